"""ExecuTorch ``.pte`` layout: file identifier, extended header, program schema fields.

Facts from executorch's ``schema/program.fbs`` and ``scalar_type.fbs`` (executorch 1.5)
and its serializer (``exir/_serialize/_program.py``). A ``.pte`` file is a FlatBuffers
buffer whose root is a ``Program``, with the file identifier ``ET`` + two digits at byte 4
(``ET12`` for the current schema). Right after the identifier an *extended header* may
follow: ``eh00``, u32 header length (>= 24), u64 program size (bytes of the flatbuffer),
u64 segment base offset (where the data segments start, from byte 0), and, when the length
allows (>= 32), u64 segment data size. ``Program.segments`` are ``(offset, size)`` pairs
relative to the segment base. Constant tensor bytes live either inline in
``Program.constant_buffer[i].storage`` (older files) or in the segment named by
``Program.constant_segment`` at ``offsets[data_buffer_idx]``; index 0 is reserved for
non-constant tensors. ScalarType values are c10's enum numbers.
"""

from __future__ import annotations

import struct
from typing import Any

__all__ = [
    "IDENTIFIER_PREFIX",
    "KNOWN_IDENTIFIERS",
    "is_pte",
    "program_view",
    "EH_MAGIC",
    "EH_MIN_LENGTH",
    "EH_FULL_LENGTH",
    "P",
    "KERNEL_TYPES",
    "INSTRUCTIONS",
    "DATA_LOCATIONS",
    "TENSOR_LOCATIONS",
    "DYNAMISM",
]

#: the file identifier is b"ET" + a two-digit schema version at byte 4
IDENTIFIER_PREFIX = b"ET"
#: identifiers executorch 1.5's runtime accepts (``ET12``); others are read with a warning
KNOWN_IDENTIFIERS = (b"ET12",)
#: the extended header at byte 8
EH_MAGIC = b"eh00"
EH_MIN_LENGTH = 24  # magic, length, program size, segment base offset
EH_FULL_LENGTH = 32  # + segment data size


def program_view(source: Any) -> tuple[Any, int | None]:
    """What to parse of a ``.pte`` (a :class:`~torchless.io.source.ByteSource`): the
    whole file, or, for a remote file whose extended header is sound, the flatbuffer
    program alone (``program_size`` bytes), so that reading the program (``info``, ``ls``,
    ``scan``) does not fetch the data segments. ``(buffer, the file's size or None)``."""
    from ...io.source import RemoteSource

    size = source.size
    if not isinstance(source, RemoteSource) or size < EH_FULL_LENGTH + 8:
        return source.view(0, size), None
    head = bytes(source.view(0, 8 + EH_FULL_LENGTH))
    if head[8:12] != EH_MAGIC:
        return source.view(0, size), None
    length, prog = struct.unpack_from("<I", head, 12)[0], struct.unpack_from("<Q", head, 16)[0]
    if length < EH_MIN_LENGTH or not 8 + length <= prog <= size:
        return source.view(0, size), None  # the checks of the whole-file parse name the fault
    return source.view(0, prog), size


def is_pte(head: bytes) -> bool:
    """An ExecuTorch program: ``ET`` + two digits at byte 4 (cheap sniff)."""
    return len(head) >= 8 and head[4:6] == IDENTIFIER_PREFIX and head[6:8].isdigit()


class P:
    """Field indices of ``program.fbs`` tables (declaration order; a union takes two)."""

    # table Program
    PROGRAM_VERSION, PROGRAM_PLANS, PROGRAM_CONSTANT_BUFFER, PROGRAM_DELEGATE_DATA = 0, 1, 2, 3
    PROGRAM_SEGMENTS, PROGRAM_CONSTANT_SEGMENT, PROGRAM_MUTABLE_SEGMENTS, PROGRAM_NAMED_DATA = 4, 5, 6, 7
    # table ExecutionPlan
    PLAN_NAME, PLAN_CONTAINER_META, PLAN_VALUES, PLAN_INPUTS, PLAN_OUTPUTS = 0, 1, 2, 3, 4
    PLAN_CHAINS, PLAN_OPERATORS, PLAN_DELEGATES, PLAN_NON_CONST_SIZES = 5, 6, 7, 8
    # ContainerMetadata {encoded_inp_str, encoded_out_str}
    META_INP, META_OUT = 0, 1
    # EValue {val: KernelTypes}; Instruction {instr_args: InstructionArguments}
    UNION_TYPE = 0
    # Tensor
    TENSOR_SCALAR_TYPE, TENSOR_OFFSET, TENSOR_SIZES, TENSOR_DIM_ORDER, TENSOR_REQUIRES_GRAD = 0, 1, 2, 3, 4
    TENSOR_BUFFER_IDX, TENSOR_ALLOCATION, TENSOR_LAYOUT, TENSOR_DYNAMISM, TENSOR_EXTRA = 5, 6, 7, 8, 9
    # ExtraTensorInfo {mutable_data_segments_idx: u64, fully_qualified_name, location, ...}
    EXTRA_MUTABLE_IDX, EXTRA_FQN, EXTRA_LOCATION = 0, 1, 2
    # AllocationDetails {memory_id, memory_offset_low, memory_offset_high}
    ALLOC_MEMORY_ID, ALLOC_LOW, ALLOC_HIGH = 0, 1, 2
    # Int/Bool/Double/String {value}; IntList/DoubleList/BoolList/TensorList/OptionalTensorList {items}
    SCALAR_VALUE = ITEMS = 0
    # Operator {name, overload}
    OP_NAME, OP_OVERLOAD = 0, 1
    # KernelCall {op_index, args}; DelegateCall {delegate_index, args}; MoveCall {from, to};
    # JumpFalseCall {cond_value_index, destination_instruction}; FreeCall {value_index}
    CALL_FIRST, CALL_SECOND = 0, 1
    # Chain {inputs, outputs, instructions, stacktrace}
    CHAIN_INPUTS, CHAIN_OUTPUTS, CHAIN_INSTRUCTIONS = 0, 1, 2
    # BackendDelegate {id, processed, compile_specs}; BackendDelegateDataReference {location, index}
    DELEGATE_ID, DELEGATE_PROCESSED, DELEGATE_SPECS = 0, 1, 2
    REF_LOCATION, REF_INDEX = 0, 1
    # CompileSpec {key, value}
    SPEC_KEY, SPEC_VALUE = 0, 1
    # Buffer {storage}; BackendDelegateInlineData {data}
    BUFFER_DATA = 0
    # DataSegment {offset: u64, size: u64}; SubsegmentOffsets {segment_index, offsets: [u64]}
    SEGMENT_OFFSET, SEGMENT_SIZE = 0, 1
    SUBSEG_INDEX, SUBSEG_OFFSETS = 0, 1
    # NamedData {key, segment_index}
    NAMED_KEY, NAMED_SEGMENT = 0, 1


#: union KernelTypes members (type index = position + 1; 0 is NONE)
KERNEL_TYPES = (
    "Null", "Int", "Bool", "Double", "Tensor", "String", "IntList", "DoubleList", "BoolList", "TensorList",
    "OptionalTensorList",
)  # fmt: skip
#: union InstructionArguments members
INSTRUCTIONS = ("KernelCall", "DelegateCall", "MoveCall", "JumpFalseCall", "FreeCall")
#: enum DataLocation (where a delegate blob is)
DATA_LOCATIONS = ("INLINE", "SEGMENT")
#: enum TensorDataLocation (ExtraTensorInfo.location)
TENSOR_LOCATIONS = ("CONSTANT_SEGMENT", "EXTERNAL")
#: enum TensorShapeDynamism
DYNAMISM = ("STATIC", "DYNAMIC_BOUND", "DYNAMIC_UNBOUND")
