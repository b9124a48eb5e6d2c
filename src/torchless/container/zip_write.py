"""TorchZipWriter: torch 2.13's exact zip record layout (spec ``pt.md`` §1.3), CRC-32s
computed while writing, the file published atomically.
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Callable, Iterable, Iterator
from typing import Any, BinaryIO

from ..core.errors import UsageError
from ..io.atomic import AtomicFile
from ..io.crc import crc32 as fast_crc32
from ..io.crc import crc32_spans
from ..io.source import PathLike
from ..io.threads import helper
from .zip_spec import (
    CENTRAL_HEADER,
    CENTRAL_SIG,
    DESC_SIG,
    EOCD64_RECORD,
    EOCD64_SIG,
    EOCD_RECORD,
    EOCD_SIG,
    LOC64_RECORD,
    LOC64_SIG,
    LOCAL_HEADER,
    LOCAL_SIG,
    MAX32,
)


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
        local_pack = LOCAL_HEADER.pack
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
        local = LOCAL_HEADER.pack(LOCAL_SIG, need, gp_flags, method, 0, 0, 0, 0, 0, len(full), len(extra))
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
            CENTRAL_HEADER.pack(
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
            put(EOCD64_RECORD.pack(EOCD64_SIG, 44, 0x031E, 0x002D, 0, 0, n, n, cd_size, cd_off))
            put(LOC64_RECORD.pack(LOC64_SIG, 0, eocd64_off, 1))
            put(EOCD_RECORD.pack(EOCD_SIG, 0, 0, min(n, 0xFFFF), min(n, 0xFFFF), min(cd_size, MAX32), min(cd_off, MAX32), 0))
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
    return (
        CENTRAL_HEADER.pack(CENTRAL_SIG, 0, 0, 0x0808 if n else 0x0800, 0, 0, 0, crc, n, n, len(full), 0, 0, 0, 0, 0, hoff) + full
    )


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
