"""The ExportedProgram JSON schema (``models/<name>.json``), schema version 8.20.

Frozen, slotted dataclasses mirror ``torch/_export/serde/schema.py`` field by field and in
declaration order, so :func:`to_json` re-emits exactly the bytes torch wrote
(``pt2.md`` §3: every field present, unions as single-key objects, enums as ints,
``inf``/``nan`` as ``"Infinity"``/``"NaN"``). Unions are :class:`Union` subclasses holding
one ``(kind, value)`` pair. Unknown keys are ignored and missing keys take their defaults,
as torch's decoder does.

Example:
    >>> ep = loads_program(text)            # ExportedProgram
    >>> ep.graph_module.graph.nodes[0].target
    'torch.ops.aten.linear.default'
    >>> dumps(ep) == text
    True
"""

from __future__ import annotations

import base64
import dataclasses
import enum
import json
import math
import sys
import types
import typing
from dataclasses import dataclass, field
from typing import Any

from ...core import jsonsafe
from ...core.errors import FormatError, UnsupportedError

__all__ = [
    "SCHEMA_VERSION",
    "TREESPEC_VERSION",
    "ScalarType",
    "Layout",
    "MemoryFormat",
    "ArgumentKind",
    "Union",
    "SchemaVersion",
    "ExportedProgram",
    "GraphModule",
    "Graph",
    "Node",
    "NamedArgument",
    "Argument",
    "TensorMeta",
    "TensorArgument",
    "SymInt",
    "SymBool",
    "SymFloat",
    "SymExpr",
    "GraphSignature",
    "InputSpec",
    "OutputSpec",
    "PayloadConfig",
    "PayloadMeta",
    "from_json",
    "to_json",
    "loads_program",
    "dumps",
    "check_version",
]

#: the schema torch 2.13 writes and reads (major must match on load).
SCHEMA_VERSION = (8, 20)
TREESPEC_VERSION = 1


class ScalarType(enum.IntEnum):
    UNKNOWN = 0
    BYTE = 1
    CHAR = 2
    SHORT = 3
    INT = 4
    LONG = 5
    HALF = 6
    FLOAT = 7
    DOUBLE = 8
    COMPLEXHALF = 9
    COMPLEXFLOAT = 10
    COMPLEXDOUBLE = 11
    BOOL = 12
    BFLOAT16 = 13
    UINT16 = 28
    FLOAT8E4M3FN = 29
    FLOAT8E5M2 = 30
    FLOAT8E4M3FNUZ = 31
    FLOAT8E5M2FNUZ = 32
    FLOAT8E8M0FNU = 33
    UINT32 = 34
    UINT64 = 35


#: ScalarType -> torchless dtype name
SCALAR_TYPE_DTYPE = {
    ScalarType.BYTE: "uint8",
    ScalarType.CHAR: "int8",
    ScalarType.SHORT: "int16",
    ScalarType.INT: "int32",
    ScalarType.LONG: "int64",
    ScalarType.HALF: "float16",
    ScalarType.FLOAT: "float32",
    ScalarType.DOUBLE: "float64",
    ScalarType.COMPLEXHALF: "complex32",
    ScalarType.COMPLEXFLOAT: "complex64",
    ScalarType.COMPLEXDOUBLE: "complex128",
    ScalarType.BOOL: "bool",
    ScalarType.BFLOAT16: "bfloat16",
    ScalarType.UINT16: "uint16",
    ScalarType.FLOAT8E4M3FN: "float8_e4m3fn",
    ScalarType.FLOAT8E5M2: "float8_e5m2",
    ScalarType.FLOAT8E4M3FNUZ: "float8_e4m3fnuz",
    ScalarType.FLOAT8E5M2FNUZ: "float8_e5m2fnuz",
    ScalarType.FLOAT8E8M0FNU: "float8_e8m0fnu",
    ScalarType.UINT32: "uint32",
    ScalarType.UINT64: "uint64",
}
DTYPE_SCALAR_TYPE = {v: k for k, v in SCALAR_TYPE_DTYPE.items()}


class Layout(enum.IntEnum):
    Unknown = 0
    SparseCoo = 1
    SparseCsr = 2
    SparseCsc = 3
    SparseBsr = 4
    SparseBsc = 5
    _mkldnn = 6
    Strided = 7


LAYOUT_NAMES = {
    Layout.SparseCoo: "sparse_coo",
    Layout.SparseCsr: "sparse_csr",
    Layout.SparseCsc: "sparse_csc",
    Layout.SparseBsr: "sparse_bsr",
    Layout.SparseBsc: "sparse_bsc",
    Layout._mkldnn: "_mkldnn",
    Layout.Strided: "strided",
}


class MemoryFormat(enum.IntEnum):
    Unknown = 0
    ContiguousFormat = 1
    ChannelsLast = 2
    ChannelsLast3d = 3
    PreserveFormat = 4


MEMORY_FORMAT_NAMES = {
    MemoryFormat.ContiguousFormat: "contiguous_format",
    MemoryFormat.ChannelsLast: "channels_last",
    MemoryFormat.ChannelsLast3d: "channels_last_3d",
    MemoryFormat.PreserveFormat: "preserve_format",
}


class ArgumentKind(enum.IntEnum):
    UNKNOWN = 0
    POSITIONAL = 1
    KEYWORD = 2


class Union:
    """A tagged union: exactly one of the annotated fields is set (``kind``, ``value``).

    Subclasses only declare annotations; instances are immutable pairs.
    """

    __slots__ = ("kind", "value")
    kind: str
    value: Any

    def __init__(self, kind: str, value: Any) -> None:
        fields = _union_fields(type(self))
        if kind not in fields:
            raise FormatError(f"{type(self).__name__} has no variant {kind!r}", expected="one of " + ", ".join(fields))
        object.__setattr__(self, "kind", kind)
        object.__setattr__(self, "value", value)

    @classmethod
    def create(cls, **kw: Any) -> Any:
        if len(kw) != 1:
            raise FormatError(f"{cls.__name__} takes exactly one variant", found=", ".join(kw))
        ((k, v),) = kw.items()
        return cls(k, v)

    def __setattr__(self, name: str, value: Any) -> None:
        raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")

    def __getattr__(self, name: str) -> Any:
        # ``arg.as_tensor`` reads the variant, like torch's generated accessors
        if name.startswith("as_") or name in _union_fields(type(self)):
            if name == self.kind:
                return self.value
            raise AttributeError(f"{type(self).__name__} is {self.kind!r}, not {name!r}")
        raise AttributeError(name)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Union) and type(other) is type(self) and other.kind == self.kind and other.value == self.value

    def __hash__(self) -> int:
        return hash((type(self).__name__, self.kind, repr(self.value)))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.kind}={self.value!r})"


_FIELD_CACHE: dict[type, dict[str, Any]] = {}


def _union_fields(cls: type) -> dict[str, Any]:
    got = _FIELD_CACHE.get(cls)
    if got is None:
        got = {k: v for k, v in typing.get_type_hints(cls, vars(sys.modules[__name__])).items() if k not in ("kind", "value")}
        _FIELD_CACHE[cls] = got
    return got


@dataclass(frozen=True, slots=True)
class Device:
    type: str
    index: int | None = None


class SymExprHint(Union):
    __slots__ = ()
    as_int: int
    as_bool: bool
    as_float: float


@dataclass(frozen=True, slots=True)
class SymExpr:
    expr_str: str
    hint: SymExprHint | None = None


class SymInt(Union):
    __slots__ = ()
    as_expr: SymExpr
    as_int: int


class SymFloat(Union):
    __slots__ = ()
    as_expr: SymExpr
    as_float: float


class SymBool(Union):
    __slots__ = ()
    as_expr: SymExpr
    as_bool: bool


@dataclass(frozen=True, slots=True)
class TensorMeta:
    dtype: ScalarType
    sizes: list[SymInt]
    requires_grad: bool
    device: Device
    strides: list[SymInt]
    storage_offset: SymInt
    layout: Layout


class SymIntArgument(Union):
    __slots__ = ()
    as_name: str
    as_int: int


class SymFloatArgument(Union):
    __slots__ = ()
    as_name: str
    as_float: float


class SymBoolArgument(Union):
    __slots__ = ()
    as_name: str
    as_bool: bool


@dataclass(frozen=True, slots=True)
class TensorArgument:
    name: str


@dataclass(frozen=True, slots=True)
class TokenArgument:
    name: str


class OptionalTensorArgument(Union):
    __slots__ = ()
    as_tensor: TensorArgument
    as_none: bool


@dataclass(frozen=True, slots=True)
class CustomObjArgument:
    name: str
    class_fqn: str


@dataclass(frozen=True, slots=True)
class GraphArgument:
    name: str
    graph: Graph


@dataclass(frozen=True, slots=True)
class ComplexValue:
    real: float
    imag: float


class Argument(Union):
    __slots__ = ()
    as_none: bool
    as_tensor: TensorArgument
    as_tensors: list[TensorArgument]
    as_int: int
    as_ints: list[int]
    as_float: float
    as_floats: list[float]
    as_string: str
    as_strings: list[str]
    as_sym_int: SymIntArgument
    as_sym_ints: list[SymIntArgument]
    as_scalar_type: ScalarType
    as_memory_format: MemoryFormat
    as_layout: Layout
    as_device: Device
    as_bool: bool
    as_bools: list[bool]
    as_sym_bool: SymBoolArgument
    as_sym_bools: list[SymBoolArgument]
    as_graph: GraphArgument
    as_optional_tensors: list[OptionalTensorArgument]
    as_custom_obj: CustomObjArgument
    as_operator: str
    as_sym_float: SymFloatArgument
    as_sym_floats: list[SymFloatArgument]
    as_optional_tensor: OptionalTensorArgument
    as_complex: ComplexValue
    as_nested_tensors: list[list[TensorArgument]]
    as_int_lists: list[list[int]]
    as_string_to_argument: dict[str, Argument]
    as_float_lists: list[list[float]]


class ConstantValue(Union):
    __slots__ = ()
    as_none: bool
    as_int: int
    as_float: float
    as_string: str
    as_bool: bool


@dataclass(frozen=True, slots=True)
class NamedArgument:
    name: str
    arg: Argument
    kind: ArgumentKind | None = None


@dataclass(frozen=True, slots=True)
class Node:
    target: str
    inputs: list[NamedArgument]
    outputs: list[Argument]
    metadata: dict[str, str]
    is_hop_single_tensor_return: bool | None = None
    name: str | None = None


@dataclass(frozen=True, slots=True)
class Graph:
    inputs: list[Argument]
    outputs: list[Argument]
    nodes: list[Node]
    tensor_values: dict[str, TensorMeta]
    sym_int_values: dict[str, SymInt]
    sym_bool_values: dict[str, SymBool]
    is_single_tensor_return: bool = False
    custom_obj_values: dict[str, CustomObjArgument] = field(default_factory=dict)
    sym_float_values: dict[str, SymFloat] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class UserInputSpec:
    arg: Argument


@dataclass(frozen=True, slots=True)
class InputToParameterSpec:
    arg: TensorArgument
    parameter_name: str


@dataclass(frozen=True, slots=True)
class InputToBufferSpec:
    arg: TensorArgument
    buffer_name: str
    persistent: bool


@dataclass(frozen=True, slots=True)
class InputToTensorConstantSpec:
    arg: TensorArgument
    tensor_constant_name: str


@dataclass(frozen=True, slots=True)
class InputToCustomObjSpec:
    arg: CustomObjArgument
    custom_obj_name: str


@dataclass(frozen=True, slots=True)
class InputTokenSpec:
    arg: TokenArgument


@dataclass(frozen=True, slots=True)
class InputToConstantInputSpec:
    name: str
    value: ConstantValue


class InputSpec(Union):
    __slots__ = ()
    user_input: UserInputSpec
    parameter: InputToParameterSpec
    buffer: InputToBufferSpec
    tensor_constant: InputToTensorConstantSpec
    custom_obj: InputToCustomObjSpec
    token: InputTokenSpec
    constant_input: InputToConstantInputSpec


@dataclass(frozen=True, slots=True)
class UserOutputSpec:
    arg: Argument


@dataclass(frozen=True, slots=True)
class LossOutputSpec:
    arg: TensorArgument


@dataclass(frozen=True, slots=True)
class BufferMutationSpec:
    arg: TensorArgument
    buffer_name: str


@dataclass(frozen=True, slots=True)
class ParameterMutationSpec:
    arg: TensorArgument
    parameter_name: str


@dataclass(frozen=True, slots=True)
class GradientToParameterSpec:
    arg: TensorArgument
    parameter_name: str


@dataclass(frozen=True, slots=True)
class GradientToUserInputSpec:
    arg: TensorArgument
    user_input_name: str


@dataclass(frozen=True, slots=True)
class UserInputMutationSpec:
    arg: TensorArgument
    user_input_name: str


@dataclass(frozen=True, slots=True)
class OutputTokenSpec:
    arg: TokenArgument


class OutputSpec(Union):
    __slots__ = ()
    user_output: UserOutputSpec
    loss_output: LossOutputSpec
    buffer_mutation: BufferMutationSpec
    gradient_to_parameter: GradientToParameterSpec
    gradient_to_user_input: GradientToUserInputSpec
    user_input_mutation: UserInputMutationSpec
    token: OutputTokenSpec
    parameter_mutation: ParameterMutationSpec


@dataclass(frozen=True, slots=True)
class GraphSignature:
    input_specs: list[InputSpec]
    output_specs: list[OutputSpec]


@dataclass(frozen=True, slots=True)
class RangeConstraint:
    min_val: int | None
    max_val: int | None


@dataclass(frozen=True, slots=True)
class ModuleCallSignature:
    inputs: list[Argument]
    outputs: list[Argument]
    in_spec: str
    out_spec: str
    forward_arg_names: list[str] | None = None


@dataclass(frozen=True, slots=True)
class ModuleCallEntry:
    fqn: str
    signature: ModuleCallSignature | None = None


@dataclass(frozen=True, slots=True)
class NamedTupleDef:
    field_names: list[str]


@dataclass(frozen=True, slots=True)
class GraphModule:
    graph: Graph
    signature: GraphSignature
    module_call_graph: list[ModuleCallEntry]
    metadata: dict[str, str] = field(default_factory=dict)
    treespec_namedtuple_fields: dict[str, NamedTupleDef] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class SchemaVersion:
    major: int
    minor: int


@dataclass(frozen=True, slots=True)
class ExportedProgram:
    graph_module: GraphModule
    opset_version: dict[str, int]
    range_constraints: dict[str, RangeConstraint]
    schema_version: SchemaVersion
    verifiers: list[str] = field(default_factory=list)
    torch_version: str = "<=2.4"
    guards_code: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class PayloadMeta:
    path_name: str
    is_param: bool
    use_pickle: bool
    tensor_meta: TensorMeta | None


@dataclass(frozen=True, slots=True)
class PayloadConfig:
    config: dict[str, PayloadMeta]


# -- codec ---------------------------------------------------------------------------------

_HINTS: dict[type, dict[str, Any]] = {}
_NS = vars(sys.modules[__name__])


def _hints(cls: type) -> dict[str, Any]:
    h = _HINTS.get(cls)
    if h is None:
        h = typing.get_type_hints(cls, _NS)
        _HINTS[cls] = h
    return h


def _bad(where: str, expected: str, found: Any) -> FormatError:
    text = repr(found)
    return FormatError("bad value in ExportedProgram JSON", member=None, expected=f"{expected} at {where}", found=text[:80])


def from_json(tp: Any, obj: Any, where: str = "$") -> Any:
    """Decode JSON value ``obj`` into schema type ``tp`` (a dataclass, union, enum or builtin).

    Raises:
        FormatError: ``obj`` does not have the shape ``tp`` requires.
    """
    origin = typing.get_origin(tp)
    if origin is typing.Union or origin is types.UnionType:  # Optional[T], T | None
        if obj is None:
            return None
        (inner,) = [a for a in typing.get_args(tp) if a is not type(None)]
        return from_json(inner, obj, where)
    if origin is list:
        if not isinstance(obj, list):
            raise _bad(where, "a list", obj)
        (inner,) = typing.get_args(tp)
        return [from_json(inner, v, f"{where}[{i}]") for i, v in enumerate(obj)]
    if origin is dict:
        if not isinstance(obj, dict):
            raise _bad(where, "an object", obj)
        _k, inner = typing.get_args(tp)
        return {str(k): from_json(inner, v, f"{where}.{k}") for k, v in obj.items()}
    if tp is bool:
        if not isinstance(obj, bool):
            raise _bad(where, "a bool", obj)
        return obj
    if tp is int:
        if isinstance(obj, bool) or not isinstance(obj, int):
            raise _bad(where, "an int", obj)
        return obj
    if tp is float:
        if isinstance(obj, str):
            special = {"Infinity": math.inf, "-Infinity": -math.inf, "NaN": math.nan}
            if obj in special:
                return special[obj]
            raise _bad(where, "a float", obj)
        if isinstance(obj, bool) or not isinstance(obj, (int, float)):
            raise _bad(where, "a float", obj)
        return float(obj) if isinstance(obj, float) else _IntFloat(obj)
    if tp is str:
        if not isinstance(obj, str):
            raise _bad(where, "a string", obj)
        return obj
    if tp is bytes:
        return base64.b64decode(obj)
    if isinstance(tp, type) and issubclass(tp, enum.IntEnum):
        if isinstance(obj, bool) or not isinstance(obj, int):
            raise _bad(where, f"a {tp.__name__} number", obj)
        try:
            return tp(obj)
        except ValueError:
            raise _bad(where, f"a {tp.__name__} value", obj) from None
    if isinstance(tp, type) and issubclass(tp, Union):
        if not isinstance(obj, dict) or len(obj) != 1:
            raise _bad(where, f"a {tp.__name__} (one-key object)", obj)
        ((k, v),) = obj.items()
        fields = _union_fields(tp)
        if k not in fields:
            raise _bad(where, f"a {tp.__name__} variant (" + ", ".join(fields) + ")", k)
        return tp(k, from_json(fields[k], v, f"{where}.{k}"))
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if not isinstance(obj, dict):
            raise _bad(where, f"a {tp.__name__} object", obj)
        kw = {}
        hints = _hints(tp)
        for f in dataclasses.fields(tp):
            if f.name in obj:
                kw[f.name] = from_json(hints[f.name], obj[f.name], f"{where}.{f.name}")
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise _bad(where, f"field {f.name!r} of {tp.__name__}", "nothing")
        return tp(**kw)
    raise UnsupportedError(f"schema type {tp!r} is not supported")


class _IntFloat(float):
    """A float field that the file spelled as a JSON integer (kept so it re-encodes as ``1``)."""

    __slots__ = ("_int",)
    _int: int

    def __new__(cls, v: int) -> _IntFloat:
        obj = super().__new__(cls, v)
        obj._int = v
        return obj


def to_json(obj: Any) -> Any:
    """The JSON-ready value of a schema object (torch's ``_dataclass_to_dict`` encoding)."""
    if obj is None or isinstance(obj, (bool, str)):
        return obj
    if isinstance(obj, enum.IntEnum):
        return int(obj)
    if isinstance(obj, _IntFloat):
        return obj._int
    if isinstance(obj, float):
        if math.isnan(obj):
            return "NaN"
        if math.isinf(obj):
            return "Infinity" if obj > 0 else "-Infinity"
        return obj
    if isinstance(obj, int):
        return obj
    if isinstance(obj, bytes):
        return base64.b64encode(obj).decode("ascii")
    if isinstance(obj, Union):
        return {obj.kind: to_json(obj.value)}
    if dataclasses.is_dataclass(obj):
        return {f.name: to_json(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [to_json(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_json(v) for k, v in obj.items()}
    raise UnsupportedError(f"cannot encode {type(obj).__name__} in ExportedProgram JSON")


def dumps(obj: Any) -> str:
    """``json.dumps`` as torch writes it (no indent, ``allow_nan=False``)."""
    return json.dumps(to_json(obj), allow_nan=False)


def check_version(major: int, minor: int, *, member: str | None = None) -> None:
    """Refuse schema majors other than 8 (torch accepts 0.0 too, from very old files).

    Raises:
        UnsupportedError: the major version differs.
    """
    if (major, minor) == (0, 0):
        return
    if major != SCHEMA_VERSION[0]:
        raise UnsupportedError(
            "unsupported ExportedProgram schema version",
            member=member,
            expected=f"major {SCHEMA_VERSION[0]} (torchless implements {SCHEMA_VERSION[0]}.{SCHEMA_VERSION[1]})",
            found=f"{major}.{minor}",
            hint="re-export the program with torch 2.8 or newer",
        )


def upgrade_legacy(obj: dict[str, Any]) -> dict[str, Any]:
    """Rewrite the ExportedProgram JSON of a pre-2.8 archive (schema 5.x-8.x, torch 2.5-2.7)
    in place into the current schema's shape. Only what changed between those schemas and 8.x is touched:

    * ``Argument.as_none``: older schemas wrote an empty list (``[]``, the unit type),
      8.x a bool (``true``);
    * the single ``verifier`` string became the ``verifiers`` list;
    * ``NamedArgument.kind`` did not exist: those torches passed an operator's argument
      positionally when its schema gives it no default and it is not keyword-only, and by
      keyword otherwise; the upgrade writes that ``kind`` for ``torch.ops`` targets whose
      schema torchless knows (others stay positional);
    * ``schema_version`` is kept as written (``Program.schema_version`` tells the file's).
    """
    from ...graph.schema import registry

    reg = registry()
    if "verifiers" not in obj and isinstance(obj.get("verifier"), str):
        obj["verifiers"] = [obj["verifier"]]
    stack: list[Any] = [obj]
    seen = 0
    while stack:
        x = stack.pop()
        seen += 1
        if seen > 50_000_000:
            raise FormatError("ExportedProgram JSON too large to upgrade")
        if isinstance(x, dict):
            if x.get("as_none") == []:
                x["as_none"] = True
            target, inputs = x.get("target"), x.get("inputs")
            if isinstance(target, str) and isinstance(inputs, list) and target.startswith("torch.ops."):
                op = reg.find(target)
                if op is not None:
                    keyword = {a.name for a in op.arguments if a.default is not None or a.kwarg_only}
                    for ia in inputs:
                        if isinstance(ia, dict) and "kind" not in ia:
                            ia["kind"] = int(ArgumentKind.KEYWORD if ia.get("name") in keyword else ArgumentKind.POSITIONAL)
            stack.extend(v for v in x.values() if isinstance(v, (dict, list)))
        elif isinstance(x, list):
            stack.extend(v for v in x if isinstance(v, (dict, list)))
    return obj


def loads_program(text: str | bytes, *, member: str | None = None, legacy: bool = False) -> ExportedProgram:
    """Parse ``models/<name>.json`` into an :class:`ExportedProgram`, checking the version.

    ``legacy``: the JSON of a pre-2.8 archive; majors in ``LEGACY_SCHEMA_MAJORS`` are
    accepted and upgraded (:func:`upgrade_legacy`).

    Raises:
        FormatError: not JSON, or not an ExportedProgram.
        UnsupportedError: another schema major version.
    """
    obj = jsonsafe.loads(text, what="ExportedProgram JSON", member=member)
    if not isinstance(obj, dict):
        raise FormatError("ExportedProgram JSON is not an object", member=member, found=type(obj).__name__)
    sv = obj.get("schema_version")
    if isinstance(sv, dict):
        ma, mi = sv.get("major"), sv.get("minor")
        if isinstance(ma, int) and isinstance(mi, int):
            from .spec import LEGACY_SCHEMA_MAJORS

            if not (legacy and ma in LEGACY_SCHEMA_MAJORS):
                check_version(ma, mi, member=member)
    if legacy:  # torch 2.6-2.7 wrote 8.x in this layout, still without NamedArgument.kind
        obj = upgrade_legacy(obj)
    try:
        return from_json(ExportedProgram, obj)
    except FormatError as e:
        e.with_context(member=member)
        raise
    except RecursionError:
        raise FormatError("ExportedProgram JSON nests too deeply", member=member) from None
