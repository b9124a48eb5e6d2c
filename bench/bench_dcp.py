"""Consolidating a DCP checkpoint: torchless against torch's ``dcp_to_torch_save``.

Usage: python bench/bench_dcp.py [--rounds N] [--data DIR] [--world W]

The fixture (generated with torch on first use into bench/_data/, not committed) is a
1.1B-parameter decoder LLM in bfloat16 (about 2.2 GB; largest tensor 131 MB) saved with
``torch.distributed.checkpoint.save`` by a real W-rank gloo job on localhost (default 4):
FSDP-style ``Shard(0)`` DTensors, with ``o_proj``/``down_proj`` ``Shard(1)`` as tensor
parallelism would leave them, plus a step counter.

Every measurement runs in a fresh subprocess after the checkpoint was read once into the
page cache, and reports its own peak RSS (``ru_maxrss``) and the seconds of the
conversion itself (imports excluded) and of the whole process. Figures are medians.
Targets (issue): torchless peak RSS <= 1/4 of torch's, time no worse.
Also timed: ``torchless reshard`` W -> 3 ranks (``--jobs 2``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PY = sys.executable

GEN = r"""
import sys, torch, torch.distributed as dist, torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard

def shapes():
    h, inter, kv, vocab, layers = 2048, 5632, 256, 32000, 22
    out = {"model.embed_tokens.weight": ((vocab, h), 0)}
    for i in range(layers):
        p = f"model.layers.{i}."
        for k, s, d in [("self_attn.q_proj.weight", (h, h), 0), ("self_attn.k_proj.weight", (kv, h), 0),
                        ("self_attn.v_proj.weight", (kv, h), 0), ("self_attn.o_proj.weight", (h, h), 1),
                        ("mlp.gate_proj.weight", (inter, h), 0), ("mlp.up_proj.weight", (inter, h), 0),
                        ("mlp.down_proj.weight", (h, inter), 1), ("input_layernorm.weight", (h,), 0),
                        ("post_attention_layernorm.weight", (h,), 0)]:
            out[p + k] = (s, d)
    out["model.norm.weight"] = ((h,), 0)
    out["lm_head.weight"] = ((vocab, h), 0)
    return out

def worker(rank, world, port, ckpt):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (world,))
    sd = {}
    for i, (name, (shape, dim)) in enumerate(shapes().items()):
        n = shape[dim]
        step = -(-n // world)
        a, b = min(rank * step, n), min(rank * step + step, n)
        ls = list(shape); ls[dim] = b - a
        g = torch.Generator().manual_seed(i * 1000 + rank)
        loc = torch.empty(*ls, dtype=torch.bfloat16).normal_(generator=g)
        t = torch.empty(shape)
        sd[name] = DTensor.from_local(loc, mesh, [Shard(dim)], run_check=False, shape=torch.Size(shape), stride=t.stride())
        del t
    sd["step"] = 1000
    dcp.save({"model": sd}, checkpoint_id=ckpt)
    dist.barrier()
    dist.destroy_process_group()

if __name__ == "__main__":
    world, port, ckpt = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    mp.start_processes(worker, args=(world, port, ckpt), nprocs=world, start_method="fork")
"""

RUN_TORCH = r"""
import json, resource, sys, time
t0 = time.perf_counter()
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
t1 = time.perf_counter()
dcp_to_torch_save(sys.argv[1], sys.argv[2])
t2 = time.perf_counter()
print(json.dumps({"op": t2 - t1, "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""

RUN_TL = r"""
import json, resource, sys, time
t0 = time.perf_counter()
import torchless
t1 = time.perf_counter()
torchless.convert(sys.argv[1], sys.argv[2])
t2 = time.perf_counter()
print(json.dumps({"op": t2 - t1, "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""

RUN_RESHARD = r"""
import json, resource, sys, time
import torchless.dcp as d
t1 = time.perf_counter()
d.reshard(sys.argv[1], sys.argv[2], 3, jobs=2)
t2 = time.perf_counter()
print(json.dumps({"op": t2 - t1, "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def generate(ckpt: str, world: int) -> None:
    tmp = ckpt + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    print(f"generating {ckpt} with a {world}-rank torch job ...", flush=True)
    subprocess.run([PY, "-c", GEN, str(world), str(free_port()), tmp], check=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    os.replace(tmp, ckpt)


def warm(path: str) -> None:
    for root, _d, files in os.walk(path):
        for f in files:
            with open(os.path.join(root, f), "rb") as fh:
                while fh.read(64 << 20):
                    pass


def measure(script: str, *args: str) -> dict:
    t0 = time.perf_counter()
    res = subprocess.run([PY, "-c", script, *args], capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if res.returncode != 0:
        raise SystemExit(res.stderr[-3000:])
    out = json.loads(res.stdout.strip().splitlines()[-1])
    out["wall"] = wall
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--data", default=os.path.join(HERE, "_data"))
    ap.add_argument("--world", type=int, default=4)
    a = ap.parse_args()
    os.makedirs(a.data, exist_ok=True)
    ckpt = os.path.join(a.data, f"dcp_llm_{a.world}ranks")
    if not os.path.exists(os.path.join(ckpt, ".metadata")):
        generate(ckpt, a.world)
    size = sum(os.path.getsize(os.path.join(ckpt, f)) for f in os.listdir(ckpt))
    print(f"checkpoint: {ckpt} ({size / 1e9:.2f} GB, {len(os.listdir(ckpt)) - 1} rank files)")
    out_t, out_l = os.path.join(a.data, "out_torch.pt"), os.path.join(a.data, "out_torchless.pt")
    runs: dict[str, list[dict]] = {"torch": [], "torchless": [], "reshard": []}
    for r in range(a.rounds):
        for name, script, dst in (("torch", RUN_TORCH, out_t), ("torchless", RUN_TL, out_l)):
            warm(ckpt)
            if os.path.exists(dst):
                os.unlink(dst)
            runs[name].append(measure(script, ckpt, dst))
            os.unlink(dst)
            print(
                f"  round {r + 1} {name:10s} op {runs[name][-1]['op']:7.2f} s  wall {runs[name][-1]['wall']:7.2f} s  "
                f"peak RSS {runs[name][-1]['rss_mb']:8.0f} MB",
                flush=True,
            )
    dst3 = os.path.join(a.data, "resharded3")
    shutil.rmtree(dst3, ignore_errors=True)
    warm(ckpt)
    runs["reshard"].append(measure(RUN_RESHARD, ckpt, dst3))
    shutil.rmtree(dst3, ignore_errors=True)

    def med(name: str, key: str) -> float:
        return statistics.median(x[key] for x in runs[name])

    print()
    print(f"{'':22s}{'torch':>12s}{'torchless':>12s}{'ratio':>9s}")
    for key, label in (("op", "convert time (s)"), ("wall", "process time (s)"), ("rss_mb", "peak RSS (MB)")):
        t, l = med("torch", key), med("torchless", key)
        print(f"{label:22s}{t:12.2f}{l:12.2f}{l / t:9.3f}")
    print(
        "targets: peak RSS ratio <= 0.25 -> "
        f"{'met' if med('torchless', 'rss_mb') <= 0.25 * med('torch', 'rss_mb') else 'MISSED'}; "
        f"time ratio <= 1.0 -> {'met' if med('torchless', 'op') <= med('torch', 'op') else 'MISSED'}"
    )
    rs = runs["reshard"][0]
    print(f"torchless reshard {a.world} -> 3 ranks (--jobs 2): {rs['op']:.2f} s, coordinator peak RSS {rs['rss_mb']:.0f} MB")


if __name__ == "__main__":
    main()
