# /// script
# requires-python = ">=3.10"
# dependencies = ["torch==2.13.0"]
# ///
"""Regenerate ``samples/dcp_ckpt/`` (run: python samples/gen_dcp.py).

A distributed checkpoint written by ``torch.distributed.checkpoint.save`` from a real
2-rank job (gloo on localhost): a small MLP's weights as DTensors sharded row-wise
(``Shard(0)``) and column-wise (``Shard(1)``), a replicated bias, Adam-like optimizer
state and a step counter. The demo inspects, consolidates and reshards it without torch.
"""

from __future__ import annotations

import os
import shutil
import socket

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "dcp_ckpt")


def shard(t: torch.Tensor, dim: int, mesh, rank: int, world: int) -> DTensor:
    loc = torch.chunk(t, world, dim=dim)[rank].contiguous()
    return DTensor.from_local(loc, mesh, [Shard(dim)], run_check=False, shape=t.shape, stride=t.stride())


def worker(rank: int, world: int, port: int) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (world,))
    g = torch.Generator().manual_seed(0)
    w1, b1 = torch.randn(64, 32, generator=g), torch.randn(64, generator=g)
    w2 = torch.randn(10, 64, generator=g).to(torch.bfloat16)
    model = {
        "fc1.weight": shard(w1, 0, mesh, rank, world),
        "fc1.bias": DTensor.from_local(b1.clone(), mesh, [Replicate()], run_check=False),
        "fc2.weight": shard(w2, 1, mesh, rank, world),
    }
    optim = {
        "state": {
            "fc1.weight": {
                "step": torch.tensor(100.0),
                "exp_avg": shard(w1 * 0.1, 0, mesh, rank, world),
                "exp_avg_sq": shard(w1 * w1, 0, mesh, rank, world),
            }
        },
        "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.999), "params": ["fc1.weight", "fc1.bias", "fc2.weight"]}],
    }
    # a relative checkpoint_id: .metadata records it (StorageMeta), keep machine paths out
    dcp.save({"model": model, "optim": optim, "step": 100}, checkpoint_id="dcp_ckpt")
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    shutil.rmtree(OUT, ignore_errors=True)
    os.chdir(HERE)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(worker, args=(2, port), nprocs=2, start_method="fork")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
