"""Long fuzz runs of the bounded expression evaluator (the bounded run is tests/graph/test_bounded.py).

    python scripts/fuzz_bounded.py --batches 20 [--seed 1] [--cases 1500]

Each batch is one child process (address space capped 256 MiB above its imports) running
``--cases`` seeded adversarial guards, srepr sizes and SymInt kernel calls plus the fixed
hostile ones; a case fails when it takes 1 s or more or ends in anything but a value, a
Python arithmetic error or a TorchlessError. Exit code 1 if anything failed. Record the
counts in docs/interpreter.md.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "graph"))
if (ROOT / "src" / "torchless").is_dir():  # a checkout: its sources, not an installed copy
    sys.path.insert(0, str(ROOT / "src"))

import test_bounded  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, default=20)
    ap.add_argument("--cases", type=int, default=1500)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    total, failures, slowest, t0 = 0, 0, 0.0, time.perf_counter()
    outcomes: dict[str, int] = {}
    for b in range(args.batches):
        cases, results = test_bounded.run_fuzz(seed=args.seed + b, n=args.cases, timeout=600)
        for c, (outcome, secs) in zip(cases, results, strict=True):
            outcomes[outcome] = outcomes.get(outcome, 0) + 1
            slowest = max(slowest, secs)
            if outcome not in ("value", "python", "torchless") or secs >= 1.0:
                failures += 1
                print(f"FAIL seed {args.seed + b}: {outcome} in {secs:.3f} s: {str(c)[:300]}")
        total += len(cases)
        print(f"batch {b + 1}/{args.batches}: {total} cases, {failures} failures, slowest {slowest:.3f} s", flush=True)
    print(f"{total} cases, {failures} failures, slowest case {slowest:.3f} s, {time.perf_counter() - t0:.0f} s; {outcomes}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
