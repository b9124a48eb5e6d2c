"""Long differential fuzz runs of eager checkpoints against torch (issues 11, 31).

    PYTHONPATH=src python scripts/fuzz_pt.py --cases 5000 [--start 0] [--minutes 10]

Each case is one random checkpoint written by torch (pickle protocols 0-5; zip, legacy
stream, 4096-aligned zip without CRCs, deflated zip, zip without the torch 2.1+ records,
big-endian zip), loaded by torchless and torch.load and compared,
then saved by torchless (from torchless's result and from torch's objects) and loaded by
torch with weights_only True/False and mmap=True. A protocol-0 file with tensors, which
torch refuses, must be refused by torchless too (counted as refusals). Prints the counts
docs/pt.md records and every failing seed (replay one with ``python tests/pt_fuzz.py SEED``).
Ctrl-C (SIGINT) stops the run and still prints the counts (prefer --minutes: the
interrupted case may be counted in part).
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

import pt_fuzz  # noqa: E402
import tl_testutil  # noqa: E402


def main() -> int:
    stats = pt_fuzz.Stats()
    run = tl_testutil.long_run(
        __doc__.splitlines()[0], lambda seed: pt_fuzz.run_case(seed, stats), default_cases=2000, message_chars=200
    )
    failed, dt, cpu, seeds = run.failed, run.wall, run.cpu, run.seeds
    print(
        f"seeds {run.start}..{run.last} ({seeds}): cases {stats.cases} (failed {len(failed)}),"
        f" refusals {stats.refusals}, tensors {stats.tensors}, writes {stats.writes} x 3 torch loads,"
        f" {dt:.0f} s ({cpu:.0f} CPU s, {seeds / max(cpu, 1e-9):.1f} seeds per CPU s)"
    )
    print("layouts", dict(sorted(stats.by_layout.items())), "protocols", dict(sorted(stats.by_protocol.items())))
    print("dtypes", len(stats.dtypes), ", ".join(sorted(stats.dtypes)))
    print("special leaves", len(stats.kinds), ", ".join(sorted(stats.kinds)))
    for seed, msg in failed[:50]:
        print(f"seed {seed}: {msg}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
