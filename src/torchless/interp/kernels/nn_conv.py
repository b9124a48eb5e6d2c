"""Convolution kernels: ``convolution`` (every stride/padding/dilation/groups, transposed with
``output_padding``, 1d/2d/3d), its backward, ``col2im``, and the training-IR wrappers
(``conv1d``/``conv2d``/``conv3d`` incl. ``padding="same"``, ``conv_transpose1d/2d/3d``).

Vectorised as torch's CPU "slow" path is: a forward convolution is one im2col (a strided
view of the padded input, copied once) and one matrix product per group (BLAS); depthwise
convolutions (one input and one output channel per group) accumulate over the kernel's
positions instead. A transposed convolution multiplies first and scatters the columns back
(col2im), one vectorised add per kernel position; no Python loop runs over elements.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ...core.errors import UnsupportedError, UsageError
from ..registry import kernel
from ._nn_util import compute, expand_param, finish, pad_spatial, require_float, windows


def _out_sizes(
    op: str,
    spatial: Sequence[int],
    k: Sequence[int],
    s: Sequence[int],
    p_lo: Sequence[int],
    p_hi: Sequence[int],
    d: Sequence[int],
) -> list[int]:
    out = [(n + a + b - dd * (kk - 1) - 1) // ss + 1 for n, kk, ss, a, b, dd in zip(spatial, k, s, p_lo, p_hi, d, strict=False)]
    if any(o <= 0 for o in out):
        raise UsageError(f"{op}: the (padded) input {tuple(spatial)} is smaller than the kernel {tuple(k)}")
    return out


def conv_forward(
    x: np.ndarray,
    w: np.ndarray,
    stride: Sequence[int],
    pad_lo: Sequence[int],
    pad_hi: Sequence[int],
    dilation: Sequence[int],
    groups: int,
) -> np.ndarray:
    """The forward (cross-correlation) convolution of ``x`` ``(N, C, *S)`` with ``w``
    ``(Cout, C/groups, *K)``, in the inputs' (compute) dtype, contiguous ``(N, Cout, *O)``."""
    nd = w.ndim - 2
    n, c = x.shape[:2]
    cout, cg = w.shape[:2]
    k = w.shape[2:]
    g = groups
    if c != cg * g or cout % g:
        raise UsageError(f"convolution: input channels {c} and weight {tuple(w.shape)} do not fit groups={g}")
    og = cout // g
    out = _out_sizes("convolution", x.shape[2:], k, stride, pad_lo, pad_hi, dilation)
    xp = pad_spatial(x, pad_lo, pad_hi)
    win = windows(xp, k, stride, dilation, out)  # (N, C, *O, *K)
    npos = math.prod(out)
    kk = math.prod(k)
    if cg == 1 and og == 1:  # depthwise: accumulate over kernel positions
        wf = w.reshape(c, kk)
        y = np.zeros((n, c, *out), dtype=np.result_type(x.dtype, w.dtype))
        bshape = (1, c) + (1,) * nd
        for i, pos in enumerate(np.ndindex(*k)):
            y += win[(Ellipsis,) + tuple(pos)] * wf[:, i].reshape(bshape)
        return y
    cols = _im2col(win, g, cg, nd)  # (G, Cg*KK, N*P)
    y = np.matmul(w.reshape(g, og, cg * kk), cols)  # (G, Og, N*P)
    y = y.reshape(cout, n, npos)
    if n > 1:
        y = np.ascontiguousarray(y.transpose(1, 0, 2))
    return y.reshape(n, cout, *out)


def _im2col(win: np.ndarray, g: int, cg: int, nd: int) -> np.ndarray:
    """The windows ``(N, C, *O, *K)`` as columns ``(G, Cg*KK, N*P)``: one copy whose inner
    loop runs along the output positions (contiguous rows of the input for stride 1)."""
    n = win.shape[0]
    out, k = win.shape[2 : 2 + nd], win.shape[2 + nd :]
    win = win.reshape(n, g, cg, *out, *k)
    perm = (1, 2, *range(3 + nd, 3 + 2 * nd), 0, *range(3, 3 + nd))
    return win.transpose(perm).reshape(g, cg * math.prod(k), n * math.prod(out))


def scatter_windows(
    cols: np.ndarray,
    nd: int,
    k: Sequence[int],
    blocks: Sequence[int],
    full: Sequence[int],
    stride: Sequence[int],
    dilation: Sequence[int],
) -> np.ndarray:
    """col2im: ``cols`` ``(*lead, *K, *blocks)`` summed into ``(*lead, *full)``, block ``b``'s
    kernel position ``k`` landing at ``b*stride + k*dilation``."""
    lead = cols.shape[: cols.ndim - 2 * nd]
    buf = np.zeros((*lead, *full), dtype=cols.dtype)
    for pos in np.ndindex(*k):
        sl = tuple(slice(p * d, p * d + (b - 1) * s + 1, s) for p, d, b, s in zip(pos, dilation, blocks, stride, strict=False))
        buf[(Ellipsis,) + sl] += cols[(Ellipsis,) + tuple(pos) + (slice(None),) * nd]
    return buf


def conv_transpose(
    x: np.ndarray,
    w: np.ndarray,
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int],
    output_padding: Sequence[int],
    groups: int,
) -> np.ndarray:
    """The transposed convolution of ``x`` ``(N, Cin, *I)`` with ``w`` ``(Cin, Cout/groups, *K)``."""
    nd = w.ndim - 2
    n, cin = x.shape[:2]
    og = w.shape[1]
    k = w.shape[2:]
    g = groups
    if cin != w.shape[0] or cin % g:
        raise UsageError(f"conv_transpose: input channels {cin} and weight {tuple(w.shape)} do not fit groups={g}")
    cg = cin // g
    inner = x.shape[2:]
    npos = math.prod(inner)
    kk = math.prod(k)
    xm = x.reshape(n, g, cg, npos).transpose(1, 0, 3, 2).reshape(g, n * npos, cg)
    cols = np.matmul(xm, w.reshape(g, cg, og * kk))  # (G, N*P, Og*KK)
    cols = cols.reshape(g, n, *inner, og, *k)
    perm = (1, 0, 2 + nd, *range(3 + nd, 3 + 2 * nd), *range(2, 2 + nd))
    cols = cols.transpose(perm)  # (N, G, Og, *K, *I)
    full = [
        (i - 1) * s + d * (kk_ - 1) + 1 + op for i, s, d, kk_, op in zip(inner, stride, dilation, k, output_padding, strict=False)
    ]
    out = [f - 2 * p for f, p in zip(full, padding, strict=False)]
    if any(o <= 0 for o in out):
        raise UsageError(f"conv_transpose: output size {tuple(out)} is not positive")
    buf = scatter_windows(cols, nd, k, inner, full, stride, dilation)
    buf = buf[(Ellipsis,) + tuple(slice(p, p + o) for p, o in zip(padding, out, strict=False))]
    return np.ascontiguousarray(buf).reshape(n, g * og, *out)


def conv_weight_grad(
    x: np.ndarray,
    gy: np.ndarray,
    kshape: Sequence[int],
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int],
    groups: int,
) -> np.ndarray:
    """d(conv_forward(x, w))/dw contracted with ``gy``: shape ``(Cout, C/groups, *K)``."""
    nd = len(kshape)
    n, c = x.shape[:2]
    cout = gy.shape[1]
    g = groups
    cg, og = c // g, cout // g
    out = gy.shape[2:]
    npos = math.prod(out)
    xp = pad_spatial(x, padding, padding)
    cols = _im2col(windows(xp, kshape, stride, dilation, out), g, cg, nd)  # (G, Cg*KK, N*P)
    g2 = gy.reshape(n, g, og, npos).transpose(1, 2, 0, 3).reshape(g, og, n * npos)
    return np.matmul(g2, cols.transpose(0, 2, 1)).reshape(cout, cg, *kshape)


def _batchify(x: np.ndarray, w: np.ndarray, unbatched_ok: bool = True) -> tuple[np.ndarray, bool]:
    """``x`` with a batch dim; conv1d/2d/3d take an unbatched ``(C, *S)`` input, the
    ``convolution`` op does not."""
    if x.ndim == w.ndim - 1 and unbatched_ok:
        return x[None], True
    if x.ndim != w.ndim:
        raise UsageError(f"convolution: input of {x.ndim} dims for a weight of {w.ndim}")
    return x, False


def _convolution(x, w, bias, stride, padding, dilation, transposed, output_padding, groups, unbatched_ok=False) -> np.ndarray:
    if x.dtype.kind == "b":
        raise UnsupportedError("convolution: torch has no CPU kernel for bool")
    nd = w.ndim - 2
    if nd < 1:
        raise UsageError(f"convolution: weight of {w.ndim} dims")
    dtype = x.dtype
    xb, unbatched = _batchify(compute(x), w, unbatched_ok)
    wc = compute(w)
    stride = expand_param(stride, nd, 1)
    dilation = expand_param(dilation, nd, 1)
    if isinstance(padding, str):
        if transposed:
            raise UnsupportedError(f"conv_transpose: padding={padding!r}")
        lo, hi = _padding_mode(padding, wc.shape[2:], dilation, stride)
    else:
        lo = hi = list(expand_param(padding, nd, 0))
    groups = int(groups)
    if transposed:
        y = conv_transpose(xb, wc, stride, lo, dilation, expand_param(output_padding, nd, 0), groups)
    else:
        y = conv_forward(xb, wc, stride, lo, hi, dilation, groups)
    if bias is not None:
        y += compute(bias).reshape((1, -1) + (1,) * nd)
    return finish(y[0] if unbatched else y, dtype)


def _padding_mode(mode: str, k: Sequence[int], dilation: Sequence[int], stride: Sequence[int]) -> tuple[list[int], list[int]]:
    if mode == "valid":
        return [0] * len(k), [0] * len(k)
    if mode != "same":
        raise UsageError(f"convolution: padding={mode!r} (torch knows 'valid' and 'same')")
    if any(s != 1 for s in stride):
        raise UsageError("convolution: padding='same' needs stride 1 (as in torch)")
    total = [d * (kk - 1) for d, kk in zip(dilation, k, strict=False)]
    lo = [t // 2 for t in total]
    return lo, [t - a for t, a in zip(total, lo, strict=False)]


@kernel("aten.convolution.default")
def convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    return _convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups)


@kernel("aten._convolution.default", "aten._convolution.deprecated")
def _convolution_legacy(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups, *_flags):
    return _convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups)


@kernel(
    "aten.conv1d.default",
    "aten.conv2d.default",
    "aten.conv3d.default",
    "aten.conv1d.padding",
    "aten.conv2d.padding",
    "aten.conv3d.padding",
)
def conv_nd(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    return _convolution(input, weight, bias, stride, padding, dilation, False, 0, groups, unbatched_ok=True)


@kernel("aten.conv_transpose1d.default", "aten.conv_transpose2d.input", "aten.conv_transpose3d.input")
def conv_transpose_nd(input, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1):
    return _convolution(input, weight, bias, stride, padding, dilation, True, output_padding, groups, unbatched_ok=True)


@kernel("aten.convolution_backward.default")
def convolution_backward(
    grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed, output_padding, groups, output_mask
):
    require_float("convolution_backward", grad_output, input, weight)
    nd = weight.ndim - 2
    stride = expand_param(stride, nd, 1)
    padding = expand_param(padding, nd, 0)
    dilation = expand_param(dilation, nd, 1)
    output_padding = expand_param(output_padding, nd, 0)
    groups = int(groups)
    gy, unbatched = _batchify(compute(grad_output), weight, False)
    x, _ = _batchify(compute(input), weight, False)
    w = compute(weight)
    k = w.shape[2:]
    gi = gw = gb = None
    if output_mask[0]:
        if transposed:
            gi = conv_forward(gy, w, stride, padding, padding, dilation, groups)
        else:
            full = [
                (o - 1) * s - 2 * p + d * (kk - 1) + 1
                for o, s, p, d, kk in zip(gy.shape[2:], stride, padding, dilation, k, strict=False)
            ]
            op = [i - f for i, f in zip(x.shape[2:], full, strict=False)]
            gi = conv_transpose(gy, w, stride, padding, dilation, op, groups)
        gi = finish(gi[0] if unbatched else gi, input.dtype)
    if output_mask[1]:
        if transposed:
            gw = conv_weight_grad(gy, x, k, stride, padding, dilation, groups)
        else:
            gw = conv_weight_grad(x, gy, k, stride, padding, dilation, groups)
        gw = finish(gw, weight.dtype)
    if output_mask[2]:
        gb = finish(gy.sum(axis=(0, *range(2, gy.ndim))), grad_output.dtype)
    return gi, gw, gb


@kernel("aten.col2im.default")
def col2im(input, output_size, kernel_size, dilation, padding, stride):
    require_float("col2im", input)
    k = expand_param(kernel_size, 2)
    d = expand_param(dilation, 2, 1)
    p = expand_param(padding, 2, 0)
    s = expand_param(stride, 2, 1)
    osz = expand_param(output_size, 2)
    x = compute(input)
    unbatched = x.ndim == 2
    if unbatched:
        x = x[None]
    n, ckk, length = x.shape
    kk = k[0] * k[1]
    blocks = [(o + 2 * pp - dd * (kk_ - 1) - 1) // ss + 1 for o, pp, dd, kk_, ss in zip(osz, p, d, k, s, strict=False)]
    if ckk % kk or length != blocks[0] * blocks[1]:
        raise UsageError(f"col2im: input {tuple(input.shape)} does not fit kernel {k} and {blocks[0]}x{blocks[1]} blocks")
    cols = x.reshape(n, ckk // kk, *k, *blocks)
    full = [o + 2 * pp for o, pp in zip(osz, p, strict=False)]
    buf = scatter_windows(cols, 2, k, blocks, full, s, d)
    y = buf[..., p[0] : p[0] + osz[0], p[1] : p[1] + osz[1]]
    return finish(np.ascontiguousarray(y[0] if unbatched else y), input.dtype)


_: Any = None
