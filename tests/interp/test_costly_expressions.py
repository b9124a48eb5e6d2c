"""The red team's ``.pt2`` files whose expressions cost without bound (issue 30, item 5): a
guard ``round(1, -1000000000) == 0``, an input size ``Pow(10, 1000000000)`` and a guard
``'a' * 3221225472 == 'b'``. Before ``graph/bounded.py``, ``torchless run`` hung on the first
two (big-integer work in C) and built a 3 GiB string for the third; a fourth file makes the
graph's own SymInt arithmetic ``n ** 1000000000``. Each file is a real exported program
(torch.export) with one field of its ``models/model.json`` edited.

The runs happen in a child process whose address space is capped 512 MiB above what it
maps after its imports, under a timeout: on the old code the test fails instead of hanging.
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

torch = pytest.importorskip("torch", reason="torch exports the program the files are made from")

SRC = Path(__file__).resolve().parents[2] / "src"


class _Halves(torch.nn.Module):
    """A dynamic batch whose exported program carries ``guards_code`` (``max(1, n // 2) != 1``)."""

    def forward(self, x):
        n = x.shape[0]
        return x[: torch.sym_max(n // 2, 1)].sum() + n % 3


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


def _guard(text: str):
    def change(obj):
        obj["guards_code"].append(text)

    return change


def _size(expr: str):
    def change(obj):
        obj["graph_module"]["graph"]["tensor_values"]["x"]["sizes"][1] = {"as_expr": {"expr_str": expr, "hint": {"as_int": 2}}}

    return change


def _node_pow(obj):
    """The graph's ``n % 3`` (``_operator.mod``) made ``n ** 1000000000``: SymInt arithmetic
    the interpreter's kernel computes."""
    (node,) = [n for n in obj["graph_module"]["graph"]["nodes"] if n["target"] == "_operator.mod"]
    node["target"] = "_operator.pow"
    node["inputs"][1]["arg"] = {"as_int": 1000000000}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("costly")
    ep = torch.export.export(_Halves(), (torch.randn(7, 2),), dynamic_shapes={"x": {0: torch.export.Dim.AUTO}})
    base = d / "base.pt2"
    torch.export.save(ep, base)
    assert any("// 2" in g for g in json.loads(_program_json(base))["guards_code"])
    x = np.ones((7, 2), np.float32)
    np.savez(d / "in.npz", arg0=x)
    return {
        "dir": d,
        "want": float(ep.module()(torch.from_numpy(x))),
        "base": base,
        "round_true": _edit(base, d / "round_true.pt2", _guard("round(1, -1000000000) == 0")),
        "round_false": _edit(base, d / "round_false.pt2", _guard("round(1, -1000000000) == 1")),
        "pow": _edit(base, d / "pow.pt2", _size("Pow(Integer(10), Integer(1000000000))")),
        "strmul": _edit(base, d / "strmul.pt2", _guard("'a' * 3221225472 == 'b'")),
        "node_pow": _edit(base, d / "node_pow.pt2", _node_pow),
    }


def _program_json(path: Path) -> bytes:
    with zipfile.ZipFile(path) as z:
        return z.read(next(n for n in z.namelist() if n.endswith("/models/model.json")))


_CHILD = r"""
import contextlib, io, json, resource, sys, time
import numpy as np
import torchless
from torchless.cli.main import main
from torchless.core.errors import TorchlessError

vm = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmSize:")) << 10
resource.setrlimit(resource.RLIMIT_AS, (vm + (512 << 20), vm + (512 << 20)))
inputs, names = sys.argv[1], sys.argv[2:]
out = {}
for path in names:
    t0 = time.perf_counter()
    err, res = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(res):
        rc = main(["run", path, "--inputs", inputs, "--json"])
    cli = time.perf_counter() - t0
    t0 = time.perf_counter()
    try:
        api = repr(torchless.load(path).module()(np.ones((7, 2), np.float32)))
    except TorchlessError as e:
        api = f"{type(e).__name__}: {e}"
    api_s = time.perf_counter() - t0
    out[path] = {"rc": rc, "err": err.getvalue(), "out": res.getvalue(), "cli_s": cli, "api": api, "api_s": api_s}
print(json.dumps(out))
"""


def _run(files, names: list[str]) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]), OPENBLAS_NUM_THREADS="1")
    paths = [str(files[n]) for n in names]
    p = subprocess.run(
        [sys.executable, "-c", _CHILD, str(files["dir"] / "in.npz"), *paths],
        capture_output=True,
        text=True,
        timeout=90,
        env=env,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    res = json.loads(p.stdout)
    return {n: res[str(files[n])] for n in names}


def test_red_team_files_end_fast_with_an_error_naming_the_file(files):
    res = _run(files, ["base", "round_true", "round_false", "pow", "strmul", "node_pow"])
    for name, r in res.items():
        assert r["cli_s"] < 5 and r["api_s"] < 5, (name, r)
    # the program and the true guard run as torch would: round(1, -10**9) is 0, decided at once
    for name in ("base", "round_true"):
        assert res[name]["rc"] == 0, res[name]
        (row,) = json.loads(res[name]["out"])["outputs"]
        assert row["max"] == pytest.approx(files["want"])
    for name, what in (
        ("round_false", "the inputs fail a guard the program was exported under: round(1, -1000000000) == 1"),
        ("pow", "input x.shape[1] has the size '10**1000000000': expression too costly to evaluate: power"),
        ("strmul", "guard \"'a' * 3221225472 == 'b'\": expression too costly to evaluate: str * 3221225472"),
        ("node_pow", "expression too costly to evaluate: power with exponent 1000000000"),
    ):
        r = res[name]
        assert r["rc"] == 2, (name, r)
        (line,) = r["err"].strip().splitlines()  # one line, no traceback
        assert str(files[name]) in line and what in line, line
        assert str(files[name]) in r["api"] and what in r["api"], r["api"]
        if name != "round_false":  # an expression of the file over a cap: LimitError, its JSON named
            assert r["api"].startswith("LimitError") and "member 'models/model.json'" in r["api"], r["api"]
