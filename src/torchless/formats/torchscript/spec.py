"""TorchScript archive layout: record names, versions and the C++ pickler's names.

Spec: ``torchscript.md`` (torch 2.13). A TorchScript archive is the same zip container
as ``torch.save`` (``pt.md`` §1.3) with these records under the archive folder.
"""

from __future__ import annotations

from ...core.dtypes import DTYPES, DType
from ..pt.spec import (
    BYTEORDER,
    DATA_DIR,
    DATA_PKL,
    DATA_VERSION,
    METADATA_RECORDS,
    SERIALIZATION_ID,
    VERSION,
    VERSION_RECORDS,
    is_storage_record,
)

__all__ = [
    "DATA_PKL",
    "DATA_DIR",
    "CONSTANTS_PKL",
    "CONSTANTS_DIR",
    "BYTECODE_PKL",
    "BYTECODE_DIR",
    "TRACED_INPUTS_PKL",
    "TRACED_INPUTS_DIR",
    "CODE_DIR",
    "EXTRA_DIR",
    "DEBUG_SUFFIX",
    "VERSION_RECORDS",
    "PICKLES",
    "SMALL_RECORDS",
    "BYTEORDER",
    "SERIALIZATION_ID",
    "FLATBUFFER_ID",
    "is_flatbuffer",
    "FB",
    "FB_IVALUE",
    "FB_TYPE_KINDS",
    "OPCODES",
    "QSCHEMES",
    "C10_SCALAR_TYPES",
    "is_torchscript_zip",
    "is_checkpoint_zip",
    "may_be_torchscript",
    "classify_record",
    "MIN_FILE_FORMAT_VERSION",
    "MAX_FILE_FORMAT_VERSION",
    "MIN_BYTECODE_VERSION",
    "MAX_BYTECODE_VERSION",
    "SCALAR_TYPE_DTYPES",
    "storage_dtype",
    "code_record_for",
    "module_of_code_record",
]

#: the module object tree (§2): the same record as ``torch.save``'s (``pt.md`` §1)
#: (``DATA_PKL``, ``DATA_DIR`` are imported from :mod:`..pt.spec`)
#: tensor and other constants referenced as ``CONSTANTS.cN`` in code (§3)
CONSTANTS_PKL = "constants.pkl"
CONSTANTS_DIR = "constants"
#: lite-interpreter bytecode (§5); tensors of old (v4) bytecode live in ``bytecode/``
BYTECODE_PKL = "bytecode.pkl"
BYTECODE_DIR = "bytecode"
#: example inputs of ``torch.jit.trace`` (§1); the storage records may be empty
TRACED_INPUTS_PKL = "traced_inputs.pkl"
TRACED_INPUTS_DIR = "traced_inputs"
#: TorchScript source, one file per Python module path of the qualified class names
CODE_DIR = "code/"
#: ``_extra_files``, stored verbatim
EXTRA_DIR = "extra/"
#: source-range tables next to each code file (§4)
DEBUG_SUFFIX = ".debug_pkl"
#: the file format version record (``.data/version`` from version 6 on): ``VERSION_RECORDS``
#: from :mod:`..pt.spec`
#: the pickles torch.jit.load unpickles by name (each with its storage folder)
PICKLES = (
    (DATA_PKL, DATA_DIR),
    (CONSTANTS_PKL, CONSTANTS_DIR),
    (BYTECODE_PKL, BYTECODE_DIR),
    (TRACED_INPUTS_PKL, TRACED_INPUTS_DIR),
)
#: the small records ``info`` reports (``producer_info``: written by some exporters)
SMALL_RECORDS = (VERSION, DATA_VERSION, BYTEORDER, SERIALIZATION_ID, "producer_info")
#: a flatbuffer module (``save_jit_module_to_flatbuffer``, ``.ptl``): this file identifier
#: at byte 4; ``torch.jit.load`` reads such a file by content
FLATBUFFER_ID = b"PTMF"


class FB:
    """Field indices of ``mobile_bytecode.fbs`` (torch 2.13), ``TABLE_FIELD``: the index
    in declaration order that the table's vtable uses (a union takes two: type, value)."""

    # table Module (the root)
    MODULE_BYTECODE_VERSION, MODULE_EXTRA_FILES, MODULE_METHODS, MODULE_STATE_OBJ = 0, 1, 2, 3
    MODULE_IVALUES, MODULE_STORAGE_DATA_SIZE, MODULE_STORAGE_DATA, MODULE_OBJECT_TYPES = 4, 5, 6, 7
    MODULE_JIT_SOURCES, MODULE_JIT_CONSTANTS, MODULE_OPERATOR_VERSION = 8, 9, 10
    # table ExtraFile {name, content}; table IValue {val: IValueUnion}
    EXTRA_NAME, EXTRA_CONTENT = 0, 1
    IVALUE_TYPE = 0  # the union's type; its value is field 1
    # table Function
    FUNCTION_QN, FUNCTION_INSTRUCTIONS, FUNCTION_OPERATORS, FUNCTION_CONSTANTS = 0, 1, 2, 3
    FUNCTION_TYPES, FUNCTION_REGISTER_SIZE, FUNCTION_SCHEMA, FUNCTION_DEBUG_INFO, FUNCTION_CLASS_TYPE = 4, 5, 6, 7, 8
    # table Operator {name, overload_name, num_args_serialized = -1}
    OPERATOR_NAME, OPERATOR_OVERLOAD, OPERATOR_NUM_ARGS = 0, 1, 2
    # table Schema {arguments, returns}; table Arg {name, type, default_value}
    SCHEMA_ARGUMENTS, SCHEMA_RETURNS = 0, 1
    ARG_NAME, ARG_TYPE, ARG_DEFAULT = 0, 1, 2
    # struct Instruction {op: byte; n: ushort; x: int}: 8 bytes, op at 0, n at 2, x at 4
    INSTRUCTION_SIZE = 8
    # table TensorMetadata
    TENSOR_STORAGE, TENSOR_SCALAR_TYPE, TENSOR_OFFSET, TENSOR_SIZES, TENSOR_STRIDES = 0, 1, 2, 3, 4
    TENSOR_REQUIRES_GRAD, TENSOR_QUANTIZED = 5, 6
    # table QuantizedSchema {qscheme, scale, zero_point, scales, zero_points, axis}
    Q_QSCHEME, Q_SCALE, Q_ZERO_POINT, Q_SCALES, Q_ZERO_POINTS, Q_AXIS = 0, 1, 2, 3, 4, 5
    # table StorageData {data: [ubyte] (force_align: 16)}
    STORAGE_DATA = 0
    # List {items, annotation_str}; Tuple {items}; Dict {keys, values, annotation_str}
    LIST_ITEMS, LIST_ANNOTATION = 0, 1
    DICT_KEYS, DICT_VALUES, DICT_ANNOTATION = 0, 1, 2
    # ObjectType {type_name, type, attr_names}; Object {type_index, state, attrs, setstate_func}
    OBJTYPE_NAME, OBJTYPE_KIND, OBJTYPE_ATTRS = 0, 1, 2
    OBJECT_TYPE, OBJECT_STATE, OBJECT_ATTRS, OBJECT_SETSTATE = 0, 1, 2, 3
    # String {data}; Device {str}; EnumValue {type_name, value}; Int/Bool/Double lists {items}
    STRING_DATA = DEVICE_STR = ITEMS = 0
    ENUM_TYPE_NAME, ENUM_VALUE = 0, 1


#: IValueUnion member -> its type index (0 is NONE: the value None)
FB_IVALUE = {
    name: i + 1
    for i, name in enumerate(
        (
            "Int", "Bool", "Double", "ComplexDouble", "TensorMetadata", "String", "List", "Tuple",
            "Dict", "Object", "IntList", "DoubleList", "BoolList", "Device", "EnumValue", "Function",
        )
    )
}  # fmt: skip
#: c10::QScheme in enum order (QuantizedSchema.qscheme)
QSCHEMES = (
    "per_tensor_affine",
    "per_channel_affine",
    "per_tensor_symmetric",
    "per_channel_symmetric",
    "per_channel_affine_float_qparams",
)
#: enum TypeType (ObjectType.type)
FB_TYPE_KINDS = ("UNSET", "CLASS_WITH_FIELD", "CUSTOM_CLASS", "CLASS_WITH_SETSTATE", "NON_OBJ")

#: the interpreter's opcodes in enum order (torch/csrc/jit/runtime/instruction.h): a
#: flatbuffer Instruction stores the index, bytecode.pkl the name
OPCODES = (
    "OP", "OPN", "LOAD", "MOVE", "STOREN", "STORE", "DROP", "DROPR", "LOADC", "JF", "JMP", "LOOP", "RET", "WAIT",
    "CALL", "GUARD", "TYPECHECK", "FAIL_GUARD", "PROFILE_OP", "TAIL_CALL", "INTERFACE_CALL", "GET_ATTR", "SET_ATTR",
    "LIST_UNPACK", "TUPLE_CONSTRUCT", "NAMED_TUPLE_CONSTRUCT", "LIST_CONSTRUCT", "DICT_CONSTRUCT", "CREATE_OBJECT",
    "ISINSTANCE", "TUPLE_SLICE", "TUPLE_INDEX", "RAISE_EXCEPTION", "DICT_INDEX", "UNCHECKED_CAST", "__IS__",
    "UN_INITIALIZED", "__ISNOT__", "FORMAT", "DEVICE", "DTYPE", "DIM", "__NOT__", "TO_LIST", "NUM_TO_TENSOR",
    "IS_CUDA", "FORK", "WARN", "ENTER", "EXIT", "AWAITABLE",
)  # fmt: skip

#: caffe2/serialize/versions.h (§1, Versioning)
MIN_FILE_FORMAT_VERSION = 1
MAX_FILE_FORMAT_VERSION = 10
#: bytecode versions torch 2.13's mobile loader accepts (§5)
MIN_BYTECODE_VERSION = 4
MAX_BYTECODE_VERSION = 9

#: c10 ScalarType name -> dtype name. The C++ pickler names a storage class
#: ``torch <ScalarTypeName>Storage`` for every dtype (§2), so dtypes added after the
#: legacy typed storages get class names that do not exist in Python.
_SCALAR_TYPES = {
    "Byte": "uint8",
    "Char": "int8",
    "Short": "int16",
    "Int": "int32",
    "Long": "int64",
    "Half": "float16",
    "Float": "float32",
    "Double": "float64",
    "ComplexHalf": "complex32",
    "ComplexFloat": "complex64",
    "ComplexDouble": "complex128",
    "Bool": "bool",
    "QInt8": "qint8",
    "QUInt8": "quint8",
    "QInt32": "qint32",
    "BFloat16": "bfloat16",
    "QUInt4x2": "quint4x2",
    "QUInt2x4": "quint2x4",
    "Bits1x8": "bits1x8",
    "Bits2x4": "bits2x4",
    "Bits4x2": "bits4x2",
    "Bits8": "bits8",
    "Bits16": "bits16",
    "Float8_e5m2": "float8_e5m2",
    "Float8_e4m3fn": "float8_e4m3fn",
    "Float8_e5m2fnuz": "float8_e5m2fnuz",
    "Float8_e4m3fnuz": "float8_e4m3fnuz",
    "UInt16": "uint16",
    "UInt32": "uint32",
    "UInt64": "uint64",
    "Float8_e8m0fnu": "float8_e8m0fnu",
    "Float4_e2m1fn_x2": "float4_e2m1fn_x2",
}
for _n in range(1, 8):
    _SCALAR_TYPES[f"UInt{_n}"] = f"uint{_n}"
    _SCALAR_TYPES[f"Int{_n}"] = f"int{_n}"

#: c10::ScalarType in enum order (c10/core/ScalarType.h): the number a flatbuffer
#: TensorMetadata (and ExecuTorch's ScalarType) stores -> dtype name
C10_SCALAR_TYPES: tuple[str, ...] = (
    *[_SCALAR_TYPES[k] for k in list(_SCALAR_TYPES)[: list(_SCALAR_TYPES).index("UInt64") + 1]],
    *[f"uint{n}" for n in range(1, 8)],
    *[f"int{n}" for n in range(1, 8)],
    "float8_e8m0fnu",
    "float4_e2m1fn_x2",
)

#: ``<ScalarTypeName>Storage`` -> DType, for every storage class the C++ pickler writes.
SCALAR_TYPE_DTYPES: dict[str, DType] = {f"{k}Storage": DTYPES[v] for k, v in _SCALAR_TYPES.items() if v in DTYPES}


def storage_dtype(class_name: str) -> DType | None:
    """The dtype of a C++-pickler storage class name (``UInt16Storage`` -> uint16)."""
    return SCALAR_TYPE_DTYPES.get(class_name)


def code_record_for(qualified_name: str) -> tuple[str, str]:
    """``(code record, class name)`` holding a qualified class name.

    ``__torch__.torch.nn.modules.linear.Linear`` ->
    ``("code/__torch__/torch/nn/modules/linear.py", "Linear")``.
    """
    module, _, name = qualified_name.rpartition(".")
    return CODE_DIR + module.replace(".", "/") + ".py", name


def module_of_code_record(record: str) -> str | None:
    """The Python-style module a code record defines (inverse of :func:`code_record_for`)."""
    if not record.startswith(CODE_DIR) or not record.endswith(".py"):
        return None
    return record[len(CODE_DIR) : -3].replace("/", ".")


# Detection lives here, with the record names, so sniffing stays cheap.
def is_torchscript_zip(records: list[str] | None) -> bool:
    """True for the record list of a TorchScript archive (torch's own test, §1)."""
    return records is not None and (CONSTANTS_PKL in records or (BYTECODE_PKL in records and DATA_PKL in records))


def is_checkpoint_zip(records: list[str] | None) -> bool:
    """The record list of a ``torch.save`` zip: a ``data.pkl`` and no ``constants.pkl``
    (torch.load's own test for "not TorchScript"; here, where both record names live)."""
    return records is not None and DATA_PKL in records and CONSTANTS_PKL not in records


def may_be_torchscript(records: list[str]) -> bool:
    """Whether ``torch.jit.load`` could be the loader meant for these records: any record
    only TorchScript writes, looked up case-insensitively as miniz does. Wider than
    :func:`is_torchscript_zip` (the scanner's rule: it must not miss an archive whose
    records a writer renamed in case, or that holds only code)."""
    for r in records:
        low = r.lower()
        if low in (CONSTANTS_PKL, BYTECODE_PKL) or low.startswith(CODE_DIR):
            return True
    return False


def is_flatbuffer(head: bytes) -> bool:
    """A flatbuffer TorchScript module (the ``PTMF`` identifier at byte 4)."""
    return head[4:8] == FLATBUFFER_ID


def classify_record(rel: str) -> str:
    """``pickle``, ``storage``, ``code``, ``metadata`` or ``other`` for a record name
    relative to the archive folder (case-insensitive, as torch looks records up)."""
    low = rel.lower()
    if low.startswith(CODE_DIR) and low.endswith(".py"):
        return "code"
    if low.endswith(".pkl") or low.endswith(DEBUG_SUFFIX):
        return "pickle"
    if is_storage_record(rel):
        return "storage"
    if low in METADATA_RECORDS:
        return "metadata"
    return "other"
