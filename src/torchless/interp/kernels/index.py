"""Indexing kernels: gather/scatter, advanced indexing, index_put, masked_scatter, nonzero.

An index out of range is a :class:`~torchless.core.errors.UsageError`, as torch refuses it.
Where torch leaves the order of duplicate writes unspecified (``scatter``, ``index_put``
without ``accumulate``), the last write wins here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from .. import promote
from ..registry import kernel
from ._common import bad, norm_dim, quiet, refuse, tensor


def _check_range(op: str, idx: np.ndarray, n: int, allow_negative: bool = False) -> np.ndarray:
    if idx.dtype.kind not in "iu":
        raise bad(op, f"expected an int64 index tensor, got {idx.dtype}")
    lo = -n if allow_negative else 0
    if idx.size and (idx.min() < lo or idx.max() >= n):
        bad_v = idx.min() if idx.min() < lo else idx.max()
        raise bad(op, f"index {int(bad_v)} is out of bounds for dimension with size {n}")
    return idx


def _scatter_positions(op: str, x: np.ndarray, dim: int, index: np.ndarray) -> tuple[int, tuple[np.ndarray, ...]]:
    """(dim, a tuple indexing x) for gather/scatter with ``index``: index values along dim, positions elsewhere."""
    idx = tensor(index)
    if x.ndim == 0:
        d = norm_dim(dim, 0, op)
        _check_range(op, idx, 1)
        return d, ()
    d = norm_dim(dim, x.ndim, op)
    if idx.ndim != x.ndim and idx.size:
        raise bad(op, f"index tensor must have the same number of dimensions as self ({x.ndim}), got {idx.ndim}")
    _check_range(op, idx, x.shape[d])
    if idx.ndim != x.ndim:  # an empty index of other rank
        return d, tuple(np.zeros((0,), np.int64) for _ in range(x.ndim))
    grids: list[Any] = list(np.indices(idx.shape, sparse=True))
    grids[d] = idx.astype(np.intp)
    return d, tuple(grids)


@kernel("aten.gather.default")
def gather(self: np.ndarray, dim: int, index: np.ndarray, *, sparse_grad: bool = False) -> np.ndarray:
    x = tensor(self)
    d, pos = _scatter_positions("aten.gather", x, dim, index)
    idx = tensor(index)
    if x.ndim == 0 or idx.size == 0:
        return (
            np.broadcast_to(x.reshape(-1)[:1] if x.size else x, idx.shape).copy() if x.ndim == 0 else np.empty(idx.shape, x.dtype)
        )
    return np.asarray(x[pos])


def _src_values(src: Any, index: np.ndarray, dt: np.dtype) -> np.ndarray:
    s = tensor(src)
    if s.ndim == 0 or not isinstance(src, np.ndarray):
        return np.broadcast_to(promote.cast(s, dt), index.shape)
    if s.ndim != index.ndim:
        raise bad("aten.scatter", "src must have the same number of dimensions as index")
    return promote.cast(s[tuple(slice(0, n) for n in index.shape)], dt)


@kernel("aten.scatter.src", "aten.scatter.value")
def scatter(self: np.ndarray, dim: int, index: np.ndarray, src: Any = None, *, value: Any = None) -> np.ndarray:
    x = tensor(self)
    src = value if src is None else src
    out = x.copy()
    idx = tensor(index)
    d, pos = _scatter_positions("aten.scatter", x, dim, idx)
    if x.ndim == 0:
        if idx.size:
            out[...] = _src_values(src, idx, x.dtype).reshape(-1)[-1]
        return out
    out[pos] = _src_values(src, idx, x.dtype)
    return out


@kernel("aten.scatter.reduce", "aten.scatter.value_reduce")
def scatter_reduce_legacy(self: np.ndarray, dim: int, index: np.ndarray, src: Any, *, reduce: str) -> np.ndarray:
    mode = {"add": "sum", "multiply": "prod"}.get(reduce)
    if mode is None:
        raise bad("aten.scatter", f"reduce argument must be 'add' or 'multiply', not {reduce!r}")
    return scatter_reduce(self, dim, index, src, mode, include_self=True)


@kernel("aten.scatter_add.default")
def scatter_add(self: np.ndarray, dim: int, index: np.ndarray, src: np.ndarray) -> np.ndarray:
    return scatter_reduce(self, dim, index, src, "sum", include_self=True)


_UFUNC = {"sum": np.add, "prod": np.multiply, "mean": np.add, "amax": np.maximum, "amin": np.minimum}


def _identity(reduce: str, dt: np.dtype) -> Any:
    if reduce in ("sum", "mean"):
        return 0
    if reduce == "prod":
        return 1
    if dt.kind == "f":
        return -np.inf if reduce == "amax" else np.inf
    if dt == np.bool_:
        return reduce == "amin"
    info = np.iinfo(dt)
    return info.min if reduce == "amax" else info.max


@kernel("aten.scatter_reduce.two")
def scatter_reduce(
    self: np.ndarray, dim: int, index: np.ndarray, src: np.ndarray, reduce: str, *, include_self: bool = True
) -> np.ndarray:
    if reduce not in _UFUNC:
        raise bad("aten.scatter_reduce", f"reduce argument must be one of sum, prod, mean, amax, amin, not {reduce!r}")
    x = tensor(self)
    if x.dtype.kind == "c" and reduce in ("amax", "amin"):
        raise refuse("aten.scatter_reduce", "complex input with amax/amin")
    idx = tensor(index)
    acc = promote.opmath(x.dtype)
    out = x.astype(acc, copy=True)
    d, pos = _scatter_positions("aten.scatter_reduce", x, dim, idx)
    if x.ndim == 0:
        out = out.reshape(1)
        pos = (np.zeros(idx.shape, np.intp),)
    vals = _src_values(src, idx, acc)
    with quiet():
        hit = np.zeros(out.shape, np.int64)
        np.add.at(hit, pos, 1)
        if not include_self:
            out[hit > 0] = _identity(reduce, acc)
        _UFUNC[reduce].at(out, pos, vals)
        if reduce == "mean":
            count = hit + (1 if include_self else 0)
            count = np.maximum(count, 1)
            if acc.kind in "iub":
                out = np.floor_divide(out, count.astype(acc))
            else:
                out = out / count.astype(acc)
    return promote.cast(out.reshape(x.shape), x.dtype)


@kernel("aten.index_select.default")
def index_select(self: np.ndarray, dim: int, index: np.ndarray) -> np.ndarray:
    x = tensor(self)
    idx = tensor(index)
    if idx.ndim > 1:
        raise bad("aten.index_select", "index must be a 1-d or 0-d tensor")
    if x.ndim == 0:
        _check_range("aten.index_select", idx, 1)
        return x.reshape(-1)[idx.reshape(-1)].reshape(())
    d = norm_dim(dim, x.ndim, "aten.index_select")
    _check_range("aten.index_select", idx, x.shape[d])
    return np.take(x, idx.reshape(-1), axis=d)


def _index_tuple(op: str, x: np.ndarray, indices: Sequence[Any]) -> tuple[Any, ...]:
    if len(indices) > x.ndim:
        raise bad(op, f"too many indices for a tensor of dimension {x.ndim} (got {len(indices)})")
    out: list[Any] = []
    d = 0
    for ix in indices:
        if ix is None:
            out.append(slice(None))
            d += 1
            continue
        t = tensor(ix)
        if t.dtype in (np.bool_, np.uint8):
            t = t.astype(np.bool_)
            for k in range(t.ndim):
                if t.shape[k] != x.shape[d + k]:
                    raise bad(op, f"the shape of the mask {list(t.shape)} does not match the shape of the indexed tensor")
            out.append(t)
            d += t.ndim
            continue
        _check_range(op, t, x.shape[d], allow_negative=True)
        out.append(t.astype(np.intp))
        d += 1
    return tuple(out)


def _trailing_gather(x: np.ndarray, key: tuple[Any, ...]) -> np.ndarray | None:
    """``x[key]`` where ``key`` is full slices then integer index arrays on every remaining
    dim (what ATen IR's resizing decompositions index with: ``x[:, :, iy, ix]``), as one
    flat index into the trailing dims and one 1-d ``take`` per leading row: NumPy's own
    advanced indexing visits the leading dims innermost there (3-10x slower) and returns a
    non-contiguous result. None where ``key`` has another shape or the gather is small."""
    lead = 0
    while lead < len(key) and isinstance(key[lead], slice):
        lead += 1
    arrs = key[lead:]
    if not arrs or len(key) != x.ndim or any(not isinstance(a, np.ndarray) or a.dtype == np.bool_ for a in arrs):
        return None
    dims = x.shape[lead:]
    b_shape = np.broadcast_shapes(*(a.shape for a in arrs))
    rows, cols, size = math.prod(x.shape[:lead]), math.prod(dims), math.prod(b_shape)
    if size < 1024 or rows < 1:
        return None
    acc = np.zeros(b_shape, np.intp)
    step = 1
    for a, n in zip(arrs[::-1], dims[::-1], strict=True):
        acc += np.where(a < 0, a + n, a) * step  # in range: checked by _index_tuple
        step *= n
    flat = acc.reshape(-1)
    src = np.reshape(x, (rows, cols))
    out = np.empty((rows, size), x.dtype)
    for r in range(rows):
        src[r].take(flat, out=out[r], mode="clip")  # clip: no bounds pass, no copy of out
    return out.reshape(*x.shape[:lead], *b_shape)


@kernel("aten.index.Tensor")
def index(self: np.ndarray, indices: Sequence[Any]) -> np.ndarray:
    x = tensor(self)
    key = _index_tuple("aten.index", x, indices)
    fast = _trailing_gather(x, key)
    if fast is not None:
        return fast
    return np.asarray(x[key]).copy()


def _index_put(out: np.ndarray, indices: Sequence[Any], values: np.ndarray, accumulate: bool) -> np.ndarray:
    key = _index_tuple("aten.index_put", out, indices)
    v = promote.cast(values, out.dtype)
    if accumulate:
        if out.dtype == np.bool_:
            np.logical_or.at(out, key, v)
        else:
            target_shape = out[key].shape
            with quiet():
                np.add.at(out, key, np.broadcast_to(v, target_shape))
    else:
        out[key] = v
    return out


@kernel("aten.index_put.default")
def index_put(self: np.ndarray, indices: Sequence[Any], values: np.ndarray, accumulate: bool = False) -> np.ndarray:
    return _index_put(tensor(self).copy(), indices, values, accumulate)


@kernel("aten.index_put_.default", "aten._index_put_impl_.default")
def index_put_(
    self: np.ndarray, indices: Sequence[Any], values: np.ndarray, accumulate: bool = False, unsafe: bool = False
) -> np.ndarray:
    return _index_put(tensor(self), indices, values, accumulate)


@kernel("aten.masked_scatter.default")
def masked_scatter(self: np.ndarray, mask: np.ndarray, source: np.ndarray) -> np.ndarray:
    x, m = tensor(self), tensor(mask).astype(np.bool_)
    shape = np.broadcast_shapes(x.shape, m.shape)
    out = np.broadcast_to(x, shape).copy()
    m = np.broadcast_to(m, shape)
    n = int(m.sum())
    src = tensor(source).reshape(-1)
    if src.size < n:
        raise bad("aten.masked_scatter", f"the source has {src.size} elements, the mask selects {n}")
    out[m] = promote.cast(src[:n], x.dtype)
    return out


@kernel("aten.nonzero.default")
def nonzero(self: np.ndarray) -> np.ndarray:
    x = tensor(self)
    return np.asarray(np.argwhere(x != 0), np.int64)


@kernel("aten.select_scatter.default")
def select_scatter(self: np.ndarray, src: np.ndarray, dim: int, index: int) -> np.ndarray:
    from .shape import select

    out = tensor(self).copy()
    view = select(out, dim, index)
    view[...] = promote.cast(src, out.dtype)
    return out


@kernel("aten.slice_scatter.default")
def slice_scatter(
    self: np.ndarray, src: np.ndarray, dim: int = 0, start: int | None = None, end: int | None = None, step: int = 1
) -> np.ndarray:
    from .shape import slice_

    out = tensor(self).copy()
    view = slice_(out, dim, start, end, step)
    s = tensor(src)
    if s.shape != view.shape:
        raise bad("aten.slice_scatter", f"src shape {list(s.shape)} does not match the slice's {list(view.shape)}")
    view[...] = promote.cast(s, out.dtype)
    return out


@kernel("aten.diagonal_scatter.default")
def diagonal_scatter(self: np.ndarray, src: np.ndarray, offset: int = 0, dim1: int = 0, dim2: int = 1) -> np.ndarray:
    from .shape import diagonal

    out = tensor(self).copy()
    diagonal(out, offset, dim1, dim2)[...] = promote.cast(src, out.dtype)
    return out


@kernel("aten.bincount.default")
def bincount(self: np.ndarray, weights: np.ndarray | None = None, minlength: int = 0) -> np.ndarray:
    x = tensor(self)
    if x.ndim != 1 or x.dtype.kind not in "iu" or (x.size and x.min() < 0):
        raise bad("aten.bincount", "expects a 1-d tensor of non-negative integers")
    if weights is None:
        return np.bincount(x, minlength=minlength).astype(np.int64)
    w = tensor(weights)
    out = w.dtype if w.dtype in (np.float32, np.float64) else np.dtype(np.float64)
    return np.bincount(x, weights=w.astype(np.float64), minlength=minlength).astype(out)


# -- searchsorted / bucketize ------------------------------------------------------------


def _bsearch(op: str, seq: np.ndarray, values: np.ndarray, right: bool, sorter: np.ndarray | None) -> np.ndarray:
    """For every value, torch's binary search over its row of ``seq``: the first position
    whose element is ``>=`` (left) or ``>`` (right) the value, comparisons as written (a NaN
    value goes past every element, a NaN element compares false), vectorised over all values."""
    n = seq.shape[-1]
    if seq.ndim == 1:
        rows = np.zeros(values.shape, np.intp)
        table = seq.reshape(1, n)
        order = None if sorter is None else sorter.reshape(1, n)
    else:
        if seq.shape[:-1] != values.shape[:-1]:
            raise bad(
                op,
                f"the boundaries' leading dimensions {list(seq.shape[:-1])} must match the input's {list(values.shape[:-1])}",
            )
        lead = int(np.prod(seq.shape[:-1], dtype=np.int64))
        table = seq.reshape(lead, n)
        rows = np.broadcast_to(np.arange(lead, dtype=np.intp).reshape(seq.shape[:-1] + (1,)), values.shape)
        order = None if sorter is None else sorter.reshape(lead, n)
    lo = np.zeros(values.shape, np.int64)
    hi = np.full(values.shape, n, np.int64)
    with quiet():
        while True:
            active = lo < hi
            if not active.any():
                return lo
            mid = (lo + hi) >> 1
            at = np.minimum(mid, n - 1) if n else mid
            if order is not None:
                at = order[rows, at]
            mv = table[rows, at]
            past = ~(mv > values) if right else ~(mv >= values)
            lo = np.where(active & past, mid + 1, lo)
            hi = np.where(active & ~past, mid, hi)


def _search(op: str, seq: Any, values: Any, out_int32: bool, right: bool, side: Any, sorter: Any) -> np.ndarray:
    s = tensor(seq)
    v = tensor(values)
    if side is not None:
        if side not in ("left", "right"):
            raise bad(op, f"side can only be 'left' or 'right', got {side!r}")
        if right and side == "left":
            raise bad(op, "side and right can't be set to opposites, got side of left while right was True")
        right = side == "right"
    if s.ndim == 0:
        raise bad(op, "the boundaries must have at least one dimension")
    if s.ndim > 1 and v.ndim == 0:
        raise bad(op, "a scalar input needs 1-d boundaries")
    if s.dtype.kind == "c" or v.dtype.kind == "c":
        raise bad(op, "not implemented for complex tensors")
    order = None
    if sorter is not None:
        order = tensor(sorter)
        if order.shape != s.shape or order.dtype != np.int64:
            raise bad(op, "sorter must be an int64 tensor of the boundaries' shape")
        if order.size and (order.min() < 0 or order.max() >= s.shape[-1]):
            raise bad(op, "sorter index out of range")
    ct = promote.result_type(s, values)  # a Scalar input promotes as a Python number
    cmp = promote.opmath(ct) if promote.category(ct) == promote.FLOAT else ct
    r = _bsearch(op, promote.cast(s, cmp), promote.cast(v, cmp), right, order)
    return r.astype(np.int32 if out_int32 else np.int64)


@kernel("aten.searchsorted.Tensor", "aten.searchsorted.Scalar")
def searchsorted(
    sorted_sequence: Any,
    self: Any,
    *,
    out_int32: bool = False,
    right: bool = False,
    side: Any = None,
    sorter: Any = None,
) -> np.ndarray:
    return _search("aten.searchsorted", sorted_sequence, self, out_int32, right, side, sorter)


@kernel("aten.bucketize.Tensor", "aten.bucketize.Scalar")
def bucketize(self: Any, boundaries: Any, *, out_int32: bool = False, right: bool = False) -> np.ndarray:
    b = tensor(boundaries)
    if b.ndim != 1:
        raise bad("aten.bucketize", f"boundaries must be 1-d, got {b.ndim} dimensions")
    return _search("aten.bucketize", b, self, out_int32, right, None, None)
