"""Long mutation-fuzz runs over every format (the bounded run is tests/fuzz/).

    python scripts/fuzz_formats.py --cases 50000 [--seed 1] [--workers 2] [--out fuzz-out]

Prints a summary line per 1000 cases and at the end; failing inputs are saved under
``OUT/failures/case-<n>-<seed>/`` with a ``case.json`` naming the seed, the mutation
and the error. Exit code 1 if anything failed. Record the counts in docs/robustness.md.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "fuzz"))
if (ROOT / "src" / "torchless").is_dir():  # a checkout: its sources, not an installed copy
    sys.path.insert(0, str(ROOT / "src"))

import harness  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=10_000)
    ap.add_argument("--seed", type=int, default=1, help="base seed (case n of seed s is always the same input)")
    ap.add_argument("--start", type=int, default=0, help="first case number")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--cli-every", type=int, default=1, help="run the CLI targets on every Nth case (0: never)")
    ap.add_argument("--out", type=Path, default=Path("fuzz-out"))
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="torchless-fuzz-"))
    last = [0]
    t0 = time.monotonic()

    def write_summary(s: harness.Summary, done: bool) -> None:
        (args.out / "summary.json").write_text(
            json.dumps(
                {
                    "done": done,
                    "cases": s.cases,
                    "targets": s.targets,
                    "failures": len(s.failures),
                    "seconds": round(s.seconds or time.monotonic() - t0, 1),
                    "by_seed": s.by_seed,
                    "base_seed": args.seed,
                    "start": args.start,
                    "cli_every": args.cli_every,
                    "killed_workers": s.killed,
                },
                indent=1,
            )
        )

    def progress(s: harness.Summary) -> None:
        if s.cases - last[0] >= 1000:
            last[0] = s.cases
            print(f"{s.cases} cases, {s.targets} targets, {len(s.failures)} failures, {time.monotonic() - t0:.0f} s", flush=True)
            write_summary(s, False)

    try:
        s = harness.run_campaign(
            args.cases,
            base_seed=args.seed,
            start=args.start,
            workers=args.workers,
            workdir=work,
            faildir=args.out / "failures",
            cli_every=args.cli_every,
            progress=progress,
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(s.report(limit=200))
    write_summary(s, True)
    return 1 if s.failures else 0


if __name__ == "__main__":
    sys.exit(main())
