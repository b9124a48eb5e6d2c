"""TorchScript mobile modules in the flatbuffer container (``PTMF``).

Spec: ``torchscript.md`` §6 (``mobile_bytecode.fbs``, torch 2.13).
``torch.jit.save_jit_module_to_flatbuffer`` and ``_save_for_lite_interpreter(...,
_use_flatbuffer=True)`` write one FlatBuffers buffer whose root ``Module`` holds every
value in one ``ivalues`` table (objects, lists, tensors, and each method as a
``Function``) that the other fields index: ``state_obj`` (the root module),
``methods``, ``jit_constants``; tensors point into ``storage_data``. ``jit_sources`` keep
the TorchScript source (``torch.jit.load`` compiles it), ``extra_files`` the
``_extra_files``. Values are decoded on demand and each index once (shared objects stay
shared); nothing is executed. Every offset is checked
(:mod:`torchless.container.flatbuffer`): a hostile buffer raises
:class:`~torchless.core.errors.FormatError` naming the offset.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Any

from ...container.flatbuffer import FlatBuffer, Table
from ...core.dtypes import DTYPES
from ...core.errors import FormatError, LimitError, NotFoundError
from ...core.tensor import Storage, Tensor
from ...core.values import Device
from ...io.source import ByteSource, BytesSource
from .bytecode import Argument, Bytecode, Instruction, MobileMethod, Operator
from .code import CodeFile, FunctionSource, parse_code_file
from .read import ClassSource, ScriptObject, _attach_classes
from .spec import C10_SCALAR_TYPES, CODE_DIR, FB, FB_IVALUE, FB_TYPE_KINDS, FLATBUFFER_ID, OPCODES, QSCHEMES

__all__ = ["ExtraFile", "FlatbufferModule", "read_flatbuffer", "MAX_VALUES"]

#: values (ivalues entries) one module may hold
MAX_VALUES = 4_000_000
_IV = FB_IVALUE


@dataclass(frozen=True)
class ExtraFile:
    """One ``_extra_files`` entry: where its bytes lie in the file. ``data`` reads them
    through the module's source on each access (a zero-copy view of a mapped file), so
    the parsed module keeps no view of the file and closing the artifact releases it."""

    offset: int
    size: int
    source: ByteSource = field(repr=False, compare=False)

    @property
    def data(self) -> memoryview:
        return self.source.view(self.offset, self.size, what="extra file")


@dataclass
class FlatbufferModule:
    """A parsed flatbuffer mobile module.

    Attributes:
        bytecode_version: ``Module.bytecode_version`` (9 and above for this container).
        operator_version: ``Module.operator_version``.
        module: the root :class:`~torchless.formats.torchscript.read.ScriptObject`.
        constants: ``jit_constants`` (``CONSTANTS.cN`` in the sources).
        extra: ``_extra_files`` name -> :class:`ExtraFile`.
        code: ``code/<module>.py`` -> parsed source (from ``jit_sources``).
        classes: qualified class name -> parsed class.
        object_types: ``(type name, kind, attribute names)`` per ObjectType.
        storages: storage_data index -> Storage (every one the tensors use).
        storage_count: ``Module.storage_data_size``.
    """

    bytecode_version: int
    operator_version: int
    module: Any
    constants: tuple[Any, ...]
    extra: dict[str, ExtraFile]
    code: dict[str, CodeFile]
    classes: dict[str, ClassSource]
    object_types: list[tuple[str, str, list[str]]]
    storages: dict[int, Storage] = field(default_factory=dict)
    storage_count: int = 0
    _bytecode: Bytecode | None = None

    zip: None = None  # no zip container (the archive reader's field, for code shared with it)

    @property
    def prefix(self) -> str:
        return ""

    @property
    def is_lite(self) -> bool:
        return True

    def extra_file(self, name: str) -> bytes:
        """The bytes of extra file ``name``."""
        e = self.extra.get(name)
        if e is None:
            raise NotFoundError(f"no extra file {name!r}", expected=", ".join(self.extra) or "no extra files")
        return bytes(e.data)

    def function(self, qualified_name: str) -> FunctionSource:
        """A method (``__torch__.M.forward``) or free function of ``jit_sources``."""
        owner, _, name = qualified_name.rpartition(".")
        cs = self.classes.get(owner)
        if cs is not None and name in cs.methods:
            return cs.methods[name]
        for cf in self.code.values():
            if cf.module == owner and name in cf.functions:
                return cf.functions[name]
        raise NotFoundError(f"no method or function {qualified_name!r} in the module's jit_sources")

    def bytecode(self) -> Bytecode:
        """The methods' bytecode (the ``Function`` values ``methods`` lists), in the
        form :mod:`.bytecode` gives a ``bytecode.pkl``."""
        assert self._bytecode is not None
        return self._bytecode


class _Decoder:
    def __init__(self, fb: FlatBuffer, root: Table, source: ByteSource | None = None) -> None:
        self.fb = fb
        self.source = source if source is not None else BytesSource(fb.b, fb.name)
        self.root = root
        self.ivalues = root.vector_pos(FB.MODULE_IVALUES, 4) or (0, 0)
        if self.ivalues[1] > MAX_VALUES:
            raise LimitError(
                "flatbuffer module has too many values", path=fb.name, expected=f"at most {MAX_VALUES}", found=self.ivalues[1]
            )
        self.memo: dict[int, Any] = {}
        self.busy: set[int] = set()
        self.storage_vec = root.tables(FB.MODULE_STORAGE_DATA, "StorageData")
        self.storages: dict[int, Storage] = {}
        self.types = [
            (t.string(FB.OBJTYPE_NAME) or "", t.scalar(FB.OBJTYPE_KIND, "B", 0), t.strings(FB.OBJTYPE_ATTRS))
            for t in root.tables(FB.MODULE_OBJECT_TYPES, "ObjectType")
        ]
        self.functions: list[MobileMethod] = []

    def err(self, message: str, offset: int, **kw: Any) -> FormatError:
        return FormatError(message, path=self.fb.name, offset=offset, **kw)

    def value(self, index: int) -> Any:
        if index in self.memo:
            return self.memo[index]
        start, n = self.ivalues
        if not 0 <= index < n:
            raise self.err("value index out of range", start - 4, expected=f"< {n} values", found=index)
        if index in self.busy:
            raise self.err("value refers to itself", start + 4 * index, found=f"ivalues[{index}]")
        self.busy.add(index)
        iv = self.fb.table_at(self.fb.uoffset(start + 4 * index, "IValue"), f"ivalues[{index}]")
        kind, pos = iv.union(FB.IVALUE_TYPE)
        try:
            v = self._decode(index, kind, pos, iv)
        finally:
            self.busy.discard(index)
        self.memo[index] = v
        return v

    def _decode(self, index: int, kind: int, pos: int | None, iv: Table) -> Any:
        fb = self.fb
        if kind == 0:
            return None
        if pos is None:
            raise self.err("value has a type but no data", iv.pos, found=f"ivalues[{index}] type {kind}")
        if kind == _IV["Int"]:
            return fb.scalar(pos, "q", "Int")
        if kind == _IV["Bool"]:
            return bool(fb.scalar(pos, "B", "Bool"))
        if kind == _IV["Double"]:
            return fb.scalar(pos, "d", "Double")
        if kind == _IV["ComplexDouble"]:
            return complex(fb.scalar(pos, "d", "ComplexDouble"), fb.scalar(pos + 8, "d", "ComplexDouble"))
        t = fb.table_at(pos, f"ivalues[{index}]")
        if kind == _IV["TensorMetadata"]:
            return self.tensor(t)
        if kind == _IV["String"]:
            return t.string(FB.STRING_DATA) or ""
        if kind == _IV["Device"]:
            return Device(t.string(FB.DEVICE_STR) or "")
        if kind in (_IV["List"], _IV["Tuple"]):
            items = [self.value(int(i)) for i in t.scalars(FB.LIST_ITEMS, "I")]
            return items if kind == _IV["List"] else tuple(items)
        if kind == _IV["IntList"]:
            return [int(x) for x in t.scalars(FB.ITEMS, "q")]
        if kind == _IV["DoubleList"]:
            return [float(x) for x in t.scalars(FB.ITEMS, "d")]
        if kind == _IV["BoolList"]:
            return [bool(x) for x in t.scalars(FB.ITEMS, "?")]
        if kind == _IV["Dict"]:
            keys = t.scalars(FB.DICT_KEYS, "I")
            vals = t.scalars(FB.DICT_VALUES, "I")
            if len(keys) != len(vals):
                raise self.err(
                    "dict has different numbers of keys and values", t.pos, found=f"{len(keys)} keys, {len(vals)} values"
                )
            out: dict[Any, Any] = {}
            for k, v in zip(keys, vals, strict=True):
                out[self.value(int(k))] = self.value(int(v))
            return out
        if kind == _IV["Object"]:
            return self.object(t, index)
        if kind == _IV["EnumValue"]:
            return ScriptObject(t.string(FB.ENUM_TYPE_NAME) or "", (self.value(t.scalar(FB.ENUM_VALUE, "I")),))
        if kind == _IV["Function"]:
            return self.function(t)
        raise self.err("unknown value type", iv.pos, expected=f"1..{len(_IV)}", found=kind)

    def object(self, t: Table, index: int) -> ScriptObject:
        ti = t.scalar(FB.OBJECT_TYPE, "I")
        if ti >= len(self.types):
            raise self.err("object type index out of range", t.pos, expected=f"< {len(self.types)}", found=ti)
        name, kind, attr_names = self.types[ti]
        obj = ScriptObject(name)
        self.memo[index] = obj  # objects may refer back to themselves through attributes
        if kind == 1:  # CLASS_WITH_FIELD
            attrs = t.scalars(FB.OBJECT_ATTRS, "I")
            if len(attrs) != len(attr_names):
                raise self.err(
                    f"object of {name} has {len(attrs)} attributes, its type names {len(attr_names)}",
                    t.pos,
                    expected=len(attr_names),
                    found=len(attrs),
                )
            for a, v in zip(attr_names, attrs, strict=True):
                obj.attrs[a] = self.value(int(v))
        elif kind in (2, 3):  # CUSTOM_CLASS, CLASS_WITH_SETSTATE: state given to __setstate__
            obj.state = self.value(t.scalar(FB.OBJECT_STATE, "I"))
        else:
            raise self.err(f"object of type kind {FB_TYPE_KINDS[kind] if kind < len(FB_TYPE_KINDS) else kind}", t.pos, found=kind)
        return obj

    def tensor(self, t: Table) -> Tensor:
        code = t.scalar(FB.TENSOR_SCALAR_TYPE, "b", 0)
        if not 0 <= code < len(C10_SCALAR_TYPES) or C10_SCALAR_TYPES[code] not in DTYPES:
            raise self.err("tensor has an unknown scalar type", t.pos, found=code)
        dtype = DTYPES[C10_SCALAR_TYPES[code]]
        si = t.scalar(FB.TENSOR_STORAGE, "I")
        st = self.storages.get(si)
        if st is None:
            if si >= len(self.storage_vec):
                raise self.err("tensor storage index out of range", t.pos, expected=f"< {len(self.storage_vec)}", found=si)
            vec = self.storage_vec[si].vector_pos(FB.STORAGE_DATA, 1)
            start, n = vec if vec is not None else (0, 0)
            what = f"storage_data[{si}]"
            load = partial(self.source.view, start, n, what=what)
            st = Storage(str(si), n, dtype, "cpu", loader=load, origin=what, file_offset=start)
            self.storages[si] = st
        q = None
        qt = t.table(FB.TENSOR_QUANTIZED, "QuantizedSchema")
        if qt is not None:
            qs = qt.scalar(FB.Q_QSCHEME, "b", 0)
            scheme = QSCHEMES[qs] if 0 <= qs < len(QSCHEMES) else str(qs)
            if "per_tensor" in scheme:
                q = {
                    "qscheme": scheme,
                    "scale": qt.scalar(FB.Q_SCALE, "d", 0.0),
                    "zero_point": qt.scalar(FB.Q_ZERO_POINT, "i", 0),
                }
            else:
                scales, zps = qt.table(FB.Q_SCALES), qt.table(FB.Q_ZERO_POINTS)
                q = {
                    "qscheme": scheme,
                    "scales": None if scales is None else self.tensor(scales),
                    "zero_points": None if zps is None else self.tensor(zps),
                    "axis": qt.scalar(FB.Q_AXIS, "i", 0),
                }
        sizes = [int(x) for x in t.scalars(FB.TENSOR_SIZES, "i")]
        strides = [int(x) for x in t.scalars(FB.TENSOR_STRIDES, "i")]
        try:
            out = Tensor(
                st,
                dtype,
                sizes,
                strides,
                t.scalar(FB.TENSOR_OFFSET, "i", 0),
                requires_grad=bool(t.scalar(FB.TENSOR_REQUIRES_GRAD, "B", 0)),
                quantizer=q,
            )
            if st.dtype is not dtype:  # one storage viewed as two dtypes: reinterpret the bytes
                assert st.file_offset is not None  # every storage here is a range of the file
                load = partial(self.source.view, st.file_offset, st.nbytes, what=st.origin)
                out.storage = Storage(st.key, st.nbytes, dtype, "cpu", loader=load, origin=st.origin, file_offset=st.file_offset)
            out._check_bounds()
        except FormatError as e:
            e.with_context(path=self.fb.name)
            if e.offset is None:
                e.offset = t.pos
            raise
        return out

    def function(self, t: Table) -> MobileMethod:
        m = MobileMethod(t.string(FB.FUNCTION_QN) or "")
        v = t.vector_pos(FB.FUNCTION_INSTRUCTIONS, FB.INSTRUCTION_SIZE)
        if v is not None:
            start, n = v
            for i in range(n):
                p = start + FB.INSTRUCTION_SIZE * i
                op = self.fb.scalar(p, "b", "Instruction")
                if not 0 <= op < len(OPCODES):
                    raise self.err("unknown instruction opcode", p, expected=f"0..{len(OPCODES) - 1}", found=op)
                m.instructions.append(Instruction(OPCODES[op], self.fb.scalar(p + 4, "i"), self.fb.scalar(p + 2, "H")))
        for o in t.tables(FB.FUNCTION_OPERATORS, "Operator"):
            na = o.scalar(FB.OPERATOR_NUM_ARGS, "i", -1)
            m.operators.append(
                Operator(o.string(FB.OPERATOR_NAME) or "", o.string(FB.OPERATOR_OVERLOAD) or "", None if na < 0 else na)
            )
        m.constants = [self.value(int(i)) for i in t.scalars(FB.FUNCTION_CONSTANTS, "I")]
        m.types = t.strings(FB.FUNCTION_TYPES)
        m.register_size = t.scalar(FB.FUNCTION_REGISTER_SIZE, "i", 0)
        sch = t.table(FB.FUNCTION_SCHEMA, "Schema")
        if sch is not None:
            m.arguments = [self.arg(a) for a in sch.tables(FB.SCHEMA_ARGUMENTS, "Arg")]
            m.returns = [self.arg(a) for a in sch.tables(FB.SCHEMA_RETURNS, "Arg")]
        return m

    def arg(self, a: Table) -> Argument:
        return Argument(a.string(FB.ARG_NAME) or "", a.string(FB.ARG_TYPE) or "", self.value(a.scalar(FB.ARG_DEFAULT, "I")))


def read_flatbuffer(data: Any, name: str = "<flatbuffer>", *, source: ByteSource | None = None) -> FlatbufferModule:
    """Parse a flatbuffer mobile module (bytes or a memoryview over the whole file).
    Tensor storages and extra files are read later through ``source`` (the file's byte
    source; by default one over ``data``), so a source that is closed releases the file.

    Raises:
        FormatError / TruncatedError: offsets, lengths or indices outside the buffer.
        LimitError: more than :data:`MAX_VALUES` values.
    """
    fb = FlatBuffer(data, name, what="flatbuffer module")
    root = fb.root(FLATBUFFER_ID)
    src = source if source is not None else BytesSource(data, name)
    dec = _Decoder(fb, root, src)
    extra: dict[str, ExtraFile] = {}
    for ef in root.tables(FB.MODULE_EXTRA_FILES, "ExtraFile"):
        off, size = ef.span(FB.EXTRA_CONTENT, kind="string") or (0, 0)
        extra[ef.string(FB.EXTRA_NAME) or ""] = ExtraFile(off, size, src)
    code: dict[str, CodeFile] = {}
    classes: dict[str, ClassSource] = {}
    for ef in root.tables(FB.MODULE_JIT_SOURCES, "ExtraFile"):
        module = ef.string(FB.EXTRA_NAME) or ""
        rec = CODE_DIR + module.replace(".", "/") + ".py"
        cf = parse_code_file(rec, module, ef.string(FB.EXTRA_CONTENT) or "")
        code[rec] = cf
        for cs in cf.classes.values():
            classes[cs.qualified_name] = cs
    module = dec.value(root.scalar(FB.MODULE_STATE_OBJ, "I"))
    constants = tuple(dec.value(int(i)) for i in root.scalars(FB.MODULE_JIT_CONSTANTS, "I"))
    methods = []
    for i in root.scalars(FB.MODULE_METHODS, "I"):
        f = dec.value(int(i))
        if not isinstance(f, MobileMethod):
            raise FormatError("a method index names a value that is not a Function", path=name, found=f"ivalues[{int(i)}]")
        methods.append(f)
    version = root.scalar(FB.MODULE_BYTECODE_VERSION, "I")
    _attach_classes(module, classes)
    _attach_classes(constants, classes)
    out = FlatbufferModule(
        version,
        root.scalar(FB.MODULE_OPERATOR_VERSION, "I"),
        module,
        constants,
        extra,
        code,
        classes,
        [(n, FB_TYPE_KINDS[k] if k < len(FB_TYPE_KINDS) else str(k), a) for n, k, a in dec.types],
        dec.storages,
        root.scalar(FB.MODULE_STORAGE_DATA_SIZE, "i", 0),
    )
    out._bytecode = Bytecode(version, methods)
    return out
