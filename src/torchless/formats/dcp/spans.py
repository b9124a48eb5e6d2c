"""Byte spans of located DCP chunks: the copy of a chunk's overlap with a block into the
block (:func:`copy_chunk`), and the views of whole tensors in a file's map that a
consolidation writes from (:func:`direct_spans`, :func:`view_spans`). Functions of a
:class:`~.reader.DCPReader` (typed ``Any``: the reader imports this module), whose maps
and file handles they use.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...io.crc import crc32_spans
from .read import (
    BOUNCE,
    ChunkRef,
    pread_into,
)
from .spec import TensorStorageMetadata, numel

__all__ = ["copy_chunk", "direct_spans", "view_spans"]


def copy_chunk(
    reader: Any,
    ref: ChunkRef,
    isz: int,
    lo: list[int],
    hi: list[int],
    boff: tuple[int, ...],
    bsize: tuple[int, ...],
    dst: np.ndarray,
    flat: np.ndarray,
) -> None:
    c = ref.chunk
    fd = reader._fd(ref.info.relative_path)
    path = reader._shown(ref.info.relative_path)
    nd = len(c.sizes)
    if nd == 0:
        pread_into(fd, flat.data, ref.data_offset, path=path)
        return
    if not ref.contiguous:
        # rare: a strided chunk (torch keeps views' strides when the storage is compact)
        buf = np.empty(ref.storage_nbytes, dtype=np.uint8)
        pread_into(fd, buf.data, ref.data_offset, path=path)
        src = np.lib.stride_tricks.as_strided(
            buf, shape=tuple(c.sizes) + (isz,), strides=tuple(s * isz for s in ref.stride) + (1,), writeable=False
        )
        sl = tuple(slice(l - o, h - o) for l, h, o in zip(lo, hi, c.offsets, strict=False))
        dl = tuple(slice(l - o, h - o) for l, h, o in zip(lo, hi, boff, strict=False))
        dst[dl] = src[sl]
        return
    # rows of the chunk along dim 0 are contiguous runs of `row` bytes
    row = numel(c.sizes[1:]) * isz
    r0, r1 = lo[0] - c.offsets[0], hi[0] - c.offsets[0]
    inner_full_chunk = all(l == o and h == o + s for l, h, o, s in zip(lo[1:], hi[1:], c.offsets[1:], c.sizes[1:], strict=False))
    inner_full_block = all(l == o and h == o + s for l, h, o, s in zip(lo[1:], hi[1:], boff[1:], bsize[1:], strict=False))
    if inner_full_chunk and inner_full_block:
        start = (lo[0] - boff[0]) * row
        pread_into(fd, flat.data[start : start + (r1 - r0) * row], ref.data_offset + r0 * row, path=path)
        return
    rows_per = max(1, BOUNCE // max(row, 1))
    inner_src = tuple(slice(l - o, h - o) for l, h, o in zip(lo[1:], hi[1:], c.offsets[1:], strict=False))
    inner_dst = tuple(slice(l - o, h - o) for l, h, o in zip(lo[1:], hi[1:], boff[1:], strict=False))
    bounce = np.empty(min(rows_per, r1 - r0) * row, dtype=np.uint8)
    for a in range(r0, r1, rows_per):
        b = min(a + rows_per, r1)
        part = bounce[: (b - a) * row]
        pread_into(fd, part.data, ref.data_offset + a * row, path=path)
        src = part.reshape((b - a,) + tuple(c.sizes[1:]) + (isz,))
        d0 = a + c.offsets[0] - boff[0]
        dst[(slice(d0, d0 + b - a),) + inner_dst] = src[(slice(None),) + inner_src]


def direct_spans(
    reader: Any, items: list[tuple[str, TensorStorageMetadata, int, tuple[int, ...]]]
) -> list[tuple[str, int, int, int, tuple[int, int] | None] | None]:
    """For each ``(fqn, tmd, nbytes, strides)`` of ``items`` (a located tensor, its
    metadata, byte count and contiguous strides), where its bytes lie whole in a file's
    map, as ``(file, offset, item start, item end, known)``; None where they must be
    assembled or read (not one contiguous chunk of the whole tensor, empty, not
    mapped). ``known`` is ``(CRC-32, nbytes)``, the CRC-32 the item's zip directory
    gives for its storage record, when the bytes are that whole record
    (:attr:`ChunkRef.record_crc`), else None. One loop for every tensor a
    consolidation writes."""
    if reader.remote:
        return [None] * len(items)
    chunks = reader._chunks
    sizes: dict[str, int | None] = {}  # file -> the size of its map (None: not mapped)
    out: list[tuple[str, int, int, int, tuple[int, int] | None] | None] = []
    for fqn, tmd, nbytes, strides in items:
        refs = chunks.get(fqn)
        if refs is None or len(refs) != 1:
            out.append(None)
            continue
        ref = refs[0]
        off = ref.data_offset
        chunk = ref.chunk
        if not nbytes or off < 0 or chunk.sizes != tmd.size or any(chunk.offsets):
            out.append(None)
            continue
        if ref.stride != strides and not ref.contiguous:
            out.append(None)
            continue
        info = ref.info
        rel = info.relative_path
        if rel in sizes:
            size = sizes[rel]
        else:
            f = reader._maps.get(rel)
            size = sizes[rel] = None if f is None or getattr(f, "_map", None) is None else f.size
        if size is None or off + nbytes > size:
            out.append(None)
            continue
        crc = ref.record_crc
        known = None if crc is None or ref.storage_nbytes != nbytes else (crc, nbytes)
        out.append((rel, off, info.offset, info.offset + info.length, known))
    return out


def view_spans(
    reader: Any,
    spans: list[tuple[str, int, int, int, tuple[int, int] | None] | None],
    sizes: list[int],
    crcs: list[int | None] | None = None,
) -> list[memoryview | None]:
    """The views of :func:`direct_spans` results (``sizes`` bytes each; None stays
    None); the previous call's items are released (their pages dropped from this
    process). ``crcs``: a list that receives the CRC-32 of each view (None for None):
    the span's known one (its item's zip directory's, for a view that is a whole
    storage record of the item) or computed from the map with one address look-up
    (:func:`~torchless.io.crc.crc32_spans`)."""
    prev = reader.__dict__.pop("_viewed_spans", None)
    if prev:  # runs of items that follow each other in a file, each in one step
        rel, start, end = prev[0][0], prev[0][2], prev[0][3]
        for sp in prev[1:]:
            if sp[0] == rel and sp[2] == end:
                end = sp[3]
                continue
            reader._release_range(rel, start, end)
            rel, start, end = sp[0], sp[2], sp[3]
        reader._release_range(rel, start, end)
    out: list[memoryview | None] = []
    used = []
    bufs: dict[str, memoryview | None] = {}
    at: dict[str, tuple[list[int], list[int], list[int]]] = {}  # per file: indices, offsets, sizes
    for j, (sp, n) in enumerate(zip(spans, sizes, strict=True)):
        if sp is None:
            out.append(None)
            continue
        rel = sp[0]
        mv = bufs.get(rel)
        if mv is None:
            f = reader._maps.get(rel)
            if f is None or getattr(f, "_map", None) is None or reader._closed:
                out.append(None)
                continue
            mv = bufs[rel] = f.view(0, f.size)
            at[rel] = ([], [], [])
        off = sp[1]
        out.append(mv[off : off + n])
        used.append(sp)
        known = sp[4]
        if crcs is not None and (known is None or known[1] != n):
            idx, offs, ns = at[rel]
            idx.append(j)
            offs.append(off)
            ns.append(n)
    reader.__dict__["_viewed_spans"] = used
    if crcs is not None:
        # the directory's CRC-32 of a view that is a whole storage record of its item
        crcs.extend(
            [
                None if v is None or sp is None or sp[4] is None or sp[4][1] != len(v) else sp[4][0]
                for v, sp in zip(out, spans, strict=True)
            ]
        )
        for rel, (idx, offs, ns) in at.items():
            buf = bufs[rel]
            assert buf is not None
            for j, c in zip(idx, crc32_spans(buf, offs, ns), strict=True):
                crcs[j] = c
    return out
