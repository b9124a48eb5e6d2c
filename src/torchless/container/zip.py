"""The zip container of torch archives: a reader with torch's rules, and torch's writer.

Reader (:class:`ZipReader`) - reads the central directory once and each record by
offset from a memory map, the way torch's ``PyTorchStreamReader`` (miniz) does:

* the end record is the one miniz 3.0.2 finds (:func:`locate_eocd`: backwards in 4 KiB
  windows, the last signature with 22 bytes after it, comment length ignored); a zip64
  locator is looked for only when the end record sits at offset >= 76, and the zip64
  record is read where the locator points (:func:`zip64_record`); the entry count, not
  the directory size, says how many entries there are;
* the archive prefix is the first central-directory entry's name up to its first ``/``;
* a member is looked up as ``prefix/name`` **case-insensitively**; when several entries
  match, the one torch reads is the one miniz's binary search over its heap-sorted index
  hits (:meth:`ZipReader.lookup` reproduces that; :meth:`ZipReader.duplicates` lists all);
* a record's data starts after the *local* header's name and extra field (FB padding);
* data descriptors and zip64 records (end records and extra fields) are honoured;
* a record miniz treats as a directory (name ending in ``/`` or DOS attribute 0x10) that
  declares data is refused: miniz extracts nothing and torch would return uninitialized
  memory;
* CRCs are not checked on read (torch builds miniz without it, and writes CRC 0 with
  ``compute_crc32=False``); :meth:`ZipReader.verify` checks them on request.

Writer (:class:`TorchZipWriter`) - torch 2.13's exact record layout (spec ``pt.md``
§1.3): stored records with flags 0x0808, zero time/date, an ``FB`` extra field padding
every record's data to the alignment, a data descriptor after each record, a central
directory, then ZIP64 end record + locator + classic end record, always. CRC-32 is
computed while writing, not in a second pass. The file is written to a temporary name and
renamed into place on success.
"""

from __future__ import annotations

import bisect
import operator
import os
import struct
import weakref
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, BinaryIO, Protocol

from ..core.errors import FormatError, LimitError, NotFoundError, TruncatedError, UnsupportedError, UsageError
from ..core.findings import Problem
from ..core.gcpause import GCPause
from ..io.atomic import AtomicFile
from ..io.crc import crc32 as fast_crc32
from ..io.crc import crc32_spans
from ..io.source import ByteSource, PathLike, open_source, pieces
from ..io.threads import helper

__all__ = [
    "ZipEntry",
    "ZipReader",
    "DirectoryRun",
    "RecordLoader",
    "TorchZipWriter",
    "is_zip",
    "check_inflate",
    "locate_eocd",
    "zip64_record",
]

LOCAL_SIG = b"PK\x03\x04"
_LOCAL_SIG_U32 = struct.unpack("<I", LOCAL_SIG)[0]
CENTRAL_SIG = b"PK\x01\x02"
EOCD_SIG = b"PK\x05\x06"
EOCD64_SIG = b"PK\x06\x06"
LOC64_SIG = b"PK\x06\x07"
DESC_SIG = b"PK\x07\x08"

_LOCAL = struct.Struct("<4sHHHHHIIIHH")  # 30 bytes
_CENTRAL = struct.Struct("<4sHHHHHHIIIHHHHHII")  # 46 bytes
_EOCD = struct.Struct("<4sHHHHIIH")  # 22 bytes
_EOCD64 = struct.Struct("<4sQHHIIQQQQ")  # 56 bytes
_LOC64 = struct.Struct("<4sIQI")  # 20 bytes

MAX32 = 0xFFFFFFFF
#: general-purpose flag bits of a record that torch's reader refuses (miniz 3.0.2
#: ``mz_zip_file_stat_internal``), each with what it means and miniz's error for it
REFUSED_FLAG_BITS = (
    (0x1, "encrypted (flag bit 0)", "unsupported encryption"),
    (0x20, "compressed patched data (flag bit 5)", "unsupported feature"),
    (0x40, "strong encryption (flag bit 6)", "unsupported encryption"),
)
REFUSED_FLAGS = sum(bit for bit, _what, _miniz in REFUSED_FLAG_BITS)
#: deflate input is fed in steps of this size
_INFLATE_STEP = 1 << 16
_HEADER_OFFSET = operator.attrgetter("header_offset")
_SIZE = operator.attrgetter("size")
_METHOD = operator.attrgetter("method")
_RAW_NAME = operator.attrgetter("raw_name")
_weak = weakref.ref
_deref = weakref.ReferenceType.__call__  # (a weak reference's object, or None)
_NONE_TYPE = {type(None)}


def _rows_of(blob: bytes, n: int) -> list[bytes]:
    """``blob`` cut into rows of ``n`` bytes (``[blob[j : j + n] for j in ...]``), in one
    NumPy call when no row ends in a zero byte (NumPy's fixed-width bytes drop trailing
    zeros: those rows are sliced one by one)."""
    import numpy as np

    rows = np.frombuffer(blob, np.uint8).reshape(-1, n)
    if len(rows) and rows[:, -1].all():
        out: list[bytes] = np.frombuffer(blob, f"S{n}").tolist()
        return out
    return [blob[j : j + n] for j in range(0, len(blob), n)]


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


class ZipReader:
    """Read a zip archive the way torch's reader does.

    Args:
        source: a path, bytes, or a :class:`~torchless.io.source.ByteSource`.
        max_entries: refuse central directories with more entries than this.
        require_prefix: raise when the first entry has no ``/`` (torch's rule); set
            False to read generic zips (``.npz``, AOTInductor packages).

    Raises:
        FormatError: no end record, a corrupt central directory, or (with
            ``require_prefix``) a first entry outside a folder.
    """

    def __init__(self, source: Any, *, max_entries: int = 10_000_000, require_prefix: bool = True) -> None:
        self.source: ByteSource = open_source(source)
        self.path = self.source.name
        self.max_entries = max_entries
        self.entries: list[ZipEntry] = []
        self.eocd_offset = 0
        self.cd_offset = 0
        self.cd_size = 0
        self.zip64 = False
        self.eocd64_offset: int | None = None
        self.cd_used = 0
        self.num_disk = 0
        self._runs: list[DirectoryRun] = []  # the entries read as runs of rows, as columns
        self._read_into: list[ZipEntry] | None = None  # the list they describe, and its length then
        self._n_read = 0
        with GCPause():  # tens of thousands of entries: GC passes would find nothing to free
            self._read_directory()
            first = self.entries[0].name if self.entries else ""
            self.prefix = first.split("/", 1)[0] if "/" in first else ""
            self._in_folder = "/" in first
            if require_prefix:
                self.check_prefix()
            # lowercased name -> its entry; names several entries share also in _dups (all of them)
            lowered = self._lowered_names()
            self._by_lower: dict[bytes, ZipEntry] = dict(zip(lowered, self.entries, strict=True))
            self._dups: dict[bytes, list[ZipEntry]] = {}
            if len(self._by_lower) != len(self.entries):
                for k, e in zip(lowered, self.entries, strict=True):
                    self._dups.setdefault(k, []).append(e)
                self._dups = {k: v for k, v in self._dups.items() if len(v) > 1}
        self._sorted: list[int] | None = None
        self._inflated: dict[int, int | FormatError] = {}  # entry index -> CRC-32 or error (crc32)
        self._held: dict[int, memoryview] = {}  # entry index -> its bytes, read whole by a caller (hold)

    def check_prefix(self) -> ZipReader:
        """``self`` when the first entry is inside a folder (torch's rule).

        Raises:
            FormatError: the first entry is not inside a folder, or there are no entries.
        """
        if not self._in_folder:
            first = self.entries[0].name if self.entries else ""
            raise FormatError(
                "first archive entry is not inside a folder" if self.entries else "archive has no entries",
                path=self.path,
                expected="entries named '<prefix>/...'",
                found=repr(first),
            )
        return self

    def segments(self) -> list[tuple[int, int, DirectoryRun | None]]:
        """The entries in order as ``(first, end, run)`` slices of :attr:`entries`: the runs
        of rows read together (:class:`DirectoryRun`, their fields as columns) and, with
        ``run`` None, the entries read one by one between them. One ``(0, n, None)`` when
        :attr:`entries` is not the list the directory was read into."""
        entries = self.entries
        runs = self._runs
        if not runs or entries is not self._read_into or len(entries) != self._n_read:
            return [(0, len(entries), None)]
        out: list[tuple[int, int, DirectoryRun | None]] = []
        at = 0
        for run in runs:
            if run.first > at:
                out.append((at, run.first, None))
            out.append((run.first, run.first + run.count, run))
            at = run.first + run.count
        if at < len(entries):
            out.append((at, len(entries), None))
        return out

    def _lowered_names(self) -> list[bytes]:
        """Every entry's raw name lowercased (``bytes.lower``: ASCII letters only), in order."""
        out: list[bytes] = []
        for a, b, run in self.segments():
            if run is None:
                out += [e.raw_name.lower() for e in self.entries[a:b]]
            elif run.nlen:
                low, n = run.blob.lower(), run.nlen
                if low == run.blob:  # (torch's names: lowercase already) the raw names themselves
                    out += map(_RAW_NAME, self.entries[a:b])
                else:
                    out += _rows_of(low, n)
            else:
                out += [b""] * run.count
        return out

    def data_index(self, folder: str) -> EntryIndex:
        """``{name relative to prefix/folder/: entry}`` for the records under a folder.

        Equivalent to :meth:`lookup` per name when no two entries collide
        case-insensitively (checked), and much faster for many records.
        """
        cache = self.__dict__.setdefault("_folder_index", {})
        idx = cache.get(folder)
        if idx is None:
            base = f"{self.prefix}/{folder}/" if self.prefix else f"{folder}/"
            cut = len(base)
            idx = {}
            if self._dups:
                idx = None
            else:
                entries = self.entries
                for a, b, run in self.segments():
                    if run is not None and run.text is not None:  # the names as one block: no test per name
                        n, text = run.nlen, run.text
                        hit = run.starts_with(base)
                        if hit.all():
                            idx.update(zip([text[j + cut : j + n] for j in range(0, len(text), n)], entries[a:b], strict=True))
                        else:
                            rows = hit.nonzero()[0].tolist()
                            idx.update(
                                zip([text[j * n + cut : j * n + n] for j in rows], [entries[a + j] for j in rows], strict=True)
                            )
                        continue
                    for e in entries[a:b]:
                        nm = e.name
                        if nm.startswith(base):
                            idx[nm[cut:]] = e
            cache[folder] = idx
        return idx if idx is not None else _LookupView(self, folder)

    # -- directory ---------------------------------------------------------------------
    def _read_directory(self) -> None:
        # miniz 3.0.2 ``mz_zip_reader_read_central_dir`` as torch bundles it (torch patches
        # the per-entry zip64 handling), step by step
        src = self.source
        size = src.size
        if size < _EOCD.size:
            raise TruncatedError(
                "file too small to be a zip archive", path=self.path, expected=">= 22 bytes", found=f"{size} bytes"
            )
        eocd = locate_eocd(src)
        if eocd is None:
            if bytes(src.view(0, 4)) == LOCAL_SIG:  # it starts as a zip: the end is missing
                raise TruncatedError(
                    "truncated zip archive: it has no end-of-central-directory record",
                    path=self.path,
                    hint="the file was cut short (an interrupted write, download or copy?)",
                )
            raise FormatError(
                "no zip end-of-central-directory record", path=self.path, expected="PK\\x05\\x06 in the last 64 KiB"
            )
        self.eocd_offset = eocd
        _sig, disk, cd_disk, n_disk, n_total, cd_size, cd_off, _clen = _EOCD.unpack_from(src.view(eocd, _EOCD.size))
        z64 = zip64_record(src, eocd)
        if z64 is not None:
            e64_off, loc, rec = z64
            self.zip64 = True
            self.eocd64_offset = e64_off
            if rec[1] < _EOCD64.size - 12:
                raise FormatError("zip64 end record too small", path=self.path, offset=e64_off, expected=">= 44", found=rec[1])
            if loc[3] != 1:
                raise UnsupportedError(
                    "multi-disk zip archives", path=self.path, offset=eocd - _LOC64.size, expected="1 disk", found=loc[3]
                )
            if rec[7] > MAX32 or rec[6] > MAX32:
                raise LimitError(
                    "too many archive entries (miniz's limit)",
                    path=self.path,
                    offset=e64_off,
                    expected=f"<= {MAX32}",
                    found=rec[7],
                )
            if rec[8] > MAX32:
                raise UnsupportedError(
                    "central directory larger than 4 GiB (miniz's limit)", path=self.path, offset=e64_off, found=rec[8]
                )
            n_total, n_disk, cd_size, disk, cd_disk, cd_off = rec[7], rec[6], rec[8], rec[4], rec[5], rec[9]
        if n_total != n_disk:
            raise UnsupportedError(
                "multi-disk zip archives",
                path=self.path,
                offset=eocd,
                expected="entries on this disk == total entries",
                found=f"{n_disk} != {n_total}",
            )
        if (disk | cd_disk) != 0 and (disk != 1 or cd_disk != 1):
            raise UnsupportedError(
                "multi-disk zip archives",
                path=self.path,
                offset=eocd,
                expected="disk numbers (0, 0) or (1, 1)",
                found=(disk, cd_disk),
            )
        if n_total * _CENTRAL.size > cd_size:
            raise FormatError(
                "central directory smaller than its entry count needs",
                path=self.path,
                offset=cd_off,
                expected=f">= {n_total * 46} bytes",
                found=cd_size,
            )
        if cd_off + cd_size > size:
            raise TruncatedError(
                "central directory runs past the end of the file",
                path=self.path,
                offset=cd_off,
                expected=f"{cd_size} bytes",
                found=f"{max(0, size - cd_off)} bytes",
            )
        if n_total > self.max_entries:
            raise LimitError("too many archive entries", path=self.path, expected=f"<= {self.max_entries}", found=n_total)
        self.cd_offset, self.cd_size = cd_off, cd_size
        self.num_disk = disk
        cd = bytes(src.view(cd_off, cd_size)) if n_total else b""
        p = 0
        unpack = _CENTRAL.unpack_from
        entries = self.entries
        runs = self._runs
        i = 0
        retry = 0  # the next entry worth trying a run of same-sized entries at
        while i < n_total:
            if FAST_DIRECTORY and i >= retry and n_total - i >= _RUN_MIN:
                got = _directory_run(cd, p, i, n_total - i, cd_off, disk, size)
                if got:
                    run, p, cols = got
                    entries += run
                    runs.append(cols)
                    i += len(run)
                    continue
                retry = i + 8
            if p + _CENTRAL.size > cd_size or cd[p : p + 4] != CENTRAL_SIG:
                raise FormatError(
                    "bad central directory entry",
                    path=self.path,
                    offset=cd_off + p,
                    expected="PK\\x01\\x02 and 46 bytes",
                    found=cd[p : p + 4],
                )
            (_sig, _made, _need, flags, method, mtime, _d, crc, csize, usize, nlen, xlen, clen, dstart, _iattr, eattr, hoff) = (
                unpack(cd, p)
            )
            q = p + _CENTRAL.size
            extra = cd[q + nlen : q + nlen + xlen]
            raw = cd[q : q + nlen]
            if xlen and (usize == MAX32 or csize == MAX32 or hoff == MAX32):
                # torch's miniz resolves zip64 extra fields before its per-entry checks
                usize, csize, hoff = _zip64_extra(extra, usize, csize, hoff, self.path, cd_off + p)
            # miniz reads the method as a 32-bit word (method + time): only a stored
            # record with time 0 must have equal sizes
            if (csize != MAX32 and usize != MAX32) and ((method == 0 and mtime == 0 and usize != csize) or (usize and not csize)):
                raise FormatError(
                    "central directory sizes are inconsistent", path=self.path, offset=cd_off + p, expected=usize, found=csize
                )
            if dstart == 0xFFFF or (dstart != disk and dstart != 1):
                raise UnsupportedError(
                    "multi-disk zip archives", path=self.path, offset=cd_off + p, expected=f"disk {disk} or 1", found=dstart
                )
            if csize != MAX32 and hoff + _LOCAL.size + csize > size:
                raise TruncatedError(
                    "record runs past the end of the file", path=self.path, offset=cd_off + p, expected=f"{csize} bytes at {hoff}"
                )
            if flags & 0x2000:
                raise UnsupportedError("zip records with masked (encrypted) local headers", path=self.path, offset=cd_off + p)
            if q + nlen + xlen + clen > cd_size:
                raise TruncatedError("central directory entry runs past the directory", path=self.path, offset=cd_off + p)
            name = raw.decode("utf-8", "surrogateescape")
            entries.append(ZipEntry(i, name, raw, hoff, csize, usize, crc, method, flags, cd_off + p, extra, eattr))
            p = q + nlen + xlen + clen
            i += 1
        self.cd_used = p  # bytes of the directory the counted entries take (the rest is ignored)
        self._read_into = entries  # (segments: the runs' columns describe this list as read)
        self._n_read = len(entries)

    # -- lookup ------------------------------------------------------------------------
    def names(self) -> list[str]:
        """Full entry names in central-directory order."""
        return [e.name for e in self.entries]

    def records(self) -> list[str]:
        """Entry names relative to the prefix (``data.pkl``, ``data/0`` ...)."""
        cut = len(self.prefix) + 1 if self.prefix else 0
        folder = self.prefix + "/"
        out: list[str] = []
        for a, b, run in self.segments():
            if run is not None and run.text is not None:  # the names as one block: no test per name
                hit, n, text = run.starts_with(folder), run.nlen, run.text
                if hit.all():
                    out += [text[j + cut : j + n] for j in range(0, len(text), n)]
                    continue
                if not hit.any():
                    out += [text[j : j + n] for j in range(0, len(text), n)]
                    continue
            names = [e.name for e in self.entries[a:b]]
            out += [n[cut:] if n.startswith(folder) else n for n in names]
        return out

    def _full(self, name: str) -> bytes:
        full = name if not self.prefix else f"{self.prefix}/{name}"
        return full.encode("utf-8", "surrogateescape")

    def lookup(self, name: str, *, full: bool = False) -> ZipEntry | None:
        """The entry torch reads for ``name`` (relative to the prefix unless ``full``)."""
        key = (name.encode("utf-8", "surrogateescape") if full else self._full(name)).lower()
        hit = self._by_lower.get(key)
        if hit is None or key not in self._dups:
            return hit
        return self._miniz_search(key)

    def has(self, name: str) -> bool:
        return self.lookup(name) is not None

    def get(self, name: str, *, full: bool = False) -> ZipEntry:
        """Like :meth:`lookup` but raises NotFoundError naming the archive."""
        e = self.lookup(name, full=full)
        if e is None:
            raise NotFoundError(f"archive has no record {name!r}", path=self.path, member=name)
        return e

    def duplicates(self) -> dict[str, list[ZipEntry]]:
        """Names (lowercased) that several entries share, as torch's lookup sees them."""
        return {k.decode("utf-8", "surrogateescape"): v for k, v in self._dups.items()}

    def _miniz_search(self, key: bytes) -> ZipEntry | None:
        # miniz sorts entry indices with an (unstable) heap sort on the lowercased name and
        # binary-searches that array: which duplicate is found depends on that order.
        if self._sorted is None:
            self._sorted = _miniz_heapsort([e.raw_name.lower() for e in self.entries])
        names = [self.entries[i].raw_name.lower() for i in self._sorted]
        lo, hi = 0, len(names) - 1
        while lo <= hi:
            m = lo + ((hi - lo) >> 1)
            cand = names[m]
            if cand == key:
                return self.entries[self._sorted[m]]
            if cand < key:  # miniz: ASCII-lowercased bytes, shorter first on a tie (= bytes order)
                lo = m + 1
            else:
                hi = m - 1
        return None

    # -- data --------------------------------------------------------------------------
    def data_offset(self, entry: ZipEntry) -> int:
        """Absolute offset of the entry's data, from its *local* header."""
        if entry._data_offset is None:
            src = self.source
            src.check(entry.header_offset, _LOCAL.size, what=f"local header of {entry.name!r}")
            sig, _need, _flags, _m, _t, _d, _crc, _cs, _us, nlen, xlen = _LOCAL.unpack_from(
                src.view(entry.header_offset, _LOCAL.size)
            )
            if sig != LOCAL_SIG:
                raise FormatError(
                    "bad local header signature",
                    path=self.path,
                    member=entry.name,
                    offset=entry.header_offset,
                    expected="PK\\x03\\x04",
                    found=sig,
                )
            entry._data_offset = entry.header_offset + _LOCAL.size + nlen + xlen
        return entry._data_offset

    def batch_reader(self) -> BatchReader:
        """A :class:`BatchReader` over this archive (eager reads of many small records)."""
        return BatchReader(self)

    def local_name(self, entry: ZipEntry) -> bytes:
        """The name stored in the entry's local header (may differ from the central one)."""
        src = self.source
        src.check(entry.header_offset, _LOCAL.size, what="local header")
        nlen = struct.unpack_from("<H", src.view(entry.header_offset + 26, 2))[0]
        return src.read_at(entry.header_offset + _LOCAL.size, nlen, what="local header name")

    def read(self, name: str | ZipEntry, *, max_size: int | None = None) -> memoryview:
        """The record's bytes: a zero-copy view for stored records, inflated for deflate.

        Raises:
            NotFoundError: no such record.
            TruncatedError: the record runs past the end of the file.
            UnsupportedError: compression methods other than stored/deflate, encryption.
            LimitError: the declared size exceeds ``max_size``.
        """
        e = self.get(name) if isinstance(name, str) else name
        off = self._record_start(e, max_size)
        if e.method == 0:
            return self.source.view(off, e.size, what=f"record {e.name!r}")
        raw = self.source.view(off, e.compressed_size, what=f"record {e.name!r}")
        try:
            out, n = inflate_into(raw, e.size, self.path, e.name)
        except zlib.error as err:
            raise FormatError(f"corrupt deflate data: {err}", path=self.path, member=e.name) from None
        if n != e.size:
            raise self._size_differs(e, n)
        return memoryview(out).toreadonly()

    def _record_start(self, e: ZipEntry, max_size: int | None = None) -> int:
        """The checks :meth:`read` makes before it touches the record's data, in its
        order; returns the data's offset."""
        if max_size is not None and e.size > max_size:
            raise LimitError(
                "record larger than allowed", path=self.path, member=e.name, expected=f"<= {max_size} bytes", found=e.size
            )
        if e.flags & REFUSED_FLAGS:
            said = [f"{what} (torch: {miniz})" for bit, what, miniz in REFUSED_FLAG_BITS if e.flags & bit]
            raise UnsupportedError(
                "zip record torch cannot read: " + ", ".join(said),
                path=self.path,
                member=e.name,
                offset=e.central_offset,
                expected=f"general-purpose flag bits {REFUSED_FLAGS:#06x} clear",
                found=f"flags {e.flags:#06x}",
            )
        if e.is_directory and e.compressed_size:
            # miniz extracts nothing for a "directory" (name ending in '/' or DOS attribute
            # 0x10): torch would hand back uninitialized memory of the declared size
            raise UnsupportedError(
                "a record marked as a directory that holds data (torch reads uninitialized memory for it)",
                path=self.path,
                member=e.name,
                offset=e.central_offset,
                found=f"external attributes {e.external_attr:#x}",
            )
        off = self.data_offset(e)
        if e.method == 0:
            if e.compressed_size != e.size:
                raise FormatError(
                    "stored record with different compressed and uncompressed sizes",
                    path=self.path,
                    member=e.name,
                    expected=e.size,
                    found=e.compressed_size,
                )
            return off
        if e.method == 8:
            check_inflate(e.compressed_size, e.size, self.path, e.name)
            return off
        raise UnsupportedError(
            f"zip compression method {e.method}", path=self.path, member=e.name, expected="0 (stored) or 8 (deflate)"
        )

    def _size_differs(self, e: ZipEntry, n: int) -> FormatError:
        return FormatError(
            "inflated size differs from the declared size",
            path=self.path,
            member=e.name,
            expected=e.size,
            found=f"{n}{'+' if n > e.size else ''}",
        )

    def check_read(self, e: ZipEntry) -> int:
        """Raise what :meth:`read` of the record would raise, without keeping its bytes;
        returns its size. A stored record is checked by its headers and bounds (its data
        is not read); a deflated one is inflated in chunks, once per reader (the result of
        :meth:`crc32` is kept): ``verify`` checks each storage after its CRC-32 pass
        without reading a payload twice (a remote file's bytes are fetched once) or
        holding one whole.
        """
        off = self._record_start(e)
        if e.method == 0:
            self.source.check(off, e.size, what=f"record {e.name!r}")
        else:
            self.crc32(e)
        return e.size

    def hold(self, e: ZipEntry, data: memoryview) -> None:
        """Record ``e``'s bytes as :meth:`read` returned them, kept by the caller (a remote
        record parsed whole): :meth:`crc32` takes its CRC-32 from them instead of reading
        the record again."""
        self._held[e.index] = data

    def crc32(self, name: str | ZipEntry) -> int:
        """CRC-32 of the record's bytes, read and inflated in bounded chunks (never the
        whole record in memory: ``verify`` of a small file declaring a huge deflated
        record stays small, and a multi-GB record at a URL is fetched piece by piece).

        Raises what :meth:`read` raises for the same record.
        """
        e = self.get(name) if isinstance(name, str) else name
        held = self._held.get(e.index)
        if held is not None:  # read() checked what crc32 checks
            self._record_start(e)
            return zlib.crc32(held) & MAX32
        if e.method != 8:
            off = self._record_start(e)
            self.source.check(off, e.size, what=f"record {e.name!r}")
            crc = 0
            for piece in pieces(self.source, off, e.size):
                crc = zlib.crc32(piece, crc)
            return crc & MAX32
        off = self._record_start(e)
        self.source.check(off, e.compressed_size, what=f"record {e.name!r}")
        done = self._inflated.get(e.index)
        if done is None:
            done = self._inflated[e.index] = self._inflate_crc(e, off)
        if isinstance(done, FormatError):
            raise done
        return done

    def _inflate_crc(self, e: ZipEntry, off: int) -> int | FormatError:
        crc = total = 0
        steps = (
            p[i : i + _INFLATE_STEP] for p in pieces(self.source, off, e.compressed_size) for i in range(0, len(p), _INFLATE_STEP)
        )
        try:
            for chunk in inflate_pieces(steps, e.size + 1):
                crc = zlib.crc32(chunk, crc)
                total += len(chunk)
        except zlib.error as err:
            return FormatError(f"corrupt deflate data: {err}", path=self.path, member=e.name)
        if total != e.size:
            return self._size_differs(e, total)
        return crc & MAX32

    def read_bytes(self, name: str | ZipEntry, *, max_size: int | None = None) -> bytes:
        """:meth:`read` as ``bytes`` (a copy)."""
        return bytes(self.read(name, max_size=max_size))

    # -- checks ------------------------------------------------------------------------
    def verify(self, *, crc: bool = True) -> list[Problem]:
        """Structural checks and (optionally) CRC-32 of every record.

        Returns the problems found; an empty list means the archive is sound.
        """
        problems: list[Problem] = []
        for name, dups in self.duplicates().items():
            chosen = self._miniz_search(name.encode("utf-8", "surrogateescape"))
            problems.append(
                Problem(
                    "duplicate-name",
                    f"{len(dups)} entries named {name!r} (case-insensitively); "
                    f"torch reads entry #{chosen.index if chosen else '?'}",
                    name,
                )
            )
        spans: list[tuple[int, int, str]] = []
        for e in self.entries:
            if self.prefix and not e.name.startswith(self.prefix + "/"):
                problems.append(
                    Problem(
                        "prefix",
                        f"entry {e.name!r} is outside the archive folder {self.prefix!r} (torch refuses to list such archives)",
                        e.name,
                    )
                )
            parts = e.name.replace("\\", "/").split("/")
            if e.name.startswith("/") or ".." in parts or (len(e.name) > 1 and e.name[1] == ":"):
                problems.append(Problem("path-traversal", f"entry name {e.name!r} escapes the extraction folder", e.name))
            if e.flags & 0x1:
                problems.append(Problem("encrypted", "encrypted record", e.name))
            if e.method not in (0, 8):
                problems.append(Problem("method", f"unsupported compression method {e.method}", e.name))
            try:
                off = self.data_offset(e)
                local = self.local_name(e)
            except FormatError as err:
                problems.append(Problem("local-header", err.message, e.name, e.header_offset))
                continue
            if local != e.raw_name:
                problems.append(
                    Problem(
                        "name-mismatch",
                        f"local header names {local!r}, central directory {e.raw_name!r}",
                        e.name,
                        e.header_offset,
                    )
                )
            end = off + e.compressed_size
            if end > self.cd_offset and e.compressed_size:
                problems.append(Problem("overlap", "record data runs into the central directory", e.name, off))
            spans.append((e.header_offset, end, e.name))
            if crc and e.method in (0, 8):
                try:
                    actual = self.crc32(e)
                except (FormatError, LimitError, UnsupportedError) as err:
                    # a fault of the file (a flag or kind of record read() refuses, data
                    # past the end) is this record's problem: the ones found so far stand.
                    # A failure of the store or of torchless itself is not the file's: it
                    # propagates (the CLI's one error line, exit 2), never a verdict.
                    problems.append(Problem("data", err.message, e.name, off))
                    continue
                if actual != e.crc:
                    kind = "crc-zero" if e.crc == 0 else "crc"
                    sev = "warning" if e.crc == 0 else "error"
                    problems.append(
                        Problem(
                            kind,
                            f"CRC-32 {e.crc:08x} stored, {actual:08x} computed"
                            + (" (written with compute_crc32=False)" if e.crc == 0 else ""),
                            e.name,
                            off,
                            sev,
                        )
                    )
        spans.sort()
        for (_s1, e1, n1), (s2, _e2, n2) in zip(spans, spans[1:], strict=False):
            if s2 < e1:
                problems.append(Problem("overlap", f"records {n1!r} and {n2!r} overlap", n2, s2))
        first_header = min((e.header_offset for e in self.entries), default=0)
        if first_header > 0:
            problems.append(
                Problem(
                    "leading-data",
                    f"{first_header} bytes before the first record (polyglot or prepended data)",
                    None,
                    0,
                    "warning",
                )
            )
        return problems

    def close(self) -> None:
        self.source.close()

    def __enter__(self) -> ZipReader:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


#: parse runs of same-sized central-directory entries as NumPy rows (the tests turn it
#: off to run every suite on the entry-by-entry loop as well)
FAST_DIRECTORY = True
#: fewer entries of one size than this are parsed one by one
_RUN_MIN = 32

#: the fields of a central-directory entry the reader keeps, by offset
_CENTRAL_FIELDS = (
    ("flags", 8, "<u2"),
    ("method", 10, "<u2"),
    ("mtime", 12, "<u2"),
    ("crc", 16, "<u4"),
    ("csize", 20, "<u4"),
    ("usize", 24, "<u4"),
    ("dstart", 34, "<u2"),
    ("eattr", 38, "<u4"),
    ("hoff", 42, "<u4"),
)


class DirectoryRun:
    """Entries ``first .. first + count`` of a central directory read together as rows of
    one size (:func:`_directory_run`): the fields checks of every entry need, as NumPy
    columns, and the names as one block of ``count`` names of ``nlen`` bytes (``names``:
    its rows; ``text``: the block decoded when every byte is ASCII, else None). Made
    from the same bytes as the entries, so a check of the columns is a check of them."""

    __slots__ = ("first", "count", "nlen", "blob", "names", "text", "method", "csize", "usize", "flags", "hoff", "eattr")

    def __init__(self, first: int, count: int, nlen: int, blob: bytes, text: str | None, cols: dict[str, Any]) -> None:
        import numpy as np

        self.first, self.count, self.nlen, self.blob, self.text = first, count, nlen, blob, text
        self.names = np.frombuffer(blob, np.uint8).reshape(count, nlen)
        self.method, self.csize, self.usize = cols["method"], cols["csize"], cols["usize"]
        self.flags, self.hoff, self.eattr = cols["flags"], cols["hoff"], cols["eattr"]

    def starts_with(self, prefix: str) -> Any:
        """Per entry, ``entry.name.startswith(prefix)``, for a run of ASCII names (all
        False when the names are not ASCII: the caller then tests them one by one)."""
        import numpy as np

        if self.text is None or not prefix.isascii() or len(prefix) > self.nlen:  # (no ASCII name starts with non-ASCII)
            return np.zeros(self.count, dtype=bool)
        return (self.names[:, : len(prefix)] == np.frombuffer(prefix.encode("ascii"), np.uint8)).all(axis=1)


def _directory_run(
    cd: bytes, p: int, i: int, left: int, cd_off: int, disk: int, size: int
) -> tuple[list[ZipEntry], int, DirectoryRun] | None:
    """The entries from ``cd[p:]`` (entry number ``i``) that all have the size of the first
    one and no extra field or comment, as ZipEntry objects, with the position after
    them and their columns; None when fewer than :data:`_RUN_MIN` do.

    Rows that the entry-by-entry loop would refuse, or treat specially (a zip64 size, a
    different size, bad signature, inconsistent sizes, a disk number, a record past the
    end of the file, masked headers), end the run: the loop then reads (or refuses) them
    itself. The entries made are the ones the loop makes."""
    import numpy as np

    if len(cd) - p < 46 or cd[p : p + 4] != CENTRAL_SIG:
        return None
    nlen, xlen, clen = struct.unpack_from("<HHH", cd, p + 28)
    if xlen or clen:
        return None
    step = 46 + nlen
    cnt = min(left, (len(cd) - p) // step)
    if cnt < _RUN_MIN:
        return None
    head = np.frombuffer(cd, np.uint8, count=step, offset=p)
    w = _RUN_MIN * 2
    while True:  # the run's length in windows growing 4x (work in proportion to the run)
        c = min(cnt, w)
        rows = np.frombuffer(cd, np.uint8, count=c * step, offset=p).reshape(c, step)
        same = (rows[:, :4] == head[:4]).all(axis=1) & (rows[:, 28:34] == head[28:34]).all(axis=1)
        if not same.all():
            cnt = int(same.argmin())
            break
        if c == cnt:
            break
        w *= 4
    if cnt < _RUN_MIN:
        return None
    rows = rows[:cnt]
    ok = np.ones(cnt, dtype=bool)
    dt = np.dtype({"names": [f[0] for f in _CENTRAL_FIELDS], "formats": [f[2] for f in _CENTRAL_FIELDS],
                   "offsets": [f[1] for f in _CENTRAL_FIELDS], "itemsize": step})  # fmt: skip
    rec = np.frombuffer(cd, dt, count=cnt, offset=p)
    csize, usize, hoff = (rec[k].astype(np.int64) for k in ("csize", "usize", "hoff"))
    method, mtime, flags, dstart = rec["method"], rec["mtime"], rec["flags"], rec["dstart"]
    big = (csize == MAX32) | (usize == MAX32) | (hoff == MAX32)
    ok &= ~big
    ok &= ~(((method == 0) & (mtime == 0) & (usize != csize)) | ((usize != 0) & (csize == 0)))
    ok &= (dstart != 0xFFFF) & ((dstart == disk) | (dstart == 1))
    ok &= hoff + _LOCAL.size + csize <= size
    ok &= (flags & 0x2000) == 0
    if not ok.all():
        cnt = int(ok.argmin())
        if cnt < _RUN_MIN:
            return None
        rows, rec = rows[:cnt], rec[:cnt]
        csize, usize, hoff = csize[:cnt], usize[:cnt], hoff[:cnt]
    names = rows[:, 46:]
    blob = names.tobytes()
    raws = _rows_of(blob, nlen) if nlen else [b""] * cnt
    text: str | None = None
    if nlen and (names < 0x80).all():
        text = blob.decode("ascii")
        strs = [text[j : j + nlen] for j in range(0, cnt * nlen, nlen)]
    else:
        strs = [r.decode("utf-8", "surrogateescape") for r in raws]
    # ZipEntry(index, name, raw_name, header_offset, compressed_size, size, crc, method,
    # flags, central_offset, b"", external_attr) per row, without a call per entry; stored
    # records (both sizes the same) share one int object for the two
    usizes = usize.tolist()
    csizes = usizes if (csize == usize).all() else csize.tolist()
    run: list[ZipEntry] = []
    new = ZipEntry.__new__
    rows_in = zip(
        range(i, i + cnt),
        strs,
        raws,
        hoff.tolist(),
        csizes,
        usizes,
        rec["crc"].tolist(),
        rec["method"].tolist(),
        rec["flags"].tolist(),
        range(cd_off + p, cd_off + p + cnt * step, step),
        rec["eattr"].tolist(),
        strict=True,
    )
    for index, name, raw, h, c, u, crc, m, f, co, ea in rows_in:
        e = new(ZipEntry)
        e.index = index
        e.name = name
        e.raw_name = raw
        e.header_offset = h
        e.compressed_size = c
        e.size = u
        e.crc = crc
        e.method = m
        e.flags = f
        e.central_offset = co
        e.extra = b""
        e.external_attr = ea
        e._data_offset = None
        run.append(e)
    cols = {k: rec[k].astype(np.int64) for k in ("method", "flags", "eattr")}  # (copies: no view of the directory kept)
    cols.update(csize=csize, usize=usize, hoff=hoff)
    return run, p + cnt * step, DirectoryRun(i, cnt, nlen, blob, text, cols)


class EntryIndex(Protocol):
    """What :meth:`ZipReader.data_index` returns: a dict, or :class:`_LookupView`."""

    def get(self, key: str, default: None = None, /) -> ZipEntry | None: ...


class _LookupView:
    """``data_index`` fallback when names collide: every get goes through torch's lookup."""

    def __init__(self, zr: ZipReader, folder: str) -> None:
        self.zr = zr
        self.folder = folder

    def get(self, key: str, default: None = None, /) -> ZipEntry | None:
        return self.zr.lookup(f"{self.folder}/{key}")


def _zip64_extra(extra: bytes, usize: int, csize: int, hoff: int, path: str, off: int) -> tuple[int, int, int]:
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


MAX_DEFLATE_RATIO = 1032  # deflate's best case: 258 bytes from one length/distance pair
MAX_INFLATE = 1 << 32


def inflate_chunks(raw: Any, limit: int, *, chunk: int = 1 << 20) -> Iterator[bytes]:
    """Inflate a raw deflate stream in pieces of at most ``chunk`` bytes, stopping once
    ``limit`` bytes came out (input is fed 64 KiB at a time: no quadratic tail copies).

    Raises:
        zlib.error: corrupt data.
    """
    return inflate_pieces((raw[i : i + _INFLATE_STEP] for i in range(0, len(raw), _INFLATE_STEP)), limit, chunk=chunk)


def inflate_pieces(pieces: Iterable[Any], limit: int, *, chunk: int = 1 << 20) -> Iterator[bytes]:
    """:func:`inflate_chunks` over a raw deflate stream given in consecutive pieces (read
    as they are needed: a record streamed from its source)."""
    d = zlib.decompressobj(-15)
    total = 0
    for buf in pieces:
        while buf:
            out = d.decompress(buf, chunk)
            if out:
                total += len(out)
                yield out
                if total >= limit:
                    return
            buf = d.unconsumed_tail
        if d.eof:
            return
    out = d.flush()
    if out:
        yield out[: max(0, limit - total)]


def inflate_into(raw: Any, size: int, path: str | None = None, member: str | None = None) -> tuple[bytearray, int]:
    """Inflate a raw deflate stream into one buffer of the declared ``size`` (peak memory
    is the output, not twice it as with ``decompress``); returns ``(buffer, bytes that
    came out)``, where a count above ``size`` means the stream holds more than declared.

    Raises:
        LimitError: the process cannot allocate ``size`` bytes (a memory limit such as
            RLIMIT_AS, or a decompression bomb): never a bare ``MemoryError``.
    """
    try:
        out = bytearray(size)
    except MemoryError:
        raise LimitError(
            "not enough memory to inflate a deflated record",
            path=path,
            member=member,
            expected="a record that fits in memory",
            found=f"{size} bytes declared",
        ) from None
    n = 0
    for chunk in inflate_chunks(raw, size + 1):
        k = min(len(chunk), size - n)
        out[n : n + k] = chunk if k == len(chunk) else memoryview(chunk)[:k]  # no copy of the chunk
        n += len(chunk)
        if n > size:
            break
    return out, n


def check_inflate(csize: int, size: int, path: str, member: str) -> None:
    """Refuse a deflated record whose declared size no deflate stream of ``csize`` bytes
    can produce, or that exceeds :data:`MAX_INFLATE` (bounded memory on hostile sizes)."""
    if size > MAX_DEFLATE_RATIO * csize + 1024:
        raise FormatError(
            "declared size larger than deflate can produce from the record",
            path=path,
            member=member,
            expected=f"<= {MAX_DEFLATE_RATIO} x {csize} bytes",
            found=size,
        )
    if size > MAX_INFLATE:
        raise LimitError(
            "deflated record too large to inflate", path=path, member=member, expected=f"<= {MAX_INFLATE} bytes", found=size
        )


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
    if size < _EOCD.size:
        return None
    cur = max(size - 4096, 0)
    while True:
        n = min(4096, size - cur)
        # candidates: i in [0, n-4] with size - (cur+i) >= 22
        hi = min(n - 4, size - _EOCD.size - cur)
        if hi >= 0:
            window = bytes(src.view(cur, hi + 4))
            i = window.rfind(EOCD_SIG)
            if i >= 0:
                return cur + i
        if cur == 0 or size - cur >= 0xFFFF + _EOCD.size:
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
    if eocd < _LOC64.size + _EOCD64.size:
        return None
    loc = _LOC64.unpack_from(src.view(eocd - _LOC64.size, _LOC64.size))
    if loc[0] != LOC64_SIG:
        return None
    e64_off = loc[2]
    if e64_off > src.size - _EOCD64.size:
        raise TruncatedError(
            "zip64 locator points past the end of the file",
            path=src.name,
            offset=eocd - _LOC64.size,
            expected=f"<= {src.size - _EOCD64.size}",
            found=e64_off,
        )
    rec = _EOCD64.unpack_from(src.view(e64_off, _EOCD64.size))
    if rec[0] != EOCD64_SIG:
        return None
    return e64_off, loc, rec


def _miniz_heapsort(keys: list[bytes]) -> list[int]:
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


# ----------------------------------------------------------------------------------------
class TorchZipWriter:
    """Write a zip archive with torch 2.13's record layout.

    Args:
        target: a path (written atomically) or a binary file object.
        prefix: the archive folder; defaults to the file stem as torch does
            (``"model.pt"`` -> ``model``), or ``archive`` for file objects.
        alignment: data alignment of every record (64 in torch).
        compute_crc: write real CRC-32 values (torch's default) or zeros.

    Example:
        >>> with TorchZipWriter("out.pt") as zw:           # doctest: +SKIP
        ...     zw.write("data.pkl", pickle_bytes)
    """

    def __init__(
        self, target: PathLike | BinaryIO, prefix: str | None = None, *, alignment: int = 64, compute_crc: bool = True
    ) -> None:
        if not 1 <= alignment <= 65535:
            raise UsageError("alignment must be in 1..65535 (the FB field is a uint16)", found=alignment)
        self._atomic: AtomicFile | None = None
        if isinstance(target, (str, os.PathLike)):
            stem = os.path.basename(os.fspath(target))
            if prefix is None:
                # torch: everything before the last '.'; ".pt" leaves nothing and is refused
                prefix = stem.rsplit(".", 1)[0] if "." in stem else stem
                if not prefix.isascii():
                    prefix = "archive"
            if not prefix:  # before the temporary file exists
                raise UsageError(
                    "invalid file name: empty archive prefix",
                    path=os.fspath(target),
                    hint="torch takes the archive folder from the file name before its last '.'",
                )
            self._atomic = AtomicFile(target)
            self._f: BinaryIO = self._atomic.file
        else:
            prefix = prefix or "archive"
            self._f = target
        if not prefix:
            raise UsageError("invalid file name: empty archive prefix")
        self.prefix = prefix
        self.alignment = alignment
        self.compute_crc = compute_crc
        self._pos = 0
        self._central: list[bytes] = []
        self._names: list[str] = []
        self._crcs: list[int] = []
        self._closed = False
        # headers, small records and data descriptors gather here and reach the file in
        # few large writes (a checkpoint of 20,000 small tensors made 100,000 writes)
        self._buf = bytearray()
        self._scratch: bytearray | None = None  # write_small_many's, made at its first call

    @property
    def names(self) -> list[str]:
        return list(self._names)

    def _put(self, b: Any) -> None:
        buf = self._buf
        buf += b
        if len(buf) >= _WRITE_BUFFER:
            self._flush()

    def _flush(self) -> None:
        if self._buf:
            buf, self._buf = self._buf, bytearray()
            self._f.write(buf)

    def _padding(self, name_len: int, size: int) -> tuple[bytes, bytes]:
        start = self._pos + 30 + name_len + 4
        zip64 = b""
        if size >= MAX32 or self._pos >= MAX32:
            body = b""
            if size >= MAX32:
                body += struct.pack("<QQ", size, size)
            if self._pos >= MAX32:
                body += struct.pack("<Q", self._pos)
            zip64 = struct.pack("<HH", 1, len(body)) + body
            start += 4 + len(body)
        pad = (-start) % self.alignment
        return zip64, b"FB" + struct.pack("<H", pad) + b"Z" * pad

    def write(self, name: str, data: Any, *, compress: bool = False) -> int:
        """Write one record (``name`` relative to the prefix); returns its data offset.

        Args:
            data: bytes-like, or an iterable of bytes-like chunks when ``size`` is known
                through :meth:`write_chunks`.
            compress: deflate at level 9 (TorchScript ``code/`` files); alignment
                padding is still written.
        """
        if compress:
            mv = memoryview(data).cast("B")
            crc = zlib.crc32(mv) & MAX32 if self.compute_crc else 0
            c = zlib.compressobj(9, zlib.DEFLATED, -15)
            body = c.compress(mv) + c.flush()
            return self._write_record(name, [body], len(mv), len(body), crc, method=8, precomputed_crc=True)
        mv = memoryview(data).cast("B")
        return self.write_chunks(name, [mv], len(mv))

    def copy_compressed(self, name: str, raw: Any, size: int, crc: int) -> int:
        """Write an already-deflated record (raw deflate bytes, its inflated ``size`` and
        CRC-32) without recompressing: copying an archive keeps such records byte-identical.
        """
        mv = memoryview(raw).cast("B")
        return self._write_record(name, [mv], size, len(mv), crc, method=8, precomputed_crc=True)

    def write_chunks(self, name: str, chunks: Iterable[Any], size: int, *, crc: int | None = None) -> int:
        """Stream one stored record of exactly ``size`` bytes from ``chunks``; ``crc``: its
        CRC-32 when already known (the chunks are then not read for it)."""
        if crc is not None:
            return self._write_record(name, chunks, size, size, crc & MAX32, method=0, precomputed_crc=True)
        return self._write_record(name, chunks, size, size, 0, method=0, precomputed_crc=False)

    def write_small(self, name: str, data: Any) -> int:
        """:meth:`write` for a record held in memory: the same bytes, fewer steps.

        Records under 64 KiB in an archive still under 4 GiB take this path (no zip64
        fields, the bytes go through the write buffer); others go through :meth:`write`.
        """
        mv = memoryview(data).cast("B")
        n = len(mv)
        pos = self._pos
        if n >= _DIRECT_WRITE or pos >= MAX32 - (1 << 20) or self._closed:
            return self.write(name, mv)
        (head,), (full,), _offs, end = self._small_heads([name], [mv])
        crc = zlib.crc32(mv) & MAX32 if self.compute_crc else 0
        buf = self._buf
        buf += head
        buf += mv
        data_off = pos + len(head)
        if n:
            buf += _DESC32.pack(DESC_SIG, crc, n, n)
        self._pos = end
        self._central.append(_small_central(crc, n, full, pos))
        self._names.append(name)
        self._crcs.append(crc)
        if len(buf) >= _WRITE_BUFFER:
            self._flush()
        return data_off

    def write_small_many(self, names: list[str], views: list[memoryview], crcs: list[int] | None = None) -> None:
        """:meth:`write_small` of each ``(name, view)`` in turn, in one loop (the same
        bytes): many small records, such as the storages of thousands of small tensors.
        ``views`` are byte memoryviews (format ``B``, one dimension); ``crcs``, when
        given, their CRC-32s (``zlib.crc32`` of each view, computed by the caller, or
        taken from where the bytes come from). Into a file of our own, with every CRC-32
        given (or none written), the headers and views go by the atomic file's guarded
        ``writev``, without being copied here; else through one reused scratch buffer."""
        total = sum(len(v) for v in views)
        if (
            self._closed
            or self._pos + total + 200 * len(views) + sum(len(n) for n in names) >= MAX32 - (1 << 20)
            or any(len(v) >= _DIRECT_WRITE for v in views)
        ):
            for name, mv in zip(names, views, strict=True):
                self.write_small(name, mv)
            return
        central = self._central
        all_crcs = self._crcs
        desc_into = _DESC32.pack_into
        compute = self.compute_crc
        if crcs is not None and len(crcs) != len(views):
            raise ValueError("write_small_many: one CRC-32 per view")
        heads, fulls, offs, end = self._small_heads(names, views)
        own = self._atomic is not None  # our own file: written as it is, kept by no one
        # (behind: on the atomic file's helper thread, while the caller makes its next batch)
        writev = getattr(self._f, "writev_behind", None) if own and hasattr(os, "writev") else None
        if writev is not None and (crcs is not None or not compute):
            # our own file and every CRC-32 known: the headers and the views given to the
            # system as they are, a few hundred records per call (no copy of the bytes in
            # this process; CRC-32s to compute are taken from the scratch copies below)
            self._flush()  # what earlier records left there goes first
            desc_pack = _DESC32.pack
            iov: list[Any] = []
            for i, (head, full, hoff, mv) in enumerate(zip(heads, fulls, offs, views, strict=True)):
                n = len(mv)
                crc = crcs[i] & MAX32 if crcs is not None and compute else 0
                central.append(_small_central(crc, n, full, hoff))
                all_crcs.append(crc)
                if n:
                    iov += (head, mv, desc_pack(DESC_SIG, crc, n, n))
                else:
                    iov.append(head)
                if len(iov) >= _IOV_BATCH:
                    writev(iov)
                    iov = []
            if iov:
                writev(iov)
            self._pos = end
            self._names.extend(names)
            return
        # the records are copied into one reused scratch buffer and written from it: the
        # write buffer (a bytearray grown by ``+=``) would be reallocated, and copied
        # again, every eighth of its size. The CRC-32s the caller did not give are taken
        # from the copies in the scratch buffer, a buffer-full at a time (libdeflate on
        # all but the smallest, core.crc.crc32_spans); each record's data descriptor
        # (16 bytes after its data) and central entry are filled in then.
        self._flush()  # what earlier records left there goes first
        scratch = self._scratch
        if scratch is None:
            scratch = self._scratch = bytearray(_SCRATCH)
        cap = len(scratch)
        at = 0
        write = self._f.write
        # records copied into the scratch buffer since its last write: (their data's
        # offset in it, size, CRC-32 or None, header offset in the file, full name)
        waiting: list[tuple[int, int, int | None, int, bytes]] = []

        def settle() -> None:
            """Descriptors and central entries of the waiting records, in order."""
            if not waiting:
                return
            todo = [w for w in waiting if w[2] is None and w[1]] if compute else []
            got = iter(crc32_spans(scratch, [w[0] for w in todo], [w[1] for w in todo]) if todo else ())
            for d, n, crc, hoff, full in waiting:
                if not compute:
                    crc = 0
                elif crc is None:
                    crc = next(got) & MAX32 if n else 0
                if n:
                    desc_into(scratch, d + n, DESC_SIG, crc, n, n)
                central.append(_small_central(crc, n, full, hoff))
                all_crcs.append(crc)
            waiting.clear()

        for i, (head, full, hoff, mv) in enumerate(zip(heads, fulls, offs, views, strict=True)):
            n = len(mv)
            given = crcs[i] & MAX32 if crcs is not None and compute else None
            k = len(head)
            dlen = 16 if n else 0
            if at + k + n + dlen > cap:
                settle()
                _write_scratch(write, scratch, at, own)
                at = 0
                if k + n + dlen > cap:  # (not with torch's names and alignment)
                    crc = (given if given is not None else zlib.crc32(mv) & MAX32) if compute else 0
                    write(head)
                    write(mv)
                    if n:
                        write(_DESC32.pack(DESC_SIG, crc, n, n))
                    central.append(_small_central(crc, n, full, hoff))
                    all_crcs.append(crc)
                    continue
            e = at + k
            scratch[at:e] = head
            if n:
                scratch[e : e + n] = mv
            waiting.append((e, n, given, hoff, full))
            at = e + n + dlen
        settle()
        _write_scratch(write, scratch, at, own)
        self._pos = end
        self._names.extend(names)

    def _small_heads(self, names: list[str], views: list[memoryview]) -> tuple[list[bytes], list[bytes], list[int], int]:
        """For records written one after the other from the current position (each its
        local header, stored data and, when not empty, a 16-byte data descriptor, as
        :meth:`write_small` writes them): each one's local header (name and alignment
        field included), full name and header offset, and the position after the last."""
        pos = self._pos
        align = self.alignment
        pre = (self.prefix + "/").encode()
        local_pack = _LOCAL.pack
        fb = _FB
        heads: list[bytes] = []
        fulls: list[bytes] = []
        offs: list[int] = []
        for name, mv in zip(names, views, strict=True):
            full = pre + name.encode()
            nlen = len(full)
            pad = (-(pos + 34 + nlen)) % align
            extra = fb[pad] if pad < 64 else b"FB" + struct.pack("<H", pad) + b"Z" * pad
            n = len(mv)
            head = local_pack(LOCAL_SIG, 0, 0x0808 if n else 0x0800, 0, 0, 0, 0, 0, 0, nlen, len(extra)) + full + extra
            heads.append(head)
            fulls.append(full)
            offs.append(pos)
            pos += len(head) + n + (16 if n else 0)
        return heads, fulls, offs, pos

    def _write_record(
        self, name: str, chunks: Iterable[Any], usize: int, csize: int, crc: int, *, method: int, precomputed_crc: bool
    ) -> int:
        if self._closed:
            raise ValueError("writer is closed")
        full = f"{self.prefix}/{name}".encode()
        header_off = self._pos
        zip64_extra, fb = self._padding(len(full), usize)
        extra = zip64_extra + fb
        need = 0x14 if method == 8 else 0
        # miniz writes an empty record without a data descriptor (flags 0x0800)
        gp_flags = 0x0808 if csize else 0x0800
        local = _LOCAL.pack(LOCAL_SIG, need, gp_flags, method, 0, 0, 0, 0, 0, len(full), len(extra))
        put = self._put
        put(local + full + extra)
        data_off = header_off + len(local) + len(full) + len(extra)
        written = 0
        running = 0
        want_crc = not precomputed_crc and self.compute_crc
        for chunk in chunks:
            mv = memoryview(chunk).cast("B")
            n = len(mv)
            if n >= _DIRECT_WRITE:
                self._flush()
                if want_crc and n >= _PARALLEL_CRC:
                    # CRC-32 and the write both release the GIL: overlap them on two cores
                    fut = _crc_pool().submit(fast_crc32, mv, running)
                    self._f.write(mv)
                    running = fut.result()
                else:
                    if want_crc:
                        running = fast_crc32(mv, running)
                    self._f.write(mv)
            else:
                if want_crc:
                    running = zlib.crc32(mv, running)
                put(mv)
            written += n
        if written != csize:
            raise ValueError(f"record {name!r}: {written} bytes written, {csize} declared")
        if not precomputed_crc:
            crc = running & MAX32 if self.compute_crc else 0
        big = usize >= MAX32 or header_off >= MAX32
        if big:
            desc = DESC_SIG + struct.pack("<IQQ", crc, csize, usize)
        else:
            desc = DESC_SIG + struct.pack("<III", crc, csize, usize)
        if not csize:
            desc = b""
        put(desc)
        self._pos = data_off + csize + len(desc)
        # central directory entry
        cextra = b""
        c_us, c_cs, c_off = usize, csize, header_off
        body = b""
        if usize >= MAX32:
            body += struct.pack("<Q", usize)
            c_us = MAX32
        if csize >= MAX32:
            body += struct.pack("<Q", csize)
            c_cs = MAX32
        if header_off >= MAX32:
            body += struct.pack("<Q", header_off)
            c_off = MAX32
        if body:
            cextra = struct.pack("<HH", 1, len(body)) + body
        self._central.append(
            _CENTRAL.pack(
                CENTRAL_SIG, 0, need, gp_flags, method, 0, 0, crc, c_cs, c_us, len(full), len(cextra), 0, 0, 0, 0, c_off
            )
            + full
            + cextra
        )
        self._names.append(name)
        self._crcs.append(crc)
        return data_off

    def serialization_id(self) -> bytes:
        """40 ASCII digits derived from record names and CRCs (nothing validates it)."""
        h1 = 0
        for n in self._names:
            h1 = (h1 * 1000003 ^ zlib.crc32(n.encode())) & 0xFFFFFFFFFFFFFFFF
        h2 = 0
        for c in self._crcs:
            h2 = (h2 * 1000003 ^ c) & 0xFFFFFFFFFFFFFFFF
        return f"{h1:020d}{h2:020d}".encode()

    def close(self) -> None:
        """Write the central directory and end records, then publish the file."""
        if self._closed:
            return
        cd_off = self._pos
        put = self._put
        central = b"".join(self._central)
        try:  # (a write that failed behind, on the helper thread, is raised here too)
            put(central)
            cd_size = len(central)
            n = len(self._central)
            eocd64_off = cd_off + cd_size
            put(_EOCD64.pack(EOCD64_SIG, 44, 0x031E, 0x002D, 0, 0, n, n, cd_size, cd_off))
            put(_LOC64.pack(LOC64_SIG, 0, eocd64_off, 1))
            put(_EOCD.pack(EOCD_SIG, 0, 0, min(n, 0xFFFF), min(n, 0xFFFF), min(cd_size, MAX32), min(cd_off, MAX32), 0))
            self._flush()
        except BaseException:
            self.abort()
            raise
        self._closed = True
        if self._atomic is not None:
            self._atomic.commit()

    def abort(self) -> None:
        """Discard a partly written archive (the target path is left untouched)."""
        self._closed = True
        self._buf = bytearray()
        if self._atomic is not None:
            self._atomic.abort()

    def __enter__(self) -> TorchZipWriter:
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


_PARALLEL_CRC = 1 << 20
#: the alignment extra field ("FB", length, padding) for each padding length below 64
_FB = [b"FB" + struct.pack("<H", k) + b"Z" * k for k in range(64)]
_DESC32 = struct.Struct("<4sIII")


def _small_central(crc: int, n: int, full: bytes, hoff: int) -> bytes:
    """The central directory entry of a stored record of ``n`` bytes that :meth:`~TorchZipWriter.write_small`
    writes (a data descriptor unless empty) at ``hoff``, named ``full``."""
    return _CENTRAL.pack(CENTRAL_SIG, 0, 0, 0x0808 if n else 0x0800, 0, 0, 0, crc, n, n, len(full), 0, 0, 0, 0, 0, hoff) + full


#: TorchZipWriter: bytes gathered before a write; records at least _DIRECT_WRITE long
#: go to the file directly (no copy)
_WRITE_BUFFER = 1 << 20
_DIRECT_WRITE = 1 << 16


#: the reused buffer of TorchZipWriter.write_small_many
_SCRATCH = 2 << 20
#: buffers :meth:`TorchZipWriter.write_small_many` gives one ``writev`` of its own file
_IOV_BATCH = 768


def _write_scratch(write: Callable[[Any], Any], scratch: bytearray, n: int, own: bool) -> None:
    """``write(scratch[:n])``: without a copy into a file of our own (the view is released
    before the buffer is filled again), as ``bytes`` into a caller's file object (which
    may keep what it is given)."""
    if not n:
        return
    if not own:
        write(bytes(memoryview(scratch)[:n]))
        return
    with memoryview(scratch) as whole, whole[:n] as part:
        write(part)


def _crc_pool() -> Any:
    """The CRC thread of this process (see :func:`torchless.io.threads.helper`)."""
    return helper("crc")


def iter_chunks(mv: memoryview, chunk: int = 1 << 24) -> Iterator[memoryview]:
    for i in range(0, len(mv), chunk):
        yield mv[i : i + chunk]


__all__ += ["iter_chunks"]


class RecordLoader:
    """A storage's loader for a zip record (see :class:`~torchless.core.tensor.Storage`).

    Called, it returns the record's first ``nbytes`` bytes, read as :meth:`ZipReader.read`
    does or, with ``batch``, through a :class:`BatchReader`. :meth:`check` raises what the
    call would raise and returns the length the call would return, without keeping the
    bytes (:meth:`ZipReader.check_read`): ``verify`` checks every storage after the CRC-32
    pass read each record, so no payload is read twice (fetched twice, at a URL) or
    held whole.
    """

    __slots__ = ("zr", "entry", "nbytes", "batch")

    def __init__(self, zr: ZipReader, entry: ZipEntry, nbytes: int | None = None, batch: BatchReader | None = None) -> None:
        self.zr = zr
        self.entry = entry
        self.nbytes = entry.size if nbytes is None else nbytes
        self.batch = batch

    @classmethod
    def many(
        cls, zr: ZipReader, entries: list[ZipEntry], sizes: list[int], batch: BatchReader | None = None
    ) -> list[RecordLoader]:
        """``RecordLoader(zr, entry, nbytes, batch)`` for each entry and size, without a
        call per loader (one per storage of a checkpoint of many tensors)."""
        new = cls.__new__
        out = []
        for entry, nbytes in zip(entries, sizes, strict=True):
            ld = new(cls)
            ld.zr = zr
            ld.entry = entry
            ld.nbytes = nbytes
            ld.batch = batch
            out.append(ld)
        return out

    def __call__(self) -> memoryview:
        if self.batch is not None:
            return self.batch.read(self.entry, self.nbytes)
        return self.zr.read(self.entry)[: self.nbytes]

    def check(self) -> int:
        zr, e = self.zr, self.entry
        if self.batch is not None:  # what BatchReader.read raises: the local header, the bounds
            zr.source.check(zr.data_offset(e), self.nbytes, what=f"record {e.name!r}")
            return self.nbytes
        return min(zr.check_read(e), self.nbytes)


class BatchReader:
    """Eager reads of many small stored records with few system calls.

    Records are :meth:`add`-ed up front (a checkpoint's storages); the first :meth:`read`
    of a small one reads the run of added records around it in file order (up to
    :data:`CHUNK` bytes, no gap over :data:`GAP`) with one positioned read into a new
    buffer, and hands each record of the run a view of its own slice of it, the
    requested one now and the others when they are read. Large records, and any record
    whose local header does not check out in the run, are read on their own exactly as
    :meth:`ZipReader.data_offset` + ``source.copy`` do (raising their errors).

    A record added with an *owner* (an object with a ``hold(view)`` method: a storage)
    hands the owner its slice as soon as its run is read, instead of keeping it for a
    later :meth:`read` (the owner then has its bytes without asking again); an owner
    class with a ``hold_many(owners, buf, offsets, sizes)`` static method (a storage)
    takes a whole run's slices in one call. Owners are referred to weakly: their loaders
    refer to the reader, so a strong reference back would make every storage of a load
    and the reader one cycle, freed only by a full GC pass (an owner gone before its run
    is read is skipped).
    """

    CHUNK = 32 << 20
    SMALL = 1 << 20
    GAP = 64 << 10
    SLACK = 1024  # bytes read past a record's nominal end for its local name and extra field

    def __init__(self, zr: ZipReader) -> None:
        self.zr = zr
        self._entries: list[ZipEntry] = []
        self._owners: list[Any] = []  # per added entry: a weak reference to who takes its bytes when its run is read, or None
        self._sorted: list[ZipEntry] | None = None
        self._sorted_owners: list[Any] = []
        self._hoff: Any = None  # header offsets of _sorted (an array)
        self._ready: dict[int, memoryview] = {}  # id(entry) -> its bytes from a run read earlier
        self._consumed: set[int] = set()  # entries already handed out
        # spans being read ahead (read_ahead): (start, end, future of their bytes)
        self._ahead: list[tuple[int, int, Any]] = []
        self._ahead_starts: list[int] = []
        self._ahead_last: list[int] = []
        self._ahead_pid = 0  # the process that started the read-ahead
        # the records read ahead with their header offsets and ends (arrays), or None
        self._ahead_cols: tuple[list[ZipEntry], Any, Any] | None = None

    def add(self, entry: ZipEntry) -> None:
        if entry.method == 0 and entry.size <= self.SMALL:
            self._entries.append(entry)
            self._owners.append(None)
            self._sorted = None

    def add_many(self, entries: list[ZipEntry], owners: list[Any]) -> None:
        """:meth:`add` each entry, with the owner of the same index (see the class)."""
        if len(entries) != len(owners):
            raise ValueError("one owner per entry")
        small = self.SMALL
        try:
            refs: list[Any] = list(map(_weak, owners))
        except TypeError:  # (an owner None, no one to hand its bytes to: weakref.ref refuses it)
            refs = [None if o is None else _weak(o) for o in owners]
        if entries and not any(map(_METHOD, entries)) and max(map(_SIZE, entries)) <= small:
            self._entries += entries
            self._owners += refs
        else:
            for e, ref in zip(entries, refs, strict=True):
                if e.method == 0 and e.size <= small:
                    self._entries.append(e)
                    self._owners.append(ref)
        self._sorted = None

    def read(self, entry: ZipEntry, nbytes: int) -> memoryview:
        """``nbytes`` of the record's data, in memory of its own (a slice of a run)."""
        got = self._ready.pop(id(entry), None)
        if got is not None and len(got) >= nbytes:
            self._consumed.add(id(entry))
            return got[:nbytes]
        if self._sorted is None:
            self._sort()
        i = self._position(entry)
        if i is not None and nbytes <= entry.size:
            mv = self._read_run(i, entry)
            if mv is not None:
                return mv[:nbytes]
        zr = self.zr
        return zr.source.copy(zr.data_offset(entry), nbytes, what=f"record {entry.name!r}")

    def read_ahead(self, entries: Iterable[ZipEntry]) -> None:
        """Start reading, on a helper thread, the runs that reads of ``entries`` (the
        small stored ones: a checkpoint's storage records, all of which an eager load
        will ask for) are going to need, so that the copy runs on a second core while
        the caller goes on (parses the pickle). The runs are found as :meth:`read`
        finds them (the same CHUNK, GAP and SLACK); a read whose run lies inside one
        takes its bytes from it, any other reads as before. Nothing happens for a
        source that reads only when asked (a URL) or entries not in file order."""
        import numpy as np

        small = self.SMALL
        todo = [e for e in entries if e.method == 0 and e.size <= small]
        if len(todo) < 2:
            return
        hoff = np.fromiter(map(_HEADER_OFFSET, todo), np.int64, len(todo))
        ends = hoff + _LOCAL.size + np.fromiter(map(_SIZE, todo), np.int64, len(todo))
        if not (hoff[1:] >= ends[:-1]).all():
            # out of file order, or records that overlap (a hostile directory naming one
            # record many times would have it read ahead once per name: memory without bound)
            return
        joins = np.zeros(len(todo), dtype=bool)
        gap = hoff[1:] - ends[:-1]
        joins[1:] = (gap >= 0) & (gap <= self.GAP)
        size = self.zr.source.size
        spans: list[tuple[int, int]] = []
        lasts: list[int] = []  # the header offset of each span's last record
        i, n = 0, len(todo)
        while i < n:
            start = int(hoff[i])
            k = int(np.searchsorted(hoff, start + self.CHUNK, side="right"))
            fits = joins[i + 1 : k] & (ends[i + 1 : k] + self.SLACK - start <= self.CHUNK)
            j = i + 1 + (int(fits.argmin()) if len(fits) and not fits.all() else len(fits))
            last = todo[j - 1]
            end = min(size, last.header_offset + _LOCAL.size + last.size + len(last.raw_name) + self.SLACK)
            if end > start:
                spans.append((start, end - start))
                lasts.append(last.header_offset)
            i = j
        futs = self.zr.source.read_ahead(spans)
        if futs is not None:
            self._ahead_cols = (todo, hoff, ends)  # (for _sort, when these are the records added)
            self._ahead_starts = [s for s, _ in spans]
            self._ahead_last = lasts
            self._ahead = [(s, s + m, f) for (s, m), f in zip(spans, futs, strict=True)]
            self._ahead_pid = os.getpid()

    def _from_ahead(self, start: int, end: int) -> memoryview | None:
        """``[start, end)`` from a span read ahead that holds it, else None. (A span is
        kept while this reader lives: runs asked for out of file order take their
        pieces of it; its memory is what the views handed out hold anyway.)"""
        ahead = self._ahead
        k = bisect.bisect_right(self._ahead_starts, start) - 1
        if k < 0:
            return None
        s, e, fut = ahead[k]
        if end > e:
            return None
        if os.getpid() != self._ahead_pid and not fut.done():
            return None  # a forked child: the helper thread that would finish it is the parent's
        try:
            mv = fut.result()
        except Exception:  # noqa: BLE001 - the read on its own raises what is wrong
            return None
        view: memoryview = mv.obj[start - s : end - s].data
        return view

    def _sort(self) -> None:
        """The added records in file order, with their offsets, sizes and the gaps
        between neighbours as arrays (a run's extent is then found on columns)."""
        import numpy as np

        entries, owners = self._entries, self._owners
        cols, self._ahead_cols = self._ahead_cols, None  # (used once: the entries are kept in _sorted)
        if cols is not None and len(cols[0]) == len(entries) and all(map(operator.is_, cols[0], entries)):
            # the records read ahead, in the same order: in file order (read_ahead takes
            # no other), their offsets and ends found already
            self._sorted, self._sorted_owners = list(entries), list(owners)
            hoff, ends = cols[1], cols[2]
        else:
            offs = list(map(_HEADER_OFFSET, entries))
            if all(map(operator.le, offs, offs[1:])):  # torch writes its records in order
                self._sorted, self._sorted_owners = list(entries), list(owners)
            else:
                order = sorted(range(len(entries)), key=offs.__getitem__)
                self._sorted = list(map(entries.__getitem__, order))
                self._sorted_owners = list(map(owners.__getitem__, order))
                offs = list(map(offs.__getitem__, order))
            hoff = np.array(offs, dtype=np.int64)
            ends = hoff + _LOCAL.size + np.fromiter(map(_SIZE, self._sorted), np.int64, len(offs))
        gap = np.zeros(len(entries), dtype=np.int64)
        gap[1:] = hoff[1:] - ends[:-1]
        # (to the previous record) a record after the one before it, by at most GAP
        self._joins = (gap >= 0) & (gap <= self.GAP)
        self._hoff, self._ends = hoff, ends

    def _position(self, entry: ZipEntry) -> int | None:
        """The index of ``entry`` in file order (the last, when it was added twice)."""
        import numpy as np

        order = self._sorted
        assert order is not None
        k = int(np.searchsorted(self._hoff, entry.header_offset, side="right")) - 1
        while k >= 0 and self._hoff[k] == entry.header_offset:
            if order[k] is entry:
                return k
            k -= 1
        return None

    def _read_run(self, i: int, entry: ZipEntry) -> memoryview | None:
        import numpy as np

        order = self._sorted
        assert order is not None
        start = entry.header_offset
        # the run: the records after i that each follow the one before it closely and end,
        # with SLACK, within CHUNK of the start
        k = int(np.searchsorted(self._hoff, start + self.CHUNK, side="right"))
        fits = self._joins[i + 1 : k] & (self._ends[i + 1 : k] + self.SLACK - start <= self.CHUNK)
        j = i + 1 + (int(fits.argmin()) if len(fits) and not fits.all() else len(fits))
        if self._ahead:  # a run asked for out of file order ends where its span read ahead ends
            k = bisect.bisect_right(self._ahead_starts, start) - 1
            if k >= 0 and start < self._ahead[k][1]:
                cap = int(np.searchsorted(self._hoff, self._ahead_last[k], side="right"))
                if cap > i:
                    j = min(j, cap)
        last = order[j - 1]
        # to the last record's end, with room for its local name and extra field
        span_end = min(self.zr.source.size, last.header_offset + _LOCAL.size + last.size + len(last.raw_name) + self.SLACK)
        if span_end - start < _LOCAL.size:
            return None
        buf = self._from_ahead(start, span_end) if self._ahead else None
        if buf is None:
            buf = self.zr.source.copy(start, span_end - start, what=f"records from {entry.name!r}")
        mine: memoryview | None = None
        ready, consumed = self._ready, self._consumed
        owners = self._sorted_owners[i:j]
        run = order[i:j]
        # the local headers of the whole run at once: signature, name and extra lengths
        raw = buf.obj if isinstance(buf.obj, np.ndarray) else np.frombuffer(buf, np.uint8)
        span = len(raw) - 3
        rel = np.fromiter(map(_HEADER_OFFSET, run), np.int64, len(run)) - start
        sizes = np.fromiter(map(_SIZE, run), np.int64, len(run))
        head_ok = rel + _LOCAL.size <= len(raw)
        relc = np.where(head_ok, rel, 0)
        w16 = np.ndarray((span,), dtype="<u2", buffer=raw, strides=(1,)) if span > 0 else None
        w32 = np.ndarray((span,), dtype="<u4", buffer=raw, strides=(1,)) if span > 0 else None
        if w16 is None or w32 is None:
            return None
        d_arr = relc + _LOCAL.size + w16[relc + 26].astype(np.int64) + w16[relc + 28].astype(np.int64)
        good = head_ok & (w32[relc] == _LOCAL_SIG_U32) & (d_arr + sizes <= len(raw))
        if good.all() and None not in owners:
            # every record checks out and has its owner (a checkpoint's storages): each
            # gets its slice now (GC paused: thousands of views that all live on)
            with GCPause():
                d_list, s_list = d_arr.tolist(), sizes.tolist()
                for e, d in zip(run, (d_arr + start).tolist(), strict=True):
                    e._data_offset = d
                live = list(map(_deref, owners))
                kinds = set(map(type, live)) - _NONE_TYPE
                many = getattr(next(iter(kinds)), "hold_many", None) if len(kinds) == 1 else None
                if many is not None:  # (one kind of owner, that takes many at once: storages)
                    many(live, buf, d_list, s_list)
                else:
                    for owner, d, sz in zip(live, d_list, s_list, strict=True):
                        if owner is not None:
                            owner.hold(buf[d : d + sz])
            consumed.add(id(entry))
            d0 = int(d_arr[0])  # the run starts with the record asked for
            return buf[d0 : d0 + int(sizes[0])]
        for e, d, sz, g, ref in zip(run, d_arr.tolist(), sizes.tolist(), good.tolist(), owners, strict=True):
            if not g:
                continue  # read on its own when asked for (its error then comes from data_offset)
            e._data_offset = start + d
            owner = None if ref is None else ref()
            if ref is not None and owner is None and e is not entry:
                continue  # its storage is gone: no one asks for these bytes
            if e is entry:
                mine = buf[d : d + sz]
                if owner is not None:
                    owner.hold(mine)
            elif owner is not None:
                owner.hold(buf[d : d + sz])
            elif id(e) not in consumed:
                ready[id(e)] = buf[d : d + sz]
        consumed.add(id(entry))
        return mine
