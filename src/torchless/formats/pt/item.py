"""One tensor as a whole ``torch.save`` stream, for range tasks (DCP rank files of the
``torch_save`` format written by :func:`torchless.jobs.outputs.write_outputs`).

* :func:`write_item` - a block written as one ``torch.save`` stream (a ``ptitem``
  piece's item writer);
* :func:`pt_item_template` - the bytes before and after the payload of such a stream,
  computed without the payload: an item larger than a task is written as its header,
  payload rows by several tasks, then its tail (the ``seal``) once the payload's CRC-32
  is known.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...container.zip import LOCAL_SIG
from ...core.errors import InternalError

__all__ = ["write_item", "pt_item_template"]


def write_item(block: np.ndarray, dtype: str, sizes: tuple[int, ...], sink: Any) -> None:
    """Write ``block`` (the C-order bytes of a tensor of ``dtype``/``sizes``) to ``sink`` as
    one ``torch.save`` stream."""
    from ...core.dtypes import by_name
    from ...core.tensor import Storage, Tensor
    from .write import save_checkpoint

    dt = by_name(dtype)
    st = Storage("0", block.nbytes, dt, "cpu", data=block)
    save_checkpoint(Tensor(st, dt, sizes), sink)


class _HeadTail:
    """A write-only sink keeping the first and last 64 KiB of what passes through."""

    KEEP = 1 << 16

    def __init__(self) -> None:
        self.head = bytearray()
        self.tail = bytearray()
        self.n = 0

    def write(self, b: Any) -> int:
        mv = memoryview(b).cast("B")
        n = len(mv)
        if len(self.head) < self.KEEP:
            self.head += mv[: self.KEEP - len(self.head)]
        if n >= self.KEEP:
            self.tail = bytearray(mv[n - self.KEEP :])
        else:
            self.tail += mv
            del self.tail[: max(0, len(self.tail) - self.KEEP)]
        self.n += n
        return n

    def flush(self) -> None:
        pass


def pt_item_template(dtype: str, sizes: tuple[int, ...], crc: int = 0) -> tuple[bytes, int, bytes]:
    """``(header, payload length, tail)`` of the ``torch.save`` stream of one tensor of
    ``dtype``/``sizes`` whose payload has CRC-32 ``crc``: the bytes before and after the
    payload, computed without the payload (a zero-filled buffer that is never touched)."""
    from ...core.dtypes import by_name
    from ...core.tensor import Storage, Tensor
    from ..dcp.spec import numel
    from .write import save_checkpoint

    dt = by_name(dtype)
    n = numel(sizes) * dt.itemsize
    if n < 2 * _HeadTail.KEEP:
        raise InternalError("pt_item_template is for items larger than 128 KiB")
    zeros = np.zeros(n, dtype=np.uint8)  # calloc'd: pages stay unmapped as nothing reads them
    sink = _HeadTail()
    save_checkpoint(Tensor(Storage("0", n, dt, "cpu", data=zeros), dt, sizes), sink, storage_crc=crc)
    head = bytes(sink.head)
    name = b"archive/data/0"
    at = head.find(name)
    if at < 30 or head[at - 30 : at - 26] != LOCAL_SIG:
        raise InternalError("cannot find the payload record in a torch.save template")
    nlen = int.from_bytes(head[at - 4 : at - 2], "little")
    xlen = int.from_bytes(head[at - 2 : at], "little")
    start = at + nlen + xlen
    tail_len = sink.n - start - n
    if tail_len <= 0 or tail_len > _HeadTail.KEEP or start > _HeadTail.KEEP:
        raise InternalError("unexpected torch.save template layout")
    return head[:start], n, bytes(sink.tail[len(sink.tail) - tail_len :])
