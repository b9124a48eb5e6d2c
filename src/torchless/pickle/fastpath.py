"""A fast path for the pickles ``torch.save`` writes for tensors and state dicts.

Most checkpoints hold one pickle shape over and over: a dict (or ``OrderedDict``) of
``torch._utils._rebuild_tensor_v2(<storage persistent id>, offset, size, stride,
requires_grad, OrderedDict())`` calls; every DCP item is one such call on its own. For
those, the general :class:`~torchless.pickle.machine.Unpickler` pays a per-run set-up
and a dispatch over the whole opcode set. :func:`fast_load` runs only the small subset
of opcodes these pickles use, with *the same semantics as the machine* for each of them,
and gives up (returns :data:`FALLBACK`) on anything else, so the caller runs the general
machine instead.

It is exactly as safe as the machine, by construction:

- a GLOBAL is resolved only if its (Python-2-renamed) name is one of :data:`FAST_GLOBALS`,
  and then through the caller's resolver, as the machine does (so the allowlist decides,
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

__all__ = ["FALLBACK", "FAST_GLOBALS", "fast_load"]

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

#: the fast path handles pickles up to this size (bigger ones are rare and not per-item)
MAX_FAST = 1 << 26
#: memo entries and MARK depth the fast path allows before leaving it to the machine
_MAX_MEMO = 1 << 20
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


def _tensor_pickle(data: bytes, resolver: Any, persistent_load: Callable[[Any], Any] | None) -> Any:
    """The one-tensor pickle through one regular expression (None: not that shape)."""
    m = _TENSOR_RE.match(data)
    if m is None or persistent_load is None:
        return None
    cls, kl, key, ll, loc, numel, off, size, stride, rg = m.group(
        "cls", "kl", "key", "ll", "loc", "numel", "off", "size", "stride", "rg"
    )
    if kl[0] != len(key) or ll[0] != len(loc):
        return None
    # the machine's order: the GLOBALs as they come, persistent_load at BINPERSID, the
    # OrderedDict REDUCE, then the tensor's REDUCE
    k1 = python2_name("torch._utils", "_rebuild_tensor_v2", torch_subset=True)
    rebuild = resolver.resolve(*k1)
    k2 = python2_name("torch", cls.decode("ascii"), torch_subset=True)
    if k2 not in FAST_GLOBALS:
        return FALLBACK
    stype = resolver.resolve(*k2)
    pid = ("storage", stype, key.decode("ascii"), loc.decode("ascii"), int_token(numel, 0)[0])
    storage = persistent_load(pid)
    odict = resolver.resolve(*python2_name("collections", "OrderedDict", torch_subset=True))
    if type(odict) is not Rebuilder or type(rebuild) is not Rebuilder:
        return FALLBACK
    hooks = odict._call(())
    args = (storage, int_token(off, 0)[0], _tuple_of(size), _tuple_of(stride), rg == b"\x88", hooks)
    return rebuild._call(args)


def fast_load(data: Any, resolver: Any, persistent_load: Callable[[Any], Any] | None, limits: Any = None) -> tuple[Any, int]:
    """Run ``data`` if it is a recognised tensor/state-dict pickle.

    ``limits`` (a :class:`~torchless.pickle.machine.Limits`): the fast path only runs when
    every bound it could come near is at least its own, so the machine's limits always
    apply; otherwise FALLBACK.

    Returns:
        ``(obj, seen_added)``: the object the machine would return, or ``FALLBACK``; and
        how many entries were appended to ``resolver.seen`` (to undo on FALLBACK).
    """
    if limits is not None and (
        limits.max_memo < _MAX_MEMO
        or limits.max_marks < _MAX_MARKS
        or limits.max_object_bytes < _MAX_STR
        or limits.max_input < min(len(data), MAX_FAST + 1)
    ):
        return FALLBACK, 0
    if not isinstance(data, bytes):
        data = bytes(data)
    seen = getattr(resolver, "seen", None)
    seen0 = len(seen) if seen is not None else 0
    try:
        obj = _tensor_pickle(data, resolver, persistent_load) if len(data) < 512 else None
        if obj is None:
            obj = _run(data, resolver, persistent_load)
    except Exception:  # noqa: BLE001 - whatever went wrong, the machine decides
        obj = FALLBACK
    return obj, (len(seen) - seen0 if seen is not None else 0)


def _run(data: bytes, resolver: Any, persistent_load: Callable[[Any], Any] | None) -> Any:  # noqa: C901
    n = len(data)
    if n > MAX_FAST or n < 3 or data[0] != 0x80 or data[1] != 2:
        return FALLBACK
    stack: list[Any] = []
    metastack: list[list[Any]] = []
    memo: dict[int, Any] = {}
    pos = 2
    while pos < n:
        op = data[pos]
        pos += 1
        if op == 0x71:  # q BINPUT
            if not stack:
                return FALLBACK
            memo[data[pos]] = stack[-1]
            pos += 1
        elif op == 0x72:  # r LONG_BINPUT
            if not stack or pos + 4 > n:
                return FALLBACK
            idx = _unpack_I(data, pos)[0]
            pos += 4
            if len(memo) >= _MAX_MEMO and idx not in memo:
                return FALLBACK
            memo[idx] = stack[-1]
        elif op == 0x68:  # h BINGET
            v = memo.get(data[pos], memo)
            if v is memo:
                return FALLBACK
            stack.append(v)
            pos += 1
        elif op == 0x6A:  # j LONG_BINGET
            if pos + 4 > n:
                return FALLBACK
            v = memo.get(_unpack_I(data, pos)[0], memo)
            if v is memo:
                return FALLBACK
            stack.append(v)
            pos += 4
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
            if len(metastack) >= _MAX_MARKS:
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
        elif op == 0x58:  # X BINUNICODE
            if pos + 4 > n:
                return FALLBACK
            k = _unpack_I(data, pos)[0]
            pos += 4
            if k > _MAX_STR or pos + k > n:
                return FALLBACK
            stack.append(str(data[pos : pos + k], "utf-8", "surrogatepass"))
            pos += k
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
        elif op == 0x63:  # c GLOBAL
            e1 = data.find(b"\n", pos, pos + 64)
            e2 = data.find(b"\n", e1 + 1, e1 + 65) if e1 > pos else -1
            if e2 <= e1 + 1:
                return FALLBACK
            key = python2_name(str(data[pos:e1], "utf-8", "strict"), str(data[e1 + 1 : e2], "utf-8", "strict"), torch_subset=True)
            pos = e2 + 1
            if key not in FAST_GLOBALS:
                return FALLBACK
            stack.append(resolver.resolve(*key))
        elif op == 0x7D:  # } EMPTY_DICT
            stack.append({})
        elif op == 0x75:  # u SETITEMS
            if not metastack:
                return FALLBACK
            items = stack
            stack = metastack.pop()
            if not _setitems(stack[-1], items):
                return FALLBACK
        elif op == 0x73:  # s SETITEM
            v = stack.pop()
            k = stack.pop()
            if not _setitems(stack[-1], [k, v]):
                return FALLBACK
        elif op == 0x2E:  # . STOP
            if len(stack) != 1 or metastack:
                return FALLBACK
            return stack[0]
        else:
            return FALLBACK
    return FALLBACK


def _setitems(target: Any, items: list[Any]) -> bool:
    """The machine's SETITEM(S) on a dict, for str/int keys only (its key check is then a
    no-op); False for anything else."""
    if not isinstance(target, dict) or len(items) % 2:
        return False
    for i in range(0, len(items), 2):
        k = items[i]
        if type(k) is not str and type(k) is not int:
            return False
        target[k] = items[i + 1]
    return True
