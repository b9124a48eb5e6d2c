"""Input checks of an exported program, as torch's unlifted module makes them.

``torch.export.load(p).module()(x)`` refuses an input whose rank, static sizes or symbolic
sizes do not fit what the program was exported for (``_check_input_constraints_for_graph``):
each symbol of ``range_constraints`` is bound from the first input dimension that is just
that symbol, every other symbolic dimension (``2*s0``, ``s0 + 1``) must equal its
expression's value, and each symbol must lie in its range. :func:`check_inputs` does the
same on NumPy inputs and also checks dtypes (a NumPy float64 array for a float32 input is
the usual slip; torch would compute in another dtype or fail inside a kernel).

Expressions are ``sympy.srepr`` text (:mod:`torchless.graph.symbolic` parses them);
:func:`evaluate` computes one given the symbols' values.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..core.errors import UsageError
from ..graph.ir import SymValue, TensorValue
from ..graph.symbolic import Expr, parse_srepr, pretty

__all__ = ["InputSlot", "check_inputs", "evaluate", "Unbound"]


class Unbound(KeyError):
    """A symbol of an expression has no value yet."""


def _prod(xs: list[Any]) -> Any:
    out: Any = 1
    for x in xs:
        out = out * x
    return out


_FUNCS: dict[str, Any] = {
    "Add": lambda *a: sum(a),
    "Mul": lambda *a: _prod(list(a)),
    "Pow": lambda a, b: a**b,
    "FloorDiv": lambda a, b: a // b,
    "CleanDiv": lambda a, b: a // b,
    "IntTrueDiv": lambda a, b: a / b,
    "FloatTrueDiv": lambda a, b: a / b,
    "Mod": lambda a, b: a % b,
    "PythonMod": lambda a, b: a % b,
    "CeilToInt": math.ceil,
    "FloorToInt": math.floor,
    "TruncToInt": math.trunc,
    "RoundToInt": round,
    "ceiling": math.ceil,
    "floor": math.floor,
    "Max": max,
    "Min": min,
    "Abs": abs,
    "Eq": lambda a, b: a == b,
    "Equality": lambda a, b: a == b,
    "Ne": lambda a, b: a != b,
    "Unequality": lambda a, b: a != b,
    "StrictLessThan": lambda a, b: a < b,
    "LessThan": lambda a, b: a <= b,
    "StrictGreaterThan": lambda a, b: a > b,
    "GreaterThan": lambda a, b: a >= b,
    "And": lambda *a: all(a),
    "Or": lambda *a: any(a),
    "Not": lambda a: not a,
}


def evaluate(expr: Any, env: dict[str, Any]) -> Any:
    """The value of a parsed srepr expression (:class:`~torchless.graph.symbolic.Expr`).

    Raises:
        Unbound: a symbol has no value in ``env``.
        ValueError: a function torchless does not evaluate.
    """
    if not isinstance(expr, Expr):
        return expr
    f = expr.func
    if f == "Symbol":
        name = str(expr.args[0])
        if name not in env:
            raise Unbound(name)
        return env[name]
    if f in ("Integer", "Float"):
        return expr.args[0]
    if f == "Rational":
        return expr.args[0] / expr.args[1]
    if f in ("BooleanTrue", "true"):
        return True
    if f in ("BooleanFalse", "false"):
        return False
    fn = _FUNCS.get(f)
    if fn is None:
        raise ValueError(f"cannot evaluate {f}")
    return fn(*(evaluate(a, env) for a in expr.args))


def _symbols(expr: Any, out: set[str]) -> set[str]:
    if isinstance(expr, Expr):
        if expr.func == "Symbol":
            out.add(str(expr.args[0]))
        for a in expr.args:
            _symbols(a, out)
    return out


@dataclass
class InputSlot:
    """One user input to check: its display name (``x``, ``kwargs['mask']``), what the
    graph expects (``TensorValue``, ``SymValue``, or a constant), and the value given."""

    name: str
    expected: Any
    value: Any


@dataclass
class _Dim:
    where: str
    expr: Any  # parsed
    text: str
    actual: int


def check_inputs(slots: list[InputSlot], range_constraints: dict[str, tuple[Any, Any]]) -> dict[str, Any]:
    """Check every input against the program; returns the symbols' values.

    Raises:
        UsageError: naming the input, the dimension and the expected value or range.
    """
    dims: list[_Dim] = []
    for s in slots:
        exp, v = s.expected, s.value
        if isinstance(exp, TensorValue):
            if not isinstance(v, np.ndarray):
                raise UsageError(f"input {s.name} must be a tensor", found=type(v).__name__)
            if len(exp.shape) != v.ndim:
                raise UsageError(f"unexpected number of dimensions in input {s.name}", expected=len(exp.shape), found=v.ndim)
            want = exp.dtype.numpy
            if want is not None and v.dtype != want:
                raise UsageError(
                    f"input {s.name} has the wrong dtype",
                    expected=exp.dtype.name,
                    found=str(v.dtype),
                    hint=f"convert it, e.g. .astype({str(want)!r})" if str(want).isidentifier() else None,
                )
            for d, size in enumerate(exp.shape):
                actual = int(v.shape[d])
                if isinstance(size, SymValue):
                    dims.append(_dim(f"{s.name}.shape[{d}]", size, actual))
                elif actual != size:
                    raise UsageError(f"input {s.name}.shape[{d}] does not match the program", expected=size, found=actual)
        elif isinstance(exp, SymValue):
            if isinstance(v, np.ndarray) and v.ndim == 0:
                v = v.item()
            if exp.kind == "int" and not isinstance(v, (int, np.integer)) or isinstance(v, bool) and exp.kind != "bool":
                raise UsageError(f"input {s.name} must be an int", found=type(v).__name__)
            if exp.kind == "int":
                dims.append(_dim(s.name, exp, int(v)))
        elif (isinstance(exp, (int, float, str, bool)) or exp is None) and v != exp:
            raise UsageError(f"input {s.name} must equal the value the program was exported with", expected=exp, found=v)
    env: dict[str, Any] = {}
    origin: dict[str, str] = {}
    # bind the symbols that are a whole dimension, then solve linear expressions for the rest
    for dm in dims:
        if isinstance(dm.expr, Expr) and dm.expr.func == "Symbol":
            name = str(dm.expr.args[0])
            if name in env and env[name] != dm.actual:
                raise UsageError(
                    f"input {dm.where} must equal {origin[name]} (both are {name})", expected=env[name], found=dm.actual
                )
            if name not in env:
                _check_range(name, dm.actual, dm.where, range_constraints)
            env.setdefault(name, dm.actual)
            origin.setdefault(name, dm.where)
    for dm in dims:
        syms = _symbols(dm.expr, set()) - set(env)
        if len(syms) == 1:
            (name,) = syms
            sol = _solve(dm.expr, name, env, dm.actual)
            if sol is not None:
                env[name] = sol
                origin[name] = dm.where
    for name, value in env.items():
        _check_range(name, value, origin[name], range_constraints)
    for dm in dims:
        try:
            want = evaluate(dm.expr, env)
        except (Unbound, ValueError, ZeroDivisionError, TypeError):
            continue
        if want != dm.actual:
            raise UsageError(f"input {dm.where} must equal {dm.text}", expected=want, found=dm.actual)
    return env


def _check_range(name: str, value: int, where: str, range_constraints: dict[str, tuple[Any, Any]]) -> None:
    lo, hi = range_constraints.get(name, (None, None))
    if lo is not None and value < lo:
        raise UsageError(
            f"input {where} is out of the range the program was exported for ({name})", expected=f">= {lo}", found=value
        )
    if hi is not None and value > hi:
        raise UsageError(
            f"input {where} is out of the range the program was exported for ({name})", expected=f"<= {hi}", found=value
        )


def _dim(where: str, size: SymValue, actual: int) -> _Dim:
    try:
        expr = parse_srepr(size.expr)
    except (ValueError, RecursionError, IndexError):
        expr = None
    return _Dim(where, expr, pretty(size.expr), actual)


def _solve(expr: Any, name: str, env: dict[str, Any], actual: int) -> int | None:
    """``name`` such that ``expr == actual``, for an expression linear in ``name``."""
    try:
        f0 = evaluate(expr, {**env, name: 0})
        f1 = evaluate(expr, {**env, name: 1})
    except (Unbound, ValueError, ZeroDivisionError, TypeError):
        return None
    slope = f1 - f0
    if not slope or (actual - f0) % slope:
        return None
    sol = int((actual - f0) // slope)
    try:
        return sol if evaluate(expr, {**env, name: sol}) == actual else None
    except (ValueError, ZeroDivisionError, TypeError):
        return None
