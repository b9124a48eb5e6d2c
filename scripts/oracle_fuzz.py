"""The coverage oracle, long run: thousands of mutated artifacts per carrier.

Usage: ``python scripts/oracle_fuzz.py [--n N] [--seed S] [--procs P] [--carriers raw,npy,...]``

Writes the benign corpus (``tests/scan/corpus/gen_benign.py``) as seeds, builds ``N``
mutations per class (``tests/scan/oracle/mutate.py``), runs the real loaders under the
recording hooks and the scanner with ``coverage=True`` (``tests/scan/oracle/harness.py``)
and prints one line per class: cases, loader runs, runs that reached a payload, unpickled
spans and compiled sources recorded, and the runs the scanner did not cover (the first of
each class in full). Exit 1 when a class outside the known misses of
``tests/scan/test_oracle.py`` has one. Needs torch and joblib (transformers for the
Hugging Face class). ``docs/scan.md`` records a run.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "scan", "oracle"))
sys.path.insert(0, os.path.join(ROOT, "src"))

import harness  # noqa: E402
import mutate  # noqa: E402

#: the test suite's known misses (xfail there), by class
KNOWN = ("pt2/weights-pickle", "package/import-module", "hf/remote-code")


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=1000, help="cases per mutation class (default 1000)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--procs", type=int, default=2, help="loader processes (default 2)")
    ap.add_argument("--carriers", default=",".join(mutate.CARRIERS), help="builders to run (default all)")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="oracle_fuzz_") as tmp:
        ben = os.path.join(tmp, "benign")
        subprocess.run(
            [sys.executable, os.path.join(ROOT, "tests", "scan", "corpus", "gen_benign.py"), ben], check=True, capture_output=True
        )
        seeds = {
            "torch_zip": [os.path.join(ben, n) for n in ("b02_state_dict.pt", "b03_model_adam.pt", "b19_protocol4.pt")],
            "legacy": [os.path.join(ben, "b20_legacy_state_dict.pt"), os.path.join(ROOT, "samples", "legacy_format.pt")],
            "pt2": [os.path.join(ben, "b34_exported.pt2")],
            "dcp": [os.path.join(ben, "b35_dcp")],
        }
        out = os.path.join(tmp, "cases")
        os.makedirs(out)
        t0 = time.monotonic()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cases = mutate.build(out, args.n, args.seed, seeds, tuple(args.carriers.split(",")))
        t1 = time.monotonic()
        res = harness.check(cases, procs=args.procs)
        t2 = time.monotonic()
    bad = 0
    print(f"{len(cases)} cases built in {t1 - t0:.0f} s, loaded and scanned in {t2 - t1:.0f} s (seed {args.seed})")
    print(f"{'class':28} {'cases':>6} {'runs':>6} {'reached':>8} {'spans':>7} {'sources':>8} {'uncovered':>10}")
    for cls, st in sorted(res.items()):
        mark = " (known)" if cls in KNOWN else ""
        print(
            f"{cls:28} {st['cases']:6} {st['runs']:6} {st['reached']:8} {st['spans']:7} {st['sources']:8} "
            f"{len(st['failures']):10}{mark}"
        )
        if st["failures"] and cls not in KNOWN:
            bad += 1
            p, ld, msg = st["failures"][0]
            print(f"    first: {os.path.basename(p)} [{ld}]: {msg}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
