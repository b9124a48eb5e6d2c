"""Reductions, scans, sort and top-k.

dtype rules as torch's: ``sum``/``prod``/``cumsum`` of bool or integer tensors give int64
(or the ``dtype`` argument), ``mean`` refuses integers, ``any`` gives bool (uint8 for a
uint8 input), ``argmax``/``max.dim`` indices are int64. float16/bfloat16 accumulate in
float32 and round once; NaN propagates through ``amax``/``amin``/``max.dim`` and is the
largest value for ``argmax``/``sort``/``topk``, as in torch.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import promote
from ..registry import kernel
from ._common import bad, norm_dim, norm_dims, np_dtype, quiet, refuse, tensor


def _acc_dtype(x: np.ndarray, dtype: Any, op: str) -> tuple[np.dtype, np.dtype]:
    """(accumulate dtype, result dtype) of sum/prod/cumsum."""
    out = np_dtype(dtype)
    if out is None:
        out = np.dtype(np.int64) if promote.category(x.dtype) <= promote.INT else x.dtype
    return promote.opmath(out), out


def _reduce_shape(x: np.ndarray, dims: tuple[int, ...], keepdim: bool) -> tuple[int, ...]:
    return tuple(1 if i in dims else s for i, s in enumerate(x.shape) if keepdim or i not in dims)


@kernel("aten.sum.dim_IntList")
def sum_dim(self: np.ndarray, dim: Any = None, keepdim: bool = False, *, dtype: Any = None) -> np.ndarray:
    x = tensor(self)
    acc, out = _acc_dtype(x, dtype, "aten.sum")
    dims = norm_dims(dim, x.ndim, "aten.sum")
    with quiet():
        r = np.sum(promote.cast(x, acc), axis=dims, keepdims=keepdim)
    return promote.cast(r, out)


@kernel("aten.sum.default")
def sum_all(self: np.ndarray, *, dtype: Any = None) -> np.ndarray:
    return sum_dim(self, None, False, dtype=dtype)


@kernel("aten.prod.dim_int")
def prod_dim(self: np.ndarray, dim: int, keepdim: bool = False, *, dtype: Any = None) -> np.ndarray:
    x = tensor(self)
    acc, out = _acc_dtype(x, dtype, "aten.prod")
    d = norm_dims(dim, x.ndim, "aten.prod")
    with quiet():
        r = np.prod(promote.cast(x, acc), axis=d, keepdims=keepdim)
    return promote.cast(r, out)


@kernel("aten.prod.default")
def prod_all(self: np.ndarray, *, dtype: Any = None) -> np.ndarray:
    x = tensor(self)
    acc, out = _acc_dtype(x, dtype, "aten.prod")
    with quiet():
        return promote.cast(np.prod(promote.cast(x, acc)), out)


@kernel("aten.mean.dim")
def mean_dim(self: np.ndarray, dim: Any = None, keepdim: bool = False, *, dtype: Any = None) -> np.ndarray:
    x = tensor(self)
    out = np_dtype(dtype) or x.dtype
    if promote.category(out) <= promote.INT:
        raise bad(
            "aten.mean",
            f"could not infer output dtype: input dtype must be floating point or complex, got {x.dtype}",
        )
    dims = norm_dims(dim, x.ndim, "aten.mean")
    acc = promote.opmath(out)
    with quiet():
        r = np.mean(promote.cast(x, acc), axis=dims, keepdims=keepdim)
    return promote.cast(r, out)


@kernel("aten.mean.default")
def mean_all(self: np.ndarray, *, dtype: Any = None) -> np.ndarray:
    return mean_dim(self, None, False, dtype=dtype)


def _amax(fn: Any, name: str) -> None:
    @kernel(f"aten.{name}.default")
    def k(self: np.ndarray, dim: Any = (), keepdim: bool = False) -> np.ndarray:
        x = tensor(self)
        dims = norm_dims(dim, x.ndim, f"aten.{name}")
        if x.size == 0 and any(x.shape[d] == 0 for d in dims) or (x.size == 0 and not dims):
            raise bad(f"aten.{name}", "cannot reduce over a zero-size dimension")
        if x.dtype.kind == "c":
            raise refuse(f"aten.{name}", "complex input")
        work = x.astype(np.float32) if promote.opmath(x.dtype) != x.dtype else x
        with quiet():
            return promote.cast(fn(work, axis=dims, keepdims=keepdim), x.dtype)

    k.__name__ = name


_amax(np.max, "amax")
_amax(np.min, "amin")


def _any(x: np.ndarray, dims: tuple[int, ...], keepdim: bool) -> np.ndarray:
    r = np.any(x if x.dtype == np.bool_ else x != 0, axis=dims, keepdims=keepdim)  # (bool != 0 is slow)
    return np.asarray(r, dtype=np.uint8 if x.dtype == np.uint8 else np.bool_)


@kernel("aten.any.default")
def any_all(self: np.ndarray) -> np.ndarray:
    x = tensor(self)
    return _any(x, tuple(range(x.ndim)), False)


@kernel("aten.any.dim")
def any_dim(self: np.ndarray, dim: int, keepdim: bool = False) -> np.ndarray:
    x = tensor(self)
    return _any(x, norm_dims([dim], x.ndim, "aten.any"), keepdim)


@kernel("aten.any.dims")
def any_dims(self: np.ndarray, dim: Any = None, keepdim: bool = False) -> np.ndarray:
    x = tensor(self)
    return _any(x, norm_dims(dim, x.ndim, "aten.any"), keepdim)


@kernel("aten.all.default")
def all_all(self: np.ndarray) -> np.ndarray:
    x = tensor(self)
    return np.asarray(np.all(x if x.dtype == np.bool_ else x != 0), dtype=np.uint8 if x.dtype == np.uint8 else np.bool_)


@kernel("aten.all.dim", "aten.all.dims")
def all_dim(self: np.ndarray, dim: Any = None, keepdim: bool = False) -> np.ndarray:
    x = tensor(self)
    r = np.all(x if x.dtype == np.bool_ else x != 0, axis=norm_dims(dim, x.ndim, "aten.all"), keepdims=keepdim)
    return np.asarray(r, dtype=np.uint8 if x.dtype == np.uint8 else np.bool_)


def _comparable(x: np.ndarray, op: str) -> np.ndarray:
    if x.dtype.kind == "c":
        raise refuse(op, "complex input")
    return x.astype(np.float32) if promote.opmath(x.dtype) != x.dtype else x


def _arg(fn: Any, name: str) -> None:
    @kernel(f"aten.{name}.default")
    def k(self: np.ndarray, dim: int | None = None, keepdim: bool = False) -> np.ndarray:
        x = _comparable(tensor(self), f"aten.{name}")
        if x.size == 0:
            raise bad(f"aten.{name}", "expected a non-empty tensor")
        if dim is None:
            r = np.asarray(fn(x.reshape(-1)), np.int64)
            return r.reshape((1,) * x.ndim) if keepdim else r
        d = norm_dim(dim, x.ndim, f"aten.{name}")
        if x.ndim == 0:
            return np.zeros((), np.int64)
        return np.asarray(fn(x, axis=d, keepdims=keepdim), np.int64)

    k.__name__ = name


_arg(np.argmax, "argmax")
_arg(np.argmin, "argmin")


def _minmax_dim(argfn: Any, name: str) -> None:
    @kernel(f"aten.{name}.dim")
    def k(self: np.ndarray, dim: int, keepdim: bool = False) -> tuple[np.ndarray, np.ndarray]:
        x = tensor(self)
        work = _comparable(x, f"aten.{name}")
        d = norm_dim(dim, x.ndim, f"aten.{name}")
        if x.ndim == 0:
            return x.copy(), np.zeros((), np.int64)
        if x.shape[d] == 0:
            raise bad(f"aten.{name}", "cannot reduce over a zero-size dimension")
        idx = argfn(work, axis=d, keepdims=True)
        vals = np.take_along_axis(x, idx, axis=d)
        if not keepdim:
            vals, idx = np.squeeze(vals, d), np.squeeze(idx, d)
        return np.asarray(vals), np.asarray(idx, np.int64)

    k.__name__ = name


_minmax_dim(np.argmax, "max")
_minmax_dim(np.argmin, "min")


@kernel("aten.max.default")
def max_all(self: np.ndarray) -> np.ndarray:
    x = tensor(self)
    if x.size == 0:
        raise bad("aten.max", "expected a non-empty tensor")
    return promote.cast(np.max(_comparable(x, "aten.max")), x.dtype)


@kernel("aten.min.default")
def min_all(self: np.ndarray) -> np.ndarray:
    x = tensor(self)
    if x.size == 0:
        raise bad("aten.min", "expected a non-empty tensor")
    return promote.cast(np.min(_comparable(x, "aten.min")), x.dtype)


def _var(x: np.ndarray, dims: tuple[int, ...], correction: float, keepdim: bool, op: str, root: bool = False) -> np.ndarray:
    if promote.category(x.dtype) <= promote.INT:
        raise bad(op, f"var only supports floating point and complex dtypes, got {x.dtype}")
    out = promote.to_real(x.dtype)
    acc = np.complex128 if x.dtype.kind == "c" else np.float64
    with quiet():
        v = x.astype(acc)
        n = 1
        for d in dims:
            n *= x.shape[d]
        m = np.mean(v, axis=dims, keepdims=True) if n else np.zeros((1,) * x.ndim)
        dev = v - m
        ss = np.sum((dev * np.conj(dev)).real, axis=dims, keepdims=keepdim)
        r = ss / np.float64(max(0, n - correction))
        if root:  # the standard deviation, rounded once
            r = np.sqrt(r)
    return promote.cast(r, out)


@kernel("aten.var.correction")
def var_correction(self: np.ndarray, dim: Any = None, *, correction: Any = None, keepdim: bool = False) -> np.ndarray:
    x = tensor(self)
    return _var(x, norm_dims(dim, x.ndim, "aten.var"), 1 if correction is None else correction, keepdim, "aten.var")


@kernel("aten.var.dim")
def var_dim(self: np.ndarray, dim: Any = None, unbiased: bool = True, keepdim: bool = False) -> np.ndarray:
    x = tensor(self)
    return _var(x, norm_dims(dim, x.ndim, "aten.var"), 1 if unbiased else 0, keepdim, "aten.var")


@kernel("aten.var.default")
def var_all(self: np.ndarray, unbiased: bool = True) -> np.ndarray:
    return var_dim(self, None, unbiased, False)


@kernel("aten.cumsum.default")
def cumsum(self: np.ndarray, dim: int, *, dtype: Any = None) -> np.ndarray:
    x = tensor(self)
    acc, out = _acc_dtype(x, dtype, "aten.cumsum")
    d = norm_dim(dim, x.ndim, "aten.cumsum")
    if x.ndim == 0:
        return promote.cast(x, out)
    with quiet():
        return promote.cast(np.cumsum(promote.cast(x, acc), axis=d), out)


@kernel("aten.cumprod.default")
def cumprod(self: np.ndarray, dim: int, *, dtype: Any = None) -> np.ndarray:
    x = tensor(self)
    acc, out = _acc_dtype(x, dtype, "aten.cumprod")
    d = norm_dim(dim, x.ndim, "aten.cumprod")
    if x.ndim == 0:
        return promote.cast(x, out)
    with quiet():
        return promote.cast(np.cumprod(promote.cast(x, acc), axis=d), out)


@kernel("aten.logsumexp.default")
def logsumexp(self: np.ndarray, dim: Any, keepdim: bool = False) -> np.ndarray:
    x = tensor(self)
    out = promote.DEFAULT_FLOAT if promote.category(x.dtype) <= promote.INT else x.dtype
    dims = norm_dims(dim, x.ndim, "aten.logsumexp")
    with quiet():
        v = promote.cast(x, promote.opmath(out))
        m = np.max(v, axis=dims, keepdims=True) if v.size else np.zeros((1,) * v.ndim, v.dtype)
        m = np.where(np.isinf(m), 0, m)
        r = np.log(np.sum(np.exp(v - m), axis=dims, keepdims=True)) + m
        if not keepdim:
            r = np.squeeze(r, axis=dims)
    return promote.cast(r, out)


# -- sort / topk ---------------------------------------------------------------------------


def _argsort(x: np.ndarray, d: int, descending: bool) -> np.ndarray:
    """Stable argsort along ``d``, NaN largest; descending keeps equal elements in their order."""
    work = _comparable(x, "aten.sort")
    if not descending:
        return np.argsort(work, axis=d, kind="stable")
    flipped = np.flip(work, axis=d)
    idx = np.flip(np.argsort(flipped, axis=d, kind="stable"), axis=d)
    return work.shape[d] - 1 - idx


@kernel("aten.sort.default")
def sort(self: np.ndarray, dim: int = -1, descending: bool = False) -> tuple[np.ndarray, np.ndarray]:
    x = tensor(self)
    d = norm_dim(dim, x.ndim, "aten.sort")
    if x.ndim == 0:
        return x.copy(), np.zeros((), np.int64)
    idx = _argsort(x, d, descending)
    return np.take_along_axis(x, idx, axis=d), np.asarray(idx, np.int64)


@kernel("aten.sort.stable")
def sort_stable(
    self: np.ndarray, *, stable: bool | None = None, dim: int = -1, descending: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    return sort(self, dim, descending)


@kernel("aten.topk.default")
def topk(self: np.ndarray, k: int, dim: int = -1, largest: bool = True, sorted: bool = True) -> tuple[np.ndarray, np.ndarray]:  # noqa: A002
    x = tensor(self)
    d = norm_dim(dim, x.ndim, "aten.topk")
    n = x.shape[d] if x.ndim else 1
    if not 0 <= k <= n:
        raise bad("aten.topk", f"selected index k={k} out of range for a dimension of size {n}")
    if x.ndim == 0:
        return x.copy(), np.zeros((), np.int64)
    idx = np.take(_argsort(x, d, largest), np.arange(k), axis=d)
    return np.take_along_axis(x, idx, axis=d), np.asarray(idx, np.int64)


@kernel("aten.argsort.default")
def argsort(self: np.ndarray, dim: int = -1, descending: bool = False) -> np.ndarray:
    return sort(self, dim, descending)[1]


def _order_stat(x: np.ndarray, d: int, pick: Any, keepdim: bool, op: str) -> tuple[np.ndarray, np.ndarray]:
    """Value and index of the element of rank ``pick(n)`` along ``d`` (NaN ranks last; a NaN in a slice wins)."""
    if x.ndim == 0:
        return x.copy(), np.zeros((), np.int64)
    n = x.shape[d]
    if n == 0:
        raise bad(op, "cannot compute on a zero-size dimension")
    k = pick(n)
    if not 0 <= k < n:
        raise bad(op, f"selected number k out of range for dimension {d} of size {n}")
    idx = np.take(_argsort(x, d, False), [k], axis=d)
    work = _comparable(x, op)
    if work.dtype.kind == "f":
        has_nan = np.isnan(work).any(axis=d, keepdims=True)
        first_nan = np.argmax(np.isnan(work), axis=d, keepdims=True)
        idx = np.where(has_nan, first_nan, idx)
    vals = np.take_along_axis(x, idx, axis=d)
    if not keepdim:
        vals, idx = np.squeeze(vals, d), np.squeeze(idx, d)
    return np.asarray(vals), np.asarray(idx, np.int64)


@kernel("aten.median.dim")
def median_dim(self: np.ndarray, dim: int, keepdim: bool = False) -> tuple[np.ndarray, np.ndarray]:
    x = tensor(self)
    return _order_stat(x, norm_dim(dim, x.ndim, "aten.median"), lambda n: (n - 1) // 2, keepdim, "aten.median")


@kernel("aten.median.default")
def median_all(self: np.ndarray) -> np.ndarray:
    x = tensor(self)
    if x.size == 0:
        return np.full((), np.nan, x.dtype) if x.dtype.kind == "f" else np.zeros((), x.dtype)
    return median_dim(x.reshape(-1), 0)[0]


@kernel("aten.kthvalue.default")
def kthvalue(self: np.ndarray, k: int, dim: int = -1, keepdim: bool = False) -> tuple[np.ndarray, np.ndarray]:
    x = tensor(self)
    return _order_stat(x, norm_dim(dim, x.ndim, "aten.kthvalue"), lambda n: k - 1, keepdim, "aten.kthvalue")


# -- var_mean / std / std_mean -------------------------------------------------------------


def _mean_like_var(x: np.ndarray, dims: tuple[int, ...], keepdim: bool) -> np.ndarray:
    with quiet():
        m = np.mean(x.astype(np.complex128 if x.dtype.kind == "c" else np.float64), axis=dims, keepdims=keepdim)
    return promote.cast(m, x.dtype)


def _moments(op: str, self: Any, dim: Any, correction: Any, keepdim: bool, root: bool, mean: bool) -> Any:
    x = tensor(self)
    dims = norm_dims(dim, x.ndim, op)
    v = _var(x, dims, correction, keepdim, op, root)
    return (v, _mean_like_var(x, dims, keepdim)) if mean else v


def _correction(correction: Any) -> Any:
    return 1 if correction is None else correction


def _moment_overloads(op: str, root: bool, mean: bool) -> None:
    """Register ``aten.<op>``'s three overloads (``correction``, ``dim`` with ``unbiased``,
    ``default``): one computation, the schema's three argument forms."""

    @kernel(f"aten.{op}.correction")
    def by_correction(self: Any, dim: Any = None, *, correction: Any = None, keepdim: bool = False) -> Any:
        return _moments(f"aten.{op}", self, dim, _correction(correction), keepdim, root, mean)

    @kernel(f"aten.{op}.dim")
    def by_dim(self: Any, dim: Any = None, unbiased: bool = True, keepdim: bool = False) -> Any:
        return _moments(f"aten.{op}", self, dim, 1 if unbiased else 0, keepdim, root, mean)

    @kernel(f"aten.{op}.default")
    def whole(self: Any, unbiased: bool = True) -> Any:
        return _moments(f"aten.{op}", self, None, 1 if unbiased else 0, False, root, mean)


for _op, _root, _mean in (("var_mean", False, True), ("std", True, False), ("std_mean", True, True)):
    _moment_overloads(_op, _root, _mean)


# -- cummax / cummin / logcumsumexp -------------------------------------------------------


def _cum_extreme(op: str, self: Any, dim: int, fn: Any) -> tuple[np.ndarray, np.ndarray]:
    """Running max/min along ``dim`` and where it was taken. As torch's CPU kernel: an
    element equal to the running value takes over its index (the last of equal values
    wins), and a NaN takes over from anything (later NaNs too) and stays."""
    x = tensor(self)
    d = norm_dim(dim, x.ndim, op)
    if x.ndim == 0 or x.size == 0:
        return x.copy(), np.zeros(x.shape, np.int64)
    if x.dtype.kind == "c":
        raise bad(op, "not implemented for complex tensors")
    w = _comparable(x, op)
    with quiet():
        vals = fn.accumulate(w, axis=d) if w.shape[d] else w.copy()
        taken = (w == vals) | (np.isnan(w) if w.dtype.kind == "f" else False)
    pos = np.arange(x.shape[d], dtype=np.int64).reshape((-1,) + (1,) * (x.ndim - 1 - d))
    idx = np.maximum.accumulate(np.where(taken, pos, 0), axis=d) if x.shape[d] else np.zeros(x.shape, np.int64)
    return promote.cast(vals, x.dtype), np.asarray(idx, np.int64)


@kernel("aten.cummax.default")
def cummax(self: Any, dim: int) -> tuple[np.ndarray, np.ndarray]:
    return _cum_extreme("aten.cummax", self, dim, np.maximum)


@kernel("aten.cummin.default")
def cummin(self: Any, dim: int) -> tuple[np.ndarray, np.ndarray]:
    return _cum_extreme("aten.cummin", self, dim, np.minimum)


def _logaddexp_complex(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``log(exp(a) + exp(b))`` for complex values, shifted by the one of larger real part."""
    hi = np.where(a.real >= b.real, a, b)
    lo = np.where(a.real >= b.real, b, a)
    r = hi + np.log1p(np.exp(lo - hi))
    # both parts -inf (exp is 0): the sum is 0 too, whose log is -inf
    return np.where(np.isneginf(hi.real) & np.isneginf(lo.real), lo, r)


@kernel("aten.logcumsumexp.default")
def logcumsumexp(self: Any, dim: int) -> np.ndarray:
    """``log(cumsum(exp(x)))`` along ``dim`` without overflow, in float64/complex128,
    rounded to the input's dtype (integer and bool inputs are refused, as in torch)."""
    x = tensor(self)
    d = norm_dim(dim, x.ndim, "aten.logcumsumexp")
    if promote.category(x.dtype) <= promote.INT:
        raise bad("aten.logcumsumexp", f"not implemented for {x.dtype}")
    out = x.dtype
    if x.ndim == 0 or x.shape[d] == 0:
        return x.copy()
    with quiet():
        if x.dtype.kind == "c":
            v = np.moveaxis(x.astype(np.complex128), d, 0).copy()
            for i in range(1, v.shape[0]):
                v[i] = _logaddexp_complex(v[i - 1], v[i])
            r = np.moveaxis(v, 0, d)
        else:
            r = np.logaddexp.accumulate(promote.cast(x, np.float64), axis=d)
    return promote.cast(r, out)
