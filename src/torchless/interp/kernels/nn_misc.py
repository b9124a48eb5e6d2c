"""nn kernels besides convolution, pooling and normalisation: embeddings, padding
(reflection, replication, ``pad``; ``constant_pad_nd`` is the shape family's),
upsampling, ``grid_sampler_2d``, dropout, the activations of the nn family (mish,
softplus, the in-place SiLU/hardswish/hardsigmoid), ``linear``/``matmul``, scaled dot-product
attention, ``flatten``/``unflatten``, and the losses training IR keeps
(``cross_entropy_loss``, ``nll_loss*``, ``mse_loss``, ``l1_loss``, binary cross-entropy).

Random kernels (dropout in train mode, attention dropout) draw from the generator of the
creation kernels (``kernels.create``, reseeded by ``create.seed(n)``): the same
distribution as torch, never the same bits (torch's CPU generator is a Mersenne Twister
consumed in its own order).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from ...core.errors import UnsupportedError, UsageError
from ..registry import kernel
from . import create
from ._common import row_max
from ._nn_util import compute, compute_dtype, finish, require_float


def _rng() -> np.random.Generator:
    """The interpreter's one generator (``create.seed`` replaces it, so look it up per call)."""
    return create._RNG


def _check_index(op: str, idx: np.ndarray, n: int) -> None:
    if idx.dtype.kind not in "iu":
        raise UsageError(f"{op}: indices must be an integer tensor, not {idx.dtype}")
    if idx.size and (idx.min() < 0 or idx.max() >= n):
        raise UsageError(f"{op}: index out of range", expected=f"0 <= index < {n}", found=f"{idx.min()}..{idx.max()}")


# -- embeddings ---------------------------------------------------------------------------


@kernel("aten.embedding.default")
def embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    if weight.ndim != 2:
        raise UsageError(f"embedding: weight must be 2-D, found {weight.ndim}-D")
    _check_index("embedding", indices, weight.shape[0])
    return np.take(weight, indices, axis=0)


@kernel("aten.embedding_dense_backward.default")
def embedding_dense_backward(grad_output, indices, num_weights, padding_idx, scale_grad_by_freq):
    num_weights = int(num_weights)
    idx = indices.reshape(-1).astype(np.int64)
    _check_index("embedding_dense_backward", idx, num_weights)
    g = compute(grad_output).reshape(idx.size, -1)
    if scale_grad_by_freq:
        counts = np.bincount(idx, minlength=num_weights)
        g = g / counts[idx][:, None].astype(g.dtype)
    if padding_idx is not None and padding_idx >= 0:
        keep = idx != padding_idx
        idx, g = idx[keep], g[keep]
    out = np.zeros((num_weights, g.shape[1]), dtype=g.dtype)
    np.add.at(out, idx, g)
    return finish(out, grad_output.dtype)


@kernel("aten._embedding_bag.default", "aten._embedding_bag_forward_only.default")
def embedding_bag(
    weight,
    indices,
    offsets,
    scale_grad_by_freq=False,
    mode=0,
    sparse=False,
    per_sample_weights=None,
    include_last_offset=False,
    padding_idx=-1,
):
    """(output, offset2bag, bag_size, max_indices). ``output`` is torch's; the other three
    have torch's meaning (the bag of each index, the bag's count of non-padding indices,
    each output element's source row in max mode, else the bag size) rather than the
    placeholders torch's CPU kernel leaves in some modes."""
    if indices.ndim != 1:
        raise UnsupportedError("_embedding_bag: 2-D indices (the functional flattens them first)")
    idx = indices.astype(np.int64)
    _check_index("_embedding_bag", idx, weight.shape[0])
    off = offsets.astype(np.int64)
    nbags = len(off) - 1 if include_last_offset else len(off)
    starts = off[:nbags]
    pos = np.arange(idx.size)
    offset2bag = np.clip(np.searchsorted(starts, pos, side="right") - 1, 0, max(nbags - 1, 0))
    # (the last bag runs to the end of indices, include_last_offset or not, as in torch)
    valid = idx != padding_idx if padding_idx is not None and padding_idx >= 0 else np.ones(idx.size, dtype=bool)
    w = compute(weight)
    rows = w[idx]
    if per_sample_weights is not None:
        if mode != 0:
            raise UsageError("_embedding_bag: per_sample_weights need mode 'sum'")
        rows = rows * compute(per_sample_weights)[:, None]
    d = w.shape[1]
    bag_size = np.bincount(offset2bag[valid], minlength=nbags).astype(np.int64)[:nbags]
    if mode in (0, 1):
        out = np.zeros((nbags, d), dtype=w.dtype)
        np.add.at(out, offset2bag[valid], rows[valid])
        if mode == 1:
            out = out / np.maximum(bag_size, 1)[:, None].astype(w.dtype)
        max_indices = bag_size.copy()
    elif mode == 2:
        out = np.full((nbags, d), -np.inf, dtype=w.dtype)
        np.maximum.at(out, offset2bag[valid], rows[valid])
        empty = bag_size == 0
        out[empty] = 0
        # the row each maximum came from: the first index of the bag holding it
        vi = np.nonzero(valid)[0]
        hit = rows[vi] == out[offset2bag[vi]]
        max_indices = np.full((nbags, d), -1, dtype=np.int64)
        bags = np.broadcast_to(offset2bag[vi][:, None], hit.shape)
        cols = np.broadcast_to(np.arange(d)[None, :], hit.shape)
        src = np.broadcast_to(idx[vi][:, None], hit.shape)
        order = np.arange(len(vi))[::-1]  # earliest index last, so it wins the assignment
        sel = hit[order]
        max_indices[bags[order][sel], cols[order][sel]] = src[order][sel]
        max_indices[empty] = 0
    else:
        raise UsageError(f"_embedding_bag: mode {mode} (0 sum, 1 mean, 2 max)")
    return finish(out, weight.dtype), offset2bag.astype(np.int64), bag_size, max_indices


# -- padding ------------------------------------------------------------------------------


def _pad(op: str, x: np.ndarray, padding: Sequence[int], mode: str, value=0) -> np.ndarray:
    if mode == "edge":
        return _replicate(op, x, padding)
    padding = [int(p) for p in padding]
    if len(padding) % 2 or len(padding) // 2 > x.ndim:
        raise UsageError(f"{op}: padding {padding} for an input of {x.ndim} dims")
    nd = len(padding) // 2
    widths = [(0, 0)] * (x.ndim - nd) + [(padding[2 * i], padding[2 * i + 1]) for i in reversed(range(nd))]
    crop = tuple(slice(max(-a, 0), x.shape[i] - max(-b, 0)) for i, (a, b) in enumerate(widths))
    x = x[crop]
    pos = [(max(a, 0), max(b, 0)) for a, b in widths]
    if mode == "reflect":
        for i, (a, b) in enumerate(pos):
            if (a or b) and (a >= x.shape[i] or b >= x.shape[i]):
                raise UsageError(f"{op}: padding ({a}, {b}) must be less than the dimension {x.shape[i]}")
        return np.pad(x, pos, mode="reflect")
    if mode == "circular":
        return np.pad(x, pos, mode="wrap")
    return np.pad(x, pos, constant_values=value)


@kernel("aten.reflection_pad1d.default", "aten.reflection_pad2d.default", "aten.reflection_pad3d.default")
def reflection_pad(self, padding):
    return _pad("reflection_pad", self, padding, "reflect")


def _replicate(op: str, x: np.ndarray, padding: Sequence[int]) -> np.ndarray:
    """out[j] = in[clamp(j - left, 0, n - 1)] along each padded dim (negative amounts too)."""
    padding = [int(p) for p in padding]
    if len(padding) % 2 or len(padding) // 2 > x.ndim:
        raise UsageError(f"{op}: padding {padding} for an input of {x.ndim} dims")
    for i in range(len(padding) // 2):
        axis = x.ndim - 1 - i
        left, right = padding[2 * i], padding[2 * i + 1]
        n = x.shape[axis]
        size = n + left + right
        if n == 0 or size < 0:
            raise UsageError(f"{op}: padding ({left}, {right}) of a dimension of size {n}")
        x = np.take(x, np.clip(np.arange(size) - left, 0, n - 1), axis=axis)
    return x


@kernel("aten.replication_pad1d.default", "aten.replication_pad2d.default", "aten.replication_pad3d.default")
def replication_pad(self, padding):
    return _replicate("replication_pad", self, padding)


@kernel("aten.pad.default")
def pad(self, pad, mode="constant", value=None):
    modes = {"constant": "constant", "reflect": "reflect", "replicate": "edge", "circular": "circular"}
    if mode not in modes:
        raise UnsupportedError(f"pad: mode {mode!r}")
    v = np.asarray(0 if value is None else value).astype(self.dtype)
    return _pad("pad", self, pad, modes[mode], v)


# -- upsampling ---------------------------------------------------------------------------


def _scale_value(scale: float | None, n_in: int, n_out: int, dt) -> np.ndarray:
    """torch's ``compute_scales_value``: 1/scale when given (> 0), else in/out, in ``dt``."""
    if scale is not None and scale > 0:
        return dt.type(1.0 / scale)
    return dt.type(n_in) / dt.type(n_out)


def _nearest_index(n_in: int, n_out: int, scale: float | None, exact: bool) -> np.ndarray:
    i = np.arange(n_out)
    if not exact:
        if n_out == n_in:
            return i
        if n_out == 2 * n_in:
            return i >> 1
    f32 = np.dtype(np.float32)
    s = _scale_value(scale, n_in, n_out, f32)
    src = np.floor((i.astype(np.float32) + np.float32(0.5 if exact else 0.0)) * s).astype(np.int64)
    return np.minimum(src, n_in - 1)


def _linear_scale(n_in: int, n_out: int, align_corners: bool, scale: float | None, dt) -> np.ndarray:
    if align_corners:
        return dt.type(n_in - 1) / dt.type(n_out - 1) if n_out > 1 else dt.type(0)
    return _scale_value(scale, n_in, n_out, dt)


def _source_index(scale, n_out: int, align_corners: bool, cubic: bool, dt) -> np.ndarray:
    i = np.arange(n_out).astype(dt)
    if align_corners:
        return scale * i
    src = scale * (i + dt.type(0.5)) - dt.type(0.5)
    return src if cubic else np.maximum(src, dt.type(0))


def _cubic_coeffs(t: np.ndarray) -> list[np.ndarray]:
    a = t.dtype.type(-0.75)
    one = t.dtype.type(1)

    def c1(x):  # |x| <= 1
        return ((a + 2) * x - (a + 3)) * x * x + 1

    def c2(x):  # 1 < |x| < 2
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a

    return [c2(t + one), c1(t), c1(one - t), c2(2 * one - t)]


def _axis_taps(n_in: int, n_out: int, mode: str, align_corners: bool, scale: float | None, dt: np.dtype, shape: list[int]):
    """The (index, weight) taps of one resized axis (linear 2, cubic 4); each weight has
    ``shape`` (the output's along the axis, 1 elsewhere)."""
    s = _linear_scale(n_in, n_out, align_corners, scale, dt)
    if mode == "linear":
        src = _source_index(s, n_out, align_corners, False, dt)
        i0 = src.astype(np.int64)
        i1 = i0 + (i0 < n_in - 1)
        l1 = np.clip(src - i0.astype(dt), 0, 1)
        l0 = dt.type(1) - l1
        return [(i0, l0.reshape(shape)), (i1, l1.reshape(shape))]
    src = _source_index(s, n_out, align_corners, True, dt)
    f = np.floor(src)
    i0 = f.astype(np.int64)
    t = src - f
    return [(np.clip(i0 - 1 + j, 0, n_in - 1), c.reshape(shape)) for j, c in enumerate(_cubic_coeffs(t))]


def _weighted_taps(x: np.ndarray, axis: int, taps: list[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
    """``sum_j take(x, idx_j, axis) * w_j``, added left to right; each product computed
    in place in its gathered copy."""
    acc = np.take(x, taps[0][0], axis=axis, mode="clip")  # indices in range by construction
    acc *= taps[0][1]
    tmp = np.empty_like(acc)
    for idx, w in taps[1:]:
        np.take(x, idx, axis=axis, out=tmp, mode="clip")  # clip: no copy of out
        tmp *= w
        acc += tmp
    return acc


#: elements of output one block of (batch x channel) planes is resized in: its temporaries
#: stay in cache and are reused from the heap (whole-size temporaries were fresh pages to
#: fault in on every call, which cost more than the arithmetic)
_RESIZE_BLOCK = 1 << 16


def _upsample(op: str, nd: int, x, output_size, scales, mode: str, align_corners: bool = False):
    if x.ndim != nd + 2:
        raise UsageError(f"{op}: input of {x.ndim} dims (expected {nd + 2})")
    spatial = x.shape[2:]
    scales = list(scales) if scales is not None else [None] * nd
    if output_size is None or len(output_size) == 0:
        if any(s is None for s in scales):
            raise UsageError(f"{op}: needs output_size or scale_factors")
        output_size = [int(math.floor(n * float(s))) for n, s in zip(spatial, scales, strict=True)]
    output_size = [int(o) for o in output_size]
    if len(output_size) != nd or any(o <= 0 for o in output_size):
        raise UsageError(f"{op}: output size {output_size}")
    if mode in ("nearest", "nearest-exact"):
        y = x
        for i in range(nd):
            y = np.take(y, _nearest_index(spatial[i], output_size[i], scales[i], mode == "nearest-exact"), axis=2 + i)
        return finish(np.ascontiguousarray(y), x.dtype)
    require_float(op, x)
    y = compute(x)
    dt = y.dtype
    rows = x.shape[0] * x.shape[1]
    y = np.reshape(y, (rows, *spatial))
    # the last spatial dim first, as torch's kernel nests its sums (each row along W, then
    # those along H, then D): the same grouping of the products, and the contiguous axis
    # (the slowest to gather along) resized while the array is smallest when upsampling
    taps = {}
    for i in reversed(range(nd)):
        shape = [1] * (nd + 1)
        shape[1 + i] = output_size[i]
        taps[i] = _axis_taps(spatial[i], output_size[i], mode, align_corners, scales[i], dt, shape)
    out = np.empty((rows, *output_size), dt)
    step = max(1, _RESIZE_BLOCK // max(1, math.prod(output_size)))
    for r in range(0, rows, step):
        z = y[r : r + step]
        for i in reversed(range(nd)):
            z = _weighted_taps(z, 1 + i, taps[i])
        out[r : r + step] = z
    return finish(out.reshape(*x.shape[:2], *output_size), x.dtype)


def _vec(nd: int, mode: str, op: str) -> Callable[..., np.ndarray]:
    def nearest(input, output_size, scale_factors):
        return _upsample(op, nd, input, output_size, scale_factors, mode)

    def interpolating(input, output_size, align_corners, scale_factors):
        return _upsample(op, nd, input, output_size, scale_factors, mode, align_corners)

    return nearest if mode in ("nearest", "nearest-exact") else interpolating


for _nd, _dim in ((1, "1d"), (2, "2d"), (3, "3d")):
    kernel(f"aten.upsample_nearest{_dim}.vec")(_vec(_nd, "nearest", f"upsample_nearest{_dim}"))
    kernel(f"aten._upsample_nearest_exact{_dim}.vec")(_vec(_nd, "nearest-exact", f"_upsample_nearest_exact{_dim}"))
kernel("aten.upsample_linear1d.vec")(_vec(1, "linear", "upsample_linear1d"))
kernel("aten.upsample_bilinear2d.vec")(_vec(2, "linear", "upsample_bilinear2d"))
kernel("aten.upsample_trilinear3d.vec")(_vec(3, "linear", "upsample_trilinear3d"))
kernel("aten.upsample_bicubic2d.vec")(_vec(2, "cubic", "upsample_bicubic2d"))


@kernel("aten.upsample_nearest1d.default")
def upsample_nearest1d(self, output_size, scales=None):
    return _upsample("upsample_nearest1d", 1, self, output_size, [scales], "nearest")


@kernel("aten.upsample_nearest2d.default")
def upsample_nearest2d(self, output_size, scales_h=None, scales_w=None):
    return _upsample("upsample_nearest2d", 2, self, output_size, [scales_h, scales_w], "nearest")


@kernel("aten.upsample_nearest3d.default")
def upsample_nearest3d(self, output_size, scales_d=None, scales_h=None, scales_w=None):
    return _upsample("upsample_nearest3d", 3, self, output_size, [scales_d, scales_h, scales_w], "nearest")


@kernel("aten.upsample_linear1d.default")
def upsample_linear1d(self, output_size, align_corners, scales=None):
    return _upsample("upsample_linear1d", 1, self, output_size, [scales], "linear", align_corners)


@kernel("aten.upsample_bilinear2d.default")
def upsample_bilinear2d(self, output_size, align_corners, scales_h=None, scales_w=None):
    return _upsample("upsample_bilinear2d", 2, self, output_size, [scales_h, scales_w], "linear", align_corners)


@kernel("aten.upsample_trilinear3d.default")
def upsample_trilinear3d(self, output_size, align_corners, scales_d=None, scales_h=None, scales_w=None):
    return _upsample("upsample_trilinear3d", 3, self, output_size, [scales_d, scales_h, scales_w], "linear", align_corners)


@kernel("aten.upsample_bicubic2d.default")
def upsample_bicubic2d(self, output_size, align_corners, scales_h=None, scales_w=None):
    return _upsample("upsample_bicubic2d", 2, self, output_size, [scales_h, scales_w], "cubic", align_corners)


# -- grid_sampler_2d ----------------------------------------------------------------------


def _reflect(c: np.ndarray, twice_low: int, twice_high: int) -> np.ndarray:
    if twice_low == twice_high:
        return np.zeros_like(c)
    lo = c.dtype.type(twice_low / 2)
    span = c.dtype.type((twice_high - twice_low) / 2)
    c = np.abs(c - lo)
    extra = np.fmod(c, span)
    flips = np.floor(c / span)
    return np.where(flips % 2 == 0, extra + lo, span - extra + lo)


def _grid_coords(c: np.ndarray, size: int, padding_mode: int, align_corners: bool) -> np.ndarray:
    one = c.dtype.type(1)
    if align_corners:
        c = (c + one) / 2 * (size - 1)
    else:
        c = ((c + one) * size - one) / 2
    return _apply_padding(c, size, padding_mode, align_corners)


def _apply_padding(c: np.ndarray, size: int, padding_mode: int, align_corners: bool) -> np.ndarray:
    if padding_mode == 1:  # border
        c = np.clip(c, 0, size - 1)
    elif padding_mode == 2:  # reflection
        c = _reflect(c, 0, 2 * (size - 1)) if align_corners else _reflect(c, -1, 2 * size - 1)
        c = np.clip(c, 0, size - 1)
    return c


def _corner_index(iy: np.ndarray, ix: np.ndarray, h: int, w: int) -> tuple[np.ndarray, np.ndarray | None]:
    """(flat ``iy * w + ix`` of integer coords, 0 outside; the outside mask, None if no
    point is outside)."""
    inb = (ix >= 0) & (ix < w) & (iy >= 0) & (iy < h)
    out = ~inb
    return np.where(inb, iy * w + ix, 0), (out if out.any() else None)


def _sample_sum(x: np.ndarray, taps: list[tuple[tuple[np.ndarray, np.ndarray | None], np.ndarray | None]], out_hw) -> np.ndarray:
    """``sum_k x[n, :, idx_k] * w_k`` over the taps ``((flat index (N, *out_hw) into x's
    spatial dims, outside mask or None), weight (N, *out_hw) or None)``, added in the taps'
    order, a point outside reading 0. The gathers are 1-d ``take``s, one per (batch entry,
    tap, channel), NumPy's fastest gather (``take`` along an axis of a 2-d array is 2-3x
    slower per element, fancy indexing slower still; every index is in range by
    construction, so ``mode="clip"``, which skips the bounds pass and the copy of ``out``,
    changes nothing), straight into the output or one plane-sized temporary: no padded
    copy of the input and no buffer of every tap (fresh multi-megabyte arrays are new
    pages to fault in on every call, which cost more than the gathers)."""
    n, c = x.shape[:2]
    src = np.reshape(x, (n, c, -1))
    p = math.prod(out_hw)
    out = np.empty((n, c, p), x.dtype)
    tmp = np.empty((c, p), x.dtype) if len(taps) > 1 else None
    for b in range(n):
        xb, ob = src[b], out[b]
        for j, ((idx, outside), wt) in enumerate(taps):
            ib = idx[b].reshape(p)
            dst = ob if j == 0 or tmp is None else tmp
            for ch in range(c):
                xb[ch].take(ib, out=dst[ch], mode="clip")
            if outside is not None:
                np.copyto(dst, 0, where=outside[b].reshape(p))
            if wt is not None:
                dst *= wt[b].reshape(p)
            if j:
                ob += dst
    return out.reshape(n, c, *out_hw)


@kernel("aten.grid_sampler_2d.default")
def grid_sampler_2d(input, grid, interpolation_mode, padding_mode, align_corners):
    require_float("grid_sampler_2d", input, grid)
    if input.ndim != 4 or grid.ndim != 4 or grid.shape[-1] != 2 or grid.shape[0] != input.shape[0]:
        raise UsageError(f"grid_sampler_2d: input {tuple(input.shape)} and grid {tuple(grid.shape)}")
    if interpolation_mode not in (0, 1, 2):
        raise UsageError(f"grid_sampler_2d: interpolation_mode {interpolation_mode} (0 bilinear, 1 nearest, 2 bicubic)")
    x = compute(input)
    g = compute(grid).astype(x.dtype)
    h, w = x.shape[2:]
    out_hw = g.shape[1:3]
    if interpolation_mode == 2:  # bicubic: unnormalise without padding, pad each tap
        one = x.dtype.type(1)
        ux, uy = g[..., 0], g[..., 1]
        if align_corners:
            ux, uy = (ux + one) / 2 * (w - 1), (uy + one) / 2 * (h - 1)
        else:
            ux, uy = ((ux + one) * w - one) / 2, ((uy + one) * h - one) / 2
        fx, fy = np.floor(ux), np.floor(uy)
        cx, cy = _cubic_coeffs(ux - fx), _cubic_coeffs(uy - fy)
        taps = []
        for j in range(4):
            ty = _apply_padding(fy - 1 + j, h, padding_mode, align_corners).astype(np.int64)
            for i in range(4):
                tx = _apply_padding(fx - 1 + i, w, padding_mode, align_corners).astype(np.int64)
                taps.append((_corner_index(ty, tx, h, w), cy[j] * cx[i]))
        return finish(_sample_sum(x, taps, out_hw), input.dtype)
    ix = _grid_coords(g[..., 0], w, padding_mode, align_corners)
    iy = _grid_coords(g[..., 1], h, padding_mode, align_corners)
    if interpolation_mode == 1:  # nearest (round half to even, as nearbyint)
        near = _corner_index(np.rint(iy).astype(np.int64), np.rint(ix).astype(np.int64), h, w)
        return finish(_sample_sum(x, [(near, None)], out_hw), input.dtype)
    x0, y0 = np.floor(ix), np.floor(iy)
    tx, ty = ix - x0, iy - y0
    x0i, y0i = x0.astype(np.int64), y0.astype(np.int64)
    one = x.dtype.type(1)
    taps = [
        (_corner_index(y0i, x0i, h, w), (one - tx) * (one - ty)),
        (_corner_index(y0i, x0i + 1, h, w), tx * (one - ty)),
        (_corner_index(y0i + 1, x0i, h, w), (one - tx) * ty),
        (_corner_index(y0i + 1, x0i + 1, h, w), tx * ty),
    ]
    return finish(_sample_sum(x, taps, out_hw), input.dtype)


# -- dropout ------------------------------------------------------------------------------


def _dropout(x: np.ndarray, p: float) -> tuple[np.ndarray, np.ndarray]:
    if not 0 <= p <= 1:
        raise UsageError(f"dropout: probability {p} is not in [0, 1]")
    keep = _rng().random(x.shape) < (1.0 - p)
    scale = 0.0 if p == 1 else 1.0 / (1.0 - p)
    xc = compute(x)
    return finish(xc * keep * xc.dtype.type(scale), x.dtype), keep


@kernel("aten.native_dropout.default")
def native_dropout(input, p, train):
    if train is None or train:
        return _dropout(input, p)
    return input.copy(), np.ones(input.shape, dtype=bool)


@kernel(
    "aten.dropout.default", "aten.feature_dropout.default", "aten.alpha_dropout.default", "aten.feature_alpha_dropout.default"
)
def dropout(input, p, train):
    if not train or p == 0:
        return input
    return _dropout(input, p)[0]


@kernel("aten.dropout_.default", "aten.feature_dropout_.default")
def dropout_(input, p, train):
    if train and p != 0:
        input[...] = _dropout(input, p)[0]
    return input


# -- activations --------------------------------------------------------------------------


def _unary(op: str, x: np.ndarray, fn) -> np.ndarray:
    require_float(op, x)
    return finish(fn(compute(x)), x.dtype)


def _hardsigmoid(x):
    return np.minimum(np.maximum(x + x.dtype.type(3), x.dtype.type(0)), x.dtype.type(6)) / x.dtype.type(6)


def _hardswish(x):
    return x * np.minimum(np.maximum(x + x.dtype.type(3), x.dtype.type(0)), x.dtype.type(6)) / x.dtype.type(6)


def _silu(x):
    with np.errstate(over="ignore"):
        return x / (x.dtype.type(1) + np.exp(-x))


def _softplus(x, beta=1.0, threshold=20.0):
    b = x.dtype.type(beta)
    with np.errstate(over="ignore"):
        return np.where(x * b > threshold, x, np.log1p(np.exp(x * b)) / b)


def _mish(x):
    return x * np.tanh(_softplus(x))


_ACTS = {"hardsigmoid": _hardsigmoid, "hardswish": _hardswish, "silu": _silu, "mish": _mish}


def _register_act(name: str, fn, functional: bool) -> None:
    """The in-place kernel of ``name`` (and the functional one where the elementwise family
    has none: hardswish, hardsigmoid and silu live in ``elementwise``)."""
    if functional:
        kernel(f"aten.{name}.default")(lambda self: _unary(name, self, fn))

    def inplace(self):
        self[...] = _unary(name, self, fn)
        return self

    kernel(f"aten.{name}_.default")(inplace)


for _name, _fn in _ACTS.items():
    _register_act(_name, _fn, functional=_name == "mish")


@kernel("aten.softplus.default")
def softplus(self, beta=1, threshold=20):
    return _unary("softplus", self, lambda x: _softplus(x, beta, threshold))


# -- linear algebra of the nn family ------------------------------------------------------


def _same_dtype(op: str, *xs) -> None:
    dts = {x.dtype for x in xs if x is not None}
    if len(dts) > 1:
        raise UsageError(f"{op}: expected all tensors of one dtype, found {sorted(str(d) for d in dts)}")


@kernel("aten.linear.default")
def linear(input, weight, bias=None):
    _same_dtype("linear", input, weight, bias)
    x, w = compute(input), compute(weight)
    if x.ndim > 2 and w.ndim == 2:
        # the leading dims folded into one matrix product, as torch does: NumPy's matmul
        # of a 3-d operand is a loop of small products, and of a non-contiguous one (the
        # (L, N, E) transpose MultiheadAttention feeds its projections) a non-BLAS loop
        y = np.matmul(np.reshape(x, (-1, x.shape[-1])), w.T).reshape(*x.shape[:-1], w.shape[0])
    else:
        y = np.matmul(x, w.T)
    if bias is not None:
        y += compute(bias)  # (matmul's result is a fresh array)
    return finish(y, input.dtype)


@kernel("aten.matmul.default")
def matmul(self, other):
    _same_dtype("matmul", self, other)
    if self.ndim == 0 or other.ndim == 0:
        raise UsageError("matmul: both arguments need at least 1 dimension")
    return finish(np.matmul(compute(self), compute(other)), self.dtype)


@kernel("aten.flatten.using_ints")
def flatten(self, start_dim=0, end_dim=-1):
    if self.ndim == 0:
        return self.reshape(1)
    s, e = start_dim % self.ndim, end_dim % self.ndim
    if s > e:
        raise UsageError(f"flatten: start_dim {start_dim} after end_dim {end_dim}")
    return self.reshape(
        *self.shape[:s], -1 if self.size == 0 and e > s else math.prod(self.shape[s : e + 1]), *self.shape[e + 1 :]
    )


@kernel("aten.unflatten.int")
def unflatten(self, dim, sizes):
    d = dim % self.ndim
    return self.reshape(*self.shape[:d], *[int(s) for s in sizes], *self.shape[d + 1 :])


# -- softmax as training IR keeps it (F.softmax / F.log_softmax) ---------------------------


def _softmax_args(op: str, x: np.ndarray, dtype) -> tuple[np.ndarray, np.dtype]:
    out_dtype = np.dtype(dtype.numpy) if dtype is not None else x.dtype
    if dtype is not None:
        x = x.astype(out_dtype)
    require_float(op, x)
    return compute(x), out_dtype


@kernel("aten.softmax.int")
def softmax_int(self, dim, dtype=None):
    x, out_dtype = _softmax_args("softmax", self, dtype)
    if x.ndim == 0:
        return finish(np.exp(x - x), out_dtype)
    # a row holding +inf is NaN, as torch's (x - max is NaN there)
    e = np.subtract(x, row_max(x, dim))  # a fresh array: finished in place
    np.exp(e, out=e)
    np.divide(e, e.sum(axis=dim, keepdims=True), out=e)
    return finish(e, out_dtype)


@kernel("aten.log_softmax.int")
def log_softmax_int(self, dim, dtype=None):
    x, out_dtype = _softmax_args("log_softmax", self, dtype)
    if x.ndim == 0:
        return finish(x - x, out_dtype)
    return finish(_log_softmax(x, dim), out_dtype)


# -- attention ----------------------------------------------------------------------------


def _softmax_safe(s: np.ndarray) -> np.ndarray:
    """softmax over the last axis, in place on ``s`` (a fresh array); a row that is all
    -inf gives zeros (torch's ``_safe_softmax`` in its math attention)."""
    m = row_max(s, -1)
    dead = np.isneginf(m)
    any_dead = bool(dead.any())
    if any_dead:
        m[dead] = 0
    s -= m
    np.exp(s, out=s)
    tot = s.sum(axis=-1, keepdims=True)
    if any_dead:
        tot[dead] = 1  # the row is all zeros after exp(-inf)
    s /= tot
    return s


@kernel("aten.scaled_dot_product_attention.default")
def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    require_float("scaled_dot_product_attention", query, key, value)
    q, k, v = compute(query), compute(key), compute(value)
    e = q.shape[-1]
    length, s = q.shape[-2], k.shape[-2]
    if enable_gqa and q.ndim >= 3 and k.shape[-3] != q.shape[-3]:
        if q.shape[-3] % k.shape[-3]:
            raise UsageError(f"scaled_dot_product_attention: {q.shape[-3]} query heads for {k.shape[-3]} key heads")
        rep = q.shape[-3] // k.shape[-3]
        k, v = np.repeat(k, rep, axis=-3), np.repeat(v, rep, axis=-3)
    sc = q.dtype.type(1.0 / math.sqrt(e) if scale is None else scale)
    scores = np.matmul(q, np.swapaxes(k, -1, -2))  # a fresh array: masked and normalised in place
    scores *= sc
    if is_causal:
        if attn_mask is not None:
            raise UsageError("scaled_dot_product_attention: attn_mask and is_causal together")
        np.copyto(scores, -np.inf, where=~np.tril(np.ones((length, s), dtype=bool)))
    if attn_mask is not None:
        if attn_mask.dtype == np.bool_:
            if scores.shape != np.broadcast_shapes(scores.shape, attn_mask.shape):
                scores = np.broadcast_to(scores, np.broadcast_shapes(scores.shape, attn_mask.shape)).copy()
            np.copyto(scores, -np.inf, where=~attn_mask)
        else:
            scores = scores + compute(attn_mask).astype(scores.dtype)
    p = _softmax_safe(scores)
    if dropout_p > 0:
        p = p * (_rng().random(p.shape) >= dropout_p) / p.dtype.type(1 - dropout_p)
    return finish(np.matmul(p, v), query.dtype)


# -- losses -------------------------------------------------------------------------------

_REDUCTIONS = {0: "none", 1: "mean", 2: "sum"}


def _reduce(loss: np.ndarray, reduction: int) -> np.ndarray:
    if reduction == 0:
        return loss
    if reduction == 1:
        return np.asarray(loss.mean())
    if reduction == 2:
        return np.asarray(loss.sum())
    raise UsageError(f"loss reduction {reduction} (0 none, 1 mean, 2 sum)")


def _log_softmax(x: np.ndarray, axis: int) -> np.ndarray:
    z = x - row_max(x, axis)  # a row holding +inf or only -inf is NaN, as torch's
    return z - np.log(np.exp(z).sum(axis=axis, keepdims=True))


def _nll(logp: np.ndarray, target: np.ndarray, weight, reduction: int, ignore_index: int) -> tuple[np.ndarray, np.ndarray]:
    """(loss, total_weight) of nll over class axis 1 (axis 0 for a 1-D input)."""
    cls_axis = 0 if logp.ndim == 1 else 1
    nc = logp.shape[cls_axis]
    t = target.astype(np.int64)
    ignored = t == ignore_index
    tt = np.where(ignored, 0, t)
    _check_index("nll_loss", tt, nc)
    picked = np.take_along_axis(logp, np.expand_dims(tt, cls_axis), axis=cls_axis).squeeze(cls_axis)
    w = compute(weight)[tt] if weight is not None else np.ones(tt.shape, dtype=logp.dtype)
    w = np.where(ignored, 0, w).astype(logp.dtype)
    loss = -picked * w
    total = np.asarray(w.sum())
    if reduction == 0:
        return loss, np.asarray(0, dtype=logp.dtype)
    if reduction == 2:
        return np.asarray(loss.sum()), total
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.asarray(loss.sum() / total), total


@kernel("aten.nll_loss_forward.default", "aten.nll_loss2d_forward.default")
def nll_loss_forward(self, target, weight, reduction, ignore_index):
    require_float("nll_loss", self)
    loss, total = _nll(compute(self), target, weight, reduction, ignore_index)
    return finish(loss, self.dtype), finish(total, self.dtype)


@kernel("aten.nll_loss.default", "aten.nll_loss_nd.default", "aten.nll_loss2d.default")
def nll_loss(self, target, weight=None, reduction=1, ignore_index=-100):
    return nll_loss_forward(self, target, weight, reduction, ignore_index)[0]


@kernel("aten.cross_entropy_loss.default")
def cross_entropy_loss(self, target, weight=None, reduction=1, ignore_index=-100, label_smoothing=0.0):
    require_float("cross_entropy_loss", self)
    x = compute(self)
    cls_axis = 0 if x.ndim == 1 else 1
    nc = x.shape[cls_axis]
    logp = _log_softmax(x, cls_axis)
    wshape = [1] * x.ndim
    wshape[cls_axis] = nc
    wv = compute(weight).reshape(wshape) if weight is not None else None
    if target.dtype.kind == "f" or compute_dtype(target.dtype) != target.dtype:  # class probabilities
        tp = compute(target).astype(x.dtype)
        if label_smoothing > 0:
            tp = tp * x.dtype.type(1 - label_smoothing) + x.dtype.type(label_smoothing / nc)
        prod = logp * tp if wv is None else logp * tp * wv
        if reduction == 1:
            out = np.asarray(-prod.sum() / x.dtype.type(x.size / nc))
        elif reduction == 2:
            out = np.asarray(-prod.sum())
        else:
            out = -prod.sum(axis=cls_axis)
        return finish(out, self.dtype)
    nll, _total = _nll(logp, target, weight, reduction, ignore_index)
    if label_smoothing <= 0:
        return finish(nll, self.dtype)
    ignored = target == ignore_index
    smooth = -(logp * wv).sum(axis=cls_axis) if wv is not None else -logp.sum(axis=cls_axis)
    smooth = np.where(ignored, 0, smooth)
    if reduction == 1:
        if weight is not None:
            denom = compute(weight)[target[~ignored].astype(np.int64)].sum()
        else:
            denom = (~ignored).sum()
        with np.errstate(invalid="ignore", divide="ignore"):
            ret = np.asarray(smooth.sum() / x.dtype.type(denom))
    elif reduction == 2:
        ret = np.asarray(smooth.sum())
    else:
        ret = smooth
    ls = x.dtype.type(label_smoothing)
    return finish((1 - ls) * nll + ret * (ls / x.dtype.type(nc)), self.dtype)


@kernel("aten.mse_loss.default")
def mse_loss(self, target, reduction=1):
    d = compute(self) - compute(target)
    return finish(_reduce(d * d, reduction), self.dtype)


@kernel("aten.l1_loss.default")
def l1_loss(self, target, reduction=1):
    return finish(_reduce(np.abs(compute(self) - compute(target)), reduction), self.dtype)


@kernel("aten.smooth_l1_loss.default")
def smooth_l1_loss(self, target, reduction=1, beta=1.0):
    d = np.abs(compute(self) - compute(target))
    loss = d - 0.5 * beta if beta == 0 else np.where(d < beta, 0.5 * d * d / beta, d - 0.5 * beta)
    return finish(_reduce(loss.astype(d.dtype), reduction), self.dtype)


@kernel("aten.huber_loss.default")
def huber_loss(self, target, reduction=1, delta=1.0):
    d = np.abs(compute(self) - compute(target))
    loss = np.where(d < delta, 0.5 * d * d, delta * (d - 0.5 * delta)).astype(d.dtype)
    return finish(_reduce(loss, reduction), self.dtype)


@kernel("aten.binary_cross_entropy.default")
def binary_cross_entropy(self, target, weight=None, reduction=1):
    x, t = compute(self), compute(target)
    with np.errstate(divide="ignore"):
        lx = np.maximum(np.log(x), -100)
        l1x = np.maximum(np.log1p(-x), -100)
    loss = (t - 1) * l1x - t * lx
    if weight is not None:
        loss = loss * compute(weight)
    return finish(_reduce(loss, reduction), self.dtype)


@kernel("aten.binary_cross_entropy_with_logits.default")
def binary_cross_entropy_with_logits(self, target, weight=None, pos_weight=None, reduction=1):
    x, t = compute(self), compute(target)
    # log(sigmoid(x)) and log(1 - sigmoid(x)) without overflow
    log_sig = -np.logaddexp(0, -x)
    log_one_minus = -np.logaddexp(0, x)
    if pos_weight is not None:
        loss = -(compute(pos_weight) * t * log_sig + (1 - t) * log_one_minus)
    else:
        loss = -(t * log_sig + (1 - t) * log_one_minus)
    if weight is not None:
        loss = loss * compute(weight)
    return finish(_reduce(loss.astype(x.dtype), reduction), self.dtype)
