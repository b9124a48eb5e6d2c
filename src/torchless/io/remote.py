"""Remote paths: URLs read by byte ranges and written atomically, through fsspec.

Every path torchless takes may be a URL (``s3://``, ``gs://``, ``az://``, ``hf://``,
``http(s)://``, ``memory://``, ``file://``...). Local paths never reach this module's
fsspec side: :func:`is_url` is a string test, and fsspec (the optional extra
``torchless[remote]``) is imported only when a URL is opened.

* :func:`filesystem`, :func:`join`, :func:`isdir`... - URLs as fsspec filesystems and paths;
  the byte source over a remote object (ranged reads through a block cache shared by the
  objects of this module) is :class:`torchless.io.source.RemoteSource`, which builds on
  this module (this module imports nothing of ``source``).
* :data:`STATS` - bytes fetched and requests made by this process (``--stats``).
* :func:`storage_options` - credentials and endpoints for the filesystems opened inside
  it (on top of each filesystem's own configuration: ``AWS_ENDPOINT_URL``, profiles...).
* :func:`upload` - publish a finished local file as one remote object (used by
  :mod:`torchless.io.atomic`): object stores create an object only when its upload
  completes (s3fs completes a multipart upload at the end); other filesystems get a
  temporary name and a move.
* :func:`join_objects` - join part objects into one object server-side where the store
  can (:func:`can_join`): an S3 multipart upload of server-side copies, completed only at
  the end and aborted on failure (:mod:`torchless.io.cloud.s3`); Azure blocks staged from
  the parts' URLs, committed by one block list (:mod:`torchless.io.cloud.azure`);
  :func:`move` - a server-side move, waited for until complete; :func:`abort_uploads` -
  abort the incomplete multipart uploads an interrupted job left.
"""

from __future__ import annotations

import contextvars
import os
import re
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar, cast

from ..core.errors import NotFoundError, UsageError

__all__ = [
    "RemotePath",
    "STATS",
    "Stats",
    "is_url",
    "local_path",
    "check_writable",
    "storage_options",
    "filesystem",
    "upload",
    "join",
    "isdir",
    "exists",
    "listdir",
    "read_bytes",
    "join_objects",
    "abort_uploads",
    "can_join",
    "join_min_part",
    "joins_server_side",
    "move",
    "reason",
    "check_exists",
    "INSTALL_HINT",
]

INSTALL_HINT = "install the remote extra: pip install 'torchless[remote]'"

_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*://")
#: filesystems whose objects appear only once their upload completed (no rename needed)
_ATOMIC_PUT = {"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "memory"}
#: schemes read but never written: the Hugging Face Hub takes files in commits (its commit
#: and LFS upload APIs), not as object puts, so an output there is refused up front
_READ_ONLY = {"hf"}


def is_url(path: Any) -> bool:
    """True for ``scheme://...`` strings (a cheap test: nothing is imported)."""
    return isinstance(path, str) and _URL.match(path) is not None


def check_writable(url: str) -> None:
    """Refuse an output URL on a store torchless only reads (``hf://``), before any work.

    Raises:
        UsageError: the scheme is read-only here.
    """
    scheme = url.partition("://")[0].lower()
    if scheme in _READ_ONLY:
        raise UsageError(
            f"cannot write to {scheme}:// (the Hugging Face Hub is read here; it takes files in commits)",
            path=url,
            hint="write to a local folder, then upload it: hf upload REPO FOLDER",
        )


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


def is_missing(e: BaseException) -> bool:
    return isinstance(e, (FileNotFoundError, KeyError))


def reason(e: BaseException) -> str:
    """A filesystem's exception in one line: its type and the first line of its message
    (the Azure SDK's messages go on with a request id, a time and the service's XML)."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    first = lines[0] if lines else ""
    return f"{type(e).__name__}: {first[:300]}" if first else type(e).__name__


def check_exists(url: str) -> None:
    """Raise unless object ``url`` exists: NotFoundError when the store says it is missing,
    UsageError naming the store's reason when it cannot tell (refused credentials...)."""
    if not present(url, "cannot open this URL"):
        raise NotFoundError("no such file or directory", path=url)


def present(url: str, what: str) -> bool:
    """Whether object ``url`` exists, as the store says: True, or False when it says the
    object is missing. When it cannot tell (a network failure, refused credentials), a
    UsageError ``"<what>: <the store's reason>"`` rather than a guess (:func:`exists`
    guesses False)."""
    fs, p = filesystem(url)
    try:
        fs.info(p)
        return True
    except Exception as e:  # noqa: BLE001 - each filesystem raises its own kind
        if is_missing(e):
            return False
        raise UsageError(f"{what}: {reason(e)}", path=url) from None


def isdir(url: str) -> bool:
    """Whether ``url`` is a folder, as the store says: False when it says the path is
    missing or an object. When it cannot tell (a network failure, refused credentials), a
    UsageError naming the store's reason, as :func:`present` (fsspec's own ``isdir``
    answers False for any ``OSError``, so it is asked with ``info``)."""
    fs, p = filesystem(url)
    if _protocol(fs) in ("http", "https"):  # every URL is a file there; listing one would download it
        return url.endswith("/")
    try:
        return bool(fs.info(p).get("type") == "directory")
    except Exception as e:  # noqa: BLE001 - each filesystem raises its own kind (adlfs: azure's HttpResponseError)
        if is_missing(e) or isinstance(e, NotADirectoryError):  # under an object: not a folder
            return False
        raise UsageError(f"cannot check whether this URL is a folder: {reason(e)}", path=url) from None


def listable(url: str) -> bool:
    """False for filesystems that cannot list a folder (plain HTTP servers)."""
    fs, _p = filesystem(url)
    return _protocol(fs) not in ("http", "https")


def exists(url: str) -> bool:
    """Whether object ``url`` exists, guessing False when the store cannot tell (a network
    failure, refused credentials). Only for a caller to which a wrong "missing" costs a
    recomputation at most; a caller that would overwrite, delete or report less on
    "missing" asks :func:`present`."""
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
    except Exception as e:  # noqa: BLE001 - each filesystem raises its own kind
        if is_missing(e):
            raise NotFoundError("no such folder", path=url) from None
        raise UsageError(f"cannot list this URL: {reason(e)}", path=url) from None
    out = []
    for entry in entries:
        n = str(entry).rstrip("/").rsplit("/", 1)[-1]
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


def child(root: str, name: object, *, what: str = "file", path: Any = None, member: str | None = None) -> str:
    """``root/name`` for a name an artifact gives (an index's shard, a DCP storage file):
    refused unless a plain file name (no separators, ``..``, NUL or absolute names), as
    :func:`~torchless.io.paths.confine` refuses them for local folders."""
    from ..core.errors import LinkEscapeError

    if not isinstance(name, str) or not name or name in (".", "..") or "\x00" in name or "/" in name or "\\" in name:
        raise LinkEscapeError(
            f"refused {what}: not a plain file name",
            path=root if path is None else path,
            member=member,
            expected="a plain file name inside the artifact's folder",
            found=repr(name)[:120],
        )
    return join(root, name)


def confined(root: str, name: object, *, what: str = "file", path: Any = None, member: str | None = None) -> str:
    """``root/name`` for a relative path an artifact gives (``/`` components allowed: an
    ONNX external data location), under the rules of
    :func:`~torchless.io.paths.confine` that need no filesystem (no absolute name, no
    ``..``, no NUL) and no ``?``, ``#`` or ``%`` (a query, a fragment, an escape a server
    would decode). A URL has no symbolic links to resolve: the joined path is the object.

    Raises:
        LinkEscapeError: a name that could leave ``root``.
    """
    from .paths import name_parts

    parts = name_parts(name, what=what, path=root if path is None else path, member=member, subdirs=True, url=True)
    if not parts:
        from ..core.errors import LinkEscapeError

        raise LinkEscapeError(f"refused {what}: it names the folder itself", path=root if path is None else path, member=member)
    return join(root, "/".join(parts))


def dirname(url: str) -> str:
    return url.rstrip("/").rsplit("/", 1)[0]


def basename(url: str) -> str:
    return url.rstrip("/").rsplit("/", 1)[-1]


def read_bytes(url: str) -> bytes:
    """The whole object (for small files: an index, a config), in one request."""
    fs, p = filesystem(url)
    try:
        data = fs.cat_file(p)
    except Exception as e:  # noqa: BLE001 - each filesystem raises its own kind
        if is_missing(e):
            raise NotFoundError("no such file", path=url) from None
        raise UsageError(f"cannot read this URL: {reason(e)}", path=url) from None
    STATS.fetched(len(data))
    return bytes(data)


def cat_range(fs: Any, path: str, start: int, end: int) -> bytes:
    """Bytes ``[start, end)`` of object ``path`` in one request.

    Filesystems with no ranged ``cat_file`` of their own (``hf://``) serve it through a
    buffered file whose default read-ahead cache fetches whole 5 MiB blocks: such a file is
    opened with no cache, so the request asks for exactly the range.
    """
    import fsspec.spec

    generic = type(fs).cat_file is fsspec.spec.AbstractFileSystem.cat_file and not getattr(fs, "async_impl", False)
    if generic:  # (async filesystems mirror their own ranged _cat_file as cat_file)
        return bytes(fs.cat_file(path, start=start, end=end, cache_type="none"))
    return bytes(fs.cat_file(path, start=start, end=end))


#: the block caches of :class:`~torchless.io.source.RemoteSource`, one per object (by URL,
#: size, block size and version): the same object opened again shares what was fetched
SHARED_BLOCKS: dict[tuple[str, int, int, str], tuple[OrderedDict[int, bytes], threading.Lock]] = {}


def _after_fork() -> None:
    """In a forked child (a ``local:N`` or ``--jobs N`` worker): fresh locks and caches for
    what the fork copied from a threaded parent (a lock another thread held at the fork
    would stay held), and this process's own traffic counters. fsspec resets its
    event-loop thread at a fork but its own hook leaves the loop lock as it was: its
    ``reset_lock`` does it."""
    STATS.lock = threading.Lock()
    STATS.reset()
    SHARED_BLOCKS.clear()
    asyn = sys.modules.get("fsspec.asyn")
    if asyn is not None and hasattr(asyn, "reset_lock"):
        asyn.reset_lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


def forget(url: str) -> None:
    """Drop cached blocks of ``url`` (after this process wrote it)."""
    for k in [k for k in SHARED_BLOCKS if k[0] == url]:
        SHARED_BLOCKS.pop(k, None)


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
        # as pathlib's exists() raises on errors other than "missing"
        return present(self, "cannot check this URL")

    def is_file(self) -> bool:
        return present(self, "cannot check this URL") and not isdir(self)


def upload(local: str, url: str) -> int:
    """Publish finished local file ``local`` as object ``url``; returns its size.

    On object stores the object appears only when its upload completed; elsewhere the
    file is uploaded under a temporary name beside the target and moved over it.
    """
    from ..core.errors import WriteError

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
    except Exception as e:  # noqa: BLE001 - each filesystem raises its own kind (adlfs: azure's HttpResponseError)
        raise WriteError(f"cannot upload: {reason(e)}", path=url) from None
    STATS.uploaded(size)
    forget(url)
    return size


# -- server-side joins (S3: cloud/s3.py, Azure: cloud/azure.py) ----------------------------------
#: S3's multipart rules and the plan of a join live in :mod:`.cloud.s3`


def _join_kind(fs: Any) -> str | None:
    """How objects of filesystem ``fs`` are joined server-side: ``"s3"`` (a multipart upload
    of UploadPartCopy parts), ``"azure"`` (Put Block From URL, then one Put Block List), or
    None (no join: the parts are read back and uploaded)."""
    proto = _protocol(fs)
    if proto in ("s3", "s3a") and hasattr(fs, "call_s3"):
        return "s3"
    if proto in ("az", "abfs", "abfss") and hasattr(fs, "service_client"):
        return "azure"
    return None


def can_join(url: str, sizes: list[int] | None = None) -> bool:
    """True when :func:`join_objects` joins objects at ``url`` (S3 through s3fs, Azure Blob
    Storage through adlfs; with ``sizes``: parts of those sizes, at most 50,000 blocks on
    Azure); elsewhere a job reads its parts back and uploads them."""
    from .cloud import azure  # the join code: loaded when a join is asked

    fs, _p = filesystem(url)
    kind = _join_kind(fs)
    if kind == "azure" and sizes is not None:
        return azure.block_count(sizes) <= azure.AZ_MAX_BLOCKS
    return kind is not None


def join_min_part(url: str, total: int = 0) -> int:
    """The smallest part (but the last) that :func:`join_objects` copies server-side at
    ``url`` into an object of ``total`` bytes: S3's 5 MiB multipart minimum, or more for
    an object that would otherwise take over 10,000 parts (:func:`s3_min_part`); 0 where
    any part is (Azure's blocks) or where parts are read back anyway."""
    from .cloud import s3  # the join code: loaded when a join is asked

    fs, _p = filesystem(url)
    return s3.s3_min_part(total) if _join_kind(fs) == "s3" else 0


def joins_server_side(url: str, sizes: list[int]) -> bool:
    """True when :func:`join_objects` would join parts of ``sizes`` at ``url`` with no
    payload byte passing through this process (then a coordinator may join them itself)."""
    from .cloud import azure, s3  # the join code: loaded when a join is asked

    fs, _p = filesystem(url)
    kind = _join_kind(fs)
    if kind == "s3":
        return all(p[0] == "copy" for p in s3.join_plan(sizes))
    if kind == "azure":
        return (
            _location(url) not in azure.NO_FROM_URL
            and azure.source_auth(fs) is not None
            and azure.block_count(sizes) <= azure.AZ_MAX_BLOCKS
        )
    return False


def join_objects(url: str, parts: list[str], sizes: list[int]) -> int:
    """Join objects ``parts`` (URLs, in order, of ``sizes`` bytes) into object ``url``,
    server-side where the store can (:func:`can_join`). The object appears only when the
    join completes, and a failed join leaves neither a partial object nor (on S3) an
    incomplete upload; callers hold signals back around it
    (:func:`torchless.io.atomic.holding_signals`), so that a Ctrl-C lands after it.

    * S3: one multipart upload (see :func:`join_plan`): parts of 5 MiB or more are
      copied server-side (UploadPartCopy), a smaller one travels with the bytes next to it.
    * Azure Blob Storage: one block per part (per 100 MiB of a larger part) staged by the
      service from the part's URL (Put Block From URL, the source authorized by a
      read-only SAS signed with the account key, or the SAS the filesystem holds), then
      one Put Block List makes the blob. Without a key or SAS to authorize the source
      (a token credential), or on an emulator without Put Block From URL, the blocks
      are uploaded by this process instead (the same block list).

    Returns the bytes that passed through this process.

    Raises:
        WriteError: the store refused a request.
        UsageError: the store has no server-side join.
    """
    fs, _p = filesystem(url)
    kind = _join_kind(fs)
    if kind == "s3":
        return _join_s3(url, parts, sizes)
    if kind == "azure":
        return _join_azure(url, parts, sizes)
    raise UsageError("this store has no server-side join", path=url)


def _join_s3(url: str, parts: list[str], sizes: list[int]) -> int:
    from .cloud import s3  # the join code: loaded when a join is asked

    fs, dest = filesystem(url)
    moved = s3.join(fs, url, dest, [filesystem(p)[1] for p in parts], sizes, STATS, cat_range)
    if moved:
        STATS.uploaded(moved)
    forget(url)
    return moved


def _join_azure(url: str, parts: list[str], sizes: list[int]) -> int:
    from fsspec.asyn import sync

    from ..core.errors import WriteError
    from .cloud import azure  # the join code: loaded when a join is asked

    fs, dest = filesystem(url)
    if azure.block_count(sizes) > azure.AZ_MAX_BLOCKS:
        raise WriteError(f"cannot join parts: more than {azure.AZ_MAX_BLOCKS} blocks", path=url)
    srcs = [filesystem(p)[1] for p in parts]
    try:
        moved = int(sync(fs.loop, azure.join_async, fs, dest, srcs, sizes, STATS, _location(url)))
    except WriteError:
        raise
    except Exception as e:  # noqa: BLE001 - the Azure SDK's errors are not OSErrors
        raise WriteError(f"cannot join parts: {reason(e)}", path=url) from None
    fs.invalidate_cache(dest)
    if moved:
        STATS.uploaded(moved)
    forget(url)
    return moved


def move(src: str, dst: str) -> None:
    """Move object ``src`` to ``dst`` (same store) server-side. On Azure the copy is
    waited for until the service reports it complete (adlfs's move deletes the source as
    soon as the copy is started, and a copy may complete asynchronously), so a file moved
    before another is whole before the next one appears.

    Raises:
        WriteError: the store refused, or the copy failed.
    """
    from ..core.errors import WriteError
    from .cloud import azure  # the join code: loaded when a join is asked

    fs, s = filesystem(src)
    _fs, d = filesystem(dst)
    try:
        if _join_kind(fs) == "azure":
            from fsspec.asyn import sync

            sync(fs.loop, azure.copy, fs, s, d)
            fs.rm_file(s)
            fs.invalidate_cache(d)
        else:
            fs.mv(s, d)
    except Exception as e:  # noqa: BLE001 - each filesystem raises its own kind
        raise WriteError(f"cannot move {basename(src)} into place: {reason(e)}", path=dst) from None
    forget(src)
    forget(dst)


def abort_uploads(url: str, *, exact: bool = False, under: bool = True) -> list[str]:
    """Abort the incomplete S3 multipart uploads under folder ``url`` (``exact``: of that
    key only; ``under=False``: of every key that starts with ``url``), left by a process
    killed while uploading. Returns ``URL (incomplete multipart upload)`` for each;
    nothing on stores without multipart uploads.

    On Azure, the counterpart: blobs that have uncommitted blocks and no committed
    content (a join or a staged upload that never committed its block list) are deleted,
    discarding their blocks; ``URL (uncommitted blocks)`` for each."""
    from .cloud import azure, s3  # the join code: loaded when a join is asked

    fs, p = filesystem(url)
    kind = _join_kind(fs)
    if kind == "azure":
        from fsspec.asyn import sync

        return list(sync(fs.loop, azure.discard_uncommitted, fs, url, p, exact, under))
    if kind != "s3":
        return []
    return s3.abort_uploads(fs, url, p, exact, under)
