"""The generic commands on ONNX models, and ``torchless onnx set-weights``."""

from __future__ import annotations

import json

import numpy as np
import pytest

from torchless.cli.main import main

from .conftest import fixture_path


def _json(capsys, argv):
    capsys.readouterr()
    rc = main(argv)
    return rc, json.loads(capsys.readouterr().out)


def test_info_ls_verify(onnx, capsys):
    rc, info = _json(capsys, ["info", fixture_path("mlp_ext"), "--json"])
    assert rc == 0 and info["format"] == "onnx" and info["inputs"][0]["shape"] == ["batch", 64]
    rc, rows = _json(capsys, ["ls", fixture_path("legacy"), "--json"])
    assert rc == 0 and {"name": "emb.weight", "dtype": "float32", "shape": [16, 6], "nbytes": 384} in rows
    assert main(["info", fixture_path("cond")]) == 0
    out = capsys.readouterr().out
    assert "If" in out and "then_branch" in out and "ir_version" in out
    rc, res = _json(capsys, ["verify", fixture_path("mlp_ext"), "--json"])
    assert rc == 0 and res["ok"] and res["problems"] == []


def test_verify_reports_checker_errors(onnx, tmp_path, capsys):
    from onnx import helper

    # a node with an unknown op in the default domain: the onnx checker refuses it
    g = helper.make_graph(
        [helper.make_node("NoSuchOp", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", 1, [1])],
        [helper.make_tensor_value_info("y", 1, [1])],
    )
    p = tmp_path / "bad.onnx"
    p.write_bytes(helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)]).SerializeToString())
    rc, res = _json(capsys, ["verify", str(p), "--json"])
    assert rc == 1 and [x["code"] for x in res["problems"]] == ["onnx-checker"]
    assert "NoSuchOp" in res["problems"][0]["message"]


def test_convert_extracts_weights(onnx, tmp_path, capsys):
    st = pytest.importorskip("safetensors.numpy")
    out = tmp_path / "w.safetensors"
    assert main(["convert", fixture_path("mlp_ext"), str(out)]) == 0
    got = st.load_file(str(out))
    model = onnx.load(fixture_path("mlp_ext"))
    assert sorted(got) == sorted(t.name for t in model.graph.initializer)
    for tp in model.graph.initializer:
        assert got[tp.name].tobytes() == onnx.numpy_helper.to_array(tp).tobytes()
    # diff: the extracted weights are the model's
    assert main(["diff", fixture_path("mlp_ext"), str(out)]) == 1  # the graph is not in the weights file
    assert main(["diff", "--tensors-only", fixture_path("mlp_ext"), str(out)]) == 0


def test_set_weights_cli(onnx, tmp_path, capsys):
    from torchless.formats.safetensors import write_safetensors

    rng = np.random.default_rng(0)
    w = {"l1.weight": rng.standard_normal((64, 64)).astype(np.float32), "l2.bias": np.ones(4, np.float32)}
    wp = tmp_path / "w.safetensors"
    write_safetensors(w.items(), wp)
    out = tmp_path / "new.onnx"
    rc, res = _json(capsys, ["onnx", "set-weights", fixture_path("mlp_ext"), str(wp), "-o", str(out), "--json"])
    assert rc == 0 and res["replaced"] == ["l1.weight", "l2.bias"] and res["kept"] == ["l1.bias", "l2.weight"]
    assert res["data_file"] == str(out) + ".data"
    assert main(["diff", str(out), fixture_path("mlp_ext")]) == 1
    assert "~ l1.weight" in capsys.readouterr().out
    assert (
        main(["onnx", "set-weights", fixture_path("mlp_ext"), str(wp), "-o", str(tmp_path / "single.onnx"), "--no-external-data"])
        == 0
    )
    assert "replaced 2 initializers, kept 2" in capsys.readouterr().out
    assert not (tmp_path / "single.onnx.data").exists()
    # errors are one line, exit 2
    bad = tmp_path / "bad.safetensors"
    write_safetensors([("l2.bias", np.ones(5, np.float32))], bad)
    assert main(["onnx", "set-weights", fixture_path("mlp_ext"), str(bad), "-o", str(tmp_path / "x.onnx")]) == 2
    err = capsys.readouterr().err
    assert "shape mismatch" in err and "l2.bias" in err and err.count("\n") == 1


@pytest.mark.differential
def test_convert_to_pt_loads_in_torch(torch, onnx, tmp_path):
    out = tmp_path / "w.pt"
    assert main(["convert", fixture_path("legacy"), str(out)]) == 0
    sd = torch.load(str(out), weights_only=True)
    model = onnx.load(fixture_path("legacy"))
    for tp in model.graph.initializer:
        assert type(sd[tp.name]) is torch.Tensor  # plain tensors, as in a state dict
        assert sd[tp.name].numpy().tobytes() == onnx.numpy_helper.to_array(tp).tobytes()
    consts = [n.output[0] for n in model.graph.node if n.op_type == "Constant"]
    assert set(sd) == {t.name for t in model.graph.initializer} | set(consts)


def test_a_model_is_recognised_by_content_whatever_its_name(onnx, tmp_path, capsys):
    """onnx.load looks at no suffix: a model saved as ``.bin`` (its external data beside
    it) opens as ONNX with the same tensors, as onnx reads them."""
    import shutil

    from onnx import numpy_helper

    import torchless

    shutil.copy(fixture_path("mlp_ext"), tmp_path / "model.bin")
    shutil.copy(fixture_path("mlp_ext") + ".data", tmp_path / "mlp_ext.onnx.data")
    rc, info = _json(capsys, ["info", str(tmp_path / "model.bin"), "--json"])
    assert rc == 0 and info["format"] == "onnx"
    want = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(tmp_path / "model.bin")).graph.initializer}
    with torchless.open(tmp_path / "model.bin") as art:
        got = {k: t.numpy() for k, t in art.tensors()}
    assert set(got) == set(want) and all(np.array_equal(got[k], want[k]) for k in want)


def test_set_weights_paths_as_given(onnx, tmp_path, capsys, monkeypatch):
    # issue 36 bug 5: --json gave data_file as an absolute path ("paths as given" in the
    # docs), and a missing output folder's error named the absolute .data path
    from torchless.formats.safetensors import write_safetensors

    write_safetensors([("l2.bias", np.full(4, 3.0, np.float32))], tmp_path / "w.safetensors")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sub").mkdir()
    for out in ("new.onnx", "sub/new.onnx"):
        rc, res = _json(capsys, ["onnx", "set-weights", fixture_path("mlp_ext"), "w.safetensors", "-o", out, "--json"])
        assert rc == 0 and res["output"] == out and res["data_file"] == out + ".data", res
        m = onnx.load(out)  # the oracle finds the data beside the model
        (b,) = [t for t in m.graph.initializer if t.name == "l2.bias"]
        assert np.array_equal(onnx.numpy_helper.to_array(b), np.full(4, 3.0, np.float32))
    assert main(["onnx", "set-weights", fixture_path("mlp_ext"), "w.safetensors", "-o", "missing/x.onnx"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "missing/x.onnx" in err and str(tmp_path) not in err, err
