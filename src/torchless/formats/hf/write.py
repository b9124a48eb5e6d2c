"""Writing Hugging Face sharded checkpoints (safetensors or torch ``.bin`` shards + index).

Sharding follows ``huggingface_hub.split_torch_state_dict_into_shards`` (what
``transformers``' ``save_pretrained`` uses): tensors are taken in order, a new shard
starts when the next storage would pass ``max_shard_size``, a storage larger than that
gets a shard of its own, tensors sharing a storage stay in one shard and count once in
``total_size``. With one shard, the unsharded name is written and no index.

Shared tensors follow the one rule of :mod:`..shared`: a ``.bin`` shard keeps them shared
(torch's own storage sharing); a safetensors set stores an exact alias once (not in the
index, reported as dropped, recorded in the shards' ``__metadata__``), writes disjoint
views as their own tensors and refuses overlapping ones.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ...core.errors import UsageError
from ...core.tensor import as_tensor
from ...core.values import StateDict
from ...io.atomic import AtomicFile, make_folder_for
from ..shared import alias_metadata, dropped_entries, drops_aliases, split_aliases
from .index import shard_set
from .spec import INDEX_SUFFIX, shard_name

__all__ = ["DEFAULT_MAX_SHARD_SIZE", "convert_tensors", "write_bin_sharded", "write_sharded"]

#: transformers' default ``max_shard_size``
DEFAULT_MAX_SHARD_SIZE = "5GB"


def _split(items: list[tuple[str, Any]], limit: int) -> tuple[list[list[tuple[str, Any]]], int]:
    """Shards as lists of ``(name, tensor)`` and the total size (storages counted once)."""
    shards: list[list[tuple[str, Any]]] = []
    current = -1  # the shard being filled
    size = 0
    total = 0
    home: dict[Any, int] = {}  # Storage (held) -> its shard
    for name, t in items:
        sk = t.storage
        if sk is not None and sk in home:
            shards[home[sk]].append((name, t))
            continue
        n = t.storage.nbytes if t.storage is not None else t.nbytes
        if n > limit:  # a shard of its own; the one being filled stays open
            shards.append([(name, t)])
            idx = len(shards) - 1
        else:
            if current < 0 or size + n > limit:
                shards.append([])
                current = len(shards) - 1
                size = 0
            shards[current].append((name, t))
            size += n
            idx = current
        if sk is not None:
            home[sk] = idx
        total += n
    return shards or [[]], total


def write_bin_sharded(
    items: Iterable[tuple[str, Any]], path: Any, max_shard_size: Any, *, progress: Callable[[int], None] | None = None
) -> list[str]:
    """``pytorch_model-00001-of-0000N.bin`` shards beside ``path`` (``.../pytorch_model.bin``)
    and ``pytorch_model.bin.index.json``; each shard is a ``torch.save`` state dict.

    Everything is built under temporary names and published together, the index last; the
    folder and its missing parents are created. Returns the files written.
    """
    from ..pt.write import save_checkpoint
    from ..safetensors import parse_size

    limit = parse_size(max_shard_size)
    make_folder_for(path)
    tensors = [(name, as_tensor(t, name=name)) for name, t in items]
    shards, total = _split(tensors, limit)
    p = os.fspath(path)
    folder, base = os.path.split(p)
    if len(shards) == 1:
        sd = StateDict(shards[0])
        save_checkpoint(sd, p, progress=progress)
        return [p]
    stem, ext = os.path.splitext(base)
    names = [shard_name(stem, i + 1, len(shards), ext or ".bin") for i in range(len(shards))]
    with shard_set(folder, base + INDEX_SUFFIX, total) as (pending, weight_map):
        for fname, group in zip(names, shards, strict=False):
            af = AtomicFile(os.path.join(folder, fname))
            pending.append(af)
            save_checkpoint(StateDict(group), af.file, prefix=fname.rsplit(".", 1)[0], progress=progress)
            af.finish()
            for name, _t in group:
                weight_map[name] = fname
    idx_path = os.path.join(folder, base + INDEX_SUFFIX)
    return [os.path.join(folder, f) for f in names] + [idx_path]


def write_sharded(
    items: Iterable[tuple[str, Any]], path: Any, max_shard_size: Any = None, *, progress: Callable[[int], None] | None = None
) -> tuple[list[str], dict[str, str]]:
    """Write a sharded set named by ``path``: ``<name>.safetensors[.index.json]`` or
    ``<name>.bin[.index.json]``. Returns ``(files, {alias: kept})``.

    Raises:
        UsageError: a destination that is neither, or shared views safetensors refuses.
    """
    from ...core.tensor import unique_names
    from ..safetensors import write_safetensors_sharded

    p = os.fspath(path)
    base = p[: -len(INDEX_SUFFIX)] if p.endswith(INDEX_SUFFIX) else p
    limit = max_shard_size or DEFAULT_MAX_SHARD_SIZE
    items = unique_names(items, p)
    if base.endswith(".safetensors"):
        from ..safetensors import checked_names

        kept, aliases = split_aliases(checked_names(items, p), p)  # every name checked, aliases too
        meta = alias_metadata({"format": "pt"}, aliases)
        return write_safetensors_sharded(kept, base, limit, metadata=meta, progress=progress), aliases
    if base.endswith(".bin"):
        return write_bin_sharded(items, base, limit, progress=progress), {}
    raise UsageError("a Hugging Face index must be named <name>.safetensors.index.json or <name>.bin.index.json", path=p)


def convert_tensors(
    items: list[tuple[str, Any]],
    dst: Any,
    *,
    format: str | None,
    progress: Any = None,
    strict: bool = False,
    dropped: list[dict[str, str]] | None = None,
    source: Any = None,
    max_shard_size: int | str | None = None,
    options: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """``torchless convert`` from a Hugging Face checkpoint: sharded outputs for
    ``.safetensors`` and ``.index.json`` destinations, one file otherwise.

    Args:
        max_shard_size: the shard size of a sharded destination (``"5GB"``, or bytes).
        options: the destination writer's options (``max_shard_size`` may be given here);
            a sharded destination takes ``max_shard_size`` only.

    Raises:
        UsageError: an option the destination does not take (the message names the
            ones it does), checked before anything is written.
    """
    from ..base import check_options
    from ..registry import handler

    opts = {k: v for k, v in (options or {}).items() if v is not None}  # None: the writer's default
    if max_shard_size is not None:
        if opts.get("max_shard_size", max_shard_size) != max_shard_size:
            raise UsageError("max_shard_size given twice, with different values", path=dst)
        opts["max_shard_size"] = max_shard_size
    dropped = list(dropped or [])
    p = os.fspath(dst)
    aliases: dict[str, str] = {}
    if format == "safetensors" or (format == "hf" and drops_aliases(p, "hf")):
        _kept, aliases = split_aliases(items, p)  # found (and overlaps refused) before writing anything
    dropped += dropped_entries(aliases)
    written = [(n, t) for n, t in items if n not in aliases]
    total = {"tensors": len(written), "bytes": sum(t.nbytes for _, t in written)}
    if strict and dropped:
        shown = ", ".join(d["key"] for d in dropped[:8]) + (" ..." if len(dropped) > 8 else "")
        raise UsageError(
            f"converting to {format} would drop {len(dropped)} value(s): {shown}",
            path=source,
            hint="leave out --strict, or write .pt / .bin shards (they keep shared tensors)",
        )
    if format in ("safetensors", "hf"):
        check_options(handler("hf"), "write", opts, path=dst)  # a sharded set: the Hugging Face writer's options
        files, _aliases = write_sharded(items, dst, opts.get("max_shard_size"), progress=progress)
    else:
        from ..dispatch import write_tensors

        files = write_tensors(items, dst, format=format, progress=progress, **opts)
    return {**total, "files": files, "object_kept": False, "dropped": dropped}
