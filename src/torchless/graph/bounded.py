"""Bounded scalar arithmetic for the expressions a ``.pt2`` carries.

A ``.pt2`` holds expressions torchless evaluates: symbolic sizes (``sympy.srepr`` text),
the program's ``guards_code`` (Python expressions) and the graph's SymInt arithmetic
(``_operator.pow``, ``math.factorial``...). Python's big integers make some of them cost
without bound (``10 ** 1000000000``, ``round(1, -1000000000)``, ``1 << 2**40``,
``'a' * 3221225472``), and big-integer work in C cannot be interrupted once started. Every
operation of those evaluators goes through :func:`binary`, :func:`unary` or :func:`call`,
which decide the cost of the operation from its operands *before* doing it, by the caps of
:class:`Limits` (one place: :data:`LIMITS`); an operation over a cap, or one whose cost they
cannot decide (``str % x`` formatting), raises :class:`~torchless.core.errors.LimitError`
at once. Tree walkers also take a :class:`Meter`, which caps the nodes one evaluation
visits and its nesting depth.

Python's arithmetic errors on small operands (``ZeroDivisionError``, ``TypeError``, a
negative shift's ``ValueError``, a float's ``OverflowError``) are raised as Python raises
them; callers decide what they mean.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..core.errors import LimitError

__all__ = ["Limits", "LIMITS", "Meter", "binary", "unary", "call", "check", "check_text", "BINARY_OPS", "FUNCTIONS"]


@dataclass(frozen=True, slots=True)
class Limits:
    """The caps of one evaluation (:data:`LIMITS`; docs/interpreter.md lists them).

    Attributes:
        int_bits: largest bit length of an integer operand or result (``|v| < 2**4096``).
        seq_len: longest ``str``/``bytes``/``tuple``/``list`` an operation may build.
        int_digits: longest text ``int()`` converts (4096 bits are 1,234 digits).
        text: longest expression text parsed (a guard, a srepr size).
        depth: deepest nesting of one expression.
        nodes: most operations and leaves one evaluation visits.
    """

    int_bits: int = 4096
    seq_len: int = 4096
    int_digits: int = 1300
    text: int = 100_000
    depth: int = 200
    nodes: int = 10_000


#: the caps every evaluator of ``.pt2`` expressions uses
LIMITS = Limits()

_LOG10_2 = math.log10(2)


def _too(what: str, expected: str, found: str) -> LimitError:
    return LimitError(f"expression too costly to evaluate: {what}", expected=expected, found=found)


class Meter:
    """The budget of one evaluation: :meth:`visit` once per node, with its depth."""

    __slots__ = ("limits", "nodes")

    def __init__(self, limits: Limits = LIMITS) -> None:
        self.limits = limits
        self.nodes = 0

    def visit(self, depth: int) -> None:
        """Count one node at nesting ``depth``.

        Raises:
            LimitError: past :attr:`Limits.nodes` nodes or :attr:`Limits.depth` levels.
        """
        self.nodes += 1
        if self.nodes > self.limits.nodes:
            raise _too("too many operations", f"<= {self.limits.nodes} nodes", f"more than {self.limits.nodes}")
        if depth > self.limits.depth:
            raise _too("nested too deeply", f"<= {self.limits.depth} levels", f"{depth} levels")


def check_text(text: str, what: str, limits: Limits = LIMITS) -> str:
    """``text`` if it is short enough to parse; LimitError otherwise."""
    if len(text) > limits.text:
        raise LimitError(f"{what} too long to parse", expected=f"<= {limits.text} characters", found=f"{len(text)} characters")
    return text


_SEQ = (str, bytes, bytearray, tuple, list)


def _is_int(v: Any) -> bool:
    """A Python int (bool included): the type whose operations cost without bound."""
    return isinstance(v, int)


def _count(v: Any) -> int | None:
    """``v`` as a repeat count (``operator.index``), or None when it is not one."""
    if isinstance(v, (int, np.integer)):
        return int(v)
    return None


def _bits(v: int, limits: Limits) -> int:
    """``v``'s bit length, refused past the cap."""
    n = v.bit_length()
    if n > limits.int_bits:
        raise _too("integer too large", f"<= {limits.int_bits} bits", f"{n} bits")
    return n


def _value(v: Any, limits: Limits) -> Any:
    """A result checked against the caps (the operations below keep it within twice a cap
    before this check, so computing it was cheap)."""
    if _is_int(v):
        _bits(v, limits)
    elif isinstance(v, _SEQ) and len(v) > limits.seq_len:
        raise _too(f"{type(v).__name__} too long", f"<= {limits.seq_len} items", f"{len(v)}")
    return v


def _operand(v: Any, limits: Limits) -> Any:
    return _value(v, limits)


def check(v: Any, limits: Limits = LIMITS) -> Any:
    """``v`` if it is within the caps (an int's bits, a sequence's length); LimitError otherwise."""
    return _value(v, limits)


def _repeat(seq: Any, n: int, limits: Limits) -> Any:
    size = len(seq) * max(n, 0)
    if size > limits.seq_len:
        raise _too(f"{type(seq).__name__} * {n}", f"<= {limits.seq_len} items", f"{size}")
    return seq * n


def _pow(a: Any, b: Any, limits: Limits) -> Any:
    if _is_int(a) and _is_int(b) and b > 0 and a not in (0, 1, -1):
        # |a| >= 2**(bits-1), so the result has at least (bits-1)*b + 1 bits
        low = (a.bit_length() - 1) * b
        if low >= limits.int_bits:
            raise _too(f"power with exponent {b}", f"<= {limits.int_bits} bits", f">= {low + 1} bits")
    return a**b  # a NumPy integer operand computes in its fixed width


def _shift_left(a: Any, b: Any, limits: Limits) -> Any:
    if _is_int(a) and _is_int(b) and a != 0 and b > 0:
        n = a.bit_length() + b
        if n > limits.int_bits:
            raise _too(f"shift by {b}", f"<= {limits.int_bits} bits", f"{n} bits")
    return a << b


def _mul(a: Any, b: Any, limits: Limits) -> Any:
    if isinstance(a, _SEQ) and (n := _count(b)) is not None:
        return _repeat(a, n, limits)
    if isinstance(b, _SEQ) and (n := _count(a)) is not None:
        return _repeat(b, n, limits)
    if _is_int(a) and _is_int(b):
        n = a.bit_length() + b.bit_length()
        if n > limits.int_bits + 1:
            raise _too("product", f"<= {limits.int_bits} bits", f">= {n - 1} bits")
    return a * b


def _add(a: Any, b: Any, limits: Limits) -> Any:
    if isinstance(a, _SEQ) and isinstance(b, _SEQ):
        n = len(a) + len(b)
        if n > limits.seq_len:
            raise _too(f"{type(a).__name__} concatenation", f"<= {limits.seq_len} items", f"{n}")
    return a + b


def _mod(a: Any, b: Any, limits: Limits) -> Any:
    if isinstance(a, (str, bytes, bytearray)):  # printf-style formatting: widths are unbounded
        raise _too(f"{type(a).__name__} % formatting", "numbers", type(a).__name__)
    return a % b


#: the binary operators, by Python's symbol (and sympy's names map onto these)
BINARY_OPS: dict[str, Any] = {
    "+": lambda a, b, lim: _add(a, b, lim),
    "-": lambda a, b, lim: a - b,
    "*": _mul,
    "/": lambda a, b, lim: a / b,
    "//": lambda a, b, lim: a // b,
    "%": _mod,
    "**": _pow,
    "<<": _shift_left,
    ">>": lambda a, b, lim: a >> b,
    "&": lambda a, b, lim: a & b,
    "|": lambda a, b, lim: a | b,
    "^": lambda a, b, lim: a ^ b,
    "==": lambda a, b, lim: a == b,
    "!=": lambda a, b, lim: a != b,
    "<": lambda a, b, lim: a < b,
    "<=": lambda a, b, lim: a <= b,
    ">": lambda a, b, lim: a > b,
    ">=": lambda a, b, lim: a >= b,
}


def binary(op: str, a: Any, b: Any, limits: Limits = LIMITS) -> Any:
    """``a op b`` (``op`` a key of :data:`BINARY_OPS`) with its cost checked first.

    Raises:
        LimitError: an operand or the result is over a cap, or the cost cannot be bounded.
        KeyError: an operator that is not in the table.
    """
    fn = BINARY_OPS[op]
    return _value(fn(_operand(a, limits), _operand(b, limits), limits), limits)


_UNARY: dict[str, Any] = {"-": operator.neg, "+": operator.pos, "~": operator.invert, "not": operator.not_, "abs": abs}


def unary(op: str, a: Any, limits: Limits = LIMITS) -> Any:
    """``op a`` (``-``, ``+``, ``~``, ``not``, ``abs``): results no larger than the operand."""
    return _value(_UNARY[op](_operand(a, limits)), limits)


def _round(x: Any, ndigits: Any = None, *, limits: Limits = LIMITS) -> Any:
    if ndigits is None or not _is_int(x):
        return round(x) if ndigits is None else round(x, ndigits)  # floats: CPython decides in O(1)
    n = _count(ndigits)
    if n is None:
        return round(x, ndigits)  # TypeError, as Python
    if n >= 0:
        return x  # an int rounded to n >= 0 digits is itself
    # |x| < 10**digits <= 10**(-n) / 10, below half the unit: rounds to 0 (10**(-n) not computed)
    digits = int(x.bit_length() * _LOG10_2) + 1
    if -n > digits:
        return 0
    return round(x, n)  # 10**(-n) has about as many bits as x


def _int(x: Any, *args: Any, limits: Limits = LIMITS) -> int:
    if isinstance(x, (str, bytes, bytearray)) and len(x) > limits.int_digits:
        raise _too("int() of a long string", f"<= {limits.int_digits} characters", f"{len(x)} characters")
    return int(x, *args)


def _factorial(n: Any, *, limits: Limits = LIMITS) -> int:
    k = _count(n)
    if k is not None and k > 1:
        bits = math.lgamma(k + 1) / math.log(2)  # log2(k!)
        if bits > limits.int_bits:
            raise _too(f"factorial({k})", f"<= {limits.int_bits} bits", f"about {bits:.0f} bits")
    return math.factorial(n)


def _fold(op: str) -> Any:
    def fn(*args: Any, limits: Limits = LIMITS) -> Any:
        if not args:
            return 0 if op == "+" else 1
        out = _operand(args[0], limits)
        for a in args[1:]:
            out = binary(op, out, a, limits)
        return out

    return fn


def _keep(fn: Any) -> Any:
    """A function whose result is no larger than its operands (max, floor of a float...)."""

    def wrapped(*args: Any, limits: Limits = LIMITS) -> Any:
        return fn(*(_operand(a, limits) for a in args))

    return wrapped


#: the functions by name: Python's builtins, ``math``'s and the sympy functions torch's
#: symbolic shapes use (``FloorDiv``, ``CeilToInt``...); ``Mod``/``PythonMod`` are
#: Python's ``%`` (sympy's ``Mod`` takes the divisor's sign too)
FUNCTIONS: dict[str, Any] = {
    "add": _fold("+"),
    "mul": _fold("*"),
    "max": _keep(max),
    "min": _keep(min),
    "abs": _keep(abs),
    "bool": _keep(bool),
    "float": _keep(float),
    "int": _int,
    "round": _round,
    "factorial": _factorial,
    "floor": _keep(math.floor),
    "ceil": _keep(math.ceil),
    "trunc": _keep(math.trunc),
    "sqrt": _keep(math.sqrt),
    "log": _keep(math.log),
    "log2": _keep(math.log2),
    "exp": _keep(math.exp),
    "fabs": _keep(math.fabs),
    "isnan": _keep(math.isnan),
    "isinf": _keep(math.isinf),
    "truediv": lambda a, b, limits=LIMITS: binary("/", a, b, limits),
    "floordiv": lambda a, b, limits=LIMITS: binary("//", a, b, limits),
    "mod": lambda a, b, limits=LIMITS: binary("%", a, b, limits),
    "pow": lambda a, b, limits=LIMITS: binary("**", a, b, limits),
    "lshift": lambda a, b, limits=LIMITS: binary("<<", a, b, limits),
    "rshift": lambda a, b, limits=LIMITS: binary(">>", a, b, limits),
    "bitand": lambda a, b, limits=LIMITS: binary("&", a, b, limits),
    "bitor": lambda a, b, limits=LIMITS: binary("|", a, b, limits),
    "bitxor": lambda a, b, limits=LIMITS: binary("^", a, b, limits),
    "ceildiv": lambda a, b, limits=LIMITS: unary("-", binary("//", unary("-", a, limits), b, limits), limits),
    "modindex": lambda a, d, m, limits=LIMITS: binary("%", binary("//", a, d, limits), m, limits),
    "where": lambda c, a, b, limits=LIMITS: _operand(a if c else b, limits),
    "identity": _keep(lambda a: a),
    "truncfloat": _keep(lambda a: float(math.trunc(a))),
}


def call(name: str, *args: Any, limits: Limits = LIMITS) -> Any:
    """``FUNCTIONS[name](*args)`` with its cost checked first.

    Raises:
        LimitError: an operand or the result is over a cap.
        KeyError: a function that is not in the table.
    """
    return _value(FUNCTIONS[name](*args, limits=limits), limits)
