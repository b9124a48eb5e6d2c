"""Sparse initializers and sparse Constant values, listed dense; the oracle is
onnxruntime, which densifies them at session creation (an Identity node returns them)."""

from __future__ import annotations

import ml_dtypes  # noqa: F401 - bfloat16 values
import numpy as np
import pytest

import torchless
from torchless.core.errors import FormatError, LimitError

onnx = pytest.importorskip("onnx", reason="builds the models")
ort = pytest.importorskip("onnxruntime", reason="the oracle")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402


def _sparse(name, vals, idx, dims):
    return helper.make_sparse_tensor(
        numpy_helper.from_array(np.asarray(vals), name), numpy_helper.from_array(np.asarray(idx, dtype=np.int64), ""), dims
    )


CASES = {
    "linear_f32": (np.array([1.5, -2, 3], np.float32), [1, 5, 11], [3, 4], TensorProto.FLOAT),
    "coords_i64": (np.array([7, 9], np.int64), [[0, 1], [2, 3]], [3, 4], TensorProto.INT64),
    "coords_3d_f16": (np.array([0.5, 4], np.float16), [[0, 0, 1], [1, 2, 0]], [2, 3, 2], TensorProto.FLOAT16),
    "empty": (np.zeros(0, np.float32), np.zeros((0,), np.int64), [2, 2], TensorProto.FLOAT),
    "f64_vector": (np.array([1e300, -1e-300], np.float64), [0, 4], [5], TensorProto.DOUBLE),
}


def _model(path, sparse, *, as_constant=False):
    nodes, outs, inits = [], [], []
    for name, (vals, idx, dims, code) in sparse.items():
        sp = _sparse(name, vals, idx, dims)
        if as_constant:
            nodes.append(helper.make_node("Constant", [], [name], sparse_value=sp))
        else:
            inits.append(sp)
        nodes.append(helper.make_node("Identity", [name], [name + "_out"]))
        outs.append(helper.make_tensor_value_info(name + "_out", code, dims))
    g = helper.make_graph(nodes, "g", [], outs, sparse_initializer=inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


@pytest.mark.differential
@pytest.mark.parametrize("as_constant", [False, True])
def test_dense_matches_onnxruntime(tmp_path, as_constant):
    p = _model(tmp_path / "m.onnx", CASES, as_constant=as_constant)
    ref = dict(zip([n + "_out" for n in CASES], ort.InferenceSession(str(p)).run(None, {}), strict=False))
    with torchless.open(p) as art:
        got = dict(art.tensors())
        assert set(got) == set(CASES)
        for name in CASES:
            want = ref[name + "_out"]
            t = got[name]
            assert t.dtype.name == str(want.dtype)
            assert tuple(t.shape) == want.shape and t.numpy().tobytes() == want.tobytes(), name
        assert art.verify() == []
        kinds = {r.name: r.kind for r in art.records}
        assert set(kinds.values()) == {"constant" if as_constant else "sparse_initializer"}
        if not as_constant:
            assert [s["name"] for s in art.info()["sparse_initializers"]] == list(CASES)
    out = tmp_path / "dense.safetensors"
    torchless.convert(p, out)
    assert torchless.load(out)["linear_f32"].numpy().tobytes() == ref["linear_f32_out"].tobytes()


@pytest.mark.parametrize(
    "vals, idx, dims, exc, match",
    [
        (np.array([1, 2], np.float32), [0, 12], [3, 4], FormatError, "out of bounds"),
        (np.array([1, 2], np.float32), [-1, 3], [3, 4], FormatError, "out of bounds"),
        (np.array([1, 2], np.float32), [[0, 4], [1, 1]], [3, 4], FormatError, "out of bounds"),
        (np.array([1, 2], np.float32), [5, 5], [3, 4], FormatError, "strictly increasing"),
        (np.array([1, 2], np.float32), [6, 5], [3, 4], FormatError, "strictly increasing"),
        (np.array([1, 2], np.float32), [1, 2], [1 << 20, 1 << 20], LimitError, "too large"),
    ],
)
def test_hostile_sparse_fails_on_use(tmp_path, vals, idx, dims, exc, match):
    p = _model(tmp_path / "m.onnx", {"w": (vals, idx, dims, TensorProto.FLOAT)})
    art = torchless.open(p)
    ((name, t),) = art.tensors()  # listing never densifies (a 4 TiB claim is listed)
    assert tuple(t.shape) == tuple(dims)
    with pytest.raises(exc, match=match):
        t.numpy()
    assert art.verify()  # reported, not raised


@pytest.mark.parametrize(
    "edit, match",
    [
        (lambda sp: sp.indices.CopyFrom(numpy_helper.from_array(np.array([0, 1], np.int32), "")), "INT64"),
        (lambda sp: sp.indices.CopyFrom(numpy_helper.from_array(np.array([0, 1, 2], np.int64), "")), "wrong shape"),
        (lambda sp: sp.values.dims.extend([1]), "1-D"),
        (lambda sp: sp.dims.__setitem__(0, -3), "negative"),
    ],
)
def test_malformed_sparse_refused_at_open(tmp_path, edit, match):
    sp = _sparse("w", np.array([1, 2], np.float32), [0, 1], [3, 4])
    edit(sp)
    g = helper.make_graph([], "g", [], [], sparse_initializer=[sp])
    p = tmp_path / "m.onnx"
    onnx.save(helper.make_model(g), str(p))
    with pytest.raises(FormatError, match=match):
        torchless.open(p)


@pytest.mark.parametrize("kind", ["raw", "typed", "external", "sparse"])
def test_a_dropped_model_is_freed_without_a_gc_pass(tmp_path, kind):
    """The tensors' loaders referred to the model (to read from its source or external
    data), which referred to the tensors: every dropped model was a reference cycle,
    freed only by a full GC pass. The loaders hold what they read from instead."""
    from onnx.external_data_helper import convert_model_to_external_data
    from tl_testutil import left_for_the_collector

    from torchless.core.tensor import Storage

    w = np.arange(64, dtype=np.float32).reshape(8, 8)
    if kind == "sparse":
        p = _model(tmp_path / "m.onnx", {"s": CASES["linear_f32"]})
    else:
        t = numpy_helper.from_array(w, "w")
        if kind == "typed":  # values in float_data, not raw_data
            t = helper.make_tensor("w", TensorProto.FLOAT, [8, 8], w.ravel().tolist())
        g = helper.make_graph(
            [helper.make_node("Identity", ["w"], ["y"])],
            "g",
            [],
            [helper.make_tensor_value_info("y", 1, [8, 8])],
            initializer=[t],
        )
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
        if kind == "external":
            convert_model_to_external_data(m, location="w.bin", size_threshold=0)
        p = tmp_path / "m.onnx"
        onnx.save(m, str(p))
    got: dict = {}

    def open_and_drop() -> None:
        with torchless.open(str(p)) as art:
            got.update((n, x.numpy().copy()) for n, x in art.tensors())

    assert left_for_the_collector(open_and_drop, Storage) == []
    assert got
    if kind != "sparse":
        np.testing.assert_array_equal(got["w"], w)
