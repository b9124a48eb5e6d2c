"""Outputs of writing commands (issue 36 item 9): an existing output is refused unless
--force, which replaces it atomically (in place included); sharded outputs get their folder."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from torchless.cli.main import main

SAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "samples")
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def _cli(*argv, cwd):
    env = {**os.environ, "PYTHONPATH": os.path.join(ROOT, "src")}
    return subprocess.run(
        [sys.executable, "-m", "torchless", *map(str, argv)], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )


def test_existing_output_needs_force_as_a_user_types_it(tmp_path):
    from safetensors.numpy import load_file, save_file

    save_file({"a": np.arange(6, dtype=np.float32), "b": np.ones(3, np.int64)}, tmp_path / "w.safetensors")
    (tmp_path / "out.safetensors").write_bytes(b"precious")
    r = _cli("convert", "w.safetensors", "out.safetensors", cwd=tmp_path)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and "--force" in r.stderr and "out.safetensors" in r.stderr
    assert (tmp_path / "out.safetensors").read_bytes() == b"precious"  # untouched
    r = _cli("convert", "w.safetensors", "out.safetensors", "--force", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    got = load_file(tmp_path / "out.safetensors")
    assert got["a"].tolist() == list(range(6)) and got["b"].tolist() == [1, 1, 1]
    # in place: refused without --force, and with it the file is read before it is replaced
    r = _cli("convert", "w.safetensors", "w.safetensors", cwd=tmp_path)
    assert r.returncode == 2 and "--force" in r.stderr
    r = _cli("convert", "w.safetensors", "w.safetensors", "--force", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    got = load_file(tmp_path / "w.safetensors")
    assert got["a"].tolist() == list(range(6)) and got["b"].tolist() == [1, 1, 1]
    assert sorted(os.listdir(tmp_path)) == ["out.safetensors", "w.safetensors"]  # no temporaries left


@pytest.mark.parametrize(
    "argv",
    [
        ["ts", "set-weights", "scripted_module.pt", "{w}", "-o", "{out}"],
        ["onnx", "set-weights", "mlp.onnx", "{w}", "-o", "{out}"],
        ["pt2", "set-weights", "mlp.pt2", "{w}", "-o", "{out}"],
        ["run", "mlp.pt2", "--sample-inputs", "-o", "{out}"],
    ],
    ids=["ts", "onnx", "pt2", "run"],
)
def test_every_writing_command_refuses_an_existing_output(argv, tmp_path, capsys):
    model = os.path.join(SAMPLES, argv[2] if argv[0] != "run" else argv[1])
    w = tmp_path / "w.safetensors"
    if argv[0] != "run":
        assert main(["convert", model, str(w)]) == 0
    out = tmp_path / "existing"
    out.write_bytes(b"x")
    full = [
        a.format(w=w, out=out) if "{" in a else (os.path.join(SAMPLES, a) if a == os.path.basename(model) else a) for a in argv
    ]
    capsys.readouterr()
    assert main(full) == 2
    err = capsys.readouterr().err
    assert "--force" in err and str(out) in err and out.read_bytes() == b"x"
    assert main([*full, "--force"]) == 0, capsys.readouterr().err
    assert out.read_bytes() != b"x"


def test_sharded_output_folder_is_created(tmp_path, capsys):
    """As save_pretrained: the folder of a sharded output and its missing parents."""
    from safetensors.numpy import load_file

    dst = tmp_path / "new" / "deeper" / "model.safetensors"
    assert main(["convert", os.path.join(SAMPLES, "state_dict.pt"), str(dst), "--max-shard-size", "4KB"]) == 0
    idx = tmp_path / "new" / "deeper" / "model.safetensors.index.json"
    assert idx.exists() and len(list(dst.parent.glob("model-*-of-*.safetensors"))) > 1
    assert sum(len(load_file(p)) for p in dst.parent.glob("model-*.safetensors")) > 1
    capsys.readouterr()
    assert main(["convert", os.path.join(SAMPLES, "state_dict.pt"), str(dst), "--max-shard-size", "4KB"]) == 2
    assert "--force" in capsys.readouterr().err  # the index exists: refused
    hf = tmp_path / "hf" / "sub" / "pytorch_model.bin.index.json"
    assert main(["convert", os.path.join(SAMPLES, "state_dict.pt"), str(hf), "--to", "hf", "--max-shard-size", "4KB"]) == 0
    assert hf.exists()


def test_existing_url_output_needs_force(tmp_path, capsys):
    """A URL output is asked through its store (fsspec's memory filesystem here): an
    existing object is refused in one line naming --force, and replaced with it."""
    import uuid

    import fsspec
    from safetensors.numpy import load, save_file

    fs = fsspec.filesystem("memory")
    base = f"/force-{uuid.uuid4().hex}"
    src = str(tmp_path / "w.safetensors")
    save_file({f"t{i}": np.full(1024, i, np.float32) for i in range(4)}, src)
    try:
        fs.pipe(f"{base}/out.safetensors", b"precious")
        capsys.readouterr()
        assert main(["convert", src, f"memory://{base}/out.safetensors"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "--force" in err and "out.safetensors" in err
        assert fs.cat(f"{base}/out.safetensors") == b"precious"  # untouched
        assert main(["convert", src, f"memory://{base}/out.safetensors", "--force"]) == 0, capsys.readouterr().err
        got = load(fs.cat(f"{base}/out.safetensors"))
        assert sorted(got) == ["t0", "t1", "t2", "t3"] and got["t3"].tolist() == [3.0] * 1024
        # a sharded output's index counts too
        fs.pipe(f"{base}/sh.safetensors.index.json", b"{}")
        capsys.readouterr()
        assert main(["convert", src, f"memory://{base}/sh.safetensors", "--max-shard-size", "4KB"]) == 2
        assert "--force" in capsys.readouterr().err and fs.cat(f"{base}/sh.safetensors.index.json") == b"{}"
    finally:
        fs.rm(base, recursive=True)


def test_reshard_into_a_folder_that_is_not_empty_needs_force(tmp_path, capsys):
    """``reshard`` into an existing folder holding other files: refused in one line naming
    --force (nothing written); with --force the rank files are moved in beside them. An
    empty folder needs no --force."""
    from safetensors.numpy import save_file

    import torchless

    src = tmp_path / "w.safetensors"
    save_file({"a": np.arange(64, dtype=np.float32).reshape(8, 8), "b": np.ones(8, np.int64)}, src)
    dst = tmp_path / "out"
    dst.mkdir()
    (dst / "README.txt").write_text("precious")
    r = _cli("reshard", "w.safetensors", "out", "--ranks", "2", cwd=tmp_path)
    assert r.returncode == 2 and r.stdout == "", r.stderr
    assert r.stderr.count("\n") == 1 and "--force" in r.stderr and "out" in r.stderr
    assert os.listdir(dst) == ["README.txt"]  # nothing written
    assert sorted(os.listdir(tmp_path)) == ["out", "w.safetensors"]  # no staging left
    assert main(["reshard", str(src), str(dst), "--ranks", "2", "--force"]) == 0, capsys.readouterr().err
    assert (dst / "README.txt").read_text() == "precious"
    assert {".metadata", "__0_0.distcp", "__1_0.distcp"} <= set(os.listdir(dst))
    got = torchless.load(str(dst))
    assert np.asarray(got["a"]).tolist() == np.arange(64).reshape(8, 8).tolist()
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["reshard", str(src), str(empty), "--ranks", "2"]) == 0, capsys.readouterr().err


def test_reshard_into_a_url_folder_that_is_not_empty_needs_force(tmp_path, capsys):
    import uuid

    import fsspec
    from safetensors.numpy import save_file

    fs = fsspec.filesystem("memory")
    base = f"/force-{uuid.uuid4().hex}"
    src = tmp_path / "w.safetensors"
    save_file({"a": np.arange(64, dtype=np.float32).reshape(8, 8)}, src)
    try:
        fs.pipe(f"{base}/out/README.txt", b"precious")
        capsys.readouterr()
        assert main(["reshard", str(src), f"memory://{base}/out", "--ranks", "2"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "--force" in err
        assert fs.ls(f"{base}/out", detail=False) == [f"{base}/out/README.txt"]
        assert main(["reshard", str(src), f"memory://{base}/out", "--ranks", "2", "--force"]) == 0, capsys.readouterr().err
        assert fs.cat(f"{base}/out/README.txt") == b"precious" and fs.exists(f"{base}/out/.metadata")
    finally:
        fs.rm(base, recursive=True)


def test_onnx_data_file_beside_the_output_counts_as_an_output(tmp_path, capsys):
    """``onnx set-weights``: the external-data file the writer puts beside the model
    (``<output>.data``) existing is an existing output: refused in one line naming --force,
    replaced with it. With the choice left to the writer, it counts only when the writer
    would write one (the source used external data); an inline output leaves it alone."""
    import onnx

    model = os.path.join(SAMPLES, "mlp.onnx")
    w = tmp_path / "w.safetensors"
    assert main(["convert", model, str(w)]) == 0
    (tmp_path / "new.onnx.data").write_bytes(b"precious")
    r = _cli("onnx", "set-weights", model, "w.safetensors", "-o", "new.onnx", "--external-data", cwd=tmp_path)
    assert r.returncode == 2 and r.stdout == "", r.stderr
    assert r.stderr.count("\n") == 1 and "--force" in r.stderr and "new.onnx.data" in r.stderr
    assert (tmp_path / "new.onnx.data").read_bytes() == b"precious" and not (tmp_path / "new.onnx").exists()
    capsys.readouterr()
    argv = ["onnx", "set-weights", model, str(w), "-o", str(tmp_path / "new.onnx"), "--external-data", "--size-threshold", "0"]
    assert main([*argv, "--force"]) == 0, capsys.readouterr().err
    assert (tmp_path / "new.onnx.data").read_bytes() != b"precious"
    onnx.checker.check_model(str(tmp_path / "new.onnx"))  # the model and its data agree
    # the source uses external data: the writer's default writes a data file, so it counts
    (tmp_path / "auto.onnx.data").write_bytes(b"precious")
    argv = ["onnx", "set-weights", str(tmp_path / "new.onnx"), str(w), "-o", str(tmp_path / "auto.onnx")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "--force" in err and "auto.onnx.data" in err and (tmp_path / "auto.onnx.data").read_bytes() == b"precious"
    # ... and an inline output (asked for, or the default for an inline source) writes none
    assert main([*argv, "--no-external-data"]) == 0, capsys.readouterr().err
    assert (tmp_path / "auto.onnx.data").read_bytes() == b"precious"
    (tmp_path / "inline.onnx.data").write_bytes(b"precious")
    assert main(["onnx", "set-weights", model, str(w), "-o", str(tmp_path / "inline.onnx")]) == 0, capsys.readouterr().err
    assert (tmp_path / "inline.onnx.data").read_bytes() == b"precious"
