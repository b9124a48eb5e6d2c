"""TorchScript code and lite-interpreter bytecode, read the way torch reads them.

``torch.jit.load`` compiles every ``code/*.py`` file of an archive with TorchScript's own
frontend, and the lite interpreter (``_load_for_lite_interpreter``) runs the operator
tables of ``bytecode.pkl``. What either can reach is found here without compiling:

* :func:`tokenize` follows the rules of torch's lexer (``torch/csrc/jit/frontend/
  lexer.h``): blanks are ``isspace`` minus newline, ``#`` comments run to the end of the
  line (``# type:`` is a token), a backslash before a newline joins lines, newlines
  inside brackets do not count, strings are ``'``/``"`` or triple-quoted with backslash
  escapes, adjacent string literals concatenate, identifiers are ASCII
  ``[A-Za-z_][A-Za-z0-9_]*``, and tokens are matched longest first. One pass, linear in
  the text, with a token budget.
* :func:`analyse_code` collects every dotted reference (``torch.from_file``,
  ``ops.aten.from_file``, ``torch.ops.aten.save``, ``torch.classes.ns.Cls``,
  ``getattr(torch, "from_" "file")``), after resolving simple aliases (``t = torch``,
  ``import a.b as c``, ``from a import b``) anywhere in the file, and every ``def
  __setstate__`` (any class, any spacing). References are checked against
  :mod:`torchless.scan.torchscript_ops` (generated from torch's operator registry): a
  reference is flagged whether it is called or only named, since TorchScript can call a
  function through a name bound to it.
* :func:`analyse_bytecode` walks the value of ``bytecode.pkl`` (as the symbolic pickle
  machine built it) for every operator name (``ns::op``) and every method name, whether
  or not ``code/`` exists: a method ``*.__setstate__`` runs at load.

Nothing is compiled, imported or executed; the work is linear in the input and bounded.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Final

from ..core.errors import FormatError, LimitError
from ..formats.torchscript import spec as ts_spec
from .torchscript_ops import BUILTIN_CLASSES, RISKY_OPS, RISKY_PYTHON

__all__ = [
    "Token",
    "Reference",
    "CodeReport",
    "tokenize",
    "analyse_code",
    "analyse_bytecode",
    "risk_of",
    "MAX_CODE_BYTES",
    "MAX_TOKENS",
]

MAX_CODE_BYTES = 16 << 20  # one code file
MAX_TOKENS = 4_000_000  # tokens per code file
MAX_ALIAS_STEPS = 32  # alias resolution chain length
MAX_BYTECODE_NODES = 2_000_000  # values visited in one bytecode.pkl
MAX_REPORTED = 50  # risky references listed per code file

_OPEN, _CLOSE = "([{", ")]}"
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "a": "\a", "b": "\b", "f": "\f", "v": "\v", "\\": "\\", "'": "'", '"': '"', "\n": ""}


#: one token, a plain tuple ``(kind, text, pos)`` (tuples keep the lexer fast): ``kind``
#: is ``name``, ``string`` (decoded; adjacent literals joined), ``number``, ``op`` or
#: ``newline``; ``pos`` the character offset of its start
Token = tuple[str, str, int]
_KIND: Final = 0
_TEXT: Final = 1
_POS: Final = 2


def _decode(body: str) -> str:
    """A string literal's value (escapes decoded the way Python and torch's parser do)."""
    if "\\" not in body:
        return body
    out: list[str] = []
    i, n = 0, len(body)
    while i < n:
        c = body[i]
        if c != "\\" or i + 1 >= n:
            out.append(c)
            i += 1
            continue
        e = body[i + 1]
        if e in _ESCAPES:
            out.append(_ESCAPES[e])
            i += 2
        elif e == "x" and re.match(r"[0-9a-fA-F]{2}", body[i + 2 : i + 4]):
            out.append(chr(int(body[i + 2 : i + 4], 16)))
            i += 4
        elif e in "01234567":
            m = re.match(r"[0-7]{1,3}", body[i + 1 : i + 4])
            assert m is not None
            out.append(chr(int(m.group(0), 8)))
            i += 1 + len(m.group(0))
        else:
            out.append("\\" + e)
            i += 2
    return "".join(out)


_TOKEN = re.compile(
    r"""
     (?P<blank>[ \t\v\f\r]+|\\\n|\#(?!\ type:)[^\n]*)
    |(?P<nl>\n)
    |(?P<str>\"\"\"(?:[^\\]|\\[\s\S])*?\"\"\"|'''(?:[^\\]|\\[\s\S])*?'''|"(?:[^"\\\n]|\\[\s\S])*"|'(?:[^'\\\n]|\\[\s\S])*')
    |(?P<name>[A-Za-z_][A-Za-z0-9_]*)
    |(?P<num>0[xX](?:[0-9a-fA-F]+\.?[0-9a-fA-F]*|\.[0-9a-fA-F]+)(?:[pP][+-]?[0-9]+)?j?|(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?j?)
    |(?P<op>\#\ type:|\*\*=|<<=|>>=|\.\.\.|<=>|->|!=|==|<=|>=|//|<<|>>|\+=|-=|\*=|/=|%=|\|=|&=|\^=|\*\*
            |[-+*/%@()\[\]:,={}><.?!&^|~])
    """,
    re.X,
)


def tokenize(text: str, *, name: str = "<code>", max_tokens: int = MAX_TOKENS) -> Iterator[Token]:
    """Tokens of TorchScript source, by the rules of torch's lexer (see module doc).

    One compiled pattern matched at each position (linear); blanks, comments and
    continuations produce nothing, newlines only outside brackets, adjacent string
    literals one ``string`` token.

    Raises:
        FormatError: a character or string torch's lexer rejects (the archive would not
            load; the caller reports it as not analysed).
        LimitError: more than ``max_tokens`` tokens.
    """
    n = len(text)
    i = 0
    depth = 0
    count = 0
    parts: list[str] = []  # pieces of a run of string literals (joined once: linear)
    spos = 0
    match = _TOKEN.match
    while i < n:
        m = match(text, i)
        if m is None:
            c = text[i]
            what = "unterminated string literal" if c in "'\"" else f"character {c!r} that is not a TorchScript token"
            raise FormatError(f"{what} in TorchScript code", path=name, offset=i)
        kind = m.lastgroup
        j = m.end()
        if kind == "blank":
            i = j
            continue
        if kind == "str":
            raw = m.group(0)
            q = 3 if len(raw) >= 6 and raw[:3] in ('"""', "'''") else 1
            if not parts:
                spos = i
            parts.append(_decode(raw[q:-q]))
            i = j
            continue
        if parts:
            yield ("string", "".join(parts), spos)
            parts = []
        count += 1
        if count > max_tokens:
            raise LimitError("TorchScript code has too many tokens", path=name, expected=f"at most {max_tokens}")
        if kind == "nl":
            if depth == 0:
                yield ("newline", "\n", i)
        elif kind == "op":
            t = m.group(0)
            if t in _OPEN:
                depth += 1
            elif t in _CLOSE and depth:
                depth -= 1
            yield ("op", t, i)
        elif kind == "name":
            yield ("name", m.group(0), i)
        else:
            yield ("number", m.group(0), i)
        i = j
    if parts:
        yield ("string", "".join(parts), spos)


@dataclass(frozen=True)
class Reference:
    """A dotted name the code names (``chain``, as written) and what it resolves to."""

    chain: tuple[str, ...]
    resolved: tuple[str, ...]
    pos: int
    called: bool

    @property
    def dotted(self) -> str:
        return ".".join(self.resolved)


@dataclass
class CodeReport:
    """What one code file (or a whole archive's code) can reach."""

    setstate: list[int] = field(default_factory=list)  # offsets of ``def __setstate__``
    risky: list[tuple[Reference, str, str, str]] = field(default_factory=list)  # (ref, target, category, reason)
    references: int = 0
    tokens: int = 0


def _op_name(parts: tuple[str, ...]) -> str | None:
    """``ns::op`` for ``torch.ops.ns.op[.overload]`` / ``ops.ns.op`` / ``torch.op`` forms."""
    if len(parts) >= 4 and parts[0] == "torch" and parts[1] == "ops":
        return f"{parts[2]}::{parts[3]}"
    if len(parts) >= 3 and parts[0] == "ops":
        return f"{parts[1]}::{parts[2]}"
    if len(parts) == 2 and parts[0] == "torch":
        return f"aten::{parts[1]}"
    if len(parts) == 4 and parts[:3] == ("torch", "nn", "functional"):
        return f"aten::{parts[3]}"
    if len(parts) == 4 and parts[:2] == ("torch", "_C") and parts[2] in ("_nn", "_fft", "_linalg", "_special"):
        return f"aten::{parts[3]}"
    return None


#: the last names of risky targets: a reference ending in one of these is flagged even
#: when its root does not resolve to torch (a submodule or value of unknown type)
_DISTINCTIVE = {k.split("::", 1)[1] for k, (cat, _r) in RISKY_OPS.items() if cat in ("file", "python")} | {
    "load_library",
    "_load_for_mobile",
    "_load_for_lite_interpreter",
    "import_ir_module",
    "cpp_extension",
}


_MAX_PY_DEPTH = max(k.count(".") + 1 for k in RISKY_PYTHON)
_RISKY_PY_T = {tuple(k.split(".")): v for k, v in RISKY_PYTHON.items()}
_NETWORK_NS = frozenset({"c10d", "_c10d_functional", "_c10d_functional_autograd", "symm_mem"})


def risk_of(parts: tuple[str, ...]) -> tuple[str, str, str] | None:
    """(target, category, reason) when a resolved dotted name reaches files, processes,
    the network or native code; None otherwise."""
    if not parts:
        return None
    root = parts[0]
    if root not in ("torch", "ops", "__torch__"):
        if parts[-1] in _DISTINCTIVE and len(parts) > 1:  # a value whose type is not resolved
            return (
                ".".join(parts[-2:]),
                "file",
                f"names {parts[-1]!r}, an operator or function that reaches files "
                "or native code, on a value whose type is not resolved",
            )
        return None
    for i in range(min(len(parts), _MAX_PY_DEPTH), 0, -1):  # torch.jit.load, also torch.jit.load.x
        hit = _RISKY_PY_T.get(parts[:i])
        if hit is not None:
            return ".".join(parts[:i]), hit[0], hit[1]
    op = _op_name(parts)
    if op is not None:
        if op in RISKY_OPS:
            return op, *RISKY_OPS[op]
        if op.split("::", 1)[0] in _NETWORK_NS:
            return op, "network", "collective communication with other processes over the network"
    # torch.classes.ns.Cls / __torch__.torch.classes.ns.Cls
    rest = (
        parts[2:]
        if parts[:2] == ("torch", "classes")
        else (parts[3:] if parts[:3] == ("__torch__", "torch", "classes") else None)
    )
    if rest is not None:
        if len(rest) >= 2 and f"{rest[0]}.{rest[1]}" not in BUILTIN_CLASSES:
            return (
                f"torch.classes.{rest[0]}.{rest[1]}",
                "library",
                "a TorchBind class that torch does not register itself: native code from a library loaded into the process",
            )
        if rest[:1] == ("load_library",):
            return "torch.classes.load_library", "library", "dlopen()s a native library"
    if parts[-1] in _DISTINCTIVE and len(parts) > 1:
        return (
            ".".join(parts[-3:]),
            "file",
            f"names {parts[-1]!r}, an operator or function that reaches files "
            "or native code, on a value whose type is not resolved",
        )
    return None


def _statements(tokens: list[Token]) -> Iterator[tuple[int, int]]:
    """(start, end) token index ranges of logical lines."""
    s = 0
    for k, t in enumerate(tokens):
        if t[_KIND] == "newline":
            if k > s:
                yield s, k
            s = k + 1
    if s < len(tokens):
        yield s, len(tokens)


def _chain_at(tokens: list[Token], k: int, end: int) -> tuple[tuple[str, ...], int]:
    """The dotted chain starting at name token ``k`` and the index after it."""
    parts = [tokens[k][_TEXT]]
    j = k + 1
    while j + 1 < end and tokens[j][_KIND] == "op" and tokens[j][_TEXT] == "." and tokens[j + 1][_KIND] == "name":
        parts.append(tokens[j + 1][_TEXT])
        j += 2
    return tuple(parts), j


def analyse_code(text: str, *, name: str = "<code>", max_tokens: int = MAX_TOKENS) -> CodeReport:
    """Every ``__setstate__`` definition and every risky reference in one code file.

    Raises:
        FormatError: the text does not lex as TorchScript (see :func:`tokenize`).
        LimitError: the text or its tokens exceed the limits.
    """
    if len(text) > MAX_CODE_BYTES:
        raise LimitError(
            "TorchScript code file too large to analyse",
            path=name,
            expected=f"at most {MAX_CODE_BYTES} characters",
            found=len(text),
        )
    tokens = list(tokenize(text, name=name, max_tokens=max_tokens))
    rep = CodeReport(tokens=len(tokens))
    aliases: dict[str, tuple[str, ...]] = {}
    # pass 1: aliases (``x = a.b``, ``import a.b as c``, ``from a import b as c``)
    for s, e in _statements(tokens):
        t0 = tokens[s]
        if t0[_KIND] == "name" and t0[_TEXT] == "import":
            k = s + 1
            while k < e and tokens[k][_KIND] == "name":
                chain, k = _chain_at(tokens, k, e)
                if k + 1 < e and tokens[k][_KIND] == "name" and tokens[k][_TEXT] == "as" and tokens[k + 1][_KIND] == "name":
                    aliases[tokens[k + 1][_TEXT]] = chain
                    k += 2
                else:
                    aliases.setdefault(chain[0], (chain[0],))
                if k < e and tokens[k][_TEXT] == ",":
                    k += 1
                else:
                    break
        elif t0[_KIND] == "name" and t0[_TEXT] == "from" and s + 1 < e and tokens[s + 1][_KIND] == "name":
            mod, k = _chain_at(tokens, s + 1, e)
            if k < e and tokens[k][_TEXT] == "import":
                k += 1
                while k < e:
                    if tokens[k][_TEXT] in ("(", ")", ","):
                        k += 1
                        continue
                    if tokens[k][_KIND] != "name":
                        break
                    nm = tokens[k][_TEXT]
                    k += 1
                    if k + 1 < e and tokens[k][_TEXT] == "as" and tokens[k + 1][_KIND] == "name":
                        aliases[tokens[k + 1][_TEXT]] = mod + (nm,)
                        k += 2
                    else:
                        aliases[nm] = mod + (nm,)
        else:
            # NAME [: annotation] = CHAIN (end of statement)
            k = s
            if t0[_KIND] == "name" and k + 1 < e:
                eq = k + 1
                if tokens[eq][_TEXT] == ":":
                    while eq < e and tokens[eq][_TEXT] != "=":
                        eq += 1
                if eq + 1 < e and tokens[eq][_TEXT] == "=" and tokens[eq + 1][_KIND] == "name":
                    chain, after = _chain_at(tokens, eq + 1, e)
                    if after == e:
                        aliases[t0[_TEXT]] = chain

    # each alias name resolved once (memoized), following at most MAX_ALIAS_STEPS
    # aliases and stopping where a cycle closes: linear in the number of aliases
    final: dict[str, tuple[str, ...]] = {}

    def root_of(name: str) -> tuple[str, ...]:
        hit = final.get(name)
        if hit is not None:
            return hit
        seen: set[str] = set()
        cur: tuple[str, ...] = (name,)
        while cur[0] in aliases and cur[0] not in seen and len(seen) < MAX_ALIAS_STEPS:
            seen.add(cur[0])
            cur = aliases[cur[0]] + cur[1:]
        final[name] = cur
        return cur

    def resolve(chain: tuple[str, ...]) -> tuple[str, ...]:
        if chain[0] not in aliases:
            return chain
        return root_of(chain[0]) + chain[1:]

    # pass 2: every reference (see _references); def __setstate__ in any class
    for k in range(len(tokens) - 1):
        if (
            tokens[k][_KIND] == "name"
            and tokens[k][_TEXT] == "def"
            and tokens[k + 1][_KIND] == "name"
            and tokens[k + 1][_TEXT] == "__setstate__"
        ):
            rep.setstate.append(tokens[k + 1][_POS])
    for ref_chain, pos, called in _references(tokens):
        chain_t = tuple(ref_chain)
        resolved = resolve(chain_t) if chain_t[0] != "?" else chain_t
        rep.references += 1
        hit = risk_of(resolved)
        if hit is not None:
            rep.risky.append((Reference(chain_t, resolved, pos, called), *hit))
    return rep


#: names after which ``(`` opens a parenthesized expression, not a call
_KEYWORDS = frozenset(
    [
        "and",
        "or",
        "not",
        "in",
        "is",
        "if",
        "else",
        "elif",
        "while",
        "for",
        "return",
        "raise",
        "assert",
        "del",
        "pass",
        "lambda",
        "yield",
        "with",
        "as",
        "import",
        "from",
        "def",
        "class",
        "global",
        "nonlocal",
        "await",
    ]
)
_SHAPE_MAX = 6  # elements of a bracket's content kept to recognise (x) and getattr(x, "s")


def _references(tokens: list[Token]) -> Iterator[tuple[list[str], int, bool]]:
    """Every dotted value the code names: ``(chain, position, called)``.

    One left-to-right pass with a stack of open brackets (linear, no recursion): a name
    and its ``.attr`` run is a value; a parenthesized bracket whose content is exactly
    one value is that value (``(torch).save``), and ``getattr(value, "lit" "eral")`` is
    the value extended by the literal (``getattr(ops, "aten").from_file``); either can
    be followed by more ``.attr``s. An attribute of anything else (``x[0].from_file``)
    is judged by its name alone (chain ``("?", name)``).
    """
    n = len(tokens)
    stack: list[tuple[str, list[tuple[str, Any]], int]] = [("root", [], 0)]

    def push(item: tuple[str, Any]) -> None:
        shape = stack[-1][1]
        if len(shape) < _SHAPE_MAX:
            shape.append(item)

    def attrs(chain: list[str], j: int) -> int:
        while j + 1 < n and tokens[j][_KIND] == "op" and tokens[j][_TEXT] == "." and tokens[j + 1][_KIND] == "name":
            chain.append(tokens[j + 1][_TEXT])
            j += 2
        return j

    k = 0
    while k < n:
        kind, text, pos = tokens[k]
        prev = tokens[k - 1] if k else None
        after_dot = prev is not None and prev[_KIND] == "op" and prev[_TEXT] == "."
        if kind == "name" and after_dot:
            yield ["?", text], pos, k + 1 < n and tokens[k + 1][_TEXT] == "("
            push(("x", None))
            k += 1
        elif kind == "name" and text == "getattr" and k + 1 < n and tokens[k + 1][_TEXT] == "(":
            stack.append(("getattr", [], pos))
            k += 2
        elif kind == "name" and text not in _KEYWORDS:
            chain = [text]
            j = attrs(chain, k + 1)
            yield chain, pos, j < n and tokens[j][_TEXT] == "("
            push(("val", chain))
            k = j
        elif kind == "op" and text in "([{":
            is_call = (
                text == "("
                and prev is not None
                and (
                    (prev[_KIND] in ("name", "string", "number") and prev[_TEXT] not in _KEYWORDS)
                    or prev[_TEXT] in (")", "]", "}")
                )
            )
            stack.append(("call" if is_call else ("paren" if text == "(" else "other"), [], pos))
            k += 1
        elif kind == "op" and text in ")]}":
            if len(stack) == 1:
                k += 1
                continue
            fkind, shape, spos = stack.pop()
            value: list[str] | None = None
            if text == ")" and fkind == "paren" and len(shape) == 1 and shape[0][0] == "val":
                value = list(shape[0][1])
            elif (
                text == ")"
                and fkind == "getattr"
                and len(shape) >= 3
                and shape[0][0] == "val"
                and shape[1][0] == ","
                and shape[2][0] == "str"
                and (len(shape) == 3 or shape[3][0] == ",")
            ):
                value = list(shape[0][1]) + shape[2][1].split(".")
            j = k + 1
            if value is not None:
                j = attrs(value, j)
                yield value, spos, j < n and tokens[j][_TEXT] == "("
                push(("val", value))
            else:
                push(("x", None))
            k = j
        elif kind == "op" and text == ",":
            push((",", None))
            k += 1
        elif kind == "string":
            push(("str", text))
            k += 1
        else:
            push(("x", None))
            k += 1


def _walk(value: Any, budget: list[int]) -> Iterator[Any]:
    """Every str and tuple/list in a (symbolic) pickle value, iteratively, within budget."""
    stack = [value]
    seen: set[int] = set()
    while stack:
        v = stack.pop()
        budget[0] -= 1
        if budget[0] < 0:
            raise LimitError("bytecode.pkl value too large to walk", expected=f"at most {MAX_BYTECODE_NODES} values")
        if isinstance(v, (tuple, list)):
            if id(v) in seen:
                continue
            seen.add(id(v))
            yield v
            stack.extend(reversed(v))
        elif isinstance(v, dict):
            if id(v) in seen:
                continue
            seen.add(id(v))
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, str):
            yield v
        else:
            for attr in ("args", "state", "items"):  # symbolic values (analysis.Sym)
                sub = getattr(v, attr, None) if type(v).__name__ == "Sym" else None
                if sub:
                    stack.append(sub)


_OP_NAME = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)::([A-Za-z_][A-Za-z0-9_]*)(?:\.[A-Za-z0-9_]*)?$")


@dataclass
class BytecodeReport:
    """Operators and methods found in ``bytecode.pkl``."""

    operators: set[str] = field(default_factory=set)
    methods: list[str] = field(default_factory=list)
    setstate: list[str] = field(default_factory=list)
    risky: list[tuple[str, str, str]] = field(default_factory=list)  # (op, category, reason)


def analyse_bytecode(value: Any) -> BytecodeReport:
    """Every operator name and method of a ``bytecode.pkl`` value (any nesting: the walk
    does not trust the layout, so an operator table hidden elsewhere is found too).

    Raises:
        LimitError: the value is larger than :data:`MAX_BYTECODE_NODES`.
    """
    rep = BytecodeReport()
    budget = [MAX_BYTECODE_NODES]
    for v in _walk(value, budget):
        if isinstance(v, str):
            m = _OP_NAME.match(v)
            if m:
                rep.operators.add(f"{m.group(1)}::{m.group(2)}")
        elif (
            len(v) >= 2
            and isinstance(v[0], str)
            and isinstance(v[1], (tuple, list))
            and v[0].startswith("__torch__.")
            and "." in v[0]
        ):
            rep.methods.append(v[0])
            if v[0].rsplit(".", 1)[-1] == "__setstate__":
                rep.setstate.append(v[0])
    for op in sorted(rep.operators):
        ns = op.split("::", 1)[0]
        if op in RISKY_OPS:
            rep.risky.append((op, *RISKY_OPS[op]))
        elif ns in ("c10d", "_c10d_functional", "_c10d_functional_autograd", "symm_mem"):
            rep.risky.append((op, "network", "collective communication with other processes over the network"))
    return rep


# -- findings ------------------------------------------------------------------------

_JIT = "torch.jit.load"
_LITE = "torch.jit._load_for_lite_interpreter"


def report_archive(
    scanner: Any,
    code: list[tuple[str, str]],
    bytecode: list[tuple[str, bytes]],
    parsed: list[tuple[str, BytecodeReport]] | None = None,
) -> None:
    """Add ``torchscript-code`` findings for one archive's code files and bytecode tables.

    Args:
        scanner: the :class:`~torchless.scan.carriers.base.ScanEngine` collecting findings.
        code: ``(location, text)`` of every ``code/*.py`` member.
        bytecode: ``(location, bytes)`` of ``bytecode.pkl`` / ``constants.pkl`` members
            (their pickles are analysed for globals elsewhere; here only their values).
        parsed: operator tables already read (flatbuffer modules).

    A reference to a risky target is ``critical`` (``high`` for network collectives): it
    runs at load time when the archive defines ``__setstate__`` and otherwise when the
    module is called. ``__setstate__`` alone is ``info`` (all code was analysed and
    reaches nothing risky). Code that does not lex, or a value too large to walk, is
    ``unanalysable``.
    """
    from .analysis import analyse

    def budget(n: int, loc: str, doing: str, loader: str) -> bool:
        spend = getattr(scanner, "spend", None)  # the scan's work budget (bytes analysed)
        return spend is None or spend("pickle", n, loc, doing, loader=loader)

    reports: list[tuple[str, CodeReport]] = []
    for loc, text in code:
        if not budget(len(text), loc, "lexing TorchScript code", _JIT):
            break
        try:
            reports.append((loc, analyse_code(text, name=loc)))
            if hasattr(scanner, "covered"):
                scanner.covered("source", loc, text)
        except (FormatError, LimitError) as e:
            scanner.add(
                "unanalysable",
                "high",
                "TorchScript code not analysed: "
                f"{e.message}{' (offset ' + str(e.offset) + ')' if e.offset is not None else ''}; torch.jit.load "
                "compiles this file",
                loc,
                e.offset,
                loader=_JIT,
            )
    bc_reports: list[tuple[str, BytecodeReport]] = list(parsed or [])
    for loc, data in bytecode:
        if not budget(len(data), loc, "reading operator tables", _LITE):
            break
        try:
            bc_reports.append((loc, analyse_bytecode(analyse(data, torchscript=True).value)))
        except LimitError as e:
            scanner.add("unanalysable", "high", f"operator table not analysed: {e.message}", loc, loader=_LITE)
    setstate_code = [(loc, off) for loc, r in reports for off in r.setstate]
    setstate_bc = [(loc, m) for loc, r in bc_reports for m in r.setstate]
    at_load = bool(setstate_code or setstate_bc)
    when = (
        "in an archive whose __setstate__ runs at load (torch.jit.load / the lite interpreter)"
        if at_load
        else "when the module runs"
    )
    for loc, r in reports:
        if len(r.risky) > MAX_REPORTED:
            scanner.add(
                "torchscript-code",
                "critical",
                f"{len(r.risky)} references to file, process, network or native operators; the first {MAX_REPORTED} are listed",
                loc,
                loader=_JIT,
            )
        for ref, target, cat, reason in r.risky[:MAX_REPORTED]:
            how = "calls" if ref.called else "names"
            alias = "" if ref.chain == ref.resolved else f" (written {'.'.join(ref.chain)!r})"
            sev = "high" if cat == "network" else "critical"
            scanner.add(
                "torchscript-code",
                sev,
                f"TorchScript code {how} {ref.dotted!r}{alias} -> {target}: {reason}; {when}",
                loc,
                ref.pos,
                loader=_JIT,
            )
    for loc, br in bc_reports:
        for op, cat, reason in br.risky:
            sev = "high" if cat == "network" else "critical"
            scanner.add("torchscript-code", sev, f"bytecode operator table calls {op}: {reason}; {when}", loc, loader=_LITE)
    any_risky = any(r.risky for _l, r in reports) or any(r.risky for _l, r in bc_reports)
    for loc, off in setstate_code if not any_risky else []:
        scanner.add(
            "torchscript-code",
            "info",
            "TorchScript __setstate__: archive code runs at torch.jit.load (it "
            "reaches no listed file, process, network or native operator)",
            loc,
            off,
            loader=_JIT,
        )
    for loc, m in setstate_bc if not any_risky else []:
        scanner.add(
            "torchscript-code",
            "info",
            f"bytecode method {m}: runs at lite-interpreter load (its operator table "
            "reaches no listed file, process, network or native operator)",
            loc,
            loader=_LITE,
        )


# -- flatbuffer modules (``save_jit_module_to_flatbuffer``; ``PTMF`` at byte 4) -----------

FLATBUFFER_ID = ts_spec.FLATBUFFER_ID
MAX_FB_ITEMS = 4_000_000  # tables visited in one flatbuffer module
_FB = ts_spec.FB
_FB_FUNCTION = ts_spec.FB_IVALUE["Function"]
_FB_CUSTOM_CLASS = ts_spec.FB_TYPE_KINDS.index("CUSTOM_CLASS")
_FB_CLASS_WITH_SETSTATE = ts_spec.FB_TYPE_KINDS.index("CLASS_WITH_SETSTATE")


def analyse_flatbuffer(data: bytes, *, name: str = "<flatbuffer>") -> tuple[list[tuple[str, str]], BytecodeReport]:
    """The TorchScript sources (``jit_sources``, compiled by ``torch.jit.load``) and the
    operator tables, methods and class types of a flatbuffer mobile module
    (``mobile_bytecode.fbs``). Risky operator names found anywhere in the buffer but in no
    table are reported too: the parse and the loader cannot disagree unseen.

    Raises:
        FormatError: offsets outside the buffer.
        LimitError: more than :data:`MAX_FB_ITEMS` tables.
    """
    from ..container.flatbuffer import FlatBuffer

    fb = FlatBuffer(data, name, what="flatbuffer module")
    root = fb.root()
    budget = MAX_FB_ITEMS
    sources: list[tuple[str, str]] = []
    for ef in root.tables(_FB.MODULE_JIT_SOURCES):
        sources.append((ef.string(_FB.EXTRA_NAME) or "?", ef.string(_FB.EXTRA_CONTENT) or ""))
    functions: list[tuple[str, tuple[Any, ...], None]] = []
    vec = root.vector_pos(_FB.MODULE_IVALUES, 4)
    if vec is not None and vec[1] > budget:
        raise LimitError("flatbuffer module has too many values", path=name, expected=f"at most {budget}", found=vec[1])
    for iv in root.tables(_FB.MODULE_IVALUES):
        kind, pos = iv.union(_FB.IVALUE_TYPE)
        if kind != _FB_FUNCTION or pos is None:
            continue
        fn = fb.table_at(pos, "Function")
        ops = tuple(
            (op.string(_FB.OPERATOR_NAME) or "", op.string(_FB.OPERATOR_OVERLOAD) or "", 0)
            for op in fn.tables(_FB.FUNCTION_OPERATORS)
        )
        budget -= len(ops) + 1
        if budget < 0:
            raise LimitError("flatbuffer module has too many operators", path=name, expected=f"at most {MAX_FB_ITEMS}")
        functions.append((fn.string(_FB.FUNCTION_QN) or "", (("operators", ops),), None))
    classes: list[tuple[str, int]] = [
        (ot.string(_FB.OBJTYPE_NAME) or "", ot.scalar(_FB.OBJTYPE_KIND, "B", 0)) for ot in root.tables(_FB.MODULE_OBJECT_TYPES)
    ]
    rep = analyse_bytecode(tuple(functions))
    for tname, kind in classes:
        if kind == _FB_CLASS_WITH_SETSTATE:
            rep.setstate.append(f"{tname}.__setstate__")
        elif kind == _FB_CUSTOM_CLASS:
            hit = risk_of(tuple(tname.split(".")))
            if hit is not None:
                rep.risky.append((hit[0], hit[1], hit[2]))
    found = {r[0] for r in rep.risky}
    for op, (cat, reason) in RISKY_OPS.items():
        if op not in found and op.encode() in data:
            rep.risky.append((op, cat, reason + " (its name is in the buffer, outside the operator tables read)"))
    if not rep.setstate and b"__setstate__" in data and not any(k == _FB_CLASS_WITH_SETSTATE for _n, k in classes):
        rep.setstate.append("(a __setstate__ name in the buffer)")
    return sources, rep


def report_flatbuffer(scanner: Any, data: bytes, member: str | None) -> None:
    """The :class:`~torchless.scan.carriers.base.ScanEngine` hook for ``PTMF`` buffers."""
    loc = member or os.path.basename(scanner.path)
    try:
        sources, rep = analyse_flatbuffer(data, name=loc)
    except (FormatError, LimitError) as e:
        scanner.add(
            "unanalysable",
            "high",
            f"flatbuffer TorchScript module not analysed: {e.message}; torch.jit.load and the lite interpreter read this format",
            member,
            e.offset,
            loader=_JIT,
        )
        return
    report_archive(scanner, [(f"{loc} > jit_sources/{n}", t) for n, t in sources], [], [(f"{loc} > operator tables", rep)])
