"""Every TensorProto data type: torchless reads what onnx.numpy_helper reads, bit for bit,
from raw_data, from the typed fields and from external data."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import torchless
from torchless.core.errors import UnsupportedError
from torchless.formats.onnx.dtypes import ONNX_TYPES, PackedTensor, code_for, onnx_type, pack_bits, packed_nbytes, unpack_bits

NUMERIC = [c for c, t in ONNX_TYPES.items() if t.dtype is not None]


def _values(code: int, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    t = ONNX_TYPES[code]
    n = int(np.prod(shape))
    el = t.element
    if el.kind == "b":
        return rng.integers(0, 2, n).astype(bool).reshape(shape)
    if el.kind in "iu" and el.type.__module__ == "numpy":
        info = np.iinfo(el)
        return rng.integers(info.min, info.max, n, dtype=el, endpoint=True).reshape(shape)
    if el.kind == "c":
        return (rng.standard_normal(n) + 1j * rng.standard_normal(n)).astype(el).reshape(shape)
    if el.kind == "f":
        return rng.standard_normal(n).astype(el).reshape(shape)
    # ml_dtypes types (bfloat16, float8/6/4, int4/uint4/int2/uint2): every bit pattern
    bits = t.bits or el.itemsize * 8
    codes = rng.integers(0, 1 << bits, n).astype(np.uint8 if bits <= 8 else np.uint16)
    return codes.view(el).reshape(shape)


def _model(onnx, tensors):
    from onnx import helper

    nodes = [helper.make_node("Identity", [t.name], [t.name + "_out"]) for t in tensors]
    outs = [helper.make_tensor_value_info(t.name + "_out", t.data_type, list(t.dims)) for t in tensors]
    g = helper.make_graph(nodes, "alltypes", [], outs, initializer=tensors)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def _same(a: np.ndarray, b: np.ndarray) -> None:
    assert a.dtype == b.dtype, (a.dtype, b.dtype)
    assert a.shape == b.shape
    assert np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(b).tobytes()


@pytest.mark.parametrize("form", ["raw", "typed"])
def test_every_dtype_matches_numpy_helper(onnx, tmp_path, form):
    from onnx import numpy_helper

    rng = np.random.default_rng(0)
    tensors = []
    for code in NUMERIC:
        for shape in [(3, 5), (7,), (), (0, 2)]:
            arr = _values(code, shape, rng)
            name = f"{ONNX_TYPES[code].name}_{'x'.join(map(str, shape)) or 'scalar'}"
            if form == "raw":
                tp = numpy_helper.from_array(arr, name)
            else:
                tp = onnx.helper.make_tensor(
                    name, code, list(shape), arr.reshape(-1).tolist() if code not in (14, 15) else arr.reshape(-1), raw=False
                )
            assert tp.data_type == code
            if form == "typed":
                assert not tp.HasField("raw_data")
            tensors.append(tp)
    path = tmp_path / "alltypes.onnx"
    onnx.save(_model(onnx, tensors), str(path))
    loaded = onnx.load(str(path))
    with torchless.open(path) as art:
        assert art.format == "onnx"
        names = [n for n, _ in art.tensors()]
        assert names == [t.name for t in loaded.graph.initializer]
        for tp in loaded.graph.initializer:
            t = art[tp.name]
            want = numpy_helper.to_array(tp)
            got = t.numpy()
            _same(got, want)
            otype = ONNX_TYPES[tp.data_type]
            assert t.nbytes == otype.nbytes(int(np.prod(tp.dims)))
            assert isinstance(t, PackedTensor) == otype.packed
            if form == "raw":  # the stored bytes are raw_data, unchanged
                assert bytes(t.numpy(raw=True).reshape(-1).view(np.uint8)) == tp.raw_data
        assert art.verify() == []


def test_every_dtype_external(onnx, tmp_path):
    from onnx import numpy_helper
    from onnx.external_data_helper import convert_model_to_external_data

    rng = np.random.default_rng(1)
    tensors = [numpy_helper.from_array(_values(code, (9, 4), rng), ONNX_TYPES[code].name) for code in NUMERIC]
    model = _model(onnx, tensors)
    convert_model_to_external_data(model, location="w.bin", size_threshold=0)
    onnx.save(model, str(tmp_path / "ext.onnx"))
    loaded = onnx.load(str(tmp_path / "ext.onnx"), load_external_data=False)
    with torchless.open(tmp_path / "ext.onnx") as art:
        for tp in loaded.graph.initializer:
            assert tp.data_location == 1
            want = numpy_helper.to_array(tp, str(tmp_path))
            _same(art[tp.name].numpy(), want)
            rec = next(r for r in art.records if r.name == tp.name)
            assert rec.storage == "external" and rec.external.location == "w.bin"
            # zero copy: the storage is a view of the memory-mapped data file
            mv = art[tp.name].storage.bytes()
            assert isinstance(mv.obj, __import__("mmap").mmap)
        assert [p for p in art.verify() if p.severity == "error"] == []


def test_string_tensors_are_refused_clearly(onnx, tmp_path):
    from onnx import helper, numpy_helper

    s = helper.make_tensor("labels", onnx.TensorProto.STRING, [2], [b"a", b"b"])
    f = numpy_helper.from_array(np.arange(3, dtype=np.float32), "w")
    onnx.save(_model(onnx, [s, f]), str(tmp_path / "s.onnx"))
    with torchless.open(tmp_path / "s.onnx") as art:
        assert [n for n, _ in art.tensors()] == ["w"]
        with pytest.raises(UnsupportedError, match="STRING"):
            art["labels"]
        assert "labels" in art.info()["unsupported_tensors"]
        assert any(p.code == "unsupported-tensor" and p.severity == "warning" for p in art.verify())
    with pytest.raises(UnsupportedError):
        onnx_type(8)
    with pytest.raises(UnsupportedError):
        onnx_type(99)


def test_dtype_codes_match_onnx(onnx):
    from onnx import helper

    for code, t in ONNX_TYPES.items():
        assert onnx.TensorProto.DataType.Name(code) == t.name
        if t.dtype is None:
            continue
        assert np.dtype(helper.tensor_dtype_to_np_dtype(code)) == t.element, t.name
        assert helper.tensor_dtype_to_field(code) == t.field, t.name
        assert code_for(t.dtype) == code
    # the spec's torch -> ONNX table
    for name, code in {
        "float32": 1,
        "bfloat16": 16,
        "float8_e4m3fn": 17,
        "float8_e5m2fnuz": 20,
        "complex128": 15,
        "bool": 9,
        "uint64": 13,
    }.items():
        assert code_for(name) == code
    with pytest.raises(UnsupportedError):
        code_for("qint8")


@settings(max_examples=60, deadline=None)
@given(bits=st.sampled_from([2, 4, 6]), n=st.integers(0, 40), seed=st.integers(0, 2**31))
def test_pack_unpack_roundtrip_matches_onnx(bits, n, seed):
    onnx = pytest.importorskip("onnx")
    from onnx import numpy_helper as nh

    codes = np.random.default_rng(seed).integers(0, 1 << bits, n).astype(np.uint8)
    packed = pack_bits(codes, bits)
    assert len(packed) == packed_nbytes(n, bits)
    ref = {2: nh._pack_2bitx4, 4: nh._pack_4bitx2, 6: nh._pack_6bit}[bits](codes)
    assert bytes(ref) == packed
    np.testing.assert_array_equal(unpack_bits(packed, n, bits), codes)
    del onnx


def test_packed_tensor_values_are_ml_dtypes(onnx, tmp_path):
    from onnx import numpy_helper

    arr = np.array([-8, 7, 0, 1, -1], dtype=ml_dtypes.int4)
    tp = numpy_helper.from_array(arr, "q")
    onnx.save(_model(onnx, [tp]), str(tmp_path / "q.onnx"))
    with torchless.open(tmp_path / "q.onnx") as art:
        t = art["q"]
        assert t.dtype.name == "int4" and t.shape == (5,) and t.nbytes == 3
        _same(t.numpy(), arr)
        assert t.numpy(raw=True).tolist() == list(tp.raw_data)
