"""The generic CLI commands on eager checkpoints: info, ls, convert, diff, verify."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import torchless
from torchless.cli.main import main
from torchless.container.zip import ZipReader

torch = pytest.importorskip("torch", reason="torch writes the fixtures and is the oracle")


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    sd = model.state_dict()
    sd["emb"] = torch.randn(5, 4).to(torch.bfloat16)
    sd["idx"] = torch.arange(6, dtype=torch.int64)
    path = d / "model.pt"
    torch.save(sd, path)
    return path


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_info_and_json(capsys, ckpt):
    code, out, err = run(capsys, "info", ckpt)
    assert code == 0 and "pt" in out and "little" in out
    code, out, err = run(capsys, "info", ckpt, "--json")
    assert code == 0
    info = json.loads(out)
    assert info["format"] == "pt" and info["layout"] == "zip" and info["storages"] == 6
    assert info["archive_prefix"] == "model"
    assert info["records"]["version"] == "3"  # trimmed (the record holds "3\n")


def test_ls(capsys, ckpt):
    code, out, _ = run(capsys, "ls", ckpt)
    assert code == 0
    assert "0.weight" in out and "bfloat16" in out
    code, out, _ = run(capsys, "ls", ckpt, "--json")
    rows = {r["name"]: r for r in json.loads(out)}
    assert rows["emb"] == {"name": "emb", "dtype": "bfloat16", "shape": [5, 4], "nbytes": 40}


def test_convert_round_trip_preserves_bfloat16(capsys, ckpt, tmp_path):
    from safetensors.torch import load_file

    st = tmp_path / "m.safetensors"
    npz = tmp_path / "m.npz"
    back = tmp_path / "back.pt"
    assert run(capsys, "convert", ckpt, st)[0] == 0
    assert run(capsys, "convert", st, npz)[0] == 0
    assert run(capsys, "convert", npz, back)[0] == 0
    expect = torch.load(ckpt, weights_only=True)
    via_st = load_file(str(st))
    got = torch.load(back, weights_only=True)
    for k, v in expect.items():
        assert via_st[k].dtype == v.dtype and torch.equal(via_st[k], v)
        assert got[k].dtype == v.dtype and torch.equal(got[k], v), k
    code, out, _ = run(capsys, "diff", ckpt, back)
    assert code == 0 and "0 changed" in out
    # npz stores bfloat16 as np.save does (|V2) and names it in the member comment
    with np.load(npz) as z:
        assert z["emb"].dtype == np.dtype("V2")
        assert torch.equal(
            torch.from_numpy(z["emb"].view(np.uint16).astype(np.int32)), expect["emb"].view(torch.int16).to(torch.int32) & 0xFFFF
        )
    assert torchless.open(npz)["emb"].dtype.name == "bfloat16"


def test_diff_reports_changes(capsys, ckpt, tmp_path):
    sd = torch.load(ckpt, weights_only=True)
    sd["0.bias"] = sd["0.bias"] + 1
    del sd["idx"]
    sd["new"] = torch.zeros(2)
    sd["emb"] = sd["emb"].float()
    other = tmp_path / "other.pt"
    torch.save(sd, other)
    code, out, _ = run(capsys, "diff", ckpt, other)
    assert code == 1
    assert (
        "+ new" in out
        and "- idx" in out
        and "~ 0.bias: values (max abs diff 1)" in out
        and "~ emb: bfloat16[5, 4] -> float32[5, 4]" in out
    )
    code, out, _ = run(capsys, "diff", ckpt, other, "--json")
    res = json.loads(out)
    assert res["added"] == ["new"] and res["removed"] == ["idx"] and {c["name"] for c in res["changed"]} == {"0.bias", "emb"}
    assert run(capsys, "diff", ckpt, other, "--atol", "2")[0] == 1  # dtype change stays a change


def test_verify(capsys, ckpt, tmp_path):
    code, out, _ = run(capsys, "verify", ckpt)
    assert code == 0 and "OK" in out
    data = bytearray(ckpt.read_bytes())
    zr = ZipReader(bytes(data))
    off = zr.data_offset(zr.get("data/0"))
    data[off] ^= 0x55
    bad = tmp_path / "bad.pt"
    bad.write_bytes(bytes(data))
    code, out, _ = run(capsys, "verify", bad)
    assert code == 1 and "crc" in out and "FAILED" in out
    code, out, _ = run(capsys, "verify", bad, "--json")
    res = json.loads(out)
    assert res["ok"] is False and res["problems"][0]["member"] == "model/data/0"


def test_user_errors_one_line_exit_2(capsys, tmp_path):
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"\x00" * 64)
    for argv in (
        ["info", tmp_path / "missing.pt"],
        ["ls", junk],
        ["info", tmp_path],
        ["convert", junk, tmp_path / "x.safetensors"],
    ):
        code, out, err = run(capsys, *argv)
        assert code == 2, argv
        assert err.count("\n") == 1 and err.startswith("torchless: error:") and "Traceback" not in err, err
    assert run(capsys, "bogus-command")[0] == 2


def test_module_entry_point_subprocess(tmp_path, ckpt):
    env = dict(os.environ)
    r = subprocess.run(
        [sys.executable, "-m", "torchless", "info", str(tmp_path / "nope.pt")],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    evil = tmp_path / "evil.pt"
    from torchless.container.zip import TorchZipWriter

    with TorchZipWriter(evil) as zw:
        zw.write("data.pkl", b"\x80\x02cos\nsystem\nX\x05\x00\x00\x00touch\x85R.")
        zw.write("version", b"3\n")
    r = subprocess.run([sys.executable, "-m", "torchless", "ls", str(evil)], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0 and "Traceback" not in r.stderr  # placeholders, nothing run
    r = subprocess.run(
        [sys.executable, "-m", "torchless", "ls", "--json", str(ckpt)], capture_output=True, text=True, env=env, timeout=120
    )
    assert r.returncode == 0 and len(json.loads(r.stdout)) == 6


def test_convert_to_unknown_format_lists_the_writable_ones(capsys, ckpt, tmp_path):
    # issue 36 bug 6: --to banana listed every format, most of which cannot be written
    from torchless.formats.dispatch import writable_formats

    dst = tmp_path / "x.out"
    code, out, err = run(capsys, "convert", ckpt, dst, "--to", "banana")
    assert code == 2 and err.count("\n") == 1 and "'banana'" in err
    listed = err.split("writes tensors: ", 1)[1].split(")", 1)[0].split(", ")
    assert listed == writable_formats() and "onnx" not in listed and "pt" in listed
    code, out, err = run(capsys, "convert", ckpt, dst, "--to", "onnx")  # known, not writable: says so
    assert code == 2 and "onnx cannot write tensors" in err
    assert not dst.exists()
