"""External data: strict location and bounds checks (hostile models are refused with
torchless errors), checksums and unknown keys reported by verify."""

from __future__ import annotations

import hashlib
import os

import numpy as np
import pytest

import torchless
from torchless.core.errors import FormatError, NotFoundError, TorchlessError, TruncatedError, UnsupportedError


def _write(onnx, d, entries, *, data=b"\x00" * 64, dims=(4,), data_name="w.bin", data_location=1):
    """A model whose one initializer (float32, ``dims``) has the given external_data."""
    from onnx import TensorProto, helper

    os.makedirs(d, exist_ok=True)
    if data is not None:
        with open(os.path.join(d, data_name), "wb") as f:
            f.write(data)
    tp = TensorProto()
    tp.name = "w"
    tp.data_type = TensorProto.FLOAT
    tp.dims.extend(dims)
    tp.data_location = data_location
    for k, v in entries:
        e = tp.external_data.add()
        e.key, e.value = k, v
    g = helper.make_graph(
        [helper.make_node("Identity", ["w"], ["y"])],
        "g",
        [],
        [helper.make_tensor_value_info("y", 1, list(dims))],
        initializer=[tp],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    path = os.path.join(d, "m.onnx")
    with open(path, "wb") as f:
        f.write(m.SerializeToString())
    return path


def _open_all(path):
    with torchless.open(path) as art:
        for _n, t in art.tensors():
            t.numpy()


def test_good_reference(onnx, tmp_path):
    data = np.arange(16, dtype=np.float32).tobytes()
    p = _write(onnx, tmp_path, [("location", "w.bin"), ("offset", "16"), ("length", "16")], data=data)
    with torchless.open(p) as art:
        np.testing.assert_array_equal(art["w"].numpy(), [4, 5, 6, 7])
        assert art.verify() == []
    np.testing.assert_array_equal(onnx.numpy_helper.to_array(onnx.load(p).graph.initializer[0]), [4, 5, 6, 7])


@pytest.mark.parametrize(
    "location, match",
    [
        ("../secret.bin", "path traversal"),
        ("sub/../../secret.bin", "path traversal"),
        ("..\\secret.bin", "path traversal"),
        ("/etc/passwd", "absolute"),
        ("\\\\server\\share\\x", "absolute"),
        ("C:\\Windows\\x", "absolute"),
        ("", "empty"),
        ("w.bin\x00.txt", "NUL"),
    ],
)
def test_hostile_locations_refused(onnx, tmp_path, location, match):
    (tmp_path / "secret.bin").write_bytes(b"\x01" * 64)
    p = _write(onnx, tmp_path / "model", [("location", location), ("length", "16")])
    with pytest.raises(FormatError, match=match) as ei:
        _open_all(p)
    assert ei.value.member == "w" and ei.value.path == p


def test_symlink_escape_refused(onnx, tmp_path):
    (tmp_path / "secret.bin").write_bytes(b"\x01" * 64)
    d = tmp_path / "model"
    p = _write(onnx, d, [("location", "link.bin"), ("length", "16")], data=None)
    os.symlink(tmp_path / "secret.bin", d / "link.bin")
    with pytest.raises(FormatError, match="symlink escape"):
        _open_all(p)
    # a linked directory that leaves the model's folder too
    os.symlink(tmp_path, d / "up")
    p = _write(onnx, d, [("location", "up/secret.bin"), ("length", "16")], data=None)
    with pytest.raises(FormatError, match="symlink escape"):
        _open_all(p)


def test_symlink_inside_directory_is_fine(onnx, tmp_path):
    d = tmp_path / "model"
    p = _write(onnx, d, [("location", "link.bin"), ("length", "16")])
    os.symlink("w.bin", d / "link.bin")
    with torchless.open(p) as art:
        assert art["w"].numpy().tolist() == [0, 0, 0, 0]


@pytest.mark.parametrize(
    "entries, err, match",
    [
        ([("location", "w.bin"), ("offset", "65")], TruncatedError, "offset is past the end"),
        ([("location", "w.bin"), ("offset", "56"), ("length", "16")], TruncatedError, "past the end"),
        ([("location", "w.bin"), ("length", "99999999999999999999")], TruncatedError, "past the end"),
        ([("location", "w.bin"), ("offset", "-1"), ("length", "16")], FormatError, "non-negative decimal"),
        ([("location", "w.bin"), ("offset", "0x10"), ("length", "16")], FormatError, "non-negative decimal"),
        ([("location", "w.bin"), ("length", " 16")], FormatError, "non-negative decimal"),
        ([("location", "w.bin"), ("length", "12")], FormatError, "does not match"),
        ([("location", "w.bin")], FormatError, "does not match"),  # whole file: 64 bytes for 16 wanted
        ([("offset", "0"), ("length", "16")], FormatError, "without a location"),
        ([("location", "w.bin"), ("location", "w.bin"), ("length", "16")], FormatError, "duplicate"),
        ([("location", "missing.bin"), ("length", "16")], NotFoundError, "not found"),
        ([("location", "."), ("length", "16")], FormatError, "not a regular file"),
    ],
)
def test_hostile_bounds_refused(onnx, tmp_path, entries, err, match):
    p = _write(onnx, tmp_path, entries)
    with pytest.raises(err, match=match):
        _open_all(p)


def test_huge_dims_with_small_data_refused(onnx, tmp_path):
    p = _write(onnx, tmp_path, [("location", "w.bin"), ("length", "64")], dims=(1 << 40, 1 << 30))
    with pytest.raises(FormatError, match="does not match"):
        _open_all(p)


def test_bytes_model_refuses_external(onnx, tmp_path):
    p = _write(onnx, tmp_path, [("location", "w.bin"), ("length", "16")])
    from torchless.formats.onnx.handler import OnnxArtifact

    with pytest.raises(UnsupportedError):
        OnnxArtifact(open(p, "rb").read())


def test_checksum_and_unknown_keys_reported(onnx, tmp_path):
    data = np.arange(4, dtype=np.float32).tobytes()
    good = hashlib.sha1(data).hexdigest()
    p = _write(onnx, tmp_path / "a", [("location", "w.bin"), ("length", "16"), ("checksum", good), ("evil", "x")], data=data)
    with torchless.open(p) as art:
        probs = art.verify()
    assert [(x.code, x.severity) for x in probs] == [("external-data-key", "warning")]
    p = _write(onnx, tmp_path / "b", [("location", "w.bin"), ("length", "16"), ("checksum", "0" * 40)], data=data)
    with torchless.open(p) as art:
        probs = art.verify()
        assert art["w"].numpy().tolist() == [0, 1, 2, 3]  # reading does not check; verify does
    assert [x.code for x in probs if x.severity == "error"] == ["checksum"]


def test_overlapping_ranges_warned(onnx, tmp_path):
    from onnx import TensorProto, helper

    (tmp_path / "w.bin").write_bytes(np.arange(8, dtype=np.float32).tobytes())
    tps = []
    for name, off in (("a", 0), ("b", 8)):
        tp = TensorProto(name=name, data_type=1, dims=[4], data_location=1)
        for k, v in (("location", "w.bin"), ("offset", str(off)), ("length", "16")):
            e = tp.external_data.add()
            e.key, e.value = k, v
        tps.append(tp)
    g = helper.make_graph([], "g", [], [], initializer=tps)
    (tmp_path / "m.onnx").write_bytes(helper.make_model(g).SerializeToString())
    with torchless.open(tmp_path / "m.onnx") as art:
        assert art["b"].numpy().tolist() == [2, 3, 4, 5]
        assert [p.code for p in art.verify()] == ["external-overlap"]


def test_external_entries_on_inline_tensor_warned(onnx, tmp_path):
    from onnx import TensorProto, helper

    tp = TensorProto(name="w", data_type=1, dims=[2], raw_data=np.array([1, 2], np.float32).tobytes())
    e = tp.external_data.add()
    e.key, e.value = "location", "../../etc/passwd"
    g = helper.make_graph([], "g", [], [], initializer=[tp])
    (tmp_path / "m.onnx").write_bytes(helper.make_model(g).SerializeToString())
    with torchless.open(tmp_path / "m.onnx") as art:
        # as in onnx, external_data is ignored unless data_location is EXTERNAL
        assert art["w"].numpy().tolist() == [1, 2]
        assert [(p.code, p.severity) for p in art.verify()] == [("external-data", "warning")]


def test_all_errors_are_torchless_errors(onnx, tmp_path):
    """Random external_data values: only TorchlessError subclasses come out."""
    rng = np.random.default_rng(3)
    vals = [
        "w.bin",
        "../w.bin",
        "/w.bin",
        "0",
        "16",
        "-5",
        "1e3",
        "",
        "w.bin/",
        "./w.bin",
        "a/../w.bin",
        "\u2603",
        "18446744073709551616",
    ]
    keys = ["location", "offset", "length", "checksum", "basepath", "x"]
    for i in range(80):
        entries = [(keys[rng.integers(0, len(keys))], vals[rng.integers(0, len(vals))]) for _ in range(rng.integers(0, 4))]
        p = _write(onnx, tmp_path / str(i), entries)
        try:
            _open_all(p)
        except TorchlessError:
            pass
