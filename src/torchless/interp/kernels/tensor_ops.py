"""Tensor operators that training-IR exports keep and that belong to no larger family:
``min``/``max`` against another tensor, ``diff``, ``type_as``, ``detach``/``detach_``,
``histc``, ``repeat_interleave``, ``empty_permuted``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .. import promote
from ..registry import _KERNELS, kernel
from ._common import bad, norm_dim, quiet, refuse, tensor
from .elementwise import inplace

# min(a, b) / max(a, b) of two tensors are minimum / maximum (NaN propagating)
kernel("aten.min.other")(_KERNELS["aten.minimum.default"])
kernel("aten.max.other")(_KERNELS["aten.maximum.default"])


@kernel("aten.detach.default", "aten.detach_.default")
def detach(self: np.ndarray) -> np.ndarray:
    """Identity: the interpreter has no autograd graph to detach from (``detach_`` returns self)."""
    return tensor(self)


@kernel("aten.type_as.default")
def type_as(self: np.ndarray, other: np.ndarray) -> np.ndarray:
    """``self`` converted to ``other``'s dtype (``self`` itself when it has it)."""
    x, dt = tensor(self), tensor(other).dtype
    return x if x.dtype == dt else promote.cast(x, dt)


@kernel("aten.diff.default")
def diff(self: np.ndarray, n: int = 1, dim: int = -1, prepend: Any = None, append: Any = None) -> np.ndarray:
    """The ``n``-th forward difference along ``dim`` (``!=`` for bool), with ``prepend`` and
    ``append`` concatenated first."""
    x = tensor(self)
    if x.ndim == 0:
        raise bad("aten.diff", "diff expects input to be at least one-dimensional")
    if n < 0:
        raise bad("aten.diff", f"order must be non-negative but got {n}")
    d = norm_dim(dim, x.ndim, "aten.diff")
    parts = [x]
    for where, extra in ((0, prepend), (1, append)):
        if extra is not None:
            e = tensor(extra)
            if e.ndim != x.ndim:
                raise bad("aten.diff", f"{('prepend', 'append')[where]} must have the same number of dimensions as input")
            parts.insert(0 if where == 0 else len(parts), e)
    if len(parts) > 1:
        rt = parts[0].dtype
        for p in parts[1:]:
            rt = promote.promote_types(rt, p.dtype)
        x = np.concatenate([promote.cast(p, rt) for p in parts], axis=d)
    compute = promote.opmath(x.dtype) if x.dtype != np.bool_ else x.dtype
    out_dt = x.dtype
    v = x.astype(compute, copy=False)
    with quiet():
        for _ in range(min(n, x.shape[d])):
            hi = np.take(v, range(1, v.shape[d]), axis=d)
            lo = np.take(v, range(v.shape[d] - 1), axis=d)
            # each order is rounded to the dtype, as torch computes it one subtraction at a time
            v = promote.cast(np.not_equal(hi, lo) if out_dt == np.bool_ else hi - lo, out_dt).astype(compute, copy=False)
        if n > x.shape[d]:
            shape = list(x.shape)
            shape[d] = 0
            v = np.zeros(shape, out_dt)
    return promote.cast(v, out_dt)


@kernel("aten.histc.default")
def histc(self: np.ndarray, bins: int = 100, min: Any = 0, max: Any = 0) -> np.ndarray:  # noqa: A002
    """Counts of ``self``'s elements in ``bins`` equal bins over [min, max] (the data's
    range when min == max), in the input's dtype; elements outside (and NaN) are not counted."""
    x = tensor(self)
    if promote.category(x.dtype) != promote.FLOAT:
        raise refuse("aten.histc", f'"histogram_cpu" not implemented for {x.dtype}')
    if bins <= 0:
        raise bad("aten.histc", "bins must be > 0")
    lo, hi = float(min), float(max)
    flat = x.reshape(-1).astype(np.float64)
    if lo == hi and flat.size:
        finite = flat[~np.isnan(flat)]
        if finite.size:
            lo, hi = float(finite.min()), float(finite.max())
    if lo == hi:
        lo, hi = lo - 1, hi + 1
    if not (np.isfinite(lo) and np.isfinite(hi)):
        raise bad("aten.histc", f"range of [{lo}, {hi}] is not finite")
    if lo > hi:
        raise bad("aten.histc", "max must be larger than min")
    # torch's linear interpolation, in the input's dtype: the outer edges are those of the
    # dtype's linspace, an element's bin is int((x - left) * bins / (right - left)), the last
    # bin holds its right edge
    dt = x.dtype
    edges = np.linspace(lo, hi, bins + 1).astype(dt)
    left, right = edges[0], edges[-1]
    v = x.reshape(-1)
    v = v[(v >= left) & (v <= right)]
    with quiet():
        pos = ((v - left) * dt.type(bins) / (right - left)).astype(np.int64)
    pos = np.clip(pos, 0, bins - 1)
    return np.bincount(pos, minlength=bins).astype(x.dtype)


def _repeats(r: Any, op: str) -> np.ndarray:
    rep = tensor(r)
    if rep.dtype.kind not in "iu":
        raise bad(op, f"repeats has to be Long or Int tensor, got {rep.dtype}")
    if rep.ndim > 1:
        raise bad(op, "repeats must be 0-dim or 1-dim tensor")
    if (rep < 0).any():
        raise bad(op, "repeats can not be negative")
    return rep.astype(np.int64)


def _check_size(out: np.ndarray, d: int, output_size: Any, op: str) -> np.ndarray:
    if output_size is not None and out.shape[d] != output_size:
        raise bad(op, f"allocated size does not match required size ({output_size} vs {out.shape[d]})")
    return out


@kernel("aten.repeat_interleave.Tensor")
def repeat_interleave(repeats: np.ndarray, *, output_size: Any = None) -> np.ndarray:
    """Index ``i`` repeated ``repeats[i]`` times."""
    rep = _repeats(repeats, "aten.repeat_interleave").reshape(-1)
    out = np.repeat(np.arange(rep.shape[0], dtype=np.int64), rep).astype(tensor(repeats).dtype)
    return _check_size(out, 0, output_size, "aten.repeat_interleave")


def _interleave(x: np.ndarray, rep: Any, dim: Any, output_size: Any, op: str) -> np.ndarray:
    x = tensor(x)
    if dim is None:
        x, d = x.reshape(-1), 0
    else:
        d = norm_dim(dim, x.ndim, op)
        if x.ndim == 0:
            x = x.reshape(1)
    r: Any = rep
    if isinstance(rep, np.ndarray):
        if rep.size == 1:
            r = int(rep.reshape(-1)[0])
        elif rep.shape[0] != x.shape[d]:
            raise bad(op, f"repeats must have the same size as input along dim, got {rep.shape[0]} and {x.shape[d]}")
    return _check_size(np.repeat(x, r, axis=d), d, output_size, op)


@kernel("aten.repeat_interleave.self_int")
def repeat_interleave_int(self: np.ndarray, repeats: int, dim: Any = None, *, output_size: Any = None) -> np.ndarray:
    if repeats < 0:
        raise bad("aten.repeat_interleave", "repeats can not be negative")
    return _interleave(self, int(repeats), dim, output_size, "aten.repeat_interleave")


@kernel("aten.repeat_interleave.self_Tensor")
def repeat_interleave_tensor(self: np.ndarray, repeats: np.ndarray, dim: Any = None, *, output_size: Any = None) -> np.ndarray:
    return _interleave(self, _repeats(repeats, "aten.repeat_interleave"), dim, output_size, "aten.repeat_interleave")


@kernel("aten.empty_permuted.default")
def empty_permuted(
    size: Sequence[int],
    physical_layout: Sequence[int],
    *,
    dtype: Any = None,
    layout: Any = None,
    device: Any = None,
    pin_memory: Any = None,
) -> np.ndarray:
    """A tensor of ``size`` whose memory holds its dims in ``physical_layout`` order (zeros:
    torch leaves it uninitialised)."""
    from .create import empty

    size, perm = [int(s) for s in size], [int(p) for p in physical_layout]
    if sorted(perm) != list(range(len(size))):
        raise bad("aten.empty_permuted", f"physical_layout {perm} is not a permutation of the {len(size)} dims")
    phys = empty([size[p] for p in perm], dtype=dtype)
    return np.transpose(phys, np.argsort(perm))


def _triangle(op: str, x: Any, diagonal: int, lower: bool) -> np.ndarray:
    v = tensor(x)
    if v.ndim < 2:
        raise bad(op, "input tensor must have at least 2 dimensions")
    return np.tril(v, diagonal) if lower else np.triu(v, diagonal)


@kernel("aten.tril.default")
def tril(self: np.ndarray, diagonal: int = 0) -> np.ndarray:
    """The lower triangle of the last two dims (``diagonal`` above the main one), zeros elsewhere."""
    return _triangle("aten.tril", self, diagonal, True)


@kernel("aten.triu.default")
def triu(self: np.ndarray, diagonal: int = 0) -> np.ndarray:
    """The upper triangle of the last two dims (``diagonal`` above the main one), zeros elsewhere."""
    return _triangle("aten.triu", self, diagonal, False)


inplace("aten.tril.default")
inplace("aten.triu.default")
