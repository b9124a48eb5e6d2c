"""Reading and writing DCP's ``.metadata`` pickle without importing or running anything.

torch writes ``.metadata`` with ``pickle.dump`` (protocol 4) and reads it back with a plain
``pickle.load``: any global in it would run. torchless reads it through its own pickle
machine with :data:`DCP_ALLOWLIST`, which holds exactly the DCP classes plus the torch
values they contain (``torch.Size``, dtypes, the strided layout, path objects); anything
else is refused with :class:`~torchless.core.errors.UnsafeGlobalError` and nothing runs.

NEWOBJ on a DCP class makes an inert :class:`_Shell`; BUILD stores its state; a final
pass validates every shell and turns it into the dataclasses of :mod:`.spec`.

Writing (:func:`dump_metadata`, re-exported here) lives in :mod:`.metadata_write`.
"""

from __future__ import annotations

import gc
import os
import pathlib
import re
import struct
from typing import Any

from ...core.dtypes import DType
from ...core.errors import FormatError, TorchlessError, short_repr
from ...core.settings import SETTINGS
from ...core.values import Layout
from ...io.source import RemoteSource, open_source
from ...pickle.fastpath import FALLBACK, OPAQUE, EntryHooks, fast_load, int_token
from ...pickle.globals import Allowlist, Rebuilder
from ...pickle.machine import Limits, Unpickler
from ...pickle.torch_globals import DEFAULT_ALLOWLIST, TORCH_ALLOWLIST
from .metadata_write import dump_metadata
from .spec import (
    CLASSES,
    FIELDS,
    FILESYSTEM_MODULE,
    MEM_FORMATS,
    METADATA_MODULE,
    METADATA_NAME,
    STORAGE_INFO_NAME,
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    StorageInfo,
    StorageMeta,
    TensorProperties,
    TensorStorageMetadata,
    storage_info_location,
)

__all__ = ["DCP_ALLOWLIST", "parse_metadata", "read_metadata", "merge_rank_metadata", "dump_metadata"]

MD_MOD = METADATA_MODULE
FS_MOD = FILESYSTEM_MODULE

#: DCP class name -> spec kind
_CLASSES = CLASSES


class _Shell:
    """What NEWOBJ on a DCP class makes: the class kind and, after BUILD, its state."""

    __slots__ = ("kind", "args", "state")

    def __init__(self, kind: str, args: tuple) -> None:
        self.kind = kind
        self.args = args
        self.state: Any = None

    def __torchless_build__(self, state: Any) -> None:
        if self.state is not None:
            raise FormatError(f"{self.kind} built twice")
        self.state = state


class _MemFormat(int):
    """``_MEM_FORMAT_ENCODING(n)``."""


def _class(kind: str) -> Rebuilder:
    def new(args: tuple, kwargs: dict) -> _Shell:
        if kwargs:
            raise FormatError(f"{kind} created with keyword arguments")
        return _Shell(kind, args)

    return Rebuilder(kind, lambda a: new(a, {}), new)


def _mem_format(args: tuple) -> _MemFormat:
    if len(args) != 1 or type(args[0]) is not int or args[0] not in MEM_FORMATS:
        raise FormatError("bad _MEM_FORMAT_ENCODING value", expected="0, 1 or 2", found=short_repr(args, 40))
    return _MemFormat(args[0])


def _build_allowlist() -> Allowlist:
    al = Allowlist("dcp-metadata")
    for qual, kind in _CLASSES.items():
        al.add(qual, _class(kind), f"DCP metadata class {kind}: an inert record, validated field by field")
    al.add(
        f"{MD_MOD}._MEM_FORMAT_ENCODING",
        Rebuilder(f"{MD_MOD}._MEM_FORMAT_ENCODING", _mem_format),
        "an enum value 0..2 (memory format)",
    )
    for qual in ["torch.Size", "torch.serialization._get_layout"]:
        e = TORCH_ALLOWLIST.get(qual)
        assert e is not None
        al.add(qual, e.target, e.reason)
    for qual, e in TORCH_ALLOWLIST.items():
        if isinstance(e.target, DType):
            al.add(qual, e.target, e.reason)
    for qual in [
        "copyreg.__newobj__",
        "pathlib.PosixPath",
        "pathlib.PurePosixPath",
        "pathlib.WindowsPath",
        "pathlib.PureWindowsPath",
        "pathlib.Path",
    ]:
        e = DEFAULT_ALLOWLIST.get(qual)
        assert e is not None
        al.add(qual, e.target, e.reason)
    return al


#: exactly what a ``.metadata`` pickle may name.
DCP_ALLOWLIST = _build_allowlist()


class _Resolver:
    def __init__(self) -> None:
        self.seen: list[tuple[str, bool]] = []

    def resolve(self, module: str, name: str) -> Any:
        from ...core.errors import UnsafeGlobalError

        qual = f"{module}.{name}"
        e = DCP_ALLOWLIST.get(qual)
        self.seen.append((qual, e is not None))
        if e is None:
            raise UnsafeGlobalError(
                f"refusing global {qual} in DCP .metadata: only DCP's metadata classes are allowed (nothing was imported or run)",
                global_name=qual,
                hint=(
                    "this .metadata was not written by torch.distributed.checkpoint's default planner; do not load it "
                    "with torch either"
                ),
            )
        return e.target


# -- conversion of shells into spec objects ----------------------------------------------
def _err(msg: str, **kw: Any) -> FormatError:
    return FormatError(f"bad DCP metadata: {msg}", **kw)


def _ints(x: Any, what: str) -> tuple[int, ...]:
    if not isinstance(x, tuple) or not all(type(v) is int and v >= 0 for v in x):
        raise _err(f"{what} must be a torch.Size of non-negative ints", found=short_repr(x, 60))
    return tuple(x)


def _state_dict(sh: _Shell, allowed: frozenset[str] | set[str]) -> dict[str, Any]:
    st = sh.state
    if st is None:
        st = {}
    if isinstance(st, tuple) and len(st) == 2 and isinstance(st[0], dict) and st[1] is None:
        st = st[0]
    if not isinstance(st, dict) or not all(isinstance(k, str) for k in st):
        raise _err(f"{sh.kind} state must be a dict", found=type(st).__name__)
    extra = set(st) - allowed
    if extra:
        raise _err(f"{sh.kind} has unknown fields", found=", ".join(sorted(extra))[:80])
    if sh.args:
        raise _err(f"{sh.kind} created with arguments", found=short_repr(sh.args, 60))
    return st


def _expect(x: Any, kind: str) -> _Shell:
    if not isinstance(x, _Shell) or x.kind != kind:
        raise _err(f"expected {kind}", found=getattr(x, "kind", type(x).__name__))
    return x


def _properties(x: Any) -> TensorProperties:
    sh = _expect(x, "TensorProperties")
    st = sh.state
    if not isinstance(st, tuple) or len(st) != 5:
        raise _err("TensorProperties state must be a 5-tuple", found=short_repr(st, 60))
    dtype, layout, rg, mf, pin = st
    if not isinstance(dtype, DType):
        raise _err("TensorProperties dtype", found=short_repr(dtype, 40))
    if not isinstance(layout, Layout) or not isinstance(mf, _MemFormat) or type(rg) is not bool or type(pin) is not bool:
        raise _err("TensorProperties fields", found=short_repr(st, 80))
    return TensorProperties(dtype, str(layout), rg, MEM_FORMATS[int(mf)], pin)


def _chunk(x: Any) -> ChunkStorageMetadata:
    st = _state_dict(_expect(x, "ChunkStorageMetadata"), FIELDS["ChunkStorageMetadata"])
    if set(st) != FIELDS["ChunkStorageMetadata"]:
        raise _err("ChunkStorageMetadata needs offsets and sizes")
    offs, sizes = _ints(st["offsets"], "chunk offsets"), _ints(st["sizes"], "chunk sizes")
    if len(offs) != len(sizes):
        raise _err("chunk offsets and sizes differ in rank", found=f"{offs} / {sizes}")
    return ChunkStorageMetadata(offs, sizes)


def _tensor_md(sh: _Shell, fqn: str) -> TensorStorageMetadata:
    st = _state_dict(sh, FIELDS["TensorStorageMetadata"])
    if set(st) != FIELDS["TensorStorageMetadata"] or not isinstance(st["chunks"], list):
        raise _err("TensorStorageMetadata needs properties, size and a list of chunks", member=fqn)
    size = _ints(st["size"], "tensor size")
    chunks = [_chunk(c) for c in st["chunks"]]
    for c in chunks:
        if len(c.offsets) != len(size) or any(o + s > g for o, s, g in zip(c.offsets, c.sizes, size, strict=False)):
            raise _err(
                "chunk lies outside its tensor",
                member=fqn,
                expected=f"within {list(size)}",
                found=f"offsets {list(c.offsets)} sizes {list(c.sizes)}",
            )
    return TensorStorageMetadata(_properties(st["properties"]), size, chunks)


def _index(x: Any) -> MetadataIndex:
    if type(x) is MetadataIndex:  # built and checked by the fast path (fast_metadata)
        return x
    st = _state_dict(_expect(x, "MetadataIndex"), FIELDS["MetadataIndex"])
    fqn = st.get("fqn")
    if not isinstance(fqn, str):
        raise _err("MetadataIndex.fqn must be a string", found=short_repr(fqn, 40))
    off = st.get("offset")
    idx = st.get("index")
    if idx is not None and type(idx) is not int:
        raise _err("MetadataIndex.index must be an int", found=short_repr(idx, 40))
    return MetadataIndex(fqn, None if off is None else _ints(off, "MetadataIndex.offset"), idx)


def _storage_info(x: Any) -> StorageInfo:
    if type(x) is StorageInfo:  # built and checked by the fast path (fast_metadata)
        return x
    st = _state_dict(_expect(x, "StorageInfo"), FIELDS["StorageInfo"])
    loc = storage_info_location(st)
    if loc is None:
        raise _err("_StorageInfo needs relative_path, offset and length", found=short_repr(st, 80))
    rp, off, ln = loc
    td = st.get("transform_descriptors")
    if td is not None:
        if not isinstance(td, (list, tuple)) or not all(isinstance(s, str) for s in td):
            raise _err("_StorageInfo.transform_descriptors", found=short_repr(td, 60))
        td = tuple(td)
    return StorageInfo(rp, off, ln, td)


def _storage_meta(x: Any) -> StorageMeta | None:
    if x is None:
        return None
    st = _state_dict(_expect(x, "StorageMeta"), {"checkpoint_id", "save_id", "load_id", "modules"})
    cid = st.get("checkpoint_id")
    if isinstance(cid, pathlib.PurePath):
        cid = str(cid)
    mods = st.get("modules") or []
    return StorageMeta(cid, st.get("save_id"), st.get("load_id"), list(mods) if isinstance(mods, list) else [])


def _plain(x: Any, where: str) -> Any:
    """planner data: nested tuples/lists/dicts of str/int/None (no DCP objects)."""
    t = type(x)
    if t is str or t is int or x is None:
        return x
    if t is tuple and all(type(v) is str for v in x):  # a flat state dict's key path
        return x
    if isinstance(x, _Shell):
        raise _err(f"unexpected {x.kind} in {where}")
    if isinstance(x, (list, tuple)):
        return type(x)(_plain(v, where) for v in x) if type(x) in (list, tuple) else tuple(_plain(v, where) for v in x)
    if isinstance(x, dict):
        if type(x) is dict and set(map(type, x)) <= {str} and set(map(type, x.values())) <= {tuple}:
            # a flat state dict's planner data: str -> key path; a path of strs stays as it is
            return {k: v if set(map(type, v)) <= {str} else _plain(v, where) for k, v in x.items()}
        return {_plain(k, where): _plain(v, where) for k, v in x.items()}
    return x


def to_metadata(obj: Any) -> Metadata:
    """Validate the unpickled shells and build :class:`~.spec.Metadata`."""
    st = _state_dict(_expect(obj, "Metadata"), FIELDS["Metadata"])
    sdm = st.get("state_dict_metadata")
    if not isinstance(sdm, dict):
        raise _err("state_dict_metadata must be a dict")
    items: dict[str, Any] = {}
    if set(map(type, sdm)) <= {str} and set(map(type, sdm.values())) <= {TensorStorageMetadata}:
        # every entry built and checked by the fast path (fast_metadata): the loop below
        # would copy each one as it is
        items = dict(sdm)
        sdm = {}
    for fqn, md in sdm.items():
        if not isinstance(fqn, str):
            raise _err("state_dict_metadata keys must be strings", found=short_repr(fqn, 40))
        sh = md if isinstance(md, _Shell) else None
        if type(md) is TensorStorageMetadata:  # built and checked by the fast path (fast_metadata)
            items[fqn] = md
        elif sh is not None and sh.kind == "TensorStorageMetadata":
            items[fqn] = _tensor_md(sh, fqn)
        elif sh is not None and sh.kind == "BytesStorageMetadata":
            _state_dict(sh, set())
            items[fqn] = BytesStorageMetadata()
        else:
            raise _err(
                "state_dict_metadata values must be tensor or bytes metadata",
                member=fqn,
                found=getattr(md, "kind", type(md).__name__),
            )
    sd = st.get("storage_data")
    storage: dict[MetadataIndex, StorageInfo] | None = None
    if sd is not None:
        if not isinstance(sd, dict):
            raise _err("storage_data must be a dict (FileSystemWriter)")
        if set(map(type, sd)) <= {MetadataIndex} and set(map(type, sd.values())) <= {StorageInfo}:
            storage = dict(sd)  # built and checked by the fast path: what the line below gives
        else:
            storage = {_index(k): _storage_info(v) for k, v in sd.items()}
    version = st.get("version")
    if version is not None and not isinstance(version, str):
        raise _err("version must be a string", found=short_repr(version, 40))
    return Metadata(
        items, _plain(st.get("planner_data"), "planner_data"), storage, _storage_meta(st.get("storage_meta")), version
    )


# -- the fast path's hooks for .metadata ---------------------------------------------------
# A checkpoint of 20,000 tensors has a 4 MB ``.metadata`` of two million opcodes; run by the
# general machine it costs seconds. Almost all of it is two entry shapes repeated once per
# tensor: a ``state_dict_metadata`` entry (the fqn, a ``TensorStorageMetadata`` with its
# ``TensorProperties``, ``torch.Size`` and one ``ChunkStorageMetadata``) and a
# ``storage_data`` entry (a ``MetadataIndex`` and its ``_StorageInfo``), written with every
# class and field name fetched from the memo. :func:`fast_metadata` runs the pickle fast
# path (:mod:`torchless.pickle.fastpath`: the general machine's semantics for each opcode,
# globals resolved through the same :data:`DCP_ALLOWLIST`) with :class:`_Entries` as its
# hooks: each entry shape is one compiled regular expression whose match builds the
# finished spec objects directly, after the checks :func:`to_metadata` makes. Anything else
# (an opcode outside the subset, a memo entry of the wrong kind, a failed check, a limit
# approached, any exception) returns None, and the general machine runs from the start and
# accepts or refuses the file with its own errors. Tests compare the two on torch-written
# and mutated files.

_unpack_I = struct.Struct("<I").unpack_from
_unpack_i = struct.Struct("<i").unpack_from
_unpack_H = struct.Struct("<H").unpack_from


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

#: the (module, name) of every global the fast path may resolve: the allowlist's
_FAST_ALLOWED = frozenset(tuple(q.rsplit(".", 1)) for q, _e in DCP_ALLOWLIST.items())
_FAST_KEYS = frozenset({str, _Shell, MetadataIndex})

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


#: a frozen dataclass object made and filled in without its ``__init__`` (see ``_tsm``)
_new_object = object.__new__
_set_field = object.__setattr__


class _Bail(Exception):
    """Leave the fast path: the general machine decides."""


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


#: runs of OPAQUE memo values, by length
_OPAQUE_RUNS = [[OPAQUE] * k for k in range(16)]


def _memo_at(data: bytes, pos: int, n: int, memo: list[Any]) -> Any:
    """What the BINGET or LONG_BINGET at ``pos`` fetches (None when there is none there, or
    its index is past the memo: the fast path's own opcodes then decide)."""
    if pos + 1 < n and data[pos] == 0x68:
        idx = data[pos + 1]
    elif pos + 4 < n and data[pos] == 0x6A:
        idx = _unpack_I(data, pos + 1)[0]
    else:
        return None
    return memo[idx] if idx < len(memo) else None


class _Entries(EntryHooks):
    """Matches the two entry shapes at a position; checks and builds what they hold (the
    fast path's hooks for ``.metadata``)."""

    def __init__(self) -> None:
        self.memo: list[Any] = []
        self.dims: dict[bytes, tuple[tuple[int, ...], int]] = {}
        self.tsm_special: list[tuple[re.Pattern, DType, str, str]] = []
        self.sd_special: list[tuple[re.Pattern, str]] = []

    # Each hook, once its entry matched, goes on through the entries that follow it
    # directly (the next fqn key, the next MetadataIndex, the next planner_data key): the
    # same test and match that the fast path's next opcode would make, without handing
    # back to it in between. Their memo values are appended as they come (an entry may
    # fetch the one before it); the first entry that is not one hands back at its start.

    def on_get(self, value: Any, data: bytes, pos: int, memo: list[Any]) -> tuple[tuple[Any, ...], list[Any], int] | None:
        self.memo = memo
        if value is _MI:
            hit = self.sd(data, pos)
            if hit is None:
                return None
            pushed: list[Any] = []
            n = len(data)
            while True:
                pushed += hit[:2]
                memo += _OPAQUE_RUNS[hit[2]] if hit[2] < 16 else [OPAQUE] * hit[2]
                pos = hit[3]
                v = _memo_at(data, pos, n, memo)  # the next entry's BINGET of MetadataIndex
                if v is not _MI:
                    break
                hit = self.sd(data, pos)
                if hit is None:
                    break
            return tuple(pushed), [], pos
        if type(value) is str:
            m = _PLAN_RE.match(data, pos)
            if m is None:
                return None
            parts = _plan_parts(m, memo)
            if parts is None:
                return None
            pushed = []
            n = len(data)
            while True:
                pushed += (value, parts)
                memo.append(parts)
                pos = m.end()
                value = _memo_at(data, pos, n, memo)  # the next entry's BINGET of its fqn
                if type(value) is not str:
                    break
                m = _PLAN_RE.match(data, pos)
                if m is None:
                    break
                parts = _plan_parts(m, memo)
                if parts is None:
                    break
            return tuple(pushed), [], pos
        return None

    def on_str(self, value: str, data: bytes, pos: int, memo: list[Any]) -> tuple[tuple[Any, ...], list[Any], int] | None:
        n = len(data)
        if pos < n and data[pos] == 0x94:  # the fqn key of a tensor entry, memoized
            self.memo = memo
            hit = self.tsm(data, pos + 1)
            if hit is None:
                return None
            pushed: list[Any] = []
            while True:
                pushed += (value, hit[0])
                memo.append(value)
                memo += _OPAQUE_RUNS[hit[1]] if hit[1] < 16 else [OPAQUE] * hit[1]
                pos = hit[2]
                # the next entry's fqn key: SHORT_BINUNICODE, MEMOIZE (anything else, a
                # longer key included, through the fast path's own opcodes)
                if pos + 1 >= n or data[pos] != 0x8C:
                    break
                e = pos + 2 + data[pos + 1]
                if e >= n or data[e] != 0x94:
                    break
                value = str(data[pos + 2 : e], "utf-8", "surrogatepass")  # (as the fast path decodes it)
                hit = self.tsm(data, e + 1)
                if hit is None:
                    break
            return tuple(pushed), [], pos
        return None

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
        dims = self.dims
        size, s1 = dims.get(st) or self._dims(st)
        offs, o1 = dims.get(ot) or self._dims(ot)
        sizes, z1 = dims.get(zt) or self._dims(zt)
        if len(offs) != len(size) or len(sizes) != len(size):
            raise _Bail
        if sizes != size or any(offs):  # (one chunk of the whole tensor: inside it)
            for o, z, d in zip(offs, sizes, size, strict=True):
                if o + z > d:
                    raise _Bail
        props = TensorProperties(dtype, layout, rg == b"\x88", mf, pin == b"\x88")
        # memo: TSM shell, its dict, TP shell, TP state, Size (dims, args, value), the
        # list, CSM shell, its dict, two Sizes
        k = 2 + 2 + (s1 + 2) + 1 + 2 + (o1 + 2) + (z1 + 2)
        # the frozen dataclass filled in without its __init__ (an equal object, made in
        # three quarters of the time: one per tensor entry)
        chunk = _new_object(ChunkStorageMetadata)
        _set_field(chunk, "offsets", offs)
        _set_field(chunk, "sizes", sizes)
        return TensorStorageMetadata(props, size, [chunk]), k, m.end()

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
        index, ot, offt, lnt, fa, fb = m.group("index", "offs", "off", "length", "fqna", "fqnb")
        fqn = self.memo[fa[0]] if fa is not None else self.memo[_unpack_I(fb)[0]]  # (_ref)
        if type(fqn) is not str:
            raise _Bail
        offs, o1 = self.dims.get(ot) or self._dims(ot)
        # BININT and BININT2 (the common offsets and lengths) unpacked here, as int_token does
        off = _unpack_i(offt, 1)[0] if offt[0] == 0x4A else _unpack_H(offt, 1)[0] if offt[0] == 0x4D else int_token(offt)[0]
        ln = _unpack_i(lnt, 1)[0] if lnt[0] == 0x4A else _unpack_H(lnt, 1)[0] if lnt[0] == 0x4D else int_token(lnt)[0]
        if off < 0 or ln < 0:
            raise _Bail
        # memo: MI shell, its dict, the Size (dims, args, value); SI shell, its dict
        key = _new_object(MetadataIndex)  # as the chunk in _tsm
        _set_field(key, "fqn", fqn)
        _set_field(key, "offset", offs)
        _set_field(key, "index", None if index == b"N" else int_token(index)[0])
        return key, StorageInfo(rp, off, ln, None), 2 + o1 + 2 + 2, m.end()


def fast_metadata(data: Any, limits: Limits | None = None) -> Metadata | None:
    """The :class:`~.spec.Metadata` of a ``.metadata`` pickle through the fast path, or
    None when the general machine must decide (anything outside the recognised subset)."""
    if limits is not None and limits != Limits():
        return None
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        obj, _seen = fast_load(
            data,
            _Resolver(),
            None,
            limits,
            allowed=_FAST_ALLOWED,
            hooks=_Entries(),
            buildable=(_Shell,),
            key_types=_FAST_KEYS,
        )
        if obj is FALLBACK:
            return None
        return to_metadata(obj)
    except Exception:  # noqa: BLE001 - whatever went wrong, the general machine decides
        return None
    finally:
        if gc_was_enabled:
            gc.enable()


def parse_metadata(data: Any, *, path: Any = None, limits: Limits = Limits()) -> Metadata:
    """Parse the bytes of a ``.metadata`` file.

    The fast path (:func:`fast_metadata`) is tried first; on anything it
    does not recognise the general pickle machine runs, and decides.

    Raises:
        UnsafeGlobalError: the pickle names anything but DCP's classes (nothing runs).
        FormatError: malformed pickle or metadata.
    """
    if SETTINGS.dcp_metadata:
        md = fast_metadata(data, limits)
        if md is not None:
            return md
    res = _Resolver()
    gc_was_enabled = gc.isenabled()
    try:
        obj = Unpickler(data, resolver=res, limits=limits, path=path, member=METADATA_NAME).load()
        # tens of thousands of small spec objects that all live on: generational GC
        # passes over them would find nothing to free
        gc.disable()
        return to_metadata(obj)
    except TorchlessError as e:
        if e.path is None:
            e.path = path
        raise
    finally:
        if gc_was_enabled:
            gc.enable()


def read_metadata(directory: Any, name: str = METADATA_NAME, store: Any = None) -> Metadata:
    """Read ``<directory>/.metadata``; without one, the per-rank ``__<rank>.metadata``
    files of ``dcp.save(..., use_collectives=False)`` merged (:func:`merge_rank_metadata`).
    ``store``: the store holding ``directory`` (resolved here when not given)."""
    from ...core.errors import NotFoundError
    from ...io.paths import confine
    from .constants import rank_metadata_names, store_of

    store = store_of(os.fspath(directory), store)
    if store.remote:
        return _read_remote_metadata(os.fspath(directory), name, store)
    p = os.path.join(os.fspath(directory), name)
    if not os.path.isfile(p) and name == METADATA_NAME:
        ranks = rank_metadata_names(directory, store)
        if ranks:
            return merge_rank_metadata([(n, read_metadata(directory, n, store)) for n in ranks], path=directory)
    if not os.path.isfile(p):
        raise NotFoundError("not a DCP checkpoint: no .metadata file", path=directory)
    src = open_source(confine(directory, name, what="DCP metadata file"))
    try:
        return parse_metadata(src.view(0, src.size), path=p)
    finally:
        src.close()


def _read_remote_metadata(directory: str, name: str, store: Any) -> Metadata:
    from ...core.errors import NotFoundError
    from ...io import remote
    from .constants import rank_metadata_names

    p = remote.join(directory, name)
    try:
        src = RemoteSource(p)
    except NotFoundError:
        ranks = rank_metadata_names(directory, store) if name == METADATA_NAME else []
        if ranks:
            return merge_rank_metadata([(n, read_metadata(directory, n, store)) for n in ranks], path=directory)
        raise NotFoundError("not a DCP checkpoint: no .metadata file", path=directory) from None
    return parse_metadata(src.view(0, src.size), path=p)


def merge_rank_metadata(parts: list[tuple[str, Metadata]], *, path: Any = None) -> Metadata:
    """One checkpoint from per-rank metadata (``use_collectives=False``: each rank wrote
    ``__<rank>.metadata`` for its own items, without the global plan that deduplicates).

    Chunks are united by their offsets (a chunk several ranks saved is read from the
    lowest rank, as torch's global plan keeps the first); a bytes item and planner data
    come from the lowest rank holding them.

    Raises:
        FormatError: ranks disagree on a key's kind, a tensor's dtype or global size, or
            the same chunk's extent.
    """
    from ...core.errors import FormatError

    sdm: dict[str, Any] = {}
    storage: dict[MetadataIndex, StorageInfo] = {}
    planner: dict[str, Any] = {}
    first = parts[0][1]
    for name, md in parts:
        if md.storage_data is None:
            raise FormatError("per-rank metadata without storage_data", path=path, member=name)
        by_key = {(k.fqn, k.offset): v for k, v in md.storage_data.items()}
        for fqn, item in md.state_dict_metadata.items():
            prev = sdm.get(fqn)
            if isinstance(item, BytesStorageMetadata):
                if prev is None:
                    sdm[fqn] = item
                    if (fqn, None) in by_key:
                        storage[MetadataIndex(fqn)] = by_key[(fqn, None)]
                elif not isinstance(prev, BytesStorageMetadata):
                    raise FormatError("ranks disagree on whether a key is a tensor", path=path, member=fqn, found=name)
                continue
            if prev is None:
                prev = sdm[fqn] = TensorStorageMetadata(item.properties, tuple(item.size), [])
            elif (
                not isinstance(prev, TensorStorageMetadata)
                or prev.dtype.name != item.dtype.name
                or tuple(prev.size) != tuple(item.size)
            ):
                raise FormatError("ranks disagree on a tensor's dtype or global size", path=path, member=fqn, found=name)
            have = {c.offsets: c for c in prev.chunks}
            for c in item.chunks:
                if c.offsets in have:
                    if have[c.offsets].sizes != c.sizes:
                        raise FormatError("ranks saved one chunk with two extents", path=path, member=fqn, found=name)
                    continue
                info = by_key.get((fqn, c.offsets))
                if info is None:
                    raise FormatError(
                        "chunk has no storage entry", path=path, member=fqn, found=f"{name}: offsets {list(c.offsets)}"
                    )
                storage[MetadataIndex(fqn, c.offsets, len(prev.chunks))] = info
                prev.chunks.append(c)
                have[c.offsets] = c
        if isinstance(md.planner_data, dict):
            for k, v in md.planner_data.items():
                planner.setdefault(k, v)
    return Metadata(sdm, planner or first.planner_data, storage, first.storage_meta, first.version)
