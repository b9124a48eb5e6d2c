"""Hugging Face safetensors shards (and their index) written by range tasks on any
executor (``consolidate`` and ``convert`` with ``executor``/``max_task_bytes``/``resume``):
:func:`write_shards` lays the shards out as
:func:`~torchless.formats.safetensors.write_safetensors_sharded` does and hands them to
:func:`torchless.jobs.outputs.write_outputs`; the tasks read the source's tensors through
:func:`open_blocks`. :func:`cleanup` is the public cleanup of every range job (DCP folders
and shard sets: the shards' names are this format's, :func:`abort_shard_uploads`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import numpy as np

from ...io import remote
from ...io.store import resolve
from ...jobs.outputs import write_outputs
from ...jobs.plan import OutputFile, Piece, split_rows
from ...jobs.staging import LocalFilesStaging, RemoteStaging
from ...jobs.staging import cleanup as _cleanup
from ...jobs.tasks import close_sources
from .index import index_bytes
from .spec import INDEX_SUFFIX, shard_name

__all__ = ["write_shards", "open_blocks", "cleanup", "abort_shard_uploads"]


class _TensorSource:
    """Blocks of the tensors of any checkpoint (a DCP folder through its reader, any
    other file through its artifact), by the names ``tensors()`` gives."""

    def __init__(self, path: str) -> None:
        from ..dispatch import open_artifact

        store, p = resolve(path)  # a task's source, arriving in its worker: resolved once here
        if store.isdir(p):
            from ..dcp.readers import open_reader

            self.reader: Any = open_reader(p, store)
            self.art = None
            return
        self.reader = None
        self.art = open_artifact(p, weights_only=False)
        self.tensors = dict(self.art.tensors())

    def read_block(self, fqn: str, offsets: tuple[int, ...], sizes: tuple[int, ...]) -> np.ndarray:
        if self.reader is not None:
            return self.reader.read_block(fqn, offsets, sizes)
        arr = self.tensors[fqn].numpy(raw=True)
        block = np.ascontiguousarray(arr[tuple(slice(o, o + s) for o, s in zip(offsets, sizes, strict=False))])
        if block.dtype.byteorder == ">":
            block = block.astype(block.dtype.newbyteorder("<"))
        return block.reshape(-1).view(np.uint8)

    def close(self) -> None:
        if self.reader is not None:
            self.reader.close()
        if self.art is not None:
            self.art.close()


def open_blocks(path: str, weights_only: bool = True) -> _TensorSource:
    """The range tasks' opener: the tensors of any checkpoint at ``path`` (its artifact is
    opened with ``weights_only=False``, whatever ``weights_only`` says, as before)."""
    return _TensorSource(path)


def write_shards(
    src: str,
    entries: list[tuple[str, Any, tuple[int, ...], int]],
    dst: Any,
    *,
    max_shard_size: Any = None,
    metadata: dict[str, str] | None = None,
    executor: Any = None,
    max_task_bytes: int | None = None,
    resume: bool = False,
    progress: Callable[[int], None] | None = None,
) -> list[str]:
    """Write the tensors ``entries`` (``(name, dtype, shape, nbytes)``) of checkpoint
    ``src`` as safetensors at ``dst`` (Hugging Face shards + index with
    ``max_shard_size``, laid out as :func:`~torchless.formats.safetensors.write_safetensors_sharded`
    does), by range tasks on ``executor``. Returns the files written, the index last."""
    from ...jobs.executor import parse_executor
    from ..safetensors import parse_size, safetensors_header

    store, d = resolve(os.fspath(dst))
    url = store.remote  # asked once: the answer is passed down
    groups: list[list[tuple[str, Any, tuple[int, ...], int]]] = [[]]
    size = total = 0
    limit = parse_size(max_shard_size) if max_shard_size else None
    for e in entries:
        if groups[-1] and limit is not None and size + e[3] > limit:
            groups.append([])
            size = 0
        groups[-1].append(e)
        size += e[3]
        total += e[3]
    base = remote.basename(d) if url else os.path.basename(d)
    stem = base[: -len(".safetensors")] if base.endswith(".safetensors") else base
    n = len(groups)
    names = [base] if n == 1 else [shard_name(stem, i + 1, n, ".safetensors") for i in range(n)]
    files: list[OutputFile] = []
    weight_map: dict[str, str] = {}
    for fname, group in zip(names, groups, strict=False):
        hdr = safetensors_header(group, metadata)
        pieces = [Piece(0, len(hdr), "bytes", data=hdr)]
        pos = len(hdr)
        for name, dt, shape, _nb in group:
            zero = (0,) * len(shape)
            cuts = split_rows(zero, tuple(shape), dt.itemsize, max_task_bytes) if max_task_bytes else [(zero, tuple(shape))]
            for offs, sizes in cuts:
                m = dt.itemsize
                for s in sizes:
                    m *= s
                pieces.append(Piece(pos, m, "rows", src=src, fqn=name, offsets=offs, sizes=sizes))
                pos += m
            weight_map[name] = fname
        files.append(OutputFile(fname, pos, pieces))
    ex = parse_executor(executor, where=d, paths=(src, d))
    staging: Any = None
    index = base + INDEX_SUFFIX
    try:
        if url:
            staging = RemoteStaging(d, resume=resume, folder=False, siblings=abort_shard_uploads)
        else:
            staging = LocalFilesStaging(d, resume=resume)
        write_outputs(
            files,
            staging,
            ex,
            max_task_bytes=max_task_bytes,
            fingerprint={"source": src, "shards": n, "metadata": metadata},
            opener=open_blocks,
            progress=progress,
        )
        if n > 1:
            staging.put(index, index_bytes(total, weight_map))
        staging.publish(last=(index,))
    except BaseException as e:
        if staging is not None:
            staging.abort(e)
        raise
    finally:
        close_sources()
        ex.close()
    folder = remote.dirname(d) if url else os.path.dirname(d)
    out = [remote.join(folder, f.name) if url else os.path.join(folder, f.name) for f in files]
    return out + ([remote.join(folder, index) if url else os.path.join(folder, index)] if n > 1 else [])


def _shard_name(name: str, stem: str) -> bool:
    """``name`` is a shard or the index of ``stem`` (``stem-00001-of-00004.safetensors``)."""
    import re

    return (
        re.fullmatch(re.escape(stem) + r"-\d{5}-of-\d{5}\.safetensors|" + re.escape(stem) + r"\.safetensors\.index\.json", name)
        is not None
    )


def abort_shard_uploads(url: str) -> list[str]:
    """Abort the incomplete uploads of the shards and index a job writing shard set ``url``
    left beside it (a killed process's single-object uploads); returns what was aborted
    (the staging's ``siblings``: :mod:`torchless.jobs.staging`)."""
    base = remote.dirname(url)
    stem = remote.basename(url)
    stem = stem[: -len(".safetensors")] if stem.endswith(".safetensors") else stem
    return [
        u
        for u in remote.abort_uploads(remote.join(base, stem), exact=False, under=False)
        if _shard_name(u.rsplit("/", 1)[-1].partition(" ")[0], stem)
    ]


@remote.accepts_storage_options
def cleanup(dst: Any, *, folder: bool = True) -> list[str]:
    """Remove what interrupted jobs left for destination ``dst`` (their staging folders
    or prefixes, never a published file; on S3 also the incomplete multipart uploads,
    on Azure the blobs of uncommitted blocks, under the staging prefix and at the
    destination). Returns what was removed: local staging folders; at a URL each object,
    and ``URL (incomplete multipart upload)`` / ``URL (uncommitted blocks)``.

    Args:
        dst: the destination the job wrote: a DCP folder (``folder=True``) or a file
            (shards are staged beside it: ``folder=False``); a path or a URL.
    """
    return _cleanup(dst, folder=folder, siblings=abort_shard_uploads)
