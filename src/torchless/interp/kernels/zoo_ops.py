"""Operators the transformers model zoo's programs record that no other family has
(tests/interp/zoo_hf.py, scripts/interp_zoo.py): ``meshgrid`` (BEiT's relative position
bias) and ``broadcast_to`` (WavLM's relative position buckets), both in the training IR
(the ATen IR decomposes them)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..registry import kernel
from ._common import bad, tensor
from .shape import expand


@kernel("aten.meshgrid.default", "aten.meshgrid.indexing")
def meshgrid(tensors: Sequence[np.ndarray], *, indexing: str = "ij") -> list[np.ndarray]:
    """One grid per input, each of shape ``(len(t0), len(t1), ...)`` (``xy`` swaps the
    first two), as read-only broadcast views of the inputs, as torch's are expanded views."""
    op = "aten.meshgrid"
    ts = [tensor(t) for t in tensors]
    if not ts:
        raise bad(op, "expects a non-empty TensorList")
    if indexing not in ("ij", "xy"):
        raise bad(op, f"indexing must be one of 'xy' or 'ij', got {indexing!r}")
    if any(t.ndim > 1 for t in ts):
        raise bad(op, "expects scalar or 1D tensors, got " + ", ".join(f"{t.ndim}-d" for t in ts))
    if len({t.dtype for t in ts}) != 1:
        raise bad(op, "expects all tensors to have the same dtype")
    flat = [t.reshape(-1) for t in ts]
    swap = indexing == "xy" and len(flat) >= 2
    if swap:
        flat[0], flat[1] = flat[1], flat[0]
    shape = tuple(t.shape[0] for t in flat)
    out = []
    for i, t in enumerate(flat):
        view = [1] * len(flat)
        view[i] = shape[i]
        out.append(np.broadcast_to(t.reshape(view), shape))
    if swap:
        out[0], out[1] = out[1], out[0]
    return out


@kernel("aten.broadcast_to.default")
def broadcast_to(self: np.ndarray, size: Sequence[int]) -> np.ndarray:
    """``expand``: a view of ``self`` broadcast to ``size`` (``-1`` keeps a dim)."""
    return expand(self, size)
