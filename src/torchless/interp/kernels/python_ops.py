"""Kernels of the Python-level functions exported graphs call: ``_operator.*`` (arithmetic
and comparisons on SymInts/SymFloats/SymBools, ``getitem`` on multi-output ops) and
``math.*``. Operands are Python scalars (the convention of :mod:`..registry`); the
results follow Python's rules, which are SymInt's (``//`` floors, ``%`` takes the
divisor's sign, ``/`` of two ints is a float). The operands come from the file, so the
arithmetic operators, ``math.factorial``, ``builtins.round`` and ``builtins.int`` go through
:mod:`torchless.graph.bounded`: ``10 ** 10**9`` is a ``LimitError`` before it runs.
"""

from __future__ import annotations

import math
import operator
from typing import Any

from ...graph import bounded
from ..registry import kernel

_BINARY = (
    "add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "lshift", "rshift", "and_", "or_", "xor",
    "eq", "ne", "lt", "le", "gt", "ge", "getitem", "matmul", "contains", "is_", "is_not",
)  # fmt: skip
_UNARY = ("neg", "pos", "abs", "invert", "not_", "truth", "index")
#: the operators whose cost grows with their operands' values go through
#: :func:`torchless.graph.bounded.binary` (the cost is checked before the operation runs)
_BOUNDED_BINARY = {
    "add": "+", "sub": "-", "mul": "*", "truediv": "/", "floordiv": "//", "mod": "%", "pow": "**",
    "lshift": "<<", "rshift": ">>", "and_": "&", "or_": "|", "xor": "^",
}  # fmt: skip


def _register(name: str, fn: Any) -> None:
    kernel(f"_operator.{name}", f"operator.{name}")(fn)


def _make_binary(fn: Any) -> Any:
    def k(a: Any, b: Any) -> Any:
        return fn(a, b)

    k.__name__ = fn.__name__
    return k


def _make_bounded(name: str, op: str) -> Any:
    def k(a: Any, b: Any) -> Any:
        return bounded.binary(op, a, b)

    k.__name__ = name
    return k


def _make_unary(fn: Any) -> Any:
    def k(a: Any) -> Any:
        return fn(a)

    k.__name__ = fn.__name__
    return k


for _name in _BINARY:
    _op = _BOUNDED_BINARY.get(_name)
    _register(_name, _make_bounded(_name, _op) if _op else _make_binary(getattr(operator, _name)))
for _name in _UNARY:
    _register(_name, _make_unary(getattr(operator, _name)))


_MATH_UNARY = (
    "ceil", "floor", "trunc", "sqrt", "exp", "expm1", "log", "log1p", "log2", "log10", "sin", "cos", "tan",
    "asin", "acos", "atan", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "fabs", "erf", "erfc",
    "gamma", "lgamma", "isnan", "isinf", "isfinite", "radians", "degrees",
)  # fmt: skip
_MATH_BINARY = ("pow", "fmod", "atan2", "copysign", "gcd", "hypot", "isclose", "remainder")

for _name in _MATH_UNARY:
    kernel(f"math.{_name}")(_make_unary(getattr(math, _name)))
for _name in _MATH_BINARY:
    kernel(f"math.{_name}")(_make_binary(getattr(math, _name)))


@kernel("math.factorial")
def math_factorial(a: Any) -> int:
    return int(bounded.call("factorial", a))


@kernel("builtins.max", "max")
def builtin_max(*args: Any) -> Any:
    return max(*args)


@kernel("builtins.min", "min")
def builtin_min(*args: Any) -> Any:
    return min(*args)


@kernel("builtins.abs")
def builtin_abs(a: Any) -> Any:
    return abs(a)


@kernel("builtins.round")
def builtin_round(a: Any, ndigits: Any = None) -> Any:
    return bounded.call("round", a, ndigits)


@kernel("builtins.int")
def builtin_int(a: Any) -> int:
    return int(bounded.call("int", a))


@kernel("builtins.float")
def builtin_float(a: Any) -> float:
    return float(a)


@kernel("builtins.bool")
def builtin_bool(a: Any) -> bool:
    return bool(a)
