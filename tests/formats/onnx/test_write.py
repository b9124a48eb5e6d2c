"""set-weights: weights fine-tuned in torch (saved as .pt and .safetensors) replace the
initializers of models torch 2.13 exported; onnxruntime then computes what torch
computes with the new weights."""

from __future__ import annotations

import os

import numpy as np
import pytest

import torchless
from torchless.core.errors import LimitError, NotFoundError, UsageError
from torchless.formats.onnx.write import set_weights

from .conftest import fixture_path


def _new_state(torch, name):
    from .models import build

    m = build(name, seed=123)  # "fine-tuned": other weights, same architecture
    return m, {k: v.detach().clone() for k, v in m.state_dict().items()}


def _save(torch, sd, path):
    if path.endswith(".pt"):
        torch.save(sd, path)
    else:
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in sd.items()}, path)


def _run(ort, path, inputs):
    s = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feed = {i.name: x for i, x in zip(s.get_inputs(), inputs, strict=False)}
    return s.run(None, feed)[0]


@pytest.mark.differential
@pytest.mark.parametrize("name", ["mlp_ext", "cnn", "cond", "half"])
@pytest.mark.parametrize("ext", [".pt", ".safetensors"])
def test_set_weights_runs_in_onnxruntime(torch, onnx, ort, fixtures_copy, name, ext):
    from .models import example_input, reference

    m, sd = _new_state(torch, name)
    w = str(fixtures_copy / f"w{ext}")
    _save(torch, sd, w)
    out = fixtures_copy / "out" / f"{name}_new.onnx"
    out.parent.mkdir()
    res = set_weights(fixtures_copy / f"{name}.onnx", w, out)
    assert set(res["replaced"]) == set(sd)
    assert res["ignored"] == [] and res["kept"] == [n for n in res["kept"] if n not in sd]
    assert (res["data_file"] is not None) == (name == "mlp_ext")  # external data is kept
    args = example_input(name)
    want = reference(m, args).numpy()
    got = _run(ort, out, [a.numpy() for a in args])
    tol = 2e-3 if name == "half" else 1e-5
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=tol, atol=tol)
    # the old weights gave something else
    old = _run(ort, fixtures_copy / f"{name}.onnx", [a.numpy() for a in args])
    assert not np.allclose(old, got)
    # the new initializers are the state dict's bytes, as onnx reads them
    new_model = onnx.load(str(out))
    for tp in new_model.graph.initializer:
        if tp.name in sd:
            assert onnx.numpy_helper.to_array(tp).tobytes() == sd[tp.name].contiguous().numpy().tobytes()
    onnx.checker.check_model(str(out))
    with torchless.open(out) as art:
        assert art.verify() == []


def test_external_data_layout(torch, onnx, ort, fixtures_copy):
    _m, sd = _new_state(torch, "cnn")
    out = fixtures_copy / "cnn_ext.onnx"
    res = set_weights(
        fixtures_copy / "cnn.onnx", {k: v.numpy() for k, v in sd.items()}, out, external_data=True, size_threshold=100
    )
    assert res["data_file"] == str(out) + ".data"
    with torchless.open(out) as art:
        recs = {r.name: r for r in art.records}
        assert recs["conv.weight"].external.location == "cnn_ext.onnx.data"
        assert recs["conv.weight"].external.offset % 64 == 0
        assert recs["conv.bias"].external is None  # 32 bytes <= threshold
        for k, v in sd.items():
            assert art[k].numpy().tobytes() == v.numpy().tobytes()
    # and back to a single file
    out2 = fixtures_copy / "cnn_single.onnx"
    res = set_weights(out, {}, out2, external_data=False)
    assert res["data_file"] is None and res["replaced"] == []
    with torchless.open(out2) as art:
        assert all(r.external is None for r in art.records)
        assert art["conv.weight"].numpy().tobytes() == sd["conv.weight"].numpy().tobytes()
    x = np.random.default_rng(0).standard_normal((2, 3, 8, 8)).astype(np.float32)
    np.testing.assert_array_equal(_run(ort, out, [x]), _run(ort, out2, [x]))


def test_in_place_rewrite_of_external_model(torch, onnx, ort, fixtures_copy):
    m, sd = _new_state(torch, "mlp_ext")
    p = fixtures_copy / "mlp_ext.onnx"
    set_weights(p, {k: v.numpy() for k, v in sd.items() if k.startswith("l1.")}, p, allow_missing=False)
    with torchless.open(p) as art:
        assert art["l1.weight"].numpy().tobytes() == sd["l1.weight"].numpy().tobytes()
        ref = torchless.open(fixture_path("mlp_ext"))
        assert art["l2.weight"].numpy().tobytes() == ref["l2.weight"].numpy().tobytes()  # kept
        ref.close()


def test_mismatches_are_usage_errors(torch, onnx, fixtures_copy):
    _m, sd = _new_state(torch, "mlp_ext")
    w = {k: v.numpy() for k, v in sd.items()}
    src = fixtures_copy / "mlp_ext.onnx"
    out = fixtures_copy / "o.onnx"
    with pytest.raises(UsageError, match="shape mismatch") as ei:
        set_weights(src, {**w, "l1.weight": w["l1.weight"].T.copy()[:, :32]}, out)
    assert ei.value.member == "l1.weight"
    with pytest.raises(UsageError, match="dtype mismatch"):
        set_weights(src, {**w, "l2.bias": w["l2.bias"].astype(np.float64)}, out)
    with pytest.raises(NotFoundError, match="name no initializer"):
        set_weights(src, {**w, "extra.weight": w["l2.bias"]}, out)
    assert not out.exists() and not os.path.exists(str(out) + ".data")  # nothing written
    res = set_weights(src, {**w, "extra.weight": w["l2.bias"]}, out, allow_missing=True)
    assert res["ignored"] == ["extra.weight"]
    res = set_weights(src, {f"model.{k}": v for k, v in w.items()}, fixtures_copy / "p.onnx", strip_prefix="model.")
    assert sorted(res["replaced"]) == sorted(w)
    leftovers = [f for f in os.listdir(fixtures_copy) if f.startswith(".torchless-")]
    assert leftovers == []


def test_legacy_export_names(torch, onnx, ort, fixtures_copy):
    """The TorchScript exporter stores proj.weight transposed under an onnx:: name:
    state-dict names that are missing must be asked for explicitly."""
    from .models import example_input

    m, sd = _new_state(torch, "legacy")
    w = str(fixtures_copy / "w.safetensors")
    _save(torch, sd, w)
    with pytest.raises(NotFoundError):
        set_weights(fixtures_copy / "legacy.onnx", w, fixtures_copy / "n.onnx")
    weights = dict(torchless.open(w).tensors())
    weights["onnx::MatMul_20"] = sd["proj.weight"].T.contiguous().numpy()
    res = set_weights(fixtures_copy / "legacy.onnx", weights, fixtures_copy / "n.onnx", allow_missing=True)
    assert res["ignored"] == ["proj.weight"]
    (idx,) = example_input("legacy")
    with torch.no_grad():
        want = m(idx).numpy()
    np.testing.assert_allclose(_run(ort, fixtures_copy / "n.onnx", [idx.numpy()]), want, rtol=1e-5, atol=1e-6)


def test_protobuf_limit_needs_external_data(onnx, tmp_path, monkeypatch):
    import torchless.formats.onnx.write as w

    monkeypatch.setattr(w, "PROTOBUF_LIMIT", os.path.getsize(fixture_path("cnn")) - 1500)
    with pytest.raises(LimitError, match="2 GiB"):
        set_weights(fixture_path("cnn"), {}, tmp_path / "x.onnx", external_data=False)
    assert os.listdir(tmp_path) == []
    res = set_weights(fixture_path("cnn"), {}, tmp_path / "x.onnx", external_data=True, size_threshold=0)
    assert res["data_file"]


def test_relocates_every_external_tensor(onnx, ort, tmp_path):
    """Constant-node and subgraph tensors in external data move with the model."""
    from onnx import TensorProto, helper, numpy_helper
    from onnx.external_data_helper import convert_model_to_external_data

    k = np.arange(6, dtype=np.float32).reshape(2, 3)
    then_g = helper.make_graph(
        [
            helper.make_node("Constant", [], ["t"], value=numpy_helper.from_array(k * 10, "tv")),
            helper.make_node("Add", ["t", "w"], ["r"]),
        ],
        "then",
        [],
        [helper.make_tensor_value_info("r", 1, [2, 3])],
    )
    else_g = helper.make_graph(
        [helper.make_node("Sub", ["w", "sub_init"], ["r2"])],
        "else",
        [],
        [helper.make_tensor_value_info("r2", 1, [2, 3])],
        initializer=[numpy_helper.from_array(k + 1, "sub_init")],
    )
    g = helper.make_graph(
        [helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)],
        "main",
        [helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", 1, [2, 3])],
        initializer=[numpy_helper.from_array(k, "w")],
    )
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    convert_model_to_external_data(model, location="all.bin", size_threshold=0, convert_attribute=True)
    src = tmp_path / "src"
    src.mkdir()
    onnx.save(model, str(src / "m.onnx"))
    dst = tmp_path / "dst"
    dst.mkdir()
    new_w = -k
    res = set_weights(src / "m.onnx", {"w": new_w}, dst / "n.onnx", size_threshold=0)
    assert res["data_file"] == str(dst / "n.onnx.data")
    with torchless.open(dst / "n.onnx") as art:
        assert {r.external.location for r in art.records} == {"n.onnx.data"}
        assert art["w"].numpy().tolist() == new_w.tolist()
        assert art["If_0/then_branch/t"].numpy().tolist() == (k * 10).tolist()
        assert art["If_0/else_branch/sub_init"].numpy().tolist() == (k + 1).tolist()
        assert art.verify() == []
    s = ort.InferenceSession(str(dst / "n.onnx"))
    np.testing.assert_array_equal(s.run(None, {"c": np.array(True)})[0], k * 10 + new_w)
    np.testing.assert_array_equal(s.run(None, {"c": np.array(False)})[0], new_w - (k + 1))


def test_set_weights_bfloat16_and_int4(onnx, tmp_path):
    import ml_dtypes
    from onnx import helper, numpy_helper

    b = np.arange(6, dtype=np.float32).astype(ml_dtypes.bfloat16)
    q = np.array([1, -2, 3], dtype=ml_dtypes.int4)
    g = helper.make_graph([], "g", [], [], initializer=[numpy_helper.from_array(b, "b"), numpy_helper.from_array(q, "q")])
    (tmp_path / "m.onnx").write_bytes(helper.make_model(g).SerializeToString())
    nb = (-b.astype(np.float32)).astype(ml_dtypes.bfloat16)
    nq = np.array([-8, 7, 0], dtype=ml_dtypes.int4)
    set_weights(tmp_path / "m.onnx", {"b": nb, "q": nq}, tmp_path / "n.onnx")
    m = onnx.load(str(tmp_path / "n.onnx"))
    got = {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}
    assert got["b"].dtype == nb.dtype and got["b"].tobytes() == nb.tobytes()
    assert got["q"].dtype == nq.dtype and got["q"].tolist() == nq.tolist()
    with pytest.raises(UsageError, match="dtype mismatch"):
        set_weights(tmp_path / "m.onnx", {"b": b.astype(np.float16)}, tmp_path / "x.onnx")
    # weights read back from an ONNX model (packed tensors) are accepted as they are
    with torchless.open(tmp_path / "n.onnx") as art:
        set_weights(tmp_path / "m.onnx", dict(art.tensors()), tmp_path / "y.onnx")
    assert (tmp_path / "y.onnx").read_bytes() == (tmp_path / "n.onnx").read_bytes()
