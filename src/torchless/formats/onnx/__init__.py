"""ONNX models: read initializers and Constant tensors lazily, summarize, verify, and
replace weights (``set_weights``). The ``onnx`` package is needed (optional extra)."""

from __future__ import annotations

from typing import Any

__all__ = ["OnnxArtifact", "OnnxModel", "set_weights"]


def __getattr__(name: str) -> Any:  # lazy: importing the package never imports onnx
    if name == "OnnxArtifact":
        from .handler import OnnxArtifact

        return OnnxArtifact
    if name == "OnnxModel":
        from .read import OnnxModel

        return OnnxModel
    if name == "set_weights":
        from .write import set_weights

        return set_weights
    raise AttributeError(name)
