"""Atomic writes: every output is built beside its destination and published only whole.

* :class:`AtomicFile` - one file: a temporary file in the destination's folder, renamed
  over the destination on :meth:`~AtomicFile.commit`.
* :class:`AtomicDir` - one folder (a DCP checkpoint, an extracted package): a temporary
  folder beside the destination, renamed into place on :meth:`~AtomicDir.commit`.
* :func:`publish` - several finished files (shards, then their index) renamed in order
  with signals held back, so an index never names a shard that is not there.
* the staging API (:func:`temp_path`, :func:`track`, :func:`untrack`, :func:`adoptable`,
  :func:`fault_tick`, :func:`write_error`) - for a job that builds its outputs itself
  (:mod:`torchless.jobs.staging`, :mod:`torchless.jobs.tasks`): the same temporary names,
  cleanup on interruption, fault injection and errors as the classes above.

A failure at any point leaves the destination as it was (absent, or the previous
complete output):

* an exception (including ``KeyboardInterrupt``) removes the temporary output;
* SIGINT, SIGTERM and SIGHUP remove every temporary output of this process before the
  signal takes its usual course (handlers are installed only while something is being
  written and the previous ones are restored afterwards);
* a run killed outright (SIGKILL, power loss) leaves a temporary named
  ``.torchless-<pid>@<host>-....tmp``; the next write into that folder removes it when that
  process no longer exists, and logs what it removed;
* ``OSError`` while writing (a full disk, a file-size limit, a read-only or missing
  folder) becomes one :class:`~torchless.core.errors.WriteError` naming the destination,
  never the temporary name.

Fault injection for tests: the environment variable ``TORCHLESS_FAULT_AFTER_BYTES=N`` or
``N:ACTION`` (ACTION one of ``SIGINT``, ``SIGTERM``, ``SIGHUP``, ``SIGKILL``, ``ENOSPC``,
``EIO``; default ``SIGKILL``) makes the process act after it has written ``N`` bytes
through this module, counted over all outputs of the process; ``EROFS`` and ``EACCES``
fail the creation of every output instead (a read-only destination).
"""

from __future__ import annotations

# the interpreter's own _signal, not signal: signal builds its enums first (a noticeable
# part of the command line's start-up, and nothing here needs them); the calls are the same
import _signal as signal
import atexit
import errno
import os
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, BinaryIO

from ..core.errors import InternalError, WriteError
from .source import PathLike
from .store import Store, resolve

__all__ = [
    "AtomicFile",
    "AtomicDir",
    "atomic_write_bytes",
    "make_folder_for",
    "target",
    "publish",
    "clean_stale",
    "holding_signals",
    "temp_path",
    "track",
    "untrack",
    "adoptable",
    "fault_tick",
    "write_error",
    "TEMP_PREFIX",
    "FAULT_ENV",
]

TEMP_PREFIX = ".torchless-"
TEMP_SUFFIX = ".tmp"
FAULT_ENV = "TORCHLESS_FAULT_AFTER_BYTES"
_SIGNALS = tuple(getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, n))


def _log() -> Any:
    """torchless's logger (logging is imported on first use: most runs never warn)."""
    import logging

    return logging.getLogger("torchless")


def _rmtree(path: str, **kw: Any) -> None:
    import shutil

    shutil.rmtree(path, **kw)


# -- temporary names and stale ones -------------------------------------------------------------
def _host() -> str:
    try:
        name = os.uname().nodename  # what socket.gethostname() returns on POSIX
    except AttributeError:  # Windows
        import socket

        name = socket.gethostname()
    h = "".join(c for c in name if c.isalnum() or c in "-_")[:24]
    return h or "host"


def temp_path(directory: str, kind: str) -> str:
    """A fresh name ``.torchless-<pid>@<host>-<kind>-<random>.tmp`` in ``directory``: a
    staging name that :func:`clean_stale` removes once its process is gone (part of the
    staging API a job that builds its outputs itself uses, with :func:`track`,
    :func:`untrack` and :func:`adoptable`)."""
    return os.path.join(directory, f"{TEMP_PREFIX}{os.getpid()}@{_host()}-{kind}-{os.urandom(6).hex()}{TEMP_SUFFIX}")


def _owner(name: str) -> tuple[int, str] | None:
    """``(pid, host)`` encoded in a temporary name, or None for another naming."""
    if not (name.startswith(TEMP_PREFIX) and name.endswith(TEMP_SUFFIX)):
        return None
    pid, at, rest = name[len(TEMP_PREFIX) :].partition("@")
    if not at or not pid.isdigit():
        return None
    return int(pid), rest.partition("-")[0]


def adoptable(name: str) -> bool:
    """Whether the temporary named ``name`` (a base name) was made on this host by a process
    that is gone, or by this one: a resumed job may take over what it holds."""
    who = _owner(name)
    return who is not None and who[1] == _host() and (who[0] == os.getpid() or not _alive(who[0]))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


_swept: set[tuple[int, str]] = set()


def clean_stale(directory: PathLike) -> list[str]:
    """Remove temporaries in ``directory`` left by killed torchless runs on this host.

    Only names of this module's pattern whose process no longer exists are removed (a
    live writer's temporaries are left alone); names of that prefix without a process id
    (older torchless versions) are reported, not removed. Returns the removed paths; each
    is logged as a warning on the ``torchless`` logger.
    """
    d = os.fspath(directory) or "."
    key = (os.getpid(), os.path.abspath(d))
    if key in _swept:  # once per folder and process: a run writing 10,000 files lists it once
        return []
    _swept.add(key)
    try:
        names = os.listdir(d)
    except OSError:
        return []
    host = _host()
    removed = []
    for n in names:
        who = _owner(n)
        if who is None and n.startswith(TEMP_PREFIX) and n.endswith(TEMP_SUFFIX):
            # an older torchless's name carries no process id: report it, never guess
            _log().warning(
                "torchless: %s looks left by an interrupted torchless run; remove it if no torchless is writing here",
                os.path.join(d, n),
            )
            continue
        if who is None or who[1] != host or who[0] == os.getpid() or _alive(who[0]):
            continue
        p = os.path.join(d, n)
        try:
            if os.path.isdir(p) and not os.path.islink(p):
                _rmtree(p)
            else:
                os.unlink(p)
        except OSError:
            continue
        removed.append(p)
        _log().warning("torchless: removed %s, left by an interrupted run (process %d)", p, who[0])
    return removed


# -- signals: clean up, then let the signal do what it would have done --------------------------
_lock = threading.RLock()
_active: dict[int, tuple[int, str, bool]] = {}  # id -> (owner pid, temp path, is_dir)
_previous: dict[int, Any] = {}
_held = 0
_pending: list[int] = []
_fired: list[int] = []  # signals whose clean-up already ran in this process (see interrupted())


def _remove(path: str, is_dir: bool) -> None:
    try:
        if is_dir:
            _rmtree(path, ignore_errors=True)
            if os.path.isdir(path):  # a file appeared while the tree was removed
                _rmtree(path, ignore_errors=True)
        else:
            os.unlink(path)
    except OSError:
        pass


def interrupted_cleanup() -> None:
    """Remove this process's temporaries still tracked after an interrupt unwound (the
    CLI calls it when it reports "interrupted"; an exit hook calls it too)."""
    _cleanup_own()


def _cleanup_own() -> None:
    me = os.getpid()
    for key, (pid, path, is_dir) in list(_active.items()):
        if pid == me:  # a forked worker never removes what its parent is writing
            _remove(path, is_dir)
            _active.pop(key, None)


def _on_signal(signum: int, frame: Any) -> None:
    prev = _previous.get(signum, signal.SIG_DFL)
    if prev == signal.SIG_IGN:  # this process ignores it (a worker whose parent handles Ctrl-C)
        return
    if _held:
        _pending.append(signum)
        return
    if signum == signal.SIGINT:
        # Python unwinds (KeyboardInterrupt) and every writer on the way aborts, removing
        # its temporary after its worker processes stopped. Removing files here, in the
        # middle of whatever the main thread was doing, raced with workers still writing
        # into a staging folder (an empty folder was left behind) and made the handler's
        # window long. What unwinding misses, interrupted_cleanup() (the CLI) and the
        # exit hook remove.
        _fired.append(signum)
        _restore_handlers()
        if callable(prev):
            prev(signum, frame)  # Python's own handler raises KeyboardInterrupt
        else:
            raise KeyboardInterrupt
        _fired.remove(signum)  # a handler of the application's chose to go on
        if _active:
            _install_handlers()
        return
    _fired.append(signum)
    _cleanup_own()
    _restore_handlers()
    if callable(prev):
        prev(signum, frame)
    else:  # default action (terminate): re-deliver with the default disposition
        os.kill(os.getpid(), signum)


def _after_fork_in_child() -> None:
    """A forked child starts with no held or pending signals of its parent's: a worker
    forked while its parent held signals must still die on the parent's SIGTERM."""
    global _held
    _held = 0
    _pending.clear()
    _fired.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(_cleanup_own)  # a write an interrupt left unfinished is never left behind


def interrupted() -> int | None:
    """The signal that interrupted this process, or None.

    Python can lose the ``KeyboardInterrupt`` a handler raises: when the signal lands in
    an at-fork hook, a finalizer or a weakref callback, the exception is printed as
    "ignored" and the program goes on; inside the import system it can even surface as a
    ``KeyError``. Code that publishes asks this first: a commit after a lost interrupt
    refuses, and an error that follows it is reported as the interrupt it is.
    """
    return _fired[0] if _fired else None


def _refuse_if_interrupted() -> None:
    sig = interrupted()
    if sig is None:
        return
    if sig == signal.SIGINT:
        raise KeyboardInterrupt
    raise WriteError(f"cannot write: interrupted by signal {sig}; nothing was published")


def _install_handlers() -> None:
    if _previous or threading.current_thread() is not threading.main_thread():
        return
    for s in _SIGNALS:
        try:
            _previous[s] = signal.signal(s, _on_signal)
        except (ValueError, OSError):  # not the main interpreter
            pass


def _restore_handlers() -> None:
    for s, prev in list(_previous.items()):
        try:
            if signal.getsignal(s) is _on_signal:
                signal.signal(s, prev if prev is not None else signal.SIG_DFL)
        except (ValueError, OSError):
            pass
    _previous.clear()


def track(obj: Any, path: str, is_dir: bool) -> None:
    """Remove ``path`` (a file, or a folder when ``is_dir``) if this process is interrupted
    (SIGINT, SIGTERM, SIGHUP) before :func:`untrack` of ``obj``."""
    with _lock:
        _active[id(obj)] = (os.getpid(), path, is_dir)
        _install_handlers()


def untrack(obj: Any) -> None:
    """Forget what :func:`track` registered for ``obj`` (published, removed, or kept)."""
    with _lock:
        _active.pop(id(obj), None)
        if not any(pid == os.getpid() for pid, _p, _d in _active.values()):
            _restore_handlers()


@contextmanager
def holding_signals() -> Iterator[None]:
    """Hold SIGINT/SIGTERM/SIGHUP back while a group of renames publishes an output."""
    global _held
    with _lock:
        _held += 1
        _install_handlers()
    try:
        yield
    finally:
        with _lock:
            _held -= 1
            pending = list(_pending) if not _held else []
            if not _held:
                _pending.clear()
                if not _active:
                    _restore_handlers()
        for s in pending[:1]:
            os.kill(os.getpid(), s)


# -- fault injection (tests) ----------------------------------------------------------------------
_fault_written = 0


def _fault_plan() -> tuple[int, str] | None:
    spec = os.environ.get(FAULT_ENV)
    if not spec:
        return None
    n, _, action = spec.partition(":")
    return int(n), (action or "SIGKILL").upper()


def _fault_create() -> None:
    """``EROFS``/``EACCES`` actions fail the creation of every output (a read-only or
    unwritable destination)."""
    plan = _fault_plan()
    if plan is not None and plan[1] in ("EROFS", "EACCES"):
        code = getattr(errno, plan[1])
        raise OSError(code, os.strerror(code))


def fault_tick(n: int, dest: str) -> None:
    """Count ``n`` bytes written to ``dest`` for the fault injection (module doc): a writer
    outside this module (a range task's pwrite) calls it before each write."""
    global _fault_written
    plan = _fault_plan()
    if plan is None:
        return
    before = _fault_written
    _fault_written += n
    if before <= plan[0] < _fault_written or (plan[0] == 0 and before == 0):
        action = plan[1]
        if action in ("ENOSPC", "EIO"):
            code = getattr(errno, action)
            raise OSError(code, os.strerror(code))
        os.kill(os.getpid(), getattr(signal, action))


# -- errors ---------------------------------------------------------------------------------------
def write_error(e: OSError, dest: str) -> WriteError:
    """The WriteError naming ``dest`` (never a temporary name) for ``OSError`` ``e``."""
    reason = e.strerror or str(e)
    if e.errno == errno.EFBIG:
        reason = "file too large (a file-size limit or the file system's maximum)"
    hint = None
    if e.errno in (errno.ENOSPC, errno.EDQUOT if hasattr(errno, "EDQUOT") else errno.ENOSPC, errno.EFBIG):
        hint = "free some space or write elsewhere; nothing was written"
    elif e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        hint = "the destination folder is not writable; nothing was written"
    elif e.errno == errno.ENOENT:
        hint = "its folder does not exist; nothing was written"
    return WriteError(f"cannot write: {reason}", path=dest, hint=hint)


def _iov_max() -> int:
    try:
        n = os.sysconf("SC_IOV_MAX")
    except (AttributeError, ValueError, OSError):
        n = 16
    return max(16, min(1024, n))  # (-1: no limit said)


#: buffers given to one ``os.writev`` (POSIX guarantees 16; Linux and macOS take 1024)
IOV_MAX = _iov_max()


def _writev_all(fd: int, bufs: list[Any]) -> None:
    """Write every byte of ``bufs`` to ``fd`` in order (a short write goes on with the
    rest, one buffer at a time)."""
    for s in range(0, len(bufs), IOV_MAX):
        part = bufs[s : s + IOV_MAX]
        got = os.writev(fd, part)
        if got == sum(map(len, part)):
            continue
        for b in part:  # rare: a signal or a full disk in the middle
            m = len(b)
            if got >= m:
                got -= m
                continue
            rest = memoryview(b)[got:]
            got = 0
            while len(rest):
                w = os.write(fd, rest)
                if w <= 0:
                    raise OSError(errno.EIO, "write made no progress")
                rest = rest[w:]


#: batches a file may have in flight on its helper thread (see _Guarded.writev_behind)
_BEHIND = 2


class _Guarded:
    """The temporary file as writers see it: OSError becomes :class:`WriteError` naming
    the destination, and bytes are counted for the fault-injection hook. A batch given
    to :meth:`writev_behind` is written on a helper thread while the caller goes on;
    every other use of the file waits for it first (and raises its error)."""

    def __init__(self, f: BinaryIO, dest: str) -> None:
        self._f = f
        self._dest = dest
        self._behind: list[Any] = []  # the batches in flight (Futures), oldest first

    def drain(self, keep: int = 0) -> None:
        """Wait for the batches in flight (all but the newest ``keep``); their
        :class:`WriteError` is raised here."""
        behind = self._behind
        while len(behind) > keep:
            behind.pop(0).result()

    def write(self, b: Any) -> int:
        self.drain()
        n = b.nbytes if isinstance(b, memoryview) else len(b)
        try:
            fault_tick(n, self._dest)
            r = self._f.write(b)
        except OSError as e:
            raise write_error(e, self._dest) from None
        return n if r is None else r

    def writev(self, bufs: list[Any]) -> int:
        """:meth:`write` of each of ``bufs`` (``bytes`` or one-dimensional byte
        memoryviews) in turn, without joining them: one ``os.writev`` per :data:`IOV_MAX`
        buffers. The same errors and fault-injection count as :meth:`write`; where the
        system has no ``writev``, one :meth:`write` of them joined."""
        self.drain()
        return self._writev(bufs)

    def writev_behind(self, bufs: list[Any]) -> int:
        """:meth:`writev` of ``bufs`` on this process's ``write`` helper thread, returning
        once at most :data:`_BEHIND` batches are in flight: the system copies them on a
        second core while the caller makes the next. The caller gives
        ``bufs`` up: nothing may change them (views of a file's map, new ``bytes``)."""
        self.drain(keep=_BEHIND - 1)
        if not hasattr(os, "writev"):
            return self._writev(bufs)
        from .threads import helper

        try:
            fut = helper("write").submit(self._writev, bufs)
        except RuntimeError:  # the interpreter is shutting down (an atexit hook): no new threads
            return self._writev(bufs)
        self._behind.append(fut)
        time.sleep(0)  # (lets the helper take the GIL now, up to its system call, rather than at the next switch interval)
        return sum(map(len, bufs))

    def _writev(self, bufs: list[Any]) -> int:
        n = sum(map(len, bufs))
        if not hasattr(os, "writev"):
            return self.write(b"".join(bufs))
        try:
            fault_tick(n, self._dest)
            f = self._f
            f.flush()  # what the buffered file holds goes first
            fd = f.fileno()
            _writev_all(fd, bufs)  # (the buffered file asks the system where it is: tell() holds)
        except OSError as e:
            raise write_error(e, self._dest) from None
        return n

    def flush(self) -> None:
        self.drain()
        try:
            self._f.flush()
        except OSError as e:
            raise write_error(e, self._dest) from None

    def __getattr__(self, name: str) -> Any:
        self.drain()  # (tell, seek, fileno...: the file once the batch in flight is written)
        return getattr(self._f, name)


class AtomicFile:
    """A binary file that appears at ``path`` only when :meth:`commit` is called.

    Args:
        path: the target.
        durable: fsync before the rename (power-loss safety; slower).
        dest: the path errors name when ``path`` is itself inside a staging folder.
        store: the :class:`~torchless.io.store.Store` ``path`` is in, as the writer's
            entry resolved it (None: ``path`` is resolved here, once).

    Example:
        >>> with AtomicFile("out.bin") as f:     # doctest: +SKIP
        ...     f.file.write(b"...")
    """

    def __init__(
        self, path: PathLike, *, durable: bool = False, dest: PathLike | None = None, store: Store | None = None
    ) -> None:
        store, self.path = target(path, store)  # where it is published, asked once
        self.durable = durable
        self.dest = os.fspath(dest) if dest is not None else self.path  # the name errors give
        self.url = self.path if store.remote else None
        if self.url is not None:
            from .remote import check_writable

            check_writable(self.url)
        if self.url is not None:  # staged in the temporary folder, uploaded as one object on commit
            import tempfile

            folder = tempfile.gettempdir()
        else:
            folder = os.path.dirname(os.path.abspath(self.path))
            if os.path.isdir(self.path):
                raise WriteError("cannot write: the destination is a folder", path=self.dest)
        clean_stale(folder)
        self.tmp = temp_path(folder, "file")
        with holding_signals():  # created and tracked as one step: an interrupt never falls between
            try:
                _fault_create()
                fd = os.open(self.tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o600)
            except OSError as e:
                raise write_error(e, self.dest) from None
            track(self, self.tmp, False)
        self._raw: BinaryIO = os.fdopen(fd, "wb", buffering=1 << 20)
        # _Guarded forwards the file methods writers call (write, flush, tell...) without
        # subclassing BinaryIO, whose abstract interface is far wider than what is used
        self._guard = _Guarded(self._raw, self.dest)
        self.file: BinaryIO = self._guard  # type: ignore[assignment]  # (a _Guarded, not a BinaryIO: see above)
        self._done = False
        self._finished = False

    def finish(self) -> None:
        """Flush and close the temporary file without publishing it (see :func:`publish`)."""
        if self._finished:
            return
        try:
            self._guard.drain()
        except BaseException:
            self.abort()
            raise
        try:
            self._raw.flush()
            if self.durable:  # survive power loss too, at the cost of waiting for the disk
                os.fsync(self._raw.fileno())
            self._raw.close()
            os.chmod(self.tmp, 0o666 & ~_umask())
        except OSError as e:
            self.abort()
            raise write_error(e, self.dest) from None
        self._finished = True

    def commit(self) -> None:
        """Finish the file and rename it over the destination."""
        if self._done:
            return
        self.finish()
        with holding_signals():
            if interrupted() is not None:
                self.abort()
                _refuse_if_interrupted()
            try:
                if self.url is not None:
                    from .remote import upload

                    upload(self.tmp, self.url)
                    _remove(self.tmp, False)
                else:
                    os.replace(self.tmp, self.path)
            except OSError as e:
                self.abort()
                raise write_error(e, self.dest) from None
            except WriteError:
                self.abort()
                raise
            self._done = True
            untrack(self)

    def abort(self) -> None:
        """Remove the temporary file; the destination is untouched."""
        if self._done:
            return
        self._done = True
        try:
            self._guard.drain()  # (a batch in flight finishes before its file goes)
        except Exception:  # noqa: BLE001 - its error is moot: the file is thrown away
            pass
        try:
            self._raw.close()
        except OSError:  # the buffered tail cannot be flushed (full disk): nothing to keep
            pass
        finally:
            _remove(self.tmp, False)
            untrack(self)

    def __enter__(self) -> AtomicFile:
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        if exc_type is None:
            self.commit()
        else:
            self.abort()


class AtomicDir:
    """A folder that appears at ``path`` only when :meth:`commit` is called.

    Files are written into :attr:`tmp` (a hidden folder beside ``path``). On commit the
    folder is renamed to ``path``; when ``path`` already exists as an empty folder it is
    replaced; when it exists with other files and ``merge`` is set, the new files are
    moved into it (``last`` names moved last, e.g. a checkpoint's metadata), with
    signals held back; ``replace`` lets them replace files of the same name (never a
    symlink, never a folder).

    Raises:
        WriteError: the destination exists and is not an empty folder (without
            ``merge``), or a file of the output is already there.
    """

    def __init__(self, path: PathLike, *, merge: bool = False, replace: bool = False, store: Store | None = None) -> None:
        store, self.path = target(path, store)  # where it is published, asked once (``store``: as for AtomicFile)
        self.merge = merge
        self.replace = replace
        self.url = self.path if store.remote else None
        if self.url is not None:
            from .remote import check_writable

            check_writable(self.url)
        if self.url is not None:  # staged in the temporary folder, uploaded file by file on commit
            import tempfile

            parent = tempfile.gettempdir()
            clean_stale(parent)
            self.tmp = temp_path(parent, "dir")
            with holding_signals():  # created and tracked as one step
                try:
                    _fault_create()
                    os.mkdir(self.tmp, 0o700)
                except OSError as e:
                    raise write_error(e, self.path) from None
                track(self, self.tmp, True)
            self._done = False
            return
        parent = os.path.dirname(os.path.abspath(self.path))
        if os.path.exists(self.path) and not os.path.isdir(self.path):
            raise WriteError("cannot write: the destination exists and is not a folder", path=self.path)
        if not os.path.isdir(parent):
            raise WriteError("cannot write: its parent folder does not exist", path=self.path)
        clean_stale(parent)
        if os.path.isdir(self.path):
            clean_stale(self.path)
        self.tmp = temp_path(parent, "dir")
        with holding_signals():  # created and tracked as one step: an interrupt never falls between
            try:
                _fault_create()
                os.mkdir(self.tmp, 0o777)
            except OSError as e:
                raise write_error(e, self.path) from None
            track(self, self.tmp, True)
        self._done = False

    def commit(self, last: Sequence[str] = ()) -> None:
        """Publish the folder (see the class doc)."""
        if self._done:
            return
        with holding_signals():
            if interrupted() is not None:
                self.abort()
                _refuse_if_interrupted()
            try:
                if self.url is not None:
                    self._upload(last)
                    _rmtree(self.tmp, ignore_errors=True)
                elif os.path.isdir(self.path) and os.listdir(self.path):
                    if not self.merge:
                        raise WriteError("cannot write: the destination folder is not empty", path=self.path)
                    self._check_merge(self.tmp, self.path)
                    self._merge(self.tmp, self.path, last)
                    _rmtree(self.tmp, ignore_errors=True)
                else:
                    if os.path.isdir(self.path):
                        os.rmdir(self.path)
                    os.rename(self.tmp, self.path)
            except OSError as e:
                self.abort()
                raise write_error(e, self.path) from None
            except WriteError:
                self.abort()
                raise
            self._done = True
            untrack(self)

    def _upload(self, last: Sequence[str]) -> None:
        """Upload the staged files, those named in ``last`` (a checkpoint's metadata, an
        index) after every other one succeeded: a reader never finds metadata naming a
        file that is not there."""
        from . import remote

        url = self.url
        if url is None:  # only folders staged for a URL are uploaded
            raise InternalError("upload of a local folder")

        files = []
        for root, _dirs, names in os.walk(self.tmp):
            for n in names:
                full = os.path.join(root, n)
                files.append((os.path.relpath(full, self.tmp).replace(os.sep, "/"), full))
        # present(), not isdir(): a failed check taken as "empty" would upload over files
        present = set(remote.listdir(url)) if remote.present(url, "cannot check the destination folder") else set()
        clash = sorted(rel for rel, _ in files if rel.split("/", 1)[0] in present)
        if present and not self.merge:
            raise WriteError("cannot write: the destination folder is not empty", path=url)
        if clash and not self.replace:
            raise WriteError("cannot write: the destination already holds a file of this name", path=remote.join(url, clash[0]))
        done: list[str] = []
        try:
            for rel, full in sorted(files, key=lambda f: (f[0] in last or f[0].rsplit("/", 1)[-1] in last, f[0])):
                remote.upload(full, remote.join(url, rel))
                done.append(rel)
        except BaseException:
            # nothing in ``last`` was published; the payload files that were are removed
            # (best effort: a reader would not take them for a checkpoint anyway)
            for rel in done:
                remote.remove(remote.join(url, rel))
            raise

    def _check_merge(self, src: str, dst: str) -> None:
        """Refuse before moving anything: links in the way, files of the same name
        (unless ``replace``), a file where a folder goes or the reverse."""
        for n in os.listdir(src):
            s, d = os.path.join(src, n), os.path.join(dst, n)
            if not os.path.lexists(d):
                continue
            if os.path.islink(d):
                raise WriteError("cannot write: a symlink in the destination is in the way; refusing to follow it", path=d)
            if os.path.isdir(s) and os.path.isdir(d):
                self._check_merge(s, d)
            elif os.path.isdir(s) or os.path.isdir(d) or not self.replace:
                raise WriteError("cannot write: the destination already holds a file of this name", path=d)

    def _merge(self, src: str, dst: str, last: Sequence[str]) -> None:
        for n in sorted(os.listdir(src), key=lambda n: (n in last, n)):
            s, d = os.path.join(src, n), os.path.join(dst, n)
            if os.path.isdir(s) and os.path.isdir(d) and not os.path.islink(d):
                self._merge(s, d, last)
            else:
                os.replace(s, d)

    def public(self, e: BaseException) -> BaseException:
        """``e`` with a path inside the temporary folder renamed to the destination's (so
        errors never name the temporary)."""
        p = getattr(e, "path", None)
        if isinstance(e, WriteError) and isinstance(p, str) and p.startswith(self.tmp):
            e.path = self.path + p[len(self.tmp) :]
        return e

    def abort(self) -> None:
        """Remove the temporary folder; the destination is untouched."""
        if self._done:
            return
        self._done = True
        _remove(self.tmp, True)
        untrack(self)

    def __enter__(self) -> AtomicDir:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.commit()
        else:
            self.abort()
            self.public(exc)


def publish(files: Sequence[AtomicFile]) -> None:
    """Commit finished files in order (shards first, their index last) with signals held
    back, so an interruption never leaves an index naming a missing shard. On failure
    the files not yet published are removed, and so are the objects this call created at
    a URL; an object that replaced one already there stays, as a local file renamed into
    place does (removing it would leave an earlier index naming a missing shard).

    Raises:
        WriteError: also when the store cannot say whether an object at a URL is already
            there (a network failure): the publish stops before it, as nothing it could
            not prove it created may be removed if a later step failed.
    """
    with holding_signals():
        created: list[str] = []
        try:
            for f in files:
                f.finish()
            for f in files:
                if f.url is not None:
                    from ..core.errors import UsageError
                    from .remote import present

                    try:
                        new = not present(f.url, "cannot write: the store did not say whether the object is already there")
                    except UsageError as e:
                        raise WriteError(e.message, path=f.url) from None
                    f.commit()
                    if new:
                        created.append(f.url)
                else:
                    f.commit()
        except BaseException:
            for f in files:
                f.abort()
            if created:
                from .remote import remove

                for url in created:
                    remove(url)  # best effort, as AtomicDir's upload does
            raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def make_folder_for(path: Any, store: Store | None = None) -> None:
    """Create the folder that will hold ``path``, with its missing parents, as
    ``save_pretrained`` creates its directory (sharded outputs); nothing for a URL (object
    stores have no folders to make; a ``file://`` URL included) or a name in the current
    folder. ``store``: as for :class:`AtomicFile`."""
    if not isinstance(path, (str, os.PathLike)):
        return
    folder = os.path.dirname(os.fspath(path))
    if not folder:
        return
    store, local = target(path, store)
    if not store.remote and local == os.fspath(path):  # (not a URL as given)
        os.makedirs(folder, exist_ok=True)


def target(path: PathLike, store: Store | None = None) -> tuple[Store, str]:
    """``(store, path)`` of an output: the store its writer's entry resolved (``path`` kept
    as given), or, without one, ``path`` resolved here (a ``file://`` URL becomes the local
    path it names): the one place the outputs of this module resolve a location."""
    if store is not None:
        return store, os.fspath(path)
    return resolve(os.fspath(path))


def atomic_write_bytes(path: PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically."""
    with AtomicFile(path) as f:
        f.file.write(data)
