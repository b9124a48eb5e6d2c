"""ATen operator schemas: a parser for torch's schema strings and a typed registry.

A schema string is what ``str(torch.ops.aten.add.Tensor._schema)`` prints::

    aten::add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor

:func:`parse_schema` turns it into an :class:`OpSchema` (name, overload, typed
:class:`Arg` list with defaults and keyword-only markers, returns with alias
annotations); ``str(schema)`` prints it back exactly. :data:`REGISTRY` holds every core
ATen overload (``data/core_aten_ops.txt``, the ``Tag.core`` set of torch 2.13) and the
non-core ``aten::`` schemas exported graphs use (``data/aten_ops.txt``), keyed by the
overload name ``aten.add.Tensor``; it is loaded on first use.

Example:
    >>> s = parse_schema("aten::relu(Tensor self) -> Tensor")
    >>> s.key, [a.name for a in s.arguments]
    ('aten.relu.default', ['self'])
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

from ..core.errors import FormatError, NotFoundError

__all__ = [
    "BaseType",
    "ListType",
    "OptionalType",
    "SchemaType",
    "Arg",
    "Return",
    "OpSchema",
    "SchemaRegistry",
    "parse_schema",
    "parse_type",
    "registry",
]


@dataclass(frozen=True, slots=True)
class BaseType:
    """A named type (``Tensor``, ``int``, ``SymInt``, ``ScalarType``...) with its alias
    annotation as written (``a!``, ``a``, ``a -> *``) or None."""

    name: str
    alias: str | None = None

    def __str__(self) -> str:
        return self.name if self.alias is None else f"{self.name}({self.alias})"

    @property
    def is_write(self) -> bool:
        return self.alias is not None and "!" in self.alias


@dataclass(frozen=True, slots=True)
class ListType:
    """``T[]`` or ``T[N]`` (``size`` None when unsized)."""

    elem: SchemaType
    size: int | None = None

    def __str__(self) -> str:
        return f"{self.elem}[{'' if self.size is None else self.size}]"

    @property
    def is_write(self) -> bool:
        return self.elem.is_write


@dataclass(frozen=True, slots=True)
class OptionalType:
    """``T?``."""

    elem: SchemaType

    def __str__(self) -> str:
        return f"{self.elem}?"

    @property
    def is_write(self) -> bool:
        return self.elem.is_write


SchemaType = BaseType | ListType | OptionalType


def base_of(t: SchemaType) -> BaseType:
    """The innermost named type (``Tensor`` for ``Tensor?[]``)."""
    while not isinstance(t, BaseType):
        t = t.elem
    return t


@dataclass(frozen=True, slots=True)
class Arg:
    """One argument: type, name, default (as written, e.g. ``"1"``, ``"None"``, ``"[]"``),
    and whether it comes after ``*`` (keyword-only)."""

    name: str
    type: SchemaType
    default: str | None = None
    kwarg_only: bool = False

    def __str__(self) -> str:
        s = f"{self.type} {self.name}"
        return s if self.default is None else f"{s}={self.default}"

    @property
    def is_tensor(self) -> bool:
        return base_of(self.type).name == "Tensor"

    @property
    def is_write(self) -> bool:
        return self.type.is_write


@dataclass(frozen=True, slots=True)
class Return:
    type: SchemaType
    name: str | None = None

    def __str__(self) -> str:
        return str(self.type) if self.name is None else f"{self.type} {self.name}"


@dataclass(frozen=True, slots=True)
class OpSchema:
    """A parsed operator schema.

    Attributes:
        namespace: ``aten``.
        name: operator name (``add``).
        overload: overload name, ``""`` for the default overload.
        arguments: the arguments in order.
        returns: the returns; ``returns_tuple`` tells whether they were parenthesized.
    """

    namespace: str
    name: str
    overload: str
    arguments: tuple[Arg, ...]
    returns: tuple[Return, ...]
    returns_tuple: bool = False

    @property
    def key(self) -> str:
        """``aten.add.Tensor`` / ``aten.relu.default``: how FX names the OpOverload."""
        return f"{self.namespace}.{self.name}.{self.overload or 'default'}"

    @property
    def qualified_name(self) -> str:
        return f"{self.namespace}::{self.name}" + (f".{self.overload}" if self.overload else "")

    @property
    def is_inplace(self) -> bool:
        """Mutates ``self`` in place (``add_``): trailing underscore and a written alias."""
        return self.name.endswith("_") and not self.name.endswith("__") and any(a.is_write for a in self.arguments)

    @property
    def is_out(self) -> bool:
        """An ``out=`` variant: keyword-only written tensor arguments."""
        return any(a.kwarg_only and a.is_write and a.is_tensor for a in self.arguments)

    @property
    def is_mutating(self) -> bool:
        return any(a.is_write for a in self.arguments)

    def argument(self, name: str) -> Arg | None:
        for a in self.arguments:
            if a.name == name:
                return a
        return None

    @property
    def positional(self) -> tuple[Arg, ...]:
        return tuple(a for a in self.arguments if not a.kwarg_only)

    def __str__(self) -> str:
        parts: list[str] = []
        star = False
        for a in self.arguments:
            if a.kwarg_only and not star:
                parts.append("*")
                star = True
            parts.append(str(a))
        rets = ", ".join(str(r) for r in self.returns)
        if self.returns_tuple or len(self.returns) != 1:
            rets = f"({rets})"
        return f"{self.qualified_name}({', '.join(parts)}) -> {rets}"

    def bind(self, args: Sequence[Any], kwargs: dict[str, Any]) -> dict[str, Any]:
        """Map call arguments to argument names (no defaults filled in).

        Raises:
            FormatError: too many positional arguments, unknown or duplicate keywords, or a
                required argument missing.
        """
        out: dict[str, Any] = {}
        pos = self.positional
        if len(args) > len(pos):
            raise FormatError(f"{self.key} takes {len(pos)} positional arguments", found=f"{len(args)}")
        for a, v in zip(pos, args, strict=False):
            out[a.name] = v
        for k, v in kwargs.items():
            if self.argument(k) is None:
                raise FormatError(f"{self.key} has no argument {k!r}", expected=", ".join(a.name for a in self.arguments))
            if k in out:
                raise FormatError(f"{self.key} got argument {k!r} twice")
            out[k] = v
        for a in self.arguments:
            if a.name not in out and a.default is None:
                raise FormatError(f"{self.key} is missing required argument {a.name!r}")
        return out


# -- parser ----------------------------------------------------------------------------

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class _Parser:
    def __init__(self, text: str) -> None:
        self.s = text
        self.i = 0

    def error(self, expected: str) -> FormatError:
        found = self.s[self.i : self.i + 20] or "end of string"
        return FormatError(
            "cannot parse operator schema",
            offset=self.i,
            expected=expected,
            found=repr(found),
            hint=f"in {self.s!r}",
        )

    def ws(self) -> None:
        while self.i < len(self.s) and self.s[self.i] == " ":
            self.i += 1

    def peek(self, tok: str) -> bool:
        self.ws()
        return self.s.startswith(tok, self.i)

    def take(self, tok: str) -> bool:
        if self.peek(tok):
            self.i += len(tok)
            return True
        return False

    def expect(self, tok: str) -> None:
        if not self.take(tok):
            raise self.error(repr(tok))

    def name(self) -> str:
        self.ws()
        m = _NAME.match(self.s, self.i)
        if not m:
            raise self.error("a name")
        self.i = m.end()
        return m.group()

    def type(self) -> SchemaType:
        base = self.name()
        alias = None
        if self.peek("("):
            self.i += 1
            j = self.s.find(")", self.i)
            if j < 0:
                raise self.error("')' closing the alias annotation")
            alias = self.s[self.i : j]
            if not alias or "(" in alias:
                raise self.error("an alias annotation")
            self.i = j + 1
        t: SchemaType = BaseType(base, alias)
        while True:
            if self.s.startswith("[", self.i):
                self.i += 1
                m = re.compile(r"\d*").match(self.s, self.i)
                assert m is not None
                size = int(m.group()) if m.group() else None
                self.i = m.end()
                if not self.s.startswith("]", self.i):
                    raise self.error("']'")
                self.i += 1
                t = ListType(t, size)
            elif self.s.startswith("?", self.i):
                self.i += 1
                t = OptionalType(t)
            else:
                return t

    def default(self) -> str:
        # a default runs to the next top-level ',' or ')'; quotes and brackets nest
        self.ws()
        start = self.i
        depth = 0
        quote = None
        while self.i < len(self.s):
            c = self.s[self.i]
            if quote:
                if c == "\\":
                    self.i += 1
                elif c == quote:
                    quote = None
            elif c in "\"'":
                quote = c
            elif c in "[(":
                depth += 1
            elif c in "])":
                if depth == 0:
                    break
                depth -= 1
            elif c == "," and depth == 0:
                break
            self.i += 1
        text = self.s[start : self.i].rstrip()
        if not text or quote:
            raise self.error("a default value")
        return text

    def schema(self) -> OpSchema:
        ns = self.name()
        self.expect("::")
        name = self.name()
        overload = ""
        if self.s.startswith(".", self.i):
            self.i += 1
            overload = self.name()
        self.expect("(")
        args: list[Arg] = []
        kwonly = False
        if not self.take(")"):
            while True:
                if self.take("*"):
                    if kwonly:
                        raise self.error("one '*'")
                    kwonly = True
                else:
                    t = self.type()
                    n = self.name()
                    d = self.default() if self.take("=") else None
                    args.append(Arg(n, t, d, kwonly))
                if self.take(")"):
                    break
                self.expect(",")
        self.expect("->")
        rets: list[Return] = []
        tup = False
        if self.take("("):
            tup = True
            if not self.take(")"):
                while True:
                    rets.append(self._return())
                    if self.take(")"):
                        break
                    self.expect(",")
        else:
            rets.append(self._return())
        self.ws()
        if self.i != len(self.s):
            raise self.error("end of schema")
        names = [a.name for a in args]
        if len(set(names)) != len(names):
            raise FormatError("duplicate argument name in schema", hint=f"in {self.s!r}")
        return OpSchema(ns, name, overload, tuple(args), tuple(rets), tup)

    def _return(self) -> Return:
        t = self.type()
        self.ws()
        m = _NAME.match(self.s, self.i)
        if m:
            self.i = m.end()
            return Return(t, m.group())
        return Return(t)


def parse_schema(text: str) -> OpSchema:
    """Parse one schema string (``ns::name[.overload](args) -> returns``).

    Raises:
        FormatError: the string is not a schema (offset and expected token given).
    """
    if not isinstance(text, str) or len(text) > 100_000:
        raise FormatError("operator schema must be a string under 100000 characters")
    return _Parser(text).schema()


def parse_type(text: str) -> SchemaType:
    """Parse a schema type such as ``Tensor(a!)[]`` or ``int[1]?``."""
    p = _Parser(text)
    t = p.type()
    p.ws()
    if p.i != len(text):
        raise p.error("end of type")
    return t


# -- registry --------------------------------------------------------------------------


class SchemaRegistry:
    """Schemas by overload key (``aten.add.Tensor``), each marked core or not."""

    def __init__(self) -> None:
        self._schemas: dict[str, OpSchema] = {}
        self._core: set[str] = set()

    def add(self, schema: OpSchema, *, core: bool = False) -> None:
        if schema.key in self._schemas:
            raise ValueError(f"schema {schema.key!r} is already registered")
        self._schemas[schema.key] = schema
        if core:
            self._core.add(schema.key)

    def load_lines(self, text: str, *, core: bool, origin: str) -> int:
        n = 0
        for lineno, line in enumerate(text.splitlines(), 1):
            if not line.strip() or line.startswith("#"):
                continue
            _key, _, sch = line.partition("\t")
            try:
                self.add(parse_schema(sch), core=core)
            except FormatError as e:
                raise FormatError(f"{origin} line {lineno}: {e}") from None
            n += 1
        return n

    def get(self, key: str) -> OpSchema:
        """The schema of ``key`` (``aten.add.Tensor``; ``torch.ops.`` prefix accepted).

        Raises:
            NotFoundError: unknown overload.
        """
        s = self.find(key)
        if s is None:
            raise NotFoundError(f"no schema for operator {key!r}")
        return s

    def find(self, key: str) -> OpSchema | None:
        if key.startswith("torch.ops."):
            key = key[10:]
        return self._schemas.get(key)

    def is_core(self, key: str) -> bool:
        if key.startswith("torch.ops."):
            key = key[10:]
        return key in self._core

    @property
    def core_keys(self) -> frozenset[str]:
        return frozenset(self._core)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self.find(key) is not None

    def __iter__(self) -> Iterator[str]:
        return iter(self._schemas)

    def __len__(self) -> int:
        return len(self._schemas)


_REGISTRY: SchemaRegistry | None = None


def _data(name: str) -> str:
    return resources.files(__package__).joinpath("data").joinpath(name).read_text(encoding="utf-8")


def registry() -> SchemaRegistry:
    """The shared registry: core ATen (193 overloads) plus non-core ``aten::`` schemas."""
    global _REGISTRY
    if _REGISTRY is None:
        reg = SchemaRegistry()
        reg.load_lines(_data("core_aten_ops.txt"), core=True, origin="core_aten_ops.txt")
        reg.load_lines(_data("aten_ops.txt"), core=False, origin="aten_ops.txt")
        _REGISTRY = reg
    return _REGISTRY
