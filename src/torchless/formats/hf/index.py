"""A Hugging Face shard set's index, and writing a set of shards with it atomically.

The index is ``{"metadata": {"total_size": n}, "weight_map": {tensor: shard}}`` (indented
by 2, as ``save_pretrained`` writes it): :func:`index_bytes` is its one encoding, used by
the one-process writers (:func:`shard_set`) and by the range-task writer
(:mod:`torchless.formats.hf.ranged`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager

from ...io.atomic import AtomicFile, publish

__all__ = ["index_bytes", "shard_set"]


def index_bytes(total_size: int, weight_map: dict[str, str]) -> bytes:
    """The index file of a shard set holding ``total_size`` bytes of tensors."""
    return json.dumps({"metadata": {"total_size": total_size}, "weight_map": weight_map}, indent=2).encode("utf-8")


@contextmanager
def shard_set(folder: str, index_name: str, total_size: int) -> Iterator[tuple[list[AtomicFile], dict[str, str]]]:
    """Write a set of shards and its Hugging Face-style index atomically.

    Yields ``(pending, weight_map)``: the caller appends an :class:`AtomicFile` per shard
    to ``pending`` and fills ``weight_map`` (tensor name -> shard file). On success the
    index ``{"metadata": {"total_size": ...}, "weight_map": ...}`` is written last and
    everything is published together (:func:`~torchless.io.atomic.publish`); on any failure every temporary
    is removed and no index appears at the destination (nor, at a URL, any shard).
    """
    pending: list[AtomicFile] = []
    weight_map: dict[str, str] = {}
    try:
        yield pending, weight_map
        idx = AtomicFile(os.path.join(folder, index_name))
        pending.append(idx)
        idx.file.write(index_bytes(total_size, weight_map))
    except BaseException:
        for af in pending:
            af.abort()
        raise
    publish(pending)
