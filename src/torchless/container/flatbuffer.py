"""A bounds-checked reader of FlatBuffers binaries (the wire format, no schema compiler).

A FlatBuffers buffer starts with a ``uoffset`` (u32) to the root table, optionally
followed by a 4-byte file identifier. A table starts with a ``soffset`` (i32): the table
position minus that value is its vtable, ``u16 vtable size, u16 table size, u16 field
offset...``; a field offset of 0 (or a slot past the vtable) means the field is absent
and takes its schema default. Offsets to strings, vectors and sub-tables are ``uoffset``
relative to where they are stored; a vector or string is a u32 length then its items
(strings are NUL-terminated). A union is two fields: a u8 type (0 = none) and an offset
to the member (a table, or a struct stored out of line). All integers are little-endian.

Every read here checks its bounds and raises :class:`~torchless.core.errors.FormatError`
naming the byte offset, so a hostile buffer (truncated, bit-flipped, offsets pointing
outside) never raises anything else. Nothing here knows a schema: the format modules
(``formats/torchscript/flatbuffer.py``, ``formats/executorch``) name the fields by index.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

from ..core.errors import FormatError, TruncatedError

__all__ = ["FlatBuffer", "Table"]

_SCALARS = {"b": 1, "B": 1, "?": 1, "h": 2, "H": 2, "i": 4, "I": 4, "q": 8, "Q": 8, "f": 4, "d": 8}


class FlatBuffer:
    """A buffer to read tables from.

    Args:
        buf: the bytes (bytes, bytearray or memoryview; kept, never copied).
        name: the file or member name errors report.
        identifier: when given, the 4 bytes that must follow the root offset.
        what: the format's name in messages (``"flatbuffer module"``).
    """

    def __init__(self, buf: Any, name: str = "<flatbuffer>", *, what: str = "flatbuffer") -> None:
        self.b = memoryview(buf).cast("B") if not isinstance(buf, bytes) else buf
        self.size = len(self.b)
        self.name = name
        self.what = what

    # -- primitives --------------------------------------------------------------------
    def _err(self, message: str, offset: int, **kw: Any) -> FormatError:
        return FormatError(f"{self.what}: {message}", path=self.name, offset=offset, **kw)

    def check(self, pos: int, n: int, what: str) -> None:
        """Raise unless ``[pos, pos + n)`` lies inside the buffer."""
        if pos < 0 or n < 0 or pos + n > self.size:
            if pos >= 0 and pos <= self.size and pos + n > self.size:
                raise TruncatedError(
                    f"{self.what}: {what} runs past the end of the buffer",
                    path=self.name,
                    offset=pos,
                    expected=f"{n} bytes",
                    found=f"{self.size - pos}",
                )
            raise self._err(f"{what} offset out of range", pos, expected=f"0..{self.size}")

    def scalar(self, pos: int, fmt: str, what: str = "value") -> Any:
        n = _SCALARS[fmt]
        self.check(pos, n, what)
        return struct.unpack_from("<" + fmt, self.b, pos)[0]

    def uoffset(self, pos: int, what: str = "offset") -> int:
        """The position a ``uoffset`` stored at ``pos`` points to."""
        return pos + int(self.scalar(pos, "I", what))

    def root(self, identifier: bytes | None = None) -> Table:
        """The root table (after checking the file identifier, when given)."""
        if self.size < 8:
            raise TruncatedError(
                f"{self.what}: shorter than a root offset and identifier", path=self.name, offset=0, found=self.size
            )
        if identifier is not None and bytes(self.b[4:8]) != identifier:
            raise self._err("wrong file identifier", 4, expected=identifier.decode("latin-1"), found=bytes(self.b[4:8]))
        return self.table_at(self.uoffset(0, "root offset"), "root table")

    def table_at(self, pos: int, what: str = "table") -> Table:
        vt = pos - self.scalar(pos, "i", what)
        vsize = self.scalar(vt, "H", f"vtable of {what}")
        tsize = self.scalar(vt + 2, "H", f"vtable of {what}")
        if vsize < 4 or vsize % 2:
            raise self._err(f"vtable of {what} has a bad size", vt, expected="an even size >= 4", found=vsize)
        self.check(vt, vsize, f"vtable of {what}")
        self.check(pos, max(tsize, 4), what)
        return Table(self, pos, vt, vsize, tsize, what)


class Table:
    """One table: fields by their index in the schema (0-based, declaration order; a
    union takes two indices, its type then its value)."""

    __slots__ = ("fb", "pos", "vt", "vsize", "tsize", "what")

    def __init__(self, fb: FlatBuffer, pos: int, vt: int, vsize: int, tsize: int, what: str) -> None:
        self.fb, self.pos, self.vt, self.vsize, self.tsize, self.what = fb, pos, vt, vsize, tsize, what

    def field(self, index: int, size: int = 4) -> int | None:
        """The absolute position of field ``index``, or None when absent."""
        slot = 4 + 2 * index
        if slot + 2 > self.vsize:
            return None
        off = int(self.fb.scalar(self.vt + slot, "H"))
        if not off:
            return None
        if off + size > self.tsize:
            raise self.fb._err(
                f"field {index} of {self.what} lies outside its table", self.vt + slot, expected=f"< {self.tsize}", found=off
            )
        return int(self.pos + off)

    def has(self, index: int) -> bool:
        return self.field(index, 1) is not None

    def scalar(self, index: int, fmt: str, default: Any = 0) -> Any:
        f = self.field(index, _SCALARS[fmt])
        return default if f is None else self.fb.scalar(f, fmt, f"field {index} of {self.what}")

    def _target(self, index: int) -> int | None:
        f = self.field(index)
        return None if f is None else self.fb.uoffset(f, f"field {index} of {self.what}")

    def table(self, index: int, what: str | None = None) -> Table | None:
        p = self._target(index)
        return None if p is None else self.fb.table_at(p, what or f"field {index} of {self.what}")

    def struct(self, index: int, size: int) -> int | None:
        """Position of an inline struct field of ``size`` bytes."""
        return self.field(index, size)

    def _vector(self, index: int, item: int, what: str) -> tuple[int, int] | None:
        p = self._target(index)
        if p is None:
            return None
        n = self.fb.scalar(p, "I", what)
        if n > (self.fb.size - p - 4) // max(item, 1):
            raise TruncatedError(
                f"{self.fb.what}: {what} is longer than the buffer",
                path=self.fb.name,
                offset=p,
                expected=f"at most {(self.fb.size - p - 4) // max(item, 1)} items",
                found=n,
            )
        return p + 4, n

    def string(self, index: int) -> str | None:
        b = self.bytes(index, kind="string")
        if b is None:
            return None
        try:
            return bytes(b).decode("utf-8")
        except UnicodeDecodeError as e:
            p = self._target(index)
            raise self.fb._err(f"string field {index} of {self.what} is not UTF-8", (p or 0) + 4 + e.start) from None

    def bytes(self, index: int, *, kind: str = "byte vector") -> memoryview | None:
        """A ``[ubyte]`` vector (or a string's bytes) as a zero-copy view."""
        v = self.span(index, kind=kind)
        if v is None:
            return None
        start, n = v
        return memoryview(self.fb.b)[start : start + n]

    def span(self, index: int, *, kind: str = "byte vector") -> tuple[int, int] | None:
        """``(position, length)`` of a ``[ubyte]`` vector, checked: where its bytes lie,
        for a reader that takes them from its source later instead of keeping a view."""
        return self._vector(index, 1, f"{kind} field {index} of {self.what}")

    def vector_pos(self, index: int, item: int = 1) -> tuple[int, int] | None:
        """``(position of the first item, count)`` of a vector field, checked."""
        return self._vector(index, item, f"vector field {index} of {self.what}")

    def scalars(self, index: int, fmt: str) -> np.ndarray:
        """A vector of scalars as a little-endian NumPy array (empty when absent)."""
        n_item = _SCALARS[fmt]
        v = self._vector(index, n_item, f"vector field {index} of {self.what}")
        dt = np.dtype("<" + ("?" if fmt == "?" else fmt))
        if v is None:
            return np.zeros(0, dt)
        start, n = v
        return np.frombuffer(self.fb.b, dtype=dt, count=n, offset=start)

    def tables(self, index: int, what: str | None = None) -> list[Table]:
        v = self._vector(index, 4, f"table vector field {index} of {self.what}")
        if v is None:
            return []
        start, n = v
        w = what or f"item of field {index} of {self.what}"
        return [self.fb.table_at(self.fb.uoffset(start + 4 * i, w), w) for i in range(n)]

    def strings(self, index: int) -> list[str]:
        v = self._vector(index, 4, f"string vector field {index} of {self.what}")
        if v is None:
            return []
        start, n = v
        out = []
        for i in range(n):
            p = self.fb.uoffset(start + 4 * i, "string")
            ln = self.fb.scalar(p, "I", "string length")
            self.fb.check(p + 4, ln, "string")
            try:
                out.append(bytes(self.fb.b[p + 4 : p + 4 + ln]).decode("utf-8"))
            except UnicodeDecodeError:
                raise self.fb._err("string is not UTF-8", p + 4) from None
        return out

    def union(self, type_index: int) -> tuple[int, int | None]:
        """``(type, position of the member)`` of the union whose type field is
        ``type_index`` (its value is the next field); ``(0, None)`` when unset."""
        kind = self.scalar(type_index, "B", 0)
        if not kind:
            return 0, None
        return kind, self._target(type_index + 1)
