"""Creation, conversion and random kernels.

Random ops (``rand``, ``randn``, ``randperm``, ``bernoulli``) draw from a NumPy generator
(:func:`seed` sets it): same distributions as torch, not the same numbers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from .. import promote
from ..registry import kernel
from ._common import bad, np_dtype, tensor

_RNG = np.random.default_rng()


def seed(value: int) -> None:
    """Seed the generator the random kernels draw from."""
    global _RNG
    _RNG = np.random.default_rng(value)


def _shape(size: Sequence[int]) -> tuple[int, ...]:
    shape = tuple(int(s) for s in size)
    if any(s < 0 for s in shape):
        raise bad("aten.empty", f"negative dimension in size {list(shape)}")
    return shape


def _fill_dtype(value: Any) -> np.dtype:
    return promote.scalar_dtype(value)


@kernel("aten.empty.memory_format")
def empty(
    size: Sequence[int],
    *,
    dtype: Any = None,
    layout: Any = None,
    device: Any = None,
    pin_memory: Any = None,
    memory_format: Any = None,
) -> np.ndarray:
    # torch leaves the memory uninitialised; zeros keep runs reproducible
    return np.zeros(_shape(size), np_dtype(dtype, promote.DEFAULT_FLOAT))


@kernel("aten.empty_strided.default")
def empty_strided(
    size: Sequence[int],
    stride: Sequence[int],
    *,
    dtype: Any = None,
    layout: Any = None,
    device: Any = None,
    pin_memory: Any = None,
) -> np.ndarray:
    return np.zeros(_shape(size), np_dtype(dtype, promote.DEFAULT_FLOAT))


@kernel("aten.zeros.default")
def zeros(
    size: Sequence[int], *, dtype: Any = None, layout: Any = None, device: Any = None, pin_memory: Any = None
) -> np.ndarray:
    return np.zeros(_shape(size), np_dtype(dtype, promote.DEFAULT_FLOAT))


@kernel("aten.ones.default")
def ones(size: Sequence[int], *, dtype: Any = None, layout: Any = None, device: Any = None, pin_memory: Any = None) -> np.ndarray:
    return np.ones(_shape(size), np_dtype(dtype, promote.DEFAULT_FLOAT))


@kernel("aten.full.default")
def full(
    size: Sequence[int], fill_value: Any, *, dtype: Any = None, layout: Any = None, device: Any = None, pin_memory: Any = None
) -> np.ndarray:
    dt = np_dtype(dtype) or _fill_dtype(fill_value)
    return np.full(_shape(size), promote.cast(fill_value, dt), dt)


def _like(self: np.ndarray, dtype: Any) -> np.dtype:
    return np_dtype(dtype) or tensor(self).dtype


@kernel("aten.full_like.default")
def full_like(
    self: np.ndarray,
    fill_value: Any,
    *,
    dtype: Any = None,
    layout: Any = None,
    device: Any = None,
    pin_memory: Any = None,
    memory_format: Any = None,
) -> np.ndarray:
    dt = _like(self, dtype)
    return np.full(tensor(self).shape, promote.cast(fill_value, dt), dt)


@kernel("aten.zeros_like.default", "aten.empty_like.default")
def zeros_like(self: np.ndarray, **kw: Any) -> np.ndarray:
    return np.zeros(tensor(self).shape, _like(self, kw.get("dtype")))


@kernel("aten.ones_like.default")
def ones_like(self: np.ndarray, **kw: Any) -> np.ndarray:
    return np.ones(tensor(self).shape, _like(self, kw.get("dtype")))


@kernel("aten.new_zeros.default", "aten.new_empty.default")
def new_zeros(self: np.ndarray, size: Sequence[int], **kw: Any) -> np.ndarray:
    return np.zeros(_shape(size), _like(self, kw.get("dtype")))


@kernel("aten.new_ones.default")
def new_ones(self: np.ndarray, size: Sequence[int], **kw: Any) -> np.ndarray:
    return np.ones(_shape(size), _like(self, kw.get("dtype")))


@kernel("aten.new_full.default")
def new_full(self: np.ndarray, size: Sequence[int], fill_value: Any, **kw: Any) -> np.ndarray:
    dt = _like(self, kw.get("dtype"))
    return np.full(_shape(size), promote.cast(fill_value, dt), dt)


@kernel("aten.scalar_tensor.default")
def scalar_tensor(s: Any, *, dtype: Any = None, layout: Any = None, device: Any = None, pin_memory: Any = None) -> np.ndarray:
    return promote.cast(s, np_dtype(dtype, promote.DEFAULT_FLOAT)).reshape(())


@kernel("aten.fill.Scalar", "aten.fill.Tensor")
def fill(self: np.ndarray, value: Any) -> np.ndarray:
    x = tensor(self)
    if isinstance(value, np.ndarray) and value.ndim:
        raise bad("aten.fill", f"fill only supports a 0-dimension value tensor, got {value.ndim} dimensions")
    return np.full(x.shape, promote.cast(value, x.dtype), x.dtype)


@kernel("aten.fill_.Scalar", "aten.fill_.Tensor")
def fill_(self: np.ndarray, value: Any) -> np.ndarray:
    x = tensor(self)
    x[...] = promote.cast(value, x.dtype)
    return x


@kernel("aten.zero_.default")
def zero_(self: np.ndarray) -> np.ndarray:
    x = tensor(self)
    x[...] = 0
    return x


@kernel("aten.arange.start_step", "aten.arange.start")
def arange(
    start: Any,
    end: Any,
    step: Any = 1,
    *,
    dtype: Any = None,
    layout: Any = None,
    device: Any = None,
    pin_memory: Any = None,
) -> np.ndarray:
    vals = [v.item() if isinstance(v, np.ndarray) else v for v in (start, end, step)]
    if vals[2] == 0:
        raise bad("aten.arange", "step must be nonzero")
    if any(isinstance(v, float) and not math.isfinite(v) for v in vals):
        raise bad("aten.arange", "unsupported range: start, end and step must be finite")
    dt = np_dtype(dtype)
    if dt is None:
        dt = promote.DEFAULT_FLOAT if any(isinstance(v, float) for v in vals) else np.dtype(np.int64)
    n = math.ceil((vals[1] - vals[0]) / vals[2])
    if n < 0:
        raise bad("aten.arange", "upper bound and larger bound inconsistent with step sign")
    if promote.category(dt) <= promote.INT and all(isinstance(v, (int, bool)) for v in vals):
        return (np.arange(n, dtype=np.int64) * int(vals[2]) + int(vals[0])).astype(dt)
    r = np.float64(vals[0]) + np.arange(n, dtype=np.float64) * np.float64(vals[2])
    return promote.cast(r, dt)


@kernel("aten.arange.default")
def arange_end(end: Any, *, dtype: Any = None, layout: Any = None, device: Any = None, pin_memory: Any = None) -> np.ndarray:
    return arange(0, end, 1, dtype=dtype)


@kernel("aten._to_copy.default")
def to_copy(
    self: np.ndarray,
    *,
    dtype: Any = None,
    layout: Any = None,
    device: Any = None,
    pin_memory: Any = None,
    non_blocking: bool = False,
    memory_format: Any = None,
) -> np.ndarray:
    x = tensor(self)
    dt = np_dtype(dtype) or x.dtype
    return x.copy() if dt == x.dtype else promote.cast(x, dt)


@kernel("aten.lift_fresh_copy.default")
def lift_fresh_copy(self: np.ndarray) -> np.ndarray:
    return tensor(self).copy()


@kernel("aten._local_scalar_dense.default")
def local_scalar_dense(self: np.ndarray) -> Any:
    x = tensor(self)
    if x.size != 1:
        raise bad("aten._local_scalar_dense", f"a tensor with {x.size} elements cannot be converted to a scalar")
    v = x.reshape(-1)[0]
    if x.dtype == np.bool_:
        return bool(v)
    if x.dtype.kind in "iu":
        return int(v)
    if x.dtype.kind == "c":
        return complex(v)
    return float(v)


@kernel("aten.rand.default")
def rand(size: Sequence[int], *, dtype: Any = None, layout: Any = None, device: Any = None, pin_memory: Any = None) -> np.ndarray:
    dt = np.dtype(np_dtype(dtype, promote.DEFAULT_FLOAT))
    return promote.cast(_RNG.random(_shape(size)), dt)


@kernel("aten.randn.default")
def randn(
    size: Sequence[int], *, dtype: Any = None, layout: Any = None, device: Any = None, pin_memory: Any = None
) -> np.ndarray:
    dt = np.dtype(np_dtype(dtype, promote.DEFAULT_FLOAT))
    if dt.kind == "c":
        s = _shape(size)
        return ((_RNG.standard_normal(s) + 1j * _RNG.standard_normal(s)) / math.sqrt(2)).astype(dt)
    return promote.cast(_RNG.standard_normal(_shape(size)), dt)


@kernel("aten.rand_like.default")
def rand_like(self: np.ndarray, **kw: Any) -> np.ndarray:
    return rand(tensor(self).shape, dtype=_like(self, kw.get("dtype")))


@kernel("aten.randn_like.default")
def randn_like(self: np.ndarray, **kw: Any) -> np.ndarray:
    return randn(tensor(self).shape, dtype=_like(self, kw.get("dtype")))


@kernel("aten.randperm.default")
def randperm(n: int, *, dtype: Any = None, layout: Any = None, device: Any = None, pin_memory: Any = None) -> np.ndarray:
    if n < 0:
        raise bad("aten.randperm", f"n must be non-negative, got {n}")
    return _RNG.permutation(int(n)).astype(np_dtype(dtype, np.int64))


@kernel("aten.bernoulli.default")
def bernoulli(self: np.ndarray, *, generator: Any = None) -> np.ndarray:
    x = tensor(self)
    return promote.cast(_RNG.random(x.shape) < x.astype(np.float64), x.dtype)


@kernel("aten.bernoulli.p")
def bernoulli_p(self: np.ndarray, p: float = 0.5, *, generator: Any = None) -> np.ndarray:
    x = tensor(self)
    return promote.cast(_RNG.random(x.shape) < p, x.dtype)


# -- Tensor.to: an alias when nothing changes, else _to_copy -------------------------------


def _to(op: str, x: np.ndarray, dt: Any, copy: bool, layout: Any = None, device: Any = None) -> np.ndarray:
    if layout is not None and str(layout) not in ("strided", "torch.strided"):
        raise bad(op, f"cannot convert to layout {layout}: the interpreter has strided tensors only")
    # the device is not honoured: every tensor of the interpreter lives in host memory
    target = np_dtype(dt) or x.dtype
    if target == x.dtype and not copy:
        return x  # torch returns self itself (an alias)
    return x.copy() if target == x.dtype else promote.cast(x, target)


@kernel("aten.to.dtype")
def to_dtype(
    self: np.ndarray, dtype: Any, non_blocking: bool = False, copy: bool = False, memory_format: Any = None
) -> np.ndarray:
    return _to("aten.to.dtype", tensor(self), dtype, copy)


@kernel("aten.to.dtype_layout")
def to_dtype_layout(
    self: np.ndarray,
    *,
    dtype: Any = None,
    layout: Any = None,
    device: Any = None,
    pin_memory: Any = None,
    non_blocking: bool = False,
    copy: bool = False,
    memory_format: Any = None,
) -> np.ndarray:
    return _to("aten.to.dtype_layout", tensor(self), dtype, copy, layout, device)


@kernel("aten.to.device")
def to_device(
    self: np.ndarray,
    device: Any,
    dtype: Any,
    non_blocking: bool = False,
    copy: bool = False,
    memory_format: Any = None,
) -> np.ndarray:
    return _to("aten.to.device", tensor(self), dtype, copy, device=device)


@kernel("aten.to.other")
def to_other(
    self: np.ndarray, other: np.ndarray, non_blocking: bool = False, copy: bool = False, memory_format: Any = None
) -> np.ndarray:
    return _to("aten.to.other", tensor(self), tensor(other).dtype, copy)
