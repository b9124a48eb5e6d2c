"""Range planning: an output laid out in full before any byte is read, then cut into tasks.

An output (a DCP folder of rank files, a set of safetensors shards) is laid out by the
coordinator before any byte is read: every output file is a list of :class:`Piece`
objects at known offsets (literal header bytes, a byte range copied from a source file,
rows of a tensor block, one whole item written by the job's item writer). The file's
byte range is then cut into :class:`RangeTask` objects of at most ``max_task_bytes``
each (:func:`segments`), run by :mod:`torchless.jobs.tasks` and coordinated by
:func:`torchless.jobs.outputs.write_outputs`; :func:`fingerprint` names a layout so that a
resumed job recognises its own staging.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Piece", "OutputFile", "RangeTask", "split_rows", "segments", "fingerprint", "MIN_TASK_BYTES"]

#: the smallest ``max_task_bytes`` accepted (a task always holds a whole small piece)
MIN_TASK_BYTES = 1 << 20


@dataclass
class Piece:
    """``length`` bytes at ``offset`` of an output file.

    ``kind``: ``"bytes"`` (``data``), ``"copy"`` (``length`` bytes of file ``src`` at
    ``src_offset``; ``remote``: ``src`` is a URL's object, as its planner's store said),
    ``"rows"`` (the C-order bytes of block ``offsets``/``sizes`` of tensor
    ``fqn`` of checkpoint ``src``: a row range of a larger block when split), ``"ptitem"``
    (the block written whole by the task's ``item_writer``: one ``torch.save`` stream),
    ``"seal"`` (the tail of an item split over tasks, a ``torch.save`` item's: filled in
    by the job's ``seal`` once its payload's CRC-32 is known).
    """

    offset: int
    length: int
    kind: str
    data: bytes = b""
    src: str = ""
    src_offset: int = 0
    fqn: str = ""
    offsets: tuple[int, ...] = ()
    sizes: tuple[int, ...] = ()
    dtype: str = ""
    item: int = -1  # a split item's number: its payload rows' CRCs are joined by item
    remote: bool = False  # a "copy" piece's ``src`` is read by ranges (its source's store is remote)

    def key(self) -> tuple:
        return (self.offset, self.length, self.kind, self.src, self.src_offset, self.fqn, self.offsets, self.sizes)


@dataclass
class OutputFile:
    name: str
    size: int
    pieces: list[Piece]


@dataclass
class RangeTask:
    """Write ``[offset, offset + length)`` of output file ``name`` from ``pieces``."""

    name: str
    offset: int
    length: int
    pieces: list[Piece]
    target: str  # the staged file (local) or the part object's URL
    part: bool  # a part object (a URL destination) rather than a pwrite into ``target``
    opener: Any = None  # opens ``rows``/``ptitem`` sources: f(path, weights_only) (module-level: pickled by name)
    weights_only: bool = True
    options: dict[str, Any] = field(default_factory=dict)  # storage options for the worker
    dest: str = ""  # the output file as the user named it (for messages; ``name`` when empty)
    item_writer: Any = None  # writes a ``ptitem`` block: f(block, dtype, sizes, sink) (module-level)


# -- cutting files into tasks -------------------------------------------------------------------
def split_rows(offsets: tuple[int, ...], sizes: tuple[int, ...], itemsize: int, budget: int) -> list[tuple[tuple, tuple]]:
    """Cut block ``offsets``/``sizes`` into row ranges of at most ``budget`` bytes each
    (one row at least); each range is contiguous in the block's C-order bytes."""
    if not sizes or sizes[0] <= 1:
        return [(offsets, sizes)]
    row = itemsize
    for s in sizes[1:]:
        row *= s
    per = max(1, budget // max(row, 1))
    out = []
    for a in range(0, sizes[0], per):
        b = min(sizes[0], a + per)
        out.append(((offsets[0] + a, *offsets[1:]), (b - a, *sizes[1:])))
    return out


def segments(pieces: list[Piece], budget: int | None, min_part: int = 0) -> list[list[Piece]]:
    """Consecutive pieces in task ranges of about ``budget`` bytes (a task holds one piece
    in memory at a time, and no piece is larger than the budget once split); a range is
    closed only once it holds ``min_part`` bytes (S3's smallest multipart part, for parts
    joined server-side); a seal is a range of its own."""
    segs: list[list[Piece]] = []
    cur: list[Piece] = []
    size = 0
    for p in pieces:
        if p.kind == "seal":  # written in the second phase, in a segment of its own
            if cur:
                segs.append(cur)
            segs.append([p])
            cur, size = [], 0
            continue
        if cur and budget is not None and size + p.length > budget and size >= min_part:
            segs.append(cur)
            cur, size = [], 0
        cur.append(p)
        size += p.length
    if cur:
        segs.append(cur)
    return segs


def fingerprint(files: list[OutputFile], extra: Any) -> str:
    h = hashlib.sha256(json.dumps(extra, sort_keys=True, default=str).encode())
    for f in files:
        h.update(json.dumps([f.name, f.size, [list(map(str, p.key())) for p in f.pieces if p.kind != "seal"]]).encode())
    return h.hexdigest()[:32]
