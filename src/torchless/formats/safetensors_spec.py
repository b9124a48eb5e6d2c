"""The ``.safetensors`` layout: a little-endian u64 header length, a JSON header, the data.

The reader (:mod:`.safetensors`), DCP's ``SerializationFormat.SAFETENSORS`` items and the
scanner take the layout from here: the sniff and the header's rules (no holes, no
overlaps, no duplicate names, sizes consistent with shapes), checked without building
any tensor.
"""

from __future__ import annotations

import struct
from typing import Any

from ..core import jsonsafe
from ..core.dtypes import DTYPES
from ..core.errors import FormatError, LimitError, TruncatedError, UnsupportedError, short_repr
from ..core.source import ByteSource
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
    header = jsonsafe.loads(
        src.view(8, n),
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
    entries: list[HeaderEntry] = []
    for name, info in header.items():
        if not isinstance(info, dict) or set(info) - {"dtype", "shape", "data_offsets"}:
            raise FormatError(f"bad header entry for {name!r}", path=path, member=name)
        code = info.get("dtype")
        if not isinstance(code, str) or code not in ST_DTYPES:
            raise UnsupportedError(f"safetensors dtype {short_repr(code, 40)}", path=path, member=name)
        dt = DTYPES[ST_DTYPES[code]]
        shape = info.get("shape")
        offs = info.get("data_offsets")
        if not isinstance(shape, list) or not all(type(s) is int and s >= 0 for s in shape):
            raise FormatError("bad shape", path=path, member=name, found=short_repr(shape, 60))
        if not isinstance(offs, list) or len(offs) != 2 or not all(type(o) is int for o in offs) or not 0 <= offs[0] <= offs[1]:
            raise FormatError("bad data_offsets", path=path, member=name, found=short_repr(offs, 60))
        numel = 1
        for s in shape:
            numel *= s
        if offs[1] - offs[0] != numel * dt.itemsize:
            raise FormatError(
                "tensor size does not match its shape",
                path=path,
                member=name,
                expected=numel * dt.itemsize,
                found=offs[1] - offs[0],
            )
        if offs[1] > data_len:
            raise TruncatedError("tensor data runs past the end of the file", path=path, member=name, offset=base + offs[0])
        entries.append((name, code, shape, (offs[0], offs[1])))
    entries.sort(key=lambda x: (x[3][0], x[3][1], x[0]))
    pos = 0
    for name, _c, _s, (b, e) in entries:
        if b != pos:
            raise FormatError("tensor data has a hole or overlap", path=path, member=name, offset=base + b, expected=pos, found=b)
        pos = e
    if pos != data_len:
        raise FormatError("trailing bytes after the last tensor", path=path, offset=base + pos, expected=data_len, found=pos)
    return meta, entries, n
