"""Helpers the nn kernel modules share: compute dtypes, argument normalisation, windows.

torch's CPU kernels compute float16/bfloat16 in float32 and round the result once
(``opmath``); :func:`compute` upcasts and :func:`finish` rounds back. float32/float64 and
complex are computed in their own type.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import ml_dtypes
import numpy as np

from ...core.errors import UnsupportedError

_HALF = (np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16))


def compute_dtype(dt: np.dtype) -> np.dtype:
    """The dtype torch's CPU kernels compute ``dt`` in (float32 for the 16-bit floats)."""
    return np.dtype(np.float32) if dt in _HALF else dt


def compute(x: np.ndarray) -> np.ndarray:
    """``x`` in its compute dtype (a copy only for the 16-bit floats)."""
    return x.astype(np.float32) if x.dtype in _HALF else x


def finish(y: Any, dtype: np.dtype) -> np.ndarray:
    """The result rounded once to ``dtype`` (an ndarray, never a NumPy scalar)."""
    y = np.asarray(y)
    return y if y.dtype == dtype else y.astype(dtype)


def require_float(op: str, *xs: np.ndarray | None) -> None:
    """torch's CPU kernels of ``op`` take floating (or complex) tensors only."""
    for x in xs:
        if x is not None and x.dtype.kind not in "fcV" and x.dtype not in _HALF:
            raise UnsupportedError(f"{op}: torch has no CPU kernel for dtype {x.dtype}")


def expand_param(v: int | Sequence[int] | None, n: int, default: int | None = None) -> tuple[int, ...]:
    """An ``int[n]`` argument as an n-tuple: one value repeats; ``[]``/None is ``default``."""
    if v is None or (isinstance(v, (list, tuple)) and len(v) == 0):
        if default is None:
            raise UnsupportedError("a required int list argument is empty")
        return (default,) * n
    if isinstance(v, (int, np.integer)):
        return (int(v),) * n
    v = [int(i) for i in v]
    return tuple(v) if len(v) == n else (v[0],) * n if len(v) == 1 else tuple(v)


def windows(
    x: np.ndarray, kernel: Sequence[int], stride: Sequence[int], dilation: Sequence[int], out: Sequence[int]
) -> np.ndarray:
    """A read-only strided view ``(*lead, *out, *kernel)`` of ``x`` (``(*lead, *spatial)``):
    element ``[..., o, k]`` is ``x[..., o*stride + k*dilation]`` along each spatial dim."""
    nd = len(kernel)
    lead = x.shape[: x.ndim - nd]
    st = x.strides
    sp = st[x.ndim - nd :]
    shape = (*lead, *out, *kernel)
    strides = (
        *st[: x.ndim - nd],
        *(s * t for s, t in zip(sp, stride, strict=False)),
        *(s * d for s, d in zip(sp, dilation, strict=False)),
    )
    return np.lib.stride_tricks.as_strided(x, shape=shape, strides=strides, writeable=False)


def pad_spatial(x: np.ndarray, before: Sequence[int], after: Sequence[int], value: Any = 0) -> np.ndarray:
    """``x`` with its last ``len(before)`` dims padded (negative amounts crop)."""
    nd = len(before)
    if not any(before) and not any(after):
        return x
    crop = [slice(None)] * (x.ndim - nd) + [
        slice(max(-b, 0), x.shape[x.ndim - nd + i] - max(-a, 0)) for i, (b, a) in enumerate(zip(before, after, strict=False))
    ]
    x = x[tuple(crop)]
    widths = [(0, 0)] * (x.ndim - nd) + [(max(b, 0), max(a, 0)) for b, a in zip(before, after, strict=False)]
    return np.pad(x, widths, constant_values=value)
