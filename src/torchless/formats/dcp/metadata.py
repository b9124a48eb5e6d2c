"""Reading and writing DCP's ``.metadata`` pickle without importing or running anything.

torch writes ``.metadata`` with ``pickle.dump`` (protocol 4) and reads it back with a plain
``pickle.load``: any global in it would run. torchless reads it through its own pickle
machine with :data:`DCP_ALLOWLIST`, which holds exactly the DCP classes plus the torch
values they contain (``torch.Size``, dtypes, the strided layout, path objects); anything
else is refused with :class:`~torchless.core.errors.UnsafeGlobalError` and nothing runs.

NEWOBJ on a DCP class makes an inert :class:`_Shell`; BUILD stores its state; a final
pass validates every shell and turns it into the dataclasses of :mod:`.spec`.

Writing emits protocol 2 through :class:`~torchless.pickle.writer.Pickler2`
(``copyreg.__newobj__`` + BUILD, which is what CPython's pickler does for these
classes at protocol 2); torch's ``pickle.load`` reads it.
"""

from __future__ import annotations

import gc
import os
import pathlib
from typing import Any

from ...core.dtypes import DType
from ...core.errors import FormatError, TorchlessError, short_repr
from ...core.source import open_source
from ...core.values import Layout, Size
from ...pickle.globals import Allowlist, Rebuilder
from ...pickle.machine import Limits, Unpickler
from ...pickle.torch_globals import DEFAULT_ALLOWLIST, TORCH_ALLOWLIST
from ...pickle.writer import Global, Pickler2, Reduce
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
    if type(x) is MetadataIndex:  # built and checked by the fast decoder (.fastmeta)
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
    if type(x) is StorageInfo:  # built and checked by the fast decoder (.fastmeta)
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
        return {_plain(k, where): _plain(v, where) for k, v in x.items()}
    return x


def to_metadata(obj: Any) -> Metadata:
    """Validate the unpickled shells and build :class:`~.spec.Metadata`."""
    st = _state_dict(_expect(obj, "Metadata"), FIELDS["Metadata"])
    sdm = st.get("state_dict_metadata")
    if not isinstance(sdm, dict):
        raise _err("state_dict_metadata must be a dict")
    items: dict[str, Any] = {}
    for fqn, md in sdm.items():
        if not isinstance(fqn, str):
            raise _err("state_dict_metadata keys must be strings", found=short_repr(fqn, 40))
        sh = md if isinstance(md, _Shell) else None
        if type(md) is TensorStorageMetadata:  # built and checked by the fast decoder (.fastmeta)
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
        storage = {_index(k): _storage_info(v) for k, v in sd.items()}
    version = st.get("version")
    if version is not None and not isinstance(version, str):
        raise _err("version must be a string", found=short_repr(version, 40))
    return Metadata(
        items, _plain(st.get("planner_data"), "planner_data"), storage, _storage_meta(st.get("storage_meta")), version
    )


#: run only the general pickle machine (tests set it to compare the two paths); by
#: default the fast decoder of :mod:`.fastmeta` is tried first
GENERAL_ONLY = False


def parse_metadata(data: Any, *, path: Any = None, limits: Limits = Limits()) -> Metadata:
    """Parse the bytes of a ``.metadata`` file.

    The fast decoder (:func:`~.fastmeta.fast_metadata`) is tried first; on anything it
    does not recognise the general pickle machine runs, and decides.

    Raises:
        UnsafeGlobalError: the pickle names anything but DCP's classes (nothing runs).
        FormatError: malformed pickle or metadata.
    """
    if not GENERAL_ONLY:
        from .fastmeta import fast_metadata

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


def read_metadata(directory: Any, name: str = METADATA_NAME) -> Metadata:
    """Read ``<directory>/.metadata``; without one, the per-rank ``__<rank>.metadata``
    files of ``dcp.save(..., use_collectives=False)`` merged (:func:`merge_rank_metadata`)."""
    from ...core.errors import NotFoundError
    from ...core.paths import confine
    from .constants import rank_metadata_names

    if _is_url(os.fspath(directory)):
        return _read_remote_metadata(os.fspath(directory), name)
    p = os.path.join(os.fspath(directory), name)
    if not os.path.isfile(p) and name == METADATA_NAME:
        ranks = rank_metadata_names(directory)
        if ranks:
            return merge_rank_metadata([(n, read_metadata(directory, n)) for n in ranks], path=directory)
    if not os.path.isfile(p):
        raise NotFoundError("not a DCP checkpoint: no .metadata file", path=directory)
    src = open_source(confine(directory, name, what="DCP metadata file"))
    try:
        return parse_metadata(src.view(0, src.size), path=p)
    finally:
        src.close()


def _is_url(p: Any) -> bool:
    from ...core.remote import is_url

    return is_url(p)


def _read_remote_metadata(directory: str, name: str) -> Metadata:
    from ...core import remote
    from ...core.errors import NotFoundError
    from .constants import rank_metadata_names

    p = remote.join(directory, name)
    try:
        src = remote.RemoteSource(p)
    except NotFoundError:
        ranks = rank_metadata_names(directory) if name == METADATA_NAME else []
        if ranks:
            return merge_rank_metadata([(n, read_metadata(directory, n)) for n in ranks], path=directory)
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


# -- writing ------------------------------------------------------------------------------
def _new(mod: str, cls: str, state: Any) -> Reduce:
    return Reduce(Global("copyreg", "__newobj__"), (Global(mod, cls),), state=state)


def _size(t: tuple[int, ...]) -> Reduce:
    return Reduce(Global("torch", "Size"), (tuple(int(v) for v in t),))


def _translate(obj: Any) -> Any:
    if isinstance(obj, Metadata):
        st: dict[str, Any] = {
            "state_dict_metadata": obj.state_dict_metadata,
            "planner_data": obj.planner_data,
            "storage_data": obj.storage_data,
            "storage_meta": obj.storage_meta,
            "version": obj.version,
        }
        return _new(MD_MOD, "Metadata", st)
    if isinstance(obj, TensorStorageMetadata):
        return _new(
            MD_MOD, "TensorStorageMetadata", {"properties": obj.properties, "size": _size(obj.size), "chunks": list(obj.chunks)}
        )
    if isinstance(obj, TensorProperties):
        enc = {v: k for k, v in MEM_FORMATS.items()}[obj.memory_format]
        state = (
            Global("torch", obj.dtype.name),
            Reduce(Global("torch.serialization", "_get_layout"), (f"torch.{obj.layout}",)),
            bool(obj.requires_grad),
            Reduce(Global(MD_MOD, "_MEM_FORMAT_ENCODING"), (enc,)),
            bool(obj.pin_memory),
        )
        return _new(MD_MOD, "TensorProperties", state)
    if isinstance(obj, ChunkStorageMetadata):
        return _new(MD_MOD, "ChunkStorageMetadata", {"offsets": _size(obj.offsets), "sizes": _size(obj.sizes)})
    if isinstance(obj, BytesStorageMetadata):
        return Reduce(Global("copyreg", "__newobj__"), (Global(MD_MOD, "BytesStorageMetadata"),))
    if isinstance(obj, MetadataIndex):
        st = {"fqn": obj.fqn, "index": obj.index}
        if obj.offset is not None:
            st["offset"] = _size(obj.offset)
        return _new(MD_MOD, "MetadataIndex", st)
    if isinstance(obj, StorageInfo):
        st = {"relative_path": obj.relative_path, "offset": int(obj.offset), "length": int(obj.length)}
        if obj.transform_descriptors is not None:
            st["transform_descriptors"] = list(obj.transform_descriptors)
        return _new(FS_MOD, STORAGE_INFO_NAME, st)
    if isinstance(obj, StorageMeta):
        cid = obj.checkpoint_id
        return _new(
            MD_MOD,
            "StorageMeta",
            {
                "checkpoint_id": None if cid is None else str(cid),
                "save_id": obj.save_id,
                "load_id": obj.load_id,
                "modules": list(obj.modules),
            },
        )
    if isinstance(obj, Size):
        return _size(obj)
    return obj


def dump_metadata(md: Metadata) -> bytes:
    """``.metadata`` bytes (pickle protocol 2) that torch's ``pickle.load`` reads."""
    return Pickler2(_translate).dumps(md)
