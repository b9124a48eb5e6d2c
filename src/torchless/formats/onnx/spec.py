"""ONNX facts in one place: the protobuf wire walk and the ``onnx.proto`` field numbers
the reader, the sniffer and the scanner use (no ``onnx`` package needed for these).

The full message is parsed by the optional ``onnx`` package (``read.py``); what is here
is what must work without it: recognising a ``ModelProto`` by its first fields, finding
where each initializer's ``raw_data`` lies in the file (zero-copy views), and listing
every external-data ``location`` (what the scanner checks for paths that leave the
model's folder).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

__all__ = [
    "ONNX_SUFFIX",
    "MODEL_FIELDS",
    "varint",
    "fields",
    "looks_like_model",
    "is_onnx_file",
    "parses_as_model",
    "raw_data_spans",
    "ExternalLocation",
    "external_locations",
]

ONNX_SUFFIX = ".onnx"

#: ModelProto field number -> wire type (onnx.proto); a head whose fields all fit is a model
MODEL_FIELDS = {1: 0, 2: 2, 3: 2, 4: 2, 5: 0, 6: 2, 7: 2, 8: 2, 14: 2, 20: 2, 25: 2, 26: 2}

#: the largest protobuf field number (2**29 - 1); 0 and larger ones do not parse
MAX_FIELD_NUMBER = (1 << 29) - 1
#: groups nested deeper than this are refused (protobuf's own recursion limit is 100)
MAX_GROUP_DEPTH = 100
#: top-level fields :func:`parses_as_model` walks before it gives up (a ModelProto has
#: a handful; past this the bytes may still be one, and the caller must not guess)
MAX_TOP_FIELDS = 100_000

# field numbers of onnx.proto used below
MODEL_GRAPH = 7
MODEL_FUNCTIONS = 25
GRAPH_NODE = 1
GRAPH_INITIALIZER = 5
GRAPH_SPARSE_INITIALIZER = 15
NODE_ATTRIBUTE = 5
ATTR_T = 5
ATTR_G = 6
ATTR_TENSORS = 10
ATTR_GRAPHS = 11
ATTR_SPARSE_TENSOR = 22
ATTR_SPARSE_TENSORS = 23
FUNCTION_NODE = 7
TENSOR_NAME = 8
TENSOR_RAW_DATA = 9
TENSOR_EXTERNAL_DATA = 13
TENSOR_DATA_LOCATION = 14
SPARSE_VALUES = 1
SPARSE_INDICES = 2
ENTRY_KEY = 1
ENTRY_VALUE = 2
DATA_LOCATION_EXTERNAL = 1

#: nesting of subgraphs walked (If/Loop/Scan bodies); deeper is refused by the walk
MAX_GRAPH_DEPTH = 64


def varint(buf: Any, pos: int, end: int) -> tuple[int, int]:
    """``(value, next position)`` of the varint at ``pos``; ValueError when malformed."""
    value = 0
    shift = 0
    while True:
        if pos >= end or shift > 63:
            raise ValueError("bad varint")
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, pos
        shift += 7


def _tag(buf: Any, pos: int, end: int) -> tuple[int, int, int]:
    tag, pos = varint(buf, pos, end)
    num, wire = tag >> 3, tag & 7
    if not 1 <= num <= MAX_FIELD_NUMBER:
        raise ValueError(f"field number {num} out of range")
    return num, wire, pos


def _skip_group(buf: Any, num: int, pos: int, end: int, depth: int) -> tuple[int, int, int]:
    """``(content start, content end, position after the end-group tag)`` of a group
    whose start tag (field ``num``) ended at ``pos``."""
    if depth > MAX_GROUP_DEPTH:
        raise ValueError("groups nested too deep")
    start = pos
    while True:
        here = pos
        inner, wire, pos = _tag(buf, pos, end)
        if wire == 4:
            if inner != num:
                raise ValueError("end-group tag of another field")
            return start, here, pos
        pos = _payload(buf, inner, wire, pos, end, depth + 1)[2]


def _payload(buf: Any, num: int, wire: int, pos: int, end: int, depth: int) -> tuple[int, int, int]:
    """``(payload start, payload end, next field's position)`` of a field whose tag
    ended at ``pos``."""
    if wire == 0:
        _v, nxt = varint(buf, pos, end)
        return pos, nxt, nxt
    if wire == 1:
        nxt = pos + 8
    elif wire == 2:
        n, pos = varint(buf, pos, end)
        nxt = pos + n
    elif wire == 5:
        nxt = pos + 4
    elif wire == 3:
        return _skip_group(buf, num, pos, end, depth)
    else:  # 4 outside a group, or 6/7
        raise ValueError(f"unexpected wire type {wire}")
    if nxt > end:
        raise ValueError("field runs past its message")
    return pos, nxt, nxt


def fields(buf: Any, start: int, end: int) -> Iterator[tuple[int, int, int, int]]:
    """``(field number, wire type, payload start, payload end)`` of one message's fields;
    ValueError when they do not tile ``[start, end)`` exactly.

    The walk accepts what protobuf's parser accepts: any field number in range with any
    wire type, groups (wire type 3, skipped to their end tag) included. A field whose wire
    type is not the one ``onnx.proto`` declares for its number is an unknown field to
    protobuf (it parses and is ignored), so callers match the number *and* the wire type."""
    pos = start
    while pos < end:
        num, wire, pos = _tag(buf, pos, end)
        start, stop, pos = _payload(buf, num, wire, pos, end, 0)
        yield num, wire, start, stop


def looks_like_model(head: bytes, *, strict: bool = False) -> bool:
    """True when ``head`` starts like a serialized ModelProto: every field that fits in
    it has a ModelProto field number and the right wire type, and ``ir_version`` (when
    present) is plausible. ``strict`` (recognising a model by content alone, whatever
    its name) also asks for what every exporter writes: ``ir_version`` first and at
    least three such fields."""
    if strict and not head.startswith(b"\x08"):
        return False
    pos = 0
    count = 0
    end = len(head)
    while pos < end:
        try:
            tag, pos = varint(head, pos, end)
            num, wire = tag >> 3, tag & 7
            if MODEL_FIELDS.get(num) != wire:
                return False
            value, pos = varint(head, pos, end)
        except ValueError:
            break
        if num == 1 and not 1 <= value <= 100:
            return False
        if wire == 2:
            pos += value
        count += 1
    return count >= 3 if strict else count > 0


def parses_as_model(buf: Any) -> bool:
    """True when ``buf`` as a whole parses as a protobuf message with a graph or a
    function in it: what ``onnx.load`` takes for a model whatever the file is named (it
    looks at no suffix and ignores unknown fields and fields of the wrong wire type).

    Raises:
        ValueError: more than :data:`MAX_TOP_FIELDS` top-level fields tile so far (the
            bytes may be a model; the caller must not call them clean on a guess).
    """
    found = False
    count = 0
    try:
        for num, wire, _s, _e in fields(buf, 0, len(buf)):
            count += 1
            if count > MAX_TOP_FIELDS:
                raise OverflowError
            if wire == 2 and num in (MODEL_GRAPH, MODEL_FUNCTIONS):
                found = True
    except OverflowError:
        raise ValueError(f"more than {MAX_TOP_FIELDS} top-level protobuf fields") from None
    except ValueError:
        return False
    return found


def is_onnx_file(head: bytes, name: str) -> bool:
    """A file named ``.onnx`` whose first fields are a ModelProto's (how the handler
    and the scanner recognise a model)."""
    return name.lower().endswith(ONNX_SUFFIX) and looks_like_model(head)


def raw_data_spans(buf: Any) -> list[tuple[int, int] | None] | None:
    """Where each main-graph initializer's ``raw_data`` lies in the serialized model:
    ``(offset, length)`` per initializer in order (None for one without raw_data), or
    None when the bytes cannot be walked. This lets in-file tensors be views of the
    memory map instead of copies out of the parsed message."""
    spans: list[tuple[int, int] | None] = []
    try:
        for num, wire, gs, ge in fields(buf, 0, len(buf)):
            if num != MODEL_GRAPH or wire != 2:  # repeated occurrences merge
                continue
            for gnum, gwire, ts, te in fields(buf, gs, ge):
                if gnum != GRAPH_INITIALIZER or gwire != 2:
                    continue
                found = None
                for tnum, twire, rs, re_ in fields(buf, ts, te):
                    if tnum == TENSOR_RAW_DATA and twire == 2:  # last one wins
                        found = (rs, re_ - rs)
                spans.append(found)
    except ValueError:
        return None
    return spans


@dataclass(frozen=True)
class ExternalLocation:
    """One tensor whose bytes live in another file: its name, the ``location`` entry as
    written, and the offset of the TensorProto in the model file."""

    tensor: str
    location: str
    offset: int


def _text(buf: Any, s: int, e: int) -> str:
    return bytes(buf[s:e]).decode("utf-8", "replace")


def _fields_of(buf: Any, spans: list[tuple[int, int]]) -> Iterator[tuple[int, int, int, int]]:
    """The fields of one message serialized in several pieces: protobuf merges every
    occurrence of a singular message field into one message, which reads as the
    concatenation of the pieces (later scalars win, repeated fields append)."""
    for s, e in spans:
        yield from fields(buf, s, e)


def _tensor_location(buf: Any, spans: list[tuple[int, int]]) -> ExternalLocation | None:
    name = ""
    external = False
    location = None
    for num, wire, ps, pe in _fields_of(buf, spans):
        if num == TENSOR_NAME and wire == 2:
            name = _text(buf, ps, pe)
        elif num == TENSOR_DATA_LOCATION and wire == 0:
            external = varint(buf, ps, pe)[0] == DATA_LOCATION_EXTERNAL
        elif num == TENSOR_EXTERNAL_DATA and wire == 2:
            key = value = None
            for knum, kwire, ks, ke in fields(buf, ps, pe):
                if knum == ENTRY_KEY and kwire == 2:
                    key = _text(buf, ks, ke)
                elif knum == ENTRY_VALUE and kwire == 2:
                    value = _text(buf, ks, ke)
            if key == "location" and value is not None:
                location = value
    # external without a location: the loader joins "" to the model's folder and fails;
    # reported as the empty path it is, never skipped
    return ExternalLocation(name, location or "", spans[0][0]) if external else None


def external_locations(buf: Any) -> list[ExternalLocation]:
    """Every external-data location of the model in ``buf``: initializers, sparse
    initializers, tensors held by node attributes, in the main graph, every subgraph and
    every function. ValueError when the bytes are not a walkable ModelProto.

    A singular tensor field given more than once (``AttributeProto.t``,
    ``sparse_tensor``, a sparse tensor's ``values``/``indices``) is one tensor merged from
    its pieces, as protobuf parses it: a ``data_location`` in one piece and a
    ``location`` in another make one external tensor."""
    return _LocationWalk(buf).model()


class _LocationWalk:
    """The walk of :func:`external_locations`. A class, not nested functions: closures
    that call each other (graph -> node -> graph) are a reference cycle holding ``buf``,
    the scanned file's mapping, kept open until the cyclic collector reaches it."""

    def __init__(self, buf: Any) -> None:
        self.buf = buf
        self.out: list[ExternalLocation] = []

    def model(self) -> list[ExternalLocation]:
        buf = self.buf
        for num, wire, ps, pe in fields(buf, 0, len(buf)):
            if wire != 2:
                continue
            if num == MODEL_GRAPH:
                self.graph(ps, pe, 0)
            elif num == MODEL_FUNCTIONS:
                for fnum, fwire, ns, ne in fields(buf, ps, pe):
                    if fnum == FUNCTION_NODE and fwire == 2:
                        self.node(ns, ne, 1)
        return self.out

    def tensor(self, spans: list[tuple[int, int]]) -> None:
        if spans:
            loc = _tensor_location(self.buf, spans)
            if loc is not None:
                self.out.append(loc)

    def sparse(self, spans: list[tuple[int, int]]) -> None:
        parts: dict[int, list[tuple[int, int]]] = {SPARSE_VALUES: [], SPARSE_INDICES: []}
        for num, wire, ps, pe in _fields_of(self.buf, spans):
            if num in parts and wire == 2:
                parts[num].append((ps, pe))
        self.tensor(parts[SPARSE_VALUES])
        self.tensor(parts[SPARSE_INDICES])

    def node(self, s: int, e: int, depth: int) -> None:
        buf = self.buf
        for num, wire, as_, ae in fields(buf, s, e):
            if num != NODE_ATTRIBUTE or wire != 2:
                continue
            single_t: list[tuple[int, int]] = []
            single_sparse: list[tuple[int, int]] = []
            for anum, awire, ps, pe in fields(buf, as_, ae):
                if awire != 2:
                    continue
                if anum == ATTR_T:
                    single_t.append((ps, pe))
                elif anum == ATTR_TENSORS:
                    self.tensor([(ps, pe)])
                elif anum == ATTR_SPARSE_TENSOR:
                    single_sparse.append((ps, pe))
                elif anum == ATTR_SPARSE_TENSORS:
                    self.sparse([(ps, pe)])
                elif anum in (ATTR_G, ATTR_GRAPHS):
                    self.graph(ps, pe, depth + 1)
            self.tensor(single_t)
            if single_sparse:
                self.sparse(single_sparse)

    def graph(self, s: int, e: int, depth: int) -> None:
        if depth > MAX_GRAPH_DEPTH:
            raise ValueError("subgraphs nested too deep")
        for num, wire, ps, pe in fields(self.buf, s, e):
            if wire != 2:
                continue
            if num == GRAPH_INITIALIZER:
                self.tensor([(ps, pe)])
            elif num == GRAPH_SPARSE_INITIALIZER:
                self.sparse([(ps, pe)])
            elif num == GRAPH_NODE:
                self.node(ps, pe, depth)
