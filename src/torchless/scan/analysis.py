"""Symbolic execution of one pickle stream in the pickle machine: what would it call?

The stream runs in :class:`~torchless.pickle.machine.Unpickler` with a resolver that never
refuses: every global becomes a :class:`Sym` (nothing is imported). REDUCE, NEWOBJ(_EX),
INST, OBJ and BUILD on a :class:`Sym` record an event and return a new :class:`Sym` for
the result, so a chain such as ``getattr(__import__('os'), 'system')('...')`` is followed to
its end: the second call is recorded as a call of a value *computed at load time*, which
is how every indirection ends. A trace hook notes the offset and opcode of each step.

A stream that the machine cannot finish (malformed, truncated) still yields everything it
did before the error: Python's unpickler executes opcodes in the same order, so what ran
before the error is exactly what a loader would have run.
"""

from __future__ import annotations

import struct
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

from ..core.errors import FormatError, TorchlessError, short_repr
from ..formats.joblib_spec import WRAPPER as JOBLIB_WRAPPER
from ..formats.npz_spec import is_npy
from ..formats.pt.spec import ZIP_MAGIC
from ..pickle.globals import Rebuilder, is_python2_name, python2_name
from ..pickle.machine import Limits, Unpickler
from ..pickle.opcodes import OPCODE_NAMES
from .budget import ARG_NODES_BASE
from .policy import Verdict, classify

__all__ = ["Sym", "GlobalUse", "CallEvent", "StreamResult", "analyse", "disassemble", "describe"]

_RANK = {"safe": 0, "unknown": 1, "dangerous": 2}
_CALL_OPS = ("REDUCE", "NEWOBJ", "NEWOBJ_EX", "INST", "OBJ")
_MEMO_READS = ("BINGET", "LONG_BINGET", "GET")


class Sym(Rebuilder):
    """A symbolic value: a global the pickle names, or what calling one would return."""

    __slots__ = ("kind", "qualname", "callee", "args", "via", "pos", "state", "items", "an", "verdict")

    def __init__(
        self,
        an: _Analyser,
        kind: str,
        qualname: str = "",
        *,
        callee: Sym | None = None,
        args: Any = (),
        via: str = "",
        pos: int = 0,
        verdict: Verdict | None = None,
    ) -> None:
        super().__init__(qualname or kind, self._do_call)
        self.an: _Analyser | None = an
        an.syms.append(self)
        self.kind = kind  # "global" | "result" | "persistent"
        self.qualname = qualname
        self.callee = callee
        self.args = args
        self.via = via
        self.pos = pos
        self.state: Any = None
        self.items: list[Any] = []
        self.verdict = verdict

    def _run(self) -> _Analyser:
        if self.an is None:
            raise RuntimeError("a symbolic value is called after its stream's analysis ended")
        return self.an

    def _do_call(self, args: tuple[Any, ...]) -> Sym:  # noqa: D102
        return self._run().on_call(self, args, {})

    def new(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Sym:
        return self._run().on_call(self, args, kwargs)

    def __torchless_build__(self, state: Any) -> Sym:
        an = self._run()
        an.on_build(self, state)
        if self.state is None:
            self.state = state
        elif isinstance(self.state, dict) and isinstance(state, dict):
            self.state.update(state)
            an.gen += 1  # a dict of the stream changed: searches made before it are stale
        return self

    def __torchless_items__(self, op: str, items: list[Any]) -> None:
        self._run().on_items(self, op, items)
        if op == "setitem":
            self.items.extend((items[i], items[i + 1]) for i in range(0, len(items) - 1, 2))
        else:
            self.items.extend(items)

    def __repr__(self) -> str:
        return describe(self)


def describe(v: Any, depth: int = 0) -> str:
    """A short, safe rendering of a symbolic value for reports."""
    if depth > 3:
        return "…"
    if isinstance(v, Sym):
        if v.kind == "global":
            return v.qualname
        if v.kind == "persistent":
            return f"persistent_load({describe(v.args, depth + 1)})"
        inner = ", ".join(describe(a, depth + 1) for a in (v.args if isinstance(v.args, tuple) else (v.args,)))
        return f"{describe(v.callee, depth + 1)}({inner})"
    if isinstance(v, (bytes, bytearray, memoryview)):
        b = bytes(v[:24])
        return repr(b) + ("…" if len(v) > 24 else "")
    if isinstance(v, str):
        return repr(v[:80]) + ("…" if len(v) > 80 else "")
    if isinstance(v, tuple):
        return (
            "("
            + ", ".join(describe(x, depth + 1) for x in v[:6])
            + (", …" if len(v) > 6 else "")
            + ("," if len(v) == 1 else "")
            + ")"
        )
    if isinstance(v, list):
        return "[" + ", ".join(describe(x, depth + 1) for x in v[:6]) + (", …" if len(v) > 6 else "") + "]"
    if isinstance(v, dict):
        items = list(v.items())[:4]
        return (
            "{"
            + ", ".join(f"{describe(k, depth + 1)}: {describe(x, depth + 1)}" for k, x in items)
            + (", …" if len(v) > 4 else "")
            + "}"
        )
    r = repr(v)
    return r[:60] + ("…" if len(r) > 60 else "")


@dataclass
class GlobalUse:
    """One global the stream resolves."""

    qualname: str
    module: str
    name: str
    offset: int
    opcode: str  # GLOBAL | STACK_GLOBAL | INST | EXT1/2/4
    verdict: Verdict
    from_memo: bool = False  # STACK_GLOBAL fed by memo reads
    raw: str = ""  # the names as written, when the Python-2 renames changed them
    called: list[str] = field(default_factory=list)  # opcodes that called it


@dataclass
class CallEvent:
    """One call (or BUILD) the stream would make."""

    opcode: str
    offset: int
    callee: Sym
    args: Any
    kwargs: Any = None


@dataclass
class StreamResult:
    """What one pickle stream does."""

    start: int
    end: int | None  # offset after STOP; None when the stream did not finish
    protocol: int
    globals: list[GlobalUse]
    calls: list[CallEvent]
    builds: list[CallEvent]
    error: TorchlessError | None
    frames: list[tuple[int, int]]  # (offset of FRAME, declared length)
    op_offsets: list[int]
    value: Any = None
    nested: list[tuple[str, bytes, int]] = field(default_factory=list)  # (what, blob, offset)
    #: where file-object readers could read other bytes than the linear walk (see
    #: :attr:`torchless.pickle.machine.ProtocolInfo.frame_hazards`)
    frame_hazards: list[tuple[int, str]] = field(default_factory=list)
    #: with ``record=True``: the run as normalised events (:mod:`torchless.scan.engine`)
    events: list[tuple[Any, ...]] | None = None
    value_norm: Any = None
    #: with ``record=True``: normalising the value ran out of its node budget
    norm_exhausted: bool = False
    #: with ``record=True``: nodes normalised (drawn from the scan's ``record_nodes``)
    norm_nodes: int = 0
    #: the stream was re-read with short FRAMEs allowed (as the pure-Python unpickler reads)
    short_frames: bool = False
    #: the scan's opcode budget stopped the walk (a larger window would not help)
    budget_cut: bool = False
    #: the work budget that stopped the run (``ops``, ``arg_nodes``; see
    #: :mod:`torchless.scan.budget`), None when none did
    budget_hit: str | None = None
    #: argument nodes searched for nested payloads (drawn from the scan's budget)
    arg_nodes: int = 0
    #: with ``joblib=True``: ``(offset, length)`` of every array's bytes skipped after its
    #: NumpyArrayWrapper BUILD, as ``joblib.load`` skips them
    skips: list[tuple[int, int]] = field(default_factory=list)
    #: with ``joblib=True``: the run of each object array's pickle (``joblib.load``
    #: unpickles it with a fresh unpickler where the array's bytes would be)
    objects: list[StreamResult] = field(default_factory=list)

    @property
    def finished(self) -> bool:
        return self.end is not None


class _Resolver:
    def __init__(self, an: _Analyser) -> None:
        self.an = an

    def resolve(self, module: str, name: str) -> Any:
        return self.an.on_global(module, name)


#: opcodes that can change a list, dict or set already built (or a BUILD state dict)
_MUTATORS = frozenset(("APPEND", "APPENDS", "SETITEM", "SETITEMS", "ADDITEMS", "BUILD"))
#: how deep and how wide call arguments are searched for nested payloads
_NESTED_DEPTH = 3
_NESTED_WIDTH = 64


class _Analyser:
    def __init__(
        self, data: bytes, torchscript: bool, record: bool = False, arg_nodes: int | None = None, record_nodes: int | None = None
    ) -> None:
        self.data = data
        self.ids: Any = None
        self.events: list[tuple[Any, ...]] | None = None
        if record:
            from .engine import _Ids

            self.ids = _Ids()
            if record_nodes is not None:
                self.ids.budget = max(0, min(self.ids.budget, record_nodes))
            self.record_nodes = self.ids.budget
            self.events = []
        self.torchscript = torchscript
        self.globals: list[GlobalUse] = []
        self.global_at: dict[tuple[int, str], GlobalUse] = {}
        self.calls: list[CallEvent] = []
        self.builds: list[CallEvent] = []
        self.frames: list[tuple[int, int]] = []
        self.ops: list[int] = []
        self.recent: deque[tuple[int, str]] = deque(maxlen=4)
        self.pos = 0
        self.op = ""
        self.nested: list[tuple[str, bytes, int]] = []
        self._nested_seen: set[int] = set()
        self.syms: list[Sym] = []  # every symbolic value made (see detach)
        # the search for nested payloads, memoized by the identity of each container: id ->
        # (the container, kept alive so that its id stays its own; the depth it was searched
        # from; whether all it reached is immutable; the mutation generation then). A value
        # shared by many calls (a memoized tuple behind thousands of BINGETs, a DAG of shared
        # containers) is searched once; a mutable one again only after an opcode that can
        # change a container (``gen``). Every node visited, memo hits included, is drawn
        # from ``arg_nodes`` (the scan's budget): a LimitError when it runs out.
        self._searched: dict[int, tuple[Any, int, bool, int]] = {}
        self.gen = 0
        self.arg_nodes = arg_nodes
        self.arg_nodes_used = 0
        self.budget_hit: str | None = None

    def detach(self) -> None:
        """Cut every symbolic value off this analyser once the stream has run: each one
        refers to it (and to its own bound method), and the analyser to the calls that
        refer to them, so a finished analysis would otherwise be reference cycles that
        only a full GC pass frees (a scan of thousands of files would hold them all)."""
        for s in self.syms:
            s.an = None
            s._call = _ended
        self.syms = []
        self._searched = {}

    def trace(self, pos: int, opname: str, _arg: Any) -> None:
        self.recent.append((self.pos, self.op))
        self.pos = pos
        self.op = opname
        self.ops.append(pos)
        if opname in _MUTATORS:
            self.gen += 1
        if opname == "FRAME" and pos + 9 <= len(self.data):
            self.frames.append((pos, struct.unpack_from("<Q", self.data, pos + 1)[0]))

    def on_global(self, module: str, name: str) -> Sym:
        qual = f"{module}.{name}"
        v = classify(module, name, torchscript=self.torchscript)
        if is_python2_name(module, name):
            # not renamed here (protocol >= 3), but judged as what its Python-2 name
            # stands for as well: the worse of the two verdicts
            m2, n2 = python2_name(module, name)
            v2 = classify(m2, n2, torchscript=self.torchscript)
            if _RANK[v2.verdict] > _RANK[v.verdict]:
                v = Verdict(v2.verdict, f"Python-2 name of {m2}.{n2}: {v2.reason}")
        raw = ""
        if self.op in ("GLOBAL", "INST"):
            try:
                e1 = self.data.index(b"\n", self.pos + 1)
                e2 = self.data.index(b"\n", e1 + 1)
                m0 = self.data[self.pos + 1 : e1].decode("utf-8", "replace")
                n0 = self.data[e1 + 1 : e2].decode("utf-8", "replace")
                if (m0, n0) != (module, name):
                    raw = f"{m0}.{n0}"
            except ValueError:
                pass
        from_memo = self.op == "STACK_GLOBAL" and any(op in _MEMO_READS for _p, op in list(self.recent)[-2:])
        self.globals.append(GlobalUse(qual, module, name, self.pos, self.op, v, from_memo, raw))
        self.global_at[(self.pos, qual)] = self.globals[-1]  # O(1) lookup for calls through the memo
        s = Sym(self, "global", qual, pos=self.pos, verdict=v)
        if self.events is not None:
            self.events.append(("global", module, name))
            self.ids.new(s)
        return s

    def norm(self, v: Any) -> Any:
        from .engine import normalize

        return normalize(v, self.ids)

    def on_items(self, target: Sym, op: str, items: list[Any]) -> None:
        if self.events is None:
            return
        t = self.norm(target)
        if op == "setitem":
            for i in range(0, len(items) - 1, 2):
                self.events.append(("setitem", t, self.norm(items[i]), self.norm(items[i + 1])))
        else:
            kind = "append" if op == "append" else "add"
            for x in items:
                self.events.append((kind, t, self.norm(x)))

    def _note_nested(self, value: Any, depth: int = 0) -> bool:
        # bytes that a call receives and that look like a pickle or an archive: torch's
        # _load_from_bytes, pickle.loads, numpy's loaders would run them. Returns whether
        # everything the search reached is immutable (tuples, bytes, atoms).
        self.arg_nodes_used += 1
        if self.arg_nodes is not None and self.arg_nodes_used > self.arg_nodes:
            from ..core.errors import LimitError

            self.budget_hit = "arg_nodes"
            raise LimitError(
                "the scan's budget of argument nodes searched for nested payloads ran out",
                offset=self.pos,
                expected=f"<= {self.arg_nodes} nodes",
            )
        if depth > _NESTED_DEPTH:
            return True  # nothing reached
        if isinstance(value, (bytes, bytearray)):
            if (
                len(value) >= 2
                and (value[:1] == b"\x80" or value[:4] == ZIP_MAGIC or is_npy(value))
                and id(value) not in self._nested_seen
            ):
                self._nested_seen.add(id(value))
                self.nested.append((self.op, bytes(value), self.pos))
            return type(value) is bytes
        t = type(value)
        if not isinstance(value, (tuple, list, dict)):
            return True  # an atom or a symbolic value: not searched
        m = self._searched.get(id(value))
        if m is not None and m[1] <= depth and (m[2] or m[3] == self.gen):
            return m[2]  # searched from this depth or above, and unchanged since
        frozen = t is tuple
        items = value.values() if isinstance(value, dict) else value
        for x in islice(items, _NESTED_WIDTH):
            if not self._note_nested(x, depth + 1):
                frozen = False
        self._searched[id(value)] = (value, depth, frozen, self.gen)
        return frozen

    def on_call(self, callee: Sym, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Sym:
        ev = CallEvent(self.op, self.pos, callee, args, kwargs or None)
        self.calls.append(ev)
        if callee.kind == "global":
            g = self.global_at.get((callee.pos, callee.qualname))
            if g is not None:
                g.called.append(self.op)
        self._note_nested(args)
        if kwargs:
            self._note_nested(kwargs)
        s = Sym(self, "result", callee=callee, args=args, via=self.op, pos=self.pos)
        if self.events is not None:
            self.events.append(("call", self.norm(callee), self.norm(args), self.norm(kwargs) if kwargs else None))
            self.ids.new(s)
        return s

    def on_build(self, target: Sym, state: Any) -> None:
        self.builds.append(CallEvent("BUILD", self.pos, target, state))
        self._note_nested(state)
        if self.events is not None:
            self.events.append(("build", self.norm(target), self.norm(state)))

    def persistent_load(self, pid: Any) -> Sym:
        s = Sym(self, "persistent", args=pid, pos=self.pos)
        if self.events is not None:
            self.events.append(("persid", self.norm(pid)))
            self.ids.new(s)
        return s


def analyse(
    data: bytes,
    *,
    start: int = 0,
    torchscript: bool = False,
    limits: Limits = Limits(),
    on_error: Callable[[TorchlessError], None] | None = None,
    record: bool = False,
    short_frames: bool = False,
    max_ops: int | None = None,
    max_arg_nodes: int | None = ARG_NODES_BASE,
    record_nodes: int | None = None,
    joblib: bool = False,
) -> StreamResult:
    """Symbolically run the pickle stream that starts at ``start`` in ``data``.

    The machine runs in its strict flavour (CPython's C unpickler's semantics, see
    :class:`~torchless.pickle.machine.Unpickler`). Never raises for bad input: a stream
    the machine cannot finish comes back with ``error`` set and everything it did
    before. ``record`` also returns the run as normalised events (for comparing with
    the real unpickler, :mod:`torchless.scan.engine`); ``short_frames`` reads a FRAME
    longer than the data as the pure-Python unpickler does. ``max_ops`` bounds the
    opcodes run and ``max_arg_nodes`` the nodes of call arguments searched for nested
    payloads (a ``LimitError`` as the error when reached, ``budget_hit`` naming it: the
    scan's budgets, :mod:`torchless.scan.budget`); ``record_nodes`` bounds the nodes
    normalised for the record (past it the record is ``norm_exhausted``).
    ``joblib`` reads the stream as ``joblib.load`` does: after the BUILD of each
    ``NumpyArrayWrapper`` the array's bytes (with their alignment padding) are skipped
    (:func:`joblib_array_bytes`), and for an array whose dtype holds an object (decided as
    NumPy decides it from the dtype's state, :func:`joblib_dtype`) the further pickle
    there is run on its own (``objects``); a wrapper it cannot size (a state that is not
    concrete or not modelled) stops the run with an error.
    """
    an = _Analyser(data, torchscript, record, max_arg_nodes, record_nodes)
    skips: list[tuple[int, int]] = []
    objects: list[StreamResult] = []

    def after_build(obj: Any, pos: int) -> tuple[int, Any] | None:
        if not (isinstance(obj, Sym) and obj.kind == "result" and obj.callee is not None):
            return None
        if obj.callee.kind != "global" or obj.callee.qualname != _JOBLIB_WRAPPER:
            return None
        n = joblib_array_bytes(obj.state, data, pos, an.builds)
        if n is None:
            # an object dtype: joblib unpickles a further stream here with a fresh
            # (pure-Python) Unpickler sharing the outer find_class, then goes on after it
            left = None if max_ops is None else max(0, max_ops - len(an.ops) - sum(len(o.op_offsets) for o in objects))
            nodes_left = None
            if max_arg_nodes is not None:
                nodes_left = max(0, max_arg_nodes - an.arg_nodes_used - sum(o.arg_nodes for o in objects))
            inner = analyse(data, start=pos, limits=limits, max_ops=left, max_arg_nodes=nodes_left)
            if inner.error is not None or inner.end is None:
                err = inner.error or FormatError("object array pickle not finished", offset=pos)
                raise FormatError(f"joblib object array pickle at {pos:#x} not analysed: {err.message}", offset=pos)
            objects.append(inner)
            n = inner.end - pos
        skips.append((pos, n))
        return n, obj

    trace: Callable[[int, str, Any], None] = an.trace
    if max_ops is not None:  # the scan's opcode budget: stop with a LimitError when it runs out
        ops, step, budget = an.ops, an.trace, max_ops

        def budgeted(pos: int, opname: str, arg: Any) -> None:
            if len(ops) >= budget:
                from ..core.errors import LimitError

                an.budget_hit = "ops"
                raise LimitError("the scan's opcode budget ran out", offset=pos, expected=f"<= {budget} opcodes")
            step(pos, opname, arg)

        trace = budgeted

    up = Unpickler(
        data,
        resolver=_Resolver(an),
        persistent_load=an.persistent_load,
        limits=limits,
        start=start,
        trace=trace,
        encoding="latin1",
        strict=True,
        short_frames=short_frames,
        after_build=after_build if joblib else None,
    )
    err: TorchlessError | None = None
    value: Any = None
    end: int | None = None
    try:
        value = up.load()
        end = up.end
    except TorchlessError as e:
        err = e
        if e.offset is None:
            e.offset = an.pos
        if on_error is not None:
            on_error(e)
    except (RecursionError, MemoryError) as e:  # pragma: no cover - limits normally stop these first
        from ..core.errors import LimitError

        err = LimitError(f"stream too complex to analyse: {type(e).__name__}", offset=an.pos)
    if err is not None:
        # an opcode that fails inside a frame may have been reading past the frame's
        # end: readers of file objects would then have read its argument elsewhere
        at = an.pos
        for fpos, flen in an.frames:
            if fpos < at and fpos + 9 <= at < fpos + 9 + flen:
                up.info.frame_hazards.append(
                    (at, f"{an.op} fails inside the FRAME at {fpos:#x}; file readers may read its argument from other bytes")
                )
                break
    out = StreamResult(
        start,
        end,
        up.info.protocol,
        an.globals,
        an.calls,
        an.builds,
        err,
        an.frames,
        an.ops,
        value,
        an.nested,
        up.info.frame_hazards,
        an.events,
    )
    out.skips = skips
    out.objects = objects
    out.budget_hit = an.budget_hit if err is not None else None
    out.arg_nodes = an.arg_nodes_used + sum(o.arg_nodes for o in objects)
    if record and err is None:
        out.value_norm = an.norm(value)
    if record:
        out.norm_exhausted = an.ids.budget <= 0
        out.norm_nodes = an.record_nodes - max(0, an.ids.budget)
    an.detach()
    return out


def _ended(args: tuple[Any, ...]) -> Any:
    raise RuntimeError("a symbolic value is called after its stream's analysis ended")


_JOBLIB_WRAPPER = ".".join(JOBLIB_WRAPPER)


#: ``numpy.dtype`` flag bits (``numpy/_core/include/numpy/ndarraytypes.h``):
#: ``NPY_ITEM_HASOBJECT`` (= ``NPY_ITEM_REFCOUNT``) is what ``dtype.hasobject`` reads
NPY_ITEM_HASOBJECT = 0x01
#: the ``numpy.dtype.__setstate__`` versions NumPy accepts (``descriptor.c``: 0-4; a higher
#: one raises before the array is read)
_DTYPE_STATE_VERSIONS = range(0, 5)
#: the flexible dtype kinds: their element size is the state's ``elsize``; the other
#: built-in types keep their own size whatever the state says
_FLEXIBLE_KINDS = frozenset("USV")


def _concrete_int(v: Any) -> bool:
    return type(v) in (int, bool)


def joblib_dtype(dt: Any, builds: list[CallEvent] | None = None, depth: int = 0) -> tuple[bool, int]:
    """``(hasobject, itemsize)`` of the dtype ``joblib.load`` builds from a pickled
    ``numpy.dtype(<str>, align, copy)`` call and its BUILD state, computed as NumPy's
    ``dtype.__setstate__`` computes them (``descriptor.c``; ``copy=True`` makes a new
    descriptor, so the state applies to every type), not from the type string:

    * from state version 3 on ``hasobject`` is the flag bit ``NPY_ITEM_HASOBJECT``, for
      every type (a ``'V8'``, ``'U2'`` or ``'f8'`` with flags ``1`` is an object dtype,
      and joblib unpickles its "bytes"); below version 3 any non-zero flags make it one;
    * the element size is the state's ``elsize`` for the flexible kinds (``U``, ``S``,
      ``V``), the type's own size for the others.

    ``builds``: the stream's BUILD events so far (a dtype rebuilt twice is not modelled).
    Where this model cannot decide exactly it raises, and the scanner reports the stream
    as not analysable, never as a plain array: an object in the type, fields or sub-array
    that the flags deny (NumPy then reads object pointers from raw bytes; versions
    differ), fields or a sub-array on a non-flexible type read as raw bytes, an unknown
    version, a value computed at load time, a state of another length than NumPy writes.

    Raises:
        FormatError: the dtype is not modelled exactly.
    """
    import numpy as np

    def bad(why: str) -> FormatError:
        return FormatError(f"joblib array dtype not modelled: {why}")

    if depth > 8:
        raise bad("dtypes nested too deep")
    if not (isinstance(dt, Sym) and dt.kind == "result" and dt.callee is not None and dt.callee.qualname == "numpy.dtype"):
        raise bad("the dtype is not a numpy.dtype(...) call")
    args = dt.args if isinstance(dt.args, tuple) else ()
    if not args or type(args[0]) is not str or len(args[0]) > 32 or len(args) > 3:
        raise bad("the dtype's type string is not concrete")
    if not all(type(a) is bool for a in args[1:]):
        raise bad("the dtype's align/copy arguments are not bools")
    try:
        base = np.dtype(args[0], align=bool(args[1]) if len(args) > 1 else False)
    except (TypeError, ValueError, SyntaxError):
        raise bad(f"numpy does not know the dtype {args[0]!r}") from None
    if builds is not None and sum(1 for b in builds if b.callee is dt) > 1:
        raise bad("the dtype is BUILT more than once")
    st = dt.state
    if st is None:  # no BUILD: the type string's dtype
        if base.hasobject:
            return True, base.itemsize
        if base.itemsize <= 0 or base.fields is not None or base.subdtype is not None:
            raise bad(f"dtype {args[0]!r} without a state")
        return False, base.itemsize
    if not isinstance(st, tuple) or len(st) not in (8, 9):
        raise bad(f"a state of {len(st) if isinstance(st, tuple) else type(st).__name__} (NumPy writes 8 or 9 items)")
    if not (len(args) > 2 and args[2] is True):
        raise bad("a BUILD state on a dtype that is not a copy (copy=True, as NumPy pickles it)")
    version, _endian, sub, names, fields, elsize, _align, flags = st[:8]
    if not _concrete_int(version) or version not in _DTYPE_STATE_VERSIONS or not _concrete_int(flags):
        raise bad(f"state version {short_repr(version, 12)} / flags {short_repr(flags, 12)}")
    content = base.hasobject  # an object in the type, or in its fields / sub-array
    if sub is not None or fields is not None or names is not None:
        content = False
        if sub is not None:
            if not (isinstance(sub, tuple) and len(sub) == 2 and isinstance(sub[1], tuple)):
                raise bad("a sub-array state NumPy does not write")
            content |= joblib_dtype(sub[0], builds, depth + 1)[0]
        if fields is not None or names is not None:
            if not isinstance(fields, dict) or not isinstance(names, tuple):
                raise bad("fields/names NumPy does not write")
            for v in fields.values():
                if not (isinstance(v, tuple) and 2 <= len(v) <= 3):
                    raise bad("a field NumPy does not write")
                content |= joblib_dtype(v[0], builds, depth + 1)[0]
    flagged = bool(flags & NPY_ITEM_HASOBJECT) if version >= 3 else bool(flags)
    if flagged:
        return True, base.itemsize  # joblib unpickles what follows
    if content:
        raise bad(f"an object in dtype {args[0]!r} or its fields/sub-array, denied by flags {flags:#x}")
    if base.kind not in _FLEXIBLE_KINDS:
        if sub is not None or fields is not None:
            raise bad(f"fields or a sub-array on a {args[0]!r} dtype")
        return False, base.itemsize
    if not _concrete_int(elsize) or elsize <= 0:
        raise bad(f"element size {short_repr(elsize, 12)}")
    return False, int(elsize)


def joblib_array_bytes(state: Any, data: bytes, pos: int, builds: list[CallEvent] | None = None) -> int | None:
    """How many bytes ``joblib.load`` reads at ``pos`` for a NumpyArrayWrapper whose BUILD
    state is ``state`` (joblib 1.x ``NumpyArrayWrapper.read_array``), or None for an array
    whose dtype holds an object (:func:`joblib_dtype`): joblib then unpickles a further
    stream at ``pos``. For other arrays: one padding-length byte and that many bytes
    (whatever the alignment says: joblib does not check it) when the state's
    ``numpy_array_alignment_bytes`` is not None, then ``prod(shape) * itemsize`` bytes.

    Raises:
        FormatError: a state the scanner does not size (anything not concrete, a dtype
            :func:`joblib_dtype` does not model), or bytes past the end.
    """

    def bad(why: str) -> FormatError:
        return FormatError(f"joblib array not modelled: {why}", offset=pos)

    if not isinstance(state, dict):
        raise bad("the wrapper's state is not a dict")
    shape, order, dt = state.get("shape"), state.get("order", "C"), state.get("dtype")
    if not isinstance(shape, tuple) or not all(type(d) is int and d >= 0 for d in shape) or order not in ("C", "F"):
        raise bad(f"shape {short_repr(shape, 40)} / order {short_repr(order, 10)}")
    try:
        hasobject, itemsize = joblib_dtype(dt, builds)
    except FormatError as e:
        e.offset = pos
        raise
    if hasobject:
        return None
    skip = 0
    if state.get("numpy_array_alignment_bytes") is not None:  # joblib reads any padding length byte
        if pos >= len(data):
            raise FormatError("joblib array padding byte past the end of the stream", offset=pos)
        skip = 1 + data[pos]
    count = 1
    for d in shape:
        count *= d
    n = skip + count * itemsize
    if pos + n > len(data):
        raise FormatError("joblib array bytes run past the end of the stream", offset=pos, expected=f"{n} bytes")
    return n


# -- disassembly -----------------------------------------------------------------------
_FIXED = {
    "BININT1": 1,
    "BINGET": 1,
    "BINPUT": 1,
    "PROTO": 1,
    "EXT1": 1,
    "BININT2": 2,
    "EXT2": 2,
    "BININT": 4,
    "LONG_BINGET": 4,
    "LONG_BINPUT": 4,
    "EXT4": 4,
    "BINFLOAT": 8,
    "FRAME": 8,
}
_LEN1 = ("SHORT_BINUNICODE", "SHORT_BINSTRING", "SHORT_BINBYTES", "LONG1")
_LEN4 = ("BINUNICODE", "BINSTRING", "BINBYTES", "LONG4")
_LEN8 = ("BINUNICODE8", "BINBYTES8", "BYTEARRAY8")
_LINES = {"GLOBAL": 2, "INST": 2, "INT": 1, "LONG": 1, "FLOAT": 1, "STRING": 1, "UNICODE": 1, "GET": 1, "PUT": 1, "PERSID": 1}


def _decode_op(data: bytes, pos: int) -> tuple[str, str, int]:
    """(name, argument text, next offset) of the opcode at ``pos``; never raises."""
    if pos >= len(data):
        return "<end>", "", pos + 1
    name = OPCODE_NAMES.get(data[pos], f"<0x{data[pos]:02x}>")
    p = pos + 1
    try:
        if name in _FIXED:
            k = _FIXED[name]
            raw = data[p : p + k]
            if name == "BINFLOAT":
                arg = repr(struct.unpack(">d", raw)[0])
            elif name == "BININT":
                arg = str(struct.unpack("<i", raw)[0])
            else:
                arg = str(int.from_bytes(raw, "little"))
            return name, arg, p + k
        if name in _LEN1 or name in _LEN4 or name in _LEN8:
            w = 1 if name in _LEN1 else (4 if name in _LEN4 else 8)
            n = int.from_bytes(data[p : p + w], "little")
            body = data[p + w : p + w + min(n, 60)]
            if "UNICODE" in name:
                arg = repr(body.decode("utf-8", "replace"))
            elif name.startswith("LONG"):
                arg = str(int.from_bytes(data[p + w : p + w + n], "little", signed=True)) if n <= 64 else f"<{n}-byte int>"
            else:
                arg = repr(body)
            if n > 60 and "LONG" not in name:
                arg += f"… ({n} bytes)"
            return name, arg, p + w + n
        if name in _LINES:
            parts = []
            for _ in range(_LINES[name]):
                e = data.find(b"\n", p)
                if e < 0:
                    return name, "<no newline>", len(data)
                parts.append(data[p:e].decode("utf-8", "replace")[:60])
                p = e + 1
            return name, repr(" ".join(parts)), p
    except (struct.error, ValueError):
        return name, "<truncated>", len(data)
    return name, "", p


def disassemble(
    data: bytes, at: int, op_offsets: list[int] | None = None, before: int = 4, after: int = 2, base: int = 0
) -> list[str]:
    """A few disassembled opcodes around offset ``at`` (the line at ``at`` marked ``>``)."""
    starts: list[int]
    if op_offsets:
        import bisect

        i = bisect.bisect_left(op_offsets, at)
        lo = max(0, i - before)
        starts = op_offsets[lo : i + after + 1]
        if at not in starts and (not starts or at > starts[-1]):
            starts.append(at)
    else:
        starts = []
        p = max(0, at)
        for _ in range(after + 1):
            starts.append(p)
            _n, _a, p = _decode_op(data, p)
    out = []
    for s in starts:
        if s >= len(data):
            break
        name, arg, _nx = _decode_op(data, s)
        mark = ">" if s == at else " "
        out.append(f"{mark} {base + s:#08x}: {name} {arg}".rstrip())
    return out


# -- where other unpicklers go on ----------------------------------------------------------
def _python_parses(op: str, line: bytes) -> bool:
    """Whether the pure-Python unpickler (``pickle._Unpickler``, joblib's base class)
    accepts a protocol-0 text argument (``line`` without its newline)."""
    try:
        if op == "INT":
            if line not in (b"00", b"01"):
                int(line, 0)
        elif op == "LONG":
            int(line[:-1] if line.endswith(b"L") else line, 0)
        elif op == "FLOAT":
            float(line)
        else:
            return False
    except (ValueError, OverflowError):
        return False
    return True


def other_readers_go_on(res: StreamResult, data: bytes) -> str | None:
    """Why a loader other than CPython's C unpickler (which the machine models exactly)
    could execute bytes beyond where this stream's analysis stopped, or None.

    * a frame hazard: readers of file objects read other bytes than the linear walk;
    * the C unpickler stops on a FRAME longer than the data, the pure-Python one
      (joblib) reads the short frame and goes on;
    * a protocol-0 number that C's parser refuses and Python's ``int``/``float`` accept;
    * INST without a MARK: the pure-Python unpickler imports the module first.
    """
    if res.frame_hazards:
        off, what = res.frame_hazards[0]
        return (
            f"{what} (at {off:#x}): io.BytesIO, buffered files and zip members are read through "
            "frames, so those loaders may run other opcodes than the linear walk analysed"
        )
    if res.error is None or not res.op_offsets:
        return None
    p = res.op_offsets[-1]
    if p >= len(data):
        return None
    op = OPCODE_NAMES.get(data[p], "")
    if op == "FRAME" and "FRAME declares" in str(res.error):
        return (
            "the FRAME declares more bytes than follow: CPython's C unpickler stops, "
            "the pure-Python unpickler (joblib) reads the short frame and goes on"
        )
    if op in ("INT", "LONG", "FLOAT"):
        e = data.find(b"\n", p + 1)
        if e >= 0 and _python_parses(op, data[p + 1 : e]):
            return (
                f"{op} argument {bytes(data[p + 1 : e][:40])!r} that CPython's C "
                "unpickler refuses and the pure-Python unpickler (joblib) accepts"
            )
    if op == "INST" and "MARK" in str(res.error):
        return "INST without a MARK: the pure-Python unpickler (joblib) imports the module before it fails"
    return None
