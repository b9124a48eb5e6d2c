"""DCP consolidation time per tensor against the number of tensors (issue 12's scale curve).

Usage: python bench/bench_dcp_scale.py [--ns 1000,10000,100000] [--rounds N] [--torch-max 100000] [--data DIR] [--md FILE]

For each n, a single-rank DCP checkpoint of n small float32 tensors (16 to 256 elements,
so per-tensor work, not bandwidth, is what is measured) is generated with torch into
bench/_data/ on first use, then consolidated to .pt by torchless and (for n up to
``--torch-max``) by ``dcp_to_torch_save`` in the same rounds, through bench/harness.py.
The table gives the medians and the microseconds per tensor; a flat column means a cost
linear in the number of tensors.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import PY, ROOT, Harness  # noqa: E402

#: the consolidation, timed in wall and CPU seconds (CPU time of the process: less
#: sensitive to other jobs on a shared machine)
CODE = {
    "torchless_dcp": """
import os
import torchless.formats.registry as reg
from torchless.formats.dcp.consolidate import consolidate
reg.handlers()  # import-time work, outside the timing like the yardstick's imports
c, t = time.process_time(), time.perf_counter()
consolidate(ARGS[0], ARGS[1])
done(time.perf_counter() - t, cpu=time.process_time() - c)
os.unlink(ARGS[1])
""",
    "torch_dcp_to_torch_save": """
import os, warnings
warnings.simplefilter("ignore")
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
c, t = time.process_time(), time.perf_counter()
dcp_to_torch_save(ARGS[0], ARGS[1])
done(time.perf_counter() - t, cpu=time.process_time() - c)
os.unlink(ARGS[1])
""",
}

GEN = r"""
import sys, warnings, torch, torch.distributed.checkpoint as dcp
n, d = int(sys.argv[1]), sys.argv[2]
g = torch.Generator().manual_seed(0)
sizes = torch.randint(16, 257, (n,), generator=g).tolist()
sd = {f"blocks.{i // 10}.p{i % 10}.weight": torch.randn(k, generator=g) for i, k in enumerate(sizes)}
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    dcp.save(sd, checkpoint_id=d, no_dist=True)
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ns", default="1000,10000,100000")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--torch-max", type=int, default=100000, help="run dcp_to_torch_save only up to this many tensors")
    ap.add_argument("--data", default=os.path.join(ROOT, "bench", "_data"))
    ap.add_argument("--md", default=None)
    a = ap.parse_args()
    ns = [int(x) for x in a.ns.split(",")]
    h = Harness(rounds=a.rounds, warmup=a.warmup)
    outs = []
    for n in ns:
        d = os.path.join(a.data, f"dcp_scale_{n}")
        if not os.path.exists(os.path.join(d, ".metadata")):
            print(f"generating {d} ...", file=sys.stderr)
            subprocess.run([PY, "-c", GEN, str(n), d], check=True)
        out = os.path.join(a.data, f"dcp_scale_{n}.pt")
        outs.append(out)
        h.case(f"torchless_dcp_{n}", CODE["torchless_dcp"], args=[d, out], warm=[d])
        if n <= a.torch_max:
            h.case(f"torch_dcp_{n}", CODE["torch_dcp_to_torch_save"], args=[d, out], warm=[d])
            h.ratio(f"DCP consolidate, {n} tensors", f"torchless_dcp_{n}", f"torch_dcp_{n}", better="higher")
            h.ratio(f"DCP consolidate, {n} tensors, CPU time", f"torchless_dcp_{n}", f"torch_dcp_{n}", better="higher", key="cpu")
    h.run()
    md = h.markdown()
    md += "\n\n| tensors | torchless us/tensor (wall / CPU) | dcp_to_torch_save us/tensor (wall / CPU) |\n|---|---|---|\n"
    for n in ns:

        def per(name: str, n: int = n) -> str:
            if name not in h.cases:
                return "-"
            return f"{h.median(name) / n * 1e6:.1f} / {h.median(name, 'cpu') / n * 1e6:.1f}"

        md += f"| {n:,} | {per(f'torchless_dcp_{n}')} | {per(f'torch_dcp_{n}')} |\n"
    print(md)
    if a.md:
        with open(a.md, "w") as f:
            f.write(md)
    for out in outs:
        if os.path.exists(out):
            os.unlink(out)


if __name__ == "__main__":
    main()
