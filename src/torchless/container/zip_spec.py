"""The zip record layouts (signatures, struct layouts of the local header, central-directory
entry, end records and zip64 locator), the record flags torch refuses, and the rules of
miniz 3.0.2 that every zip reader here shares: where the end record is
(:func:`locate_eocd`), the zip64 end record it follows (:func:`zip64_record`), zip64
extra fields, and its heap-sorted name index (:func:`miniz_heapsort`).

One place for these facts: the readers (:mod:`.zip_read`, :mod:`.pyzip`), the writer
(:mod:`.zip_write`), the differentials and the DCP item directory parser use them.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

from ..core.errors import FormatError, TruncatedError
from ..io.source import ByteSource

LOCAL_SIG = b"PK\x03\x04"
LOCAL_SIG_U32 = struct.unpack("<I", LOCAL_SIG)[0]
CENTRAL_SIG = b"PK\x01\x02"
EOCD_SIG = b"PK\x05\x06"
EOCD64_SIG = b"PK\x06\x06"
LOC64_SIG = b"PK\x06\x07"
DESC_SIG = b"PK\x07\x08"

LOCAL_HEADER = struct.Struct("<4sHHHHHIIIHH")  # 30 bytes
CENTRAL_HEADER = struct.Struct("<4sHHHHHHIIIHHHHHII")  # 46 bytes
EOCD_RECORD = struct.Struct("<4sHHHHIIH")  # 22 bytes
EOCD64_RECORD = struct.Struct("<4sQHHIIQQQQ")  # 56 bytes
LOC64_RECORD = struct.Struct("<4sIQI")  # 20 bytes

MAX32 = 0xFFFFFFFF
#: general-purpose flag bits of a record that torch's reader refuses (miniz 3.0.2
#: ``mz_zip_file_stat_internal``), each with what it means and miniz's error for it
REFUSED_FLAG_BITS = (
    (0x1, "encrypted (flag bit 0)", "unsupported encryption"),
    (0x20, "compressed patched data (flag bit 5)", "unsupported feature"),
    (0x40, "strong encryption (flag bit 6)", "unsupported encryption"),
)
REFUSED_FLAGS = sum(bit for bit, _what, _miniz in REFUSED_FLAG_BITS)


def is_zip(head: bytes) -> bool:
    """True when ``head`` starts like a zip (torch's ``_is_zipfile`` test)."""
    return head[:4] == LOCAL_SIG


@dataclass(slots=True)
class ZipEntry:
    """One central-directory entry (offsets are absolute in the file)."""

    index: int
    name: str
    raw_name: bytes
    header_offset: int
    compressed_size: int
    size: int
    crc: int
    method: int
    flags: int
    central_offset: int
    extra: bytes = b""
    external_attr: int = 0
    _data_offset: int | None = field(default=None, repr=False)

    @property
    def is_directory(self) -> bool:
        """miniz's test: a name ending in ``/`` or the DOS directory attribute (0x10).
        miniz extracts nothing for such a record: torch hands back uninitialized memory."""
        return self.raw_name.endswith(b"/") or bool(self.external_attr & 0x10)


def zip64_extra(extra: bytes, usize: int, csize: int, hoff: int, path: str, off: int) -> tuple[int, int, int]:
    """miniz ``mz_zip_file_stat_internal``: the first 0x0001 field supplies, in order, the
    uncompressed size, compressed size and header offset that are 0xFFFFFFFF."""
    p = 0
    n = len(extra)
    while p < n:
        if n - p < 4:
            raise FormatError("corrupt extra field (framing)", path=path, offset=off)
        hid, hlen = struct.unpack_from("<HH", extra, p)
        if hlen + 4 > n - p:
            raise FormatError("corrupt extra field (length)", path=path, offset=off)
        if hid == 0x0001:
            body = extra[p + 4 : p + 4 + hlen]
            q = 0
            vals = []
            for cur in (usize, csize, hoff):
                if cur == MAX32:
                    if q + 8 > len(body):
                        raise FormatError("zip64 extra field too short", path=path, offset=off)
                    vals.append(struct.unpack_from("<Q", body, q)[0])
                    q += 8
                else:
                    vals.append(cur)
            return vals[0], vals[1], vals[2]
        p += 4 + hlen
    return usize, csize, hoff


def locate_eocd(src: ByteSource) -> int | None:
    """Offset of the end record miniz 3.0.2 finds (``mz_zip_reader_locate_header_sig``).

    miniz scans backwards in 4096-byte windows that overlap by 3 bytes and takes the last
    ``PK\\x05\\x06`` with at least 22 bytes after it (the comment length is not
    checked); it gives up after the first window that starts 65557 or more bytes from
    the end, so it may look up to ~4 KiB further back than Python's zipfile. When the next
    window would start before offset 0, miniz's unsigned arithmetic makes its read fail:
    the head of the file (before ``size - 4096 - 4093k``) is never searched.
    """
    size = src.size
    if size < EOCD_RECORD.size:
        return None
    cur = max(size - 4096, 0)
    while True:
        n = min(4096, size - cur)
        # candidates: i in [0, n-4] with size - (cur+i) >= 22
        hi = min(n - 4, size - EOCD_RECORD.size - cur)
        if hi >= 0:
            window = bytes(src.view(cur, hi + 4))
            i = window.rfind(EOCD_SIG)
            if i >= 0:
                return cur + i
        if cur == 0 or size - cur >= 0xFFFF + EOCD_RECORD.size:
            return None
        if cur < 4093:
            # miniz computes MZ_MAX(cur - 4093, 0) in unsigned arithmetic: the offset wraps
            # negative and the read fails, so the first bytes of the file are never searched
            return None
        cur -= 4093


def zip64_record(src: ByteSource, eocd: int) -> tuple[int, tuple[Any, ...], tuple[Any, ...]] | None:
    """``(offset, locator, record)`` of the zip64 end record miniz follows, or None.

    miniz looks for the locator only when the end record sits at offset >= 76 (locator +
    zip64 record could fit before it), reads the record where the locator points (not at
    ``eocd - 76``), refuses a locator pointing past ``size - 56``, and ignores a
    locator whose target lacks the zip64 signature.
    """
    if eocd < LOC64_RECORD.size + EOCD64_RECORD.size:
        return None
    loc = LOC64_RECORD.unpack_from(src.view(eocd - LOC64_RECORD.size, LOC64_RECORD.size))
    if loc[0] != LOC64_SIG:
        return None
    e64_off = loc[2]
    if e64_off > src.size - EOCD64_RECORD.size:
        raise TruncatedError(
            "zip64 locator points past the end of the file",
            path=src.name,
            offset=eocd - LOC64_RECORD.size,
            expected=f"<= {src.size - EOCD64_RECORD.size}",
            found=e64_off,
        )
    rec = EOCD64_RECORD.unpack_from(src.view(e64_off, EOCD64_RECORD.size))
    if rec[0] != EOCD64_SIG:
        return None
    return e64_off, loc, rec


def miniz_heapsort(keys: list[bytes]) -> list[int]:
    """miniz's ``mz_zip_reader_sort_central_dir_offsets_by_filename`` (heap sort)."""
    size = len(keys)
    idx = list(range(size))
    if size <= 1:
        return idx

    def sift(root: int, end: int) -> None:
        while True:
            child = (root << 1) + 1
            if child >= end:
                return
            if child + 1 < end and keys[idx[child]] < keys[idx[child + 1]]:
                child += 1
            if not keys[idx[root]] < keys[idx[child]]:
                return
            idx[root], idx[child] = idx[child], idx[root]
            root = child

    start = (size - 2) >> 1
    while True:
        sift(start, size)
        if start == 0:
            break
        start -= 1
    end = size - 1
    while end > 0:
        idx[end], idx[0] = idx[0], idx[end]
        sift(0, end)
        end -= 1
    return idx
