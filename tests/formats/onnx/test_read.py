"""Models exported by torch 2.13 (committed fixtures, see fixtures/gen_fixtures.py):
initializers and Constant tensors bit-exact against onnx.numpy_helper, summaries
consistent with the ModelProto as onnx reads it."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter

import numpy as np
import pytest

import torchless
from torchless.core.errors import TorchlessError, UnsupportedError
from torchless.formats.onnx.handler import looks_like_model

from .conftest import FIXTURES, NAMES, fixture_path


def _ops(graph):
    c = Counter()
    for n in graph.node:
        c[n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}::{n.op_type}"] += 1
        for a in n.attribute:
            for g in [a.g] if a.type == 5 else list(a.graphs) if a.type == 10 else []:
                c.update(_ops(g))
    return c


def _dims(vi):
    out = []
    for d in vi.type.tensor_type.shape.dim:
        w = d.WhichOneof("value")
        out.append(d.dim_value if w == "dim_value" else d.dim_param if w == "dim_param" else None)
    return out


@pytest.mark.parametrize("name", NAMES)
def test_initializers_bit_exact(onnx, name):
    from onnx import numpy_helper

    path = fixture_path(name)
    model = onnx.load(path, load_external_data=False)
    with torchless.open(path) as art:
        assert art.format == "onnx"
        got = dict(art.tensors())
        for tp in model.graph.initializer:
            want = numpy_helper.to_array(tp, FIXTURES)
            arr = got[tp.name].numpy()
            assert arr.dtype == want.dtype and arr.shape == want.shape, tp.name
            assert arr.tobytes() == want.tobytes(), tp.name
        # Constant nodes: listed under their output name, values as onnx reads them
        for node in model.graph.node:
            if node.op_type == "Constant":
                want = numpy_helper.to_array(onnx.helper.get_attribute_value(node.attribute[0]))
                arr = got[node.output[0]].numpy()
                assert arr.dtype == want.dtype and arr.tobytes() == want.tobytes()
        n_const = sum(1 for n in model.graph.node if n.op_type == "Constant")
        assert len(got) == len(model.graph.initializer) + n_const
        assert art.verify() == []


@pytest.mark.parametrize("name", NAMES)
def test_summary_consistent_with_onnx(onnx, name):
    path = fixture_path(name)
    m = onnx.load(path, load_external_data=False)
    with torchless.open(path) as art:
        info = art.info()
    assert info["format"] == "onnx"
    assert info["ir_version"] == m.ir_version
    assert info["opsets"] == {(o.domain or "ai.onnx"): o.version for o in m.opset_import}
    assert info["producer"] == f"{m.producer_name} {m.producer_version}"
    assert info["nodes"] == len(m.graph.node)
    assert info["ops"] == dict(_ops(m.graph))
    assert info["nodes_total"] == sum(_ops(m.graph).values())
    inits = {t.name for t in m.graph.initializer}
    assert [i["name"] for i in info["inputs"]] == [v.name for v in m.graph.input if v.name not in inits]
    assert [i["shape"] for i in info["inputs"]] == [_dims(v) for v in m.graph.input if v.name not in inits]
    assert [o["shape"] for o in info["outputs"]] == [_dims(v) for v in m.graph.output]
    assert info["initializers"] == len(m.graph.initializer)
    assert info["initializer_bytes"] == sum(onnx.numpy_helper.to_array(t, FIXTURES).nbytes for t in m.graph.initializer)


def test_torch_export_facts(onnx):
    """What spec onnx.md says torch 2.13 writes, seen through torchless."""
    with torchless.open(fixture_path("mlp_ext")) as art:
        info = art.info()
        assert info["ir_version"] == 10 and info["opsets"] == {"ai.onnx": 20}
        assert info["producer"] == "pytorch 2.13.0+cpu"
        assert info["inputs"][0]["shape"] == ["batch", 64]  # torch.export.Dim -> dim_param
        assert info["ops"] == {"Gemm": 2, "Relu": 1}
        ext = {r.name: r.external for r in art.records}
        # > 256 bytes go to <model>.onnx.data back to back; 256 bytes stay inline
        assert ext["l1.weight"].location == "mlp_ext.onnx.data" and ext["l1.weight"].offset == 0
        assert ext["l2.weight"].offset == 64 * 64 * 4 and ext["l2.weight"].length == 4 * 64 * 4
        assert ext["l1.bias"] is None and ext["l2.bias"] is None
        assert info["external_data"] == {"mlp_ext.onnx.data": {"tensors": 2, "bytes": 17408}}
    with torchless.open(fixture_path("legacy")) as art:
        info = art.info()
        assert info["ir_version"] == 8 and info["opsets"] == {"ai.onnx": 17}
        assert info["inputs"][0]["shape"] == ["batch", "seq"]
        assert info["constants"] == 3


def test_if_subgraphs(onnx):
    with torchless.open(fixture_path("cond")) as art:
        info = art.info()
    subs = info["subgraphs"]
    assert {s["op_type"] for s in subs} == {"If"}
    assert sorted(s["path"].rsplit("/", 1)[1] for s in subs) == ["else_branch", "then_branch"]


def test_loop_scan_subgraphs_and_constants_are_scoped(onnx, tmp_path):
    """Handcrafted Loop/Scan/If nesting: subgraph initializers and Constants are listed
    under their scope; onnx reads the same values."""
    from onnx import TensorProto, helper, numpy_helper

    c_in = helper.make_node("Constant", [], ["k"], value=numpy_helper.from_array(np.array([1.5, 2.5], np.float32)))
    c_ints = helper.make_node("Constant", [], ["ints"], value_ints=[3, 4, 5])
    add = helper.make_node("Add", ["acc", "k"], ["acc_out"])
    cond_out = helper.make_node("Identity", ["cond"], ["cond_out"])
    body = helper.make_graph(
        [c_in, c_ints, add, cond_out],
        "loop_body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
            helper.make_tensor_value_info("acc", TensorProto.FLOAT, [2]),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("acc_out", TensorProto.FLOAT, [2]),
        ],
        initializer=[numpy_helper.from_array(np.arange(4, dtype=np.int32), "body_init")],
    )
    loop = helper.make_node("Loop", ["trip", "", "x"], ["y"], name="myloop", body=body)
    sbody = helper.make_graph(
        [helper.make_node("Add", ["s", "e"], ["s2"]), helper.make_node("Identity", ["s2"], ["o"])],
        "scan_body",
        [helper.make_tensor_value_info("s", TensorProto.FLOAT, [2]), helper.make_tensor_value_info("e", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("s2", TensorProto.FLOAT, [2]), helper.make_tensor_value_info("o", TensorProto.FLOAT, [2])],
    )
    scan = helper.make_node("Scan", ["y", "seq"], ["fin", "outs"], body=sbody, num_scan_inputs=1)
    g = helper.make_graph(
        [loop, scan],
        "main",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2]),
            helper.make_tensor_value_info("seq", TensorProto.FLOAT, ["T", 2]),
        ],
        [helper.make_tensor_value_info("fin", TensorProto.FLOAT, [2])],
        initializer=[numpy_helper.from_array(np.array(3, np.int64), "trip")],
    )
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    onnx.checker.check_model(model)
    p = tmp_path / "loop.onnx"
    onnx.save(model, str(p))
    with torchless.open(p) as art:
        names = [n for n, _ in art.tensors()]
        assert names == ["trip", "myloop/body/body_init", "myloop/body/k", "myloop/body/ints"]
        np.testing.assert_array_equal(art["myloop/body/k"].numpy(), [1.5, 2.5])
        np.testing.assert_array_equal(art["myloop/body/ints"].numpy(), [3, 4, 5])
        assert art["myloop/body/ints"].dtype.name == "int64"
        info = art.info()
        assert [(s["path"], s["op_type"]) for s in info["subgraphs"]] == [("myloop/body", "Loop"), ("Scan_1/body", "Scan")]
        assert info["ops"] == {"Add": 2, "Constant": 2, "Identity": 2, "Loop": 1, "Scan": 1}
        assert info["inputs"][1]["shape"] == ["T", 2]
        assert art.verify() == []
    # an ONNX runtime agrees on what the model computes with those constants
    ort = pytest.importorskip("onnxruntime")
    s = ort.InferenceSession(str(p))
    (fin,) = s.run(["fin"], {"x": np.zeros(2, np.float32), "seq": np.ones((2, 2), np.float32)})
    np.testing.assert_array_equal(fin, np.array([1.5, 2.5]) * 3 + 2)


def test_detection(onnx, tmp_path):
    assert torchless.detect(fixture_path("cnn")) == "onnx"
    head = open(fixture_path("cnn"), "rb").read(4096)
    assert looks_like_model(head)
    assert not looks_like_model(b"PK\x03\x04" + b"\0" * 40)
    assert not looks_like_model(b"")
    assert not looks_like_model(b"\x08\xff\x01")  # ir_version 255
    # a zip checkpoint named .onnx is not taken for ONNX
    import zipfile

    z = tmp_path / "fake.onnx"
    with zipfile.ZipFile(z, "w") as zf:
        zf.writestr("archive/data.pkl", b"x")
    assert torchless.detect(z) != "onnx"


def test_bytes_input_without_external_data(onnx):
    data = open(fixture_path("cnn"), "rb").read()
    from torchless.formats.onnx.handler import OnnxArtifact

    with OnnxArtifact(data) as art:
        assert art.path == "<bytes>"
        assert len(list(art.tensors())) == 7
        assert art.verify() == []
    with pytest.raises(UnsupportedError, match="no directory"):
        OnnxArtifact(open(fixture_path("mlp_ext"), "rb").read())


def test_import_without_onnx_package():
    """torchless imports and detects without onnx; opening raises the install hint."""
    code = (
        "import sys; sys.modules['onnx'] = None\n"
        "import torchless\n"
        "from torchless.core.errors import UnsupportedError\n"
        f"assert torchless.detect({fixture_path('cnn')!r}) == 'onnx'\n"
        "try:\n"
        f"    torchless.open({fixture_path('cnn')!r})\n"
        "except UnsupportedError as e:\n"
        "    assert 'pip install torchless[onnx]' in str(e), e\n"
        "else:\n"
        "    raise SystemExit('no error')\n"
        "assert 'onnx' not in [m for m in sys.modules if sys.modules[m] is not None]\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


def test_hostile_model_bytes_raise_torchless_errors(onnx, tmp_path):
    rng = np.random.default_rng(0)
    p = tmp_path / "bad.onnx"
    for i in range(240):
        data = open(fixture_path(("legacy", "cnn", "cond")[i % 3]), "rb").read()
        buf = bytearray(data)
        if i % 3 == 0:
            buf = buf[: rng.integers(0, len(buf))]
        else:
            for _ in range(1 + i % 4):
                buf[rng.integers(0, len(buf))] = rng.integers(0, 256)
        p.write_bytes(bytes(buf))
        try:
            with torchless.open(p, format="onnx") as art:
                art.info()
                for r in art.records:  # a view of the file is only used where it is the parser's value
                    if r.storage == "raw" and r.tensor.storage.file_offset is not None:
                        assert bytes(r.tensor.storage.bytes()) == r.proto.raw_data
                for _n, t in art.tensors():
                    try:
                        t.numpy()
                    except TorchlessError:
                        pass
                art.verify()
        except TorchlessError:
            pass


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=64))
def test_sniff_never_raises(head):
    assert looks_like_model(head) in (True, False)


@pytest.mark.parametrize("name", NAMES)
def test_inline_raw_data_is_zero_copy(onnx, name):
    """raw_data inside the model file is a view of the file's memory map, equal to what
    the protobuf parser reads."""
    import mmap

    with torchless.open(fixture_path(name)) as art:
        raw = [r for r in art.records if r.storage == "raw" and r.kind == "initializer" and r.scope == ""]
        assert raw
        for r in raw:
            mv = r.tensor.storage.bytes()
            assert isinstance(mv.obj, mmap.mmap), r.name
            assert bytes(mv) == r.proto.raw_data
            assert r.tensor.storage.file_offset is not None
            with open(fixture_path(name), "rb") as f:
                f.seek(r.tensor.storage.file_offset)
                assert f.read(len(mv)) == bytes(mv)
