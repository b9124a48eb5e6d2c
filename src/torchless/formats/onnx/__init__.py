"""ONNX models: read initializers and Constant tensors lazily, summarize, verify, and
replace weights (``set_weights``). The ``onnx`` package is needed (optional extra)."""

from __future__ import annotations

from typing import Any

from ...core.lazy import lazy_exports

__all__ = ["OnnxArtifact", "OnnxModel", "set_weights"]

# lazy: importing the package never imports onnx
_lazy = lazy_exports(
    __name__, {"OnnxArtifact": ".handler:OnnxArtifact", "OnnxModel": ".read:OnnxModel", "set_weights": ".write:set_weights"}
)


def __getattr__(name: str) -> Any:
    return _lazy(name)
