"""``torchless.dcp``: distributed checkpoints (``torch.distributed.checkpoint``) offline.

Read, inspect, consolidate, reshard and write DCP directories without torch, a process
group, memory for the whole model, or trust in the ``.metadata`` pickle.

Example:
    >>> import torchless.dcp as dcp                                   # doctest: +SKIP
    >>> with dcp.open("ckpt/") as ck:
    ...     print(ck.layout()["items"]["model.w"]["chunks"])
    ...     w = ck["model.w"].numpy()          # assembled from its chunks
    >>> dcp.consolidate("ckpt/", "model.safetensors", max_shard_size="5GB")
    >>> dcp.reshard("ckpt/", "ckpt8/", ranks=8, plan="*.bias=replicate,row", jobs=4)
    >>> dcp.reshard("model.pt", "ckpt4/", ranks=4)      # one file -> 4 ranks
    >>> dcp.reshard("s3://b/ckpt", "s3://b/ckpt8", 8, executor="dask://sched:8786", max_task_bytes=2**28)
    >>> dcp.cleanup("s3://b/ckpt8")                      # what an interrupted job left
"""

from __future__ import annotations

from typing import Any

from .formats.base import LoadPolicy
from .formats.dcp.artifact import DCPArtifact
from .formats.dcp.consolidate import consolidate
from .formats.dcp.metadata import DCP_ALLOWLIST, dump_metadata, parse_metadata, read_metadata
from .formats.dcp.read import unflatten
from .formats.dcp.reader import DCPReader
from .formats.dcp.reshard import FileTask, Plan, ShardSpec, parse_plan, plan_reshard, reshard, run_task
from .formats.dcp.spec import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    StorageInfo,
    StorageMeta,
    TensorProperties,
    TensorStorageMetadata,
)
from .formats.hf.ranged import cleanup
from .io.remote import accepts_storage_options as _remote_opts

__all__ = [
    "BytesStorageMetadata",
    "ChunkStorageMetadata",
    "DCPArtifact",
    "DCPReader",
    "DCP_ALLOWLIST",
    "FileTask",
    "Metadata",
    "MetadataIndex",
    "Plan",
    "ShardSpec",
    "StorageInfo",
    "StorageMeta",
    "TensorProperties",
    "TensorStorageMetadata",
    "cleanup",
    "consolidate",
    "dump_metadata",
    "layout",
    "load",
    "open",
    "parse_metadata",
    "parse_plan",
    "plan_reshard",
    "read_metadata",
    "reshard",
    "run_task",
    "unflatten",
]


@_remote_opts
def open(path: Any, *, weights_only: bool = True) -> DCPArtifact:  # noqa: A001
    """Open a DCP directory lazily (nothing but ``.metadata`` is read)."""
    return DCPArtifact(path, LoadPolicy(weights_only=weights_only))


@_remote_opts
def load(path: Any, *, keys: Any = None, weights_only: bool = True, materialize: bool = False) -> Any:
    """The nested state dict. Tensors are lazy unless ``materialize`` (then NumPy arrays);
    ``keys`` (flattened names) selects what to read."""
    art = DCPArtifact(path, LoadPolicy(weights_only=weights_only))
    obj = art.load(keys=keys)
    if materialize:
        from .core.tensor import Tensor

        def go(x: Any) -> Any:
            if isinstance(x, Tensor):
                return x.numpy()
            if isinstance(x, dict):
                return {k: go(v) for k, v in x.items()}
            if isinstance(x, list):
                return [go(v) for v in x]
            return x

        obj = go(obj)
        art.close()
    return obj


@_remote_opts
def layout(path: Any) -> dict[str, Any]:
    """Everything ``.metadata`` records: keys, shapes, dtypes, chunks with their files and
    byte ranges, bytes items, planner data and storage metadata (JSON-ready)."""
    with DCPArtifact(path) as art:
        return art.layout()
