# /// script
# requires-python = ">=3.10"
# dependencies = ["torch==2.13.0", "onnxscript==0.7.2"]
# ///
"""Regenerate ``samples/mlp.onnx`` (run: python samples/gen_onnx.py).

A small MLP exported by ``torch.onnx.export`` (dynamo exporter, opset 20, dynamic
batch dimension), in one file: the demo reads it without torch or onnxruntime.
"""

from __future__ import annotations

import os
import warnings

import torch

HERE = os.path.dirname(os.path.abspath(__file__))


def main() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.LayerNorm(32), torch.nn.Linear(32, 4)).eval()
    path = os.path.join(HERE, "mlp.onnx")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model,
            (torch.randn(2, 16),),
            path,
            dynamo=True,
            external_data=False,
            input_names=["x"],
            output_names=["y"],
            dynamic_shapes=({0: torch.export.Dim("batch")},),
            verbose=False,
        )
    if os.path.exists(path + ".data"):  # created empty even when unused
        os.remove(path + ".data")
    from torchless.formats.onnx.write import strip_stack_traces

    strip_stack_traces(path)  # the exporter records this machine's source paths


if __name__ == "__main__":
    main()
