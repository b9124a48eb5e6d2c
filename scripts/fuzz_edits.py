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

import argparse
import os
import shutil
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

import edits_fuzz  # noqa: E402
import tl_testutil  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=500)
    ap.add_argument("--start", type=int, default=0)
    ap.add_argument("--minutes", type=float, default=0.0, help="stop after this long (0: no limit)")
    args = ap.parse_args()
    tmp = tl_testutil.long_run_setup()  # one thread, temporary files in RAM
    stats = edits_fuzz.Stats()
    failed: list[tuple[int, str]] = []
    t0, c0 = time.monotonic(), time.process_time()
    seeds = 0
    try:
        for seed in range(args.start, args.start + args.cases):
            try:
                edits_fuzz.run_case(seed, stats)
            except Exception as e:  # noqa: BLE001 - every failure is reported with its seed
                failed.append((seed, f"{type(e).__name__}: {str(e)[:300]}"))
            seeds += 1
            if args.minutes and time.monotonic() - t0 > args.minutes * 60:
                break
    except KeyboardInterrupt:
        print(f"interrupted in seed {args.start + seeds} (not in the seed count; its case may be counted in part)")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    dt, cpu = time.monotonic() - t0, time.process_time() - c0
    print(
        f"seeds {args.start}..{args.start + seeds - 1} ({seeds}) in {dt:.0f} s ({cpu:.0f} CPU s,"
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
