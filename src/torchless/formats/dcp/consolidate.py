"""Consolidating a DCP checkpoint into one file, streaming one tensor at a time.

``.pt`` output holds the nested state dict (tensors and the non-tensor values), as
``torch.distributed.checkpoint.format_utils.dcp_to_torch_save`` writes it; other formats
(``.safetensors`` with optional ``max_shard_size``, ``.npz``) take the tensors by their
flattened names. Each tensor is assembled from its chunks into one buffer, written, and
dropped before the next, so peak memory is about the largest tensor.

A ``.pt`` record that is an item's storage record byte for byte (a whole storage copied
unchanged) takes its CRC-32 from the item's zip directory rather than computing it: a
corrupted item then gives an output record that ``torchless verify`` reports, where a
fresh CRC-32 would bless the corrupted bytes (docs/dcp.md, "Memory and speed").
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

from ...core.errors import UsageError
from ...core.gcpause import GCPause
from ...io.remote import accepts_storage_options as _remote_opts
from .read import BlockStorage, unflatten
from .reader import DCPReader
from .readers import open_reader

__all__ = ["consolidate"]

#: the keywords of range tasks on an executor (safetensors output)
_RANGED = ("executor", "max_task_bytes", "resume")


@_remote_opts
def consolidate(
    src: Any,
    dst: Any,
    *,
    format: str | None = None,
    progress: Callable[[int], None] | None = None,
    weights_only: bool = True,
    keys: Any = None,
    strict: bool = False,
    max_shard_size: int | str | None = None,
    options: Mapping[str, Any] | None = None,
    executor: Any = None,
    max_task_bytes: int | None = None,
    resume: bool = False,
) -> dict[str, Any]:
    """Write the DCP checkpoint ``src`` (a directory or a :class:`DCPReader`) as ``dst``.

    Args:
        format: destination format (default: from ``dst``'s extension).
        weights_only: how non-tensor values are unpickled (``.pt`` output only).
        keys: only these flattened keys.
        strict: refuse (before writing) when a non-tensor value would be dropped.
        max_shard_size: shard a ``.safetensors`` destination (``"5GB"``, or bytes).
        options: the destination writer's other options (``metadata`` for safetensors,
            ``compress`` for npz, ``alignment``/``compute_crc``/``prefix`` for pt;
            ``torchless formats --json`` lists them).
        executor, max_task_bytes, resume: write safetensors output as range tasks on an
            executor (see :func:`torchless.formats.hf.ranged.write_shards`); they may also
            come in ``options``.

    Returns:
        ``{"tensors": n, "bytes": total, "skipped": [non-tensor keys not written],
        "files": [written paths]}``.

    Raises:
        UsageError: an option the destination's writer does not take (the message names
            the ones it does), checked before anything is read.
    """
    from ..base import check_options
    from ..registry import handler, handler_for_path

    h = handler(format) if format else handler_for_path(dst)
    if h is None:
        raise UsageError("cannot tell the output format from the file name", path=dst, expected=".pt, .safetensors, .npz ...")
    opts = {k: v for k, v in (options or {}).items() if v is not None}  # None: the writer's default
    if max_shard_size is not None:
        if opts.get("max_shard_size", max_shard_size) != max_shard_size:
            raise UsageError("max_shard_size given twice, with different values", path=dst)
        opts["max_shard_size"] = max_shard_size
    # range tasks on an executor: how the output is written, not options of the format
    ranged = {k: opts.pop(k) for k in _RANGED if k in opts}
    ranged.update({k: v for k, v in zip(_RANGED, (executor, max_task_bytes, resume), strict=True) if v not in (None, False)})
    ranged = {k: v for k, v in ranged.items() if v not in (None, False)}
    check_options(h, "write", opts, path=dst)
    if ranged and h.name != "safetensors":
        raise UsageError("an executor writes safetensors output only", found=h.name, hint="write .safetensors")
    # tens of thousands of small objects (specs, chunk refs, storages, memo entries) that
    # live until the end: generational GC passes over them find nothing to free and cost
    # a sixth of the run on a checkpoint of many small tensors
    with GCPause():
        return _consolidate(src, dst, h, opts, ranged, progress, weights_only, keys, strict)


def _consolidate(
    src: Any,
    dst: Any,
    h: Any,
    opts: dict[str, Any],
    ranged: dict[str, Any],
    progress: Callable[[int], None] | None,
    weights_only: bool,
    keys: Any,
    strict: bool,
) -> dict[str, Any]:
    from ..dispatch import write_tensors

    reader = src if isinstance(src, DCPReader) else open_reader(src)
    try:
        want = None if keys is None else set(keys)
        names = [n for n in reader.tensor_names() if want is None or n in want]
        values = [n for n in reader.bytes_names() if want is None or n in want]
        if h.name == "pt" and not values and not opts:
            # (locates each batch of chunks just before writing it)
            flat_total = _save_flat(reader, names, dst, progress)
            if flat_total is not None:
                return {"tensors": len(names), "bytes": flat_total, "skipped": [], "files": [os.fspath(dst)]}
        # every chunk located up front, the items of each file together in file order
        reader.locate_many([r for n in names for r in reader.chunks(n)])
        total = sum(reader.entries[n].nbytes for n in names)
        if h.name == "pt":
            from ..pt.write import save_checkpoint

            flat: dict[str, Any] = {}
            name_set, value_set = set(names), set(values)  # membership per entry: no quadratic scan
            for fqn in reader.entries:
                if fqn in name_set:
                    flat[fqn] = reader.tensor(fqn, view=True)
                elif fqn in value_set:
                    flat[fqn] = reader.value(fqn, weights_only=weights_only)
            save_checkpoint(unflatten(flat, reader.metadata.planner_data), os.fspath(dst), progress=progress, **opts)
            return {"tensors": len(names), "bytes": total, "skipped": [], "files": [os.fspath(dst)]}
        if strict and values:
            shown = ", ".join(values[:8]) + (" ..." if len(values) > 8 else "")
            raise UsageError(
                f"converting to {h.name} would drop {len(values)} value(s) that are not tensors: {shown}",
                path=reader.path,
                hint="write .pt to keep them, or leave out --strict",
            )
        if ranged:  # range tasks on an executor: workers read the chunks themselves
            from ..hf.ranged import write_shards

            ents = [(n, reader.entries[n].dtype, tuple(reader.entries[n].size), reader.entries[n].nbytes) for n in names]
            files = write_shards(reader.path, ents, dst, progress=progress, **opts, **ranged)
            return {"tensors": len(names), "bytes": total, "skipped": values, "files": files}
        items = ((n, reader.tensor(n)) for n in names)
        files = write_tensors(items, dst, format=h.name, progress=progress, **opts)
        return {"tensors": len(names), "bytes": total, "skipped": values, "files": files}
    finally:
        if not isinstance(src, DCPReader):
            reader.close()


def _save_flat(reader: DCPReader, names: list[str], dst: Any, progress: Any) -> int | None:
    """A state dict of tensors only that stays flat: written from rows (no tensor objects),
    the same bytes as through the tensors (:func:`~torchless.formats.pt.write.save_plain_tensors`
    rows, built here directly); the tensors' bytes in all, or None (nothing written) when
    it is anything else."""
    from ..pt.write import _BLOCK_BATCH, _contiguous_strides, _save_rows

    want = set(names)
    order = [n for n in reader.entries if n in want]
    tree = _flat_tree(order, reader.metadata.planner_data)
    if len(tree) != len(order) or not all(type(v) is str for v in tree.values()):
        return None  # nested: the general writer
    entries = reader.entries
    full = []
    total = 0
    lazy = BlockStorage._lazy
    view = reader._view_block
    path = reader.path
    strides_of = _contiguous_strides
    prod = math.prod
    strides_by_size: dict[tuple[int, ...], tuple[int, ...]] = {}
    for key, fqn in tree.items():
        tmd = entries[fqn]
        props = tmd.properties
        dt = props.dtype
        legacy = dt.legacy_storage
        rg = props.requires_grad
        if type(key) is not str or legacy is None or type(rg) is not bool:
            return None
        # the size and strides shared between rows of one shape: the emitter writes each
        # row's as tuples of their own (fresh_tuples), as tensors' are; it refuses
        # anything but ints in them
        size = tmd.size
        numel = prod(size)
        nbytes = numel * dt.itemsize
        total += nbytes
        strides = strides_by_size.get(size)
        if strides is None:
            strides = strides_by_size[size] = strides_of(size)
        st = lazy(fqn, nbytes, dt, "cpu", partial(view, fqn), "little", f"{path}:{fqn}")
        full.append((key, legacy, "cpu", numel, 0, size, strides, rg, st, dt.name))
    # each batch's items are located when the writer asks for the batch, just before its
    # records are written (the writer writes behind): the pages the checks bring in are
    # still mapped for the write (released with the views, at the next batch); the
    # locate errors are locate_many's
    chunks = reader._chunks
    # the writer asks for the storages in row order, _BLOCK_BATCH at a time: the items
    # of the batch after the one asked for are mapped in on a helper thread meanwhile
    # (the faults of the locating and of the writes then cost this thread nothing)
    pos = 0

    def ahead(k: int) -> None:
        reader._prefault([r for row in full[k : k + _BLOCK_BATCH] for r in chunks.get(row[8].key, ())])

    ahead(0)

    def blocks(storages: list[Any]) -> tuple[list[memoryview | None], list[int | None]]:
        nonlocal pos
        # the rows of the batch: the writer asks for the storages in row order (anything
        # else is asked of the reader storage by storage: no span)
        rows = full[pos : pos + len(storages)]
        pos += len(storages)
        ahead(pos)
        reader.locate_many([r for st in storages for r in chunks.get(st.key, ())], release=False)
        crcs: list[int | None] = []  # the CRC-32s from the map, for the writer
        if len(rows) == len(storages) and all(row[8] is st for row, st in zip(rows, storages, strict=True)):
            spans = reader._direct_spans([(row[8].key, entries[row[8].key], row[8].nbytes, row[6]) for row in rows])
        else:
            spans = [None] * len(storages)
        views = reader._view_spans(spans, [st.nbytes for st in storages], crcs)
        for sp, st in zip(spans, storages, strict=True):
            if sp is None:  # located but not viewed here (read later, as any storage)
                for r in chunks.get(st.key, ()):
                    reader._release(r.info)
        return views, crcs

    if not _save_rows(tree, full, os.fspath(dst), progress=progress, blocks=blocks):
        return None
    return total


def _flat_tree(order: list[str], planner_data: Any) -> dict[Any, Any]:
    """``unflatten({n: n for n in order}, planner_data)`` where every key path has one
    part (a flat state dict, the common case: one look-up per key); anything else
    through :func:`~.read.unflatten` itself."""
    paths = planner_data if isinstance(planner_data, dict) else {}
    tree: dict[Any, Any] = {}
    for n in order:
        p = paths.get(n)
        if type(p) is tuple and len(p) == 1 and type(p[0]) is str:
            tree[p[0]] = n
        elif p is None:
            tree[n] = n
        else:
            return unflatten({n: n for n in order}, planner_data)
    return tree
