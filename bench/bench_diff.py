"""`diff` of two big checkpoints, measured by bench/harness.py (issue 12).

Usage: python bench/bench_diff.py [--rounds N] [--mib 1024] [--data DIR] [--md FILE] [--before CHECKOUT]

Fixture (written with torchless on first use into bench/_data/, not committed): two .pt
files of ``--mib`` MiB each (float32 tensors of 4 Mi elements), the second a copy of the
first with one element changed. Rows:

  diff   torchless.diff.diff(a, b)        vs reading both files (readinto a 16 MiB buffer)  <= 1.5x
  rss    peak RSS of the diff             vs a quarter of one file                          <= 1

``--before`` runs an older checkout's diff in the same rounds (its speed-up is printed).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import PY, ROOT, Harness  # noqa: E402

GEN = r"""
import sys, numpy as np, torchless
mib, a, b = int(sys.argv[1]), sys.argv[2], sys.argv[3]
n = 1 << 22
rng = np.random.default_rng(0)
sd = {f"layers.{i}.weight": rng.standard_normal(n, dtype=np.float32) for i in range(max(1, mib * (1 << 20) // (4 * n)))}
torchless.save(sd, a)
k = sorted(sd)[len(sd) // 2]
sd[k][12345] += np.float32(1.5)
torchless.save(sd, b)
"""

CODE = {
    "torchless_diff": """
from torchless.diff import diff
t = time.perf_counter()
r = diff(ARGS[0], ARGS[1])
done(time.perf_counter() - t, changed=len(r["changed"]))
assert len(r["changed"]) == 1, r["changed"]
""",
    "read_both": """
import os
buf = bytearray(16 << 20)
mv = memoryview(buf)
t = time.perf_counter()
for p in ARGS[:2]:
    with open(p, "rb", buffering=0) as f:
        while f.readinto(mv):
            pass
done(time.perf_counter() - t)
""",
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--mib", type=int, default=1024)
    ap.add_argument("--data", default=os.path.join(ROOT, "bench", "_data"))
    ap.add_argument("--md", default=None, help="also write the Markdown tables here")
    ap.add_argument("--before", default=None, help="a checkout of an older torchless: its diff runs in the same rounds")
    a = ap.parse_args()
    d = os.path.join(a.data, f"diff_{a.mib}")
    os.makedirs(d, exist_ok=True)
    pa, pb = os.path.join(d, "a.pt"), os.path.join(d, "b.pt")
    if not os.path.exists(pb):
        print(f"generating fixtures in {d} ...", file=sys.stderr)
        subprocess.run(
            [PY, "-c", GEN, str(a.mib), pa, pb], check=True, env=dict(os.environ, PYTHONPATH=os.path.join(ROOT, "src"))
        )
    size = os.path.getsize(pa)
    h = Harness(rounds=a.rounds, warmup=a.warmup)
    h.case("torchless_diff", CODE["torchless_diff"], args=[pa, pb], warm=[pa, pb])
    h.case("read_both", CODE["read_both"], args=[pa, pb], warm=[pa, pb])
    h.ratio("diff of two checkpoints", "torchless_diff", "read_both", goal=1.5)
    if a.before:
        c = h.cases["torchless_diff"]
        h.case(
            "torchless_diff_before",
            c.code,
            args=c.args,
            warm=c.warm,
            env={"PYTHONPATH": os.path.join(os.path.abspath(a.before), "src")},
        )
        h.ratio("torchless_diff: speed-up over --before", "torchless_diff", "torchless_diff_before", better="higher")
    h.run()
    md = h.markdown()
    rss = h.median("torchless_diff", "rss")
    quarter = size / 4
    md += (
        f"\n\nFiles: 2 x {size / 2**20:.0f} MiB. Peak RSS of the diff: {rss / 2**20:.0f} MiB = "
        f"{rss / quarter:.2f} x a quarter of one file (goal <= 1: {'yes' if rss <= quarter else '**no**'})"
    )
    if a.before:
        md += f"; --before: {h.median('torchless_diff_before', 'rss') / 2**20:.0f} MiB"
    print(md)
    if a.md:
        with open(a.md, "w") as f:
            f.write(md + "\n")


if __name__ == "__main__":
    main()
