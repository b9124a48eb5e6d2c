"""Remote paths: URLs read by byte ranges and written atomically, through fsspec.

Every path torchless takes may be a URL (``s3://``, ``gs://``, ``az://``, ``hf://``,
``http(s)://``, ``memory://``, ``file://``...). Local paths never reach this module's
fsspec side: :func:`is_url` is a string test, and fsspec (the optional extra
``torchless[remote]``) is imported only when a URL is opened.

* :class:`RemoteSource` - a :class:`~torchless.core.source.ByteSource` over a remote
  object that fetches only the ranges asked for: small reads go through a block cache
  (neighbouring missing blocks are fetched in one request), large reads (a tensor's
  storage) are fetched exactly, once.
* :data:`STATS` - bytes fetched and requests made by this process (``--stats``).
* :func:`storage_options` - credentials and endpoints for the filesystems opened inside
  it (on top of each filesystem's own configuration: ``AWS_ENDPOINT_URL``, profiles...).
* :func:`upload` - publish a finished local file as one remote object (used by
  :mod:`torchless.core.atomic`): object stores create an object only when its upload
  completes (s3fs completes a multipart upload at the end); other filesystems get a
  temporary name and a move.
"""

from __future__ import annotations

import contextvars
import os
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar, cast

from .errors import NotFoundError, TruncatedError, UsageError
from .source import ByteSource

__all__ = [
    "RemoteSource",
    "RemotePath",
    "SliceSource",
    "STATS",
    "Stats",
    "is_url",
    "local_path",
    "storage_options",
    "filesystem",
    "upload",
    "join",
    "isdir",
    "exists",
    "listdir",
    "read_bytes",
    "INSTALL_HINT",
]

INSTALL_HINT = "install the remote extra: pip install 'torchless[remote]'"

_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*://")
#: filesystems whose objects appear only once their upload completed (no rename needed)
_ATOMIC_PUT = {"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "memory", "hf"}


def is_url(path: Any) -> bool:
    """True for ``scheme://...`` strings (a cheap test: nothing is imported)."""
    return isinstance(path, str) and _URL.match(path) is not None


def local_path(path: Any) -> Any:
    """``file://`` URLs as the local path they name (they take the local code path);
    anything else unchanged."""
    if isinstance(path, str) and path[:7].lower() == "file://":
        rest = path[7:]
        return rest if rest.startswith("/") else "/" + rest
    return path


class Stats:
    """Counters of remote traffic (this process only)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        self.requests = 0
        self.bytes_fetched = 0
        self.uploads = 0
        self.bytes_uploaded = 0

    def fetched(self, n: int) -> None:
        with self.lock:
            self.requests += 1
            self.bytes_fetched += n

    def uploaded(self, n: int) -> None:
        with self.lock:
            self.uploads += 1
            self.bytes_uploaded += n

    def to_dict(self) -> dict[str, int]:
        return {
            "requests": self.requests,
            "bytes_fetched": self.bytes_fetched,
            "uploads": self.uploads,
            "bytes_uploaded": self.bytes_uploaded,
        }


STATS = Stats()

_OPTIONS: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar("torchless_storage_options", default=None)
_DEFAULT_OPTIONS: dict[str, Any] = {}


@contextmanager
def storage_options_ctx(opts: dict[str, Any] | None) -> Iterator[None]:
    """Use ``opts`` (fsspec storage options: ``{"endpoint_url": ..., "key": ...}``) for
    the filesystems opened inside the block."""
    if opts is not None and not isinstance(opts, dict):
        raise UsageError("storage options must be a dict", found=type(opts).__name__)
    tok = _OPTIONS.set(opts)
    try:
        yield
    finally:
        _OPTIONS.reset(tok)


#: storage options given for a bucket (scheme + first component): files opened later (a
#: shard named by an index, a tensor read lazily) reach it the same way
_BY_LOCATION: dict[str, dict[str, Any]] = {}


def _location(url: str) -> str:
    scheme, _, rest = url.partition("://")
    return scheme.lower() + "://" + rest.split("/", 1)[0]


_F = TypeVar("_F", bound=Callable[..., Any])


def accepts_storage_options(fn: _F) -> _F:
    """Decorator: the function takes ``storage_options=`` (a dict of fsspec options for
    the URLs it opens: ``{"endpoint_url": ..., "key": ..., "secret": ...}``)."""
    import functools

    @functools.wraps(fn)
    def wrapper(*args: Any, storage_options: dict[str, Any] | None = None, **kw: Any) -> Any:
        if storage_options is None:
            return fn(*args, **kw)
        if not isinstance(storage_options, dict):
            raise UsageError("storage_options must be a dict", found=type(storage_options).__name__)
        for a in list(args[:2]) + [kw.get(k) for k in ("path", "src", "dst")]:
            if is_url(a):
                _BY_LOCATION[_location(a)] = dict(storage_options)
        with storage_options_ctx(storage_options):
            return fn(*args, **kw)

    return cast(_F, wrapper)


storage_options = storage_options_ctx  # the public name (a context manager)


def set_default_options(opts: dict[str, Any]) -> None:
    """Storage options for every filesystem this process opens (the CLI's ``--storage-options``)."""
    _DEFAULT_OPTIONS.clear()
    _DEFAULT_OPTIONS.update(opts)


def _fsspec() -> Any:
    try:
        import fsspec  # noqa: F401
        import fsspec.core
    except ImportError:
        raise UsageError("reading or writing URLs needs fsspec", hint=INSTALL_HINT) from None
    return fsspec


def filesystem(url: str) -> tuple[Any, str]:
    """``(filesystem, path inside it)`` for ``url``.

    Raises:
        UsageError: fsspec (or the scheme's filesystem package) is not installed, or an
            unknown scheme.
    """
    fsspec = _fsspec()
    opts = dict(_DEFAULT_OPTIONS)
    opts.update(_BY_LOCATION.get(_location(url)) or {})
    opts.update(_OPTIONS.get() or {})
    try:
        fs, inner = fsspec.core.url_to_fs(url, **opts)
        return fs, str(inner)
    except ImportError as e:
        raise UsageError(f"the filesystem for this URL is not installed ({e})", path=url, hint=INSTALL_HINT) from None
    except ValueError as e:
        raise UsageError(f"cannot open this URL: {e}", path=url) from None


def _protocol(fs: Any) -> str:
    p = fs.protocol
    return str(p[0] if isinstance(p, (tuple, list)) else p)


def join(base: str, name: str) -> str:
    """``base/name`` for URLs and local paths alike."""
    if is_url(base):
        return base.rstrip("/") + "/" + name
    return os.path.join(base, name)


def _missing(e: BaseException) -> bool:
    return isinstance(e, (FileNotFoundError, KeyError))


def isdir(url: str) -> bool:
    fs, p = filesystem(url)
    if _protocol(fs) in ("http", "https"):  # every URL is a file there; listing one would download it
        return url.endswith("/")
    try:
        return bool(fs.isdir(p))
    except OSError:
        return False


def exists(url: str) -> bool:
    fs, p = filesystem(url)
    try:
        fs.info(p)  # a HEAD request (fsspec's http exists() would GET the whole object)
        return True
    except Exception:  # noqa: BLE001 - each filesystem raises its own kind
        return False


def listdir(url: str) -> list[str]:
    """Names (not paths) directly inside folder ``url``."""
    fs, p = filesystem(url)
    try:
        entries = fs.ls(p, detail=False)
    except FileNotFoundError:
        raise NotFoundError("no such folder", path=url) from None
    out = []
    for e in entries:
        n = str(e).rstrip("/").rsplit("/", 1)[-1]
        if n:
            out.append(n)
    return sorted(set(out))


def remove(url: str) -> None:
    """Delete one object, quietly (clean-up after a failed multi-file upload)."""
    try:
        fs, p = filesystem(url)
        fs.rm_file(p)
    except Exception:  # noqa: BLE001
        pass
    forget(url)


def child(root: str, name: str, *, what: str = "file", path: Any = None, member: str | None = None) -> str:
    """``root/name`` for a name an artifact gives (an index's shard, a DCP storage file):
    refused unless a plain file name (no separators, ``..``, NUL or absolute names), as
    :func:`~torchless.core.paths.confine` refuses them for local folders."""
    from .errors import LinkEscapeError

    if not isinstance(name, str) or not name or name in (".", "..") or "\x00" in name or "/" in name or "\\" in name:
        raise LinkEscapeError(
            f"refused {what}: not a plain file name",
            path=root if path is None else path,
            member=member,
            expected="a plain file name inside the artifact's folder",
            found=repr(name)[:120],
        )
    return join(root, name)


def dirname(url: str) -> str:
    return url.rstrip("/").rsplit("/", 1)[0]


def basename(url: str) -> str:
    return url.rstrip("/").rsplit("/", 1)[-1]


def read_bytes(url: str) -> bytes:
    """The whole object (for small files: an index, a config)."""
    src = RemoteSource(url)
    return src.read_at(0, src.size)


_SHARED: dict[tuple[str, int, int, str], tuple[OrderedDict[int, bytes], threading.Lock]] = {}


def forget(url: str) -> None:
    """Drop cached blocks of ``url`` (after this process wrote it)."""
    for k in [k for k in _SHARED if k[0] == url]:
        _SHARED.pop(k, None)


class RemotePath(str):
    """A URL standing where detection expects a :class:`pathlib.Path`."""

    @property
    def name(self) -> str:
        return self.rstrip("/").rsplit("/", 1)[-1]

    @property
    def suffix(self) -> str:
        n = self.name
        i = n.rfind(".")
        return n[i:] if 0 < i < len(n) - 1 else ""

    def __truediv__(self, other: str) -> RemotePath:
        return RemotePath(join(self, other))

    def is_dir(self) -> bool:
        return isdir(self)

    def exists(self) -> bool:
        return exists(self)

    def is_file(self) -> bool:
        return exists(self) and not isdir(self)


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

    def __init__(self, url: str, *, block: int = 1 << 16, cache_blocks: int = 256, direct: int = 1 << 20) -> None:
        self.name = url
        self.fs, self.path = filesystem(url)
        try:
            info = self.fs.info(self.path)
        except Exception as e:  # noqa: BLE001 - each filesystem raises its own kind
            if _missing(e):
                raise NotFoundError("no such file", path=url) from None
            raise UsageError(f"cannot open this URL: {type(e).__name__}: {e}", path=url) from None
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
        shared = _SHARED.get(key)
        if shared is None:
            shared = (OrderedDict(), threading.Lock())
            _SHARED[key] = shared
            while len(_SHARED) > 8:
                _SHARED.pop(next(iter(_SHARED)))
        self._blocks: OrderedDict[int, bytes] = shared[0]
        self._lock = shared[1]
        self._all: bytes | None = None

    # -- fetching -----------------------------------------------------------------------
    def _fetch(self, start: int, end: int) -> bytes:
        try:
            data = self.fs.cat_file(self.path, start=start, end=end)
        except Exception as e:  # noqa: BLE001
            if _missing(e):
                raise NotFoundError("the object disappeared while reading", path=self.name) from None
            raise UsageError(f"cannot read this URL: {type(e).__name__}: {e}", path=self.name, offset=start) from None
        STATS.fetched(len(data))
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


def upload(local: str, url: str) -> int:
    """Publish finished local file ``local`` as object ``url``; returns its size.

    On object stores the object appears only when its upload completed; elsewhere the
    file is uploaded under a temporary name beside the target and moved over it.
    """
    from .errors import WriteError

    fs, p = filesystem(url)
    size = os.path.getsize(local)
    try:
        if _protocol(fs) in _ATOMIC_PUT:
            fs.put_file(local, p)
        else:
            parent, _, leaf = p.rstrip("/").rpartition("/")
            tmp = f"{parent}/.torchless-{os.getpid()}-{os.urandom(6).hex()}.tmp" if parent else f".torchless-{leaf}.tmp"
            fs.put_file(local, tmp)
            try:
                fs.mv(tmp, p)
            except BaseException:
                try:
                    fs.rm(tmp)
                except Exception:  # noqa: BLE001
                    pass
                raise
    except (OSError, ValueError) as e:
        raise WriteError(f"cannot upload: {type(e).__name__}: {e}", path=url) from None
    STATS.uploaded(size)
    forget(url)
    return size
