"""A fast path for the pickles torch writes: state dicts, DCP items, DCP ``.metadata``.

Most checkpoints hold one pickle shape over and over: a dict (or ``OrderedDict``) of
``torch._utils._rebuild_tensor_v2(<storage persistent id>, offset, size, stride,
requires_grad, OrderedDict())`` calls; every DCP item is one such call on its own. For
those, the general :class:`~torchless.pickle.machine.Unpickler` pays a per-run set-up
and a dispatch over the whole opcode set. :func:`fast_load` runs only the small subset
of opcodes these pickles use, with *the same semantics as the machine* for each of them,
and gives up (returns :data:`FALLBACK`) on anything else, so the caller runs the general
machine instead. The same loop reads the protocol-4 ``.metadata`` pickles of
``torch.distributed.checkpoint`` (MEMOIZE, STACK_GLOBAL, NEWOBJ, BUILD, lists): their
caller widens the globals to its own allowlist and passes :class:`EntryHooks` that
match the two entry shapes repeated once per tensor with one regular expression each.

It is exactly as safe as the machine, by construction:

- a GLOBAL is resolved only if its (Python-2-renamed) name is one of :data:`FAST_GLOBALS`
  (or the caller's ``allowed`` set), and then through the caller's resolver, as the machine does (so the allowlist decides,
  and ``resolver.seen`` records it in the same order);
- REDUCE only calls a :class:`~torchless.pickle.globals.Rebuilder` the resolver returned,
  with a tuple, as the machine's REDUCE does; persistent ids go to the caller's
  ``persistent_load`` as in the machine;
- any error, any unknown opcode, any irregular stack or memo use, any limit approached:
  FALLBACK. The caller then runs the general machine from the start on fresh state, so
  every error message, offset and limit comes from the machine itself.

Side effects before a FALLBACK (entries appended to ``resolver.seen``, storages that
``persistent_load`` recorded) are the caller's to undo; :func:`fast_load` reports how
many ``seen`` entries it added.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable
from typing import Any

from .globals import Rebuilder, python2_name
from .machine import Limits

__all__ = [
    "FALLBACK",
    "FAST_GLOBALS",
    "OPAQUE",
    "EntryHooks",
    "OnceResolver",
    "fast_load",
    "fast_tensor",
    "int_token",
    "tensor_frame",
]

#: returned when the pickle is not one of the recognised shapes: run the general machine
FALLBACK: Any = object()

#: the only globals the fast path resolves (anything else: FALLBACK)
FAST_GLOBALS = frozenset(
    {("torch._utils", "_rebuild_tensor_v2"), ("collections", "OrderedDict")}
    | {
        ("torch", n)
        for n in (
            "FloatStorage",
            "DoubleStorage",
            "HalfStorage",
            "BFloat16Storage",
            "LongStorage",
            "IntStorage",
            "ShortStorage",
            "CharStorage",
            "ByteStorage",
            "BoolStorage",
            "ComplexFloatStorage",
            "ComplexDoubleStorage",
        )
    }
)

_unpack_i = struct.Struct("<i").unpack_from
_unpack_I = struct.Struct("<I").unpack_from
_unpack_H = struct.Struct("<H").unpack_from
_unpack_Q = struct.Struct("<Q").unpack_from

_DEFAULT_LIMITS = Limits()

#: dict key types SETITEM(S) takes by default
_KEYS = frozenset({str, int})

#: a memo slot an :class:`EntryHooks` filled with a value nothing fetches again in the
#: files it recognises (a fetch of it hands the pickle to the machine)
OPAQUE: Any = object()

#: the fast path handles pickles up to this size (a DCP ``.metadata`` of a million
#: tensors is about 200 MB)
MAX_FAST = 1 << 30
#: memo entries, MARK depth and string size the fast path allows (and never more than
#: the machine's limits) before leaving it to the machine
_MAX_MEMO = 1 << 26
_MAX_MARKS = 64
_MAX_STR = 1 << 20


_INT = rb"(?:K.|M..|J.{4}|\x8a(?:\x01.|\x02.{2}|\x03.{3}|\x04.{4}|\x05.{5}|\x06.{6}|\x07.{7}|\x08.{8}))"
_PUT = rb"(?:q.|r.{4})"  # BINPUT (the memo is never read back in these pickles)
_TUP = (
    rb"\)|"
    + _INT
    + rb"\x85"
    + _PUT
    + rb"|"
    + _INT
    + rb"{2}\x86"
    + _PUT
    + rb"|"
    + _INT
    + rb"{3}\x87"
    + _PUT
    + rb"|\("
    + _INT
    + rb"*t"
    + _PUT
)

#: the whole pickle ``torch.save`` writes for one tensor of a classic dtype (every DCP item):
#: ``_rebuild_tensor_v2(pid, offset, size, stride, requires_grad, OrderedDict())``
_TENSOR_RE = re.compile(
    rb"\x80\x02ctorch._utils\n_rebuild_tensor_v2\n" + _PUT + rb"\(\(X\x07\x00\x00\x00storage" + _PUT
    + rb"ctorch\n(?P<cls>[A-Za-z0-9]{1,24})\n" + _PUT
    + rb"X(?P<kl>[\x01-\x14])\x00\x00\x00(?P<key>[0-9A-Za-z_]{1,20})" + _PUT
    + rb"X(?P<ll>[\x01-\x20])\x00\x00\x00(?P<loc>[A-Za-z0-9:_]{1,32})" + _PUT
    + rb"(?P<numel>" + _INT + rb")t" + _PUT + rb"Q(?P<off>" + _INT + rb")(?P<size>" + _TUP + rb")(?P<stride>" + _TUP + rb")"
    + rb"(?P<rg>[\x88\x89])ccollections\nOrderedDict\n" + _PUT + rb"\)R" + _PUT + rb"t" + _PUT + rb"R" + _PUT + rb"\.\Z",
    re.DOTALL,
)  # fmt: skip


def int_token(tok: bytes, p: int = 0) -> tuple[int, int]:
    """The int that the BININT1/BININT2/BININT/LONG1 token at ``tok[p:]`` pushes, and the
    position after it (the token was matched by a pattern already: no bounds checks)."""
    op = tok[p]
    if op == 0x4B:
        return tok[p + 1], p + 2
    if op == 0x4D:
        return _unpack_H(tok, p + 1)[0], p + 3
    if op == 0x4A:
        return _unpack_i(tok, p + 1)[0], p + 5
    k = tok[p + 1]
    return int.from_bytes(tok[p + 2 : p + 2 + k], "little", signed=True), p + 2 + k


def _tuple_of(tok: bytes) -> tuple[int, ...]:
    """The ints of a ``_TUP`` token (its ints, then TUPLEn or TUPLE and a BINPUT)."""
    if tok == b")":
        return ()
    p = 1 if tok[0] == 0x28 else 0
    out = []
    while tok[p] in (0x4B, 0x4D, 0x4A, 0x8A):
        v, p = int_token(tok, p)
        out.append(v)
    return tuple(out)


_K_REBUILD = python2_name("torch._utils", "_rebuild_tensor_v2", torch_subset=True)
_K_ODICT = python2_name("collections", "OrderedDict", torch_subset=True)


#: what :func:`_tensor_parts` found in a one-tensor pickle, by its bytes (items of one
#: shape and dtype have the same pickle); cleared when it grows past _PARTS_MAX
_PARTS: dict[bytes, Any] = {}
_PARTS_MAX = 1 << 16


def _tensor_parts(data: bytes) -> tuple[Any, ...] | None:
    """The fields of a one-tensor pickle matched by ``_TENSOR_RE`` (None: not that shape):
    ``(storage global key or None, key, location, numel, offset, size, stride, requires_grad)``."""
    m = _TENSOR_RE.match(data)
    if m is None:
        return None
    cls, kl, key, ll, loc, numel, off, size, stride, rg = m.group(
        "cls", "kl", "key", "ll", "loc", "numel", "off", "size", "stride", "rg"
    )
    if kl[0] != len(key) or ll[0] != len(loc):
        return None
    k2 = python2_name("torch", cls.decode("ascii"), torch_subset=True)
    return (
        k2 if k2 in FAST_GLOBALS else None,
        key.decode("ascii"),
        loc.decode("ascii"),
        int_token(numel, 0)[0],
        int_token(off, 0)[0],
        _tuple_of(size),
        _tuple_of(stride),
        rg == b"\x88",
    )


def tensor_frame(data: bytes) -> tuple[tuple[bytes, bytes, bytes], int, tuple[int, ...], tuple[int, ...]] | None:
    """A one-tensor pickle that :func:`fast_tensor` would match, split into its frame (its
    bytes before, between and after the numel token and the size and stride tokens: the
    pickles of one checkpoint's items of one dtype, storage key, location, offset and
    rank share it) and those three values; None for anything else. Says nothing about
    whether the values are valid: the caller checks them as building the tensor would."""
    if len(data) >= 512:
        return None
    m = _TENSOR_RE.match(data)
    if m is None:
        return None
    a, b = m.span("numel")
    c, d = m.span("size")
    e, f = m.span("stride")
    return (data[:a], data[b:c], data[f:]), int_token(data, a)[0], _tuple_of(data[c:d]), _tuple_of(data[e:f])


def _tensor_pickle(data: bytes, resolver: Any, persistent_load: Callable[[Any], Any] | None) -> Any:
    """The one-tensor pickle through one regular expression (None: not that shape)."""
    parts = _PARTS.get(data)
    if parts is None:
        parts = _tensor_parts(data)
        if parts is None:
            return None
        if len(_PARTS) >= _PARTS_MAX:
            _PARTS.clear()
        _PARTS[data] = parts
    if persistent_load is None:
        return None
    k2, key, loc, numel, off, size, stride, rg = parts
    # the machine's order: the GLOBALs as they come, persistent_load at BINPERSID, the
    # OrderedDict REDUCE, then the tensor's REDUCE
    rebuild = resolver.resolve(*_K_REBUILD)
    if k2 is None:
        return FALLBACK
    stype = resolver.resolve(*k2)
    storage = persistent_load(("storage", stype, key, loc, numel))
    odict = resolver.resolve(*_K_ODICT)
    if type(odict) is not Rebuilder or type(rebuild) is not Rebuilder:
        return FALLBACK
    return rebuild._call((storage, off, size, stride, rg, odict._call(())))


class OnceResolver:
    """Asks ``inner`` once per global and repeats its answer: for the many DCP items of one
    checkpoint, whose pickles name the same three globals. Only what ``inner`` accepted is
    kept (a refusal raises again at every ask), so nothing resolves here that ``inner``
    would not resolve."""

    __slots__ = ("inner", "_got")

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self._got: dict[tuple[str, str], Any] = {}

    def resolve(self, module: str, name: str) -> Any:
        v = self._got.get((module, name), self)
        if v is self:
            v = self._got[(module, name)] = self.inner.resolve(module, name)
        return v


def fast_tensor(data: bytes, resolver: Any, persistent_load: Callable[[Any], Any]) -> Any:
    """The one-tensor pickle of a DCP item (``_rebuild_tensor_v2`` of one storage) through
    one regular expression: what the machine returns for it, or ``FALLBACK`` for anything
    else (including any error: the machine then decides)."""
    if len(data) >= 512:
        return FALLBACK
    try:
        obj = _tensor_pickle(data, resolver, persistent_load)
    except Exception:  # noqa: BLE001 - whatever went wrong, the machine decides
        return FALLBACK
    return FALLBACK if obj is None else obj


def fast_load(
    data: Any,
    resolver: Any,
    persistent_load: Callable[[Any], Any] | None,
    limits: Any = None,
    *,
    allowed: Any = FAST_GLOBALS,
    hooks: Any = None,
    buildable: tuple[type, ...] = (),
    key_types: frozenset[type] = _KEYS,
) -> tuple[Any, int]:
    """Run ``data`` if it is a recognised pickle.

    ``limits`` (a :class:`~torchless.pickle.machine.Limits`; its defaults when None): the
    fast path leaves the pickle to the machine before any of them is reached, so the
    machine's limits always apply.

    The other arguments let one caller widen the subset for its own files, never past
    the machine: ``allowed`` the ``(module, name)`` globals it may resolve (through
    ``resolver`` still); ``buildable`` the types BUILD may act on (through their
    ``__torchless_build__``, as the machine does); ``key_types`` the dict key types
    SETITEM(S) may use; ``hooks`` an :class:`EntryHooks` that matches whole repeated
    entries at once (DCP ``.metadata``).

    Returns:
        ``(obj, seen_added)``: the object the machine would return, or ``FALLBACK``; and
        how many entries were appended to ``resolver.seen`` (to undo on FALLBACK).
    """
    if limits is None:
        limits = _DEFAULT_LIMITS
    if limits.max_input < len(data) or len(data) > MAX_FAST:
        return FALLBACK, 0
    if not isinstance(data, bytes):
        data = bytes(data)
    seen = getattr(resolver, "seen", None)
    seen0 = len(seen) if seen is not None else 0
    try:
        obj = None
        if len(data) < 512 and hooks is None and allowed is FAST_GLOBALS:
            obj = _tensor_pickle(data, resolver, persistent_load)
        if obj is None:
            obj = _run(data, resolver, persistent_load, limits, allowed, hooks, buildable, key_types)
    except Exception:  # noqa: BLE001 - whatever went wrong, the machine decides
        obj = FALLBACK
    return obj, (len(seen) - seen0 if seen is not None else 0)


class EntryHooks:
    """Recognises whole entries that a caller's files repeat (one regular expression
    each) and builds their values directly: the fast path asks at every memo fetch
    (``on_get``) and every string (``on_str``). Each returns None (run the opcodes), or
    ``(values pushed, values memoized in order, position after the entry)``: exactly
    what running the entry's opcodes would leave. A memo entry that nothing in the
    recognised files fetches again may be :data:`OPAQUE` (a later fetch of it is a
    FALLBACK). A hook that goes on through several entries in a row may append their
    memo values to ``memo`` itself as it goes (a later entry may fetch an earlier one's)
    and return an empty list for them; the memo bound is checked after each hook."""

    def on_get(self, value: Any, data: bytes, pos: int, memo: list[Any]) -> tuple[tuple[Any, ...], list[Any], int] | None:
        """At the BINGET/LONG_BINGET at ``pos`` that fetched ``value``."""
        return None

    def on_str(self, value: str, data: bytes, pos: int, memo: list[Any]) -> tuple[tuple[Any, ...], list[Any], int] | None:
        """After the string ``value`` whose opcode ends at ``pos``."""
        return None


def _run(  # noqa: C901 - one dispatch loop by design
    data: bytes,
    resolver: Any,
    persistent_load: Callable[[Any], Any] | None,
    limits: Any,
    allowed: Any,
    hooks: EntryHooks | None,
    buildable: tuple[type, ...],
    key_types: frozenset[type],
) -> Any:
    n = len(data)
    if n < 3 or data[0] != 0x80 or data[1] not in (2, 4):
        return FALLBACK
    max_memo = min(limits.memo_cap(n), _MAX_MEMO)
    max_marks = min(limits.max_marks, _MAX_MARKS)
    max_str = min(limits.max_object_bytes, _MAX_STR)
    stack: list[Any] = []
    metastack: list[list[Any]] = []
    # the memo as the machine's would be when its indices are dense (MEMOIZE, or BINPUT
    # at the next index or an existing one); any other BINPUT: FALLBACK
    memo: list[Any] = []
    on_get = hooks.on_get if hooks is not None else None
    on_str = hooks.on_str if hooks is not None else None
    pos = 2
    while pos < n:
        op = data[pos]
        pos += 1
        if op == 0x94:  # MEMOIZE
            if len(memo) >= max_memo:
                return FALLBACK
            memo.append(stack[-1])
        elif op == 0x68 or op == 0x6A:  # h BINGET / j LONG_BINGET
            if op == 0x68:
                idx = data[pos]
                nxt = pos + 1
            else:
                if pos + 4 > n:
                    return FALLBACK
                idx = _unpack_I(data, pos)[0]
                nxt = pos + 4
            if idx >= len(memo):
                return FALLBACK
            v = memo[idx]
            if v is OPAQUE:
                return FALLBACK
            if on_get is not None:
                hit = on_get(v, data, pos - 1, memo)
                if hit is not None:
                    stack.extend(hit[0])
                    memo.extend(hit[1])
                    if len(memo) >= max_memo:
                        return FALLBACK
                    pos = hit[2]
                    continue
            stack.append(v)
            pos = nxt
        elif op == 0x71 or op == 0x72:  # q BINPUT / r LONG_BINPUT
            if not stack:
                return FALLBACK
            if op == 0x71:
                idx = data[pos]
                pos += 1
            else:
                if pos + 4 > n:
                    return FALLBACK
                idx = _unpack_I(data, pos)[0]
                pos += 4
            if idx == len(memo):
                if idx >= max_memo:
                    return FALLBACK
                memo.append(stack[-1])
            elif idx < len(memo):
                memo[idx] = stack[-1]
            else:
                return FALLBACK
        elif op == 0x8C or op == 0x58:  # SHORT_BINUNICODE / X BINUNICODE
            if op == 0x8C:
                k = data[pos]
                pos += 1
            else:
                if pos + 4 > n:
                    return FALLBACK
                k = _unpack_I(data, pos)[0]
                pos += 4
            if k > max_str or pos + k > n:
                return FALLBACK
            s = str(data[pos : pos + k], "utf-8", "surrogatepass")
            pos += k
            if on_str is not None:
                hit = on_str(s, data, pos, memo)
                if hit is not None:
                    stack.extend(hit[0])
                    memo.extend(hit[1])
                    if len(memo) >= max_memo:
                        return FALLBACK
                    pos = hit[2]
                    continue
            stack.append(s)
        elif op == 0x4B:  # K BININT1
            stack.append(data[pos])
            pos += 1
        elif op == 0x4D:  # M BININT2
            if pos + 2 > n:
                return FALLBACK
            stack.append(_unpack_H(data, pos)[0])
            pos += 2
        elif op == 0x4A:  # J BININT
            if pos + 4 > n:
                return FALLBACK
            stack.append(_unpack_i(data, pos)[0])
            pos += 4
        elif op == 0x8A:  # LONG1
            k = data[pos]
            pos += 1
            if pos + k > n:
                return FALLBACK
            stack.append(int.from_bytes(data[pos : pos + k], "little", signed=True))
            pos += k
        elif op == 0x28:  # ( MARK
            if len(metastack) >= max_marks:
                return FALLBACK
            metastack.append(stack)
            stack = []
        elif op == 0x74:  # t TUPLE
            if not metastack:
                return FALLBACK
            items = stack
            stack = metastack.pop()
            stack.append(tuple(items))
        elif op == 0x85:  # TUPLE1
            stack[-1] = (stack[-1],)
        elif op == 0x86:  # TUPLE2
            b = stack.pop()
            stack[-1] = (stack[-1], b)
        elif op == 0x87:  # TUPLE3
            c = stack.pop()
            b = stack.pop()
            stack[-1] = (stack[-1], b, c)
        elif op == 0x29:  # ) EMPTY_TUPLE
            stack.append(())
        elif op == 0x89:  # NEWFALSE
            stack.append(False)
        elif op == 0x88:  # NEWTRUE
            stack.append(True)
        elif op == 0x4E:  # N NONE
            stack.append(None)
        elif op == 0x51:  # Q BINPERSID
            if persistent_load is None:
                return FALLBACK
            stack.append(persistent_load(stack.pop()))
        elif op == 0x52:  # R REDUCE
            args = stack.pop()
            func = stack[-1]
            if type(args) is not tuple or type(func) is not Rebuilder:
                return FALLBACK
            stack[-1] = func._call(args)
        elif op == 0x81:  # NEWOBJ
            args = stack.pop()
            cls = stack[-1]
            if type(args) is not tuple or type(cls) is not Rebuilder:
                return FALLBACK
            stack[-1] = cls.new(args, {})
        elif op == 0x62:  # b BUILD
            state = stack.pop()
            inst = stack[-1]
            if type(inst) not in buildable:
                return FALLBACK
            inst.__torchless_build__(state)
        elif op == 0x63 or op == 0x93:  # c GLOBAL / STACK_GLOBAL
            if op == 0x63:
                e1 = data.find(b"\n", pos, pos + 64)
                e2 = data.find(b"\n", e1 + 1, e1 + 65) if e1 > pos else -1
                if e2 <= e1 + 1:
                    return FALLBACK
                mod, nm = str(data[pos:e1], "utf-8", "strict"), str(data[e1 + 1 : e2], "utf-8", "strict")
                pos = e2 + 1
            else:
                nm = stack.pop()
                mod = stack.pop()
                if type(nm) is not str or type(mod) is not str:
                    return FALLBACK
            key = python2_name(mod, nm, torch_subset=True)
            if key not in allowed:
                return FALLBACK  # the machine refuses it (or not), with its own message
            stack.append(resolver.resolve(*key))
        elif op == 0x7D:  # } EMPTY_DICT
            stack.append({})
        elif op == 0x5D:  # ] EMPTY_LIST
            stack.append([])
        elif op == 0x75:  # u SETITEMS
            if not metastack:
                return FALLBACK
            items = stack
            stack = metastack.pop()
            if not _setitems(stack[-1], items, key_types):
                return FALLBACK
        elif op == 0x73:  # s SETITEM
            v = stack.pop()
            k = stack.pop()
            if not _setitems(stack[-1], [k, v], key_types):
                return FALLBACK
        elif op == 0x61:  # a APPEND
            v = stack.pop()
            if type(stack[-1]) is not list:
                return FALLBACK
            stack[-1].append(v)
        elif op == 0x65:  # e APPENDS
            if not metastack:
                return FALLBACK
            items = stack
            stack = metastack.pop()
            if type(stack[-1]) is not list:
                return FALLBACK
            stack[-1].extend(items)
        elif op == 0x95:  # FRAME: framing changes nothing for a reader of the whole stream
            if pos + 8 > n or pos + 8 + _unpack_Q(data, pos)[0] > n:
                return FALLBACK
            pos += 8
        elif op == 0x2E:  # . STOP
            if len(stack) != 1 or metastack:
                return FALLBACK
            return stack[0]
        else:
            return FALLBACK
    return FALLBACK


def _setitems(target: Any, items: list[Any], key_types: frozenset[type]) -> bool:
    """The machine's SETITEM(S) on a dict (or OrderedDict), for keys of ``key_types`` only (types
    whose key check in the machine is a no-op); False for anything else."""
    if not isinstance(target, dict) or len(items) % 2:
        return False
    keys = items[0::2]
    for k in keys:
        if type(k) not in key_types:
            return False
    target.update(zip(keys, items[1::2], strict=True))
    return True
