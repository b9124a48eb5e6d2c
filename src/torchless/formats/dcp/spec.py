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
from .constants import HF_SUFFIX, METADATA_NAME, is_hf_dir  # noqa: F401 - re-exported

__all__ = [
    "METADATA_NAME",
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


def numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


@dataclass
class TensorProperties:
    """dtype (+ deprecated layout/requires_grad/memory_format/pin_memory)."""

    dtype: DType
    layout: str = "strided"
    requires_grad: bool = False
    memory_format: str = "contiguous_format"
    pin_memory: bool = False


@dataclass(frozen=True)
class ChunkStorageMetadata:
    """One saved chunk: where it sits in the global tensor and its extent."""

    offsets: tuple[int, ...]
    sizes: tuple[int, ...]


@dataclass
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


@dataclass(frozen=True)
class MetadataIndex:
    """Key of ``storage_data``: fqn + chunk offsets (None for bytes). ``index`` is a hint
    excluded from equality, as in torch."""

    fqn: str
    offset: tuple[int, ...] | None = None
    index: int | None = field(default=None, compare=False, hash=False)


@dataclass
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
