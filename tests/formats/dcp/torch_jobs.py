"""Real multi-process torch.distributed.checkpoint jobs for the differential tests.

Run as a script (it imports torch; the tests start it in a subprocess):

    python torch_jobs.py save  CKPT_DIR WORLD PORT REF_PT
    python torch_jobs.py load  CKPT_DIR WORLD PORT REF_PT OUT_PREFIX [hf]

``save`` builds a state dict on every rank (DTensors sharded on dim 0 and dim 1 with
uneven pieces, replicated DTensors, plain tensors of every common dtype, optimizer-like
nested state, non-tensor values), saves it with ``dcp.save`` over gloo on localhost, and
rank 0 writes the full values with ``torch.save`` to REF_PT (the oracle). The tensors of
safetensors dtypes are also saved with ``HuggingFaceStorageWriter(save_distributed=True)``
to ``CKPT_DIR + "_hf"`` and with ``FileSystemWriter(serialization_format=SAFETENSORS)`` to
``CKPT_DIR + "_st"``; the whole state dict again with ``use_collectives=False`` (per-rank
``__R.metadata``) to ``CKPT_DIR + "_ranked"``.

``load`` builds a state dict shaped like REF_PT but sharded differently (dim 1 where
possible), ``dcp.load``s CKPT_DIR into it in a job of WORLD ranks, and every rank saves
``{key: (offsets, local tensor)}`` plus the non-tensor values to ``OUT_PREFIX<rank>.pt``;
with ``hf`` it reads through ``HuggingFaceStorageReader``.
No other collective is used, so any dtype works over gloo.
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard

PLAIN_DTYPES = [
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.uint8,
    torch.bool,
    torch.complex64,
    torch.float8_e4m3fn,
    torch.float8_e5m2,
    torch.uint16,
    torch.uint32,
]


def make_global() -> dict:
    g = torch.Generator().manual_seed(1234)

    def rnd(*shape, dtype=torch.float32):
        return torch.randn(*shape, generator=g).to(dtype)

    plain = {}
    for dt in PLAIN_DTYPES:
        name = str(dt).split(".")[1]
        if dt == torch.bool:
            plain[name] = torch.randn(3, 5, generator=g) > 0
        elif dt.is_floating_point or dt.is_complex:
            plain[name] = (torch.randn(3, 5, generator=g) * 4).to(dt)
        else:
            plain[name] = torch.randint(0, 100, (3, 5), generator=g).to(dt)
    return {
        "model": {
            "row": rnd(8, 6),  # Shard(0)
            "col": rnd(5, 9, dtype=torch.bfloat16),  # Shard(1), uneven
            "odd": rnd(7, 3, dtype=torch.float16),  # Shard(0), uneven
            "rep": rnd(7, dtype=torch.float64),  # Replicate()
            "ints": torch.randint(-1000, 1000, (6, 4), generator=g, dtype=torch.int32),  # Shard(1)
            "cube": rnd(4, 3, 5),  # Shard(2)
            "sharded": rnd(6, 4),  # ShardedTensor, row-wise
        },
        "plain": plain,
        "optim": {
            "state": {"0": {"step": torch.tensor(3.0), "exp_avg": rnd(8, 6), "exp_avg_sq": rnd(8, 6)}},
            "param_groups": [{"lr": 0.01, "betas": (0.9, 0.999), "params": [0]}],
        },
        "step": 17,
        "name": "run-1",
        "lst": [rnd(2, 2), rnd(3)],
    }


#: dtypes the safetensors format has
HF_DTYPES = {
    "float32",
    "float64",
    "float16",
    "bfloat16",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "bool",
    "float8_e4m3fn",
    "float8_e5m2",
}

SAVE_PLACEMENT = {
    "model.row": 0,
    "model.col": 1,
    "model.odd": 0,
    "model.rep": None,
    "model.ints": 1,
    "model.cube": 2,
    "optim.state.0.exp_avg": 0,
    "optim.state.0.exp_avg_sq": 1,
}


def local_shard(t: torch.Tensor, dim: int, rank: int, world: int) -> tuple[torch.Tensor, int]:
    pieces = torch.chunk(t, world, dim=dim)
    step = pieces[0].shape[dim]
    if rank < len(pieces):
        return pieces[rank].contiguous(), rank * step
    shape = list(t.shape)
    shape[dim] = 0
    return t.new_empty(shape), t.shape[dim]


def to_dtensor(t, dim, mesh, rank, world):
    if dim is None:
        return DTensor.from_local(t.clone(), mesh, [Replicate()], run_check=False)
    loc, _ = local_shard(t, dim, rank, world)
    return DTensor.from_local(loc, mesh, [Shard(dim)], run_check=False, shape=t.shape, stride=t.stride())


def to_sharded_tensor(t, rank, world):
    """The older ShardedTensor API: row-wise shards with explicit ShardMetadata."""
    from torch.distributed._shard.metadata import ShardMetadata
    from torch.distributed._shard.sharded_tensor import Shard as STShard
    from torch.distributed._shard.sharded_tensor import init_from_local_shards

    loc, off = local_shard(t, 0, rank, world)
    md = ShardMetadata(shard_offsets=[off, 0], shard_sizes=list(loc.shape), placement=f"rank:{rank}/cpu")
    return init_from_local_shards([STShard(loc, md)], list(t.shape))


def walk(d, prefix=""):
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            yield from walk(v, key + ".")
        else:
            yield key, d, k, v


def save_worker(rank, world, port, ckpt, ref):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (world,))
    sd = make_global()
    if rank == 0:
        torch.save(make_global(), ref)
    for key, parent, k, v in list(walk(sd)):
        if key in SAVE_PLACEMENT:
            parent[k] = to_dtensor(v, SAVE_PLACEMENT[key], mesh, rank, world)
    sd["model"]["sharded"] = to_sharded_tensor(sd["model"]["sharded"], rank, world)
    dcp.save(sd, checkpoint_id=ckpt)
    # the Hugging Face safetensors flavour (per-rank shards with DCP_SHARDING_INFO)
    from torch.distributed.checkpoint import HuggingFaceStorageWriter

    hf = {"model": sd["model"], "plain": {k: v for k, v in sd["plain"].items() if k in HF_DTYPES}}
    dcp.save(hf, storage_writer=HuggingFaceStorageWriter(path=ckpt + "_hf", save_distributed=True))
    dist.barrier()
    # every rank its own __R.metadata (no global plan), and the safetensors serialization
    dcp.save(sd, checkpoint_id=ckpt + "_ranked", use_collectives=False)
    from torch.distributed.checkpoint import FileSystemWriter
    from torch.distributed.checkpoint.filesystem import SerializationFormat

    dcp.save(hf, storage_writer=FileSystemWriter(ckpt + "_st", serialization_format=SerializationFormat.SAFETENSORS))
    dist.barrier()
    dist.destroy_process_group()


def blank(v):
    """Same structure, different leaf values (so a load that did nothing is caught)."""
    if isinstance(v, dict):
        return {k: blank(x) for k, x in v.items()}
    if isinstance(v, list) and any(isinstance(x, (dict, list, torch.Tensor)) for x in v):
        return [blank(x) for x in v]
    if isinstance(v, torch.Tensor):
        return torch.zeros_like(v)
    return None


def walk_all(d, prefix=""):
    for k, v in d.items() if isinstance(d, dict) else enumerate(d):
        key = f"{prefix}{k}"
        if isinstance(v, dict) or (isinstance(v, list) and any(isinstance(x, (dict, list, torch.Tensor)) for x in v)):
            yield from walk_all(v, key + ".")
        else:
            yield key, d, k, v


def load_worker(rank, world, port, ckpt, ref, out_prefix, storage="torch_save"):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (world,))
    sd = torch.load(ref, weights_only=False)
    if storage == "hf":  # safetensors holds the tensors of safetensors dtypes only
        sd = {"model": sd["model"], "plain": {k: v for k, v in sd["plain"].items() if k in HF_DTYPES}}
    offsets = {}
    for key, parent, k, v in list(walk(sd)):
        if isinstance(v, torch.Tensor) and v.dim() >= 1 and key.startswith(("model.", "optim.state")):
            dim = 1 if v.dim() >= 2 else 0
            loc, off = local_shard(torch.zeros_like(v), dim, rank, world)
            parent[k] = DTensor.from_local(loc, mesh, [Shard(dim)], run_check=False, shape=v.shape, stride=v.stride())
            offsets[key] = (dim, off)
        elif isinstance(v, torch.Tensor):
            parent[k] = torch.zeros_like(v)
        elif key == "lst":
            parent[k] = [torch.zeros_like(x) for x in v]
        else:
            parent[k] = blank(v)
    if storage == "hf":
        from torch.distributed.checkpoint import HuggingFaceStorageReader

        dcp.load(sd, storage_reader=HuggingFaceStorageReader(ckpt))
    else:
        dcp.load(sd, checkpoint_id=ckpt)
    out = {}
    for key, _parent, _k, v in walk_all(sd):
        if isinstance(v, DTensor):
            out[key] = (offsets[key], v.to_local().clone())
        else:
            out[key] = (None, v)
    torch.save(out, f"{out_prefix}{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()


def main(argv):
    mode, ckpt, world, port = argv[0], argv[1], int(argv[2]), int(argv[3])
    import torch.multiprocessing as mp

    if mode == "save":
        mp.start_processes(save_worker, args=(world, port, ckpt, argv[4]), nprocs=world, start_method="fork")
    elif mode == "load":
        storage = argv[6] if len(argv) > 6 else "torch_save"
        mp.start_processes(load_worker, args=(world, port, ckpt, argv[4], argv[5], storage), nprocs=world, start_method="fork")
    else:
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main(sys.argv[1:])
