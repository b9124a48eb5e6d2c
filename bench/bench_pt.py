"""Eager checkpoints: torchless beside torch, NumPy and raw I/O, measured in one run by
bench/harness.py (fresh processes, warm page cache, interleaved rounds, medians, ratios).

Usage: python bench/bench_pt.py [--rounds N] [--only llm,many_small] [--llm-scale S] [--md FILE]
                                [--cases save,read,...]

Fixtures (generated with torch on first use into bench/_data/, not committed):
  llm         201 bfloat16 tensors shaped like a 1.1B decoder LLM (2.2 GB); --llm-scale
              scales the vocabulary and the layer count down (0.25: about 0.55 GB, for a
              shared machine), keeping 201 tensors' worth of shapes per layer
  many_small  20,000 float32 tensors of 64 to 4,096 elements (about 0.17 GB)

Cases and ratios (goals from the foundation issue and issue 12):
  open     torchless.open + list            vs torch.load(mmap=True) + list        >= 4x faster
  read     torchless.load(mmap=False) + bytes vs numpy.fromfile                    <= 1.2x (llm)
  save     torchless.save                   vs raw write() of the same buffers     <= 1.15x (llm)
           (--zlib-crc: also with TORCHLESS_CRC=zlib, the CRC-32s from CPython's zlib)
  tsave    torchless.save                   vs torch.save                           (faster is better)
  info     `torchless info` (CLI)           vs python -c "import torch; torch.load(P, mmap=True)"  >= 10x faster
"""

from __future__ import annotations

import argparse
import compileall
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import PY, ROOT, SHARED_CASES, Harness  # noqa: E402

GEN = r"""
import sys, torch
kind, path, scale = sys.argv[1], sys.argv[2], float(sys.argv[3])
if kind == "llm":
    torch.manual_seed(0)
    h, inter, kv = 2048, 5632, 256
    vocab, layers = int(32000 * scale), max(1, round(22 * scale))
    sd = {"model.embed_tokens.weight": torch.empty(vocab, h, dtype=torch.bfloat16).normal_()}
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes = {
            "self_attn.q_proj.weight": (h, h), "self_attn.k_proj.weight": (kv, h),
            "self_attn.v_proj.weight": (kv, h), "self_attn.o_proj.weight": (h, h),
            "mlp.gate_proj.weight": (inter, h), "mlp.up_proj.weight": (inter, h),
            "mlp.down_proj.weight": (h, inter), "input_layernorm.weight": (h,),
            "post_attention_layernorm.weight": (h,),
        }
        for k, s in shapes.items():
            sd[p + k] = torch.empty(*s, dtype=torch.bfloat16).normal_()
    sd["model.norm.weight"] = torch.ones(h, dtype=torch.bfloat16)
    sd["lm_head.weight"] = torch.empty(vocab, h, dtype=torch.bfloat16).normal_()
else:
    g = torch.Generator().manual_seed(0)
    sd = {}
    for i in range(20000):
        n = int(torch.randint(64, 4097, (1,), generator=g))
        sd[f"blocks.{i // 10}.p{i % 10}.weight"] = torch.randn(n, generator=g)
torch.save(sd, path)
"""

CODE = {
    **SHARED_CASES,  # torchless_read, numpy_fromfile, torchless_save, raw_write
    "torchless_open": """
import torchless, torchless.formats.registry as reg
reg.handlers()  # import-time work (the format handlers), outside the timing like `import torch`
t = start()
with torchless.open(P) as a:
    rows = [(n, x.dtype.name, tuple(x.shape)) for n, x in a.tensors()]
done(time.perf_counter() - t)
""",
    "torch_open_mmap": """
import torch
t = start()
sd = torch.load(P, mmap=True, weights_only=True)
rows = [(n, x.dtype, tuple(x.shape)) for n, x in sd.items()]
done(time.perf_counter() - t)
""",
    "torch_save": """
import os, torch
sd = torch.load(ARGS[0], weights_only=True)
t = start()
torch.save(sd, ARGS[1])
done(time.perf_counter() - t)
os.unlink(ARGS[1])
""",
}

CASES = ["open", "read", "save", "tsave", "info"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--only", default="llm,many_small")
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--llm-scale", type=float, default=1.0)
    ap.add_argument("--data", default=os.path.join(ROOT, "bench", "_data"))
    ap.add_argument("--md", default=None, help="also write the Markdown tables here")
    ap.add_argument("--out-dir", default=None, help="where the save cases write (default: the fixture folder)")
    ap.add_argument("--zlib-crc", action="store_true", help="also time save with TORCHLESS_CRC=zlib (no libdeflate)")
    a = ap.parse_args()
    cases = set(a.cases.split(","))
    os.makedirs(a.data, exist_ok=True)
    compileall.compile_dir(os.path.join(ROOT, "src", "torchless"), quiet=1)  # as an installed package runs
    h = Harness(rounds=a.rounds, warmup=a.warmup)
    for name in a.only.split(","):
        tag = name if name != "llm" or a.llm_scale == 1.0 else f"llm_x{a.llm_scale:g}"
        path = os.path.join(a.data, f"{tag}.pt")
        if not os.path.exists(path):
            print(f"generating {path} ...", file=sys.stderr, flush=True)
            subprocess.run([PY, "-c", GEN, name, path, str(a.llm_scale)], check=True)
        out = os.path.join(a.out_dir, os.path.basename(path) + ".out") if a.out_dir else path + ".out"
        goal_read, goal_save = (1.2, 1.15) if name == "llm" else (2.5, 4)

        def c(case: str, *, args: list[str] | None = None, tag: str = tag, path: str = path) -> str:
            h.case(f"{tag}:{case}", CODE[case], args=args or [path], warm=[path])
            return f"{tag}:{case}"

        if "open" in cases:
            x, y = c("torchless_open"), c("torch_open_mmap")
            h.ratio(f"{tag}: open + list vs torch.load(mmap=True)", x, y, goal=4, better="higher")
        if "read" in cases:
            x, y = c("torchless_read"), c("numpy_fromfile")
            h.ratio(f"{tag}: eager read vs numpy.fromfile", x, y, goal=goal_read)
            h.ratio(f"{tag}: eager read vs numpy.fromfile (CPU seconds)", x, y, goal=goal_read, key="cpu")
        if "save" in cases or "tsave" in cases:
            x = c("torchless_save", args=[path, out])
            if "save" in cases:
                y = c("raw_write", args=[path, out])
                h.ratio(f"{tag}: save vs raw write()", x, y, goal=goal_save)
                h.ratio(f"{tag}: save vs raw write() (CPU seconds)", x, y, goal=goal_save, key="cpu")
                if a.zlib_crc:  # the same save with CPython's zlib computing the CRC-32s
                    z = f"{tag}:torchless_save_zlib_crc"
                    h.case(z, CODE["torchless_save"], args=[path, out], warm=[path], env={"TORCHLESS_CRC": "zlib"})
                    h.ratio(f"{tag}: save with zlib's CRC vs raw write()", z, y, goal=goal_save)
                    h.ratio(f"{tag}: save with zlib's CRC vs raw write() (CPU seconds)", z, y, goal=goal_save, key="cpu")
            if "tsave" in cases:
                y = c("torch_save", args=[path, out])
                h.ratio(f"{tag}: save vs torch.save", x, y, better="higher")
        if "info" in cases:
            h.case(f"{tag}:torchless_info", argv=[PY, "-m", "torchless.cli.main", "info", path], warm=[path], whole_process=True)
            h.case(
                f"{tag}:torch_oneliner",
                argv=[PY, "-c", f"import torch; torch.load({path!r}, mmap=True)"],
                warm=[path],
                whole_process=True,
            )
            h.ratio(
                f"{tag}: `torchless info` vs torch one-liner",
                f"{tag}:torchless_info",
                f"{tag}:torch_oneliner",
                goal=10,
                better="higher",
            )
    h.run()
    md = h.markdown()
    print(md)
    if a.md:
        with open(a.md, "w") as f:
            f.write(md + "\n")


if __name__ == "__main__":
    main()
