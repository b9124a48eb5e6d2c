"""Normalisation kernels: batch norm (``_native_batch_norm_legit`` with its in-place
running-stat update, ``.no_stats``, ``_no_training``, ``_functional``, ``native_batch_norm``,
training IR's ``batch_norm``), layer norm and group norm (forward and backward), RMS norm
and instance norm.

Statistics are computed in the compute dtype (float32 for float16/bfloat16), the variance
biased for normalising; the running variance is updated with the unbiased one, as torch
does. ``rstd``/``invstd`` are ``1/sqrt(var + eps)``.
"""

from __future__ import annotations

import math

import numpy as np

from ...core.errors import UsageError
from ..registry import kernel
from ._nn_util import compute, finish, require_float


def _stats(x: np.ndarray, axes: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    mean = x.mean(axis=axes, keepdims=True)
    var = np.square(x - mean).mean(axis=axes, keepdims=True)
    return mean, var


def _channel_shape(x: np.ndarray) -> tuple[int, ...]:
    return (1, x.shape[1]) + (1,) * (x.ndim - 2) if x.ndim > 1 else (-1,)


def _channels(x: np.ndarray) -> int:
    return x.shape[1] if x.ndim > 1 else x.shape[0]


def _affine(y: np.ndarray, weight, bias, shape) -> np.ndarray:
    if weight is not None:
        y = y * compute(weight).reshape(shape)
    if bias is not None:
        y = y + compute(bias).reshape(shape)
    return y


def _batch_norm(x, weight, bias, running_mean, running_var, training, momentum, eps, update=True):
    """(out, save_mean, save_invstd, new_running_mean, new_running_var); the running stats
    are written in place when ``update``."""
    require_float("batch_norm", x)
    xc = compute(x)
    shape = _channel_shape(x)
    axes = tuple(i for i in range(x.ndim) if i != 1) if x.ndim > 1 else ()
    stat_dtype = running_mean.dtype if running_mean is not None else x.dtype
    new_rm, new_rv = running_mean, running_var
    if training and x.size == 0:
        c = _channels(x)
        save = np.full((c,), np.nan, dtype=stat_dtype)
        return finish(_affine(xc, weight, bias, shape), x.dtype), save, save.copy(), running_mean, running_var
    if training:
        mean, var = _stats(xc, axes)
        invstd = 1.0 / np.sqrt(var + eps)
        y = (xc - mean) * invstd
        save_mean, save_invstd = mean.reshape(-1), invstd.reshape(-1)
        if running_mean is not None and running_var is not None:
            n = x.size // _channels(x)
            unbiased = var.reshape(-1) * (n / (n - 1) if n > 1 else math.inf)
            rm = compute(running_mean) * (1 - momentum) + save_mean * momentum
            rv = compute(running_var) * (1 - momentum) + unbiased * momentum
            new_rm, new_rv = finish(rm, running_mean.dtype), finish(rv, running_var.dtype)
            if update:
                running_mean[...] = new_rm
                running_var[...] = new_rv
        save_mean, save_invstd = finish(save_mean, stat_dtype), finish(save_invstd, stat_dtype)
    else:
        if running_mean is None or running_var is None:
            raise UsageError("batch_norm: evaluation mode needs running_mean and running_var")
        # one scale and one shift per channel, as torch's inference kernel folds them
        invstd = 1.0 / np.sqrt(compute(running_var) + eps)
        scale = invstd * compute(weight) if weight is not None else invstd
        shift = -compute(running_mean) * scale
        if bias is not None:
            shift = shift + compute(bias)
        dt = xc.dtype
        y = xc * scale.astype(dt, copy=False).reshape(shape)
        y += shift.astype(dt, copy=False).reshape(shape)
        empty = np.empty((0,), dtype=stat_dtype)
        return finish(y, x.dtype), empty, empty.copy(), new_rm, new_rv
    y = _affine(y, weight, bias, shape)
    return finish(y, x.dtype), save_mean, save_invstd, new_rm, new_rv


@kernel("aten._native_batch_norm_legit.default")
def native_batch_norm_legit(input, weight, bias, running_mean, running_var, training, momentum, eps):
    return _batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps)[:3]


@kernel("aten._native_batch_norm_legit.no_stats")
def native_batch_norm_legit_no_stats(input, weight, bias, training, momentum, eps):
    return _batch_norm(input, weight, bias, None, None, True, momentum, eps)[:3]


@kernel("aten._native_batch_norm_legit_no_training.default")
def native_batch_norm_legit_no_training(input, weight, bias, running_mean, running_var, momentum, eps):
    return _batch_norm(input, weight, bias, running_mean, running_var, False, momentum, eps)[:3]


@kernel("aten._native_batch_norm_legit_functional.default")
def native_batch_norm_legit_functional(input, weight, bias, running_mean, running_var, training, momentum, eps):
    out, sm, si, rm, rv = _batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps, update=False)
    return out, sm, si, np.array(rm, copy=True), np.array(rv, copy=True)


@kernel("aten.native_batch_norm.default")
def native_batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps):
    return _batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps)[:3]


@kernel("aten.batch_norm.default")
def batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps, cudnn_enabled=True):
    return _batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps)[0]


@kernel("aten.instance_norm.default")
def instance_norm(input, weight, bias, running_mean, running_var, use_input_stats, momentum, eps, cudnn_enabled=True):
    require_float("instance_norm", input)
    if not use_input_stats:
        return _batch_norm(input, weight, bias, running_mean, running_var, False, momentum, eps)[0]
    xc = compute(input)
    axes = tuple(range(2, input.ndim))
    mean, var = _stats(xc, axes)
    y = (xc - mean) / np.sqrt(var + eps)
    if running_mean is not None and running_var is not None:
        n = math.prod(input.shape[2:])
        rm = compute(running_mean) * (1 - momentum) + mean.reshape(input.shape[:2]).mean(0) * momentum
        rv = compute(running_var) * (1 - momentum) + (var.reshape(input.shape[:2]) * n / max(n - 1, 1)).mean(0) * momentum
        running_mean[...] = finish(rm, running_mean.dtype)
        running_var[...] = finish(rv, running_var.dtype)
    return finish(_affine(y, weight, bias, _channel_shape(input)), input.dtype)


# -- layer norm ---------------------------------------------------------------------------


def _layer_norm(x, normalized_shape, weight, bias, eps):
    require_float("layer_norm", x)
    k = len(normalized_shape)
    if tuple(x.shape[x.ndim - k :]) != tuple(normalized_shape):
        raise UsageError(f"layer_norm: normalized_shape {list(normalized_shape)} does not end input {list(x.shape)}")
    xc = compute(x)
    axes = tuple(range(x.ndim - k, x.ndim))
    # the same operations as _stats and the normalisation below them, on one fresh array
    # (x - mean), reused in place: squared into a scratch copy for the variance, then scaled
    mean = xc.mean(axis=axes, keepdims=True)
    y = np.subtract(xc, mean)
    sq = np.square(y)
    var = sq.mean(axis=axes, keepdims=True)
    del sq
    rstd = 1.0 / np.sqrt(var + eps)
    if y.dtype == np.result_type(y, rstd):
        np.multiply(y, rstd, out=y)
    else:
        y = y * rstd
    for p, op in ((weight, np.multiply), (bias, np.add)):
        if p is not None:
            pc = compute(p)
            if y.dtype == np.result_type(y, pc) and y.shape == np.broadcast_shapes(y.shape, pc.shape):
                op(y, pc, out=y)
            else:
                y = op(y, pc)
    return finish(y, x.dtype), finish(mean, x.dtype), finish(rstd, x.dtype)


@kernel("aten.native_layer_norm.default")
def native_layer_norm(input, normalized_shape, weight, bias, eps):
    return _layer_norm(input, normalized_shape, weight, bias, eps)


@kernel("aten.layer_norm.default")
def layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5, cudnn_enable=True):
    return _layer_norm(input, normalized_shape, weight, bias, eps)[0]


@kernel("aten.native_layer_norm_backward.default")
def native_layer_norm_backward(grad_out, input, normalized_shape, mean, rstd, weight, bias, output_mask):
    k = len(normalized_shape)
    x = compute(input)
    g = compute(grad_out)
    axes = tuple(range(x.ndim - k, x.ndim))
    lead = tuple(range(x.ndim - k))
    xhat = (x - compute(mean)) * compute(rstd)
    gx = g * compute(weight) if weight is not None else g
    dx = dw = db = None
    if output_mask[0]:
        m = np.prod([x.shape[a] for a in axes])
        dx = compute(rstd) / m * (m * gx - gx.sum(axis=axes, keepdims=True) - xhat * (gx * xhat).sum(axis=axes, keepdims=True))
        dx = finish(dx, input.dtype)
    if output_mask[1] and weight is not None:
        dw = finish((g * xhat).sum(axis=lead), weight.dtype)
    if output_mask[2] and bias is not None:
        db = finish(g.sum(axis=lead), bias.dtype)
    return dx, dw, db


# -- group norm ---------------------------------------------------------------------------


def _group_norm(x, weight, bias, n, c, hxw, group, eps):
    require_float("group_norm", x)
    if c % group:
        raise UsageError(f"group_norm: {c} channels do not split into {group} groups")
    xc = compute(x).reshape(n, group, -1)
    mean, var = _stats(xc, (2,))
    rstd = 1.0 / np.sqrt(var + eps)
    y = ((xc - mean) * rstd).reshape(x.shape)
    y = _affine(y, weight, bias, _channel_shape(x))
    return finish(y, x.dtype), finish(mean.reshape(n, group), x.dtype), finish(rstd.reshape(n, group), x.dtype)


@kernel("aten.native_group_norm.default")
def native_group_norm(input, weight, bias, N, C, HxW, group, eps):
    return _group_norm(input, weight, bias, int(N), int(C), int(HxW), int(group), eps)


@kernel("aten.group_norm.default")
def group_norm(input, num_groups, weight=None, bias=None, eps=1e-5, cudnn_enabled=True):
    n, c = input.shape[:2]
    return _group_norm(input, weight, bias, n, c, math.prod(input.shape[2:]), int(num_groups), eps)[0]


@kernel("aten.native_group_norm_backward.default")
def native_group_norm_backward(grad_out, input, mean, rstd, weight, N, C, HxW, group, output_mask):
    n, c, hxw, gr = int(N), int(C), int(HxW), int(group)
    x = compute(input).reshape(n, gr, c // gr, hxw)
    g = compute(grad_out).reshape(n, gr, c // gr, hxw)
    mu = compute(mean).reshape(n, gr, 1, 1)
    rs = compute(rstd).reshape(n, gr, 1, 1)
    xhat = (x - mu) * rs
    gx = g * compute(weight).reshape(1, gr, c // gr, 1) if weight is not None else g
    dx = dw = db = None
    if output_mask[0]:
        m = (c // gr) * hxw
        dx = rs / m * (m * gx - gx.sum(axis=(2, 3), keepdims=True) - xhat * (gx * xhat).sum(axis=(2, 3), keepdims=True))
        dx = finish(dx.reshape(input.shape), input.dtype)
    if output_mask[1]:
        dw = finish((g * xhat).sum(axis=(0, 3)).reshape(c), weight.dtype if weight is not None else input.dtype)
    if output_mask[2]:
        db = finish(g.sum(axis=(0, 3)).reshape(c), weight.dtype if weight is not None else input.dtype)
    return dx, dw, db


# -- RMS norm -----------------------------------------------------------------------------


@kernel("aten.rms_norm.default")
def rms_norm(input, normalized_shape, weight=None, eps=None):
    require_float("rms_norm", input)
    k = len(normalized_shape)
    xc = compute(input)
    if eps is None:
        eps = float(np.finfo(xc.dtype).eps)
    axes = tuple(range(input.ndim - k, input.ndim))
    y = xc / np.sqrt(np.square(xc).mean(axis=axes, keepdims=True) + eps)
    if weight is None:
        return finish(y, input.dtype)
    y = finish(y, input.dtype)
    out_dtype = np.result_type(input.dtype, weight.dtype) if input.dtype != weight.dtype else input.dtype
    return finish(compute(y) * compute(weight), out_dtype)


# -- weight norm -----------------------------------------------------------------------------


def _norm_except_dim(v: np.ndarray, dim: int) -> np.ndarray:
    """The 2-norm of ``v`` over every dim but ``dim`` (kept as size 1); over all of it for -1."""
    if dim == -1:
        return np.sqrt(np.sum(v * v)).reshape((1,) * v.ndim)
    if not 0 <= dim < v.ndim:
        raise UsageError(f"_weight_norm: dim {dim} out of range for a {v.ndim}-d tensor")
    axes = tuple(i for i in range(v.ndim) if i != dim)
    return np.sqrt(np.sum(v * v, axis=axes, keepdims=True))


@kernel("aten._weight_norm_interface.default")
def weight_norm_interface(v, g, dim=0):
    """``(v * g / ||v||, ||v||)``, the norm over every dim but ``dim`` (a negative dim counts
    from the end: the fused kernel's), computed in float32 for the 16-bit floats."""
    return _weight_norm(v, g, dim % max(v.ndim, 1))


def _weight_norm(v, g, dim):
    require_float("_weight_norm", v, g)
    vv, gg = compute(v), compute(g)
    norms = _norm_except_dim(vv, dim)
    with np.errstate(all="ignore"):
        w = vv * (gg.reshape(norms.shape) / norms) if gg.size == norms.size else vv * (gg / norms)
    return finish(w, v.dtype), finish(norms, g.dtype if dim != -1 else v.dtype)


@kernel("aten._weight_norm.default")
def weight_norm(v, g, dim=0):
    """``v * g / ||v||``; dim -1 is the norm of all of ``v`` (torch's ``norm_except_dim``)."""
    return _weight_norm(v, g, dim)[0]
