"""Sampling kernels beyond ``nn_misc``'s: antialiased bilinear/bicubic resizing
(``_upsample_bilinear2d_aa``, ``_upsample_bicubic2d_aa``, what ``interpolate(...,
antialias=True)`` records), ``grid_sampler`` (the dispatcher over 2-d and 3-d),
``grid_sampler_3d`` and ``affine_grid_generator``.

Antialiased resizing is torch's separable filter (PIL's): along each resized axis
(width first, then height), output ``i`` is a normalised weighted sum of the inputs within
``support`` of its centre ``scale * (i + 0.5)``, the filter widened by ``scale`` when
downsampling. Computed in float32 for the 16-bit floats.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ...core.errors import UsageError
from ..registry import kernel
from ._nn_util import compute, finish, require_float
from .nn_misc import _grid_coords, grid_sampler_2d


def _area_scale(n_in: int, n_out: int, align_corners: bool, scale: Any) -> float:
    if align_corners:
        return (n_in - 1) / (n_out - 1) if n_out > 1 else 0.0
    return 1.0 / float(scale) if scale is not None and scale > 0 else n_in / n_out


def _bilinear_filter(x: np.ndarray) -> np.ndarray:
    return np.maximum(0.0, 1.0 - np.abs(x))


def _bicubic_filter(x: np.ndarray) -> np.ndarray:
    a = -0.5
    x = np.abs(x)
    near = ((a + 2) * x - (a + 3)) * x * x + 1
    far = (((x - 5) * x + 8) * x - 4) * a
    return np.where(x < 1, near, np.where(x < 2, far, 0.0))


def _aa_weights(n_in: int, n_out: int, align_corners: bool, scale: Any, interp: int, filt: Any, dt: np.dtype) -> np.ndarray:
    """The (n_out, n_in) matrix of one axis's normalised filter weights."""
    s = dt.type(_area_scale(n_in, n_out, align_corners, scale))
    support = dt.type(interp * 0.5) * s if s >= 1 else dt.type(interp * 0.5)
    max_size = int(math.ceil(float(support))) * 2 + 1
    inv = dt.type(1) / s if s >= 1 else dt.type(1)
    w = np.zeros((n_out, n_in), dt)
    for i in range(n_out):
        center = s * dt.type(i + 0.5)
        lo = max(int(center - support + dt.type(0.5)), 0)
        size = min(int(center + support + dt.type(0.5)), n_in) - lo
        size = min(max(size, 0), max_size)
        j = np.arange(size)
        ws = filt(((j + lo).astype(dt) - center + dt.type(0.5)) * inv).astype(dt)
        total = ws.sum(dtype=dt)
        if total != 0:
            ws = ws / total
        w[i, lo : lo + size] = ws
    return w


def _upsample_aa(op: str, x: Any, output_size: Any, align_corners: bool, scales: list[Any], interp: int, filt: Any) -> np.ndarray:
    if x.ndim != 4:
        raise UsageError(f"{op}: expected a 4-d input, got {x.ndim}-d")
    require_float(op, x)
    if output_size is None or len(output_size) == 0:
        if any(s is None for s in scales):
            raise UsageError(f"{op}: needs output_size or scale_factors")
        output_size = [int(math.floor(n * float(s))) for n, s in zip(x.shape[2:], scales, strict=True)]
    out = [int(o) for o in output_size]
    if len(out) != 2 or any(o <= 0 for o in out):
        raise UsageError(f"{op}: output size {out}")
    y = compute(x)
    dt = y.dtype
    for axis in (3, 2):  # width (the contiguous dim) first, as torch
        n_in, n_out = y.shape[axis], out[axis - 2]
        if n_in == n_out:
            continue
        w = _aa_weights(n_in, n_out, align_corners, scales[axis - 2], interp, filt, dt)
        y = np.moveaxis(np.moveaxis(y, axis, -1) @ w.T, -1, axis)
    return finish(np.ascontiguousarray(y), x.dtype)


@kernel("aten._upsample_bilinear2d_aa.default")
def upsample_bilinear2d_aa(self, output_size, align_corners, scales_h=None, scales_w=None):
    return _upsample_aa("_upsample_bilinear2d_aa", self, output_size, align_corners, [scales_h, scales_w], 2, _bilinear_filter)


@kernel("aten._upsample_bilinear2d_aa.vec")
def upsample_bilinear2d_aa_vec(input, output_size, align_corners, scale_factors):
    scales = list(scale_factors) if scale_factors else [None, None]
    return _upsample_aa("_upsample_bilinear2d_aa", input, output_size, align_corners, scales, 2, _bilinear_filter)


@kernel("aten._upsample_bicubic2d_aa.default")
def upsample_bicubic2d_aa(self, output_size, align_corners, scales_h=None, scales_w=None):
    return _upsample_aa("_upsample_bicubic2d_aa", self, output_size, align_corners, [scales_h, scales_w], 4, _bicubic_filter)


@kernel("aten._upsample_bicubic2d_aa.vec")
def upsample_bicubic2d_aa_vec(input, output_size, align_corners, scale_factors):
    scales = list(scale_factors) if scale_factors else [None, None]
    return _upsample_aa("_upsample_bicubic2d_aa", input, output_size, align_corners, scales, 4, _bicubic_filter)


# -- grid sampling ----------------------------------------------------------------------------


@kernel("aten.grid_sampler_3d.default")
def grid_sampler_3d(input, grid, interpolation_mode, padding_mode, align_corners):
    """Trilinear (0) or nearest (1) sampling of ``(N, C, D, H, W)`` at ``grid``'s
    ``(N, Do, Ho, Wo, 3)`` normalised ``(x, y, z)``; 0 outside unless padded."""
    require_float("grid_sampler_3d", input, grid)
    if input.ndim != 5 or grid.ndim != 5 or grid.shape[-1] != 3 or grid.shape[0] != input.shape[0]:
        raise UsageError(f"grid_sampler_3d: input {tuple(input.shape)} and grid {tuple(grid.shape)}")
    if interpolation_mode not in (0, 1):
        raise UsageError(f"grid_sampler_3d: interpolation_mode {interpolation_mode} (0 trilinear, 1 nearest; no bicubic in 3-d)")
    x = compute(input)
    g = compute(grid).astype(x.dtype)
    n, c, d, h, w = x.shape
    nidx = np.arange(n)[:, None, None, None]

    def gather(iz: np.ndarray, iy: np.ndarray, ix: np.ndarray) -> np.ndarray:
        inb = (ix >= 0) & (ix < w) & (iy >= 0) & (iy < h) & (iz >= 0) & (iz < d)
        v = x[nidx, :, np.clip(iz, 0, d - 1), np.clip(iy, 0, h - 1), np.clip(ix, 0, w - 1)]  # (N, Do, Ho, Wo, C)
        return np.where(inb[..., None], v, 0).transpose(0, 4, 1, 2, 3)

    ix = _grid_coords(g[..., 0], w, padding_mode, align_corners)
    iy = _grid_coords(g[..., 1], h, padding_mode, align_corners)
    iz = _grid_coords(g[..., 2], d, padding_mode, align_corners)
    if interpolation_mode == 1:
        return finish(gather(*(np.rint(v).astype(np.int64) for v in (iz, iy, ix))), input.dtype)
    f = [np.floor(v) for v in (iz, iy, ix)]
    t = [v - fl for v, fl in zip((iz, iy, ix), f, strict=True)]
    i0 = [fl.astype(np.int64) for fl in f]
    one = x.dtype.type(1)
    out = np.zeros((n, c, *g.shape[1:4]), x.dtype)
    for dz in (0, 1):
        wz = t[0] if dz else one - t[0]
        for dy in (0, 1):
            wy = t[1] if dy else one - t[1]
            for dx in (0, 1):
                wx = t[2] if dx else one - t[2]
                out += gather(i0[0] + dz, i0[1] + dy, i0[2] + dx) * (wz * wy * wx)[:, None]
    return finish(out, input.dtype)


@kernel("aten.grid_sampler.default")
def grid_sampler(input, grid, interpolation_mode, padding_mode, align_corners):
    """``grid_sampler_2d`` for a 4-d input, ``grid_sampler_3d`` for a 5-d one."""
    if input.ndim == 4:
        return grid_sampler_2d(input, grid, interpolation_mode, padding_mode, align_corners)
    if input.ndim == 5:
        return grid_sampler_3d(input, grid, interpolation_mode, padding_mode, align_corners)
    raise UsageError(f"grid_sampler: expected a 4-d or 5-d input, got {input.ndim}-d")


def _base_axis(steps: int, align_corners: bool, dt: np.dtype) -> np.ndarray:
    if steps <= 1:
        return np.zeros(max(steps, 0), dt)
    r = np.linspace(-1, 1, steps, dtype=np.float64).astype(dt)
    return r if align_corners else r * dt.type((steps - 1) / steps)


@kernel("aten.affine_grid_generator.default")
def affine_grid_generator(theta, size, align_corners):
    """The sampling grid of the affine maps ``theta`` ``(N, 2, 3)`` / ``(N, 3, 4)`` over an
    output of ``size`` ``[N, C, H, W]`` / ``[N, C, D, H, W]``: ``(N, H, W, 2)`` / ``(N, D, H, W, 3)``."""
    require_float("affine_grid_generator", theta)
    size = [int(s) for s in size]
    nd = len(size) - 2
    if nd not in (2, 3) or theta.shape != (size[0], nd, nd + 1):
        raise UsageError(f"affine_grid_generator: theta {tuple(theta.shape)} for size {size}")
    th = compute(theta)
    dt = th.dtype
    spatial = size[2:][::-1]  # (W, H[, D]): x varies along the last dim
    axes = [_base_axis(s, align_corners, dt) for s in spatial]
    grids = np.meshgrid(*axes[::-1], indexing="ij")[::-1]  # x, y[, z], each of shape (D?, H, W)
    base = np.stack([*grids, np.ones_like(grids[0])], axis=-1).reshape(-1, nd + 1)
    out = np.einsum("pk,nik->npi", base, th).reshape(size[0], *size[2:], nd)
    return finish(out, theta.dtype)
