"""Long open-world differential runs of the tensor writers against the real readers (issue 31).

    PYTHONPATH=src python scripts/fuzz_writers.py --cases 2000 [--start 0] [--minutes 9]

Each case (``tests/writers_fuzz.py``) is a random dict of torch tensors written by
``torchless.write_tensors`` and by ``torchless.convert`` from a ``torch.save`` file and a
DCP folder to ``.safetensors``, a sharded safetensors set, ``.npz`` and ``.pt``, and read
back by safetensors, numpy and torch. Prints the counts docs/robustness.md records and
every failing seed (replay one with ``python tests/writers_fuzz.py SEED``). Ctrl-C
(SIGINT) stops the run and still prints the counts (prefer --minutes: the interrupted
case may be counted in part).
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

import tl_testutil  # noqa: E402
import writers_fuzz  # noqa: E402


def main() -> int:
    stats = writers_fuzz.Stats()
    run = tl_testutil.long_run(
        __doc__.splitlines()[0], lambda seed: writers_fuzz.run_case(seed, stats), default_cases=2000, message_chars=200
    )
    failed, dt, cpu, seeds = run.failed, run.wall, run.cpu, run.seeds
    print(
        f"seeds {run.start}..{run.last}: {stats.cases} cases in {dt:.0f} s ({cpu:.0f} CPU s,"
        f" {seeds / max(cpu, 1e-9):.1f} seeds per CPU s): {stats.writes} writes read back by the real tools,"
        f" {stats.refusals} refusals"
    )
    print(f"  writes by destination: {stats.by_dest}")
    print(f"  compared with the real writer's file: {stats.compared_with_real_writer}")
    print(f"  refusals by reason: {stats.refusals_by_reason}")
    print(f"  failed: {len(failed)}")
    for seed, msg in failed[:50]:
        print(f"  seed {seed}: {msg}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
