"""The layout of a DCP checkpoint as plain dataclasses (spec ``dcp.md`` §2).

These mirror ``torch.distributed.checkpoint.metadata`` (``Metadata``,
``TensorStorageMetadata``, ``ChunkStorageMetadata``, ``TensorProperties``,
``BytesStorageMetadata``, ``MetadataIndex``, ``StorageMeta``) and
``torch.distributed.checkpoint.filesystem._StorageInfo``. They are what
:mod:`.metadata` builds from a ``.metadata`` pickle without importing anything, and what
it writes back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...core.dtypes import DType
from .constants import (  # noqa: F401 - re-exported
    HF_SUFFIX,
    METADATA_NAME,
    is_hf_dir,
    is_metadata_name,  # noqa: F401 - re-exported
)

__all__ = [
    "METADATA_NAME",
    "DISTCP_SUFFIX",
    "METADATA_MODULE",
    "FILESYSTEM_MODULE",
    "CLASSES",
    "FIELDS",
    "STORAGE_INFO_NAME",
    "is_metadata_name",
    "storage_info_location",
    "CURRENT_DCP_VERSION",
    "MEM_FORMATS",
    "TensorProperties",
    "ChunkStorageMetadata",
    "TensorStorageMetadata",
    "BytesStorageMetadata",
    "MetadataIndex",
    "StorageInfo",
    "StorageMeta",
    "Metadata",
    "chunk_nbytes",
    "numel",
]

CURRENT_DCP_VERSION = "1.0.0"
DISTCP_SUFFIX = ".distcp"
#: ``_MEM_FORMAT_ENCODING`` values -> memory format names
MEM_FORMATS = {0: "contiguous_format", 1: "channels_last", 2: "preserve_format"}

#: where torch defines the classes of a ``.metadata`` pickle
METADATA_MODULE = "torch.distributed.checkpoint.metadata"
FILESYSTEM_MODULE = "torch.distributed.checkpoint.filesystem"
#: ``FileSystemReader``'s byte-range record (``storage_data`` values)
STORAGE_INFO_NAME = "_StorageInfo"
#: DCP class qualname -> the dataclass of this module that mirrors it
CLASSES = {
    f"{METADATA_MODULE}.Metadata": "Metadata",
    f"{METADATA_MODULE}.TensorStorageMetadata": "TensorStorageMetadata",
    f"{METADATA_MODULE}.BytesStorageMetadata": "BytesStorageMetadata",
    f"{METADATA_MODULE}.ChunkStorageMetadata": "ChunkStorageMetadata",
    f"{METADATA_MODULE}.TensorProperties": "TensorProperties",
    f"{METADATA_MODULE}.MetadataIndex": "MetadataIndex",
    f"{METADATA_MODULE}.StorageMeta": "StorageMeta",
    f"{FILESYSTEM_MODULE}.{STORAGE_INFO_NAME}": "StorageInfo",
}
#: the fields each class's pickled state may hold (its dataclass fields)
FIELDS = {
    "Metadata": frozenset({"state_dict_metadata", "planner_data", "storage_data", "storage_meta", "version"}),
    "StorageInfo": frozenset({"relative_path", "offset", "length", "transform_descriptors"}),
    "ChunkStorageMetadata": frozenset({"offsets", "sizes"}),
    "TensorStorageMetadata": frozenset({"properties", "size", "chunks"}),
    "MetadataIndex": frozenset({"fqn", "offset", "index"}),
}


def storage_info_location(state: Any) -> tuple[str, int, int] | None:
    """``(relative_path, offset, length)`` of a ``_StorageInfo``'s pickled state (a dict),
    or None when those fields are missing or malformed. ``FileSystemReader`` reads
    ``[offset, offset + length)`` of ``<checkpoint>/<relative_path>``."""
    if not isinstance(state, dict):
        return None
    rp, off, ln = state.get("relative_path"), state.get("offset"), state.get("length")
    if not isinstance(rp, str) or type(off) is not int or type(ln) is not int or off < 0 or ln < 0:
        return None
    return rp, off, ln


def numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


@dataclass(slots=True)
class TensorProperties:
    """dtype (+ deprecated layout/requires_grad/memory_format/pin_memory)."""

    dtype: DType
    layout: str = "strided"
    requires_grad: bool = False
    memory_format: str = "contiguous_format"
    pin_memory: bool = False


@dataclass(frozen=True, slots=True)
class ChunkStorageMetadata:
    """One saved chunk: where it sits in the global tensor and its extent."""

    offsets: tuple[int, ...]
    sizes: tuple[int, ...]


@dataclass(slots=True)
class TensorStorageMetadata:
    properties: TensorProperties
    size: tuple[int, ...]
    chunks: list[ChunkStorageMetadata]

    @property
    def dtype(self) -> DType:
        return self.properties.dtype

    @property
    def nbytes(self) -> int:
        return numel(self.size) * self.properties.dtype.itemsize


@dataclass
class BytesStorageMetadata:
    """A non-tensor value, stored as a ``torch.save`` stream."""


StorageMetadata = TensorStorageMetadata | BytesStorageMetadata


@dataclass(frozen=True, slots=True)
class MetadataIndex:
    """Key of ``storage_data``: fqn + chunk offsets (None for bytes). ``index`` is a hint
    excluded from equality, as in torch."""

    fqn: str
    offset: tuple[int, ...] | None = None
    index: int | None = field(default=None, compare=False, hash=False)


@dataclass(slots=True)
class StorageInfo:
    """``_StorageInfo``: the byte range of one item in one ``.distcp`` file."""

    relative_path: str
    offset: int
    length: int
    transform_descriptors: tuple[str, ...] | None = None


@dataclass
class StorageMeta:
    checkpoint_id: Any = None
    save_id: str | None = None
    load_id: str | None = None
    modules: list[str] = field(default_factory=list)


@dataclass
class Metadata:
    state_dict_metadata: dict[str, StorageMetadata]
    planner_data: Any = None
    storage_data: Any = None
    storage_meta: StorageMeta | None = None
    version: str | None = None


def chunk_nbytes(tmd: TensorStorageMetadata, chunk: ChunkStorageMetadata) -> int:
    return numel(chunk.sizes) * tmd.properties.dtype.itemsize
