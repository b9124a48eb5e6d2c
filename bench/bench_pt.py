"""Eager checkpoints: torchless beside torch, numpy and raw I/O, measured in one run.

Usage: python bench/bench_pt.py [--rounds N] [--only llm|many_small] [--data DIR]

Fixtures (generated with torch on first use into bench/_data/, not committed):
  llm         201 bfloat16 tensors shaped like a 1.1B decoder LLM (about 2.2 GB)
  many_small  20,000 float32 tensors of 64 to 4,096 elements (about 0.17 GB)

Every measurement runs in a fresh subprocess (so peak RSS is its own), after re-reading
the input into the page cache; the figure is the median of the rounds. Printed: seconds,
peak RSS, and the ratios the foundation issue sets targets for:
  open-only      torchless.open + list  vs torch.load(mmap=True)           target >= 4x faster
  full read      torchless.load(mmap=False) + every tensor's bytes vs numpy.fromfile   target <= 1.2x
  save           torchless.save vs raw write() of the same bytes            target <= 1.2x
  info (CLI)     `torchless info` vs `python -c 'import torch; torch.load(P, mmap=True)'`  target >= 10x faster
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PY = sys.executable


def gen_llm(path: str) -> None:
    import torch

    torch.manual_seed(0)
    h, inter, kv, vocab, layers = 2048, 5632, 256, 32000, 22
    sd = {"model.embed_tokens.weight": torch.empty(vocab, h, dtype=torch.bfloat16).normal_()}
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes = {
            "self_attn.q_proj.weight": (h, h),
            "self_attn.k_proj.weight": (kv, h),
            "self_attn.v_proj.weight": (kv, h),
            "self_attn.o_proj.weight": (h, h),
            "mlp.gate_proj.weight": (inter, h),
            "mlp.up_proj.weight": (inter, h),
            "mlp.down_proj.weight": (h, inter),
            "input_layernorm.weight": (h,),
            "post_attention_layernorm.weight": (h,),
        }
        for k, s in shapes.items():
            sd[p + k] = torch.empty(*s, dtype=torch.bfloat16).normal_()
    sd["model.norm.weight"] = torch.ones(h, dtype=torch.bfloat16)
    sd["lm_head.weight"] = torch.empty(vocab, h, dtype=torch.bfloat16).normal_()
    torch.save(sd, path)


def gen_many_small(path: str) -> None:
    import torch

    g = torch.Generator().manual_seed(0)
    sd = {}
    for i in range(20000):
        n = int(torch.randint(64, 4097, (1,), generator=g))
        sd[f"blocks.{i // 10}.p{i % 10}.weight"] = torch.randn(n, generator=g)
    torch.save(sd, path)


# -- child programs: each prints one JSON line {"t": seconds, "rss": peak bytes} -----------
PRELUDE = r"""
import json, os, sys, time
def peak():
    with open('/proc/self/status') as f:
        for line in f:
            if line.startswith('VmHWM:'):
                return int(line.split()[1]) * 1024
    return 0
P = sys.argv[1]
"""

CHILD = {
    "torchless_open": """
import torchless, torchless.formats.registry as reg
reg.handlers()  # import-time work (format handlers), outside the timing like `import torch`
t = time.perf_counter()
with torchless.open(P) as a:
    rows = [(n, x.dtype.name, tuple(x.shape), x.nbytes) for n, x in a.tensors()]
t = time.perf_counter() - t
""",
    "torch_open_mmap": """
import torch
t = time.perf_counter()
sd = torch.load(P, mmap=True, weights_only=True)
rows = [(n, x.dtype, tuple(x.shape)) for n, x in sd.items()]
t = time.perf_counter() - t
""",
    "numpy_fromfile": """
import numpy as np
t = time.perf_counter()
buf = np.fromfile(P, dtype=np.uint8)
t = time.perf_counter() - t
""",
    "torchless_read_eager": """
import torchless
t = time.perf_counter()
sd = torchless.load(P, mmap=False)
arrs = [x.storage.bytes() for x in sd.values()]
t = time.perf_counter() - t
""",
    "torchless_read_mmap": """
import numpy as np, torchless
t = time.perf_counter()
sd = torchless.load(P)
tot = 0
for x in sd.values():
    tot += int(np.frombuffer(x.storage.bytes(), np.uint8)[::4096].sum())
t = time.perf_counter() - t
""",
    "torch_load": """
import torch
t = time.perf_counter()
sd = torch.load(P, weights_only=True)
t = time.perf_counter() - t
""",
    "torch_load_mmap_read": """
import torch
t = time.perf_counter()
sd = torch.load(P, mmap=True, weights_only=True)
tot = 0
for x in sd.values():
    tot += int(x.view(-1).view(torch.uint8)[::4096].sum())
t = time.perf_counter() - t
""",
    "torchless_save": """
import torchless
sd = torchless.load(P)
for x in sd.values():
    x.storage.bytes()
out = P + '.out'
t = time.perf_counter()
torchless.save(sd, out)
t = time.perf_counter() - t
os.unlink(out)
""",
    "torch_save": """
import torch
sd = torch.load(P, weights_only=True)
out = P + '.out'
t = time.perf_counter()
torch.save(sd, out)
t = time.perf_counter() - t
os.unlink(out)
""",
    "raw_write": """
import numpy as np
buf = np.fromfile(P, dtype=np.uint8)
out = P + '.out'
t = time.perf_counter()
with open(out, 'wb') as f:
    f.write(memoryview(buf))
t = time.perf_counter() - t
os.unlink(out)
""",
}


def warm(path: str) -> None:
    with open(path, "rb") as f:
        while f.read(1 << 24):
            pass


def child(name: str, path: str) -> dict:
    code = PRELUDE + CHILD[name] + "\nprint(json.dumps({'t': t, 'rss': peak()}))\n"
    warm(path)
    out = subprocess.run([PY, "-c", code, path], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def wall(cmd: list[str], path: str) -> float:
    warm(path)
    t = time.perf_counter()
    subprocess.run(cmd, capture_output=True, check=True)
    return time.perf_counter() - t


def median_of(rounds: int, fn) -> dict:  # type: ignore[no-untyped-def]
    runs = [fn() for _ in range(rounds)]
    if isinstance(runs[0], dict):
        return {"t": statistics.median(r["t"] for r in runs), "rss": statistics.median(r["rss"] for r in runs)}
    return {"t": statistics.median(runs), "rss": 0}


def fmt(r: dict) -> str:
    rss = f"{r['rss'] / 2**20:8.0f} MiB" if r["rss"] else " " * 12
    return f"{r['t']:9.3f} s {rss}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--only", choices=["llm", "many_small"])
    ap.add_argument("--data", default=os.path.join(HERE, "_data"))
    args = ap.parse_args()
    os.makedirs(args.data, exist_ok=True)
    # an installed package runs from bytecode; an editable checkout under
    # PYTHONDONTWRITEBYTECODE=1 would recompile torchless on every CLI start
    import compileall

    import torchless

    compileall.compile_dir(os.path.dirname(torchless.__file__), quiet=1)
    fixtures = {"llm": gen_llm, "many_small": gen_many_small}
    tl = os.path.join(os.path.dirname(PY), "torchless")
    for name, gen in fixtures.items():
        if args.only and name != args.only:
            continue
        path = os.path.join(args.data, f"{name}.pt")
        if not os.path.exists(path):
            print(f"generating {path} ...", flush=True)
            gen(path)
        size = os.path.getsize(path)
        rounds = args.rounds if name == "many_small" else max(3, args.rounds // 2 + 1)
        print(f"\n## {name}: {size / 1e9:.2f} GB, median of {rounds} rounds")
        res = {}
        for key in CHILD:
            res[key] = median_of(rounds, lambda key=key, path=path: child(key, path))
        res["torchless_info"] = median_of(rounds, lambda path=path: wall([tl, "info", path], path))
        res["torch_oneliner"] = median_of(
            rounds, lambda path=path: wall([PY, "-c", f"import torch; torch.load({path!r}, mmap=True)"], path)
        )
        for k, v in res.items():
            print(f"  {k:24s} {fmt(v)}")
        print("  ratios (>1 means torchless is faster; targets in brackets)")
        print(
            "    open-only vs torch.load(mmap=True):     "
            f"{res['torch_open_mmap']['t'] / res['torchless_open']['t']:7.1f}x   [>= 4x]"
        )
        print(
            "    eager full read vs numpy.fromfile:      "
            f"{res['numpy_fromfile']['t'] / res['torchless_read_eager']['t']:7.2f}x   [>= 1/1.2 = 0.83x]"
        )
        print(f"    eager full read vs torch.load:          {res['torch_load']['t'] / res['torchless_read_eager']['t']:7.2f}x")
        print(
            "    mmap full read vs torch mmap + read:    "
            f"{res['torch_load_mmap_read']['t'] / res['torchless_read_mmap']['t']:7.2f}x"
        )
        print(
            f"    save vs raw write():                    {res['raw_write']['t'] / res['torchless_save']['t']:7.2f}x   [>= 0.83x]"
        )
        print(f"    save vs torch.save:                     {res['torch_save']['t'] / res['torchless_save']['t']:7.2f}x")
        print(
            "    `torchless info` vs torch one-liner:    "
            f"{res['torch_oneliner']['t'] / res['torchless_info']['t']:7.1f}x   [>= 10x]"
        )


if __name__ == "__main__":
    main()
