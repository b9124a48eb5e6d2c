"""A protocol-2 pickler that writes torch's GLOBALs without importing torch.

CPython's pickler refuses to write a GLOBAL it cannot import and verify, so torchless
emits the opcodes itself. The output follows CPython's choices for protocol 2 (memo
``BINPUT`` after every memoizable object, batched ``SETITEMS``/``APPENDS`` of 1000, the
``__builtin__`` names of ``fix_imports``), which is what ``torch.save`` produces.

Objects are described to the pickler by :class:`Reduce` (a GLOBAL called with
arguments, optionally followed by BUILD state) and :class:`Global` (a bare GLOBAL), so the
format writers decide what torch objects look like; the pickler only knows Python's
builtin types.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

from ..core.errors import UsageError
from ..core.settings import SETTINGS

__all__ = ["Global", "Reduce", "Persistent", "TensorCall", "Pickler2", "dumps"]


class Global:
    """A bare GLOBAL ``module name`` (for example a dtype: ``torch float32``)."""

    __slots__ = ("module", "name", "memo_key")

    def __init__(self, module: str, name: str) -> None:
        self.module = module
        self.name = name
        self.memo_key = ("global", (module, name))

    def key(self) -> tuple[str, str]:
        return (self.module, self.name)


class Reduce:
    """``GLOBAL func`` + ``args`` + ``REDUCE`` (and ``state`` + ``BUILD`` if given).

    ``dictitems`` are added with SETITEMS after the REDUCE (``OrderedDict``), and
    ``memo_key`` lets identical reductions (the same tensor referenced twice) be
    written once and fetched with BINGET afterwards.
    """

    __slots__ = ("func", "args", "state", "memo_key", "dictitems")

    def __init__(
        self, func: Global, args: tuple[Any, ...], state: Any = None, memo_key: Any = None, dictitems: list[Any] | None = None
    ) -> None:
        self.func = func
        self.args = args
        self.state = state
        self.memo_key = memo_key
        self.dictitems = dictitems


class Persistent:
    """A persistent id: the pid object is pickled, then ``BINPERSID``."""

    __slots__ = ("pid",)

    def __init__(self, pid: Any) -> None:
        self.pid = pid


class TensorCall:
    """A tensor as torch pickles a plain one: ``Reduce(func, (Persistent(pid), offset,
    size, stride, requires_grad, OrderedDict()), memo_key=memo_key)``, with ``size`` and
    ``stride`` tuples of ints and ``pid`` a 5-tuple of str, Global, str, str, int.

    :meth:`as_reduce` is that general description; the pickler writes the same bytes
    straight from the parts (one object per tensor instead of six).
    """

    __slots__ = ("func", "pid", "offset", "size", "stride", "requires_grad", "od", "memo_key")

    def __init__(
        self,
        func: Global,
        pid: tuple[Any, ...],
        offset: int,
        size: tuple[int, ...],
        stride: tuple[int, ...],
        requires_grad: bool,
        od: Reduce,
        memo_key: Any,
    ) -> None:
        self.func = func
        self.pid = pid
        self.offset = offset
        self.size = size
        self.stride = stride
        self.requires_grad = requires_grad
        self.od = od
        self.memo_key = memo_key

    def as_reduce(self) -> Reduce:
        args = (Persistent(self.pid), self.offset, self.size, self.stride, self.requires_grad, self.od)
        return Reduce(self.func, args, memo_key=self.memo_key)


_REVERSE = {"builtins": "__builtin__"}
_pack_I = struct.Struct("<I").pack
_GET1 = [b"h" + bytes([i]) for i in range(256)]  # BINGET of each one-byte memo index
# types the pickler handles itself; anything else goes through ``translate`` first
_NATIVE = frozenset({str, int, float, bool, type(None), tuple, list, dict, bytes})


class Pickler2:
    """Emit a protocol-2 pickle.

    Args:
        translate: called on every object before pickling; returns the object itself or a
            :class:`Reduce`/:class:`Global`/:class:`Persistent` describing it.
        max_depth: nesting limit (refuse self-referential or absurdly deep input).
    """

    def __init__(self, translate: Callable[[Any], Any] | None = None, *, max_depth: int = 1000) -> None:
        self.out = bytearray()
        self.memo: dict[Any, int] = {}  # globals and keyed reductions
        self.memo_id: dict[int, int] = {}  # objects memoized by identity (str, tuple, list...)
        self._count = 0
        self._keep: list[Any] = []  # keep memoized objects alive so ids stay unique
        self.translate = translate
        self.max_depth = max_depth

    def dumps(self, obj: Any) -> bytes:
        self.out += b"\x80\x02"
        try:
            self._save(obj, 0)
        except RecursionError:  # max_depth counts levels, Python's limit counts frames
            raise UsageError("object nesting too deep to save", expected=f"<= {self.max_depth} levels") from None
        self.out += b"."
        return bytes(self.out)

    # -- memo --------------------------------------------------------------------------
    def _put(self, key: Any, obj: Any) -> None:
        idx = self._count
        self._count += 1
        if type(key) is tuple and key[0] == "id":
            self.memo_id[key[1]] = idx
        else:
            self.memo[key] = idx
        self._keep.append(obj)
        self.out += b"q" + bytes([idx]) if idx < 256 else b"r" + _pack_I(idx)

    def _get(self, key: Any) -> bool:
        idx = self.memo_id.get(key[1]) if key[0] == "id" else self.memo.get(key)
        if idx is None:
            return False
        self.out += _GET1[idx] if idx < 256 else b"j" + _pack_I(idx)
        return True

    # -- objects -----------------------------------------------------------------------
    def _save(self, obj: Any, depth: int) -> None:
        if depth > self.max_depth:
            raise UsageError("object nesting too deep to save", expected=f"<= {self.max_depth} levels")
        # exact types: str subclasses (Device, Layout, QScheme) must reach translate
        if self.translate is not None and type(obj) not in _NATIVE and not isinstance(obj, (Global, Reduce, Persistent)):
            obj = self.translate(obj)
            if type(obj) is TensorCall:
                if SETTINGS.pickle_tensors and depth + 4 <= self.max_depth:
                    self._save_tensor_call(obj)
                    return
                obj = obj.as_reduce()
        out = self.out
        t = type(obj)
        if obj is None:
            out += b"N"
        elif t is bool:
            out += b"\x88" if obj else b"\x89"
        elif t is int:
            out += _int_op(obj)
        elif t is float:
            out += b"G" + struct.pack(">d", obj)
        elif t is str:
            if self._get(("id", id(obj))):
                return
            raw = obj.encode("utf-8", "surrogatepass")
            out += b"X" + struct.pack("<I", len(raw)) + raw
            self._put(("id", id(obj)), obj)
        elif isinstance(obj, Global):
            self._save_global(obj)
        elif isinstance(obj, Reduce):
            if obj.memo_key is not None and self._get(("reduce", obj.memo_key)):
                return
            self._save_global(obj.func)
            self._save(tuple(obj.args), depth + 1)
            self.out += b"R"
            if obj.memo_key is not None:
                self._put(("reduce", obj.memo_key), obj)
            else:
                self._put(("obj", id(obj)), obj)
            if obj.dictitems:
                self._batch_items(obj.dictitems, depth)
            if obj.state is not None:
                self._save(obj.state, depth + 1)
                self.out += b"b"
        elif isinstance(obj, Persistent):
            self._save(obj.pid, depth + 1)
            self.out += b"Q"
        elif t is tuple:
            self._save_tuple(obj, depth)
        elif t is list:
            if self._get(("id", id(obj))):
                return
            out += b"]"
            self._put(("id", id(obj)), obj)
            self._batch(obj, depth, b"a", b"e")
        elif t is dict:
            if self._get(("id", id(obj))):
                return
            out += b"}"
            self._put(("id", id(obj)), obj)
            self._batch_items(list(obj.items()), depth)
        elif t is bytes:
            if self._get(("id", id(obj))):
                return
            # protocol 2 has no bytes opcode: _codecs.encode(text, 'latin1'), as Python's
            # pickler writes bytes, also for b"" (where it writes builtins.bytes(), which
            # torch's weights-only loader refuses)
            self._save_global(Global("_codecs", "encode"))
            self._save((obj.decode("latin1"), "latin1"), depth + 1)
            self.out += b"R"
            self._put(("id", id(obj)), obj)
        else:
            raise UsageError(
                f"cannot save objects of type {t.__module__}.{t.__qualname__}",
                hint="save tensors, arrays, containers and Python scalars",
            )

    def _save_tensor_call(self, o: TensorCall) -> None:
        """Write ``o`` exactly as :meth:`_save` writes ``o.as_reduce()``: the same opcodes,
        memo reads and memo indices (the argument and pid tuples are new objects that
        nothing can refer to again: their memo stores take an index and nothing else)."""
        rkey = ("reduce", o.memo_key)
        idx = self.memo.get(rkey)
        out = self.out
        if idx is not None:
            out += _GET1[idx] if idx < 256 else b"j" + _pack_I(idx)
            return
        self._save_global(o.func)
        out += b"(("
        name, stype, key, location, numel = o.pid
        self._save_str(name)
        self._save_global(stype)
        self._save_str(key)
        self._save_str(location)
        out += _int_op(numel)
        out += b"t"
        self._put_new()
        out += b"Q"
        out += _int_op(o.offset)
        self._save_ints(o.size)
        self._save_ints(o.stride)
        out += b"\x88" if o.requires_grad else b"\x89"
        od = o.od
        self._save_global(od.func)
        out += b")R"
        self._put(("obj", id(od)), od)
        out += b"t"
        self._put_new()
        out += b"R"
        self._put(rkey, o)

    def _put_new(self) -> None:
        """A memo store of an object nothing can fetch again (it takes the next index)."""
        idx = self._count
        self._count += 1
        self.out += b"q" + bytes([idx]) if idx < 256 else b"r" + _pack_I(idx)

    def _save_str(self, obj: str) -> None:
        idx = self.memo_id.get(id(obj))
        if idx is not None:
            self.out += _GET1[idx] if idx < 256 else b"j" + _pack_I(idx)
            return
        raw = obj.encode("utf-8", "surrogatepass")
        self.out += b"X" + _pack_I(len(raw)) + raw
        self._put(("id", id(obj)), obj)

    def _save_ints(self, t: tuple[int, ...]) -> None:
        """A tuple of ints, as :meth:`_save_tuple` writes it."""
        if not t:
            self.out += b")"
            return
        if self._get(("id", id(t))):
            return
        n = len(t)
        out = self.out
        if n > 3:
            out += b"("
        for x in t:
            out += _int_op(x)
        out += (b"\x85", b"\x86", b"\x87")[n - 1] if n <= 3 else b"t"
        self._put(("id", id(t)), t)

    def _save_global(self, g: Global) -> None:
        idx = self.memo.get(g.memo_key)
        if idx is not None:
            self.out += _GET1[idx] if idx < 256 else b"j" + _pack_I(idx)
            return
        mod = _REVERSE.get(g.module, g.module)
        self.out += b"c" + mod.encode() + b"\n" + g.name.encode() + b"\n"
        self._put(g.memo_key, g)

    def _save_tuple(self, obj: tuple[Any, ...], depth: int) -> None:
        if not obj:
            self.out += b")"
            return
        if self._get(("id", id(obj))):
            return
        n = len(obj)
        if n <= 3:
            for x in obj:
                self._save(x, depth + 1)
            self.out += (b"\x85", b"\x86", b"\x87")[n - 1]
        else:
            self.out += b"("
            for x in obj:
                self._save(x, depth + 1)
            self.out += b"t"
        self._put(("id", id(obj)), obj)

    def _batch(self, items: list[Any], depth: int, one: bytes, many: bytes) -> None:
        for i in range(0, len(items), 1000):
            chunk = items[i : i + 1000]
            if len(chunk) == 1:
                self._save(chunk[0], depth + 1)
                self.out += one
            else:
                self.out += b"("
                for x in chunk:
                    self._save(x, depth + 1)
                self.out += many

    def _batch_items(self, items: list[Any], depth: int) -> None:
        for i in range(0, len(items), 1000):
            chunk = items[i : i + 1000]
            if len(chunk) == 1:
                self._save(chunk[0][0], depth + 1)
                self._save(chunk[0][1], depth + 1)
                self.out += b"s"
            else:
                self.out += b"("
                fast_keys = SETTINGS.pickle_tensors and depth + 1 <= self.max_depth
                for k, v in chunk:
                    if fast_keys and type(k) is str:
                        self._save_str(k)  # what _save does with a str
                    else:
                        self._save(k, depth + 1)
                    self._save(v, depth + 1)
                self.out += b"u"


def _int_op(obj: int) -> bytes:
    """BININT1, BININT2, BININT, LONG1 or LONG4 for an int, as CPython's pickler chooses."""
    if 0 <= obj < 256:
        return b"K" + bytes([obj])
    if 0 <= obj < 65536:
        return b"M" + struct.pack("<H", obj)
    if -(2**31) <= obj < 2**31:
        return b"J" + struct.pack("<i", obj)
    nbytes = (obj.bit_length() + 8) // 8
    raw = obj.to_bytes(nbytes, "little", signed=True)
    while len(raw) > 1 and ((raw[-1] == 0 and raw[-2] < 0x80) or (raw[-1] == 0xFF and raw[-2] >= 0x80)):
        raw = raw[:-1]
    if len(raw) < 256:
        return b"\x8a" + bytes([len(raw)]) + raw
    return b"\x8b" + struct.pack("<i", len(raw)) + raw


def dumps(obj: Any, translate: Callable[[Any], Any] | None = None) -> bytes:
    """Pickle ``obj`` with protocol 2 (see :class:`Pickler2`)."""
    return Pickler2(translate).dumps(obj)
