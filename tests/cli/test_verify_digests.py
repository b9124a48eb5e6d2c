"""``verify`` on formats without a checksum (issue 36 item 8): it says so, and
``--sha256``/``--manifest`` see a flipped byte that the format's own checks cannot."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import torchless
from torchless.cli.main import main
from torchless.cli.schemas import SCHEMAS, validate

SAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "samples")
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def _sha(path) -> str:
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def _flip(path, at=-3) -> None:
    b = bytearray(open(path, "rb").read())
    b[at] ^= 0x01
    open(path, "wb").write(bytes(b))


@pytest.fixture
def st(tmp_path):
    from safetensors.numpy import save_file

    p = tmp_path / "w.safetensors"
    save_file({"a": np.arange(64, dtype=np.float32)}, p)
    return p


def test_flipped_safetensors_byte_as_a_user_types_it(st, tmp_path):
    want = _sha(st)
    _flip(st)
    env = {**os.environ, "PYTHONPATH": os.path.join(ROOT, "src")}

    def cli(*argv):
        return subprocess.run(
            [sys.executable, "-m", "torchless", *argv], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
        )

    r = cli("verify", "w.safetensors")  # the format cannot tell: OK, and it says why
    assert r.returncode == 0 and "this format carries no checksum" in r.stdout
    r = cli("verify", "w.safetensors", "--sha256", want)
    assert r.returncode == 1 and "sha256-mismatch" in r.stdout and "w.safetensors" in r.stdout and "FAILED" in r.stdout
    r = cli("verify", "w.safetensors", "--sha256", _sha(st))
    assert r.returncode == 0 and "1 of 1 files match" in r.stdout


def test_zip_formats_declare_their_checksum(capsys):
    assert main(["verify", os.path.join(SAMPLES, "checkpoint.pt")]) == 0
    assert "carries no checksum" not in capsys.readouterr().out
    assert main(["formats", "--json"]) == 0
    decl = {f["name"]: f["checksum"] for f in json.loads(capsys.readouterr().out)}
    assert decl["safetensors"] is None and decl["onnx"] is None and "CRC-32" in decl["pt"]


def test_onnx_external_data_flip_seen_by_manifest(tmp_path, capsys):
    w = tmp_path / "w.safetensors"
    assert main(["convert", os.path.join(SAMPLES, "mlp.onnx"), str(w)]) == 0
    model = tmp_path / "m.onnx"
    argv = ["onnx", "set-weights", os.path.join(SAMPLES, "mlp.onnx"), str(w), "-o", str(model)]
    assert main([*argv, "--external-data", "--size-threshold", "0"]) == 0
    data = [n for n in os.listdir(tmp_path) if n.startswith("m.onnx") and n != "m.onnx"]
    assert len(data) == 1
    (tmp_path / "SHA256SUMS").write_text(f"{_sha(model)}  m.onnx\n{_sha(tmp_path / data[0])} *{data[0]}\n")
    capsys.readouterr()
    assert main(["verify", str(model), "--manifest", str(tmp_path / "SHA256SUMS")]) == 0
    _flip(tmp_path / data[0], at=len((tmp_path / data[0]).read_bytes()) // 2)
    assert main(["verify", str(model)]) == 0  # the format's own checks pass: no checksum
    assert "carries no checksum" in capsys.readouterr().out
    assert main(["verify", str(model), "--manifest", str(tmp_path / "SHA256SUMS"), "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    validate(out, SCHEMAS["verify"])
    bad = [p for p in out["problems"] if p["code"] == "sha256-mismatch"]
    assert len(bad) == 1 and bad[0]["member"].endswith(data[0]) and not out["ok"]
    assert [d["ok"] for d in out["digests"]] == [True, False]


def test_folder_with_manifest(tmp_path, capsys):
    folder = tmp_path / "hf"
    assert (
        main(["convert", os.path.join(SAMPLES, "state_dict.pt"), str(folder / "model.safetensors"), "--max-shard-size", "8KB"])
        == 0
    )
    names = sorted(os.listdir(folder))
    sums = folder / "SHA256SUMS"
    sums.write_text("".join(f"{_sha(folder / n)}  {n}\n" for n in names))
    capsys.readouterr()
    assert main(["verify", str(folder), "--manifest", str(sums)]) == 0
    assert f"{len(names)} of {len(names)} files match" in capsys.readouterr().out
    (folder / "stray.txt").write_text("x")
    shard = next(n for n in names if n.endswith(".safetensors"))
    _flip(folder / shard)
    assert main(["verify", str(folder), "--manifest", str(sums)]) == 1
    out = capsys.readouterr().out
    assert f"sha256-mismatch [{folder / shard}]" in out and "not-in-manifest" in out and "stray.txt" in out


def test_listed_file_missing(st, tmp_path, capsys):
    sums = tmp_path / "SUMS"
    sums.write_text(f"{_sha(st)}  w.safetensors\n{'0' * 64}  gone.bin\n")
    assert main(["verify", str(st), "--manifest", str(sums)]) == 1
    out = capsys.readouterr().out
    assert f"sha256-missing [{tmp_path / 'gone.bin'}]" in out and "1 of 2 files match" in out


def test_bad_digest_inputs_exit_2(st, tmp_path, capsys):
    assert main(["verify", str(st), "--sha256", "abc"]) == 2
    assert "64 hexadecimal digits" in capsys.readouterr().err
    bad = tmp_path / "SUMS"
    bad.write_text("not a digest line\n")
    assert main(["verify", str(st), "--manifest", str(bad)]) == 2
    assert "line 1" in capsys.readouterr().err
    assert main(["verify", SAMPLES + "/dcp_ckpt", "--sha256", "0" * 64]) == 2
    assert "--manifest" in capsys.readouterr().err
    from torchless.io.digests import check_digests

    with pytest.raises(torchless.UsageError, match="local files only"):
        check_digests("memory://bucket/w.safetensors", sha256="0" * 64)
