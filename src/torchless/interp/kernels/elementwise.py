"""Elementwise kernels: unary math, arithmetic, comparisons, logic, bitwise, activations, softmax.

Each promotes as torch does (:mod:`torchless.interp.promote`), computes float16/bfloat16
in float32 and rounds once, broadcasts as NumPy does (the same rules as torch), and
propagates NaN where torch does (``maximum``/``minimum``/``clamp``).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .. import promote
from ..promote import COMPLEX_TO_FLOAT, INT_TO_FLOAT, NO_OPMATH
from ..registry import kernel
from ._common import bad, binary, quiet, refuse, row_max, tensor, unary

# -- erf, vectorised (NumPy has none) ----------------------------------------------------------
#
# Chebyshev interpolants of erf, fitted once at import from math.erf/math.erfc at Chebyshev
# nodes: |x| <= 2.5 as x * P(x*x) (P as a power series), 2.5 < |x| < 6 as 1 - exp(-x*x) * Q(x), 1 beyond (erfc(6) is
# below float64's resolution at 1). Degrees give ~1e-15 relative error in float64 and ~1e-7
# in float32 (evaluated in float32 for float32 inputs).

_ERF_SPLIT, _ERF_END = 2.5, 6.0


def _cheb_fit(fn: Any, lo: float, hi: float, degree: int) -> np.ndarray:
    nodes = np.cos(np.pi * (np.arange(degree + 1) + 0.5) / (degree + 1))
    vals = np.array([fn((v + 1) * (hi - lo) / 2 + lo) for v in nodes])
    return np.polynomial.chebyshev.chebfit(nodes, vals, degree)


def _erf_over_x(u: float) -> float:
    return math.erf(math.sqrt(u)) / math.sqrt(u) if u > 0 else 2 / math.sqrt(math.pi)


def _erfc_scaled(x: float) -> float:
    return math.erfc(x) * math.exp(x * x)


def _power_series(cheb: np.ndarray, lo: float, hi: float) -> np.ndarray:
    return np.polynomial.Chebyshev(cheb, domain=[lo, hi]).convert(kind=np.polynomial.Polynomial).coef


# (power series of erf(x)/x in x*x below the split, Chebyshev series of erfc(x)*exp(x*x) above)
_ERF_COEF = {
    np.dtype(np.float64): (
        _power_series(_cheb_fit(_erf_over_x, 0, _ERF_SPLIT**2, 18), 0, _ERF_SPLIT**2),
        _cheb_fit(_erfc_scaled, _ERF_SPLIT, _ERF_END, 18),
    ),
    np.dtype(np.float32): (
        _power_series(_cheb_fit(_erf_over_x, 0, _ERF_SPLIT**2, 11), 0, _ERF_SPLIT**2),
        _cheb_fit(_erfc_scaled, _ERF_SPLIT, _ERF_END, 11),
    ),
}


def _horner(u: np.ndarray, coef: np.ndarray) -> np.ndarray:
    # (the first step, coef[-1] * u, is the same product as a filled array times u)
    acc = np.multiply(u, coef[-1], out=np.empty_like(u)) if len(coef) > 1 else np.full_like(u, coef[-1])
    for i, c in enumerate(coef[-2::-1]):
        if i:
            np.multiply(acc, u, out=acc)
        np.add(acc, c, out=acc)
    return acc


def erf(x: np.ndarray) -> np.ndarray:
    """erf of a float32 or float64 array (other dtypes are computed in float64)."""
    x = np.asarray(x)
    if not x.flags.c_contiguous:  # flat indexing below needs one memory order for x and out
        x = x.copy(order="C")
    if x.dtype not in _ERF_COEF:
        x = x.astype(np.float64)
    dt = x.dtype
    ca, cb = (c.astype(dt) for c in _ERF_COEF[dt])
    one = dt.type(1)
    xc = np.clip(x, -_ERF_SPLIT, _ERF_SPLIT)
    out = _horner(xc * xc, ca)
    np.multiply(out, xc, out=out)
    far = np.flatnonzero(xc != x)  # beyond the split (clipped), and NaN (never equal)
    if far.size:
        xf = x.reshape(-1)[far]
        af = np.abs(xf)
        t = (np.minimum(af, _ERF_END) - dt.type(_ERF_SPLIT)) * dt.type(2 / (_ERF_END - _ERF_SPLIT)) - one
        tail = np.where(af < _ERF_END, one - np.exp(-af * af) * np.polynomial.chebyshev.chebval(t, cb), one)
        out.reshape(-1)[far] = np.where(np.isnan(xf), xf, np.copysign(tail, xf))
    return out


def _erf_any(x: np.ndarray) -> np.ndarray:
    if x.dtype.kind == "c":
        raise refuse("aten.erf", "complex input")
    return erf(x)


# -- unary ---------------------------------------------------------------------------------


def _unary_float(name: str, fn: Any) -> None:
    @kernel(f"aten.{name}.default")
    def k(self: np.ndarray) -> np.ndarray:
        return unary(fn, tensor(self), INT_TO_FLOAT)

    k.__name__ = name


for _name, _fn in {
    "acos": np.arccos,
    "acosh": np.arccosh,
    "asin": np.arcsin,
    "asinh": np.arcsinh,
    "atan": np.arctan,
    "atanh": np.arctanh,
    "cos": np.cos,
    "cosh": np.cosh,
    "sin": np.sin,
    "sinh": np.sinh,
    "tan": np.tan,
    "tanh": np.tanh,
    "exp": np.exp,
    "exp2": np.exp2,
    "expm1": np.expm1,
    "log": np.log,
    "log10": np.log10,
    "log1p": np.log1p,
    "log2": np.log2,
    "sqrt": np.sqrt,
    "rsqrt": lambda x: 1 / np.sqrt(x),
    "reciprocal": lambda x: 1 / x,
    "erf": _erf_any,
    "sigmoid": lambda x: 1 / (1 + np.exp(-x)),
}.items():
    _unary_float(_name, _fn)


@kernel("aten.abs.default")
def abs_(self: np.ndarray) -> np.ndarray:
    x = tensor(self)
    if x.dtype == np.bool_:
        return x.copy()
    return unary(np.abs, x, COMPLEX_TO_FLOAT)


@kernel("aten.neg.default")
def neg(self: np.ndarray) -> np.ndarray:
    x = tensor(self)
    if x.dtype == np.bool_:
        raise bad("aten.neg", "negation, the `-` operator, on a bool tensor is not supported")
    return unary(np.negative, x)


def _rounding(name: str, fn: Any) -> None:
    @kernel(f"aten.{name}.default")
    def k(self: np.ndarray) -> np.ndarray:
        x = tensor(self)
        if promote.category(x.dtype) <= promote.INT:
            return x.copy()
        return unary(fn, x)

    k.__name__ = name


for _name, _fn in {"ceil": np.ceil, "floor": np.floor, "trunc": np.trunc, "round": np.round}.items():
    _rounding(_name, _fn)


@kernel("aten.round.decimals")
def round_decimals(self: np.ndarray, *, decimals: int = 0) -> np.ndarray:
    x = tensor(self)
    if promote.category(x.dtype) <= promote.INT:
        return x.copy()
    scale = 10.0**decimals

    def fn(v: np.ndarray) -> np.ndarray:
        if decimals >= 0:
            return np.round(v * v.dtype.type(scale)) / v.dtype.type(scale)
        return np.round(v / v.dtype.type(10.0**-decimals)) * v.dtype.type(10.0**-decimals)

    return unary(fn, x)


@kernel("aten.sign.default")
def sign(self: np.ndarray) -> np.ndarray:
    x = tensor(self)
    if x.dtype == np.bool_:
        return x.copy()
    if x.dtype.kind == "c":
        raise refuse("aten.sign", "complex input (torch uses sgn)")
    # torch: (0 < x) - (x < 0), so sign(nan) is 0
    return unary(lambda v: (v > 0).astype(v.dtype) - (v < 0).astype(v.dtype), x)


@kernel("aten.sgn.default")
def sgn(self: np.ndarray) -> np.ndarray:
    x = tensor(self)
    if x.dtype.kind != "c":
        return sign(x)

    def fn(v: np.ndarray) -> np.ndarray:
        a = np.abs(v)
        return np.where(a == 0, 0, v / np.where(a == 0, 1, a))

    return unary(fn, x)


@kernel("aten.isnan.default")
def isnan(self: np.ndarray) -> np.ndarray:
    x = tensor(self)
    if promote.category(x.dtype) <= promote.INT:
        return np.zeros(x.shape, np.bool_)
    return np.asarray(np.isnan(x.astype(promote.opmath(x.dtype))))


@kernel("aten.isinf.default")
def isinf(self: np.ndarray) -> np.ndarray:
    x = tensor(self)
    if promote.category(x.dtype) <= promote.INT:
        return np.zeros(x.shape, np.bool_)
    return np.asarray(np.isinf(x.astype(promote.opmath(x.dtype))))


@kernel("aten.isfinite.default")
def isfinite(self: np.ndarray) -> np.ndarray:
    x = tensor(self)
    if promote.category(x.dtype) <= promote.INT:
        return np.ones(x.shape, np.bool_)
    return np.asarray(np.isfinite(x.astype(promote.opmath(x.dtype))))


@kernel("aten.logical_not.default")
def logical_not(self: np.ndarray) -> np.ndarray:
    x = tensor(self)
    return np.asarray(np.logical_not(x) if x.dtype == np.bool_ else x == 0)


@kernel("aten.bitwise_not.default")
def bitwise_not(self: np.ndarray) -> np.ndarray:
    x = tensor(self)
    if promote.category(x.dtype) > promote.INT:
        raise refuse("aten.bitwise_not", f"not implemented for {x.dtype}")
    return np.asarray(np.invert(x))


# -- binary arithmetic ---------------------------------------------------------------------


def _scaled(b: Any, alpha: Any) -> Any:
    return b if alpha == 1 else (b, alpha)


def _check_alpha(op: str, a: Any, b: Any, alpha: Any) -> None:
    if alpha == 1:
        return
    rt = promote.result_type(a, b)
    if isinstance(alpha, float) and promote.category(rt) <= promote.INT:
        raise bad(op, "for integral input tensors, argument alpha must not be a floating point number")
    if isinstance(alpha, bool) is False and rt == np.bool_ and alpha not in (0, 1):
        raise bad(op, "for bool input tensors, alpha must be a bool")


def _add(a: Any, b: Any, alpha: Any, sign_: int, op: str) -> np.ndarray:
    _check_alpha(op, a, b, alpha)
    if promote.result_type(a, b) == np.bool_:
        if sign_ < 0:
            raise bad(op, "subtraction, the `-` operator, with two bool tensors is not supported")
        return np.asarray(np.logical_or(tensor(a), np.logical_and(tensor(b), bool(alpha))))

    def fn(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        if alpha != 1:
            y = y * np.asarray(alpha).astype(y.dtype)
        return x + y if sign_ > 0 else x - y

    return binary(fn, a, b, op=op)


@kernel("aten.add.Tensor", "aten.add.Scalar")
def add(self: Any, other: Any, alpha: Any = 1) -> np.ndarray:
    return _add(self, other, alpha, 1, "aten.add")


@kernel("aten.sub.Tensor", "aten.sub.Scalar")
def sub(self: Any, other: Any, alpha: Any = 1) -> np.ndarray:
    return _add(self, other, alpha, -1, "aten.sub")


@kernel("aten.rsub.Tensor", "aten.rsub.Scalar")
def rsub(self: Any, other: Any, alpha: Any = 1) -> np.ndarray:
    # other - alpha * self
    _check_alpha("aten.rsub", self, other, alpha)

    def fn(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        if alpha != 1:
            x = x * np.asarray(alpha).astype(x.dtype)
        return y - x

    if promote.result_type(self, other) == np.bool_:
        raise bad("aten.rsub", "subtraction, the `-` operator, with two bool tensors is not supported")
    return binary(fn, self, other, op="aten.rsub")


@kernel("aten.mul.Tensor", "aten.mul.Scalar")
def mul(self: Any, other: Any) -> np.ndarray:
    if promote.result_type(self, other) == np.bool_:
        return np.asarray(np.logical_and(tensor(self), tensor(other)))
    return binary(np.multiply, self, other, op="aten.mul")


def _int_zero_check(op: str, b: Any, dt: np.dtype) -> None:
    if promote.category(dt) <= promote.INT and np.any(np.asarray(b) == 0):
        raise bad(op, "ZeroDivisionError (integer division by zero)")


def _trunc_div_int(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    q = np.floor_divide(x, y)
    fix = (np.remainder(x, y) != 0) & ((x < 0) != (y < 0))
    return q + fix.astype(q.dtype)


@kernel("aten.div.Tensor", "aten.div.Scalar")
def div(self: Any, other: Any) -> np.ndarray:
    return binary(np.true_divide, self, other, INT_TO_FLOAT, op="aten.div")


@kernel("aten.div.Tensor_mode", "aten.div.Scalar_mode")
def div_mode(self: Any, other: Any, *, rounding_mode: str | None = None) -> np.ndarray:
    if rounding_mode is None:
        return div(self, other)
    rt = promote.result_type(self, other)
    if rounding_mode not in ("trunc", "floor"):
        raise bad("aten.div", f"rounding_mode must be None, 'trunc' or 'floor', not {rounding_mode!r}")
    if promote.category(rt) <= promote.INT:
        _int_zero_check("aten.div", other, rt)
        if rt == np.bool_:
            return binary(lambda x, y: np.floor_divide(x.astype(np.int64), y.astype(np.int64)), self, other, op="aten.div")
        fn = _trunc_div_int if rounding_mode == "trunc" else np.floor_divide
        return binary(fn, self, other, op="aten.div")
    if rounding_mode == "trunc":
        # torch's CPU kernel truncates the quotient rounded to the result dtype (bf16/fp16 included)
        return binary(lambda x, y: np.trunc(promote.cast(x / y, rt).astype(x.dtype)), self, other, op="aten.div")

    def floor_div(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        # torch's div_floor: Python's algorithm (NumPy's floor_divide), and a/b where b == 0
        return np.where(y == 0, x / y, np.floor_divide(x, y))

    return binary(floor_div, self, other, op="aten.div")


@kernel("aten.floor_divide.default", "aten.floor_divide.Scalar")
def floor_divide(self: Any, other: Any) -> np.ndarray:
    return div_mode(self, other, rounding_mode="floor")


@kernel("aten.remainder.Tensor", "aten.remainder.Scalar")
def remainder(self: Any, other: Any) -> np.ndarray:
    rt = promote.result_type(self, other)
    _int_zero_check("aten.remainder", other, rt)
    return binary(np.remainder, self, other, op="aten.remainder")


@kernel("aten.remainder.Scalar_Tensor")
def remainder_scalar_tensor(self: Any, other: np.ndarray) -> np.ndarray:
    return remainder(self, other)


@kernel("aten.fmod.Tensor", "aten.fmod.Scalar")
def fmod(self: Any, other: Any) -> np.ndarray:
    rt = promote.result_type(self, other)
    _int_zero_check("aten.fmod", other, rt)
    return binary(np.fmod, self, other, op="aten.fmod")


def _int_pow(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    neg = y < 0
    if not np.any(neg):
        return np.power(x, y)
    # torch: 1 ** -n = 1, (-1) ** -n = +-1, otherwise 0
    out = np.power(x, np.where(neg, 0, y))
    negres = np.where(x == 1, 1, np.where(x == -1, np.where(y % 2 == 0, 1, -1), 0)).astype(out.dtype)
    return np.where(neg, negres, out)


def _pow(a: Any, b: Any) -> np.ndarray:
    rt = promote.result_type(a, b)
    if rt == np.bool_:
        rt_fn = lambda x, y: _int_pow(x.astype(np.int64), y.astype(np.int64))  # noqa: E731
        return binary(rt_fn, a, b, op="aten.pow")
    if promote.category(rt) == promote.INT:
        return binary(_int_pow, a, b, op="aten.pow")
    return binary(np.power, a, b, op="aten.pow")


@kernel("aten.pow.Tensor_Tensor", "aten.pow.Tensor_Scalar")
def pow_(self: Any, exponent: Any) -> np.ndarray:
    return _pow(self, exponent)


@kernel("aten.pow.Scalar")
def pow_scalar(self: Any, exponent: np.ndarray) -> np.ndarray:
    return _pow(self, exponent)


@kernel("aten.atan2.default")
def atan2(self: Any, other: Any) -> np.ndarray:
    return binary(np.arctan2, self, other, INT_TO_FLOAT, op="aten.atan2")


@kernel("aten.atan2.out")
def atan2_out(self: Any, other: Any, *, out: np.ndarray) -> np.ndarray:
    res = atan2(self, other)
    if out.shape != res.shape:  # torch resizes out; a NumPy view cannot grow, so the result is a new array
        return promote.cast(res, out.dtype).copy()
    out[...] = promote.cast(res, out.dtype)
    return out


def _minmax(fn: Any, name: str) -> None:
    @kernel(f"aten.{name}.default")
    def k(self: np.ndarray, other: np.ndarray) -> np.ndarray:
        if promote.result_type(self, other).kind == "c":
            raise refuse(f"aten.{name}", "complex input")
        return binary(fn, self, other, NO_OPMATH, op=f"aten.{name}")

    k.__name__ = name


_minmax(np.maximum, "maximum")
_minmax(np.minimum, "minimum")
_minmax(np.fmax, "fmax")
_minmax(np.fmin, "fmin")


@kernel("aten.clamp.default", "aten.clamp.Tensor")
def clamp(self: np.ndarray, min: Any = None, max: Any = None) -> np.ndarray:  # noqa: A002
    if min is None and max is None:
        raise bad("aten.clamp", "at least one of 'min' or 'max' must not be None")
    compute, result = promote.elementwise_dtypes(self, min, max, kind=NO_OPMATH)
    with quiet():
        x = promote.cast(self, compute)
        if min is not None:
            x = np.maximum(x, promote.cast(min, compute))
        if max is not None:
            x = np.minimum(x, promote.cast(max, compute))
        return promote.cast(x, result)


@kernel("aten.clamp_min.default", "aten.clamp_min.Tensor")
def clamp_min(self: np.ndarray, min: Any) -> np.ndarray:  # noqa: A002
    return clamp(self, min, None)


@kernel("aten.clamp_max.default", "aten.clamp_max.Tensor")
def clamp_max(self: np.ndarray, max: Any) -> np.ndarray:  # noqa: A002
    return clamp(self, None, max)


# -- comparisons, logic, bitwise -----------------------------------------------------------


def _compare(name: str, fn: Any) -> None:
    @kernel(f"aten.{name}.Tensor", f"aten.{name}.Scalar")
    def k(self: Any, other: Any) -> np.ndarray:
        compute, _ = promote.elementwise_dtypes(self, other, kind=NO_OPMATH)
        if compute.kind == "c" and name not in ("eq", "ne"):
            raise refuse(f"aten.{name}", "complex input")
        with quiet():
            return np.asarray(fn(promote.cast(self, compute), promote.cast(other, compute)))

    k.__name__ = name


for _name, _fn in {
    "eq": np.equal,
    "ne": np.not_equal,
    "lt": np.less,
    "le": np.less_equal,
    "gt": np.greater,
    "ge": np.greater_equal,
}.items():
    _compare(_name, _fn)


def _logical(name: str, fn: Any) -> None:
    @kernel(f"aten.{name}.default")
    def k(self: np.ndarray, other: np.ndarray) -> np.ndarray:
        return np.asarray(fn(tensor(self) != 0, tensor(other) != 0))

    k.__name__ = name


_logical("logical_and", np.logical_and)
_logical("logical_or", np.logical_or)
_logical("logical_xor", np.logical_xor)


def _bitwise(name: str, fn: Any) -> None:
    @kernel(f"aten.{name}.Tensor", f"aten.{name}.Scalar")
    def k(self: Any, other: Any) -> np.ndarray:
        rt = promote.result_type(self, other)
        if promote.category(rt) > promote.INT:
            raise refuse(f"aten.{name}", f"not implemented for {rt}")
        return np.asarray(fn(promote.cast(self, rt), promote.cast(other, rt)))

    k.__name__ = name


_bitwise("bitwise_and", np.bitwise_and)
_bitwise("bitwise_or", np.bitwise_or)
_bitwise("bitwise_xor", np.bitwise_xor)


@kernel("aten.bitwise_and.Scalar_Tensor")
def bitwise_and_st(self: Any, other: np.ndarray) -> np.ndarray:
    return np.asarray(np.bitwise_and(*(promote.cast(v, promote.result_type(self, other)) for v in (self, other))))


@kernel("aten.where.self")
def where(condition: np.ndarray, self: Any, other: Any) -> np.ndarray:
    rt = promote.result_type(self, other)
    c = tensor(condition)
    if c.dtype != np.bool_:
        c = c != 0
    a, b = promote.cast(self, rt), promote.cast(other, rt)
    if c.size and c.size * 8 <= max(a.size, b.size):
        # a condition much smaller than the operands (a broadcast row mask, such as the one
        # decomposed attention uses for fully masked rows) that is all one value picks one
        # side whole: a copy of it, broadcast, instead of a select per element
        pick = b if not c.any() else a if c.all() else None
        if pick is not None:
            out = np.empty(np.broadcast_shapes(c.shape, a.shape, b.shape), rt)
            np.copyto(out, pick)
            return out
    return np.asarray(np.where(c, a, b))


@kernel("aten.where.ScalarOther", "aten.where.ScalarSelf", "aten.where.Scalar")
def where_scalar(condition: np.ndarray, self: Any, other: Any) -> np.ndarray:
    return where(condition, self, other)


@kernel("aten.masked_fill.Scalar", "aten.masked_fill.Tensor")
def masked_fill(self: np.ndarray, mask: np.ndarray, value: Any) -> np.ndarray:
    x = tensor(self)
    v = promote.cast(value, x.dtype)
    return np.asarray(np.where(tensor(mask), v, x))


# -- activations ---------------------------------------------------------------------------


@kernel("aten.relu.default")
def relu(self: np.ndarray) -> np.ndarray:
    x = tensor(self)
    if x.dtype == np.bool_:
        raise refuse("aten.relu", "bool input")
    # zero first: on a tie NumPy's maximum gives its second operand, so -0.0 stays -0.0 as
    # torch's relu keeps it (tests/interp/test_core_ops.py checks the sign against torch)
    return unary(
        lambda v: np.where(v > 0, v, np.zeros((), v.dtype)) if v.dtype.kind in "iu" else np.maximum(np.zeros((), v.dtype), v), x
    )


@kernel("aten.leaky_relu.default")
def leaky_relu(self: np.ndarray, negative_slope: Any = 0.01) -> np.ndarray:
    return unary(lambda v: np.where(v > 0, v, v * v.dtype.type(negative_slope)), tensor(self))


@kernel("aten.hardtanh.default")
def hardtanh(self: np.ndarray, min_val: Any = -1, max_val: Any = 1) -> np.ndarray:
    x = tensor(self)
    if x.dtype == np.bool_:
        raise refuse("aten.hardtanh", "bool input")

    def fn(v: np.ndarray) -> np.ndarray:
        t = v.dtype.type
        return np.minimum(np.maximum(v, t(min_val)), t(max_val))

    return unary(fn, x)


@kernel("aten.elu.default")
def elu(self: np.ndarray, alpha: Any = 1, scale: Any = 1, input_scale: Any = 1) -> np.ndarray:
    def fn(v: np.ndarray) -> np.ndarray:
        t = v.dtype.type
        return np.where(v > 0, v * t(scale), np.expm1(v * t(input_scale)) * t(alpha) * t(scale))

    return unary(fn, tensor(self))


@kernel("aten.gelu.default")
def gelu(self: np.ndarray, *, approximate: str = "none") -> np.ndarray:
    if approximate not in ("none", "tanh"):
        raise bad("aten.gelu", f"approximate must be 'none' or 'tanh', not {approximate!r}")

    def fn(v: np.ndarray) -> np.ndarray:
        t = v.dtype.type
        if v.ndim == 0:  # (NumPy gives scalars for 0-d operands without out=)
            f = np.tanh(t(math.sqrt(2 / math.pi)) * (v + t(0.044715) * v * v * v)) if approximate == "tanh" else None
            return t(0.5) * v * (t(1) + (f if f is not None else _erf_any(v * t(1 / math.sqrt(2)))))
        # the same operations as 0.5 * v * (1 + f(...)), with fresh intermediates reused in place
        if approximate == "tanh":
            inner = t(0.044715) * v
            np.multiply(inner, v, out=inner)
            np.multiply(inner, v, out=inner)
            np.add(v, inner, out=inner)
            np.multiply(inner, t(math.sqrt(2 / math.pi)), out=inner)
            e = np.tanh(inner, out=inner)
        else:
            e = _erf_any(v * t(1 / math.sqrt(2)))
        if e.dtype != v.dtype or e.shape != v.shape:
            return (t(0.5) * v * (t(1) + e)).astype(v.dtype, copy=False)
        np.add(e, t(1), out=e)
        h = t(0.5) * v
        np.multiply(h, e, out=h)
        return h

    return unary(fn, tensor(self))


@kernel("aten.silu.default")
def silu(self: np.ndarray) -> np.ndarray:
    return unary(lambda v: v / (1 + np.exp(-v)), tensor(self))


@kernel("aten.hardsigmoid.default")
def hardsigmoid(self: np.ndarray) -> np.ndarray:
    return unary(lambda v: np.minimum(np.maximum(v + 3, 0), 6) / 6, tensor(self))


@kernel("aten.hardswish.default")
def hardswish(self: np.ndarray) -> np.ndarray:
    return unary(lambda v: v * np.minimum(np.maximum(v + 3, 0), 6) / 6, tensor(self))


# -- softmax -------------------------------------------------------------------------------


def _softmax_dtypes(x: np.ndarray, half_to_float: bool, op: str) -> tuple[np.dtype, np.dtype]:
    if promote.category(x.dtype) != promote.FLOAT:
        raise refuse(op, f"not implemented for {x.dtype}")
    if half_to_float and x.dtype not in (np.float16,) and x.dtype.name != "bfloat16":
        raise bad(op, "conversion from a half to a float is only supported for half inputs")
    result = np.dtype(np.float32) if half_to_float else x.dtype
    return promote.opmath(x.dtype), result


@kernel("aten._softmax.default")
def softmax(self: np.ndarray, dim: int, half_to_float: bool) -> np.ndarray:
    from ._common import norm_dim

    x = tensor(self)
    compute, result = _softmax_dtypes(x, half_to_float, "aten._softmax")
    if x.ndim == 0:
        return promote.cast(np.ones((), compute), result)
    d = norm_dim(dim, x.ndim, "aten._softmax")
    with quiet():
        v = x.astype(compute, copy=False)
        if not v.size:
            return promote.cast(np.exp(v), result)
        e = np.subtract(v, row_max(v, d))  # a fresh array: exponentiated and normalised in place
        np.exp(e, out=e)
        np.divide(e, np.add.reduce(e, axis=d, keepdims=True), out=e)
        return promote.cast(e, result)


@kernel("aten._log_softmax.default")
def log_softmax(self: np.ndarray, dim: int, half_to_float: bool) -> np.ndarray:
    from ._common import norm_dim

    x = tensor(self)
    compute, result = _softmax_dtypes(x, half_to_float, "aten._log_softmax")
    if x.ndim == 0:
        return promote.cast(np.zeros((), compute), result)
    d = norm_dim(dim, x.ndim, "aten._log_softmax")
    with quiet():
        v = x.astype(compute, copy=False)
        m = row_max(v, d) if v.size else v  # a row holding +inf or only -inf is NaN, as torch's
        s = v - m
        return promote.cast(s - np.log(np.sum(np.exp(s), axis=d, keepdims=True)), result)


# -- in-place variants (training IR and buffer updates keep a few: add_, mul_, clamp_ ...) ---------


_BOOL_RESULT = frozenset(["eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_xor", "logical_not"])


def inplace(key: str, target: str | None = None) -> None:
    """Register the in-place variant of out-of-place kernel ``key`` (``aten.add.Tensor``):
    under ``aten.<name>_.<overload>``, or ``target`` (``aten.__iand__.Tensor``). It writes the
    result into ``self``, refusing a result type that ``self`` cannot hold or a broadcast
    that would grow it, as torch does."""
    from ..registry import _KERNELS

    out_of_place = _KERNELS[key]
    _, name, overload = key.split(".")

    @kernel(target or f"aten.{name}_.{overload}")
    def k(self: np.ndarray, *args: Any, **kwargs: Any) -> np.ndarray:
        r = tensor(out_of_place(self, *args, **kwargs))
        if promote.category(r.dtype) > promote.category(self.dtype) and name not in _BOOL_RESULT:
            raise bad(f"aten.{name}_", f"result type {r.dtype} can't be cast to the desired output type {self.dtype}")
        if r.shape != self.shape:
            raise bad(f"aten.{name}_", f"output with shape {list(self.shape)} doesn't match the broadcast shape {list(r.shape)}")
        self[...] = promote.cast(r, self.dtype)
        return self

    k.__name__ = f"{name}_"


_INPLACE = {
    "Tensor": "add sub mul div remainder fmod clamp masked_fill bitwise_and bitwise_or bitwise_xor eq ne lt le gt ge",
    "Scalar": "add sub mul div remainder fmod masked_fill eq ne lt le gt ge",
    "Tensor_mode": "div",
    "Scalar_mode": "div",
    "Tensor_Tensor": "pow",
    "Tensor_Scalar": "pow",
    "default": "clamp clamp_min clamp_max relu leaky_relu hardtanh elu gelu sigmoid tanh exp log sqrt rsqrt neg abs floor ceil "
    "round trunc sin cos reciprocal erf sign bitwise_not logical_not logical_and logical_or atan2",
}
for _ov, _names in _INPLACE.items():
    for _n in _names.split(" "):
        inplace(f"aten.{_n}.{_ov}")


@kernel("aten.hypot.default")
def hypot(self: np.ndarray, other: np.ndarray) -> np.ndarray:
    if promote.category(promote.result_type(self, other)) != promote.FLOAT:
        raise refuse("aten.hypot", "only floating point inputs")
    return binary(np.hypot, self, other, op="aten.hypot")


def _erfinv64(y: np.ndarray) -> np.ndarray:
    # Winitzki's closed form as the start (~2e-3), then Newton steps on erf (quadratic)
    y = np.asarray(y, np.float64)
    a = 0.147
    ln = np.log1p(-y * y)
    t = 2 / (np.pi * a) + ln / 2
    x = np.copysign(np.sqrt(np.sqrt(t * t - ln / a) - t), y)
    inner = np.abs(y) < 1
    for _ in range(4):
        xi = np.where(inner, x, 0.0)
        step = (erf(xi) - np.where(inner, y, 0.0)) / (2 / math.sqrt(math.pi) * np.exp(-xi * xi))
        x = np.where(inner, x - step, x)
    x = np.where(np.abs(y) == 1, np.copysign(np.inf, y), x)
    return np.where(np.abs(y) > 1, np.nan, x)


@kernel("aten.erfinv.default")
def erfinv(self: np.ndarray) -> np.ndarray:
    x = tensor(self)
    if x.dtype.kind == "c":
        raise refuse("aten.erfinv", "complex input")
    return unary(lambda v: _erfinv64(v).astype(v.dtype), x, INT_TO_FLOAT)


@kernel("aten.complex.default")
def complex_(real: Any, imag: Any) -> np.ndarray:
    """``real + i*imag``, built part by part (so ``inf`` parts never make NaN)."""
    a, b = tensor(real), tensor(imag)
    if a.dtype != b.dtype:
        raise bad("aten.complex", f"expected real and imag to have the same dtype, got {a.dtype} and {b.dtype}")
    if promote.category(a.dtype) != promote.FLOAT:
        raise bad("aten.complex", f"expected floating point real and imag, got {a.dtype}")
    cdt = np.complex128 if a.dtype == np.float64 else np.complex64  # half: complex32, which NumPy lacks
    a, b = np.broadcast_arrays(a, b)
    out = np.empty(a.shape, cdt)
    out.real = a
    out.imag = b
    return out


# -- bit shifts: torch's rules for shift counts outside [0, bits) ---------------------------


def _shift(op: str, self: Any, other: Any, left: bool) -> np.ndarray:
    rt = promote.result_type(self, other)
    if promote.category(rt) != promote.INT or rt == np.bool_:
        raise bad(op, f"not implemented for {rt}")
    a, b = promote.cast(self, rt), promote.cast(other, rt)
    bits = rt.itemsize * 8
    signed = rt.kind == "i"
    # a count that is negative as a signed number, or >= the width, is out of range
    counts = b if signed else b.view(np.dtype(f"i{rt.itemsize}"))
    out_of_range = (counts < 0) | (b >= bits)
    safe = np.where(out_of_range, 0, b).astype(rt)
    with quiet():
        if left:  # shifted as unsigned (no signed overflow), 0 when out of range
            u = np.dtype(f"u{rt.itemsize}")
            r = np.left_shift(a.astype(u), safe.astype(u)).astype(rt)
            return np.asarray(np.where(out_of_range, np.zeros((), rt), r))
        r = np.right_shift(a, safe)
        # out of range: all the sign bits for a signed type, 0 for an unsigned one
        fill = np.right_shift(a, bits - 1) if signed else np.zeros((), rt)
        return np.asarray(np.where(out_of_range, fill, r))


@kernel("aten.__lshift__.Tensor", "aten.__lshift__.Scalar")
def lshift(self: Any, other: Any) -> np.ndarray:
    return _shift("aten.__lshift__", self, other, True)


@kernel("aten.__rshift__.Tensor", "aten.__rshift__.Scalar")
def rshift(self: Any, other: Any) -> np.ndarray:
    return _shift("aten.__rshift__", self, other, False)


@kernel("aten.bitwise_left_shift.Tensor", "aten.bitwise_left_shift.Tensor_Scalar", "aten.bitwise_left_shift.Scalar_Tensor")
def bitwise_left_shift(self: Any, other: Any) -> np.ndarray:
    return _shift("aten.bitwise_left_shift", self, other, True)


@kernel("aten.bitwise_right_shift.Tensor", "aten.bitwise_right_shift.Tensor_Scalar", "aten.bitwise_right_shift.Scalar_Tensor")
def bitwise_right_shift(self: Any, other: Any) -> np.ndarray:
    return _shift("aten.bitwise_right_shift", self, other, False)


# -- complex parts ------------------------------------------------------------------------


@kernel("aten.real.default")
def real(self: np.ndarray) -> np.ndarray:
    """The real part: a view of a complex tensor; a real tensor itself."""
    x = tensor(self)
    return x.real if x.dtype.kind == "c" else x


@kernel("aten.imag.default")
def imag(self: np.ndarray) -> np.ndarray:
    """The imaginary part of a complex tensor (a view)."""
    x = tensor(self)
    if x.dtype.kind != "c":
        raise bad("aten.imag", f"imag is not implemented for tensors with non-complex dtypes ({x.dtype})")
    return x.imag


@kernel("aten.conj.default", "aten._conj.default", "aten.conj_physical.default", "aten._conj_physical.default")
def conj(self: np.ndarray) -> np.ndarray:
    """The complex conjugate, materialised (torch's lazy conjugate bit has no NumPy
    counterpart); a real tensor itself."""
    x = tensor(self)
    return np.asarray(np.conj(x)) if x.dtype.kind == "c" else x


@kernel("aten.resolve_conj.default", "aten.resolve_neg.default")
def resolve_conj(self: np.ndarray) -> np.ndarray:
    """Identity: the interpreter's conjugates and negations are never lazy."""
    return tensor(self)


@kernel("aten.angle.default")
def angle(self: np.ndarray) -> np.ndarray:
    """``atan2(imag, real)`` of a complex tensor; of a real one pi where negative, else 0
    (NaN stays NaN); integers give float32."""
    x = tensor(self)
    if x.dtype.kind == "c":
        with quiet():
            return np.asarray(np.angle(x)).astype(promote.to_real(x.dtype))

    def fn(v: np.ndarray) -> np.ndarray:
        return np.where(np.isnan(v), v, np.where(v < 0, np.pi, 0.0).astype(v.dtype))

    return unary(fn, x, INT_TO_FLOAT)


@kernel("aten.polar.default")
def polar(abs: np.ndarray, angle: np.ndarray) -> np.ndarray:  # noqa: A002 - the schema's names
    """``abs * (cos(angle) + i sin(angle))``, built part by part."""
    r, t = tensor(abs), tensor(angle)
    if r.dtype != t.dtype or r.dtype not in (np.float32, np.float64):
        raise bad("aten.polar", f"expected abs and angle of the same float or double dtype, got {r.dtype} and {t.dtype}")
    r, t = np.broadcast_arrays(r, t)
    out = np.empty(r.shape, np.complex128 if r.dtype == np.float64 else np.complex64)
    with quiet():
        out.real = r * np.cos(t)
        out.imag = r * np.sin(t)
    return out
