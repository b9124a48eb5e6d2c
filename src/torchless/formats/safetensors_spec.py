"""The ``.safetensors`` layout: a little-endian u64 header length, a JSON header, the data.

The reader (:mod:`.safetensors`), DCP's ``SerializationFormat.SAFETENSORS`` items and the
scanner take the layout from here: the sniff and the header's rules (no holes, no
overlaps, no duplicate names, sizes consistent with shapes), checked without building
any tensor.
"""

from __future__ import annotations

import struct
from itertools import chain, islice
from math import prod
from operator import lt, mul, sub
from typing import Any

from ..core import jsonsafe
from ..core.dtypes import DTYPES
from ..core.errors import FormatError, LimitError, TruncatedError, UnsupportedError, short_repr
from ..core.settings import SETTINGS
from ..io.source import ByteSource
from .pt.spec import ZIP_MAGIC

__all__ = ["ST_DTYPES", "MAX_HEADER", "METADATA_KEY", "HeaderEntry", "check_name", "is_safetensors_head", "parse_header"]

#: safetensors dtype code -> torch dtype name
ST_DTYPES = {
    "BOOL": "bool",
    "U8": "uint8",
    "I8": "int8",
    "I16": "int16",
    "U16": "uint16",
    "F16": "float16",
    "BF16": "bfloat16",
    "I32": "int32",
    "U32": "uint32",
    "F32": "float32",
    "F64": "float64",
    "I64": "int64",
    "U64": "uint64",
    "C64": "complex64",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
    "F8_E4M3FNUZ": "float8_e4m3fnuz",
    "F8_E5M2FNUZ": "float8_e5m2fnuz",
    "F8_E8M0": "float8_e8m0fnu",
}
#: the safetensors package's header size limit
MAX_HEADER = 100 * 1024 * 1024
#: the header's string -> string map
METADATA_KEY = "__metadata__"

#: (name, dtype code, shape, (begin, end) relative to the data start), in the file's order
HeaderEntry = tuple[str, str, list[int], tuple[int, int]]


def check_name(name: str, path: Any = None) -> None:
    """Refuse a tensor name the safetensors package cannot read back: the header's
    metadata key (the package then fails on the whole header) and names that are not
    valid UTF-8 (lone surrogates: the header is not JSON it can parse).

    Raises:
        UsageError: naming the tensor (escaped).
    """
    from ..core.errors import UsageError
    from ..core.tensor import require_utf8_name

    if name == METADATA_KEY:
        raise UsageError(
            f"a tensor cannot be named {METADATA_KEY!r} in a safetensors file (the key of the header's metadata)",
            path=path,
            member=name,
            hint="rename the tensor",
        )
    require_utf8_name(name, path, fmt="safetensors")


def is_safetensors_head(head: bytes) -> bool:
    """True when ``head`` starts a safetensors blob: a u64 header length in range, then
    ``{`` (never a ``torch.save`` zip, which DCP items also are)."""
    if len(head) < 9 or head[:4] == ZIP_MAGIC or head[8:9] != b"{":
        return False
    (n,) = struct.unpack("<Q", head[:8])
    return 2 <= n <= MAX_HEADER


def _no_dups(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise FormatError(f"duplicate tensor name {k!r} in the safetensors header")
        out[k] = v
    return out


#: the keys of a tensor's header entry
_ENTRY_KEYS = frozenset(("dtype", "shape", "data_offsets"))


def parse_header(src: ByteSource) -> tuple[dict[str, str], list[HeaderEntry], int]:
    """``(metadata, entries by data offset, header length)`` of a safetensors blob, every
    rule of the format checked.

    Raises:
        TruncatedError, FormatError, LimitError, UnsupportedError: malformed or hostile headers.
    """
    path = src.name
    src.check(0, 8, what="header length")
    (n,) = struct.unpack("<Q", src.read_at(0, 8))
    if n > MAX_HEADER:
        raise LimitError("safetensors header too large", path=path, offset=0, expected=f"<= {MAX_HEADER}", found=n)
    src.check(8, n, what="safetensors header")
    view = src.view(8, n)
    # One plain json.loads (C, no Python call per object), then an exact duplicate check:
    # every key of the text is followed by one ':' outside strings and no other ':' lies
    # outside strings, so as many ':' bytes in the text as keys in the parsed objects
    # means no key was given twice (a ':' inside a string only adds to the count: then the
    # header is parsed again with a hook that names the duplicate, if there is one). The
    # nesting is not measured first: the structure checked below is 3 levels deep, and
    # deeper text ends in a LimitError from the parser's own recursion limit.
    header = None
    if SETTINGS.safetensors_header:
        header = jsonsafe.loads(view, what="safetensors header", path=path, offset=8, max_bytes=MAX_HEADER, max_depth=None)
        if not isinstance(header, dict):
            raise FormatError("header is not a JSON object", path=path, offset=8)
    # (the keys of the top level and of the objects in it: a deeper object, where its own
    # keys would be missed, breaks the entry rules checked below, with an error either way)
    if header is None or bytes(view).count(b":") != len(header) + sum(len(v) for v in header.values() if type(v) is dict):
        header = jsonsafe.loads(
            view,
            what="safetensors header",
            path=path,
            offset=8,
            max_bytes=MAX_HEADER,
            max_depth=8,
            object_pairs_hook=_no_dups,
        )
        if not isinstance(header, dict):
            raise FormatError("header is not a JSON object", path=path, offset=8)
    meta = header.pop(METADATA_KEY, None) or {}
    if not isinstance(meta, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items()):
        raise FormatError(f"{METADATA_KEY} must map strings to strings", path=path, offset=8)
    base = 8 + n
    data_len = src.size - base
    rows = _rows(header, data_len) if SETTINGS.safetensors_header else None
    if rows is None:  # a rule is broken: the row-by-row checks name the entry
        rows = _rows_one_by_one(header, data_len, path, base)
    names, codes, shapes, begins, ends = rows
    if len(names) > 1 and not all(map(lt, begins, islice(begins, 1, None))):  # (written in order: nothing to sort)
        keys = list(zip(begins, ends, names, strict=True))
        order = sorted(range(len(names)), key=keys.__getitem__)
        if order != list(range(len(names))):
            names, codes, shapes = [names[i] for i in order], [codes[i] for i in order], [shapes[i] for i in order]
            begins, ends = [begins[i] for i in order], [ends[i] for i in order]
    if begins[1:] != ends[:-1] or (begins and begins[0] != 0):
        pos = 0
        for name, b, e in zip(names, begins, ends, strict=True):
            if b != pos:
                raise FormatError(
                    "tensor data has a hole or overlap", path=path, member=name, offset=base + b, expected=pos, found=b
                )
            pos = e
    pos = ends[-1] if ends else 0
    if pos != data_len:
        raise FormatError("trailing bytes after the last tensor", path=path, offset=base + pos, expected=data_len, found=pos)
    entries: list[HeaderEntry] = list(zip(names, codes, shapes, zip(begins, ends, strict=True), strict=True))
    return meta, entries, n


Rows = tuple[list[str], list[str], list[list[int]], list[int], list[int]]


def _rows(header: dict[str, Any], data_len: int) -> Rows | None:
    """The header's ``(names, codes, shapes, begins, ends)``, each rule of an entry
    checked for all entries at once (C loops); None when one is broken."""
    infos = list(header.values())
    try:
        if infos and (set(map(type, infos)) != {dict} or set(map(len, infos)) != {3}):
            return None
        codes = [d["dtype"] for d in infos]
        shapes = [d["shape"] for d in infos]
        offs = [d["data_offsets"] for d in infos]
        if infos and not (set(codes) <= _CODES.keys() and set(map(type, shapes)) == {list} and set(map(type, offs)) == {list}):
            return None
        if infos and set(map(len, offs)) != {2}:
            return None
        sizes = list(chain.from_iterable(shapes))
        if sizes and (set(map(type, sizes)) != {int} or min(sizes) < 0):
            return None
        begins = [o[0] for o in offs]
        ends = [o[1] for o in offs]
        if infos and (set(map(type, begins)) != {int} or set(map(type, ends)) != {int}):
            return None
        nbytes = list(map(sub, ends, begins))
        if infos and (min(begins) < 0 or min(nbytes) < 0 or max(ends) > data_len):
            return None
        if list(map(mul, map(prod, shapes), map(_CODES.__getitem__, codes))) != nbytes:
            return None
    except (KeyError, TypeError):  # a key missing, an unhashable code
        return None
    return list(header), codes, shapes, begins, ends


def _rows_one_by_one(header: dict[str, Any], data_len: int, path: Any, base: int) -> Rows:
    """What :func:`_rows` gives, entry by entry: raises naming the first broken entry."""
    names: list[str] = []
    codes: list[str] = []
    shapes: list[list[int]] = []
    begins: list[int] = []
    ends: list[int] = []
    for name, info in header.items():
        if not isinstance(info, dict) or set(info) - _ENTRY_KEYS:
            raise FormatError(f"bad header entry for {name!r}", path=path, member=name)
        code = info.get("dtype")
        if not isinstance(code, str) or code not in ST_DTYPES:
            raise UnsupportedError(f"safetensors dtype {short_repr(code, 40)}", path=path, member=name)
        itemsize = _CODES[code]
        shape = info.get("shape")
        offs = info.get("data_offsets")
        if not isinstance(shape, list) or not all(type(s) is int and s >= 0 for s in shape):
            raise FormatError("bad shape", path=path, member=name, found=short_repr(shape, 60))
        if not isinstance(offs, list) or len(offs) != 2 or not all(type(o) is int for o in offs) or not 0 <= offs[0] <= offs[1]:
            raise FormatError("bad data_offsets", path=path, member=name, found=short_repr(offs, 60))
        if offs[1] - offs[0] != prod(shape) * itemsize:
            raise FormatError(
                "tensor size does not match its shape",
                path=path,
                member=name,
                expected=prod(shape) * itemsize,
                found=offs[1] - offs[0],
            )
        if offs[1] > data_len:
            raise TruncatedError("tensor data runs past the end of the file", path=path, member=name, offset=base + offs[0])
        names.append(name)
        codes.append(code)
        shapes.append(shape)
        begins.append(offs[0])
        ends.append(offs[1])
    return names, codes, shapes, begins, ends


#: dtype code -> bytes per element
_CODES = {code: DTYPES[name].itemsize for code, name in ST_DTYPES.items()}
