"""Stores: where the files of an artifact live, behind one protocol.

A location (a path or a URL) is resolved once, by :func:`resolve`, into a :class:`Store`
and a path inside it; code below that asks the store (open, read ranges, list, stat,
publish atomically, remove, confine a name an artifact gives) instead of asking again
whether the path is a URL. :func:`resolve` is the one place that tells them apart
(:func:`torchless.io.remote.is_url`, a string test).

* :class:`LocalStore` - the local filesystem (memory maps, ``os``, :func:`~.paths.confine`
  with symbolic links resolved).
* :class:`FsspecStore` - a URL's filesystem through fsspec (:mod:`torchless.io.remote`:
  ranged reads, uploads that appear whole, names refused unless plain).
* :class:`MemoryStore` - files held in a dict (tests of code written against a store).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Protocol

from ..core.errors import LinkEscapeError, NotFoundError, WriteError
from . import remote
from .paths import confine as _confine_local
from .paths import name_parts
from .source import BytesSource, MmapSource, RemoteSource

__all__ = ["Stat", "Store", "LocalStore", "FsspecStore", "MemoryStore", "LOCAL", "FSSPEC", "resolve", "store_for"]


@dataclass(frozen=True)
class Stat:
    """What a store says of one path: its size in bytes (0 for a folder) and whether it is a folder."""

    size: int
    is_dir: bool


class Store(Protocol):
    """Files under one naming scheme: local paths, a URL's filesystem, a dict."""

    #: True where reads are requests (a URL's object): callers fetch ranges, not maps
    remote: bool

    def open(self, path: str) -> Any:
        """A :class:`~torchless.io.source.ByteSource` over file ``path``."""
        ...

    def read_range(self, path: str, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of file ``path``."""
        ...

    def read_bytes(self, path: str) -> bytes:
        """The whole file (small files: an index, a config)."""
        ...

    def list(self, folder: str) -> list[str]:
        """Names (not paths) directly inside ``folder``, sorted."""
        ...

    def stat(self, path: str) -> Stat | None:
        """Its size and kind, or None when it is missing."""
        ...

    def isdir(self, path: str) -> bool: ...

    def isfile(self, path: str, what: str = "cannot check this URL") -> bool:
        """Whether a file is there (on an object store: an object under that key; a store
        that cannot tell raises UsageError ``"<what>: <its reason>"`` rather than guess)."""
        ...

    def exists(self, path: str, what: str = "cannot check this URL") -> bool:
        """Whether a file or folder is there (a store that cannot tell raises, as :meth:`isfile`)."""
        ...

    def join(self, base: str, name: str) -> str:
        """``base/name`` in this store's spelling."""
        ...

    def confine(
        self, root: str, name: object, *, what: str = "file", path: Any = None, member: str | None = None, subdirs: bool = False
    ) -> str:
        """The path of ``name`` (as an artifact names it) under folder ``root``, or
        LinkEscapeError when it could leave the folder."""
        ...

    def publish(self, local: str, path: str) -> int:
        """Publish finished local file ``local`` as ``path``, whole or not at all; its size."""
        ...

    def remove(self, path: str) -> None:
        """Delete one file, quietly (clean-up)."""
        ...


class LocalStore:
    """The local filesystem."""

    remote = False

    def open(self, path: str) -> Any:
        return MmapSource(path)

    def read_range(self, path: str, start: int, end: int) -> bytes:
        with open(path, "rb") as f:
            f.seek(start)
            return f.read(max(0, end - start))

    def read_bytes(self, path: str) -> bytes:
        with open(path, "rb") as f:
            return f.read()

    def list(self, folder: str) -> list[str]:
        try:
            return sorted(os.listdir(folder))
        except FileNotFoundError:
            raise NotFoundError("no such folder", path=folder) from None

    def stat(self, path: str) -> Stat | None:
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return None
        is_dir = os.path.isdir(path)
        return Stat(0 if is_dir else st.st_size, is_dir)

    def isdir(self, path: str) -> bool:
        return os.path.isdir(path)

    def isfile(self, path: str, what: str = "") -> bool:
        return os.path.isfile(path)

    def exists(self, path: str, what: str = "") -> bool:
        return os.path.exists(path)

    def join(self, base: str, name: str) -> str:
        return os.path.join(base, name)

    def confine(
        self, root: str, name: object, *, what: str = "file", path: Any = None, member: str | None = None, subdirs: bool = False
    ) -> str:
        return _confine_local(root, name, what=what, path=path, member=member, subdirs=subdirs)

    def publish(self, local: str, path: str) -> int:
        size = os.path.getsize(local)
        try:
            os.replace(local, path)
        except OSError as e:
            raise WriteError(f"cannot publish: {e.strerror}", path=path) from None
        return size

    def remove(self, path: str) -> None:
        try:
            os.unlink(path)
        except OSError:
            pass


class FsspecStore:
    """A URL's filesystem, through fsspec (:mod:`torchless.io.remote`)."""

    remote = True

    def open(self, path: str) -> Any:
        return RemoteSource(path)

    def read_range(self, path: str, start: int, end: int) -> bytes:
        fs, p = remote.filesystem(path)
        data = remote.cat_range(fs, p, start, end)
        remote.STATS.fetched(len(data))
        return data

    def read_bytes(self, path: str) -> bytes:
        return remote.read_bytes(path)

    def list(self, folder: str) -> list[str]:
        return remote.listdir(folder)

    def stat(self, path: str) -> Stat | None:
        if not remote.present(path, "cannot check this URL"):
            return None
        if remote.isdir(path):
            return Stat(0, True)
        fs, p = remote.filesystem(path)
        return Stat(int(fs.info(p).get("size") or 0), False)

    def isdir(self, path: str) -> bool:
        return remote.isdir(path)

    def isfile(self, path: str, what: str = "cannot check this URL") -> bool:
        return remote.present(path, what)

    def exists(self, path: str, what: str = "cannot check this URL") -> bool:
        return remote.present(path, what)

    def join(self, base: str, name: str) -> str:
        return base.rstrip("/") + "/" + name

    def confine(
        self, root: str, name: object, *, what: str = "file", path: Any = None, member: str | None = None, subdirs: bool = False
    ) -> str:
        """A URL has no symbolic links: the rule is the name's own (a plain file name, or
        with ``subdirs`` relative ``/`` components with no ``..``, ``?``, ``#`` or ``%``)."""
        if subdirs:
            return remote.confined(root, name, what=what, path=path, member=member)
        return remote.child(root, name, what=what, path=path, member=member)

    def publish(self, local: str, path: str) -> int:
        remote.check_writable(path)
        return remote.upload(local, path)

    def remove(self, path: str) -> None:
        remote.remove(path)


class MemoryStore:
    """Files held in a dict, keyed by ``/``-separated paths (tests of code written against
    a store: no filesystem, no network). Folders are the prefixes of the keys."""

    remote = False

    def __init__(self, files: dict[str, bytes] | None = None) -> None:
        self.files: dict[str, bytes] = dict(files or {})

    def _get(self, path: str) -> bytes:
        try:
            return self.files[path]
        except KeyError:
            raise NotFoundError("no such file", path=path) from None

    def open(self, path: str) -> Any:
        return BytesSource(self._get(path), path)

    def read_range(self, path: str, start: int, end: int) -> bytes:
        return self._get(path)[start:end]

    def read_bytes(self, path: str) -> bytes:
        return self._get(path)

    def list(self, folder: str) -> list[str]:
        pre = folder.rstrip("/") + "/"
        names = {k[len(pre) :].split("/", 1)[0] for k in self.files if k.startswith(pre)}
        if not names:
            raise NotFoundError("no such folder", path=folder)
        return sorted(names)

    def stat(self, path: str) -> Stat | None:
        if path in self.files:
            return Stat(len(self.files[path]), False)
        return Stat(0, True) if self.isdir(path) else None

    def isdir(self, path: str) -> bool:
        pre = path.rstrip("/") + "/"
        return any(k.startswith(pre) for k in self.files)

    def isfile(self, path: str, what: str = "") -> bool:
        return path in self.files

    def exists(self, path: str, what: str = "") -> bool:
        return path in self.files or self.isdir(path)

    def join(self, base: str, name: str) -> str:
        return base.rstrip("/") + "/" + name if base else name

    def confine(
        self, root: str, name: object, *, what: str = "file", path: Any = None, member: str | None = None, subdirs: bool = False
    ) -> str:
        parts = name_parts(name, what=what, path=root if path is None else path, member=member, subdirs=subdirs, url=True)
        if not parts:
            raise LinkEscapeError(
                f"refused {what}: it names the folder itself", path=root if path is None else path, member=member
            )
        return self.join(root, "/".join(parts))

    def publish(self, local: str, path: str) -> int:
        with open(local, "rb") as f:
            data = f.read()
        self.files[path] = data
        os.unlink(local)
        return len(data)

    def remove(self, path: str) -> None:
        self.files.pop(path, None)


#: the two stores a location resolves to (stateless: one of each per process)
LOCAL = LocalStore()
FSSPEC = FsspecStore()


def store_for(location: Any) -> Store:
    """The store of ``location``: :data:`FSSPEC` for a URL (``scheme://...``, ``file://``
    included: fsspec's local filesystem), :data:`LOCAL` for anything else. The one place a
    location is asked whether it is a URL."""
    return FSSPEC if remote.is_url(location) else LOCAL


def resolve(location: Any) -> tuple[Store, Any]:
    """``(store, path)`` for a location given by a user: a ``file://`` URL becomes the
    local path it names (the local store's); anything else stays as given."""
    path = remote.local_path(location)
    return store_for(path), path
