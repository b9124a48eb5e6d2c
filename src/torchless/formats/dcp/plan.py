"""Reshard plans on paper: tasks, bytes read and written per task, the critical path.

:func:`plan` turns a source's metadata (a DCP ``.metadata``, one checkpoint file, or a
:func:`synthetic` checkpoint that has metadata and no payload) into the task list that
:func:`~torchless.formats.dcp.reshard.reshard` would run: one task per output rank file,
each with the bytes it writes, the bytes it reads (the parts of the source chunks its items
overlap, the way :meth:`DCPReader.read_block` reads them: whole rows of a chunk) and the
source files and ranged reads it needs. Nothing is read but metadata, so a plan of a
terabyte checkpoint of thousands of ranks takes seconds.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Any

from ...core.dtypes import by_name
from ...core.errors import UsageError
from ...core.sizes import parse_size  # re-exported: the one size parser
from ...io.remote import accepts_storage_options as _remote_opts
from .reshard import Plan, parse_plan, plan_reshard
from .spec import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    StorageInfo,
    TensorProperties,
    TensorStorageMetadata,
    numel,
)

__all__ = ["synthetic", "parse_size", "plan", "MetadataSource", "SYNTHETIC_PREFIX"]

#: ``reshard --plan-only`` source spelling for a synthetic checkpoint: ``synthetic:1TB:1024``
SYNTHETIC_PREFIX = "synthetic:"


def synthetic(total_bytes: int, ranks: int, *, tensors: int = 256, dtype: str = "bfloat16", width: int = 8192) -> Metadata:
    """DCP metadata of a checkpoint of ``total_bytes`` saved by ``ranks`` ranks: ``tensors``
    matrices of ``width`` columns (rows filling the size), each split by rows over the
    ranks as FSDP/TP row sharding saves them, one ``__<rank>_0.distcp`` file per rank. No
    payload exists: the result is for planning.
    """
    if ranks < 1 or tensors < 1 or total_bytes < 1:
        raise UsageError("a synthetic checkpoint needs ranks, tensors and bytes >= 1")
    dt = by_name(dtype)
    rows = max(ranks, total_bytes // (tensors * width * dt.itemsize))
    sdm: dict[str, Any] = {}
    storage: dict[MetadataIndex, StorageInfo] = {}
    pos = [0] * ranks
    step = -(-rows // ranks)
    header = 1024  # a chunk's torch.save zip header, roughly: counted in each item's length
    for t in range(tensors):
        fqn = f"layers.{t}.weight"
        chunks = []
        for r in range(ranks):
            a, b = min(r * step, rows), min(r * step + step, rows)
            if b <= a:
                continue
            c = ChunkStorageMetadata((a, 0), (b - a, width))
            chunks.append(c)
            n = (b - a) * width * dt.itemsize + header
            storage[MetadataIndex(fqn, c.offsets, len(chunks) - 1)] = StorageInfo(f"__{r}_0.distcp", pos[r], n)
            pos[r] += n
        sdm[fqn] = TensorStorageMetadata(TensorProperties(dt), (rows, width), chunks)
    sdm["step"] = BytesStorageMetadata()
    storage[MetadataIndex("step", None, None)] = StorageInfo("__0_0.distcp", pos[0], 512)
    return Metadata(sdm, {k: (k,) for k in sdm}, storage, None, "1.0.0")


class MetadataSource:
    """A checkpoint known by its metadata alone (what planning needs from a source)."""

    def __init__(self, md: Metadata, path: str = "<synthetic>") -> None:
        self.path = path
        self.entries = md.state_dict_metadata
        self.planner_data = md.planner_data
        self._chunks: dict[str, list[tuple[ChunkStorageMetadata, StorageInfo]]] = {}
        by_key = {(k.fqn, k.offset): v for k, v in (md.storage_data or {}).items()}
        for fqn, it in self.entries.items():
            if isinstance(it, TensorStorageMetadata):
                self._chunks[fqn] = [(c, by_key.get((fqn, c.offsets)) or StorageInfo("?", 0, 0)) for c in it.chunks]

    def chunks(self, fqn: str) -> list[tuple[ChunkStorageMetadata, StorageInfo]]:
        return self._chunks.get(fqn, [])

    def close(self) -> None:
        pass


def _source_chunks(source: Any, fqn: str) -> list[tuple[ChunkStorageMetadata, StorageInfo]]:
    if isinstance(source, MetadataSource):
        return source.chunks(fqn)
    reader = getattr(source, "reader", None)
    if reader is not None:  # a DCP directory
        return [(ref.chunk, ref.info) for ref in reader.chunks(fqn)]
    it = source.entries[fqn]  # one file: the whole tensor is one "chunk"
    return [(ChunkStorageMetadata((0,) * len(it.size), tuple(it.size)), StorageInfo(str(source.path), 0, it.nbytes))]


@dataclass
class _Index:
    """Source chunks of one tensor sorted by their first offset, for overlap queries."""

    chunks: list[tuple[ChunkStorageMetadata, StorageInfo]]
    starts: list[int]
    max_len: int


def _index(chunks: list[tuple[ChunkStorageMetadata, StorageInfo]]) -> _Index:
    cs = sorted(chunks, key=lambda c: c[0].offsets[0] if c[0].offsets else 0)
    starts = [c.offsets[0] if c.offsets else 0 for c, _ in cs]
    max_len = max((c.sizes[0] if c.sizes else 1 for c, _ in cs), default=0)
    return _Index(cs, starts, max_len)


@_remote_opts
def plan(source: Any, ranks: int, *, plan: str | Plan | None = None, format: str = "torch_save") -> dict[str, Any]:
    """The reshard plan of ``source`` to ``ranks`` rank files, from metadata alone.

    Args:
        source: a DCP directory, one checkpoint file (paths or URLs), a
            :class:`~.spec.Metadata` (e.g. from :func:`synthetic`) or a
            ``"synthetic:SIZE:RANKS[:TENSORS]"`` string.

    Returns:
        ``{"ranks", "tasks": [{"file", "items", "bytes_written", "bytes_read",
        "source_files", "reads"}], "total_bytes_written", "total_bytes_read",
        "critical_path": {"file", "bytes"}, "balance": max/mean bytes written}``.
        Tasks are independent (each writes its own file), so the critical path is the
        largest task; ``.metadata`` is written after all of them.
    """
    from .reshard import open_source_checkpoint

    p = plan if isinstance(plan, Plan) else parse_plan(plan)
    own = False
    if isinstance(source, Metadata):
        src: Any = MetadataSource(source)
    elif isinstance(source, str) and source.startswith(SYNTHETIC_PREFIX):
        parts = source[len(SYNTHETIC_PREFIX) :].split(":")
        if len(parts) not in (2, 3):
            raise UsageError("cannot read this synthetic checkpoint", found=source, expected="synthetic:SIZE:RANKS[:TENSORS]")
        try:
            n_ranks, n_tensors = int(parts[1]), int(parts[2]) if len(parts) == 3 else 256
        except ValueError:
            raise UsageError(
                "cannot read this synthetic checkpoint", found=source, expected="synthetic:SIZE:RANKS[:TENSORS]"
            ) from None
        src = MetadataSource(synthetic(parse_size(parts[0]), n_ranks, tensors=n_tensors), path=source)
    else:
        src, own = open_source_checkpoint(source), True
    try:
        tasks, _md = plan_reshard(src, "<plan>", ranks, p, format=format)
        indexes: dict[str, _Index] = {}
        out: list[dict[str, Any]] = []
        for t in tasks:
            written = read = reads = 0
            files: set[str] = set()
            for it in t.items:
                ent = src.entries[it.fqn]
                if it.offsets is None:
                    info = _bytes_info(src, it.fqn)
                    written += info
                    read += info
                    reads += 1
                    continue
                assert it.sizes is not None
                isz = ent.dtype.itemsize
                written += numel(it.sizes) * isz
                idx = indexes.get(it.fqn)
                if idx is None:
                    idx = indexes[it.fqn] = _index(_source_chunks(src, it.fqn))
                r, n, fs = _overlap(idx, it.offsets, it.sizes, isz)
                read += r
                reads += n
                files |= fs
            out.append(
                {
                    "file": t.name,
                    "items": len(t.items),
                    "bytes_written": written,
                    "bytes_read": read,
                    "source_files": len(files),
                    "reads": reads,
                }
            )
    finally:
        if own:
            src.close()
    sizes = [x["bytes_written"] for x in out]
    mean = sum(sizes) / len(sizes) if sizes else 0
    crit = max(out, key=lambda x: x["bytes_read"] + x["bytes_written"]) if out else None
    return {
        "source": str(getattr(src, "path", source)),
        "ranks": ranks,
        "tasks": out,
        "total_bytes_written": sum(sizes),
        "total_bytes_read": sum(x["bytes_read"] for x in out),
        "critical_path": None if crit is None else {"file": crit["file"], "bytes": crit["bytes_read"] + crit["bytes_written"]},
        "balance": (max(sizes) / mean) if mean else 1.0,
    }


def _bytes_info(src: Any, fqn: str) -> int:
    reader = getattr(src, "reader", None)
    if reader is not None:
        info = reader._by_key.get((fqn, None))
        return info.length if info is not None else 0
    return 1024  # a value of one file or a synthetic source: a small pickle


def _overlap(idx: _Index, offsets: tuple[int, ...], sizes: tuple[int, ...], isz: int) -> tuple[int, int, set[str]]:
    """(bytes read, ranged reads, source files) to assemble the block ``offsets``/``sizes``:
    for each overlapping source chunk, the rows of the chunk the block spans (a chunk's
    rows are contiguous on disk; the reader fetches whole rows)."""
    if not sizes:  # a 0-d tensor: its one chunk
        c, info = idx.chunks[0]
        return isz, 1, {info.relative_path}
    lo, hi = offsets[0], offsets[0] + sizes[0]
    # chunks starting before ``hi`` and ending after ``lo`` (their first dim lengths are
    # at most max_len, so the search starts max_len before ``lo``)
    i = bisect.bisect_left(idx.starts, lo - idx.max_len)
    j = bisect.bisect_left(idx.starts, hi)
    read = n = 0
    files: set[str] = set()
    for c, info in idx.chunks[i:j]:
        a, b = max(lo, c.offsets[0]), min(hi, c.offsets[0] + c.sizes[0])
        if b <= a:
            continue
        inner_ok = True
        for d in range(1, len(sizes)):
            if min(offsets[d] + sizes[d], c.offsets[d] + c.sizes[d]) <= max(offsets[d], c.offsets[d]):
                inner_ok = False
                break
        if not inner_ok:
            continue
        read += (b - a) * numel(tuple(c.sizes[1:])) * isz
        n += 1
        files.add(info.relative_path)
    return read, n, files
