"""Benchmark ``torchless scan`` against picklescan: time and verdict on the same files.

Usage: ``python bench/bench_scan.py [--data DIR] [--big-gb 2.0] [--no-big]``

Needs torch (to write the corpora and the big checkpoint) and picklescan (``pip install
picklescan``; a bench-only requirement, never a torchless dependency). Writes into
``--data`` (default: a fresh temporary directory): the malicious and benign corpora from
``tests/scan/corpus`` and a ~2 GB torch checkpoint. Prints one row per file (both
verdicts) and a summary: detections, false positives and total/median times.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(HERE, "..", "tests", "scan", "corpus")


def gen(data: str) -> tuple[str, str]:
    mal, ben = os.path.join(data, "malicious"), os.path.join(data, "benign")
    env = dict(os.environ, TORCHLESS_SCAN_MARKER_DIR=os.path.join(data, "markers"))
    os.makedirs(env["TORCHLESS_SCAN_MARKER_DIR"], exist_ok=True)
    if not os.path.exists(os.path.join(mal, "manifest.json")):
        subprocess.run([sys.executable, os.path.join(CORPUS, "gen_malicious.py"), mal], check=True, env=env, capture_output=True)
    if not os.path.exists(os.path.join(ben, "manifest.json")):
        subprocess.run([sys.executable, os.path.join(CORPUS, "gen_benign.py"), ben], check=True, capture_output=True)
    return mal, ben


def big_checkpoint(data: str, gb: float) -> str:
    path = os.path.join(data, f"big_{gb:g}gb.pt")
    if os.path.exists(path):
        return path
    import torch

    n_layers = 16
    per = int(gb * (1 << 30) / 4 / n_layers)
    sd = {f"layers.{i}.weight": torch.ones(per) for i in range(n_layers)}
    sd["step"] = 1000
    torch.save({"model": sd, "config": {"layers": n_layers}}, path)
    return path


def run_torchless(path: str) -> tuple[str, float]:
    from torchless.scan import scan

    t0 = time.perf_counter()
    rep = scan(path, jobs=1)
    dt = time.perf_counter() - t0
    return ("flagged" if not rep.clean else "clean"), dt


def run_picklescan(path: str) -> tuple[str, float]:
    from picklescan.scanner import scan_directory_path, scan_file_path

    t0 = time.perf_counter()
    try:
        r = scan_directory_path(path) if os.path.isdir(path) else scan_file_path(path)
        verdict = "flagged" if (r.issues_count or r.infected_files) else ("error" if r.scan_err else "clean")
    except Exception as e:  # picklescan raises on some inputs
        verdict = f"error:{type(e).__name__}"
    return verdict, time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--data", default=None)
    ap.add_argument("--big-gb", type=float, default=2.0)
    ap.add_argument("--no-big", action="store_true")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    data = args.data or tempfile.mkdtemp(prefix="torchless-bench-scan-")
    os.makedirs(data, exist_ok=True)
    try:
        import picklescan  # noqa: F401
    except ImportError:
        print("picklescan is not installed: pip install picklescan (bench-only requirement)", file=sys.stderr)
        return 2
    mal, ben = gen(data)
    rows = []
    for kind, d in (("malicious", mal), ("benign", ben)):
        with open(os.path.join(d, "manifest.json")) as f:
            for m in json.load(f):
                p = os.path.join(d, m["name"])
                tl, tt = run_torchless(p)
                ps, pt = run_picklescan(p)
                rows.append(
                    {"kind": kind, "name": m["name"], "torchless": tl, "torchless_s": tt, "picklescan": ps, "picklescan_s": pt}
                )
    if not args.no_big:
        p = big_checkpoint(data, args.big_gb)
        size = os.path.getsize(p)
        # cold-ish: first touch; then warm
        for label in ("first", "second"):
            tl, tt = run_torchless(p)
            ps, pt = run_picklescan(p)
            rows.append(
                {
                    "kind": "big",
                    "name": f"{os.path.basename(p)} ({size / 1e9:.2f} GB, {label} run)",
                    "torchless": tl,
                    "torchless_s": tt,
                    "picklescan": ps,
                    "picklescan_s": pt,
                }
            )
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        print(f"{'kind':9} {'file':48} {'torchless':>9} {'time':>9}   {'picklescan':>12} {'time':>9}")
        for r in rows:
            print(
                f"{r['kind']:9} {r['name'][:48]:48} {r['torchless']:>9} {r['torchless_s'] * 1e3:8.1f}ms   "
                f"{r['picklescan'][:12]:>12} {r['picklescan_s'] * 1e3:8.1f}ms"
            )
    for tool in ("torchless", "picklescan"):
        mal_rows = [r for r in rows if r["kind"] == "malicious"]
        ben_rows = [r for r in rows if r["kind"] == "benign"]
        det = sum(r[tool] == "flagged" for r in mal_rows)
        fp = sum(r[tool] != "clean" for r in ben_rows)
        times = [r[f"{tool}_s"] for r in rows if r["kind"] != "big"]
        big = [r[f"{tool}_s"] for r in rows if r["kind"] == "big"]
        print(
            f"{tool}: detected {det}/{len(mal_rows)} malicious, {fp}/{len(ben_rows)} benign not clean, "
            f"corpus total {sum(times):.2f}s (median {statistics.median(times) * 1e3:.1f}ms/file)"
            + (f", big checkpoint {', '.join(f'{b:.3f}s' for b in big)}" if big else "")
        )
    print(f"data: {data}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
