"""Pooling kernels: average (1d/2d/3d, ``ceil_mode``, ``count_include_pad``,
``divisor_override``), adaptive average (1d/2d/3d), max with indices (dilation, ceil_mode),
and their backwards.

Windows are strided views of the padded input (no copy); reductions run over the window
axes in one NumPy call. Output sizes follow torch's ``pooling_output_shape``: with
``ceil_mode`` the last window may start inside the right padding but never past it.
Max pooling keeps the first maximum of a window, and a NaN wins over every number (the
last NaN, as torch's ``val > max || isnan(val)`` scan does). Adaptive pooling averages
``[floor(i*I/O), ceil((i+1)*I/O))`` per dimension, as separable 0/1 matrix products.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from ...core.errors import UnsupportedError, UsageError
from ..registry import first_only, kernel
from ._nn_util import compute, compute_dtype, expand_param, finish, pad_spatial, windows
from .nn_conv import scatter_windows


def pool_out(n: int, k: int, p: int, s: int, d: int, ceil_mode: bool) -> int:
    """torch's ``pooling_output_shape``."""
    out = (n + 2 * p - d * (k - 1) - 1 + (s - 1 if ceil_mode else 0)) // s + 1
    if ceil_mode and (out - 1) * s >= n + p:
        out -= 1
    return out


def _params(op: str, x: np.ndarray, nd: int, kernel_size, stride, padding, dilation=1, ceil_mode=False):
    k = expand_param(kernel_size, nd)
    s = expand_param(stride, nd, None) if stride not in (None, [], ()) else k
    p = expand_param(padding, nd, 0)
    d = expand_param(dilation, nd, 1)
    if x.ndim not in (nd + 1, nd + 2):
        raise UsageError(f"{op}: input of {x.ndim} dims (expected {nd + 1} or {nd + 2})")
    if any(pp * 2 > kk for pp, kk in zip(p, k, strict=True)):
        raise UsageError(f"{op}: padding {p} is more than half the kernel {k} (torch refuses it)")
    spatial = x.shape[x.ndim - nd :]
    out = [pool_out(n, kk, pp, ss, dd, bool(ceil_mode)) for n, kk, pp, ss, dd in zip(spatial, k, p, s, d, strict=True)]
    if any(o <= 0 for o in out):
        raise UsageError(f"{op}: output size {tuple(out)} is not positive for input {tuple(x.shape)}")
    # right padding so that every window fits (ceil_mode windows may run past the padding)
    hi = [
        max((o - 1) * ss + dd * (kk - 1) + 1 - n - pp, 0) for o, ss, dd, kk, n, pp in zip(out, s, d, k, spatial, p, strict=True)
    ]
    return k, s, p, d, out, hi


def _divisor(spatial, k, s, p, out, count_include_pad, divisor_override, dtype) -> np.ndarray | int:
    if divisor_override:
        return int(divisor_override)
    counts = []
    for n, kk, ss, pp, o in zip(spatial, k, s, p, out, strict=True):
        start = np.arange(o) * ss - pp
        end = np.minimum(start + kk, n + pp)
        if count_include_pad:
            c = end - start
        else:
            c = np.minimum(end, n) - np.maximum(start, 0)
        counts.append(c)
    div = counts[0]
    for c in counts[1:]:
        div = np.multiply.outer(div, c)
    return div


def _avg_pool(op: str, nd: int, x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
    k, s, p, _d, out, hi = _params(op, x, nd, kernel_size, stride, padding, 1, ceil_mode)
    xc = compute(x)
    if xc.dtype.kind in "iu":
        xc = xc.astype(np.int64)
    xp = pad_spatial(xc, p, hi)
    win = windows(xp, k, s, (1,) * nd, out)
    total = win.sum(axis=tuple(range(win.ndim - nd, win.ndim)))
    div = _divisor(x.shape[x.ndim - nd :], k, s, p, out, count_include_pad, divisor_override, xc.dtype)
    if total.dtype.kind in "iu":  # C++ integer division truncates toward zero
        q = np.abs(total) // div
        return finish(np.where(total < 0, -q, q), x.dtype)
    return finish(total / np.asarray(div, dtype=total.dtype), x.dtype)


@kernel("aten.avg_pool1d.default")
def avg_pool1d(self, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True):
    return _avg_pool("avg_pool1d", 1, self, kernel_size, stride, padding, ceil_mode, count_include_pad, None)


@kernel("aten.avg_pool2d.default")
def avg_pool2d(self, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True, divisor_override=None):
    return _avg_pool("avg_pool2d", 2, self, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)


@kernel("aten.avg_pool3d.default")
def avg_pool3d(self, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True, divisor_override=None):
    return _avg_pool("avg_pool3d", 3, self, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)


def _avg_pool_backward(op, nd, grad_output, x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
    k, s, p, _d, out, hi = _params(op, x, nd, kernel_size, stride, padding, 1, ceil_mode)
    spatial = x.shape[x.ndim - nd :]
    g = compute(grad_output)
    div = _divisor(spatial, k, s, p, out, count_include_pad, divisor_override, g.dtype)
    g = g / np.asarray(div, dtype=g.dtype)
    lead = g.shape[: g.ndim - nd]
    cols = np.broadcast_to(g.reshape(*lead, *(1,) * nd, *out), (*lead, *k, *out))
    full = [n + pp + h for n, pp, h in zip(spatial, p, hi, strict=True)]
    buf = scatter_windows(cols, nd, k, out, full, s, (1,) * nd)
    buf = buf[(Ellipsis,) + tuple(slice(pp, pp + n) for pp, n in zip(p, spatial, strict=True))]
    return finish(np.ascontiguousarray(buf), grad_output.dtype)


@kernel("aten.avg_pool2d_backward.default")
def avg_pool2d_backward(grad_output, self, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
    return _avg_pool_backward(
        "avg_pool2d_backward", 2, grad_output, self, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override
    )


@kernel("aten.avg_pool3d_backward.default")
def avg_pool3d_backward(grad_output, self, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
    return _avg_pool_backward(
        "avg_pool3d_backward", 3, grad_output, self, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override
    )


# -- max pooling ------------------------------------------------------------------------


def _lowest(dt: np.dtype):
    return -np.inf if dt.kind == "f" else np.iinfo(dt).min if dt.kind in "iu" else False


def _max_pool(
    op: str, nd: int, x, kernel_size, stride, padding, dilation, ceil_mode, indices: bool = True
) -> tuple[np.ndarray, np.ndarray | None]:
    k, s, p, d, out, hi = _params(op, x, nd, kernel_size, stride, padding, dilation, ceil_mode)
    xc = compute(x)
    spatial = x.shape[x.ndim - nd :]
    xp = pad_spatial(xc, p, hi, _lowest(xc.dtype))
    win = windows(xp, k, s, d, out)
    # one pass per window position over output-sized strided views (no copy of the windows):
    # a later position wins when it is greater or NaN (torch's `val > max || isnan(val)` scan:
    # the first maximum, or the last NaN)
    positions = list(np.ndindex(*k))
    vals = win[(Ellipsis,) + positions[0]].copy()
    if not indices:
        for pos in positions[1:]:
            np.maximum(vals, win[(Ellipsis,) + pos], out=vals)
        return finish(vals, x.dtype), None
    # masked writes (np.where, copyto(where=)) cost 10x an arithmetic pass on random masks:
    # the values are a running np.maximum (which propagates NaN: the same value as torch's
    # scan), the window position the running max of upd * position (positions only grow)
    arg = np.zeros(vals.shape, dtype=np.int64)
    upd = np.empty(vals.shape, dtype=bool)
    nan = np.empty(vals.shape, dtype=bool)
    take = np.empty(vals.shape, dtype=np.int64)
    for p_i, pos in enumerate(positions[1:], 1):
        v = win[(Ellipsis,) + pos]
        np.greater(v, vals, out=upd)
        if xc.dtype.kind == "f":
            np.logical_or(upd, np.not_equal(v, v, out=nan), out=upd)
        np.multiply(upd, p_i, out=take)
        np.maximum(arg, take, out=arg)
        np.maximum(vals, v, out=vals)
    # the input's flat (per plane) index: the window start's plus the window position's offset
    # (a table over positions, taken by arg: cheaper than unravelling arg)
    plane_strides = [math.prod(spatial[i + 1 :]) for i in range(nd)]
    offs = np.array([sum(q * d[i] * plane_strides[i] for i, q in enumerate(pos)) for pos in positions], dtype=np.int64)
    index = offs.take(arg)
    for i in range(nd):
        shape = [1] * arg.ndim
        shape[arg.ndim - nd + i] = out[i]
        start = (np.arange(out[i], dtype=np.int64) * s[i] - p[i]).reshape(shape)
        index += start * plane_strides[i]
    return finish(vals, x.dtype), index


@kernel("aten.max_pool2d_with_indices.default")
def max_pool2d_with_indices(self, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    return _max_pool("max_pool2d_with_indices", 2, self, kernel_size, stride, padding, dilation, ceil_mode)


@kernel("aten.max_pool3d_with_indices.default")
def max_pool3d_with_indices(self, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    return _max_pool("max_pool3d_with_indices", 3, self, kernel_size, stride, padding, dilation, ceil_mode)


@kernel("aten.max_pool1d_with_indices.default")
def max_pool1d_with_indices(self, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    return _max_pool("max_pool1d_with_indices", 1, self, kernel_size, stride, padding, dilation, ceil_mode)


@kernel("aten.max_pool1d.default")
def max_pool1d(self, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    return _max_pool("max_pool1d", 1, self, kernel_size, stride, padding, dilation, ceil_mode, indices=False)[0]


@first_only("aten.max_pool1d_with_indices.default")
def max_pool1d_values(self, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    return _max_pool("max_pool1d_with_indices", 1, self, kernel_size, stride, padding, dilation, ceil_mode, indices=False)


@kernel("aten.max_pool2d.default")
def max_pool2d(self, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    return _max_pool("max_pool2d", 2, self, kernel_size, stride, padding, dilation, ceil_mode, indices=False)[0]


@first_only("aten.max_pool2d_with_indices.default")
def max_pool2d_values(self, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    return _max_pool("max_pool2d_with_indices", 2, self, kernel_size, stride, padding, dilation, ceil_mode, indices=False)


@kernel("aten.max_pool3d.default")
def max_pool3d(self, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    return _max_pool("max_pool3d", 3, self, kernel_size, stride, padding, dilation, ceil_mode, indices=False)[0]


@first_only("aten.max_pool3d_with_indices.default")
def max_pool3d_values(self, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    return _max_pool("max_pool3d_with_indices", 3, self, kernel_size, stride, padding, dilation, ceil_mode, indices=False)


def _max_pool_backward(nd: int, grad_output, x, indices) -> np.ndarray:
    g = compute(grad_output)
    spatial = x.shape[x.ndim - nd :]
    plane = math.prod(spatial)
    lead = x.shape[: x.ndim - nd]
    nplanes = math.prod(lead)
    idx = indices.reshape(nplanes, -1).astype(np.int64) + (np.arange(nplanes, dtype=np.int64) * plane)[:, None]
    buf = np.zeros(nplanes * plane, dtype=g.dtype)
    np.add.at(buf, idx.ravel(), g.reshape(nplanes, -1).ravel())
    return finish(buf.reshape(x.shape), grad_output.dtype)


@kernel("aten.max_pool2d_with_indices_backward.default")
def max_pool2d_with_indices_backward(grad_output, self, kernel_size, stride, padding, dilation, ceil_mode, indices):
    return _max_pool_backward(2, grad_output, self, indices)


@kernel("aten.max_pool3d_with_indices_backward.default")
def max_pool3d_with_indices_backward(grad_output, self, kernel_size, stride, padding, dilation, ceil_mode, indices):
    return _max_pool_backward(3, grad_output, self, indices)


# -- adaptive average pooling -----------------------------------------------------------


def _adaptive_matrix(n: int, o: int) -> tuple[np.ndarray, np.ndarray]:
    """The 0/1 matrix ``(o, n)`` of adaptive windows and each window's length."""
    i = np.arange(o)
    start = (i * n) // o
    end = -((-(i + 1) * n) // o)  # ceil
    cols = np.arange(n)
    m = (cols[None, :] >= start[:, None]) & (cols[None, :] < end[:, None])
    return m, end - start


def _apply_dims(x: np.ndarray, mats: Sequence[np.ndarray]) -> np.ndarray:
    nd = len(mats)
    for i, m in enumerate(mats):
        axis = x.ndim - nd + i
        x = np.moveaxis(np.tensordot(x, m.T, axes=([axis], [0])), -1, axis)
    return x


def _adaptive_avg(op: str, nd: int, x: np.ndarray, output_size) -> np.ndarray:
    if x.ndim not in (nd + 1, nd + 2):
        raise UsageError(f"{op}: input of {x.ndim} dims (expected {nd + 1} or {nd + 2})")
    osz = expand_param(output_size, nd)
    xc = compute(x)
    if xc.dtype.kind not in "fc":
        raise UnsupportedError(f"{op}: torch has no CPU kernel for dtype {x.dtype}")
    spatial = x.shape[x.ndim - nd :]
    mats, counts = zip(*(_adaptive_matrix(n, o) for n, o in zip(spatial, osz, strict=True)), strict=True)
    total = _apply_dims(xc, [m.astype(xc.dtype) for m in mats])
    div = counts[0]
    for c in counts[1:]:
        div = np.multiply.outer(div, c)
    return finish(total / div.astype(compute_dtype(xc.dtype)), x.dtype)


@kernel("aten.adaptive_avg_pool1d.default")
def adaptive_avg_pool1d(self, output_size):
    return _adaptive_avg("adaptive_avg_pool1d", 1, self, output_size)


@kernel("aten._adaptive_avg_pool2d.default", "aten.adaptive_avg_pool2d.default")
def adaptive_avg_pool2d(self, output_size):
    return _adaptive_avg("adaptive_avg_pool2d", 2, self, output_size)


@kernel("aten._adaptive_avg_pool3d.default", "aten.adaptive_avg_pool3d.default")
def adaptive_avg_pool3d(self, output_size):
    return _adaptive_avg("adaptive_avg_pool3d", 3, self, output_size)


def _adaptive_avg_backward(nd: int, grad_output, x) -> np.ndarray:
    g = compute(grad_output)
    spatial = x.shape[x.ndim - nd :]
    osz = g.shape[g.ndim - nd :]
    mats, counts = zip(*(_adaptive_matrix(n, o) for n, o in zip(spatial, osz, strict=True)), strict=True)
    div = counts[0]
    for c in counts[1:]:
        div = np.multiply.outer(div, c)
    g = g / div.astype(g.dtype)
    return finish(_apply_dims(g, [m.T.astype(g.dtype) for m in mats]), grad_output.dtype)


@kernel("aten._adaptive_avg_pool2d_backward.default")
def adaptive_avg_pool2d_backward(grad_output, self):
    return _adaptive_avg_backward(2, grad_output, self)


@kernel("aten._adaptive_avg_pool3d_backward.default")
def adaptive_avg_pool3d_backward(grad_output, self):
    return _adaptive_avg_backward(3, grad_output, self)
