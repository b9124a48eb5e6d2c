"""Input checks of an exported program, as torch's unlifted module makes them.

``torch.export.load(p).module()(x)`` refuses an input whose rank, static sizes or symbolic
sizes do not fit what the program was exported for (``_check_input_constraints_for_graph``):
each symbol of ``range_constraints`` is bound from the first input dimension that is just
that symbol, every other symbolic dimension (``2*s0``, ``s0 + 1``) must equal its
expression's value, and each symbol must lie in its range. :func:`check_inputs` does the
same on NumPy inputs and also checks dtypes (a NumPy float64 array for a float32 input is
the usual slip; torch would compute in another dtype or fail inside a kernel).

Expressions are ``sympy.srepr`` text (:mod:`torchless.graph.symbolic` parses them);
:func:`evaluate` computes one given the symbols' values. Both evaluators here (srepr sizes
and ``guards_code``) do every operation through :mod:`torchless.graph.bounded`, which
checks its cost before it runs (an expression over a cap is a ``LimitError``).
"""

from __future__ import annotations

import ast
import functools
import math
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..core.errors import LimitError, UsageError, short_repr
from ..graph import bounded
from ..graph.ir import SymValue, TensorValue
from ..graph.symbolic import Expr, parse_srepr, pretty

__all__ = ["InputSlot", "check_inputs", "evaluate", "Unbound", "check_guards_code", "eval_guard", "guard_env", "parse_plain"]


class Unbound(KeyError):
    """A symbol of an expression has no value yet."""


#: srepr function -> the bounded operation (:mod:`torchless.graph.bounded`) computing it
_SREPR_CALLS: dict[str, str] = {
    "Add": "add",
    "Mul": "mul",
    "Pow": "pow",
    "FloorDiv": "floordiv",
    "CleanDiv": "floordiv",
    "IntTrueDiv": "truediv",
    "FloatTrueDiv": "truediv",
    "Mod": "mod",
    "PythonMod": "mod",
    "CeilToInt": "ceil",
    "FloorToInt": "floor",
    "TruncToInt": "trunc",
    "RoundToInt": "round",
    "ceiling": "ceil",
    "floor": "floor",
    "Max": "max",
    "Min": "min",
    "Abs": "abs",
    "PowByNatural": "pow",
    "FloatPow": "pow",
    "CeilDiv": "ceildiv",
    "ModularIndexing": "modindex",
    "LShift": "lshift",
    "RShift": "rshift",
    "BitwiseFn_bitwise_and": "bitand",
    "BitwiseFn_bitwise_or": "bitor",
    "BitwiseFn_bitwise_xor": "bitxor",
    "ToFloat": "float",
    "TruncToFloat": "truncfloat",
    "Identity": "identity",
    "RoundDecimal": "round",
    "Where": "where",
    "OpaqueUnaryFn_sqrt": "sqrt",
    "OpaqueUnaryFn_exp": "exp",
    "OpaqueUnaryFn_log": "log",
    "OpaqueUnaryFn_log2": "log2",
}
#: srepr relation -> Python comparison operator
_SREPR_RELATIONS: dict[str, str] = {
    "Eq": "==",
    "Equality": "==",
    "Ne": "!=",
    "Unequality": "!=",
    "StrictLessThan": "<",
    "LessThan": "<=",
    "StrictGreaterThan": ">",
    "GreaterThan": ">=",
}


def evaluate(expr: Any, env: dict[str, Any], meter: bounded.Meter | None = None, depth: int = 0) -> Any:
    """The value of a parsed srepr expression (:class:`~torchless.graph.symbolic.Expr`),
    every operation's cost checked first (:mod:`torchless.graph.bounded`).

    Raises:
        Unbound: a symbol has no value in ``env``.
        LimitError: an operation, the node count or the depth is over a cap of
            :data:`~torchless.graph.bounded.LIMITS`.
        ValueError: a function torchless does not evaluate.
    """
    if meter is None:
        meter = bounded.Meter()
    meter.visit(depth)
    if not isinstance(expr, Expr):
        return expr
    f = expr.func
    if f == "Symbol":
        name = str(expr.args[0])
        if name not in env:
            raise Unbound(name)
        return env[name]
    if f in ("Integer", "Float"):
        v = expr.args[0] if expr.args else None
        if f == "Float" and isinstance(v, str):  # sympy writes Float('0.5', precision=53)
            v = float(bounded.check(v))
        if not isinstance(v, (int, float)) or isinstance(v, bool):
            raise ValueError(f"{f} of {short_repr(v)}")
        return bounded.check(v)
    if f in ("BooleanTrue", "true"):
        return True
    if f in ("BooleanFalse", "false"):
        return False
    d = depth + 1
    if f == "Rational" and len(expr.args) == 2:
        return bounded.binary("/", evaluate(expr.args[0], env, meter, d), evaluate(expr.args[1], env, meter, d))
    if f in _SREPR_CALLS:
        return bounded.call(_SREPR_CALLS[f], *(evaluate(a, env, meter, d) for a in expr.args))
    if f in _SREPR_RELATIONS and len(expr.args) == 2:
        a, b = (evaluate(x, env, meter, d) for x in expr.args)
        return bounded.binary(_SREPR_RELATIONS[f], a, b)
    if f == "And":
        return all([evaluate(a, env, meter, d) for a in expr.args])
    if f == "Or":
        return any([evaluate(a, env, meter, d) for a in expr.args])
    if f == "Not" and len(expr.args) == 1:
        return not evaluate(expr.args[0], env, meter, d)
    raise ValueError(f"cannot evaluate {f}")


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
        except LimitError as e:
            e.message = f"input {dm.where} has the size {short_repr(dm.text)}: {e.message}"
            raise
        except (Unbound, ValueError, ZeroDivisionError, TypeError):
            continue
        if want != dm.actual:
            raise UsageError(f"input {dm.where} must equal {dm.text}", expected=want, found=dm.actual)
    return env


def _check_range(name: str, value: int, where: str, range_constraints: dict[str, tuple[Any, Any]]) -> None:
    lo, hi = range_constraints.get(name, (None, None))
    # as torch's unlifted module: a lower bound of 2 or less is not checked, sizes 0 and 1
    # are let through (export's default minimum is 2 because it specializes 0 and 1)
    if lo is not None and lo > 2 and value < lo:
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
    except LimitError as e:
        e.message = f"input {where}: {e.message}"
        raise
    except (ValueError, RecursionError, IndexError):
        expr = None
    if not isinstance(expr, Expr):  # schema 7.x (torch 2.5) stores the printed form: ``s0``, ``2*s0 + 1``
        expr = parse_plain(size.expr)
    return _Dim(where, expr, pretty(size.expr), actual)


_PLAIN_BIN: dict[type, str] = {ast.Add: "Add", ast.Mult: "Mul", ast.FloorDiv: "FloorDiv", ast.Mod: "Mod", ast.Pow: "Pow"}


def parse_plain(text: Any) -> Expr | None:
    """A printed size expression (``s0``, ``2*s0 + 1``, ``s0 - 1``, ``(s0//2)``) as an
    :class:`Expr` tree; None when it uses anything else (the dimension is then not checked).
    The text comes from the file: it is parsed, never executed."""
    if not isinstance(text, str) or len(text) > 1000:
        return None
    try:
        tree = ast.parse(text.strip(), mode="eval").body
    except (SyntaxError, ValueError, RecursionError):
        return None

    def conv(n: ast.AST, depth: int) -> Expr:
        if depth > 100:
            raise ValueError("too deep")
        if isinstance(n, ast.Name):
            return Expr("Symbol", (n.id,))
        if isinstance(n, ast.Constant) and type(n.value) is int:
            return Expr("Integer", (n.value,))
        if isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.USub):
            return Expr("Mul", (Expr("Integer", (-1,)), conv(n.operand, depth + 1)))
        if isinstance(n, ast.BinOp):
            a, b = conv(n.left, depth + 1), conv(n.right, depth + 1)
            if isinstance(n.op, ast.Sub):
                return Expr("Add", (a, Expr("Mul", (Expr("Integer", (-1,)), b))))
            f = _PLAIN_BIN.get(type(n.op))
            if f is not None:
                return Expr(f, (a, b))
        raise ValueError("unsupported")

    try:
        return conv(tree, 0)
    except (ValueError, RecursionError):
        return None


def _solve(expr: Any, name: str, env: dict[str, Any], actual: int) -> int | None:
    """``name`` such that ``expr == actual``, for an expression linear in ``name``."""
    try:  # LimitError is a ValueError: an expression over a cap is not solved here
        f0 = evaluate(expr, {**env, name: 0})
        f1 = evaluate(expr, {**env, name: 1})
        slope = f1 - f0
        if not slope or (actual - f0) % slope:
            return None
        sol = int((actual - f0) // slope)
        return sol if evaluate(expr, {**env, name: sol}) == actual else None
    except (Unbound, ValueError, ZeroDivisionError, TypeError, OverflowError):
        return None


# -- the program's guards_code ---------------------------------------------------------
#
# ``ExportedProgram._guards_code`` holds Python expressions over the inputs
# (``max(1, L['x'].size()[0] // 2) != 1``, ``L['x'].size()[0] % 2 == 0``) that torch's
# unlifted module compiles and asserts. The text comes from the file, so it is never
# executed: :func:`eval_guard` walks its AST and evaluates only arithmetic, comparisons,
# boolean logic, a few pure functions and the input accessors, with bounded powers and
# shifts; anything else leaves that guard unevaluated.


class _Unknown(Exception):
    """The guard uses something the evaluator does not support."""


class _TensorView:
    """What a guard may ask of a tensor input: sizes, strides (contiguous), offset."""

    def __init__(self, a: np.ndarray) -> None:
        self.a = a

    def size(self, dim: int | None = None) -> Any:
        return tuple(int(s) for s in self.a.shape) if dim is None else int(self.a.shape[dim])

    def stride(self, dim: int | None = None) -> Any:
        out, acc = [], 1
        for s in reversed(self.a.shape):
            out.append(acc)
            acc *= max(int(s), 1)
        st = tuple(reversed(out))
        return st if dim is None else st[dim]

    def storage_offset(self) -> int:
        return 0

    def dim(self) -> int:
        return int(self.a.ndim)

    def numel(self) -> int:
        return int(self.a.size)


#: guard function -> the bounded function (:data:`torchless.graph.bounded.FUNCTIONS`)
_GUARD_FUNCS: dict[str, str] = {
    "max": "max",
    "min": "min",
    "abs": "abs",
    "int": "int",
    "float": "float",
    "bool": "bool",
    "round": "round",
    "Max": "max",
    "Min": "min",
    "Abs": "abs",
    "FloorDiv": "floordiv",
    "CleanDiv": "floordiv",
    "Mod": "mod",
    "PythonMod": "mod",
    "IntTrueDiv": "truediv",
    "FloatTrueDiv": "truediv",
    "TruncToInt": "trunc",
    "FloorToInt": "floor",
    "CeilToInt": "ceil",
    "RoundToInt": "round",
    "ToFloat": "float",
    "floor": "floor",
    "ceiling": "ceil",
}
_GUARD_RELATIONS = {"Eq": "==", "Ne": "!="}
_MATH_FUNCS = {"floor", "ceil", "trunc", "sqrt", "log", "log2", "exp", "fabs", "isnan", "isinf"}
_TENSOR_METHODS = {"size", "stride", "storage_offset", "dim", "numel"}
_BINOPS: dict[type, str] = {
    ast.Add: "+",
    ast.Sub: "-",
    ast.Mult: "*",
    ast.Div: "/",
    ast.FloorDiv: "//",
    ast.Mod: "%",
    ast.Pow: "**",
    ast.LShift: "<<",
    ast.RShift: ">>",
    ast.BitAnd: "&",
    ast.BitOr: "|",
    ast.BitXor: "^",
}
_CMPOPS: dict[type, str] = {ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">="}
_UNARYOPS: dict[type, str] = {ast.Not: "not", ast.USub: "-", ast.UAdd: "+", ast.Invert: "~"}


def _ev(node: ast.AST, env: dict[str, Any], meter: bounded.Meter, depth: int = 0) -> Any:
    meter.visit(depth)
    d = depth + 1
    if isinstance(node, ast.Expression):
        return _ev(node.body, env, meter, d)
    if (
        isinstance(node, ast.Constant)
        and isinstance(node.value, (int, float, bool, str))
        or (isinstance(node, ast.Constant) and node.value is None)
    ):
        return bounded.check(node.value)
    if isinstance(node, ast.Name):
        if node.id == "L":
            return env
        if node.id in ("inf", "oo"):
            return math.inf
        raise _Unknown(node.id)
    if isinstance(node, ast.Subscript):
        base = _ev(node.value, env, meter, d)
        key = _ev(node.slice, env, meter, d)
        if isinstance(base, _TensorView) or not isinstance(base, (dict, list, tuple)):
            raise _Unknown("subscript")
        try:
            return base[key]
        except (KeyError, IndexError, TypeError) as e:
            raise _Unknown("no such input") from e
    if isinstance(node, ast.BinOp):
        op = _BINOPS.get(type(node.op))
        if op is None:
            raise _Unknown(type(node.op).__name__)
        return bounded.binary(op, _ev(node.left, env, meter, d), _ev(node.right, env, meter, d))
    if isinstance(node, ast.UnaryOp):
        op = _UNARYOPS.get(type(node.op))
        if op is None:
            raise _Unknown("unary")
        return bounded.unary(op, _ev(node.operand, env, meter, d))
    if isinstance(node, ast.BoolOp):
        vals = (_ev(v, env, meter, d) for v in node.values)
        return all(vals) if isinstance(node.op, ast.And) else any(vals)
    if isinstance(node, ast.Compare):
        left = _ev(node.left, env, meter, d)
        for op_node, right_node in zip(node.ops, node.comparators, strict=True):
            right = _ev(right_node, env, meter, d)
            op = _CMPOPS.get(type(op_node))
            if op is None:
                raise _Unknown("comparison")
            if not bounded.binary(op, left, right):
                return False
            left = right
        return True
    if isinstance(node, ast.Tuple):
        return bounded.check(tuple(_ev(e, env, meter, d) for e in node.elts))
    if isinstance(node, ast.Call) and not node.keywords:
        args = [_ev(a, env, meter, d) for a in node.args]
        f = node.func
        if isinstance(f, ast.Name) and f.id in _GUARD_FUNCS:
            return bounded.call(_GUARD_FUNCS[f.id], *args)
        if isinstance(f, ast.Name) and f.id in _GUARD_RELATIONS and len(args) == 2:
            return bounded.binary(_GUARD_RELATIONS[f.id], *args)
        if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "math" and f.attr in _MATH_FUNCS:
            return bounded.call(f.attr, *args)
        if isinstance(f, ast.Attribute) and f.attr in _TENSOR_METHODS:
            obj = _ev(f.value, env, meter, d)
            if isinstance(obj, _TensorView):
                return getattr(obj, f.attr)(*args)
        raise _Unknown("call")
    raise _Unknown(type(node).__name__)


def guard_env(tree: Any) -> Any:
    """The ``L`` a guard reads: the inputs by name with each array wrapped for ``.size()``."""
    if isinstance(tree, dict):
        return {k: guard_env(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return [guard_env(v) for v in tree]
    if isinstance(tree, np.ndarray):
        return _TensorView(tree) if tree.ndim else tree.item()
    return tree


@functools.lru_cache(maxsize=1024)
def _parse(text: str) -> ast.Expression:
    return ast.parse(text, mode="eval")


def eval_guard(text: str, env: dict[str, Any]) -> bool | None:
    """The truth of one guard over ``env`` (:func:`guard_env`), or None when the guard
    uses something torchless does not evaluate (a name, a call, a type error).

    Raises:
        LimitError: the guard is longer, deeper or larger than
            :data:`~torchless.graph.bounded.LIMITS` allows, or one of its operations would
            cost more (checked before the operation runs).
    """
    bounded.check_text(text, "guard")
    try:
        tree = _parse(text)
    except (SyntaxError, ValueError):
        return None
    except (RecursionError, MemoryError):
        raise LimitError(
            "guard nested too deeply to parse", expected=f"<= {bounded.LIMITS.depth} levels", found=short_repr(text)
        ) from None
    try:
        return bool(_ev(tree, env, bounded.Meter()))
    except LimitError as e:
        e.message = f"guard {short_repr(text)}: {e.message}"
        raise
    except (_Unknown, ValueError, TypeError, ZeroDivisionError, OverflowError, IndexError, KeyError):
        return None


_L_REF = re.compile(r"L\[(['\"])([^'\"]+)\1\]")


def check_guards_code(guards: list[str], env: dict[str, Any]) -> list[str]:
    """Assert every guard that can be evaluated; returns those that could not.

    Raises:
        UsageError: a guard is false (named as torch names it: ``x.size()[0] // 2 != 1``).
        LimitError: a guard costs more to evaluate than the caps allow (:func:`eval_guard`).
    """
    skipped = []
    for g in guards:
        ok = eval_guard(g, env)
        if ok is None:
            skipped.append(g)
        elif not ok:
            shown = _L_REF.sub(lambda m: m.group(2), g)
            raise UsageError(f"the inputs fail a guard the program was exported under: {shown}")
    return skipped
