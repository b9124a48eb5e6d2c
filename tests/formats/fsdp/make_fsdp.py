"""Write real FSDP2 per-rank state dicts on CPU (gloo, 2 processes) and FSDP's own full
state dict (the oracle).

Usage (the test's session fixture runs it; also by hand):
    python make_fsdp.py OUT [WORLD]   # OUT/ranks/model_rank<r>.pt, OUT/full.pt

Each rank ``torch.save``s ``model.state_dict()`` of a ``fully_shard``-ed model (DTensors
sharded on dimension 0, uneven: 7 rows over 2 ranks, a 1-element bias that leaves the
last rank an empty shard; a bf16 layer; BatchNorm buffers, plain tensors), after one
optimizer step. Rank 0 saves ``get_model_state_dict(model,
StateDictOptions(full_state_dict=True))``: FSDP's full state dict.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys


def _rank_main(out: str) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from torch.distributed.fsdp import fully_shard

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(1234)

    class Net(nn.Sequential):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self[3](self[2](self[1](self[0](x))))
            return self[4](h.to(torch.bfloat16)).float()

    model = Net(nn.Linear(5, 7), nn.BatchNorm1d(7), nn.Linear(7, 3), nn.Linear(3, 1), nn.Linear(1, 4))
    model[4].to(torch.bfloat16)
    for layer in (model[0], model[2], model[4]):
        fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(4, 5, generator=torch.Generator().manual_seed(rank))
    loss = model(x).pow(2).mean()
    loss.backward()
    opt.step()
    os.makedirs(os.path.join(out, "ranks"), exist_ok=True)
    torch.save(model.state_dict(), os.path.join(out, "ranks", f"model_rank{rank}.pt"))
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank == 0:
        torch.save(full, os.path.join(out, "full.pt"))
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)  # the gloo process group can hang at interpreter exit


def write(out: str, world: int = 2, timeout: float = 300) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in range(world):
        env = dict(
            os.environ,
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE=str(world),
            OMP_NUM_THREADS="1",
        )
        cmd = [sys.executable, __file__, "_rank", out]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    outs = []
    for p in procs:
        try:
            o, _ = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
        outs.append(o.decode(errors="replace"))
    if any(p.returncode for p in procs):
        raise RuntimeError("FSDP ranks failed:\n" + "\n".join(o[-3000:] for o in outs))


if __name__ == "__main__":
    if sys.argv[1] == "_rank":
        _rank_main(sys.argv[2])
    else:
        write(sys.argv[1], *(int(a) for a in sys.argv[2:3]))
