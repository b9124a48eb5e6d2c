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
from typing import Any, Union

from .errors import NotFoundError, TruncatedError, UsageError

__all__ = ["ByteSource", "BytesSource", "MmapSource", "PathLike", "SourceFile", "is_mapped", "open_source"]

PathLike = Union[str, "os.PathLike[str]"]


def is_mapped(buf: object) -> bool:
    """True when ``buf`` is a zero-copy view of a file mapping (what :meth:`MmapSource.view`
    returns). Such a view must not be kept past the read that asked for it (cache the
    source and the range instead), or ``close()`` cannot unmap the file."""
    return type(buf) is memoryview and type(buf.obj) is mmap.mmap


class ByteSource:
    """A read-only, random-access sequence of bytes.

    Attributes:
        name: a label for errors (usually the file path).
        size: total length in bytes.
    """

    name: str
    size: int

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
        finally:
            os.close(fd)

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
        import numpy as np

        out = np.empty(length, dtype=np.uint8)
        mv = out.data
        fd = os.open(self.name, os.O_RDONLY | getattr(os, "O_BINARY", 0))
        try:
            done = 0
            while done < length:
                got = os.preadv(fd, [mv[done:]], offset + done)
                if got <= 0:
                    raise TruncatedError("file shrank while reading", path=self.name, offset=offset + done)
                done += got
        finally:
            os.close(fd)
        return mv

    def close(self) -> None:
        """Release the file: unmap now, or, while arrays over the mapping are still held
        elsewhere, drop this source's references so the last of them unmaps it. Reads
        through this source raise UsageError from here on. Idempotent."""
        self._closed = True
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
        src: a filesystem path, a URL (read by ranges: :mod:`torchless.core.remote`),
            ``bytes``/``bytearray``/``memoryview``, or a ByteSource.
        name: label used in errors when ``src`` is not a path.
    """
    if isinstance(src, ByteSource):
        return src
    if isinstance(src, (bytes, bytearray, memoryview)):
        return BytesSource(src, name or "<bytes>")
    if isinstance(src, str) and "://" in src:
        from .remote import RemoteSource, is_url, local_path

        if is_url(src):
            src = local_path(src)
            if isinstance(src, str) and is_url(src):
                return RemoteSource(src)
    if isinstance(src, (str, os.PathLike)):
        return MmapSource(src)
    if hasattr(src, "read"):
        data = src.read()
        return BytesSource(data, name or str(getattr(src, "name", "<stream>")))
    raise UsageError(f"cannot read from {type(src).__name__}", expected="path, bytes or file")
