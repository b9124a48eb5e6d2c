"""Byte sources: one read interface over memory-mapped files and in-memory bytes.

Parsers take a :class:`ByteSource` and never open files themselves. Every read is
bounds-checked before it happens, so a hostile length field turns into a
:class:`~torchless.core.errors.TruncatedError` naming the source and the offset, never into
a short read that a parser misinterprets. ``view`` returns a zero-copy ``memoryview``
of the mapping: tensors built on it share the page cache with the file.
"""

from __future__ import annotations

import io
import mmap
import os
import stat
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any, Union

from ..core.buffers import is_mapped
from ..core.errors import NotFoundError, TruncatedError, UsageError
from . import remote

__all__ = [
    "ByteSource",
    "BytesSource",
    "MmapSource",
    "PathLike",
    "RemoteSource",
    "SliceSource",
    "SourceFile",
    "is_mapped",
    "open_source",
    "pieces",
]

PathLike = Union[str, "os.PathLike[str]"]


#: what :func:`pieces` reads at most at a time (a checksum pass over a record)
PIECE = 16 << 20


def pieces(src: ByteSource, offset: int, length: int) -> Iterator[memoryview]:
    """``[offset, offset+length)`` of ``src`` in pieces of at most :data:`PIECE` bytes,
    split evenly: a checksum over a multi-GB record holds one piece at a time, and a
    remote source fetches each piece once, in one request (no piece is a small tail that
    goes through its block cache). The caller checks the bounds first."""
    if length <= PIECE:
        if length:
            yield src.view(offset, length)
        return
    count = -(-length // PIECE)
    step = -(-length // count)
    for pos in range(offset, offset + length, step):
        yield src.view(pos, min(step, offset + length - pos))


#: reads of at least this many bytes go to memory aligned to 2 MiB (see _huge_aligned)
_HUGE_MIN = 4 << 20
_HUGE = 2 << 20


def _huge_aligned(length: int) -> Any:
    """``np.empty(length, uint8)`` starting at a 2 MiB boundary: NumPy asks the kernel for
    transparent huge pages for large arrays, and an aligned start lets the whole buffer
    take them (an unaligned 32 MiB buffer faulted in up to 1,000 small pages at its ends).
    The unused head and tail are never touched, so never resident."""
    import numpy as np

    raw = np.empty(length + _HUGE, dtype=np.uint8)
    skip = -raw.ctypes.data % _HUGE
    return raw[skip : skip + length]


def pread_into(fd: int, mv: memoryview, offset: int, *, path: Any = None, short: str = "file shrank while reading") -> None:
    """Fill the byte view ``mv`` from descriptor ``fd`` at ``offset`` with positioned reads
    (at most 1 GiB a call; a partial read goes on); a file that ends first raises
    :class:`TruncatedError` with the message ``short``, naming ``path`` and the offset."""
    done = 0
    n = len(mv)
    while done < n:
        step = min(n - done, 1 << 30)
        got = os.preadv(fd, [mv[done : done + step]], offset + done)
        if got <= 0:
            raise TruncatedError(short, path=path, offset=offset + done, expected=f"{n - done} more bytes")
        done += got


def _pread_new(fd: int, offset: int, length: int, name: str) -> memoryview:
    """``length`` bytes of ``fd`` from ``offset`` into new memory (2 MiB-aligned from
    :data:`_HUGE_MIN` bytes on), with positioned reads."""
    import numpy as np

    out = np.empty(length, dtype=np.uint8) if length < _HUGE_MIN else _huge_aligned(length)
    mv = out.data
    pread_into(fd, mv, offset, path=name)
    return mv


def _touch_pages(m: mmap.mmap, offset: int, length: int) -> None:
    """Read one byte of each page of ``m[offset:offset+length]`` (maps them in)."""
    import numpy as np

    try:
        a = np.frombuffer(m, dtype=np.uint8, count=length, offset=offset)
    except (ValueError, TypeError, BufferError):  # closed meanwhile: nothing to map
        return
    a[:: mmap.PAGESIZE].max()  # (a reduction over thousands of pages runs without the GIL)


class ByteSource:
    """A read-only, random-access sequence of bytes.

    Attributes:
        name: a label for errors (usually the file path).
        size: total length in bytes.
        ranged: True when every read is a request to a store (a URL): readers of formats
            that are one stream (a legacy ``torch.save``) then read a growing prefix
            instead of the whole source.
    """

    name: str
    size: int
    ranged = False

    def view(self, offset: int, length: int, *, what: str = "data") -> memoryview:
        """Zero-copy view of ``[offset, offset+length)``.

        Raises:
            TruncatedError: the range runs past the end of the source.
        """
        self.check(offset, length, what=what)
        return self._buffer()[offset : offset + length]

    def read_at(self, offset: int, length: int, *, what: str = "data") -> bytes:
        """A copy of ``[offset, offset+length)`` as bytes (bounds checked)."""
        return bytes(self.view(offset, length, what=what))

    def read_ahead(self, spans: list[tuple[int, int]]) -> list[Any] | None:
        """Start :meth:`copy` of each ``(offset, length)`` of ``spans`` on a helper
        thread, in order: a future per span (its result the copy's view, or its error),
        or None where this source reads only when asked (the default; a URL)."""
        return None

    def prefault(self, offset: int, length: int) -> None:
        """Map ``[offset, offset+length)`` into this process ahead of its reads, beside
        them (a memory map: on a helper thread); nothing for a source that reads only
        when asked (the default). Best effort: it never fails and never waits."""

    def check(self, offset: int, length: int, *, what: str = "data") -> None:
        """Raise TruncatedError unless ``[offset, offset+length)`` lies inside the source."""
        if offset < 0 or length < 0 or offset + length > self.size:
            raise TruncatedError(
                f"{what} runs past the end of the input",
                path=self.name,
                offset=offset,
                expected=f"{length} bytes",
                found=f"{max(0, self.size - max(offset, 0))} bytes before end of input",
            )

    def copy(self, offset: int, length: int, *, what: str = "data") -> memoryview:
        """``[offset, offset+length)`` read into a new buffer the caller owns.

        For files this is a positioned read straight from the file (no mapping), which is
        what an eager load wants: the bytes land once, in memory of their own.
        """
        self.check(offset, length, what=what)
        import numpy as np

        out = np.empty(length, dtype=np.uint8)
        out[:] = np.frombuffer(self._buffer()[offset : offset + length], dtype=np.uint8)
        return out.data

    def searchable(self) -> bytes | mmap.mmap:
        """The whole source as an object that indexes, slices and ``find``s (what the
        pickle machine reads): the memory map itself for files, no copy."""
        return bytes(self._buffer())

    def _buffer(self) -> memoryview:  # pragma: no cover - abstract
        raise NotImplementedError

    def close(self) -> None:
        """Release what the source holds (a file's mapping: :meth:`MmapSource.close`);
        nothing to do for bytes in memory."""

    def __enter__(self) -> ByteSource:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class BytesSource(ByteSource):
    """A source over bytes already in memory (``bytes``, ``bytearray``, ``memoryview``)."""

    def __init__(self, data: bytes | bytearray | memoryview, name: str = "<bytes>") -> None:
        self._mv = memoryview(data).cast("B") if not isinstance(data, memoryview) else data.cast("B")
        self.name = name
        self.size = len(self._mv)

    def _buffer(self) -> memoryview:
        return self._mv


class MmapSource(ByteSource):
    """A read-only memory map of a whole file (empty files get an empty buffer).

    :meth:`close` releases the file: the mapping is unmapped (and the descriptor the
    mapping holds is closed) at once when nothing else uses it. Arrays already handed out
    over the mapping (``Tensor.numpy()`` results the caller still holds) stay readable:
    they keep the pages mapped until the last of them is dropped, as torch's ``mmap=True``
    tensors do, and the mapping then goes with them. Any read through the source after
    ``close`` (``view``, ``read_at``, ``copy``, ``searchable``) raises
    :class:`~torchless.core.errors.UsageError`.
    """

    def __init__(self, path: PathLike) -> None:
        self.name = os.fspath(path)
        self._closed = False
        try:
            fd = os.open(self.name, os.O_RDONLY | getattr(os, "O_BINARY", 0))
        except FileNotFoundError:
            raise NotFoundError("no such file", path=self.name) from None
        except IsADirectoryError:
            raise UsageError("expected a file, got a directory", path=self.name) from None
        try:
            st = os.fstat(fd)
            if stat.S_ISDIR(st.st_mode):  # os.open succeeds on directories on POSIX
                raise UsageError("expected a file, got a directory", path=self.name)
            self.size = st.st_size
            if self.size:
                try:
                    self._map: mmap.mmap | None = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
                except (OSError, ValueError) as e:
                    raise UsageError(f"cannot memory-map this file: {e}", path=self.name) from None
                self._mv: memoryview | None = memoryview(self._map)
            else:
                self._map = None
                self._mv = memoryview(b"")
            # the file as opened, for copy(): a path opened again later could name
            # another file by then (a checkpoint replaced by rename after it was loaded);
            # closed by close(), or with the source when it is dropped unclosed
            self._fd: int | None = fd
            self._fd_close = weakref.finalize(self, os.close, fd)
            # close() and the reads' dup of the descriptor, one at a time: a read never
            # takes a number close() freed (and another open reused: another file's bytes)
            self._fd_lock = threading.Lock()
        except BaseException:
            os.close(fd)
            raise

    @property
    def closed(self) -> bool:
        return self._closed

    def _refuse_closed(self) -> UsageError:
        return UsageError("the file was closed: reopen it to read its data", path=self.name)

    def _buffer(self) -> memoryview:
        mv = self._mv
        if mv is None:
            raise self._refuse_closed()
        return mv

    def searchable(self) -> bytes | mmap.mmap:
        if self._closed:
            raise self._refuse_closed()
        return self._map if self._map is not None else b""

    def copy(self, offset: int, length: int, *, what: str = "data") -> memoryview:
        if self._closed:
            raise self._refuse_closed()
        self.check(offset, length, what=what)
        fd = self._dup_fd()
        if fd is None:
            raise self._refuse_closed()
        try:
            return _pread_new(fd, offset, length, self.name)
        finally:
            os.close(fd)

    def _dup_fd(self) -> int | None:
        """A descriptor of this source's file of the caller's own (to close), or None once closed."""
        with self._fd_lock:
            return None if self._fd is None else os.dup(self._fd)

    def read_ahead(self, spans: list[tuple[int, int]]) -> list[Any] | None:
        """See :meth:`ByteSource.read_ahead`: the spans are read from a descriptor of
        their own (closing the source meanwhile takes nothing from under them), on this
        process's ``read`` thread. None for a span outside the file."""
        if self._closed or self._fd is None or not spans:
            return None
        if any(off < 0 or n < 0 or off + n > self.size for off, n in spans):
            return None
        from .threads import helper

        fd = self._dup_fd()
        if fd is None:
            return None
        futs: list[Any] = []
        try:
            pool = helper("read")
            for off, n in spans:
                futs.append(pool.submit(_pread_new, fd, off, n, self.name))
            pool.submit(os.close, fd)  # after the last span (one thread: in order)
        except RuntimeError:  # the interpreter is shutting down (an atexit hook): no new threads
            for f in futs:
                f.cancel()
            for f in futs:
                if not f.cancelled():
                    f.exception()  # (waits: the descriptor is closed after its last read)
            os.close(fd)
            return None
        time.sleep(0)  # (lets the helper take the GIL now, up to its first read, rather than at the next switch interval)
        return futs

    def prefault(self, offset: int, length: int) -> None:
        """See :meth:`ByteSource.prefault`: one byte of each page of the span is read on
        this process's ``read`` thread, which maps the pages (the kernel's page-table work,
        a few microseconds per fault, then done off the caller's thread: NumPy reads them
        without the GIL). The pages stay mapped until the caller drops them
        (``madvise(MADV_DONTNEED)``) or the map closes: the caller bounds the span."""
        m = self._map
        if self._closed or m is None or offset < 0 or length <= 0 or offset + length > self.size:
            return
        from .threads import helper

        try:
            helper("read").submit(_touch_pages, m, offset, length)
        except RuntimeError:  # the interpreter is shutting down: no new threads
            pass

    def close(self) -> None:
        """Release the file: unmap now, or, while arrays over the mapping are still held
        elsewhere, drop this source's references so the last of them unmaps it. Reads
        through this source raise UsageError from here on. Idempotent."""
        self._closed = True
        with self._fd_lock:
            if self._fd is not None:
                self._fd = None
                self._fd_close()
        mv, self._mv = self._mv, None
        m, self._map = self._map, None
        if mv is not None:
            try:
                mv.release()
            except BufferError:  # something took a buffer from the whole view: it keeps it
                pass
        if m is not None:
            try:
                m.close()
            except BufferError:  # views handed out still export the map: they unmap it when dropped
                pass


class RemoteSource(ByteSource):
    """A remote object read by byte ranges.

    Args:
        url: the object's URL.
        block: cache block size; reads smaller than ``direct`` are served from blocks.
        cache_blocks: how many blocks the LRU cache keeps.
        direct: reads of at least this many bytes are fetched exactly and not cached.

    Raises:
        NotFoundError: no such object.
        UsageError: the URL names a folder.
    """

    #: a direct read from offset 0 up to this size is kept (see ``_ranged``)
    keep_head = 1 << 26

    ranged = True

    def __init__(self, url: str, *, block: int = 1 << 16, cache_blocks: int = 256, direct: int = 1 << 20) -> None:
        self.name = url
        self.fs, self.path = remote.filesystem(url)
        try:
            info = self.fs.info(self.path)
        except Exception as e:  # noqa: BLE001 - each filesystem raises its own kind
            if remote.is_missing(e):
                raise NotFoundError("no such file", path=url) from None
            raise UsageError(f"cannot open this URL: {remote.reason(e)}", path=url) from None
        if info.get("type") == "directory":
            raise UsageError("expected a file, got a directory", path=url)
        size = info.get("size")
        if size is None:
            raise UsageError("the server does not tell this object's size", path=url)
        self.size = int(size)
        self.block = block
        self.cache_blocks = cache_blocks
        self.direct = direct
        # the same unchanged object opened again in this process (detection, then the
        # handler) shares the blocks already fetched
        key = (url, self.size, block, str(info.get("ETag") or info.get("etag") or info.get("mtime") or info.get("LastModified")))
        shared = remote.SHARED_BLOCKS.get(key)
        if shared is None:
            shared = (OrderedDict(), threading.Lock())
            remote.SHARED_BLOCKS[key] = shared
            while len(remote.SHARED_BLOCKS) > 8:
                remote.SHARED_BLOCKS.pop(next(iter(remote.SHARED_BLOCKS)))
        self._blocks: OrderedDict[int, bytes] = shared[0]
        self._lock = shared[1]
        self._all: bytes | None = None
        self._head: bytes | None = None  # the largest prefix fetched by a direct read

    # -- fetching -----------------------------------------------------------------------
    def _fetch(self, start: int, end: int) -> bytes:
        try:
            data = remote.cat_range(self.fs, self.path, start, end)
        except Exception as e:  # noqa: BLE001
            if remote.is_missing(e):
                raise NotFoundError("the object disappeared while reading", path=self.name) from None
            raise UsageError(f"cannot read this URL: {remote.reason(e)}", path=self.name, offset=start) from None
        remote.STATS.fetched(len(data))
        if len(data) != end - start:
            raise TruncatedError(
                "the server returned a short range (the object changed?)",
                path=self.name,
                offset=start,
                expected=f"{end - start} bytes",
                found=f"{len(data)} bytes",
            )
        return bytes(data)

    def _ranged(self, offset: int, length: int) -> bytes:
        if self._all is not None:
            return self._all[offset : offset + length]
        head = self._head
        if head is not None and offset + length <= len(head):
            return head[offset : offset + length]
        if offset == 0 and self.direct <= length <= self.keep_head:
            # a large prefix (a pickle stream's window, read again by each unpickler the
            # scanner runs): kept, the largest one only, so it is fetched once
            self._head = self._fetch(0, length)
            return self._head
        if length >= self.direct:
            return self._fetch(offset, offset + length)
        bs = self.block
        first, last = offset // bs, (offset + length - 1) // bs
        with self._lock:
            missing = [b for b in range(first, last + 1) if b not in self._blocks]
            # coalesce runs of neighbouring missing blocks into one request each
            runs: list[list[int]] = []
            for b in missing:
                if runs and runs[-1][-1] == b - 1:
                    runs[-1].append(b)
                else:
                    runs.append([b])
            for run in runs:
                start = run[0] * bs
                end = min(self.size, (run[-1] + 1) * bs)
                data = self._fetch(start, end)
                for i, b in enumerate(run):
                    self._blocks[b] = data[i * bs : (i + 1) * bs]
            parts = []
            for b in range(first, last + 1):
                self._blocks.move_to_end(b)
                parts.append(self._blocks[b])
            while len(self._blocks) > max(self.cache_blocks, last - first + 1):
                self._blocks.popitem(last=False)
        joined = parts[0] if len(parts) == 1 else b"".join(parts)
        lo = offset - first * bs
        return joined[lo : lo + length]

    # -- ByteSource ---------------------------------------------------------------------
    def view(self, offset: int, length: int, *, what: str = "data") -> memoryview:
        self.check(offset, length, what=what)
        if length == 0:
            return memoryview(b"")
        return memoryview(self._ranged(offset, length))

    def read_at(self, offset: int, length: int, *, what: str = "data") -> bytes:
        self.check(offset, length, what=what)
        return self._ranged(offset, length) if length else b""

    def copy(self, offset: int, length: int, *, what: str = "data") -> memoryview:
        import numpy as np

        data = self.read_at(offset, length, what=what)
        out = np.empty(length, dtype=np.uint8)
        out[:] = np.frombuffer(data, dtype=np.uint8)
        return out.data

    def searchable(self) -> bytes:
        """The whole object (formats that are one pickle stream need it all)."""
        if self._all is None:
            self._all = self._fetch(0, self.size) if self.size else b""
            self._blocks.clear()
        return self._all

    def _buffer(self) -> memoryview:
        return memoryview(self.searchable())


class SliceSource(ByteSource):
    """``[offset, offset+length)`` of another source, read through it (no copy, no fetch
    until asked): an item inside a remote DCP file parsed by ranges."""

    @property
    def ranged(self) -> bool:  # type: ignore[override]  # a property over the base class attribute
        return bool(getattr(self.parent, "ranged", False))

    def __init__(self, parent: ByteSource, offset: int, length: int, *, name: str | None = None) -> None:
        parent.check(offset, length)
        self.parent = parent
        self.base = offset
        self.size = length
        self.name = name or f"{parent.name}@{offset}"

    def view(self, offset: int, length: int, *, what: str = "data") -> memoryview:
        self.check(offset, length, what=what)
        return self.parent.view(self.base + offset, length, what=what)

    def read_at(self, offset: int, length: int, *, what: str = "data") -> bytes:
        self.check(offset, length, what=what)
        return self.parent.read_at(self.base + offset, length, what=what)

    def copy(self, offset: int, length: int, *, what: str = "data") -> memoryview:
        self.check(offset, length, what=what)
        return self.parent.copy(self.base + offset, length, what=what)

    def searchable(self) -> bytes:
        return self.read_at(0, self.size)

    def _buffer(self) -> memoryview:
        return memoryview(self.searchable())


class SourceFile(io.RawIOBase):
    """A read-only, seekable file object over a ByteSource (for stdlib readers: tarfile)."""

    def __init__(self, src: ByteSource) -> None:
        self.src = src
        self.pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, off: int, whence: int = 0) -> int:
        self.pos = off if whence == 0 else (self.pos + off if whence == 1 else self.src.size + off)
        return self.pos

    def tell(self) -> int:
        return self.pos

    def readinto(self, b: Any) -> int:
        n = max(0, min(len(b), self.src.size - self.pos))
        b[:n] = self.src.view(self.pos, n)
        self.pos += n
        return n


def open_source(src: Any, name: str | None = None) -> ByteSource:
    """Normalize a path, bytes-like object or ByteSource into a ByteSource.

    Args:
        src: a filesystem path, a URL (read by ranges: :class:`RemoteSource`),
            ``bytes``/``bytearray``/``memoryview``, or a ByteSource.
        name: label used in errors when ``src`` is not a path.
    """
    if isinstance(src, ByteSource):
        return src
    if isinstance(src, (bytes, bytearray, memoryview)):
        return BytesSource(src, name or "<bytes>")
    if isinstance(src, str):
        src = remote.local_path(src)  # a file:// URL names a local path
        if remote.is_url(src):
            return RemoteSource(src)
    if isinstance(src, (str, os.PathLike)):
        return MmapSource(src)
    if hasattr(src, "read"):
        data = src.read()
        return BytesSource(data, name or str(getattr(src, "name", "<stream>")))
    raise UsageError(f"cannot read from {type(src).__name__}", expected="path, bytes or file")
