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
    "raw_data_spans",
    "ExternalLocation",
    "external_locations",
]

ONNX_SUFFIX = ".onnx"

#: ModelProto field number -> wire type (onnx.proto); a head whose fields all fit is a model
MODEL_FIELDS = {1: 0, 2: 2, 3: 2, 4: 2, 5: 0, 6: 2, 7: 2, 8: 2, 14: 2, 20: 2, 25: 2, 26: 2}

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


def fields(buf: Any, start: int, end: int) -> Iterator[tuple[int, int, int, int]]:
    """``(field number, wire type, payload start, payload end)`` of one message's fields;
    ValueError when they do not tile ``[start, end)`` exactly."""
    pos = start
    while pos < end:
        tag, pos = varint(buf, pos, end)
        num, wire = tag >> 3, tag & 7
        if wire == 0:
            _v, nxt = varint(buf, pos, end)
        elif wire == 1:
            nxt = pos + 8
        elif wire == 2:
            n, pos = varint(buf, pos, end)
            nxt = pos + n
        elif wire == 5:
            nxt = pos + 4
        else:  # groups (3, 4) do not occur in onnx.proto
            raise ValueError("unexpected wire type")
        if nxt > end:
            raise ValueError("field runs past its message")
        yield num, wire, pos, nxt
        pos = nxt


def looks_like_model(head: bytes) -> bool:
    """True when ``head`` starts like a serialized ModelProto: every field that fits in
    it has a ModelProto field number and the right wire type, and ``ir_version`` (when
    present) is plausible."""
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
    return count > 0


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


def _tensor_location(buf: Any, s: int, e: int) -> ExternalLocation | None:
    name = ""
    external = False
    location = None
    for num, wire, ps, pe in fields(buf, s, e):
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
    return ExternalLocation(name, location, s) if external and location is not None else None


def external_locations(buf: Any) -> list[ExternalLocation]:
    """Every external-data location of the model in ``buf``: initializers, sparse
    initializers, tensors held by node attributes, in the main graph, every subgraph and
    every function. ValueError when the bytes are not a walkable ModelProto."""
    out: list[ExternalLocation] = []

    def tensor(s: int, e: int) -> None:
        loc = _tensor_location(buf, s, e)
        if loc is not None:
            out.append(loc)

    def sparse(s: int, e: int) -> None:
        for num, wire, ps, pe in fields(buf, s, e):
            if num in (SPARSE_VALUES, SPARSE_INDICES) and wire == 2:
                tensor(ps, pe)

    def node(s: int, e: int, depth: int) -> None:
        for num, wire, as_, ae in fields(buf, s, e):
            if num != NODE_ATTRIBUTE or wire != 2:
                continue
            for anum, awire, ps, pe in fields(buf, as_, ae):
                if awire != 2:
                    continue
                if anum in (ATTR_T, ATTR_TENSORS):
                    tensor(ps, pe)
                elif anum in (ATTR_SPARSE_TENSOR, ATTR_SPARSE_TENSORS):
                    sparse(ps, pe)
                elif anum in (ATTR_G, ATTR_GRAPHS):
                    graph(ps, pe, depth + 1)

    def graph(s: int, e: int, depth: int) -> None:
        if depth > MAX_GRAPH_DEPTH:
            raise ValueError("subgraphs nested too deep")
        for num, wire, ps, pe in fields(buf, s, e):
            if wire != 2:
                continue
            if num == GRAPH_INITIALIZER:
                tensor(ps, pe)
            elif num == GRAPH_SPARSE_INITIALIZER:
                sparse(ps, pe)
            elif num == GRAPH_NODE:
                node(ps, pe, depth)

    for num, wire, ps, pe in fields(buf, 0, len(buf)):
        if wire != 2:
            continue
        if num == MODEL_GRAPH:
            graph(ps, pe, 0)
        elif num == MODEL_FUNCTIONS:
            for fnum, fwire, ns, ne in fields(buf, ps, pe):
                if fnum == FUNCTION_NODE and fwire == 2:
                    node(ns, ne, 1)
    return out
