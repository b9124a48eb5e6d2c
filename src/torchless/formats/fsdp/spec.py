"""The layout facts of FSDP2 per-rank state dicts (torch 2.13 ``fully_shard``).

Each rank ``torch.save``s ``model.state_dict()``: parameters are ``DTensor`` wrapper
subclasses pickled by ``_rebuild_from_type_v2(_rebuild_wrapper_subclass, DTensor, (...,
global size, global stride...), {"_local_tensor": the rank's shard, "_spec":
DTensorSpec(mesh, placements, tensor_meta)})``; buffers are plain tensors. A ``Shard(d)``
placement splits dimension ``d`` as ``torch.chunk`` does: ``ceil(size / world)`` a rank,
the last ranks shorter or empty (the state dict holds the unpadded shard).
"""

from __future__ import annotations

import math
import re

__all__ = ["DTENSOR", "FSDP_GLOBALS", "RANK_FILE", "chunk_range"]

DTENSOR = "torch.distributed.tensor.DTensor"
SHARD = "torch.distributed.tensor.placement_types.Shard"
REPLICATE = "torch.distributed.tensor.placement_types.Replicate"

#: the classes a DTensor state dict pickles; opened as inert placeholders, never imported
FSDP_GLOBALS = frozenset(
    {
        DTENSOR,
        "torch.distributed.tensor._dtensor_spec.DTensorSpec",
        "torch.distributed.tensor._dtensor_spec.TensorMeta",
        "torch.distributed.tensor._dtensor_spec.ShardOrderEntry",
        "torch.distributed.device_mesh.DeviceMesh",
        "torch.distributed._mesh_layout._MeshLayout",
        "torch.distributed._mesh_layout._FlatLayout",
        SHARD,
        REPLICATE,
    }
)

#: a per-rank file: ``<stem><rank>.pt`` (``.pth``, ``.bin``); every file of the folder
#: shares the stem, the ranks being 0..N-1 (the rank used is the mesh coordinate inside)
RANK_FILE = re.compile(r"^(.*?)(\d+)\.(pt|pth|bin)$")


def chunk_range(size: int, world: int, rank: int) -> tuple[int, int]:
    """The ``[start, stop)`` of ``rank``'s ``torch.chunk`` share of ``size`` elements."""
    step = math.ceil(size / world) if size else 0
    start = min(rank * step, size)
    return start, min(start + step, size)
