"""Hostile ``.pt2`` files that ask the interpreter for huge allocations or an endless loop
(interp/limits.py): each is a real exported program (torch.export) with one field of its
``models/model.json`` edited, run in a child process whose address space is capped 1 GiB
above what it maps after its imports, under a timeout. Each must end at once with a
LimitError (exit 2 and one line on the CLI). Before the caps, the allocations failed with a
MemoryError reported as a torchless bug (InternalError) and the loop never ended.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch exports the programs the files are made from")

SRC = Path(__file__).resolve().parents[2] / "src"
HUGE = 2**40


class _Growers(torch.nn.Module):
    """One node per allocation class: a factory with a symbolic size, one with literal sizes,
    ``repeat_interleave``, ``histc`` and ``expand`` + ``clone``."""

    def forward(self, x):
        a = torch.ones(x.shape[0], 3)
        b = torch.zeros(4, 3)
        c = x.repeat_interleave(2, dim=0)
        h = torch.histc(x, bins=10)
        e = x[:1, :1].expand(4, 3).clone()
        return a.sum() + b.sum() + c.sum() + h.sum() + e.sum()


class _Loop(torch.nn.Module):
    def forward(self, x):
        from torch._higher_order_ops.while_loop import while_loop

        def cond(i, y):
            return i < 3

        def body(i, y):
            return i + 1, y + 1.0

        _i, y = while_loop(cond, body, (torch.tensor(0), x))
        return y


def _edit(src: Path, dst: Path, change) -> Path:
    """``src`` with its program JSON changed by ``change(obj)``, every other member as is."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            data = zin.read(info.filename)
            if info.filename.endswith("/models/model.json"):
                obj = json.loads(data)
                change(obj)
                data = json.dumps(obj).encode()
            zout.writestr(info.filename, data)
    return dst


def _nodes(obj):
    """Every node of the program, its subgraphs' included."""
    stack = [obj["graph_module"]["graph"]]
    while stack:
        g = stack.pop()
        for n in g["nodes"]:
            yield n
            for i in n["inputs"]:
                sub = i["arg"].get("as_graph") if isinstance(i["arg"], dict) else None
                if sub:
                    stack.append(sub["graph"])


def _set(target: str, name: str, value):
    """Set input ``name`` of the one node calling ``target`` to ``value`` (a serialized argument)."""

    def change(obj):
        (node,) = [n for n in _nodes(obj) if n["target"] == target and any(i["name"] == name for i in n["inputs"])]
        (inp,) = [i for i in node["inputs"] if i["name"] == name]
        inp["arg"] = value(inp["arg"]) if callable(value) else value

    return change


def _sym_size(arg):
    arg["as_sym_ints"][1] = {"as_int": HUGE}
    return arg


def _body_add(obj):
    """The body's ``i + 1`` made ``i + 0``: the counter never grows, ``i < 3`` stays true."""
    (inp,) = [
        i
        for n in _nodes(obj)
        if n["target"] == "torch.ops.aten.add.Tensor"
        for i in n["inputs"]
        if i["name"] == "other" and i["arg"] == {"as_int": 1}
    ]
    inp["arg"] = {"as_int": 0}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("memcap")
    ep = torch.export.export(_Growers(), (torch.randn(5, 2),), dynamic_shapes={"x": {0: torch.export.Dim.AUTO}})
    base = d / "grow.pt2"
    torch.export.save(ep, base)
    loop = d / "loop.pt2"
    torch.export.save(torch.export.export(_Loop(), (torch.randn(5, 2),)), loop)
    np.savez(d / "in.npz", arg0=np.ones((5, 2), np.float32))
    return {
        "dir": d,
        "base": base,
        "loop_base": loop,
        "factory_literal": _edit(
            base, d / "factory_literal.pt2", _set("torch.ops.aten.zeros.default", "size", {"as_ints": [HUGE, 3]})
        ),
        "factory_symbolic": _edit(base, d / "factory_symbolic.pt2", _set("torch.ops.aten.ones.default", "size", _sym_size)),
        "repeat_interleave": _edit(
            base, d / "repeat_interleave.pt2", _set("torch.ops.aten.repeat_interleave.self_int", "repeats", {"as_int": HUGE})
        ),
        "histc": _edit(base, d / "histc.pt2", _set("torch.ops.aten.histc.default", "bins", {"as_int": HUGE})),
        "expand_clone": _edit(
            base, d / "expand_clone.pt2", _set("torch.ops.aten.expand.default", "size", {"as_ints": [2**20, 2**20]})
        ),
        "loop": _edit(loop, d / "loop_forever.pt2", _body_add),
    }


_CHILD = r"""
import contextlib, io, json, resource, sys, time
import numpy as np
import torchless
from torchless.cli.main import main
from torchless.core.errors import TorchlessError

vm = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmSize:")) << 10
resource.setrlimit(resource.RLIMIT_AS, (vm + (1 << 30), vm + (1 << 30)))
inputs, iters, names = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
extra = ["--max-iterations", str(iters)] if iters else []
if iters:
    from torchless.interp.limits import RunLimits, run_limits
    limited = lambda: run_limits(RunLimits(max_iterations=iters))
else:
    limited = contextlib.nullcontext
out = {}
for path in names:
    t0 = time.perf_counter()
    err, res = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(res):
        rc = main(["run", path, "--inputs", inputs, *extra])
    cli = time.perf_counter() - t0
    t0 = time.perf_counter()
    try:
        with limited():
            api = repr(torchless.load(path).module()(np.ones((5, 2), np.float32)))
    except TorchlessError as e:
        api = f"{type(e).__name__}: {e}"
    except MemoryError as e:
        api = f"MemoryError: {e}"
    api_s = time.perf_counter() - t0
    out[path] = {"rc": rc, "err": err.getvalue(), "out": res.getvalue(), "cli_s": cli, "api": api, "api_s": api_s}
print(json.dumps(out))
"""


def _run(files, names: list[str], timeout: float, iterations: int = 0) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]), OPENBLAS_NUM_THREADS="1")
    paths = [str(files[n]) for n in names]
    p = subprocess.run(
        [sys.executable, "-c", _CHILD, str(files["dir"] / "in.npz"), str(iterations), *paths],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    res = json.loads(p.stdout)
    return {n: res[str(files[n])] for n in names}


GROWERS = ["factory_literal", "factory_symbolic", "repeat_interleave", "histc", "expand_clone"]


def test_huge_allocations_end_at_once_with_a_limit_error(files):
    res = _run(files, ["base", *GROWERS], timeout=120)
    assert res["base"]["rc"] == 0, res["base"]["err"]  # the unedited program runs
    for name in GROWERS:
        r = res[name]
        assert r["rc"] == 2, (name, r)
        lines = r["err"].strip().splitlines()
        assert len(lines) == 1, (name, r["err"])
        assert "too large for the interpreter's cap" in lines[0], (name, lines[0])
        assert str(files[name]) in lines[0], (name, lines[0])  # names the file
        assert "at node" in lines[0], (name, lines[0])  # and the node
        assert r["api"].startswith("LimitError:"), (name, r["api"])
        assert r["cli_s"] < 2 and r["api_s"] < 2, (name, r["cli_s"], r["api_s"])


def test_endless_while_loop_stops_at_the_iteration_cap(files):
    # a cap of 1,000 (the default, 100,000, takes ~6 s at ~60 us an iteration on one core)
    res = _run(files, ["loop_base", "loop"], timeout=60, iterations=1000)
    assert res["loop_base"]["rc"] == 0, res["loop_base"]["err"]
    r = res["loop"]
    assert r["rc"] == 2, r
    (line,) = r["err"].strip().splitlines()
    assert "while_loop ran too many iterations" in line and str(files["loop"]) in line, line
    assert r["api"].startswith("LimitError:") and "1000 iterations" in r["api"], r["api"]
    assert r["cli_s"] < 2 and r["api_s"] < 2, (r["cli_s"], r["api_s"])


def test_default_caps():
    from torchless.interp.limits import RUN_LIMITS

    assert (RUN_LIMITS.max_elements, RUN_LIMITS.max_bytes, RUN_LIMITS.max_iterations) == (2**31, 16 << 30, 100_000)
