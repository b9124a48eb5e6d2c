"""Reading a DCP directory: metadata, chunk payloads, full tensors assembled lazily.

Every chunk in a ``.distcp`` file is a complete ``torch.save`` zip at a recorded offset
(spec ``dcp.md`` §3). Its small structures (zip directory, ``data.pkl``) are read through
a memory map; its payload is read with ``os.preadv`` straight into the buffer of the
tensor being assembled, so the pages of a multi-gigabyte checkpoint never pile up in
the process: peak memory is about one tensor.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...core.errors import (
    FormatError,
    UnsupportedError,
)
from ...core.tensor import Storage
from ...io.source import ByteSource
from ...io.source import pread_into as _pread_into
from ..safetensors_spec import is_safetensors_head
from .spec import ChunkStorageMetadata, StorageInfo

__all__ = ["ChunkRef", "unflatten", "pread_into", "BlockStorage"]

#: bytes read per pread when a chunk must go through a bounce buffer
BOUNCE = 64 << 20


def pread_into(fd: int | ByteSource, mv: memoryview, offset: int, *, path: Any = None) -> None:
    """Fill ``mv`` from ``fd`` at ``offset``; a short file raises TruncatedError."""
    mv = mv.cast("B") if mv.format != "B" or mv.ndim != 1 else mv
    if not isinstance(fd, int):  # a remote file (RemoteSource): one ranged read
        mv[:] = fd.read_at(offset, len(mv), what="chunk")
        return
    _pread_into(fd, mv, offset, path=path, short="file ends inside a chunk")


class BlockStorage(Storage):
    """A storage whose bytes are assembled on every access and never cached.

    Keeping assembled tensors alive would make memory grow with the checkpoint; callers
    that want to keep the values keep the array ``numpy()`` returns.
    """

    __slots__ = ()

    def bytes(self) -> memoryview:  # noqa: D102
        if self._loader is None:
            raise UnsupportedError(f"storage {self.key!r} has no data")
        data = memoryview(self._loader()).cast("B")
        if len(data) != self.nbytes:
            raise FormatError(f"assembled {self.key!r} has the wrong size", expected=self.nbytes, found=len(data))
        return data


@dataclass(slots=True)
class ChunkRef:
    """One saved chunk and where its payload lies (slots: one per chunk, tens of
    thousands in a checkpoint of many small tensors)."""

    fqn: str
    chunk: ChunkStorageMetadata
    info: StorageInfo
    index: int
    # filled by DCPReader.locate
    data_offset: int = -1  # absolute offset of the first element in the file
    stride: tuple[int, ...] = ()
    storage_nbytes: int = 0
    byteorder: str = "little"
    #: the CRC-32 the item's zip directory gives for its storage record, where the chunk
    #: starts at that record's first byte (``storage_nbytes`` is then the record's size);
    #: None where unknown (set by :meth:`DCPReader.locate_many` only)
    record_crc: int | None = None

    @property
    def contiguous(self) -> bool:
        exp = 1
        for size, st in zip(reversed(self.chunk.sizes), reversed(self.stride), strict=False):
            if size != 1 and st != exp:
                return False
            exp *= size
        return True


#: DCP's ``SerializationFormat.SAFETENSORS`` items: a safetensors blob, not a torch.save zip
is_safetensors_blob = is_safetensors_head


def unflatten(flat: dict[str, Any], planner_data: Any) -> dict[str, Any]:
    """Rebuild the nested state dict from flattened keys and the planner's key paths
    (what torch's ``_EmptyStateDictLoadPlanner`` does); keys without a path stay flat."""
    out: dict[str, Any] = {}
    paths = planner_data if isinstance(planner_data, dict) else {}
    for key, value in flat.items():
        path = paths.get(key)
        if (
            not isinstance(path, tuple)
            or not path
            or not all(isinstance(p, (str, int)) for p in path)
            or not isinstance(path[0], str)
        ):
            out[key] = value
            continue
        cur: Any = out
        for i, p in enumerate(path[:-1]):
            nxt = path[i + 1]
            if isinstance(cur, dict):
                if p not in cur:
                    cur[p] = [] if isinstance(nxt, int) else {}
                cur = cur[p]
            else:
                assert isinstance(p, int)
                while len(cur) <= p:
                    cur.append(None)
                if cur[p] is None:
                    cur[p] = [] if isinstance(nxt, int) else {}
                cur = cur[p]
            if isinstance(cur, list) != isinstance(nxt, int):
                raise FormatError("planner_data paths disagree about a container type", member=key)
        last = path[-1]
        if isinstance(cur, dict):
            cur[last] = value
        else:
            while len(cur) <= last:
                cur.append(None)
            cur[last] = value
    return out
