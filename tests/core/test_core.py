"""core: dtypes table against torch, tensors (strides, bounds, byte order), trees, errors."""

from __future__ import annotations

import json
import os

import ml_dtypes
import numpy as np
import pytest

from torchless.core import dtypes
from torchless.core.errors import FormatError, LimitError, NotFoundError, TorchlessError, UnsupportedError, UsageError
from torchless.core.tensor import Storage, Tensor
from torchless.core.tree import describe, iter_tensors
from torchless.io.source import BytesSource, MmapSource, open_source


@pytest.mark.differential
def test_dtype_table_matches_torch():
    torch = pytest.importorskip("torch", reason="torch is the oracle")
    from torch.storage import _dtype_to_storage_type_map, _new_dtypes

    legacy = {str(k)[6:]: v for k, v in _dtype_to_storage_type_map().items()}
    for name, d in dtypes.DTYPES.items():
        td = getattr(torch, name)
        if name in legacy:
            assert d.legacy_storage == legacy[name], name
        if td in _new_dtypes():
            assert d.legacy_storage is None, name
        assert d.itemsize == torch.empty(0, dtype=td).element_size() or name.startswith(("uint", "int")) and len(name) == 5, name
        if d.numpy is not None and d.kind != "quantized":
            assert d.numpy.itemsize == d.itemsize


def test_by_name_aliases_and_errors():
    assert dtypes.by_name("torch.float") is dtypes.DTYPES["float32"]
    assert dtypes.by_name("bf16").name == "bfloat16"
    with pytest.raises(UnsupportedError):
        dtypes.by_name("float128")
    assert dtypes.from_numpy(ml_dtypes.bfloat16).name == "bfloat16"
    assert dtypes.from_numpy(">f4").name == "float32"
    with pytest.raises(UnsupportedError):
        dtypes.from_numpy("U3")


def test_tensor_views_and_bounds():
    t = Tensor.from_numpy(np.arange(12, dtype=np.int32).reshape(3, 4))
    v = Tensor(t.storage, t.dtype, (2, 2), (1, 4), 1)
    np.testing.assert_array_equal(v.numpy(), np.arange(12).reshape(3, 4).T[1:3, :2])
    assert not v.is_contiguous() and t.is_contiguous()
    with pytest.raises(FormatError):
        Tensor(t.storage, t.dtype, (2,), (11,), 1).numpy()
    with pytest.raises(FormatError):
        Tensor(t.storage, t.dtype, (2,), (1,), 11).numpy()
    with pytest.raises(FormatError):
        Tensor(t.storage, t.dtype, (2,), (-1,), 0)
    with pytest.raises(FormatError):
        Tensor(t.storage, t.dtype, (2, 2), (1,), 0)
    assert Tensor(t.storage, t.dtype, (0, 5), (100, 100), 500).numpy().shape == (0, 5)  # empty: never reads
    e = Tensor(t.storage, t.dtype, (3,), (0,), 2)
    np.testing.assert_array_equal(e.numpy(), [2, 2, 2])
    with pytest.raises(UnsupportedError):
        Tensor(None, t.dtype, (2,)).numpy()
    with pytest.raises(ValueError):
        t.numpy()[0, 0] = 5  # read-only views of the file
    with pytest.raises(UsageError):
        Tensor.from_numpy(np.zeros(2, np.float32), "float64")


@pytest.mark.parametrize("name", ["bfloat16", "float16", "float8_e4m3fn", "complex64", "complex32", "int64", "uint16"])
def test_big_endian_storage_gives_native_values(name):
    d = dtypes.DTYPES[name]
    if name == "complex32":
        native = np.array([(1.5, -2.0), (0.25, 8.0)], dtype=d.storage)
    else:
        native = np.arange(1, 5).astype(d.numpy)
    big = (
        native.astype(native.dtype.newbyteorder(">"))
        if d.numpy is None or d.numpy.kind != "V"
        else native.view(f"u{d.itemsize}").byteswap()
    )
    if name == "complex32":
        big = np.array(native, dtype=[("real", ">f2"), ("imag", ">f2")])
    st = Storage("0", big.nbytes, d, data=big.tobytes(), byteorder="big")
    t = Tensor(st, d, native.shape)
    if name == "complex32":
        np.testing.assert_array_equal(t.numpy(), native["real"].astype(np.float32) + 1j * native["imag"].astype(np.float32))
    else:
        assert np.ascontiguousarray(t.numpy()).astype(native.dtype).tobytes() == native.tobytes()
    assert t.tobytes() == native.tobytes()


def test_sources(tmp_path):
    p = tmp_path / "f.bin"
    p.write_bytes(b"0123456789")
    s = MmapSource(p)
    assert s.read_at(2, 3) == b"234"
    with pytest.raises(TorchlessError):
        s.view(8, 5)
    with pytest.raises(TorchlessError):
        s.read_at(-1, 2)
    with pytest.raises(NotFoundError):
        MmapSource(tmp_path / "missing")
    with pytest.raises(UsageError):
        MmapSource(tmp_path)
    (tmp_path / "empty").write_bytes(b"")
    assert MmapSource(tmp_path / "empty").size == 0
    assert open_source(b"abc").size == 3 and isinstance(open_source(bytearray(b"x")), BytesSource)
    with pytest.raises(UsageError):
        open_source(3.5)


def test_stream_source_name_is_text(tmp_path):
    # a file opened from a descriptor is named by that int: errors must still name a str path
    p = tmp_path / "x.bin"
    p.write_bytes(b"abc")
    with open(os.open(p, os.O_RDONLY), "rb") as f:
        src = open_source(f)
        assert src.name == str(f.name) and isinstance(src.name, str)
    assert bytes(src.read_at(0, 3)) == b"abc"


def test_tree_walks_graphs_once():
    t = Tensor.from_numpy(np.zeros(2, np.float32))
    shared = [t]
    for _ in range(100):
        shared = [shared, shared]
    tree = {"a": shared, "b": {"t": t}, "self": None}
    tree["self"] = tree
    names = [n for n, _ in iter_tensors(tree)]
    assert names[-1] == "b.t" and len(names) <= 102
    out = describe(tree)
    json.dumps(out)
    with pytest.raises(LimitError):
        list(iter_tensors([[[t]] * 10] * 10, max_nodes=5))
    assert list(iter_tensors(t, "x")) == [("x", t)]


def test_errors_carry_context():
    e = FormatError("bad thing", path="f.pt", member="a/data.pkl", offset=7, expected="x", found="y", hint="do z")
    s = str(e)
    assert s == "f.pt, member 'a/data.pkl', offset 7: bad thing (expected x, found y); do z"
    assert isinstance(e, ValueError) and e.to_dict()["offset"] == 7
    assert str(NotFoundError("nope", path="p")) == "p: nope"
    assert isinstance(NotFoundError("x"), KeyError) and isinstance(NotFoundError("x"), FileNotFoundError)


def test_sparse_to_dense_validates_indices():
    from torchless.core.tensor import SparseTensor

    def coo(idx, shape):
        return SparseTensor(
            "sparse_coo",
            shape,
            {
                "indices": Tensor.from_numpy(np.array(idx, np.int64)),
                "values": Tensor.from_numpy(np.ones(len(idx[0]), np.float32)),
            },
        )

    np.testing.assert_array_equal(coo([[0, 2, 2]], (3,)).to_dense(), [1, 0, 2])
    for idx in ([[0, 5]], [[0, -1]], [[0, 1], [0, 0]]):
        with pytest.raises(FormatError):
            coo(idx, (3,)).to_dense()
    csr = SparseTensor(
        "sparse_csr",
        (2, 2),
        {
            "compressed_indices": Tensor.from_numpy(np.array([0, 1, 2], np.int64)),
            "plain_indices": Tensor.from_numpy(np.array([0, 7], np.int64)),
            "values": Tensor.from_numpy(np.ones(2, np.float32)),
        },
    )
    with pytest.raises(FormatError):
        csr.to_dense()


@pytest.mark.parametrize("flat", [True, False])
def test_hold_many_keeps_what_hold_keeps(flat):
    """Storage.hold_many (the eager batch reader's one call for a run) leaves every
    storage as one hold() per storage would: None owners skipped, a storage holding
    bytes already, of another size or past the buffer's end left alone, a held one without its loader; a
    buffer that is not a flat byte view goes through hold() itself."""
    f32 = dtypes.by_name("float32")

    def make():
        out = [Storage(str(i), 8, f32, loader=lambda: b"\x00" * 8) for i in range(6)]
        out[2] = Storage("2", 8, f32, data=b"\x07" * 8)  # holds bytes already
        out[3] = Storage("3", 4, f32, loader=lambda: b"\x00" * 4)  # another size than its slice
        return out

    raw = np.arange(48, dtype=np.uint8)
    buf = memoryview(raw) if flat else bytearray(raw.tobytes())
    offs, sizes = [0, 8, 16, 24, 32, 44], [8] * 6  # (the last slice runs past the buffer)
    a, b = make(), make()
    Storage.hold_many([*a[:4], None, a[5]], buf, offs, sizes)
    for o, off, n in zip([*b[:4], None, b[5]], offs, sizes, strict=True):
        if o is not None:
            o.hold(buf[off : off + n])
    assert [x.loaded for x in a] == [True, True, True, False, False, False]
    for x, y in zip(a, b, strict=True):
        assert (x.loaded, x._loader is None) == (y.loaded, y._loader is None)
        assert bytes(x.bytes()) == bytes(y.bytes())
