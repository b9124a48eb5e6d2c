"""Fill a TorchInductor cache with one CPU ``torch.compile`` (run as a script, needs torch + g++).

    TORCHINDUCTOR_CACHE_DIR=OUT/cache python gen_cache.py OUT

Compiles a tiny module with the FX graph cache on and calls it once; torch writes the FX
graph entry, the generated output code, the C++ kernel TU + .so, the CPU ISA probe and
lock files (spec inductor_cache.md §2). ``OUT/done.json`` records the counters.
"""

import json
import os
import sys

import torch
import torch._inductor.config as inductor_config

inductor_config.fx_graph_cache = True


def main(out: str) -> None:
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU())
    f = torch.compile(m)
    with torch.no_grad():
        y = f(torch.randn(2, 8))
    from torch._dynamo.utils import counters

    with open(os.path.join(out, "done.json"), "w") as fh:
        json.dump(
            {"sum": float(y.sum()), "aot_autograd": dict(counters["aot_autograd"]), "inductor": dict(counters["inductor"])}, fh
        )


if __name__ == "__main__":
    main(sys.argv[1])
