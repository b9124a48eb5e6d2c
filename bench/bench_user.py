"""Many small tensors as a user writes it: the issue-33 table, measured by bench/harness.py.

Usage: python bench/bench_user.py [--rounds N] [--n 20000] [--data DIR] [--only a,b] [--md FILE] [--out-dir DIR]
                                 [--yardsticks] [--before CHECKOUT]

Every case is exactly the code a user writes, through the public API only, in a fresh
process (imports outside the timing, for torchless and its peer alike), and every
yardstick is the peer a user would pick instead on the same data: the ``safetensors``
package (NumPy and torch APIs), ``torch.load``/``torch.save``, ``np.savez``; plus the
physical limit, one contiguous read or write of the same bytes. Fixtures (generated with
torch on first use into bench/_data/, not committed): ``n`` float32 tensors of 64 to 4,928
elements (20,000 by default, about 0.2 GB) as ``torch.save`` (.pt) and safetensors, and an
800-tensor .pt for the ``info`` row.

Rows (torchless vs the peer; the goal is issue 33's):

  load     ``{k: v.numpy() for k, v in torchless.load(p, mmap=False).items()}`` on the
           .safetensors / the .pt           vs ``safetensors.numpy.load_file``     <= 1.0x
  list     names, dtypes, shapes through ``torchless.open(p).tensors()`` on the
           .safetensors / the .pt           vs ``safe_open(p, "np")`` listing     <= 1.0x
  save     ``torchless.save(d, "x.safetensors")`` / ``"x.pt"`` of a dict of NumPy arrays
                                            vs ``safetensors.numpy.save_file``  <= 1.0x / 1.25x
  info     ``torchless info`` of the 800-tensor .pt  vs ``python -c "import numpy"``  <= +0.1 s

Each ratio is printed twice: on the child's wall time and on its CPU seconds (user +
system, every thread). On a shared, loaded machine only the CPU figure means anything;
the goals are wall-time goals for a quiet machine.
"""

from __future__ import annotations

import argparse
import compileall
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import PY, ROOT, Harness  # noqa: E402

GEN = r"""
import sys, torch
from safetensors.torch import save_file
n, d = int(sys.argv[1]), sys.argv[2]
g = torch.Generator().manual_seed(0)
sd = {}
for i in range(n):
    k = int(torch.randint(64, 4929, (1,), generator=g))
    sd[f"blocks.{i // 10}.p{i % 10}.weight"] = torch.randn(k, generator=g)
torch.save(sd, f"{d}/many.pt")
save_file(sd, f"{d}/many.safetensors")
torch.save({f"layer{i}.weight": torch.randn(16, generator=g) for i in range(800)}, f"{d}/info800.pt")
"""

#: the torchless imports every torchless case makes before its timing (the format
#: handlers are imported on first use: import-time work, as the peer's imports are)
TL = "import torchless, torchless.formats.registry as reg\nreg.handlers()\n"
#: the save cases' input: the dict of NumPy arrays the peer's own reader gives
SAVE_INPUT = "from safetensors.numpy import load_file\nd = load_file(ARGS[0])\n"

CODE = {
    # -- load every tensor into NumPy ---------------------------------------------------
    "torchless_load": TL
    + """
t = start()
arrs = {k: v.numpy() for k, v in torchless.load(P, mmap=False).items()}
done(time.perf_counter() - t, n=len(arrs))
""",
    "st_load_file": """
from safetensors.numpy import load_file
t = start()
arrs = load_file(P)
done(time.perf_counter() - t, n=len(arrs))
""",
    "torch_load": """
import torch
t = start()
arrs = {k: v.numpy() for k, v in torch.load(P, weights_only=True).items()}
done(time.perf_counter() - t, n=len(arrs))
""",
    "raw_read": """
t = start()
with open(P, "rb", buffering=0) as f:
    buf = f.read()
done(time.perf_counter() - t)
""",
    # -- names, dtypes and shapes -------------------------------------------------------
    "torchless_list": TL
    + """
t = start()
with torchless.open(P) as a:
    rows = [(n, x.dtype.name, tuple(x.shape)) for n, x in a.tensors()]
done(time.perf_counter() - t, n=len(rows))
""",
    "st_safe_open": """
import numpy  # (imported by framework="np" on first use: outside the timing, as torchless's own import of it)
from safetensors import safe_open
t = start()
with safe_open(P, framework="np") as f:
    rows = [(k, f.get_slice(k).get_dtype(), tuple(f.get_slice(k).get_shape())) for k in f.keys()]
done(time.perf_counter() - t, n=len(rows))
""",
    # -- save a dict of NumPy arrays ----------------------------------------------------
    "torchless_save": TL
    + SAVE_INPUT
    + """
import os
t = start()
torchless.save(d, ARGS[1])
done(time.perf_counter() - t)
os.unlink(ARGS[1])
""",
    "st_save_file": SAVE_INPUT
    + """
import os
from safetensors.numpy import save_file
t = start()
save_file(d, ARGS[1])
done(time.perf_counter() - t)
os.unlink(ARGS[1])
""",
    "torch_save": SAVE_INPUT
    + """
import os, torch
t = start()
torch.save({k: torch.from_numpy(v) for k, v in d.items()}, ARGS[1])
done(time.perf_counter() - t)
os.unlink(ARGS[1])
""",
    "np_savez": SAVE_INPUT
    + """
import os, numpy as np
t = start()
np.savez(ARGS[1], **d)
done(time.perf_counter() - t)
os.unlink(ARGS[1])
""",
    "raw_write": SAVE_INPUT
    + """
import os, numpy as np
buf = np.concatenate([v.reshape(-1).view(np.uint8) for v in d.values()])
t = start()
with open(ARGS[1], "wb", buffering=0) as f:
    f.write(buf)
done(time.perf_counter() - t)
os.unlink(ARGS[1])
""",
}

ROWS = ["load", "list", "save", "info"]


def both(h: Harness, label: str, a: str, b: str, goal: float | None) -> None:
    """The ratio ``a / b`` on wall time and on CPU seconds."""
    h.ratio(label, a, b, goal=goal)
    h.ratio(label + " (CPU seconds)", a, b, goal=goal, key="cpu")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--data", default=os.path.join(ROOT, "bench", "_data"))
    ap.add_argument("--only", default=",".join(ROWS))
    ap.add_argument("--md", default=None, help="also write the Markdown tables here")
    ap.add_argument("--out-dir", default=None, help="where the save cases write (default: the fixture folder)")
    ap.add_argument("--yardsticks", action="store_true", help="also time torch.load/torch.save, np.savez and raw I/O")
    ap.add_argument(
        "--before",
        default=None,
        help="a checkout of an older torchless: its torchless cases run in the same rounds, with the speed-up printed",
    )
    a = ap.parse_args()
    only = set(a.only.split(","))
    d = os.path.join(a.data, f"user_{a.n}")
    os.makedirs(d, exist_ok=True)
    if not os.path.exists(os.path.join(d, "info800.pt")):
        print(f"generating fixtures in {d} ...", file=sys.stderr)
        subprocess.run([PY, "-c", GEN, str(a.n), d], check=True)
    pt, st, small = (os.path.join(d, x) for x in ("many.pt", "many.safetensors", "info800.pt"))
    out = a.out_dir or d
    h = Harness(rounds=a.rounds, warmup=a.warmup)
    if "load" in only:
        h.case("torchless_load_st", CODE["torchless_load"], args=[st], warm=[st])
        h.case("st_load_file", CODE["st_load_file"], args=[st], warm=[st])
        h.case("torchless_load_pt", CODE["torchless_load"], args=[pt], warm=[pt])
        both(h, "load + numpy() of every tensor, .safetensors", "torchless_load_st", "st_load_file", 1.0)
        both(h, "load + numpy() of every tensor, .pt", "torchless_load_pt", "st_load_file", 1.0)
        if a.yardsticks:
            h.case("torch_load_pt", CODE["torch_load"], args=[pt], warm=[pt])
            h.case("raw_read_st", CODE["raw_read"], args=[st], warm=[st])
            both(h, "load + numpy(), .pt, vs torch.load + numpy()", "torchless_load_pt", "torch_load_pt", None)
            both(h, "load + numpy(), .safetensors, vs one read of the file", "torchless_load_st", "raw_read_st", None)
    if "list" in only:
        h.case("torchless_list_st", CODE["torchless_list"], args=[st], warm=[st])
        h.case("st_safe_open", CODE["st_safe_open"], args=[st], warm=[st])
        h.case("torchless_list_pt", CODE["torchless_list"], args=[pt], warm=[pt])
        both(h, "names/dtypes/shapes, .safetensors", "torchless_list_st", "st_safe_open", 1.0)
        both(h, "names/dtypes/shapes, .pt", "torchless_list_pt", "st_safe_open", 1.0)
    if "save" in only:
        h.case("torchless_save_st", CODE["torchless_save"], args=[st, os.path.join(out, "x.safetensors")], warm=[st])
        h.case("st_save_file", CODE["st_save_file"], args=[st, os.path.join(out, "y.safetensors")], warm=[st])
        h.case("torchless_save_pt", CODE["torchless_save"], args=[st, os.path.join(out, "x.pt")], warm=[st])
        both(h, "save of a dict of NumPy arrays, .safetensors", "torchless_save_st", "st_save_file", 1.0)
        both(h, "save of a dict of NumPy arrays, .pt", "torchless_save_pt", "st_save_file", 1.25)
        if a.yardsticks:
            h.case("torch_save", CODE["torch_save"], args=[st, os.path.join(out, "y.pt")], warm=[st])
            h.case("np_savez", CODE["np_savez"], args=[st, os.path.join(out, "y.npz")], warm=[st])
            h.case("raw_write", CODE["raw_write"], args=[st, os.path.join(out, "y.bin")], warm=[st])
            both(h, "save .pt vs torch.save", "torchless_save_pt", "torch_save", None)
            both(h, "save .safetensors vs one write of the bytes", "torchless_save_st", "raw_write", None)
    if "info" in only:
        # compiled beforehand, as an installed package runs (the torchless the children import)
        src = os.environ.get("PYTHONPATH", "").split(os.pathsep)[0] or os.path.join(ROOT, "src")
        compileall.compile_dir(os.path.join(src, "torchless"), quiet=1)
        h.case("torchless_info", argv=[PY, "-m", "torchless", "info", small], warm=[small], whole_process=True)
        h.case("import_numpy", argv=[PY, "-c", "import numpy"], whole_process=True)
    if a.before:
        src = os.path.join(os.path.abspath(a.before), "src")
        for name in [n for n in h.cases if n.startswith("torchless_")]:
            c = h.cases[name]
            if c.argv is not None:
                compileall.compile_dir(os.path.join(src, "torchless"), quiet=1)
                h.case(name + "_before", argv=c.argv, warm=c.warm, whole_process=True, env={"PYTHONPATH": src})
            else:
                h.case(name + "_before", c.code, args=c.args, warm=c.warm, env={"PYTHONPATH": src})
            h.ratio(f"{name}: speed-up over --before (CPU seconds)", name, name + "_before", better="higher", key="cpu")
    h.run()
    md = h.markdown()
    if "info" in only:
        diff = h.median("torchless_info") - h.median("import_numpy")
        cdiff = h.median("torchless_info", "cpu") - h.median("import_numpy", "cpu")
        ok = "yes" if diff <= 0.1 else "**no**"
        md += f"\n\n`torchless info` (800 tensors) minus `import numpy`: {diff:+.3f} s wall (goal <= +0.1 s: {ok}); "
        md += f"{cdiff:+.3f} s CPU"
    print(md)
    if a.md:
        with open(a.md, "w") as f:
            f.write(md + "\n")


if __name__ == "__main__":
    main()
