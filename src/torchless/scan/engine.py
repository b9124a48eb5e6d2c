"""The real unpicklers as a second engine: record what they would resolve and call.

:class:`RecordingUnpickler` subclasses CPython's C unpickler (``_pickle.Unpickler``, the
one behind ``pickle.load``, ``torch.load(weights_only=False)``, ``numpy.load`` and
``pickle.loads``). Its ``find_class`` and ``persistent_load`` never import or return
anything real: every global, every persistent id and every value a call returns is a
fresh *inert class* of ours (a class, so that NEWOBJ accepts it as the real one would
accept a class). Its metaclass records what the unpickler does with it: calls (REDUCE,
INST, OBJ go through ``type.__call__``; NEWOBJ and NEWOBJ_EX through ``__new__``),
``__setstate__`` (BUILD), ``extend``/``append`` (APPEND(S)), ``__setitem__``
(SETITEM(S)) and ``add`` (ADDITEMS). Nothing in the stream can reach a real callable:
the only objects the unpickler ever holds are data it built itself and these classes.

The record (:class:`Record`) is a list of normalised events in the order they happen,
plus the outcome (the normalised value at STOP, or the error). The scanner's symbolic
run produces the same form (:func:`record_of`), so the two can be compared event by event
(:func:`compare`): the differential fuzzer in the tests does that on millions of generated
streams, and the scanner can do it per stream in a resource-limited child process
(:class:`EngineWorker`), reporting any difference as ``engine-disagreement``
(:mod:`torchless.scan.differential` runs both sides).

This module imports nothing from torchless: the worker process loads this file alone.

Reader paths (``reader=``), as the loaders use them:

* ``"bytes"``: ``pickle.loads`` (the whole stream is the unpickler's buffer);
* ``"bytesio"``: ``io.BytesIO`` (no ``peek``: frames are read with ``read``), what torch
  uses for ``data.pkl`` of a zip checkpoint;
* ``"file"``: a buffered file (``peek`` + ``readinto``), ``torch.load(path)`` of a legacy
  file, ``pickle.load(open(...))``, ``numpy.load`` of ``.npy``;
* ``"zipmember"``: a member opened with :mod:`zipfile` (``peek`` returns at most 512
  bytes), ``numpy.load`` of an ``.npz``.

:func:`record_python` runs the pure-Python unpickler (``pickle._Unpickler``), which joblib
subclasses; it reads frames through its own ``_Unframer``.
"""

from __future__ import annotations

import _compat_pickle
import _pickle
import copyreg
import gc
import io
import marshal
import os
import pickle
import select
import struct
import subprocess
import sys
import zipfile
from dataclasses import dataclass, field
from typing import IO, Any

__all__ = [
    "Record",
    "RecordingUnpickler",
    "record_c",
    "record_python",
    "compare",
    "normalize",
    "EngineWorker",
    "READERS",
    "RecordingPyUnpickler",
    "shared_worker",
    "engine_enabled",
    "probe_readers",
    "digest",
    "record_of",
    "ENGINE_MAX_STREAM",
    "ENGINE_WATCHDOG_SECONDS",
    "EngineTimeout",
]

READERS = ("bytes", "bytesio", "file", "zipmember")

_MAX_NORM_DEPTH = 24


class _Ids:
    """Numbers the symbolic values of one run in creation order, and maps them back."""

    def __init__(self) -> None:
        self.ids: dict[int, int] = {}
        self.keep: list[Any] = []
        self.budget = _MAX_RUN_NODES  # nodes normalised in the whole run

    def new(self, obj: Any) -> int:
        n = len(self.keep)
        self.ids[id(obj)] = n
        self.keep.append(obj)
        return n

    def get(self, obj: Any) -> int | None:
        return self.ids.get(id(obj))


#: nodes of one value normalised; past it a value becomes ``("cut",)`` at the same place
#: on both sides (a memo can share one list 2**40 times: never walk a value as a tree)
_MAX_NORM_NODES = 2000
#: nodes normalised in one run; a record that runs out is marked ``exhausted`` and the
#: scanner does not compare it (the fuzzer's streams never get there)
_MAX_RUN_NODES = 200_000


def normalize(v: Any, ids: _Ids) -> Any:
    """A canonical, comparable (and marshal-able) form of a value built by an unpickler.

    Symbolic values become ``("sym", n)`` with ``n`` their creation index, so the C
    unpickler's inert classes and the pickle machine's ``Sym`` objects compare equal
    when they were created by the same event. Cycles, very deep and very large values
    are cut, deterministically (the same cut on both sides of a comparison).
    """
    left = [min(_MAX_NORM_NODES, ids.budget)]
    out = _norm(v, ids, 0, (), left)
    ids.budget -= min(_MAX_NORM_NODES, ids.budget) - max(0, left[0])
    if left[0] < 0:
        ids.budget -= 1
    return out


def _norm(v: Any, ids: _Ids, depth: int, active: tuple[int, ...], budget: list[int]) -> Any:
    budget[0] -= 1
    if budget[0] < 0:
        return ("cut",)
    n = ids.get(v)
    if n is not None:
        return ("sym", n)
    t = type(v)
    if v is None or t is bool or t is int or t is str or t is bytes:
        return (t.__name__, v)
    if t is float:
        return ("float", repr(v))
    if t is bytearray:
        return ("bytearray", bytes(v))
    if t is memoryview:
        try:
            return ("memoryview", v.tobytes(), v.readonly)
        except (ValueError, TypeError):  # pragma: no cover - released views
            return ("memoryview",)
    if depth > _MAX_NORM_DEPTH:
        return ("deep",)
    if id(v) in active:
        return ("cycle",)
    act = active + (id(v),)
    if t is tuple or t is list:
        return (t.__name__, tuple(_norm(x, ids, depth + 1, act, budget) for x in v))
    if t is dict:
        return (
            "dict",
            tuple((_norm(k, ids, depth + 1, act, budget), _norm(x, ids, depth + 1, act, budget)) for k, x in v.items()),
        )
    if t is set or t is frozenset:
        # element order of a set is not a property of the stream (str hashes differ between
        # processes): each element gets the same share of what is left, fixed before the
        # walk, so the cuts do not depend on the order; the shares are drawn from the budget
        share = max(1, budget[0] // max(1, len(v)))
        subs = [[share] for _ in range(len(v))]
        items = sorted((_norm(x, ids, depth + 1, act, sub) for x, sub in zip(v, subs, strict=True)), key=repr)
        budget[0] -= sum(share - max(0, sub[0]) for sub in subs)
        return (t.__name__, tuple(items))
    return ("other", t.__name__)


@dataclass
class Record:
    """What one unpickler did with one stream.

    ``events``: ``("global", module, name)``, ``("persid", pid)``,
    ``("call", callee, args, kwargs)``, ``("build", target, state)``,
    ``("append", target, item)``, ``("setitem", target, key, value)``,
    ``("add", target, item)``; values normalised (:func:`normalize`).
    ``outcome``: ``"ok"`` or ``"error"``; ``value`` the normalised value at STOP;
    ``end`` the offset after STOP where the reader can tell it; ``error`` the exception
    type's name; ``resource``: the error was a memory or recursion exhaustion of the
    real unpickler (the model may legitimately go further).
    """

    events: list[tuple[Any, ...]] = field(default_factory=list)
    outcome: str = "ok"
    exhausted: bool = False
    value: Any = None
    end: int | None = None
    error: str = ""
    resource: bool = False

    def to_wire(self) -> tuple[Any, ...]:
        return (self.events, self.outcome, self.value, self.end, self.error, self.resource)

    @classmethod
    def from_wire(cls, t: tuple[Any, ...]) -> Record:
        return cls(events=list(t[0]), outcome=t[1], value=t[2], end=t[3], error=t[4], resource=t[5])


# -- the inert classes ---------------------------------------------------------------------
class _Rec:
    """The recorder shared by the inert classes of one run."""

    def __init__(self) -> None:
        self.ids = _Ids()
        self.events: list[tuple[Any, ...]] = []

    def n(self, v: Any) -> Any:
        return normalize(v, self.ids)

    def sym(self) -> type:
        cls = _SymMeta("inert", (), {"__new__": _inert_new, "__slots__": ()})
        type.__setattr__(cls, "_tl_rec", self)
        self.ids.new(cls)
        return cls


def _inert_new(cls: Any, *args: Any, **kwargs: Any) -> Any:
    # NEWOBJ / NEWOBJ_EX: type->tp_new(cls, args, kwargs); INST/OBJ with no arguments
    rec: _Rec = cls._tl_rec
    rec.events.append(("call", rec.n(cls), rec.n(args), rec.n(kwargs) if kwargs else None))
    return rec.sym()


class _SymMeta(type):
    """Metaclass of the inert classes: records what an unpickler does with them."""

    _tl_rec: _Rec  # set on each class by _Rec.sym

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:  # REDUCE, INST, OBJ
        rec: _Rec = cls._tl_rec
        rec.events.append(("call", rec.n(cls), rec.n(args), rec.n(kwargs) if kwargs else None))
        return rec.sym()

    def __setstate__(cls, state: Any) -> None:  # BUILD
        rec: _Rec = cls._tl_rec
        rec.events.append(("build", rec.n(cls), rec.n(state)))

    def extend(cls, items: Any) -> None:  # APPENDS, APPEND
        rec: _Rec = cls._tl_rec
        t = rec.n(cls)
        for x in items:
            rec.events.append(("append", t, rec.n(x)))

    def append(cls, item: Any) -> None:  # pragma: no cover - extend exists, so unused
        rec: _Rec = cls._tl_rec
        rec.events.append(("append", rec.n(cls), rec.n(item)))

    def __setitem__(cls, key: Any, value: Any) -> None:  # SETITEM(S)
        rec: _Rec = cls._tl_rec
        rec.events.append(("setitem", rec.n(cls), rec.n(key), rec.n(value)))

    def add(cls, item: Any) -> None:  # ADDITEMS
        rec: _Rec = cls._tl_rec
        rec.events.append(("add", rec.n(cls), rec.n(item)))


def _python2(module: str, name: str) -> tuple[str, str]:
    # what CPython's unpicklers do with _compat_pickle's tables (the oracle's side; the
    # model's side is torchless.pickle.globals.python2_name over the same tables)
    pair = _compat_pickle.NAME_MAPPING.get((module, name))
    if pair is not None:
        return pair
    return _compat_pickle.IMPORT_MAPPING.get(module, module), name


def _c_proto_below_3(up: Any) -> bool:
    """Whether the C unpickler's current protocol is < 3 (it then renames Python-2 names).

    The C unpickler does not expose its protocol; its own ``find_class`` applies the
    renames exactly when it is < 3, so ask it about a name that only the rename table
    makes resolvable (``itertools.izip`` -> ``builtins.zip``). Both modules are already
    imported; what it returns is discarded.
    """
    try:
        _pickle.Unpickler.find_class(up, "itertools", "izip")
        return True
    except AttributeError:
        return False


class RecordingUnpickler(_pickle.Unpickler):
    """CPython's C unpickler with inert, recording ``find_class`` / ``persistent_load``."""

    def __init__(self, file: Any, *, encoding: str = "ASCII", rec: _Rec | None = None) -> None:
        super().__init__(file, encoding=encoding)
        self.rec = rec or _Rec()

    def find_class(self, module: str, name: str) -> Any:  # noqa: D102 - see class doc
        if _c_proto_below_3(self):
            module, name = _python2(module, name)
        self.rec.events.append(("global", module, name))
        return self.rec.sym()

    def persistent_load(self, pid: Any) -> Any:  # noqa: D102
        self.rec.events.append(("persid", self.rec.n(pid)))
        return self.rec.sym()


class RecordingPyUnpickler(pickle._Unpickler):
    """The pure-Python unpickler (what joblib subclasses), inert and recording."""

    proto: int  # set by pickle._Unpickler (the stream's protocol so far)
    fix_imports: bool

    def __init__(self, file: Any, *, encoding: str = "ASCII", rec: _Rec | None = None) -> None:
        super().__init__(file, encoding=encoding)
        self.rec = rec or _Rec()

    def find_class(self, module: str, name: str) -> Any:  # noqa: D102
        if self.proto < 3 and self.fix_imports:
            module, name = _python2(module, name)
        self.rec.events.append(("global", module, name))
        return self.rec.sym()

    def persistent_load(self, pid: Any) -> Any:  # noqa: D102
        self.rec.events.append(("persid", self.rec.n(pid)))
        return self.rec.sym()


def _zip_member(data: bytes) -> Any:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
        z.writestr("arr_0.npy", data)
    return zipfile.ZipFile(io.BytesIO(buf.getvalue())).open("arr_0.npy")


def _open(data: bytes, reader: str) -> Any:
    if reader == "bytesio":
        return io.BytesIO(data)
    if reader == "file":
        return io.BufferedReader(io.BytesIO(data))  # a raw file under a buffer: peek + readinto
    if reader == "zipmember":
        return _zip_member(data)
    raise ValueError(f"unknown reader {reader!r}")


def _run(make: Any, data: bytes, reader: str, encoding: str, start: int) -> Record:
    rec = _Rec()
    out = Record()
    # the extension cache is process-wide: a code cached by an earlier run would be
    # served without a find_class call
    copyreg._extension_cache.clear()  # type: ignore[attr-defined]  # private to copyreg, not in typeshed
    try:
        if reader == "bytes" and make is RecordingUnpickler:
            # pickle.loads: the bytes are the unpickler's whole input buffer
            value = make(_WholeReader(data[start:]), encoding=encoding, rec=rec).load()
        else:
            f = _open(data, reader) if reader != "bytes" else io.BytesIO(data)
            if start:
                if reader == "zipmember":
                    f.read(start)
                else:
                    f.seek(start)
            value = make(f, encoding=encoding, rec=rec).load()
            try:
                out.end = f.tell()
            except (OSError, ValueError):  # pragma: no cover - unseekable member
                out.end = None
        out.value = rec.n(value)
    except (MemoryError, RecursionError) as e:
        out.outcome, out.error, out.resource = "error", type(e).__name__, True
    except Exception as e:  # noqa: BLE001 - any error of the real unpickler is an outcome
        out.outcome, out.error = "error", type(e).__name__
    finally:
        copyreg._extension_cache.clear()  # type: ignore[attr-defined]  # private to copyreg, not in typeshed
    out.events = rec.events
    return out


class _WholeReader:
    """A file whose first read returns the whole stream: the C unpickler then holds the
    entire input in its buffer, exactly as with ``pickle.loads`` (``_pickle.loads``
    takes no ``find_class``; all later reads are served from memory and a read past
    the end is a truncation error, as in memory)."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.done = False

    def read(self, n: int = -1) -> bytes:
        if self.done:
            return b""
        self.done = True
        return self.data

    def readline(self) -> bytes:
        return self.read()


def record_c(data: bytes, reader: str = "bytes", *, encoding: str = "latin1", start: int = 0) -> Record:
    """Run CPython's C unpickler (inert, recording) over ``data`` through ``reader``."""
    return _run(RecordingUnpickler, data, reader, encoding, start)


def record_python(data: bytes, reader: str = "bytesio", *, encoding: str = "latin1", start: int = 0) -> Record:
    """Run the pure-Python unpickler (joblib's base class), inert and recording."""
    return _run(RecordingPyUnpickler, data, "bytesio" if reader == "bytes" else reader, encoding, start)


def compare(oracle: Record, model: Record, *, check_end: bool = True) -> str | None:
    """None when the model agrees with the oracle, else a one-line description.

    Agreement: the same events in the same order and the same outcome (and value and
    end offset when both finish). One tolerance: when the real unpickler ran out of
    memory or recursion (a resource of its process, not a property of the stream), the
    model may go further, so the oracle's events need only be a prefix of the model's.
    Likewise a model that stops on one of its explicit limits needs only to have done a
    prefix of what the oracle did.
    """
    if oracle.resource and oracle.outcome == "error":
        if model.events[: len(oracle.events)] != oracle.events:
            return _first_diff(oracle.events, model.events)
        return None
    if model.resource and model.outcome == "error":
        if oracle.events[: len(model.events)] != model.events:
            return _first_diff(oracle.events, model.events)
        return None
    if oracle.events != model.events:
        return _first_diff(oracle.events, model.events)
    if oracle.outcome != model.outcome:
        return f"outcome: real unpickler {oracle.outcome} {oracle.error}, model {model.outcome} {model.error}"
    if oracle.outcome == "ok":
        if oracle.value != model.value:
            return f"value at STOP: real {oracle.value!r:.200} model {model.value!r:.200}"
        if check_end and oracle.end is not None and oracle.end != model.end:
            return f"end offset: real {oracle.end} model {model.end}"
    return None


def _first_diff(a: list[Any], b: list[Any]) -> str:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return f"event {i}: real {x!r:.200} model {y!r:.200}"
    if len(a) != len(b):
        i = min(len(a), len(b))
        extra = a[i] if len(a) > len(b) else b[i]
        who = "real unpickler" if len(a) > len(b) else "model"
        return f"event {i}: only the {who} does {extra!r:.200} ({len(a)} vs {len(b)} events)"
    return "events differ"


# -- the second engine in a child process ------------------------------------------------
_WORKER_CODE = r"""
import marshal, os, resource, struct, sys
as_limit, cpu = int(sys.argv[1]), int(sys.argv[2])
try:
    resource.setrlimit(resource.RLIMIT_AS, (as_limit, as_limit))
except (ValueError, OSError):
    pass

def cpu_limit():
    # per request, not per process: the child serves many files, and a limit on its
    # total would make a request's answer depend on the requests before it
    try:
        u = resource.getrusage(resource.RUSAGE_SELF)
        soft = int(u.ru_utime + u.ru_stime) + cpu + 1
        hard = resource.getrlimit(resource.RLIMIT_CPU)[1]
        if hard != resource.RLIM_INFINITY:
            soft = min(soft, hard)
        resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))
    except (ValueError, OSError):
        pass
sys.setrecursionlimit(5000)
import copyreg, importlib.util
# this file alone, not the torchless package (a fast start; nothing else is needed)
spec = importlib.util.spec_from_file_location("torchless_engine_worker", sys.argv[3])
eng = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = eng
spec.loader.exec_module(eng)
record_c = eng.record_c
inp, out = sys.stdin.buffer, sys.stdout.buffer
# the parent's extension registry first (the model resolves EXT codes through it)
(k,) = struct.unpack("<I", inp.read(4))
for code, pair in marshal.loads(inp.read(k)).items():
    copyreg._inverted_registry[code] = tuple(pair)
while True:
    head = inp.read(8)
    if len(head) < 8:
        break
    n, start = struct.unpack("<II", head)
    data = inp.read(n)
    cpu_limit()
    full = start & 0x80000000
    probe = start & 0x40000000
    start &= 0x3FFFFFFF
    try:
        if probe:
            blob = marshal.dumps(("probe", eng.probe_readers(data, bool(start & 1), "py" if start & 2 else "c")))
        else:
            r = record_c(data, "bytes", start=start).to_wire()
            blob = marshal.dumps(r)
            if not full:  # a digest is enough when the parent's model agrees
                blob = marshal.dumps(("digest", eng.digest(r)))
    except BaseException as e:  # noqa
        blob = marshal.dumps(([], "error", None, None, "engine:" + type(e).__name__, True))
    out.write(struct.pack("<I", len(blob)) + blob)
    out.flush()
"""


def _pipe(stream: IO[bytes] | None) -> IO[bytes]:
    """A pipe of the worker process (``Popen`` was given ``PIPE``, so it is never None;
    an OSError, as a dead worker's pipe gives, otherwise)."""
    if stream is None:
        raise BrokenPipeError("the scan engine's worker has no pipe")
    return stream


#: the wall-clock watchdog of one request to the child (the scan's budgets are defined in
#: :mod:`torchless.scan.budget`, which takes this from here: this file runs alone in the
#: child and imports nothing). A last resort: a request is a stream of at most
#: ``ENGINE_MAX_STREAM`` bytes or a probe window of at most 1 MiB, milliseconds of the
#: real unpickler's work, so a request that takes this long says the machine is stalled or
#: the input found work no budget counts; the scanner then reports a timeout (UNANALYSABLE)
ENGINE_WATCHDOG_SECONDS = 60.0


class EngineTimeout(Exception):
    """The engine's child did not answer within its wall-clock watchdog."""


class EngineWorker:
    """One persistent child process running the recording C unpickler.

    The child has an address-space limit (``memory``), a CPU-time limit per request
    (``cpu_seconds``, above the watchdog: it never decides first) and a per-request
    wall-clock watchdog (``timeout``); a stream that exhausts them kills the child (a new
    one starts on the next request) and comes back as ``None``, with :attr:`timed_out`
    set when it was the watchdog (never a silent verdict: the scanner reports it). One
    worker serves a whole scan, so a stream costs a pipe round trip, not a process start.
    """

    def __init__(self, *, memory: int = 1 << 30, cpu_seconds: int = 120, timeout: float = ENGINE_WATCHDOG_SECONDS) -> None:
        self.memory = memory
        self.cpu_seconds = cpu_seconds
        self.timeout = timeout
        self.proc: subprocess.Popen[bytes] | None = None
        self.timed_out = False  # the last request's answer was cut by the watchdog

    def _start(self) -> subprocess.Popen[bytes]:
        p = self._spawn()
        reg = marshal.dumps({int(c): tuple(map(str, pair)) for c, pair in copyreg._inverted_registry.items()})  # type: ignore[attr-defined]  # private, not in typeshed
        _pipe(p.stdin).write(struct.pack("<I", len(reg)) + reg)
        _pipe(p.stdin).flush()
        return p

    def _spawn(self) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", _WORKER_CODE, str(self.memory), str(self.cpu_seconds), os.path.abspath(__file__)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )

    def record(self, data: bytes, start: int = 0) -> Record | None:
        """The C unpickler's record of the stream at ``start``; None when the child died
        or timed out on it (the caller decides what that means)."""
        return self.result() if self.submit(data, start) else None

    def submit(self, data: bytes, start: int = 0, *, digest: bool = False, probe: bool = False) -> bool:
        """Send a stream to the child; :meth:`result` collects the answer (the caller can
        work meanwhile: the child runs on another core)."""
        self.timed_out = False
        if len(data) >= 1 << 32:
            return False
        try:
            if self.proc is None or self.proc.poll() is not None:
                self.proc = self._start()
            p = self.proc
            flags = 0x40000000 if probe else (0 if digest else 0x80000000)
            _pipe(p.stdin).write(struct.pack("<II", len(data), start | flags) + bytes(data))
            _pipe(p.stdin).flush()
            return True
        except (OSError, ValueError):
            self.close()
            return False

    def result(self) -> Any:
        """The answer to the last :meth:`submit` (a :class:`Record`, or with ``digest`` the
        record's :func:`digest`); None if the child died or timed out."""
        p = self.proc
        if p is None:
            return None
        try:
            head = self._read(p, 4)
            if head is None:
                raise OSError("no answer")
            (k,) = struct.unpack("<I", head)
            blob = self._read(p, k)
            if blob is None:
                raise OSError("short answer")
            gc_was = gc.isenabled()
            gc.disable()  # a large record is many small tuples: nothing to collect
            try:
                t = marshal.loads(blob)
                return t[1] if t[0] in ("digest", "probe") else Record.from_wire(t)
            finally:
                if gc_was:
                    gc.enable()
        except (OSError, ValueError, EOFError):
            self.close()
            return None

    def probe(self, data: bytes, complete: bool, kind: str = "c") -> tuple[str, str, int | None, int] | None:
        """:func:`probe_readers` of ``data`` in the child; None if it died or timed out."""
        if not self.submit(data, (2 if kind == "py" else 0) | (1 if complete else 0), probe=True):
            return None
        got = self.result()
        if not isinstance(got, (tuple, list)) or len(got) != 4:  # the child failed on it
            return None
        return tuple(got)

    def _read(self, p: subprocess.Popen[bytes], k: int) -> bytes | None:
        fd = _pipe(p.stdout).fileno()
        chunks: list[bytes] = []
        got = 0
        import time

        deadline = time.monotonic() + self.timeout
        while got < k:
            left = deadline - time.monotonic()
            if left <= 0:
                self.timed_out = True
                return None
            r, _, _ = select.select([fd], [], [], left)
            if not r:
                self.timed_out = True
                return None
            b = os.read(fd, k - got)
            if not b:
                return None
            chunks.append(b)
            got += len(b)
        return b"".join(chunks)

    def close(self) -> None:
        """Stop the child process."""
        p, self.proc = self.proc, None
        if p is not None:
            try:
                p.kill()
                p.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):  # pragma: no cover
                pass
            for s in (p.stdin, p.stdout):
                try:
                    if s is not None:
                        s.close()
                except OSError:  # pragma: no cover
                    pass

    def __enter__(self) -> EngineWorker:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


_SHARED: EngineWorker | None = None

#: streams larger than this are not sent to the second engine: the machine's model of the
#: C unpickler is what the differential fuzzer proves, the engine is a second opinion, and
#: recording a checkpoint's thousands of tensors twice would cost more than the scan
ENGINE_MAX_STREAM = 64 << 10


def engine_enabled() -> bool:
    """Whether scans run the second engine (``TORCHLESS_SCAN_ENGINE=0`` turns it off)."""
    return os.environ.get("TORCHLESS_SCAN_ENGINE", "1") not in ("0", "off", "no", "false")


def shared_worker() -> EngineWorker:
    """The process's engine worker, started on first use and stopped at exit."""
    global _SHARED
    if _SHARED is None:
        import atexit

        _SHARED = EngineWorker()
        atexit.register(_SHARED.close)
    return _SHARED


#: bytes and str at least this long are hashed once per record and referred to after that
_DIGEST_SHARED = 64


def digest(wire: tuple[Any, ...]) -> str:
    """A short fingerprint of a record (what the child sends when all goes well).

    A value the stream shares (one bytes object behind thousands of memo reads) is hashed
    once: a bytes or str of :data:`_DIGEST_SHARED` or more met again *as the same
    object* is a back-reference. The encoding stays unambiguous, so equal fingerprints
    mean equal records; the two sides share the same objects where the stream does, and
    where they do not the fingerprints differ and the caller compares the records in full.
    (Not ``repr``: it writes a shared value out at every reference. Not ``marshal``: its
    output depends on reference counts.)
    """
    import hashlib

    events, outcome, value, _end, _error, resource = wire
    h = hashlib.sha256()
    seen: dict[int, int] = {}
    keep: list[Any] = []  # the shared values stay alive, so their ids stay theirs
    small: list[Any] = []  # a run of small leaves, hashed by repr in one go
    # an explicit stack (no recursive closure: that would be a reference cycle): a value
    # to feed, or a closing bracket (bytes) to write
    todo: list[Any] = [(list(events), outcome, value if outcome == "ok" else None, resource)]
    while todo:
        v = todo.pop()
        t = type(v)
        if t is _Close:
            if small:
                h.update(repr(small).encode("utf-8", "surrogatepass"))
                small.clear()
            h.update(v.mark)
        elif t is tuple or t is list:
            if small:
                h.update(repr(small).encode("utf-8", "surrogatepass"))
                small.clear()
            h.update(b"(" if t is tuple else b"[")
            todo.append(_CLOSE_TUPLE if t is tuple else _CLOSE_LIST)
            todo.extend(reversed(v))
        elif (t is bytes or t is str) and len(v) >= _DIGEST_SHARED:
            if small:
                h.update(repr(small).encode("utf-8", "surrogatepass"))
                small.clear()
            k = seen.get(id(v))
            if k is not None:
                h.update(b"@%d;" % k)
                continue
            seen[id(v)] = len(keep)
            keep.append(v)
            raw = v if t is bytes else v.encode("utf-8", "surrogatepass")
            h.update(b"%c%d:" % (98 if t is bytes else 115, len(raw)))
            h.update(raw)
        else:
            small.append(v)
    if small:
        h.update(repr(small).encode("utf-8", "surrogatepass"))
    return h.hexdigest()


class _Close:
    __slots__ = ("mark",)

    def __init__(self, mark: bytes) -> None:
        self.mark = mark


_CLOSE_TUPLE = _Close(b")")
_CLOSE_LIST = _Close(b"]")


def record_of(res: Any) -> Record:
    """The :class:`Record` of an analysis run with ``record=True``."""
    out = Record(events=res.events or [])
    out.exhausted = res.norm_exhausted
    if res.error is None:
        out.outcome, out.value, out.end = "ok", res.value_norm, res.end
    else:
        out.outcome, out.error = "error", type(res.error).__name__
        out.resource = type(res.error).__name__ == "LimitError"
    return out


# -- does any loader import anything? (run in the child) -------------------------------------
class _Found(Exception):
    pass


class _PidMet(Exception):
    pass


def _probe_find_class(module: Any, name: Any) -> Any:
    import re

    # a module name that is not a dotted identifier cannot name an installed module:
    # the import fails before any code runs
    if not isinstance(module, str) or not re.match(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*\Z", module):
        raise ModuleNotFoundError(f"no module named {str(module)[:60]!r}")
    raise _Found(f"{module}.{name}")


class _CProbe(_pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:  # noqa: D102
        return _probe_find_class(module, name)

    def persistent_load(self, pid: Any) -> Any:  # noqa: D102
        raise _PidMet()


class _PyProbe(pickle._Unpickler):
    def find_class(self, module: str, name: str) -> Any:  # noqa: D102
        return _probe_find_class(module, name)

    def persistent_load(self, pid: Any) -> Any:  # noqa: D102
        raise _PidMet()


def _small_int(value: Any) -> int | None:
    """A complete pickle's value when it is a small int (the parent compares it with the
    legacy stream's magic number, which lives in the pt spec: this file runs alone in the
    child and imports nothing from torchless)."""
    return value if type(value) is int and value.bit_length() <= 128 else None


def _probe_one(cls: type, data: bytes, reader: str, complete: bool, who: str) -> tuple[str, str, int | None, int]:
    f = _WholeReader(data) if reader == "bytes" else _open(data, reader)
    copyreg._extension_cache.clear()  # type: ignore[attr-defined]  # private to copyreg, not in typeshed

    def pos() -> int:
        if isinstance(f, _WholeReader):
            return 0
        try:
            return int(f.tell())
        except (OSError, ValueError, AttributeError):  # pragma: no cover
            return 0

    try:
        value = cls(f, encoding="latin1").load()
    except _Found as e:
        return ("resolves", f"imports {e}{who}", None, pos())
    except _PidMet:
        return ("stops", "a persistent id, which plain pickle.load refuses", None, pos())
    except (MemoryError, RecursionError) as e:
        return ("undecided", type(e).__name__ + who, None, pos())
    except Exception as e:  # noqa: BLE001 - the unpickler's own refusal, whatever its type
        msg = str(e)[:120]
        if not complete and (
            isinstance(e, EOFError) or "truncated" in msg or "ran out of input" in msg.lower() or "exhausted" in msg
        ):
            return ("undecided", "the stream runs past the probe window", None, pos())
        return ("stops", f"{type(e).__name__}: {msg} (at about byte {pos()}){who}", None, pos())
    finally:
        copyreg._extension_cache.clear()  # type: ignore[attr-defined]  # private to copyreg, not in typeshed
    return ("data", f"a complete pickle of {type(value).__name__}{who}", _small_int(value), pos())


def probe_readers(data: bytes, complete: bool, kind: str) -> tuple[str, str, int | None, int]:
    """Whether a loader would import something from the stream at byte 0: ``kind``
    ``"c"``: the C unpickler through each reader (bytes, io.BytesIO, buffered file, zip
    member), ``"py"``: the pure-Python unpickler (joblib's). Returns ``(outcome, detail,
    value, pos)``: ``resolves`` / ``undecided`` (any reader) win, then ``data``, then
    ``stops`` (``pos``: the most bytes a reader consumed; ``value``: a ``data`` pickle's
    value when it is a small int, else None).

    Meant for the engine's child process: the real unpicklers allocate what the stream
    asks for."""
    if kind == "py":
        return _probe_one(_PyProbe, data, "bytesio", complete, "")
    cs = [
        _probe_one(_CProbe, data, r, complete, who)
        for r, who in (
            ("bytesio", ""),
            ("bytes", " (whole-buffer reader)"),
            ("file", " (buffered file reader)"),
            ("zipmember", " (zip member reader)"),
        )
    ]
    for want in ("resolves", "undecided"):
        for c in cs:
            if c[0] == want:
                return c
    datas = [c for c in cs if c[0] == "data"]
    if datas:
        ints = [c[2] for c in datas if c[2] is not None]
        return ("data", datas[0][1], ints[0] if ints else None, max(c[3] for c in datas))
    return (cs[0][0], cs[0][1], None, max(c[3] for c in cs))
