"""Atomic writes: a temporary file beside the target, renamed over it on success.

A failure at any point (an exception, a full disk, a killed process) leaves the target
path as it was: either absent or the previous complete file.
"""

from __future__ import annotations

import os
from typing import Any, BinaryIO

from .source import PathLike

__all__ = ["AtomicFile", "atomic_write_bytes"]


class AtomicFile:
    """A binary file that appears at ``path`` only when :meth:`commit` is called.

    Args:
        path: the target.
        durable: fsync before the rename (power-loss safety; slower).

    Example:
        >>> with AtomicFile("out.bin") as f:     # doctest: +SKIP
        ...     f.file.write(b"...")
    """

    def __init__(self, path: PathLike, *, durable: bool = False) -> None:
        self.path = os.fspath(path)
        self.durable = durable
        import tempfile  # only writers pay for it (it pulls in random and hashlib)

        directory = os.path.dirname(os.path.abspath(self.path))
        fd, self.tmp = tempfile.mkstemp(prefix=".torchless-", suffix=".tmp", dir=directory)
        self.file: BinaryIO = os.fdopen(fd, "wb", buffering=1 << 20)
        self._done = False

    def commit(self) -> None:
        if self._done:
            return
        self.file.flush()
        if self.durable:  # survive power loss too, at the cost of waiting for the disk
            os.fsync(self.file.fileno())
        self.file.close()
        os.chmod(self.tmp, 0o666 & ~_umask())
        os.replace(self.tmp, self.path)
        self._done = True

    def abort(self) -> None:
        if self._done:
            return
        self._done = True
        try:
            self.file.close()
        finally:
            try:
                os.unlink(self.tmp)
            except FileNotFoundError:
                pass

    def __enter__(self) -> "AtomicFile":
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        if exc_type is None:
            self.commit()
        else:
            self.abort()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_bytes(path: PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically."""
    with AtomicFile(path) as f:
        f.file.write(data)
