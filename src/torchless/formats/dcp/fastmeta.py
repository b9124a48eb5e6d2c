"""A fast decoder for the ``.metadata`` pickles ``torch.distributed.checkpoint`` writes.

A checkpoint of 20,000 tensors has a 4 MB ``.metadata`` of two million opcodes; run by
the general :class:`~torchless.pickle.machine.Unpickler` it costs seconds. Almost all of
it is two entry shapes repeated once per tensor: a ``state_dict_metadata`` entry (the
fqn, a ``TensorStorageMetadata`` with its ``TensorProperties``, ``torch.Size`` and one
``ChunkStorageMetadata``) and a ``storage_data`` entry (a ``MetadataIndex`` and its
``_StorageInfo``), written with every class and field name fetched from the memo.

:func:`fast_metadata` runs a small interpreter of the protocol-4 opcodes these pickles
use, with the general machine's semantics for each (globals resolved through the same
:data:`~.metadata.DCP_ALLOWLIST`, NEWOBJ/REDUCE/BUILD on the same rebuilders), and
matches each of the two entry shapes with one compiled regular expression: a match
builds the finished spec objects directly, after the checks
:func:`~.metadata.to_metadata` makes. Anything else, anything unexpected (an opcode
outside the subset, a memo entry of the wrong kind, a failed check, a limit
approached, any exception) returns None, and the caller runs the general machine from
the start, which then accepts or refuses the file with its own errors. So the fast
decoder never accepts what the general path refuses, and what it returns equals what
the general path returns (tests compare the two on torch-written and mutated files).
"""

from __future__ import annotations

import gc
import re
import struct
from typing import Any

from ...core.dtypes import DType
from ...core.values import Layout
from ...pickle.fastpath import int_token
from ...pickle.globals import Rebuilder, python2_name
from ...pickle.machine import Limits
from .metadata import DCP_ALLOWLIST, FS_MOD, MD_MOD, _MemFormat, _Shell, to_metadata
from .spec import (
    MEM_FORMATS,
    STORAGE_INFO_NAME,
    ChunkStorageMetadata,
    MetadataIndex,
    StorageInfo,
    TensorProperties,
    TensorStorageMetadata,
)

__all__ = ["fast_metadata"]

_unpack_I = struct.Struct("<I").unpack_from
_unpack_Q = struct.Struct("<Q").unpack_from


def _target(qual: str) -> Any:
    e = DCP_ALLOWLIST.get(qual)
    assert e is not None
    return e.target


_TSM = _target(f"{MD_MOD}.TensorStorageMetadata")
_TP = _target(f"{MD_MOD}.TensorProperties")
_CSM = _target(f"{MD_MOD}.ChunkStorageMetadata")
_MI = _target(f"{MD_MOD}.MetadataIndex")
_SI = _target(f"{FS_MOD}.{STORAGE_INFO_NAME}")
_SIZE = _target("torch.Size")

#: a memo slot the fast path filled with a value nothing in a torch-written file fetches
#: again (a fetch of it hands the file to the general machine)
_OPAQUE: Any = object()

_INT = rb"(?:K.|M..|J.{4}|\x8a(?:\x01.|\x02.{2}|\x03.{3}|\x04.{4}|\x05.{5}|\x06.{6}|\x07.{7}|\x08.{8}))"
#: the argument tuple of torch.Size: the dims tuple (memoized unless empty), TUPLE1, MEMOIZE
_SZ = rb"\)|" + _INT + rb"\x85\x94|" + _INT + rb"{2}\x86\x94|" + _INT + rb"{3}\x87\x94|\(" + _INT + rb"*t\x94"
_NEW = rb"\)\x81\x94"  # EMPTY_TUPLE NEWOBJ MEMOIZE

#: the memo fetches of an entry that name classes, field names and shared values: the
#: same bytes in every entry of a file, so after one entry passed every check a
#: pattern with them spelled out matches the next ones (checked by the match itself)
_TSM_CONST = (
    "tsm",
    "k_properties",
    "tp",
    "dtype",
    "layout",
    "memfmt",
    "k_size",
    "size_cls",
    "k_chunks",
    "csm",
    "k_offsets",
    "size_cls2",
    "k_sizes",
    "size_cls3",
)
_SD_CONST = ("mi", "k_fqn", "k_index", "k_offset", "size_cls", "si", "k_relative_path", "rp", "k_offset2", "k_length")


def _tsm_pattern(lit: dict[str, bytes] | None = None) -> re.Pattern:
    """After an fqn key and its MEMOIZE: TensorStorageMetadata with one chunk."""

    def g(name: str) -> bytes:
        if lit is not None:
            return re.escape(lit[name])
        return rb"(?:h(?P<%sa>.)|j(?P<%sb>.{4}))" % (name.encode(), name.encode())

    return re.compile(
        g("tsm")
        + _NEW
        + rb"\}\x94\("  # TSM class; its state dict
        + g("k_properties")
        + g("tp")
        + _NEW
        + rb"\("
        + g("dtype")
        + g("layout")
        + rb"(?P<rg>[\x88\x89])"
        + g("memfmt")
        + rb"(?P<pin>[\x88\x89])t\x94b"  # TensorProperties
        + g("k_size")
        + g("size_cls")
        + rb"(?P<size>"
        + _SZ
        + rb")\x85\x94R\x94"  # 'size': torch.Size(...)
        + g("k_chunks")
        + rb"\]\x94"  # 'chunks': []
        + g("csm")
        + _NEW
        + rb"\}\x94\("
        + g("k_offsets")
        + g("size_cls2")
        + rb"(?P<offs>"
        + _SZ
        + rb")\x85\x94R\x94"
        + g("k_sizes")
        + g("size_cls3")
        + rb"(?P<sizes>"
        + _SZ
        + rb")\x85\x94R\x94ub"  # one chunk
        + rb"aub",
        re.DOTALL,
    )


def _sd_pattern(lit: dict[str, bytes] | None = None) -> re.Pattern:
    """A storage_data entry: MetadataIndex(fqn, index, offset) -> _StorageInfo(relative_path, offset, length)."""

    def g(name: str) -> bytes:
        if lit is not None:
            return re.escape(lit[name])
        return rb"(?:h(?P<%sa>.)|j(?P<%sb>.{4}))" % (name.encode(), name.encode())

    return re.compile(
        g("mi")
        + _NEW
        + rb"\}\x94\("
        + g("k_fqn")
        + rb"(?:h(?P<fqna>.)|j(?P<fqnb>.{4}))"
        + g("k_index")
        + rb"(?P<index>N|"
        + _INT
        + rb")"
        + g("k_offset")
        + g("size_cls")
        + rb"(?P<offs>"
        + _SZ
        + rb")\x85\x94R\x94ub"
        + g("si")
        + _NEW
        + rb"\}\x94\("
        + g("k_relative_path")
        + g("rp")
        + g("k_offset2")
        + rb"(?P<off>"
        + _INT
        + rb")"
        + g("k_length")
        + rb"(?P<length>"
        + _INT
        + rb")ub",
        re.DOTALL,
    )


#: a planner_data entry of a flat state dict: fqn -> (1 to 3 path parts), all fetched from the memo
_PLAN_RE = re.compile(rb"(?:h(.)|j(.{4}))((?:h.|j.{4}){1,3})([\x85\x86\x87])\x94", re.DOTALL)
_TUPLE_N = {0x85: 1, 0x86: 2, 0x87: 3}

_TSM_RE = _tsm_pattern()
_SD_RE = _sd_pattern()


def _dims(tok: bytes) -> tuple[tuple[int, ...], int]:
    """The dims of a ``_SZ`` match and the memo entries it made (_Bail if one is negative)."""
    if tok == b")":
        return (), 0
    p = 1 if tok[0] == 0x28 else 0
    end = len(tok) - 2  # the TUPLEn (or TUPLE) and its MEMOIZE
    out = []
    while p < end:
        v, p = int_token(tok, p)
        if v < 0:
            raise _Bail
        out.append(v)
    return tuple(out), 1


class _Bail(Exception):
    """Leave the fast path: the general machine decides."""


def fast_metadata(data: Any, limits: Limits | None = None) -> Any:
    """The :class:`~.spec.Metadata` of a ``.metadata`` pickle, or None when the general
    machine must decide (anything outside the recognised subset)."""
    if limits is not None and limits != Limits():
        return None
    if not isinstance(data, bytes):
        data = bytes(data)
    if len(data) > Limits().max_input:
        return None
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        obj = _run(data)
        if obj is None:
            return None
        return to_metadata(obj)
    except Exception:  # noqa: BLE001 - whatever went wrong, the general machine decides
        return None
    finally:
        if gc_was_enabled:
            gc.enable()


def _run(data: bytes) -> Any:  # noqa: C901 - one dispatch loop by design
    n = len(data)
    lim = Limits()
    max_memo, max_marks = lim.max_memo, lim.max_marks
    stack: list[Any] = []
    metastack: list[list[Any]] = []
    memo: list[Any] = []
    entries = _Entries(memo)
    plan_match = _PLAN_RE.match
    pos = 0
    while pos < n:
        op = data[pos]
        pos += 1
        if op == 0x94:  # MEMOIZE
            memo.append(stack[-1])
        elif op == 0x68 or op == 0x6A:  # BINGET / LONG_BINGET
            if op == 0x68:
                idx = data[pos]
                nxt = pos + 1
            else:
                if pos + 4 > n:
                    return None
                idx = _unpack_I(data, pos)[0]
                nxt = pos + 4
            v = memo[idx]
            if v is _OPAQUE:
                return None
            if v is _MI:
                hit = entries.sd(data, pos - 1)
                if hit is not None:
                    stack.append(hit[0])
                    stack.append(hit[1])
                    memo.extend([_OPAQUE] * hit[2])
                    pos = hit[3]
                    continue
            elif type(v) is str:
                m = plan_match(data, pos - 1)
                if m is not None:
                    parts = _plan_parts(m, memo)
                    if parts is not None:
                        stack.append(v)
                        stack.append(parts)
                        memo.append(parts)
                        pos = m.end()
                        continue
            stack.append(v)
            pos = nxt
        elif op == 0x8C or op == 0x58:  # SHORT_BINUNICODE / BINUNICODE
            if op == 0x8C:
                k = data[pos]
                pos += 1
            else:
                if pos + 4 > n:
                    return None
                k = _unpack_I(data, pos)[0]
                pos += 4
            if pos + k > n or k > lim.max_object_bytes:
                return None
            s = data[pos : pos + k].decode("utf-8", "surrogatepass")
            pos += k
            if pos < n and data[pos] == 0x94:
                tsm = entries.tsm(data, pos + 1)
                if tsm is not None:
                    stack.append(s)
                    memo.append(s)
                    stack.append(tsm[0])
                    memo.extend([_OPAQUE] * tsm[1])
                    pos = tsm[2]
                    continue
            stack.append(s)
        elif op == 0x29:  # EMPTY_TUPLE
            stack.append(())
        elif op == 0x85:  # TUPLE1
            stack[-1] = (stack[-1],)
        elif op == 0x86:  # TUPLE2
            b = stack.pop()
            stack[-1] = (stack[-1], b)
        elif op == 0x87:  # TUPLE3
            c = stack.pop()
            b = stack.pop()
            stack[-1] = (stack[-1], b, c)
        elif op == 0x28:  # MARK
            if len(metastack) >= max_marks:
                return None
            metastack.append(stack)
            stack = []
        elif op == 0x74:  # TUPLE
            items = stack
            stack = metastack.pop()
            stack.append(tuple(items))
        elif op == 0x7D:  # EMPTY_DICT
            stack.append({})
        elif op == 0x5D:  # EMPTY_LIST
            stack.append([])
        elif op == 0x75:  # SETITEMS
            items = stack
            stack = metastack.pop()
            _setitems(stack[-1], items)
        elif op == 0x73:  # SETITEM
            v = stack.pop()
            k = stack.pop()
            _setitems(stack[-1], [k, v])
        elif op == 0x61:  # APPEND
            v = stack.pop()
            if type(stack[-1]) is not list:
                return None
            stack[-1].append(v)
        elif op == 0x65:  # APPENDS
            items = stack
            stack = metastack.pop()
            if type(stack[-1]) is not list:
                return None
            stack[-1].extend(items)
        elif op == 0x81:  # NEWOBJ
            args = stack.pop()
            cls = stack[-1]
            if type(args) is not tuple or type(cls) is not Rebuilder:
                return None
            stack[-1] = cls.new(args, {})
        elif op == 0x52:  # REDUCE
            args = stack.pop()
            func = stack[-1]
            if type(args) is not tuple or type(func) is not Rebuilder:
                return None
            stack[-1] = func._call(args)
        elif op == 0x62:  # BUILD
            state = stack.pop()
            inst = stack[-1]
            if type(inst) is not _Shell:
                return None
            inst.__torchless_build__(state)
        elif op == 0x93:  # STACK_GLOBAL
            nm = stack.pop()
            mod = stack.pop()
            if type(nm) is not str or type(mod) is not str:
                return None
            mod, nm = python2_name(mod, nm, torch_subset=True)
            e = DCP_ALLOWLIST.get(f"{mod}.{nm}")
            if e is None:
                return None  # the general machine refuses it, with its message
            stack.append(e.target)
        elif op == 0x89:  # NEWFALSE
            stack.append(False)
        elif op == 0x88:  # NEWTRUE
            stack.append(True)
        elif op == 0x4E:  # NONE
            stack.append(None)
        elif op == 0x4B or op == 0x4D or op == 0x4A or op == 0x8A:  # BININT1/2, BININT, LONG1
            if pos >= n or pos + (1 if op == 0x4B else 2 if op == 0x4D else 4 if op == 0x4A else 1 + data[pos]) > n:
                return None
            v, pos = int_token(data, pos - 1)
            stack.append(v)
        elif op == 0x95:  # FRAME: framing changes nothing for a reader of the whole stream
            if pos + 8 > n or pos + 8 + _unpack_Q(data, pos)[0] > n:
                return None
            pos += 8
        elif op == 0x80:  # PROTO
            pos += 1
        elif op == 0x2E:  # STOP
            if not stack:
                return None
            return stack[-1]
        else:
            return None
        if len(memo) >= max_memo:
            return None
    return None


_KEY_TYPES = frozenset({str, _Shell, MetadataIndex})


def _setitems(target: Any, items: list[Any]) -> None:
    if type(target) is not dict or len(items) % 2:
        raise _Bail
    keys = items[0::2]
    if not {type(k) for k in keys} <= _KEY_TYPES:
        raise _Bail
    target.update(zip(keys, items[1::2], strict=True))


def _plan_parts(m: re.Match, memo: list[Any]) -> tuple[Any, ...] | None:
    """The path tuple of a planner_data entry (None: not all its parts are plain values)."""
    raw, op = m.group(3, 4)
    out = []
    p = 0
    while p < len(raw):
        if raw[p] == 0x68:
            v = memo[raw[p + 1]]
            p += 2
        else:
            v = memo[_unpack_I(raw, p + 1)[0]]
            p += 5
        if type(v) is not str and type(v) is not int:
            return None
        out.append(v)
    if len(out) != _TUPLE_N[op[0]]:
        return None
    return tuple(out)


class _Entries:
    """Matches the two entry shapes at a position; checks and builds what they hold."""

    def __init__(self, memo: list[Any]) -> None:
        self.memo = memo
        self.dims: dict[bytes, tuple[tuple[int, ...], int]] = {}
        self.tsm_special: list[tuple[re.Pattern, DType, str, str]] = []
        self.sd_special: list[tuple[re.Pattern, str]] = []

    def _dims(self, tok: bytes) -> tuple[tuple[int, ...], int]:
        d = self.dims.get(tok)
        if d is None:
            d = self.dims[tok] = _dims(tok)
        return d

    def _ref(self, m: re.Match, name: str) -> tuple[Any, bytes]:
        a = m.group(name + "a")
        if a is not None:
            return self.memo[a[0]], b"h" + a
        b = m.group(name + "b")
        return self.memo[_unpack_I(b)[0]], b"j" + b

    def _consts(self, m: re.Match, names: tuple[str, ...], want: dict[str, Any]) -> tuple[dict[str, bytes], dict[str, Any]]:
        lit: dict[str, bytes] = {}
        val: dict[str, Any] = {}
        for name in names:
            v, raw = self._ref(m, name)
            w = want.get(name)
            if w is None:
                pass  # checked by the caller
            elif isinstance(w, str):
                if type(v) is not str or v != w:
                    raise _Bail
            elif v is not w:
                raise _Bail
            lit[name] = raw
            val[name] = v
        return lit, val

    def tsm(self, data: bytes, pos: int) -> tuple[TensorStorageMetadata, int, int] | None:
        """(value, memo entries after the key's, end) of a tensor entry at ``pos``."""
        for pat, dtype, layout, mf in self.tsm_special:
            m = pat.match(data, pos)
            if m is not None:
                return self._tsm(m, dtype, layout, mf)
        m = _TSM_RE.match(data, pos)
        if m is None:
            return None
        want = {
            "tsm": _TSM,
            "k_properties": "properties",
            "tp": _TP,
            "k_size": "size",
            "size_cls": _SIZE,
            "k_chunks": "chunks",
            "csm": _CSM,
            "k_offsets": "offsets",
            "size_cls2": _SIZE,
            "k_sizes": "sizes",
            "size_cls3": _SIZE,
        }
        lit, val = self._consts(m, _TSM_CONST, want)
        dtype, layout, mf = val["dtype"], val["layout"], val["memfmt"]
        if not isinstance(dtype, DType) or not isinstance(layout, Layout) or not isinstance(mf, _MemFormat):
            raise _Bail
        out = self._tsm(m, dtype, str(layout), MEM_FORMATS[int(mf)])
        if len(self.tsm_special) < 16:
            self.tsm_special.append((_tsm_pattern(lit), dtype, str(layout), MEM_FORMATS[int(mf)]))
        return out

    def _tsm(self, m: re.Match, dtype: DType, layout: str, mf: str) -> tuple[TensorStorageMetadata, int, int]:
        st, ot, zt, rg, pin = m.group("size", "offs", "sizes", "rg", "pin")
        size, s1 = self._dims(st)
        offs, o1 = self._dims(ot)
        sizes, z1 = self._dims(zt)
        if len(offs) != len(size) or len(sizes) != len(size):
            raise _Bail
        for o, z, d in zip(offs, sizes, size, strict=True):
            if o + z > d:
                raise _Bail
        props = TensorProperties(dtype, layout, rg == b"\x88", mf, pin == b"\x88")
        # memo: TSM shell, its dict, TP shell, TP state, Size (dims, args, value), the
        # list, CSM shell, its dict, two Sizes
        k = 2 + 2 + (s1 + 2) + 1 + 2 + (o1 + 2) + (z1 + 2)
        return TensorStorageMetadata(props, size, [ChunkStorageMetadata(offs, sizes)]), k, m.end()

    def sd(self, data: bytes, pos: int) -> tuple[MetadataIndex, StorageInfo, int, int] | None:
        """(key, value, memo entries, end) of a storage_data entry at ``pos``."""
        for pat, rp in self.sd_special:
            m = pat.match(data, pos)
            if m is not None:
                return self._sd(m, rp)
        m = _SD_RE.match(data, pos)
        if m is None:
            return None
        want = {
            "mi": _MI,
            "k_fqn": "fqn",
            "k_index": "index",
            "k_offset": "offset",
            "size_cls": _SIZE,
            "si": _SI,
            "k_relative_path": "relative_path",
            "k_offset2": "offset",
            "k_length": "length",
        }
        lit, val = self._consts(m, _SD_CONST, want)
        rp = val["rp"]
        if type(rp) is not str:
            raise _Bail
        out = self._sd(m, rp)
        if len(self.sd_special) < 16:
            self.sd_special.append((_sd_pattern(lit), rp))
        return out

    def _sd(self, m: re.Match, rp: str) -> tuple[MetadataIndex, StorageInfo, int, int]:
        fqn, _raw = self._ref(m, "fqn")
        if type(fqn) is not str:
            raise _Bail
        index, ot, offt, lnt = m.group("index", "offs", "off", "length")
        offs, o1 = self._dims(ot)
        off = int_token(offt)[0]
        ln = int_token(lnt)[0]
        if off < 0 or ln < 0:
            raise _Bail
        # memo: MI shell, its dict, the Size (dims, args, value); SI shell, its dict
        key = MetadataIndex(fqn, offs, None if index == b"N" else int_token(index)[0])
        return key, StorageInfo(rp, off, ln, None), 2 + o1 + 2 + 2, m.end()
