# /// script
# requires-python = ">=3.10"
# dependencies = ["torch==2.13.0"]
# ///
"""Regenerate ``samples/mlp.pt2`` (run: python samples/gen_pt2.py).

A small MLP with a buffer, exported by ``torch.export.export`` with a dynamic batch
dimension and lowered to core ATen (``run_decompositions()``), saved by
``torch.export.save``: the demo prints its graph, verifies it and converts its weights
without torch.
"""

from __future__ import annotations

import os
import warnings

import torch

HERE = os.path.dirname(os.path.abspath(__file__))


class MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.l1 = torch.nn.Linear(16, 32)
        self.norm = torch.nn.LayerNorm(32)
        self.l2 = torch.nn.Linear(32, 4)
        self.register_buffer("scale", torch.full((4,), 0.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.l2(self.norm(torch.relu(self.l1(x)))) * self.scale


def main() -> None:
    torch.manual_seed(0)
    batch = torch.export.Dim("batch", min=1, max=1024)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ep = torch.export.export(MLP().eval(), (torch.randn(2, 16),), dynamic_shapes={"x": {0: batch}}).run_decompositions()
        for module in ep.graph_module.modules():
            for node in module.graph.nodes:
                # stack traces name the files of the machine that exported: keep them out
                node.meta.pop("stack_trace", None)
        torch.export.save(ep, os.path.join(HERE, "mlp.pt2"), extra_files={"README.txt": "torchless sample"})


if __name__ == "__main__":
    main()
