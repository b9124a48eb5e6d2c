"""Lite-interpreter bytecode (``bytecode.pkl`` in ``.ptl`` files), as data.

Spec: ``torchscript.md`` §5. ``bytecode.pkl`` is a tuple: the bytecode version, then one
``(qualified name, code, schema)`` entry per method, where ``code`` is a tuple of
``(key, value)`` pairs: ``instructions`` (``(opcode, X, N)``), ``operators``
(``(name, overload[, num_specified_args])``, the third field since v6), ``constants``
(values; tensors are storages in ``constants/`` since v5, in ``bytecode/`` before),
``types`` (TorchScript type strings) and ``register_size``; ``schema`` (since v4) is
``(('arguments', …), ('returns', …))`` with ``(('name', …), ('type', …),
('default_value', …))`` per argument. Nothing here is executed; the archive reader
(:meth:`~torchless.formats.torchscript.read.TorchScriptArchive.bytecode`) unpickles the
record and hands the value to :func:`parse_bytecode`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...core.errors import FormatError, UnsupportedError, short_repr
from . import spec

__all__ = ["Argument", "Bytecode", "Instruction", "MobileMethod", "Operator", "parse_bytecode"]


@dataclass(frozen=True)
class Instruction:
    """One instruction: opcode name (``OP``, ``LOADC``, ``RET`` …) and its two operands."""

    op: str
    x: int
    n: int


@dataclass(frozen=True)
class Operator:
    """An operator a method calls: ``aten::add`` overload ``Tensor``; ``num_args`` (v6+)."""

    name: str
    overload: str
    num_args: int | None = None

    @property
    def full_name(self) -> str:
        return f"{self.name}.{self.overload}" if self.overload else self.name


@dataclass(frozen=True)
class Argument:
    name: str
    type: str
    default: Any = None


@dataclass
class MobileMethod:
    """One method's bytecode.

    Attributes:
        qualified_name: ``__torch__.M.forward``.
        instructions, operators, constants, types, register_size: the code table.
        arguments, returns: the schema (None for archives without one).
    """

    qualified_name: str
    instructions: list[Instruction] = field(default_factory=list)
    operators: list[Operator] = field(default_factory=list)
    constants: list[Any] = field(default_factory=list)
    types: list[str] = field(default_factory=list)
    register_size: int = 0
    arguments: list[Argument] | None = None
    returns: list[Argument] | None = None

    def to_dict(self) -> dict[str, Any]:
        from ...core.tree import describe

        return {
            "qualified_name": self.qualified_name,
            "instructions": [[i.op, i.x, i.n] for i in self.instructions],
            "operators": [[o.name, o.overload] + ([o.num_args] if o.num_args is not None else []) for o in self.operators],
            "constants": describe(list(self.constants)),
            "types": list(self.types),
            "register_size": self.register_size,
            "arguments": None if self.arguments is None else [[a.name, a.type] for a in self.arguments],
            "returns": None if self.returns is None else [[a.name, a.type] for a in self.returns],
        }


@dataclass
class Bytecode:
    """A parsed ``bytecode.pkl``: its version and methods in file order."""

    version: int
    methods: list[MobileMethod]

    @property
    def supported_by_torch(self) -> bool:
        return spec.MIN_BYTECODE_VERSION <= self.version <= spec.MAX_BYTECODE_VERSION

    def method(self, qualified_name: str) -> MobileMethod:
        for m in self.methods:
            if m.qualified_name == qualified_name or m.qualified_name.endswith("." + qualified_name):
                return m
        from ...core.errors import NotFoundError

        raise NotFoundError(f"no bytecode method {qualified_name!r}", expected=", ".join(m.qualified_name for m in self.methods))


def _pairs(x: Any, what: str) -> dict[str, Any]:
    if not isinstance(x, tuple):
        raise FormatError(f"bytecode {what} must be a tuple of (key, value) pairs", found=type(x).__name__)
    out: dict[str, Any] = {}
    for p in x:
        if not (isinstance(p, tuple) and len(p) == 2 and isinstance(p[0], str)):
            raise FormatError(f"bytecode {what} entry is not a (key, value) pair", found=short_repr(p, 60))
        out[p[0]] = p[1]
    return out


def _int(x: Any, what: str) -> int:
    if type(x) is not int:
        raise FormatError(f"bytecode {what} must be an int", found=short_repr(x, 40))
    return x


def _args(x: Any, what: str) -> list[Argument]:
    if not isinstance(x, tuple):
        raise FormatError(f"bytecode schema {what} must be a tuple", found=type(x).__name__)
    out = []
    for a in x:
        d = _pairs(a, f"schema {what}")
        out.append(Argument(str(d.get("name", "")), str(d.get("type", "")), d.get("default_value")))
    return out


def parse_bytecode(value: Any) -> Bytecode:
    """Interpret the unpickled ``bytecode.pkl`` tuple.

    Raises:
        FormatError: the structure is not that of any bytecode version.
        UnsupportedError: versions before 3 (a different layout).
    """
    if not isinstance(value, tuple) or not value:
        raise FormatError("bytecode.pkl must be a non-empty tuple", found=type(value).__name__)
    version = _int(value[0], "version")
    if version < 3:
        raise UnsupportedError(
            "bytecode version before 3", expected=f"{spec.MIN_BYTECODE_VERSION}..{spec.MAX_BYTECODE_VERSION}", found=version
        )
    methods = []
    for entry in value[1:]:
        if not isinstance(entry, tuple) or len(entry) not in (2, 3) or not isinstance(entry[0], str):
            raise FormatError("bytecode method entry must be (name, code[, schema])", found=short_repr(entry, 80))
        name = entry[0]
        code = _pairs(entry[1], f"code of {name}")
        m = MobileMethod(name)
        for ins in code.get("instructions", ()):
            if not (isinstance(ins, tuple) and len(ins) == 3 and isinstance(ins[0], str)):
                raise FormatError(f"bad instruction in {name}", found=short_repr(ins, 60))
            m.instructions.append(Instruction(ins[0], _int(ins[1], "operand"), _int(ins[2], "operand")))
        for op in code.get("operators", ()):
            if not (isinstance(op, tuple) and len(op) in (2, 3) and isinstance(op[0], str) and isinstance(op[1], str)):
                raise FormatError(f"bad operator in {name}", found=short_repr(op, 60))
            m.operators.append(Operator(op[0], op[1], _int(op[2], "num_args") if len(op) == 3 else None))
        consts = code.get("constants", ())
        m.constants = list(consts) if isinstance(consts, (tuple, list)) else [consts]
        m.types = [str(t) for t in code.get("types", ())]
        m.register_size = _int(code.get("register_size", 0), "register_size")
        if len(entry) == 3:
            schema = _pairs(entry[2], f"schema of {name}")
            m.arguments = _args(schema.get("arguments", ()), "arguments")
            m.returns = _args(schema.get("returns", ()), "returns")
        methods.append(m)
    return Bytecode(version, methods)
