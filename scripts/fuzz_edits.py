"""Long open-world differential runs of weight edits against the real loaders (issue 31).

    PYTHONPATH=src python scripts/fuzz_edits.py --cases 500 [--start 0] [--minutes 9]

Each case (``tests/edits_fuzz.py``) is a random small module exported by
``torch.jit.trace``/``script``, ``torch.export`` or ``torch.onnx.export``, edited by
torchless with random new weights, and run by ``torch.jit.load``, ``torch.export.load``
or onnxruntime against the torch module holding the same weights. Prints the counts
docs/robustness.md records and every failing seed (replay one with
``python tests/edits_fuzz.py SEED``). Ctrl-C (SIGINT) stops the run and still prints
the counts (prefer --minutes: the interrupted case may be counted in part).
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

import edits_fuzz  # noqa: E402
import tl_testutil  # noqa: E402


def main() -> int:
    stats = edits_fuzz.Stats()
    run = tl_testutil.long_run(
        __doc__.splitlines()[0], lambda seed: edits_fuzz.run_case(seed, stats), default_cases=500, message_chars=300
    )
    failed, dt, cpu, seeds = run.failed, run.wall, run.cpu, run.seeds
    print(
        f"seeds {run.start}..{run.last} ({seeds}) in {dt:.0f} s ({cpu:.0f} CPU s,"
        f" {seeds / max(cpu, 1e-9):.2f} seeds per CPU s): {stats.cases} edited artifacts equal to torch"
        f" ({stats.edits} weights set), {stats.refusals} refusals naming a transformed or merged initializer,"
        f" {stats.not_found} ONNX weights refused as naming no initializer, {len(failed)} failures"
    )
    print(f"by target: {dict(sorted(stats.by_target.items()))}; features: {sorted(stats.features)}")
    for seed, msg in failed:
        print(f"FAIL seed {seed}: {msg}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
