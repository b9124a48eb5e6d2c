# /// script
# requires-python = ">=3.10"
# dependencies = ["torch==2.13.0"]
# ///
"""Regenerate the TorchScript samples in this folder (run: python samples/gen_torchscript.py).

``scripted_module.pt`` is a small scripted model (submodules, a bfloat16 buffer, a
non-parameter tensor attribute, a list of tensors, an extra file);
``scripted_module.ptl`` is the same model saved for the lite interpreter, and
``scripted_module.ff`` the same model as a flatbuffer mobile module (``PTMF``).
"""

from __future__ import annotations

import linecache
import os
import warnings

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
warnings.filterwarnings("ignore", category=DeprecationWarning)


# The model is defined from this string under a neutral file name and uses torch ops
# only (no torch.nn layers, whose source would be compiled from torch's installation):
# TorchScript records the path of every compiled source file in the ``*.debug_pkl``
# records (spec torchscript.md §4), and the committed sample should not carry paths of
# the machine that generated it.
MODEL_SOURCE = """
import torch
import torch.nn as nn
from typing import List


class Dense(nn.Module):
    def __init__(self, n_in: int, n_out: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n_out, n_in) / n_in ** 0.5)
        self.bias = nn.Parameter(torch.zeros(n_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.addmm(self.bias, x, self.weight.t())


class Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.lin = Dense(d, d)
        self.norm_weight = nn.Parameter(torch.ones(d))
        self.register_buffer("gain", torch.full((d,), 0.5, dtype=torch.bfloat16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + torch.relu(self.lin(x)) * self.gain.float()
        return torch.layer_norm(h, [h.size(-1)], self.norm_weight, None, 1e-5)


class TinyNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = Dense(8, 16)
        self.blocks = nn.ModuleList([Block(16), Block(16)])
        self.head = Dense(16, 3)
        self.register_buffer("steps", torch.tensor(1200))
        self.anchors: List[torch.Tensor] = [torch.zeros(3), torch.ones(3)]
        self.temperature = 0.7

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        for blk in self.blocks:
            h = blk(h)
        return self.head(h) / self.temperature + self.anchors[1]
"""


def _define_model() -> type:
    fname = "tiny_net.py"
    linecache.cache[fname] = (len(MODEL_SOURCE), None, MODEL_SOURCE.splitlines(True), fname)
    ns: dict = {"__name__": "__main__"}
    exec(compile(MODEL_SOURCE, fname, "exec"), ns)
    return ns["TinyNet"]


def main() -> None:
    torch.manual_seed(0)
    m = torch.jit.script(_define_model()().eval())
    pt = os.path.join(HERE, "scripted_module.pt")
    torch.jit.save(m, pt, _extra_files={"config.json": b'{"name": "tiny-net", "classes": 3}'})
    m._save_for_lite_interpreter(os.path.join(HERE, "scripted_module.ptl"))
    torch.jit.save_jit_module_to_flatbuffer(
        m, os.path.join(HERE, "scripted_module.ff"), _extra_files={"config.json": b'{"name": "tiny-net", "classes": 3}'}
    )
    print(f"wrote {pt} ({os.path.getsize(pt)} bytes)")


if __name__ == "__main__":
    main()
