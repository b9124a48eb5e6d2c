"""Zip archives read with Python's ``zipfile`` rules (what ``numpy.load`` uses for ``.npz``).

torch reads its archives with miniz (:class:`~torchless.container.zip.ZipReader`); NumPy
opens ``.npz`` files with CPython's ``zipfile``, whose choices differ (CPython 3.11's
``_EndRecData``, ``_EndRecData64``, ``_RealGetContents``, ``ZipFile.open``):

* the end record is the last ``PK\\x05\\x06`` at most 65,558 bytes from the end (the last
  22 bytes first, when they form a record without comment); one with fewer than 22 bytes
  after it makes the archive unreadable;
* a zip64 locator right before it is followed whatever the end record's offset, and the
  zip64 record is read at ``eocd - 76`` (not where the locator points);
* the central directory is taken to end right at the end record (or zip64 record):
  ``concat = eocd - size - offset`` shifts every header offset, so data prepended to an
  archive, or bytes between the directory and the end record, move every member;
* entries are read while bytes remain in the directory, whatever the entry count says;
* names are cut at the first NUL, decoded as UTF-8 (flag 0x800) or cp437; the last entry
  of a name wins; the local header's name must match; every extra field is framed;
* stored and deflated records are read from the *central* sizes, with the CRC-32 checked.

:class:`PyZipReader` reproduces these rules and gives zero-copy views of stored members.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass
from typing import Any

from ..core.errors import ChecksumError, FormatError, LimitError, TorchlessError, TruncatedError, UnsupportedError
from ..io.source import ByteSource, open_source, pieces
from .zip import CENTRAL_SIG, EOCD64_SIG, EOCD_SIG, LOC64_SIG, LOCAL_SIG, check_inflate, inflate_into

__all__ = ["PyZipEntry", "PyZipReader"]

_EOCD = struct.Struct("<4sHHHHIIH")
_EOCD64 = struct.Struct("<4sQHHIIQQQQ")
_LOC64 = struct.Struct("<4sIQI")
_CENTRAL = struct.Struct("<4sBBBBHHHHIIIHHHHHII")
_LOCAL = struct.Struct("<4sBBHHHHIIIHH")
MAX_EXTRACT_VERSION = 63


@dataclass(slots=True)
class PyZipEntry:
    """One ``ZipInfo`` as zipfile builds it (offsets already shifted by ``concat``)."""

    index: int
    filename: str
    orig_filename: str
    header_offset: int
    compress_size: int
    file_size: int
    crc: int
    compress_type: int
    flag_bits: int
    central_offset: int
    comment: bytes = b""


class PyZipReader:
    """Read a zip with CPython 3.11 ``zipfile``'s rules.

    Args:
        source: a path, bytes or ByteSource.
        max_entries: refuse directories with more entries (explicit limit).

    Raises:
        FormatError: where ``zipfile`` raises ``BadZipFile`` (or would fail to open).
    """

    def __init__(self, source: Any, *, max_entries: int = 1_000_000) -> None:
        self.source: ByteSource = open_source(source)
        self.path = self.source.name
        self.entries: list[PyZipEntry] = []
        self.name_to_info: dict[str, PyZipEntry] = {}
        self.zip64 = False
        self._checked: dict[int, bool | TorchlessError] = {}  # entry index -> check()'s outcome
        self._read_directory(max_entries)

    def _bad(self, msg: str, offset: int | None = None, **kw: Any) -> FormatError:
        return FormatError(f"{msg} (Python's zipfile refuses the archive)", path=self.path, offset=offset, **kw)

    # -- end records --------------------------------------------------------------------
    def _end_record(self) -> tuple[list[Any], int]:
        src, size = self.source, self.source.size
        if size < _EOCD.size:
            raise self._bad("file too small to be a zip archive")
        last = src.read_at(size - _EOCD.size, _EOCD.size)
        if last[:4] == EOCD_SIG and last[-2:] == b"\x00\x00":
            return list(_EOCD.unpack(last)), size - _EOCD.size
        start = max(size - (1 << 16) - _EOCD.size, 0)
        data = src.read_at(start, size - start)
        pos = data.rfind(EOCD_SIG)
        if pos < 0:
            raise self._bad("no end-of-central-directory record")
        if pos + _EOCD.size > len(data):
            raise self._bad("end record cut short by the end of the file", start + pos)
        return list(_EOCD.unpack_from(data, pos)), start + pos

    def _zip64(self, eocd: int, rec: list[Any]) -> list[Any]:
        # _EndRecData64: locator at eocd-20, record at the fixed place eocd-76
        if eocd < _LOC64.size:
            return rec
        loc = _LOC64.unpack(self.source.read_at(eocd - _LOC64.size, _LOC64.size))
        if loc[0] != LOC64_SIG:
            return rec
        if loc[1] != 0 or loc[3] > 1:
            raise self._bad("zip archives that span several disks", eocd - _LOC64.size)
        at = eocd - _LOC64.size - _EOCD64.size
        if at < 0:  # the seek before the file's start raises OSError -> BadZipFile
            raise self._bad("zip64 locator without room for a zip64 record", eocd - _LOC64.size)
        r = _EOCD64.unpack(self.source.read_at(at, _EOCD64.size))
        if r[0] != EOCD64_SIG:
            return rec
        self.zip64 = True
        self.eocd64_offset = at
        rec[0] = r[0]
        rec[1], rec[2], rec[3], rec[4], rec[5], rec[6] = r[4], r[5], r[6], r[7], r[8], r[9]
        return rec

    # -- directory ----------------------------------------------------------------------
    def _read_directory(self, max_entries: int) -> None:
        src = self.source
        rec, eocd = self._end_record()
        self.eocd_offset = eocd
        rec = self._zip64(eocd, rec)
        size_cd, offset_cd = rec[5], rec[6]
        concat = eocd - size_cd - offset_cd
        if self.zip64:
            concat -= _EOCD64.size + _LOC64.size
        self.concat = concat
        start = offset_cd + concat
        if start < 0:
            raise self._bad("bad offset for the central directory", eocd)
        self.cd_offset, self.cd_size = start, size_cd
        avail = max(0, min(size_cd, src.size - start))
        cd = src.read_at(start, avail) if avail else b""
        total = 0
        p = 0
        while total < size_cd:
            if p + _CENTRAL.size > len(cd):
                raise self._bad("truncated central directory", start + p)
            f = _CENTRAL.unpack_from(cd, p)
            if f[0] != CENTRAL_SIG:
                raise self._bad("bad magic number for the central directory", start + p)
            flags, method, crc, csize, usize = f[5], f[6], f[9], f[10], f[11]
            nlen, xlen, clen, hoff = f[12], f[13], f[14], f[18]
            q = p + _CENTRAL.size
            raw = cd[q : q + nlen]
            extra = cd[q + nlen : q + nlen + xlen]
            comment = cd[q + nlen + xlen : q + nlen + xlen + clen]
            try:
                orig = raw.decode("utf-8") if flags & 0x800 else raw.decode("cp437")
            except UnicodeDecodeError:
                raise self._bad("entry name is not valid UTF-8", start + p) from None
            if f[3] > MAX_EXTRACT_VERSION:
                raise UnsupportedError(
                    f"zip file version {f[3] / 10:.1f} (Python's zipfile refuses it)", path=self.path, offset=start + p
                )
            usize, csize, hoff = _decode_extra(extra, usize, csize, hoff, self, start + p)
            nul = orig.find("\x00")
            name = orig[:nul] if nul >= 0 else orig
            if len(self.entries) >= max_entries:
                raise LimitError("too many archive entries", path=self.path, expected=f"<= {max_entries}")
            e = PyZipEntry(len(self.entries), name, orig, hoff + concat, csize, usize, crc, method, flags, start + p, comment)
            self.entries.append(e)
            self.name_to_info[name] = e
            total += _CENTRAL.size + nlen + xlen + clen
            p = total

    # -- members ------------------------------------------------------------------------
    def names(self) -> list[str]:
        """``ZipFile.namelist()``: every entry, duplicates included, in directory order."""
        return [e.filename for e in self.entries]

    def getinfo(self, name: str) -> PyZipEntry | None:
        """The entry ``ZipFile.open(name)`` reads (the last one of that name)."""
        return self.name_to_info.get(name)

    def data_offset(self, e: PyZipEntry) -> int:
        """Where ``ZipFile.open`` starts reading the member's data (checks its local header)."""
        src = self.source
        if e.header_offset < 0 or e.header_offset + _LOCAL.size > src.size:
            raise self._bad("truncated file header", e.header_offset)
        h = _LOCAL.unpack(src.read_at(e.header_offset, _LOCAL.size))
        if h[0] != LOCAL_SIG:
            raise self._bad("bad magic number for a file header", e.header_offset)
        nlen, xlen = h[10], h[11]
        fname = src.read_at(e.header_offset + _LOCAL.size, min(nlen, max(0, src.size - e.header_offset - _LOCAL.size)))
        if e.flag_bits & 0x20:
            raise UnsupportedError("compressed patched data (flag bit 5)", path=self.path, member=e.filename)
        if e.flag_bits & 0x40:
            raise UnsupportedError("strong encryption (flag bit 6)", path=self.path, member=e.filename)
        try:
            local = fname.decode("utf-8") if h[3] & 0x800 else fname.decode("cp437")
        except UnicodeDecodeError:
            raise self._bad("local header name is not valid UTF-8", e.header_offset) from None
        if local != e.orig_filename:
            raise self._bad(f"file name in directory {e.orig_filename!r} and header {fname!r} differ", e.header_offset)
        if e.flag_bits & 0x1:
            raise UnsupportedError("encrypted zip member (a password is required)", path=self.path, member=e.filename)
        return int(e.header_offset + _LOCAL.size + nlen + xlen)

    def stored_span(self, e: PyZipEntry) -> tuple[int, int] | None:
        """``(offset, length)`` of a stored member's bytes as zipfile returns them, or None
        for compressed members. zipfile reads ``compress_size`` bytes and keeps the first
        ``file_size`` of them."""
        if e.compress_type != 0:
            return None
        off = self.data_offset(e)
        n = min(e.compress_size, e.file_size)
        if off + n > self.source.size:
            raise TruncatedError("member runs past the end of the file", path=self.path, member=e.filename, offset=off)
        return off, n

    def read(self, e: PyZipEntry | str, *, max_size: int = 1 << 40, check_crc: bool = True) -> memoryview:
        """The member's bytes as ``ZipFile.read`` returns them (CRC-32 checked).

        Stored members are zero-copy views of the source.

        Raises:
            NotFoundError-like FormatError, UnsupportedError (methods other than stored and
            deflate, encryption), ChecksumError, LimitError.
        """
        if isinstance(e, str):
            ent = self.getinfo(e)
            if ent is None:
                raise FormatError(f"archive has no member {e!r}", path=self.path, member=e)
            e = ent
        if e.file_size > max_size:
            raise LimitError(
                "member larger than allowed", path=self.path, member=e.filename, expected=f"<= {max_size}", found=e.file_size
            )
        span = self.stored_span(e)
        if span is not None:
            data = self.source.view(*span)
        elif e.compress_type == 8:
            check_inflate(e.compress_size, e.file_size, self.path, e.filename)
            off = self.data_offset(e)
            n = min(e.compress_size, max(0, self.source.size - off))
            raw = self.source.view(off, n)
            try:
                out, got = inflate_into(raw, e.file_size, self.path, e.filename)
            except zlib.error as err:
                raise FormatError(f"corrupt deflate data: {err}", path=self.path, member=e.filename) from None
            if got < e.file_size and n < e.compress_size:
                raise TruncatedError("member runs past the end of the file", path=self.path, member=e.filename, offset=off)
            data = memoryview(out).toreadonly()[: min(got, e.file_size)]
        else:
            raise UnsupportedError(
                f"zip compression method {e.compress_type}",
                path=self.path,
                member=e.filename,
                expected="0 (stored) or 8 (deflate)",
            )
        if check_crc:
            self._check_crc(e, zlib.crc32(data))
        return data

    def _check_crc(self, e: PyZipEntry, crc: int) -> None:
        if crc & 0xFFFFFFFF != e.crc:
            raise ChecksumError(
                "bad CRC-32 for the member (Python's zipfile refuses it)",
                path=self.path,
                member=e.filename,
                expected=f"{e.crc:08x}",
                found=f"{crc & 0xFFFFFFFF:08x}",
            )

    def check(self, e: PyZipEntry) -> None:
        """Raise what :meth:`read` of the member raises, without keeping its bytes: a
        stored member's CRC-32 is computed piece by piece (a remote member is fetched once,
        never held whole), other members are read. The outcome is kept: the member is
        checked once per reader (``verify``, then each tensor's first read)."""
        done = self._checked.get(e.index)
        if done is None:
            try:
                span = self.stored_span(e) if e.file_size <= 1 << 40 else None
                if span is None:
                    self.read(e)
                else:
                    crc = 0
                    for piece in pieces(self.source, *span):
                        crc = zlib.crc32(piece, crc)
                    self._check_crc(e, crc)
                done = True
            except TorchlessError as err:
                done = err
            self._checked[e.index] = done
        if isinstance(done, TorchlessError):
            raise done

    def close(self) -> None:
        self.source.close()


def _decode_extra(extra: bytes, usize: int, csize: int, hoff: int, zr: PyZipReader, off: int) -> tuple[int, int, int]:
    # ZipInfo._decodeExtra (3.11): every field framed; each 0x0001 field re-applied
    p = 0
    while len(extra) - p >= 4:
        tp, ln = struct.unpack_from("<HH", extra, p)
        if ln + 4 > len(extra) - p:
            raise zr._bad(f"corrupt extra field {tp:04x} (size={ln})", off)
        if tp == 0x0001:
            data = extra[p + 4 : p + 4 + ln]
            q = 0
            try:
                if usize in (0xFFFF_FFFF_FFFF_FFFF, 0xFFFF_FFFF):
                    (usize,) = struct.unpack_from("<Q", data, q)
                    q += 8
                if csize == 0xFFFF_FFFF:
                    (csize,) = struct.unpack_from("<Q", data, q)
                    q += 8
                if hoff == 0xFFFF_FFFF:
                    (hoff,) = struct.unpack_from("<Q", data, q)
            except struct.error:
                raise zr._bad("corrupt zip64 extra field", off) from None
        p += 4 + ln
    return usize, csize, hoff
