"""Scale curves: listing and eager-read time per tensor from 1,000 to 1,000,000 tensors.

Usage: python bench/bench_scale.py [--counts 1000,10000,100000] [--rounds N] [--md FILE]
       python bench/bench_scale.py --counts 1000000 --rounds 1 --warmup 0   # alone, briefly

Fixtures (generated with torch on first use into bench/_data/scale_<n>/, not committed):
``n`` tiny float32 tensors of 16 elements saved by ``torch.save``, and the same as
safetensors (the per-tensor yardstick). Cases, each in a fresh process by
bench/harness.py: ``torchless.open`` + names/dtypes/shapes, ``torchless.load(mmap=False)``
+ every tensor's bytes, and safetensors' ``safe_open`` listing. The table gives the
medians divided by ``n``: flat rows mean a cost linear in the number of tensors.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_many import CODE  # noqa: E402
from harness import PY, ROOT, Harness  # noqa: E402

GEN = r"""
import sys, torch
from safetensors.torch import save_file
n, d = int(sys.argv[1]), sys.argv[2]
base = torch.arange(16, dtype=torch.float32)
sd = {f"layers.{i // 100}.experts.{i % 100}.w": base + i for i in range(n)}
torch.save(sd, f"{d}/scale.pt")
save_file(sd, f"{d}/scale.safetensors")
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--counts", default="1000,10000,100000")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--data", default=os.path.join(ROOT, "bench", "_data"))
    ap.add_argument("--md", default=None)
    a = ap.parse_args()
    counts = [int(x) for x in a.counts.split(",")]
    h = Harness(rounds=a.rounds, warmup=a.warmup)
    for n in counts:
        d = os.path.join(a.data, f"scale_{n}")
        os.makedirs(d, exist_ok=True)
        pt, st = os.path.join(d, "scale.pt"), os.path.join(d, "scale.safetensors")
        if not os.path.exists(st):
            print(f"generating {d} ...", file=sys.stderr, flush=True)
            subprocess.run([PY, "-c", GEN, str(n), d], check=True)
        h.case(f"list_{n}", CODE["torchless_list"], args=[pt], warm=[pt])
        h.case(f"read_{n}", CODE["torchless_read"], args=[pt], warm=[pt])
        h.case(f"safetensors_list_{n}", CODE["safetensors_list"], args=[st], warm=[st])
    h.run()
    rows = [
        "| tensors | file MB | list, us/tensor | eager read, us/tensor | safetensors listing, us/tensor"
        " | list / safetensors | CPU us/tensor: list / read / safetensors | peak RSS list / read MiB |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for n in counts:
        size = os.path.getsize(os.path.join(a.data, f"scale_{n}", "scale.pt")) / 1e6
        li, rd, sf = (h.median(f"{k}_{n}") / n * 1e6 for k in ("list", "read", "safetensors_list"))
        cpu = " / ".join(f"{h.median(f'{k}_{n}', 'cpu') / n * 1e6:.1f}" for k in ("list", "read", "safetensors_list"))
        rss = "%.0f / %.0f" % (h.median(f"list_{n}", "rss") / 2**20, h.median(f"read_{n}", "rss") / 2**20)
        rows.append(f"| {n:,} | {size:.0f} | {li:.1f} | {rd:.1f} | {sf:.1f} | {li / sf:.2f}x | {cpu} | {rss} |")
    md = h.markdown() + "\n\n" + "\n".join(rows)
    print(md)
    if a.md:
        with open(a.md, "w") as f:
            f.write(md + "\n")


if __name__ == "__main__":
    main()
