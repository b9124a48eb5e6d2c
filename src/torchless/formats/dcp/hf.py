"""DCP's Hugging Face safetensors flavour (spec ``dcp.md`` §6).

``HuggingFaceStorageWriter(save_distributed=True)`` leaves one real safetensors file per
rank, ``shard-<rank+1>-model-00001-of-00001.safetensors``, whose ``__metadata__`` carries
``DCP_SHARDING_INFO`` (JSON: ``{fqn: {"saved_offsets": [...]}}``, the chunk's place in
the global tensor) and ``DCP_VERSION``. ``HuggingFaceStorageReader`` reads every
``*.safetensors`` file in a directory (plain Hugging Face checkpoints too: no sharding
info means offsets 0) and takes each tensor's global size as the largest
``offset + shape`` per dimension. :class:`HFReader` does the same without torch and then
behaves like :class:`~.reader.DCPReader` (assembled tensors, blocks, layout).
"""

from __future__ import annotations

import os
from typing import Any

from ...core import jsonsafe
from ...core.errors import FormatError, NotFoundError, short_repr
from ...io.source import MmapSource
from ..safetensors import read_safetensors
from .constants import SAVED_OFFSETS, SHARDING_KEY, store_of
from .read import ChunkRef
from .reader import DCPReader
from .spec import (
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    StorageInfo,
    TensorProperties,
    TensorStorageMetadata,
    is_hf_dir,  # noqa: F401 - re-exported
)

__all__ = ["HFReader", "hf_file_name", "is_hf_dir"]

SUFFIX = ".safetensors"


def hf_file_name(rank: int, index: int = 1, count: int = 1) -> str:
    """torch's per-rank shard name (``shard-00001-model-00001-of-00001.safetensors``)."""
    return f"shard-{rank + 1:05d}-model-{index:05d}-of-{count:05d}{SUFFIX}"


def _contiguous(sizes: tuple[int, ...]) -> tuple[int, ...]:
    out = []
    acc = 1
    for s in reversed(sizes):
        out.append(acc)
        acc *= max(s, 1)
    return tuple(reversed(out))


class HFReader(DCPReader):
    """A directory of (sharded) safetensors files read as one DCP checkpoint."""

    def __init__(self, path: Any, *, store: Any = None) -> None:  # noqa: D107 - parent's contract
        self.path = os.fspath(path)
        self.store = store_of(self.path, store)
        self.remote = self.store.remote  # a folder at a URL: listed, then read by ranges
        if not is_hf_dir(self.path, self.store):
            raise NotFoundError("no .safetensors files in the directory", path=self.path)
        self._fds = {}
        self._blobs = {}
        self._maps = {}
        sdm: dict[str, Any] = {}
        storage: dict[MetadataIndex, StorageInfo] = {}
        self._chunks = {}
        names = self.store.list(self.path)
        for name in sorted(n for n in names if n.endswith(SUFFIX)):
            fp = self.store.join(self.path, name)
            if self.remote:  # the header only (by ranges); the source serves the payload reads later
                meta, tensors, _n = read_safetensors(self._file(name))
            else:
                src = MmapSource(self.real_path(name))
                try:
                    meta, tensors, _n = read_safetensors(src)
                finally:
                    src.close()
            info: dict[str, Any] = {}
            if SHARDING_KEY in meta:
                info = jsonsafe.loads(meta[SHARDING_KEY], what=SHARDING_KEY, path=fp)
                if not isinstance(info, dict):
                    raise FormatError(f"{SHARDING_KEY} must be a JSON object", path=fp)
            for fqn, t in tensors.items():
                shape = tuple(t.shape)
                ent = info.get(fqn)
                offs = ent.get(SAVED_OFFSETS) if isinstance(ent, dict) else None
                if offs is None:
                    offs = [0] * len(shape)
                if not isinstance(offs, list) or len(offs) != len(shape) or not all(type(o) is int and o >= 0 for o in offs):
                    raise FormatError("bad saved_offsets", path=fp, member=fqn, found=short_repr(offs, 60))
                c = ChunkStorageMetadata(tuple(offs), shape)
                prev = sdm.get(fqn)
                if prev is None:
                    sdm[fqn] = TensorStorageMetadata(
                        TensorProperties(t.dtype), tuple(o + s for o, s in zip(offs, shape, strict=False)), [c]
                    )
                else:
                    if prev.dtype.name != t.dtype.name or len(prev.size) != len(shape):
                        raise FormatError("shards of one tensor disagree on dtype or rank", path=fp, member=fqn)
                    prev.chunks.append(c)
                    prev.size = tuple(max(g, o + s) for g, o, s in zip(prev.size, offs, shape, strict=False))
                assert t.storage is not None and t.storage.file_offset is not None
                si = StorageInfo(name, t.storage.file_offset, t.nbytes)
                key = MetadataIndex(fqn, c.offsets, len(sdm[fqn].chunks) - 1)
                if key in storage:
                    raise FormatError("two shards claim the same chunk", path=fp, member=fqn, found=list(c.offsets))
                storage[key] = si
                ref = ChunkRef(
                    fqn, c, si, key.index or 0, data_offset=si.offset, stride=_contiguous(shape), storage_nbytes=si.length
                )
                self._chunks.setdefault(fqn, []).append(ref)
        self.metadata = Metadata(sdm, None, storage, None, None)
        self._by_key = {(k.fqn, k.offset): v for k, v in storage.items()}
        self.flavour = "hf"
