"""Symbolic shape expressions as .pt2 stores them (``sympy.srepr`` text), without sympy.

:func:`parse_srepr` reads ``Add(Symbol('s0', integer=True), Integer(1))`` into a small tree
and :func:`pretty` renders it as torch prints it (``s0 + 1``); :func:`free_symbols` lists the
symbol names, which key ``range_constraints``. Text that is not srepr is returned as is.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ..core.errors import LimitError
from .bounded import LIMITS, check_text

__all__ = ["Expr", "parse_srepr", "pretty", "free_symbols"]


@dataclass(frozen=True, slots=True)
class Expr:
    """``func(*args, **kwargs)`` from srepr; leaves are ints, floats and strings."""

    func: str
    args: tuple[Any, ...] = ()
    kwargs: tuple[tuple[str, Any], ...] = ()


_TOKEN = re.compile(
    r"\s*(?:(?P<name>[A-Za-z_][A-Za-z0-9_]*)|(?P<num>-?\d+(?:\.\d*)?(?:[eE][-+]?\d+)?)|(?P<str>'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\")|(?P<p>[(),=]))"
)


class _P:
    def __init__(self, s: str) -> None:
        self.toks: list[tuple[str, str]] = []
        pos = 0
        while pos < len(s):
            m = _TOKEN.match(s, pos)
            if not m or m.end() == pos:
                if s[pos:].strip() == "":
                    break
                raise ValueError(s[pos:])
            kind = m.lastgroup or ""
            self.toks.append((kind, m.group(kind)))
            pos = m.end()
        self.i = 0

    def peek(self) -> tuple[str, str] | None:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def next(self) -> tuple[str, str]:
        t = self.peek()
        if t is None:
            raise ValueError("end")
        self.i += 1
        return t

    def value(self, depth: int = 0) -> Any:
        if depth > LIMITS.depth:
            raise LimitError("symbolic expression nested too deeply", expected=f"<= {LIMITS.depth} levels")
        kind, text = self.next()
        if kind == "num":
            if any(c in text for c in ".eE"):
                return float(text)
            if len(text) > LIMITS.int_digits:  # int() of a long digit string is quadratic
                raise LimitError(
                    "integer in a symbolic expression too long",
                    expected=f"<= {LIMITS.int_digits} digits",
                    found=f"{len(text)} digits",
                )
            return int(text)
        if kind == "str":
            return text[1:-1]
        if kind != "name":
            raise ValueError(text)
        if self.peek() != ("p", "("):
            return {"True": True, "False": False, "None": None}.get(text, text)
        self.next()
        args: list[Any] = []
        kwargs: list[tuple[str, Any]] = []
        if self.peek() == ("p", ")"):
            self.next()
            return Expr(text)
        while True:
            t = self.peek()
            if t and t[0] == "name" and self.i + 1 < len(self.toks) and self.toks[self.i + 1] == ("p", "="):
                self.i += 2
                kwargs.append((t[1], self.value(depth + 1)))
            else:
                args.append(self.value(depth + 1))
            kind, text2 = self.next()
            if text2 == ")":
                return Expr(text, tuple(args), tuple(kwargs))
            if text2 != ",":
                raise ValueError(text2)


def parse_srepr(text: str) -> Any:
    """Parse srepr text into :class:`Expr` nodes.

    Raises:
        ValueError: not srepr.
        LimitError: longer, deeper or with longer integers than
            :data:`~torchless.graph.bounded.LIMITS` allows (a ValueError too).
    """
    p = _P(check_text(text, "symbolic expression"))
    v = p.value()
    if p.peek() is not None:
        raise ValueError("trailing text")
    return v


_BIN = {
    "StrictGreaterThan": ">",
    "GreaterThan": ">=",
    "StrictLessThan": "<",
    "LessThan": "<=",
    "Equality": "==",
    "Eq": "==",
    "Unequality": "!=",
    "Ne": "!=",
    "Pow": "**",
    "FloorDiv": "//",
    "Mod": "%",
    "PythonMod": "%",
}
_PREC = {"Add": 1, "Mul": 2, "Pow": 3}


def _render(e: Any, parent: int = 0) -> str:
    if not isinstance(e, Expr):
        return str(e)
    f = e.func
    if f == "Symbol":
        return str(e.args[0]) if e.args else "?"
    if f in ("Integer", "Float"):
        return str(e.args[0])
    if f == "Rational" and len(e.args) == 2:
        return f"{e.args[0]}/{e.args[1]}"
    if f in ("Infinity", "IntInfinity"):
        return "oo" if f == "Infinity" else "int_oo"
    if f in ("NegativeInfinity", "NegativeIntInfinity"):
        return "-oo" if f == "NegativeInfinity" else "-int_oo"
    if f in ("BooleanTrue", "true"):
        return "True"
    if f in ("BooleanFalse", "false"):
        return "False"
    if f == "Add":
        out = ""
        for i, a in enumerate(e.args):
            s = _render(a, 1)
            if i and s.startswith("-"):
                out += " - " + s[1:]
            elif i:
                out += " + " + s
            else:
                out = s
        return f"({out})" if parent > 1 else out
    if f == "Mul":
        args = list(e.args)
        neg = ""
        if args and isinstance(args[0], Expr) and args[0].func == "Integer" and args[0].args == (-1,):
            neg = "-"
            args = args[1:]
        out = neg + "*".join(_render(a, 2) for a in args)
        return f"({out})" if parent > 2 else out
    if f in _BIN and len(e.args) == 2:
        op = _BIN[f]
        prec = 3 if op == "**" else (2 if op in ("//", "%") else 0)
        out = f"{_render(e.args[0], prec + 1)}{op if op == '**' else f' {op} '}{_render(e.args[1], prec + 1)}"
        return f"({out})" if parent > prec and prec else out
    if f == "Not" and len(e.args) == 1:
        return f"~{_render(e.args[0], 4)}"
    if f in ("And", "Or"):
        op = " & " if f == "And" else " | "
        return "(" + op.join(_render(a, 0) for a in e.args) + ")"
    return f"{f}({', '.join(_render(a) for a in e.args)})"


def pretty(text: str) -> str:
    """``Add(Symbol('s0'), Integer(1))`` -> ``s0 + 1``; non-srepr text comes back unchanged."""
    try:
        return _render(parse_srepr(text))
    except (ValueError, RecursionError, IndexError):
        return text


def free_symbols(text: str) -> list[str]:
    """Names of the ``Symbol(...)`` in srepr ``text``, in first-seen order."""
    try:
        tree = parse_srepr(text)
    except (ValueError, RecursionError, IndexError):
        return re.findall(r"Symbol\('([^']+)'", text)
    out: list[str] = []

    def walk(e: Any) -> None:
        if isinstance(e, Expr):
            if e.func == "Symbol" and e.args and e.args[0] not in out:
                out.append(str(e.args[0]))
            for a in e.args:
                walk(a)

    walk(tree)
    return out
