"""Run tiny random-weight transformers models (GPT-2, Llama, BERT, T5; config objects only,
nothing downloaded) exported by torch.export in the training IR and the ATen IR through
torchless, at two sequence lengths of the dynamic dim, and print a Markdown table of the
largest difference from torch's eager module (recorded in docs/interpreter.md).

Needs torch and transformers:  python scripts/hf_zoo.py [NAME...]
Exits 1 when a model torch can export does not run or differs beyond rtol 1e-4 / atol 1e-5.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torchless  # noqa: E402
from tests.interp import hf_models  # noqa: E402


def main(names: list[str]) -> int:
    rows, bad = [], 0
    with tempfile.TemporaryDirectory() as d:
        for name in names or hf_models.NAMES:
            m = hf_models.build(name)
            ep = hf_models.export(name, m)
            for ir in ("training", "aten"):
                try:
                    prog = ep if ir == "training" else ep.run_decompositions()
                except Exception as e:  # noqa: BLE001 - torch's own decomposition failing is a row
                    rows.append((name, ir, "-", f"torch cannot decompose it ({type(e).__name__})", "-"))
                    continue
                path = os.path.join(d, f"{name}_{ir}.pt2")
                torch.export.save(prog, path)
                t = time.perf_counter()
                try:
                    module = torchless.load(path).module()
                    diffs = []
                    for seq in (8, 13):
                        kw = hf_models.inputs(name, 2, seq, seq)
                        got = hf_models.first_output(module(**hf_models.numpy_kwargs(kw)))
                        with torch.no_grad():
                            want = hf_models.first_output(m(**kw)).numpy()
                        ok = np.allclose(got, want, rtol=1e-4, atol=1e-5)
                        bad += not ok
                        diffs.append(f"{float(np.abs(got - want).max()):.1e}{'' if ok else ' (FAIL)'}")
                    ops = len(set(torchless.load(path).op_histogram()))
                    rows.append((name, ir, str(ops), "runs: max abs diff " + ", ".join(diffs), f"{time.perf_counter() - t:.1f}"))
                except torchless.TorchlessError as e:
                    bad += 1
                    rows.append((name, ir, "-", f"refused: {str(e).splitlines()[0][:120]}", "-"))
    print("| model | IR | distinct ops | result (seq 8, 13) | seconds |")
    print("|---|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(r) + " |")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
