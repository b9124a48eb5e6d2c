"""The pickle machine: torchless's own interpreter of pickle protocols 0 to 5.

It runs every opcode of the format but never imports a module and never calls what a
file names. GLOBAL / STACK_GLOBAL / INST / EXT* go through a
:class:`~torchless.pickle.globals.Resolver`; REDUCE, NEWOBJ(_EX), OBJ, INST and BUILD
only ever invoke a torchless :class:`~torchless.pickle.globals.Rebuilder` or record a
:class:`~torchless.pickle.globals.PickledObject`. APPEND(S), SETITEM(S) and ADDITEMS act
only on builtin containers (or record items on a placeholder); they never dispatch to a
method of an object the file built.

:class:`Limits` bound the work: the bytes of one pickle, memo entries, stack and MARK depth, the
nesting of hashable keys (a deeply nested tuple used as a dict key would otherwise
overflow the C stack when hashed), and the size of a single string or bytes object. The
input itself bounds the running time: every opcode consumes at least one byte and does
O(its own argument) work.
"""

from __future__ import annotations

import codecs
import collections
import copyreg
import mmap
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..core.errors import FormatError, InternalError, LimitError, TorchlessError, TruncatedError, UnsafeGlobalError, short_repr
from ..core.gcpause import GCPause
from ..core.settings import SETTINGS
from . import entryrun
from .entryrun import MEMO_INDEX_LIMIT as _MEMO_INDEX_LIMIT
from .entryrun import EntryRunner, PersistentLoadMany
from .globals import BUILDERS, GlobalRef, PickledObject, Rebuilder, Resolver, python2_name
from .opcodes import OPCODE_NAMES, parse_float_line, parse_int_line, parse_long_line, parse_memo_line

__all__ = ["Limits", "PersistentLoadMany", "Unpickler", "unpickle", "ProtocolInfo"]

_unpack_i = struct.Struct("<i").unpack_from
_unpack_I = struct.Struct("<I").unpack_from
_unpack_H = struct.Struct("<H").unpack_from
_unpack_Q = struct.Struct("<Q").unpack_from
_unpack_d = struct.Struct(">d").unpack_from


#: memo entries any pickle may make, however short (within ``Limits.max_memo``)
MEMO_FLOOR = 1 << 24


@dataclass(frozen=True)
class Limits:
    """Explicit bounds for one unpickling run. ``LimitError`` when one is exceeded.

    Attributes:
        max_input: bytes one pickle may span, from its first opcode through STOP. What
            follows STOP in the buffer is not counted: a legacy checkpoint is five
            pickles and then its storages, and only the pickles are bounded.
        max_memo: memo entries, at most. Below it the bound is :meth:`memo_cap`: one
            entry for every four bytes the pickle may span, and never fewer than
            :data:`MEMO_FLOOR` (a memo entry costs about a hundred bytes of memory, its
            opcode one byte of input: the bound keeps that ratio where any other
            opcode's is, and lets a DCP ``.metadata`` of millions of tensors, eight
            bytes a memo entry, be read).
        max_marks: MARK nesting depth.
        max_key_depth: nesting of a tuple/frozenset used as a dict key or set item.
        max_object_bytes: a single str/bytes/bytearray/int literal.
    """

    max_input: int = 1 << 32
    max_memo: int = 1 << 28
    max_marks: int = 10_000
    max_key_depth: int = 100
    max_object_bytes: int = 1 << 31

    def __post_init__(self) -> None:
        for k in ("max_input", "max_memo", "max_marks", "max_key_depth", "max_object_bytes"):
            if getattr(self, k) <= 0:
                raise ValueError(f"Limits.{k} must be positive")

    def memo_cap(self, span: int) -> int:
        """The memo entries a pickle of at most ``span`` bytes may make (see ``max_memo``)."""
        return min(self.max_memo, max(MEMO_FLOOR, span // 4))

    def window(self, start: int) -> int:
        """The end of the bytes a run of a pickle that starts at ``start`` looks at:
        the ``max_input`` it may span and one more, which tells a pickle over the limit
        (its next byte exists) from a short one (the data ends). A reader that holds
        only a prefix of a stream (a remote legacy .pt) never needs more than this."""
        return start + self.max_input + 1


@dataclass
class ProtocolInfo:
    """Facts about the stream seen while running it."""

    protocol: int = 0
    end: int = 0  # offset just past STOP
    #: (offset, what) for every place where readers of a file object (``io.BytesIO``,
    #: buffered files, zip members, the pure-Python unpickler) could read other bytes
    #: than this linear walk: an opcode that crosses the end of a FRAME, a FRAME inside
    #: a frame that reaches past it, a frame that goes on past STOP or past the data.
    frame_hazards: list[tuple[int, str]] = field(default_factory=list)
    #: state-dict entries the one-step path ran (the rest ran opcode by opcode)
    fast_entries: int = 0
    #: of those, the ones found together by the windowed tokeniser (``SETTINGS.scan_entries``)
    scanned_entries: int = 0


class _Stop(Exception):
    pass


#: the files of the machine's own code: this module and its entry fast path
_HERE = frozenset({__file__, entryrun.__file__})


def _raised_here(exc: BaseException) -> bool:
    """Whether ``exc`` was raised by this module's own code (the loop, its helpers, or a
    builtin they called directly) rather than by code the loop called into."""
    tb = exc.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    return tb.tb_frame.f_code.co_filename in _HERE


#: what a pickle can build by itself (BUILD/SETITEM on these follows CPython in strict mode)
_PLAIN_DATA = frozenset(
    {type(None), bool, int, float, str, bytes, bytearray, tuple, list, dict, set, frozenset, memoryview, complex}
)
_STR_ONLY = frozenset({str})


def _decode_long(data: bytes) -> int:
    return int.from_bytes(data, "little", signed=True)


class Unpickler:
    """Run one pickle stream.

    Args:
        data: the pickle bytes (bytes/bytearray/memoryview); the run starts at ``start``.
        resolver: maps GLOBALs to rebuilders, values or placeholders.
        persistent_load: called with each persistent id (BINPERSID/PERSID); None refuses
            persistent ids.
        persistent_load_many: ``persistent_load`` for the storage ids of a run of
            state-dict entries at once (see :class:`PersistentLoadMany`); it must give
            exactly what ``persistent_load`` gives for each of them, in order. Optional.
        limits: safety bounds.
        encoding: how Python-2 ``str`` (STRING/BINSTRING) bytes are decoded; ``"bytes"``
            keeps them as bytes.
        buffers: out-of-band buffers for NEXT_BUFFER (protocol 5).
        path, member: for error messages.
        trace: called as ``trace(pos, opname, arg)`` before each opcode (scanners).
        strict: follow CPython's C unpickler exactly where it is stricter or different
            from torch's weights-only unpickler: PROTO above 5 is an error, REDUCE needs
            a tuple, BUILD, SETITEM(S), APPEND(S) and ADDITEMS on plain data do what the
            C unpickler does (no-op on empty items or a ``None`` state, item assignment
            on lists...), READONLY_BUFFER needs a buffer. The scanner runs strict.
        short_frames: a FRAME longer than the rest of the data is not an error and its
            frame ends with the data (the pure-Python unpickler reads it that way).
        after_build: called as ``after_build(obj, pos)`` after each BUILD; returning
            ``(n, new)`` skips ``n`` bytes of out-of-band data at ``pos`` and puts ``new``
            where ``obj`` was (joblib's NumpyArrayWrapper: the array bytes follow it).

    Both flavours apply the Python-2 renames of ``_compat_pickle``: the strict one while
    the stream's protocol is below 3 (as CPython does), the default one torch's subset of
    them, always (as torch's weights-only unpickler does). Both keep EXT codes resolved once per run (as its
    extension cache does) and parse protocol-0 text arguments as the C unpickler does.
    """

    def __init__(
        self,
        data: Any,
        *,
        resolver: Resolver,
        persistent_load: Callable[[Any], Any] | None = None,
        persistent_load_many: PersistentLoadMany | None = None,
        limits: Limits = Limits(),
        encoding: str = "utf-8",
        buffers: Any = None,
        path: Any = None,
        member: str | None = None,
        start: int = 0,
        trace: Callable[[int, str, Any], None] | None = None,
        strict: bool = False,
        short_frames: bool = False,
        after_build: Callable[[Any, int], tuple[int, Any] | None] | None = None,
    ) -> None:
        # bytes and memory maps are used as they are (both index, slice and find);
        # other buffers are copied once
        self.data = data if isinstance(data, (bytes, mmap.mmap)) else bytes(data)
        self.resolver = resolver
        self.persistent_load = persistent_load
        self.persistent_load_many = persistent_load_many if persistent_load is not None else None
        self.limits = limits
        self.encoding = encoding
        self.buffers = iter(buffers) if buffers is not None else None
        self.path = path
        self.member = member
        self.start = start
        self.trace = trace
        self.strict = strict
        self.short_frames = short_frames
        self.after_build = after_build
        self.info = ProtocolInfo()
        # The limit bounds what the run consumes from ``start``, not the buffer (a
        # legacy stream's storages follow its pickles): the run sees the data only up to
        # ``start + max_input``, and a need past that is the limit's error when the data
        # goes on (:meth:`_short`), the truncation's when it ends there.
        self._over = len(self.data) >= limits.window(start)

    # -- errors ---------------------------------------------------------------------
    def _fmt(self, msg: str, pos: int, **kw: Any) -> FormatError:
        return FormatError(msg, path=self.path, member=self.member, offset=pos, **kw)

    def _short(self, msg: str, pos: int, **kw: Any) -> TorchlessError:
        """The error of a need for bytes past the end of what the run sees: a
        :class:`TruncatedError` where the data ends there, the input limit's
        :class:`LimitError` where it goes on past ``start + max_input``."""
        if self._over:
            m = self.limits.max_input
            return LimitError(
                "pickle is larger than the configured limit",
                path=self.path,
                member=self.member,
                offset=self.start,
                expected=f"<= {m} bytes",
                found=f"more than {m} bytes before STOP",
            )
        return TruncatedError(msg, path=self.path, member=self.member, offset=pos, **kw)

    # -- main loop ------------------------------------------------------------------
    def load(self) -> Any:
        """Execute until STOP and return the object it leaves.

        Raises:
            TruncatedError: the stream ends before STOP or inside an argument.
            FormatError: malformed opcodes or stack misuse.
            UnsafeGlobalError: the resolver refused a global.
            LimitError: a limit was exceeded.
        """
        # The run allocates many small objects (tuples, memo entries, tensors) that
        # live until it ends; generational GC passes over them cost a third of the
        # time on checkpoints with many tensors and can free nothing.
        try:
            with GCPause():
                return self._run()
        except TorchlessError as e:
            e.with_context(path=self.path, member=self.member)
            raise

    def _run(self) -> Any:  # noqa: C901 - one dispatch loop by design
        data = self.data
        limits = self.limits
        n = min(len(data), limits.window(self.start) - 1)  # the input limit (see __init__)
        max_memo = limits.memo_cap(n - self.start)
        max_obj = limits.max_object_bytes
        resolver = self.resolver
        trace = self.trace
        info = self.info
        stack: list[Any] = []
        metastack: list[list[Any]] = []
        memo: dict[int, Any] = {}
        # The memo stores of scanned entry runs, not made yet (each run's materializer
        # adds them to a dict, in the run's order): made all at once when anything but a
        # store of a new key above them (torch's pickles: nothing) touches the memo. A
        # key stored again after its run deferred it holds the newer value.
        lazy: list[Callable[[dict[int, Any]], None]] = []
        lazy_top = [0]  # 1 + the largest deferred key
        cap = max_memo  # max_memo less the deferred stores: the memo limit's first test
        pos = self.start
        max_marks = limits.max_marks

        def flush() -> None:
            nonlocal cap
            d: dict[int, Any] = {}
            for materialize in lazy:
                materialize(d)
            lazy.clear()
            cap = max_memo
            for k, v in d.items():
                if k not in memo:  # else stored again since the run: the newer value
                    memo[k] = v

        def memo_full(idx: int) -> bool:
            """The memo limit reached for a store of ``idx`` (deferred stores made first)."""
            if lazy:
                flush()
            return len(memo) >= max_memo and idx not in memo

        def memo_miss(idx: int, p: int) -> Any:
            """The value of a memo key not in the memo dict: deferred, or never stored."""
            if lazy:
                flush()
                if idx in memo:
                    return memo[idx]
            raise self._fmt(f"memo key {idx} was never stored", p)

        def need(p: int, k: int, what: str) -> None:
            if k < 0 or p + k > n:
                raise self._short(f"pickle ends inside {what}", p, expected=f"{k} bytes", found=f"{max(0, n - p)} bytes")
            if k > max_obj:
                raise LimitError(f"{what} larger than the limit", offset=p, expected=f"<= {max_obj} bytes", found=k)

        def readline(p: int, what: str) -> tuple[bytes, int]:
            e = data.find(b"\n", p, n)
            if e < 0:
                raise self._short(f"pickle ends inside {what} (no newline)", p)
            if e - p > max_obj:
                raise LimitError(f"{what} larger than the limit", offset=p)
            return data[p:e], e + 1

        def text_arg(parse: Callable[[bytes], Any], line: bytes, p: int) -> Any:
            try:
                return parse(line)
            except (ValueError, OverflowError) as e:  # the text is the file's fault
                raise self._fmt(f"bad {OPCODE_NAMES[data[p]]} argument: {e}", p) from None

        def nameline(p: int, what: str, codec: str) -> tuple[str, int]:
            line, e = readline(p, what)
            if not line and strict:  # the C unpickler needs at least one byte before the newline
                raise TruncatedError(f"empty {what} line", offset=p)
            return line.decode(codec, "strict"), e

        def pop_mark(p: int) -> list[Any]:
            nonlocal stack
            if not metastack:
                raise self._fmt("opcode needs a MARK but none is set", p)
            items = stack
            stack = metastack.pop()
            return items

        def check_key(k: Any, p: int) -> None:
            t = type(k)
            if t is tuple or t is frozenset:
                # iterative depth check: hashing/comparing a deep tuple recurses in C
                todo = [(k, 1)]
                count = 0
                while todo:
                    obj, d = todo.pop()
                    if d > limits.max_key_depth:
                        raise LimitError(
                            "dictionary key nested too deeply", offset=p, expected=f"<= {limits.max_key_depth} levels"
                        )
                    count += 1
                    if count > 1_000_000:
                        raise LimitError("dictionary key too large", offset=p)
                    for c in obj:
                        tc = type(c)
                        if tc is tuple or tc is frozenset:
                            todo.append((c, d + 1))
                        elif tc is list or tc is dict or tc is set or tc is bytearray:
                            raise self._fmt(f"unhashable {tc.__name__} used as a key", p)
            elif t is list or t is dict or t is set or t is bytearray:
                raise self._fmt(f"unhashable {t.__name__} used as a key", p)

        def memo_put(idx: int, p: int) -> None:
            if idx < 0:
                raise self._fmt("negative memo index", p)
            if strict and idx >= _MEMO_INDEX_LIMIT:
                # CPython's memo is an array indexed by the key: past this it cannot
                # allocate it (or the key does not fit a Py_ssize_t)
                raise LimitError("memo index too large", offset=p, expected=f"< {_MEMO_INDEX_LIMIT}", found=idx)
            if not stack:
                raise self._fmt("memo store with an empty stack", p)
            if len(memo) >= cap and memo_full(idx):
                raise LimitError("too many memo entries", offset=p, expected=f"<= {max_memo}")
            memo[idx] = stack[-1]

        def memo_get(idx: int, p: int) -> None:
            try:
                stack.append(memo[idx])
            except KeyError:
                stack.append(memo_miss(idx, p))

        def get_global(module: str, name: str, p: int) -> Any:
            if strict:  # CPython renames below protocol 3
                if info.protocol < 3:
                    module, name = python2_name(module, name)
            else:  # torch's weights-only unpickler renames with its subset, always
                module, name = python2_name(module, name, torch_subset=True)
            try:
                return resolver.resolve(module, name)
            except UnsafeGlobalError as e:
                e.offset = p
                raise

        def call(func: Any, args: Any, p: int, via: str) -> Any:
            if type(args) is not tuple:
                if strict:
                    raise self._fmt(f"{via} arguments must be a tuple, got {type(args).__name__}", p)
                if isinstance(args, list):
                    args = tuple(args)
                elif isinstance(func, Rebuilder) and func.wraps_single_arg:
                    args = (args,)
                else:
                    raise self._fmt(f"{via} arguments must be a tuple, got {type(args).__name__}", p)
            if type(func) is Rebuilder or isinstance(func, Rebuilder):
                try:
                    return func._call(args)
                except TorchlessError as e:
                    if e.offset is None:
                        e.offset = p
                    raise
                except (TypeError, ValueError, IndexError, KeyError) as e:
                    raise self._fmt(f"bad arguments for {func.name}: {e}", p) from None
            if isinstance(func, GlobalRef):
                return PickledObject(func, args, via=via)
            raise self._fmt(f"{via} on something that is not a callable global: {type(func).__name__}", p)

        def new_obj(cls: Any, args: Any, kwargs: Any, p: int, via: str) -> Any:
            if type(args) is not tuple:
                raise self._fmt(f"{via} arguments must be a tuple", p)
            if not isinstance(kwargs, dict):
                raise self._fmt(f"{via} keyword arguments must be a dict", p)
            if strict and not isinstance(cls, Rebuilder):
                raise self._fmt(f"{via} class argument must be a type, not {type(cls).__name__}", p)
            if strict and any(type(k) is not str for k in kwargs):
                raise self._fmt(f"{via} keywords must be strings", p)
            if isinstance(cls, Rebuilder):
                try:
                    return cls.new(args, kwargs)
                except TorchlessError as e:
                    if e.offset is None:
                        e.offset = p
                    raise
                except (TypeError, ValueError, IndexError, KeyError) as e:
                    raise self._fmt(f"bad arguments for {cls.name}: {e}", p) from None
            if isinstance(cls, GlobalRef):
                return PickledObject(cls, args, kwargs, via=via)
            raise self._fmt(f"{via} on something that is not a class global: {type(cls).__name__}", p)

        def build(inst: Any, state: Any, p: int) -> Any:
            if strict and type(inst) in _PLAIN_DATA:
                # CPython: no __setstate__, so a None state (or slot state) is a no-op and
                # anything else needs an instance __dict__ or setattr, which data lacks
                st, slot = state if type(state) is tuple and len(state) == 2 else (state, None)
                if st is None and (slot is None or (type(slot) is dict and not slot)):
                    return inst
                raise self._fmt(f"BUILD on {type(inst).__name__}", p)
            if isinstance(inst, PickledObject):
                if inst.state is None:
                    inst.state = state
                elif isinstance(inst.state, dict) and isinstance(state, dict):
                    inst.state.update(state)
                else:
                    inst.state = (inst.state, state)
                return inst
            builder = getattr(type(inst), "__torchless_build__", None) or BUILDERS.get(type(inst))
            if builder is not None:
                try:
                    res = builder(inst, state)
                except TorchlessError as e:
                    if e.offset is None:
                        e.offset = p
                    raise
                except (TypeError, ValueError, IndexError, KeyError) as e:
                    raise self._fmt(f"BUILD on {type(inst).__name__} failed: {e}", p) from None
                if res is None or res is inst:
                    return inst
                replaced(inst, res, p)
                return res
            raise self._fmt(f"BUILD on {type(inst).__name__} is not allowed", p)

        replace_budget = [1 << 24]

        def replaced(old: Any, new: Any, p: int) -> None:
            # A builder that returns a new object (an immutable value such as a NumPy
            # dtype whose byte order BUILD sets) stands for the object BUILD acted on:
            # every memo entry and stack slot holding the old one now holds the new
            # one, as if BUILD had changed it in place (CPython's __setstate__ does).
            if lazy:
                flush()
            replace_budget[0] -= len(memo) + len(stack) + sum(len(f) for f in metastack) + 1
            if replace_budget[0] < 0:
                raise LimitError("too many BUILDs that replace their object", offset=p)
            for k, v in memo.items():
                if v is old:
                    memo[k] = new
            for frame in metastack:
                for i, v in enumerate(frame):
                    if v is old:
                        frame[i] = new
            for i, v in enumerate(stack):
                if v is old:
                    stack[i] = new

        def add_items(target: Any, items: list[Any], p: int, op: str) -> None:
            t = type(target)
            if op == "setitem" and len(items) % 2:
                raise self._fmt("SETITEMS with an odd number of items", p)
            if strict and t is not list and t is not dict and t is not set and not hasattr(t, "__torchless_items__"):
                if not items:
                    return  # CPython does nothing for an empty MARK, whatever the target
                if op == "append" and t is bytearray:
                    target.extend(items)
                    return
                if op == "setitem" and (t is bytearray) and len(items) % 2 == 0:
                    for i in range(0, len(items), 2):
                        target[items[i]] = items[i + 1]
                    return
                raise self._fmt(f"{op} on {t.__name__}", p)
            if strict and not items:
                return
            if strict and op == "setitem" and t is list:
                if len(items) % 2:
                    raise self._fmt("SETITEMS with an odd number of items", p)
                for i in range(0, len(items), 2):
                    target[items[i]] = items[i + 1]
                return
            if t not in (list, dict, set):
                # symbolic values of scanners (torchless.scan) record the items themselves
                hook = getattr(t, "__torchless_items__", None)
                if hook is not None:
                    hook(target, op, items)
                    return
            if op == "append":
                if t is list:
                    target.extend(items)
                elif isinstance(target, PickledObject):
                    target.items.extend(items)
                elif isinstance(target, list):  # torchless list subclasses only
                    list.extend(target, items)
                elif t is collections.deque:  # made by the deque rebuilder; pickle extends it
                    target.extend(items)
                else:
                    raise self._fmt(f"APPEND to {t.__name__}", p)
            elif op == "setitem":
                if len(items) % 2:
                    raise self._fmt("SETITEMS with an odd number of items", p)
                if t is dict and set(map(type, items[0::2])) <= _STR_ONLY:  # str keys: nothing to check
                    target.update(zip(items[0::2], items[1::2], strict=True))
                elif isinstance(target, dict):  # dict, OrderedDict, Counter, torchless subclasses
                    for i in range(0, len(items), 2):
                        k = items[i]
                        check_key(k, p)
                        target[k] = items[i + 1]  # only torchless-made dicts reach here
                elif isinstance(target, PickledObject):
                    target.items.extend((items[i], items[i + 1]) for i in range(0, len(items), 2))
                else:
                    raise self._fmt(f"SETITEM on {t.__name__}", p)
            else:  # additems
                if t is set:
                    for k in items:
                        check_key(k, p)
                    target.update(items)
                elif isinstance(target, PickledObject):
                    target.items.extend(items)
                else:
                    raise self._fmt(f"ADDITEMS on {t.__name__}", p)

        strict = self.strict
        fast_calls = SETTINGS.tensor_calls and trace is None and self.after_build is None
        runner = EntryRunner(self, data, n, memo, metastack, lazy, lazy_top, call) if fast_calls else None
        fast_misses = runner.misses if runner is not None else [1024]

        ext_cache: dict[int, Any] = {}
        hazards = info.frame_hazards
        nofr = 1 << 62
        fend = nofr  # end of the frame being read, if any
        p0 = pos
        try:
            while True:
                if pos > fend:
                    if p0 < fend:
                        hazards.append((p0, f"{OPCODE_NAMES.get(data[p0], '?')} crosses the end of a FRAME at {fend:#x}"))
                    fend = nofr
                if pos >= n:
                    raise self._short("pickle ends before STOP", pos)
                p0 = pos
                op = data[pos]
                pos += 1
                if trace is not None:
                    trace(p0, OPCODE_NAMES.get(op, f"<0x{op:02x}>"), None)
                # Ordered by frequency in torch checkpoints; fixed-width arguments are
                # bounds-checked inline (a function call per opcode costs more than the op).
                if op == 0x72:  # r LONG_BINPUT
                    if pos + 4 > n:
                        need(pos, 4, "LONG_BINPUT")
                    idx = _unpack_I(data, pos)[0]
                    pos += 4
                    if (len(memo) >= cap and memo_full(idx)) or (strict and idx >= _MEMO_INDEX_LIMIT):
                        raise LimitError("too many memo entries", offset=p0, expected=f"<= {max_memo}")
                    memo[idx] = stack[-1]
                elif op == 0x68:  # h BINGET
                    if pos >= n:
                        need(pos, 1, "BINGET")
                    try:
                        stack.append(memo[data[pos]])
                    except KeyError:
                        stack.append(memo_miss(data[pos], p0))
                    pos += 1
                elif op == 0x4B:  # K BININT1
                    if pos >= n:
                        need(pos, 1, "BININT1")
                    stack.append(data[pos])
                    pos += 1
                elif op == 0x28:  # ( MARK
                    if len(metastack) >= max_marks:
                        raise LimitError("MARK nesting too deep", offset=p0, expected=f"<= {max_marks}")
                    metastack.append(stack)
                    stack = []
                elif op == 0x58:  # X BINUNICODE
                    if runner is not None and fend == nofr and fast_misses[0] < 1024:
                        e = runner.entries(p0, stack, cap)
                        if runner.deferred:
                            cap -= runner.deferred
                            runner.deferred = 0
                        if e > 0:
                            pos = e
                            continue
                    if pos + 4 > n:
                        need(pos, 4, "BINUNICODE length")
                    k = _unpack_I(data, pos)[0]
                    pos += 4
                    if pos + k > n or k > max_obj:
                        need(pos, k, "BINUNICODE")
                    stack.append(str(data[pos : pos + k], "utf-8", "surrogatepass"))
                    pos += k
                elif op == 0x74:  # t TUPLE
                    if not metastack:
                        raise self._fmt("TUPLE needs a MARK but none is set", p0)
                    items = stack
                    stack = metastack.pop()
                    stack.append(tuple(items))
                elif op == 0x85:  # TUPLE1
                    stack[-1] = (stack[-1],)
                elif op == 0x52:  # R REDUCE
                    args = stack.pop()
                    stack[-1] = call(stack[-1], args, p0, "REDUCE")
                elif op == 0x4D:  # M BININT2
                    if pos + 2 > n:
                        need(pos, 2, "BININT2")
                    stack.append(_unpack_H(data, pos)[0])
                    pos += 2
                elif op == 0x51:  # Q BINPERSID
                    pid = stack.pop()
                    stack.append(self._persistent(pid, p0))
                elif op == 0x89:  # NEWFALSE
                    stack.append(False)
                elif op == 0x29:  # ) EMPTY_TUPLE
                    stack.append(())
                elif op == 0x71:  # q BINPUT
                    if pos >= n:
                        need(pos, 1, "BINPUT")
                    if not stack:
                        raise self._fmt("memo store with an empty stack", p0)
                    memo[data[pos]] = stack[-1]
                    pos += 1
                elif op == 0x4A:  # J BININT
                    if pos + 4 > n:
                        need(pos, 4, "BININT")
                    stack.append(_unpack_i(data, pos)[0])
                    pos += 4
                elif op == 0x86:  # TUPLE2
                    b = stack.pop()
                    stack[-1] = (stack[-1], b)
                elif op == 0x87:  # TUPLE3
                    c = stack.pop()
                    b = stack.pop()
                    stack[-1] = (stack[-1], b, c)
                elif op == 0x63:  # c GLOBAL
                    mod, pos = nameline(pos, "GLOBAL module", "utf-8")
                    nm, pos = nameline(pos, "GLOBAL name", "utf-8")
                    stack.append(get_global(mod, nm, p0))
                elif op == 0x88:  # NEWTRUE
                    stack.append(True)
                elif op == 0x4E:  # N NONE
                    stack.append(None)
                elif op == 0x7D:  # } EMPTY_DICT
                    stack.append({})
                elif op == 0x5D:  # ] EMPTY_LIST
                    stack.append([])
                elif op == 0x75:  # u SETITEMS
                    items = pop_mark(p0)
                    add_items(stack[-1], items, p0, "setitem")
                elif op == 0x73:  # s SETITEM
                    v = stack.pop()
                    k = stack.pop()
                    add_items(stack[-1], [k, v], p0, "setitem")
                elif op == 0x65:  # e APPENDS
                    items = pop_mark(p0)
                    add_items(stack[-1], items, p0, "append")
                elif op == 0x61:  # a APPEND
                    v = stack.pop()
                    add_items(stack[-1], [v], p0, "append")
                elif op == 0x6A:  # j LONG_BINGET
                    need(pos, 4, "LONG_BINGET")
                    memo_get(_unpack_I(data, pos)[0], p0)
                    pos += 4
                elif op == 0x94:  # MEMOIZE
                    if lazy:
                        flush()
                    memo_put(len(memo), p0)
                elif op == 0x8C:  # SHORT_BINUNICODE
                    need(pos, 1, "SHORT_BINUNICODE length")
                    k = data[pos]
                    pos += 1
                    need(pos, k, "SHORT_BINUNICODE")
                    stack.append(data[pos : pos + k].decode("utf-8", "surrogatepass"))
                    pos += k
                elif op == 0x47:  # G BINFLOAT
                    need(pos, 8, "BINFLOAT")
                    stack.append(_unpack_d(data, pos)[0])
                    pos += 8
                elif op == 0x8A:  # LONG1
                    need(pos, 1, "LONG1 length")
                    k = data[pos]
                    pos += 1
                    need(pos, k, "LONG1")
                    stack.append(_decode_long(data[pos : pos + k]))
                    pos += k
                elif op == 0x81:  # NEWOBJ
                    args = stack.pop()
                    stack[-1] = new_obj(stack[-1], args, {}, p0, "NEWOBJ")
                elif op == 0x62:  # b BUILD
                    state = stack.pop()
                    stack[-1] = build(stack[-1], state, p0)
                    if self.after_build is not None:  # joblib: array bytes follow the BUILD
                        hit = self.after_build(stack[-1], pos)
                        if hit is not None:
                            k, new = hit
                            need(pos, k, "data after BUILD")
                            pos += k
                            if new is not stack[-1]:
                                replaced(stack[-1], new, p0)
                elif op == 0x93:  # STACK_GLOBAL
                    nm = stack.pop()
                    mod = stack.pop()
                    if type(nm) is not str or type(mod) is not str:
                        raise self._fmt("STACK_GLOBAL needs two str", p0)
                    stack.append(get_global(mod, nm, p0))
                elif op == 0x95:  # FRAME
                    need(pos, 8, "FRAME length")
                    (k,) = _unpack_Q(data, pos)
                    pos += 8
                    if pos + k > n:
                        if not self.short_frames:
                            raise self._short(
                                "FRAME declares more bytes than the pickle has",
                                p0,
                                expected=f"{k} bytes",
                                found=f"{n - pos} bytes",
                            )
                        hazards.append((p0, f"FRAME declares {k} bytes, only {n - pos} follow"))
                    if fend != nofr and p0 < fend:
                        if pos + k > fend:
                            hazards.append((p0, f"FRAME inside a frame reaches past its end at {fend:#x}"))
                    else:
                        fend = pos + k
                elif op == 0x80:  # PROTO
                    need(pos, 1, "PROTO")
                    proto = data[pos]
                    pos += 1
                    # torch's weights_only unpickler only warns on an unknown protocol number
                    # and goes on (weights_only.md §3); the opcodes decide what loads
                    if strict and proto > 5:
                        raise self._fmt(f"unsupported pickle protocol: {proto}", p0)
                    info.protocol = proto
                elif op == 0x2E:  # . STOP
                    if not stack:
                        raise self._fmt("STOP with an empty stack", p0)
                    info.end = pos
                    self.end = pos
                    if pos < fend < nofr:
                        hazards.append(
                            (
                                p0,
                                f"STOP inside a FRAME that goes on to {fend:#x}: readers "
                                "without peek have consumed the bytes after STOP",
                            )
                        )
                    return stack[-1]
                elif op == 0x8F:  # EMPTY_SET
                    stack.append(set())
                elif op == 0x90:  # ADDITEMS
                    items = pop_mark(p0)
                    add_items(stack[-1], items, p0, "additems")
                elif op == 0x91:  # FROZENSET
                    items = pop_mark(p0)
                    for k in items:
                        check_key(k, p0)
                    stack.append(frozenset(items))
                elif op == 0x92:  # NEWOBJ_EX
                    kwargs = stack.pop()
                    args = stack.pop()
                    stack[-1] = new_obj(stack[-1], args, kwargs, p0, "NEWOBJ_EX")
                elif op == 0x43:  # C SHORT_BINBYTES
                    need(pos, 1, "SHORT_BINBYTES length")
                    k = data[pos]
                    pos += 1
                    need(pos, k, "SHORT_BINBYTES")
                    stack.append(data[pos : pos + k])
                    pos += k
                elif op == 0x42:  # B BINBYTES
                    need(pos, 4, "BINBYTES length")
                    (k,) = _unpack_I(data, pos)
                    pos += 4
                    need(pos, k, "BINBYTES")
                    stack.append(data[pos : pos + k])
                    pos += k
                elif op == 0x8E:  # BINBYTES8
                    need(pos, 8, "BINBYTES8 length")
                    (k,) = _unpack_Q(data, pos)
                    pos += 8
                    need(pos, k, "BINBYTES8")
                    stack.append(data[pos : pos + k])
                    pos += k
                elif op == 0x8D:  # BINUNICODE8
                    need(pos, 8, "BINUNICODE8 length")
                    (k,) = _unpack_Q(data, pos)
                    pos += 8
                    need(pos, k, "BINUNICODE8")
                    stack.append(data[pos : pos + k].decode("utf-8", "surrogatepass"))
                    pos += k
                elif op == 0x96:  # BYTEARRAY8
                    need(pos, 8, "BYTEARRAY8 length")
                    (k,) = _unpack_Q(data, pos)
                    pos += 8
                    need(pos, k, "BYTEARRAY8")
                    stack.append(bytearray(data[pos : pos + k]))
                    pos += k
                elif op == 0x97:  # NEXT_BUFFER
                    if self.buffers is None:
                        raise self._fmt("pickle refers to an out-of-band buffer but none were given", p0)
                    try:
                        stack.append(next(self.buffers))
                    except StopIteration:
                        raise self._fmt("not enough out-of-band buffers", p0) from None
                elif op == 0x98:  # READONLY_BUFFER
                    b = stack[-1]
                    if strict:
                        if type(b) is bytearray or (type(b) is memoryview and not b.readonly):
                            stack[-1] = memoryview(b).toreadonly()
                        elif type(b) is not bytes and type(b) is not memoryview:
                            raise self._fmt(f"READONLY_BUFFER on {type(b).__name__}", p0)
                    elif isinstance(b, (bytes, bytearray, memoryview)):
                        stack[-1] = memoryview(b).toreadonly()
                elif op == 0x8B:  # LONG4
                    need(pos, 4, "LONG4 length")
                    (k,) = _unpack_i(data, pos)
                    pos += 4
                    if k < 0:
                        raise self._fmt("LONG4 with a negative length", p0)
                    need(pos, k, "LONG4")
                    stack.append(_decode_long(data[pos : pos + k]))
                    pos += k
                elif op == 0x55:  # U SHORT_BINSTRING
                    need(pos, 1, "SHORT_BINSTRING length")
                    k = data[pos]
                    pos += 1
                    need(pos, k, "SHORT_BINSTRING")
                    stack.append(self._decode_str(data[pos : pos + k]))
                    pos += k
                elif op == 0x54:  # T BINSTRING
                    need(pos, 4, "BINSTRING length")
                    (k,) = _unpack_i(data, pos)
                    pos += 4
                    if k < 0:
                        raise self._fmt("BINSTRING with a negative length", p0)
                    need(pos, k, "BINSTRING")
                    stack.append(self._decode_str(data[pos : pos + k]))
                    pos += k
                elif op == 0x53:  # S STRING
                    line, pos = readline(pos, "STRING")
                    if len(line) >= 2 and line[0] == line[-1] and line[:1] in (b'"', b"'"):
                        line = line[1:-1]
                    else:
                        raise self._fmt("STRING argument is not quoted", p0)
                    stack.append(self._decode_str(codecs.escape_decode(line)[0]))
                elif op == 0x56:  # V UNICODE
                    line, pos = readline(pos, "UNICODE")
                    stack.append(str(line, "raw-unicode-escape"))
                elif op == 0x49:  # I INT
                    line, pos = readline(pos, "INT")
                    stack.append(text_arg(parse_int_line, data[p0 + 1 : pos], p0))
                elif op == 0x4C:  # L LONG
                    line, pos = readline(pos, "LONG")
                    stack.append(text_arg(parse_long_line, data[p0 + 1 : pos], p0))
                elif op == 0x46:  # F FLOAT
                    line, pos = readline(pos, "FLOAT")
                    stack.append(text_arg(parse_float_line, data[p0 + 1 : pos], p0))
                elif op == 0x67:  # g GET
                    line, pos = readline(pos, "GET")
                    memo_get(text_arg(parse_memo_line, data[p0 + 1 : pos], p0), p0)
                elif op == 0x70:  # p PUT
                    line, pos = readline(pos, "PUT")
                    if not stack:
                        raise self._fmt("memo store with an empty stack", p0)
                    memo_put(text_arg(parse_memo_line, data[p0 + 1 : pos], p0), p0)
                elif op == 0x6C:  # l LIST
                    items = pop_mark(p0)
                    stack.append(items)
                elif op == 0x64:  # d DICT
                    items = pop_mark(p0)
                    d: dict[Any, Any] = {}
                    add_items(d, items, p0, "setitem")
                    stack.append(d)
                elif op == 0x30:  # 0 POP
                    if stack:
                        stack.pop()
                    else:
                        pop_mark(p0)
                elif op == 0x31:  # 1 POP_MARK
                    pop_mark(p0)
                elif op == 0x32:  # 2 DUP
                    stack.append(stack[-1])
                elif op == 0x50:  # P PERSID
                    line, pos = readline(pos, "PERSID")
                    stack.append(self._persistent(line.decode("ascii"), p0))
                elif op == 0x69:  # i INST
                    if not metastack:  # the C unpickler looks for the MARK first
                        raise self._fmt("INST needs a MARK but none is set", p0)
                    mod, pos = nameline(pos, "INST module", "ascii")
                    nm, pos = nameline(pos, "INST name", "ascii")
                    cls = get_global(mod, nm, p0)
                    args = tuple(pop_mark(p0))
                    stack.append(call(cls, args, p0, "INST"))
                elif op == 0x6F:  # o OBJ
                    items = pop_mark(p0)
                    if not items:
                        raise self._fmt("OBJ without a class", p0)
                    stack.append(call(items[0], tuple(items[1:]), p0, "OBJ"))
                elif op in (0x82, 0x83, 0x84):  # EXT1/2/4
                    width = {0x82: 1, 0x83: 2, 0x84: 4}[op]
                    need(pos, width, "EXT code")
                    code = int.from_bytes(data[pos : pos + width], "little", signed=(width == 4))
                    pos += width
                    # copyreg's registry is plain data (empty unless a program registers codes)
                    if code in ext_cache:  # CPython caches what a code resolved to
                        stack.append(ext_cache[code])
                        continue
                    key = copyreg._inverted_registry.get(code)  # type: ignore[attr-defined]  # private to copyreg, not in typeshed
                    if key is None or code <= 0:
                        raise self._fmt(f"unregistered extension code {code}", p0)
                    ext_cache[code] = get_global(key[0], key[1], p0)
                    stack.append(ext_cache[code])
                else:
                    raise self._fmt(f"invalid pickle opcode 0x{op:02x}", p0)
        except TorchlessError:
            raise
        except struct.error as e:
            raise TruncatedError(f"pickle truncated: {e}", path=self.path, member=self.member, offset=p0) from None
        except RecursionError:
            raise LimitError("object nesting too deep", path=self.path, member=self.member, offset=p0) from None
        except (IndexError, KeyError, TypeError, ValueError, UnicodeError, OverflowError) as e:
            # Only what the machine's own code raised on the input's bytes (an empty stack, an
            # unknown memo key, an undecodable string, a bad number text, an unhashable
            # key...) is the file's fault; the same exception from deeper code (a
            # persistent_load, a builder, a scanner hook) is a bug and must not pass for a
            # bad file.
            if not _raised_here(e):
                raise InternalError.wrap(e, "running a pickle", path=self.path, member=self.member, offset=p0) from e
            if isinstance(e, IndexError):
                raise self._fmt("opcode pops from an empty stack", p0) from None
            raise self._fmt(f"malformed pickle: {type(e).__name__}: {e}", p0) from None
        except MemoryError:
            raise  # the limits should have stopped this first: not a property of the file
        except Exception as e:  # noqa: BLE001 - anything else is a bug in torchless
            raise InternalError.wrap(e, "running a pickle", path=self.path, member=self.member, offset=p0) from e

    def _decode_str(self, b: bytes) -> Any:
        if self.encoding == "bytes":
            return b
        return b.decode(self.encoding, "strict")

    def _persistent(self, pid: Any, pos: int) -> Any:
        if self.persistent_load is None:
            raise self._fmt("pickle uses a persistent id but this format has none", pos, found=short_repr(pid, 80))
        try:
            return self.persistent_load(pid)
        except TorchlessError as e:
            if e.offset is None:
                e.offset = pos
            raise


def unpickle(data: Any, resolver: Resolver, **kw: Any) -> Any:
    """Run one pickle stream and return its object (see :class:`Unpickler`)."""
    return Unpickler(data, resolver=resolver, **kw).load()
