"""Writing DCP's ``.metadata`` pickle: protocol 2 through
:class:`~torchless.pickle.writer.Pickler2` (``copyreg.__newobj__`` + BUILD, which is what
CPython's pickler does for these classes at protocol 2); torch's ``pickle.load`` reads it.
The reader is :mod:`.metadata` (which re-exports :func:`dump_metadata`).
"""

from __future__ import annotations

from typing import Any

from ...core.values import Size
from ...pickle.writer import Global, Pickler2, Reduce
from .spec import (
    FILESYSTEM_MODULE,
    MEM_FORMATS,
    METADATA_MODULE,
    STORAGE_INFO_NAME,
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    StorageInfo,
    StorageMeta,
    TensorProperties,
    TensorStorageMetadata,
)

__all__ = ["dump_metadata"]

MD_MOD = METADATA_MODULE
FS_MOD = FILESYSTEM_MODULE


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
