"""ONNX models: torchless beside onnx (the parser it builds on).

Usage: python bench/bench_onnx.py [--rounds N]

Fixtures (generated with onnx.helper on first use into bench/_data/onnx/, not committed):
  big_inline  100 float32 [1024, 1024] initializers in the model file (400 MiB)
  big_ext     the same in one external data file
  many_small  20,000 float32 [256] initializers (20 MiB)

Printed, best of the rounds (the page cache warm):
  tl list     torchless.open + list every tensor (no payload read)
  tl numpy    torchless.open + numpy() of every tensor (views: no payload copy)
  onnx load   onnx.load(load_external_data=False)
  onnx arrays onnx.load + numpy_helper.to_array of every initializer (reads the data)
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "_data", "onnx")


def _make(name: str, n: int, shape: tuple[int, ...], ext: bool) -> str:
    import onnx
    from onnx import helper, numpy_helper
    from onnx.external_data_helper import convert_model_to_external_data

    path = os.path.join(DATA, f"{name}.onnx")
    if not os.path.exists(path):
        os.makedirs(DATA, exist_ok=True)
        rng = np.random.default_rng(0)
        inits = [numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), f"t{i}") for i in range(n)]
        m = helper.make_model(helper.make_graph([], "g", [], [], initializer=inits))
        if ext:
            convert_model_to_external_data(m, location=f"{name}.bin", size_threshold=0)
        onnx.save(m, path)
    return path


def _best(f, rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        f()
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    import onnx
    from onnx import numpy_helper

    import torchless

    cases = {
        "big_inline": _make("big_inline", 100, (1024, 1024), False),
        "big_ext": _make("big_ext", 100, (1024, 1024), True),
        "many_small": _make("many_small", 20000, (256,), False),
    }
    for name, p in cases.items():

        def tl_list(p: str = p) -> None:
            with torchless.open(p) as a:
                for _ in a.tensors():
                    pass

        def tl_numpy(p: str = p) -> None:
            with torchless.open(p) as a:
                for _n, t in a.tensors():
                    t.numpy()

        def ox_load(p: str = p) -> None:
            onnx.load(p, load_external_data=False)

        def ox_arrays(p: str = p) -> None:
            m = onnx.load(p)
            for tp in m.graph.initializer:
                numpy_helper.to_array(tp)

        row = {
            k: _best(f, args.rounds)
            for k, f in (("tl list", tl_list), ("tl numpy", tl_numpy), ("onnx load", ox_load), ("onnx arrays", ox_arrays))
        }
        print(f"{name:>11}: " + "  ".join(f"{k} {v:.3f}s" for k, v in row.items()), flush=True)


if __name__ == "__main__":
    main()
