"""CLI: torchless code / info / ls / convert / diff / verify / ts set-weights|extra|bytecode|tensors."""

from __future__ import annotations

import json

import numpy as np

import torchless
from torchless.cli.main import main


def test_code_command(ts_files, torch, capsys):
    path = ts_files["scripted"]
    loaded = torch.jit.load(path)
    assert main(["code", path, "--method", "forward"]) == 0
    assert capsys.readouterr().out == loaded.code
    assert main(["code", path, "--method", "forward", "--module", "sub.lin"]) == 0
    assert capsys.readouterr().out == loaded.sub.lin.code
    assert main(["code", path, "--method", "helper"]) == 0
    assert capsys.readouterr().out == loaded.helper.code
    assert main(["code", path]) == 0
    out = capsys.readouterr().out
    assert "# code/" in out and "class Linear(Module):" in out
    assert main(["code", path, "--method", "nope"]) == 2
    assert "no method" in capsys.readouterr().err


def test_generic_commands(ts_files, tmp_path, capsys):
    path = ts_files["scripted"]
    assert main(["info", path]) == 0
    out = capsys.readouterr().out
    assert "torchscript" in out and "sub.lin" not in out and "lin:" in out
    assert main(["ls", path, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    with torchless.open(path) as art:
        assert [r["name"] for r in rows] == list(art.keys())
    st = tmp_path / "w.safetensors"
    assert main(["convert", ts_files["lite"], str(st)]) == 0
    capsys.readouterr()
    from safetensors import safe_open

    with safe_open(str(st), framework="np") as f:
        meta = f.metadata() or {}
    with torchless.open(st) as w, torchless.open(path) as art:
        # tied weights (docs/hf.md): an exact alias is stored once, recorded in __metadata__
        names = set(art.keys())
        aliases = {a: k for a, k in meta.items() if a in names}
        assert aliases and sorted([*w.keys(), *aliases]) == sorted(art.keys())
        for a, k in aliases.items():
            np.testing.assert_array_equal(w[k].numpy(), art[a].numpy())
        np.testing.assert_array_equal(w[aliases.get("sub.lin.weight", "sub.lin.weight")].numpy(), art["sub.lin.weight"].numpy())
    assert main(["verify", path]) == 0
    assert main(["diff", path, ts_files["lite"]]) == 0
    capsys.readouterr()


def test_set_weights_command(ts_files, torch, tmp_path, capsys):
    src = ts_files["traced"]
    weights = tmp_path / "w.safetensors"
    torchless.save({"lin.weight": np.eye(3, dtype=np.float32), "other": np.zeros(1, np.float32)}, weights)
    extra = tmp_path / "info.txt"
    extra.write_bytes(b"v2")
    out = tmp_path / "out.pt"
    assert main(["ts", "set-weights", src, str(weights), "-o", str(out)]) == 2
    assert "other" in capsys.readouterr().err
    assert main(["ts", "set-weights", src, str(weights), "-o", str(out), "--allow-missing", "--extra", f"info.txt={extra}"]) == 0
    assert "replaced 1 tensors" in capsys.readouterr().out
    files = {"info.txt": ""}
    m = torch.jit.load(str(out), _extra_files=files)
    assert files["info.txt"] == b"v2" and torch.equal(m.lin.weight, torch.eye(3))
    assert main(["ts", "extra", str(out)]) == 0
    assert "info.txt" in capsys.readouterr().out
    assert main(["diff", src, str(out)]) == 1
    assert "~ lin.weight" in capsys.readouterr().out


def test_bytecode_and_tensors_commands(ts_files, capsys):
    assert main(["ts", "bytecode", ts_files["lite_const_v5"]]) == 0
    out = capsys.readouterr().out
    assert "bytecode version 5" in out and "aten::linear" in out and "RET" in out
    assert main(["ts", "bytecode", ts_files["lite"], "--json", "--method", "forward"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["version"] == 8 and len(d["methods"]) == 1
    assert main(["ts", "tensors", ts_files["quantized"], "--all"]) == 0
    assert "qint8" in capsys.readouterr().out
    assert main(["ts", "bytecode", ts_files["scripted"]]) == 2
