"""safetensors and npz: read what the reference writers write, write what they read."""

from __future__ import annotations

import json
import struct

import ml_dtypes
import numpy as np
import pytest

import torchless
from torchless.core.errors import FormatError, LimitError, TorchlessError, TruncatedError, UnsupportedError
from torchless.core.tensor import Tensor
from torchless.formats.npz import write_npz
from torchless.formats.safetensors import read_safetensors, write_safetensors

ST = [
    "bool",
    "uint8",
    "int8",
    "int16",
    "uint16",
    "int32",
    "uint32",
    "int64",
    "uint64",
    "float16",
    "bfloat16",
    "float32",
    "float64",
    "float8_e4m3fn",
    "float8_e5m2",
    "float8_e4m3fnuz",  # issue 31 class 13: the safetensors package stores both FNUZ types
    "float8_e5m2fnuz",
]


def _torch():
    return pytest.importorskip("torch", reason="torch is the oracle")


@pytest.mark.differential
def test_safetensors_reference_files_read_exactly(tmp_path):
    torch = _torch()
    from safetensors.torch import load_file, save_file

    tensors = {}
    for name in ST:
        dt = getattr(torch, name)
        base = torch.linspace(-3, 5, 12).reshape(3, 4)
        tensors[name] = (base > 0) if name == "bool" else (base * 9).to(torch.int64).to(dt) if "int" in name else base.to(dt)
    tensors["empty"] = torch.empty(0, 2)
    tensors["scalar"] = torch.tensor(2.5)
    path = tmp_path / "ref.safetensors"
    save_file(tensors, str(path), metadata={"format": "pt"})
    art = torchless.open(path)
    assert art.format == "safetensors" and art.metadata == {"format": "pt"}
    got = dict(art.tensors())
    for k, v in tensors.items():
        assert got[k].dtype.torch_name == str(v.dtype) and got[k].shape == tuple(v.shape)
        assert np.ascontiguousarray(got[k].numpy()).tobytes() == bytes(v.contiguous().untyped_storage()) if v.numel() else True
    # torchless writes, safetensors reads
    out = tmp_path / "tl.safetensors"
    torchless.save(dict(art.tensors()), out)
    back = load_file(str(out))
    for k, v in tensors.items():
        assert back[k].dtype == v.dtype and torch.equal(back[k], v), k
    # torch checkpoint -> safetensors via convert keeps views' logical values
    ck = tmp_path / "views.pt"
    big = torch.arange(20, dtype=torch.bfloat16).reshape(4, 5)
    big2 = big.clone()
    torch.save({"T": big.t(), "slice": big2[1:3, ::2], "c": torch.tensor([1 + 2j]).conj()}, ck)
    res = torchless.convert(ck, tmp_path / "views.safetensors")
    assert res["tensors"] == 3
    v = load_file(str(tmp_path / "views.safetensors"))
    assert torch.equal(v["T"], big.t()) and torch.equal(v["slice"], big[1:3, ::2]) and torch.equal(v["c"], torch.tensor([1 - 2j]))
    # two different views overlapping in one storage: refused as save_file and save_pretrained do
    torch.save({"T": big.t(), "slice": big[1:3, ::2]}, ck)
    with pytest.raises(TorchlessError, match="overlap"):
        torchless.convert(ck, tmp_path / "views2.safetensors")
    assert not (tmp_path / "views2.safetensors").exists()


def _st_file(header: dict | bytes, data: bytes = b"", n: int | None = None) -> bytes:
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(raw) if n is None else n) + raw + data


@pytest.mark.parametrize(
    "blob,err",
    [
        (_st_file({}, b"", n=2**40), LimitError),
        (_st_file({}, b"", n=1000), TruncatedError),
        (_st_file(b"{not json"), FormatError),
        (_st_file(b"[1]"), FormatError),
        (_st_file({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, b"\x00" * 4), TruncatedError),
        (_st_file({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, b"\x00" * 8), FormatError),
        (_st_file({"a": {"dtype": "Q9", "shape": [2], "data_offsets": [0, 8]}}, b"\x00" * 8), UnsupportedError),
        (_st_file({"a": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}}, b"\x00" * 8), FormatError),
        (_st_file({"a": {"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}}, b"\x00" * 8), FormatError),
        (
            _st_file(
                {
                    "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                    "b": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                },
                b"\x00" * 8,
            ),
            FormatError,
        ),
        (_st_file({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}, b"\x00" * 8), FormatError),
        (_st_file({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, b"\x00" * 8), FormatError),
        (
            _st_file(
                b'{"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, '
                b'"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}',
                b"\x00" * 4,
            ),
            FormatError,
        ),
        (_st_file({"__metadata__": {"a": 1}}), FormatError),
        (_st_file({"a": {"dtype": "F32", "shape": [2**62, 2**62], "data_offsets": [0, 8]}}, b"\x00" * 8), FormatError),
        (b"\x01\x00", TruncatedError),
    ],
)
def test_safetensors_hostile_headers(blob, err):
    with pytest.raises(err):
        read_safetensors(blob)


def test_safetensors_refuses_what_it_cannot_store(tmp_path):
    with pytest.raises(UnsupportedError):
        write_safetensors([("c", Tensor.from_numpy(np.zeros(2, np.complex128)))], tmp_path / "x.safetensors")
    with pytest.raises(TorchlessError):
        write_safetensors([("a", np.zeros(1)), ("a", np.zeros(1))], tmp_path / "y.safetensors")
    assert not (tmp_path / "x.safetensors").exists()


def test_npz_reference_files_and_round_trip(tmp_path):
    arrays = {
        "f": np.arange(6, dtype=np.float32).reshape(2, 3),
        "F": np.asfortranarray(np.arange(6, dtype=np.int16).reshape(2, 3)),
        "be": np.arange(3, dtype=">f8"),
        "b": np.array([True, False]),
        "c": np.array([1 + 2j], np.complex64),
        "e": np.zeros((0, 3)),
    }
    p = tmp_path / "ref.npz"
    np.savez(p, **arrays)
    pc = tmp_path / "refc.npz"
    np.savez_compressed(pc, **arrays)
    for path in (p, pc):
        got = dict(torchless.open(path).tensors())
        for k, a in arrays.items():
            np.testing.assert_array_equal(got[k].numpy(), a)
            assert got[k].shape == a.shape
    single = tmp_path / "one.npy"
    np.save(single, arrays["F"])
    np.testing.assert_array_equal(torchless.open(single)["array"].numpy(), arrays["F"])
    out = tmp_path / "tl.npz"
    extra = {"bf16": np.arange(4).astype(ml_dtypes.bfloat16), "f8": np.linspace(-1, 1, 5).astype(ml_dtypes.float8_e5m2)}
    write_npz(list(arrays.items()) + list(extra.items()), out)
    with np.load(out) as z:
        for k, a in arrays.items():
            np.testing.assert_array_equal(z[k], a)
    back = dict(torchless.open(out).tensors())
    assert back["bf16"].dtype.name == "bfloat16" and back["f8"].dtype.name == "float8_e5m2"
    assert back["bf16"].numpy().tobytes() == extra["bf16"].tobytes()
    # object arrays are pickles: never loaded (a placeholder, as np.load refuses that member)
    obj = tmp_path / "obj.npz"
    np.savez(obj, o=np.array([{"a": 1}], dtype=object))
    with torchless.open(obj) as a:
        assert list(a.tensors()) == [] and type(a.load()["o"]).__name__ == "ObjectArray"


def test_npz_hostile(tmp_path):
    p = tmp_path / "ok.npz"
    np.savez(p, a=np.arange(100, dtype=np.int64))
    data = p.read_bytes()
    i = data.find(b"'shape': (")
    bad = data[:i] + data[i:].replace(b"(100,)", b"(900,)", 1)
    q = tmp_path / "bad.npz"
    q.write_bytes(bad)
    with pytest.raises(FormatError):
        torchless.open(q)
    bad2 = data[:i] + data[i:].replace(b"'shape'", b"'shapX'", 1)
    q.write_bytes(bad2)
    with pytest.raises(FormatError):
        torchless.open(q)


def test_npz_with_string_and_object_members_opens_like_np_load(tmp_path):
    """np.load(allow_pickle=False) opens an .npz holding a string array and an object array,
    gives the string array, and refuses only the object member. torchless does the same:
    the numeric arrays are tensors, the string array is a value equal to NumPy's, the
    object array a placeholder that is never unpickled; info lists them, convert names
    them as dropped, diff compares them."""
    import torchless
    from torchless.diff import diff
    from torchless.formats.npz import ObjectArray

    path = tmp_path / "m.npz"
    np.savez(path, w=np.arange(6.0).reshape(2, 3), names=np.array(["cat", "dog"]), o=np.array([{"x": 1}], dtype=object))
    ref = np.load(path, allow_pickle=False)
    with torchless.open(path) as a:
        assert [n for n, _ in a.tensors()] == ["w"]
        np.testing.assert_array_equal(dict(a.tensors())["w"].numpy(), ref["w"])
        got = a.load()
        np.testing.assert_array_equal(got["names"], ref["names"])
        assert got["names"].dtype == ref["names"].dtype
        with pytest.raises(ValueError):
            ref["o"]  # numpy refuses the pickle ...
        assert isinstance(got["o"], ObjectArray)  # ... and torchless never unpickles it
        assert set(a.info()["other_members"]) == {"names", "o"}
    res = torchless.convert(path, tmp_path / "m.safetensors")
    assert sorted(d["key"] for d in res["dropped"]) == ["names", "o"]
    assert diff(path, path)["identical"]
    other = tmp_path / "n.npz"
    np.savez(other, w=np.arange(6.0).reshape(2, 3), names=np.array(["cat", "cow"]), o=np.array([{"x": 2}], dtype=object))
    res = diff(path, other)
    assert res["same"] == 1 and sorted(c["name"] for c in res["values_changed"]) == ["names", "o"]


# names the real readers give back as written (numpy.load, safetensors.numpy.load_file)
_ROUND_TRIP_NAMES = ["", "a/b", "a.npy", "/abs", "../x", "a\\b", ".", "é", "a b", "\u2028"]
# (name, destination suffix): names the real reader cannot give back (issue 31 classes 14-15)
_REFUSED_NAMES = [
    ("__metadata__", ".safetensors"),  # the header's metadata key: the package fails on the whole header
    ("a\ud800b", ".safetensors"),  # a lone surrogate: not JSON the package parses
    ("a\x00b", ".npz"),  # zipfile cuts a member name at NUL: np.load would return "a"
    ("a\udcffb", ".npz"),  # np.savez: a plain UnicodeEncodeError
]


@pytest.mark.differential
@pytest.mark.parametrize("name", _ROUND_TRIP_NAMES)
def test_names_round_trip_through_the_real_readers(name, tmp_path):
    from safetensors.numpy import load_file

    arr = np.arange(3, dtype=np.int32)
    st, nz = tmp_path / "x.safetensors", tmp_path / "x.npz"
    torchless.save({name: arr, "other": arr + 1}, st)
    torchless.save({name: arr, "other": arr + 1}, nz)
    got = load_file(str(st))
    assert sorted(got) == sorted([name, "other"]) and np.array_equal(got[name], arr)
    with np.load(nz) as z:
        assert sorted(z.files) == sorted([name, "other"]) and np.array_equal(z[name], arr)


@pytest.mark.parametrize(("name", "suffix"), _REFUSED_NAMES)
def test_names_the_real_reader_cannot_read_are_refused(name, suffix, tmp_path):
    """Fails on the old code: the file was written (unreadable, or with the name cut) or
    a plain UnicodeEncodeError escaped."""
    out = tmp_path / f"x{suffix}"
    with pytest.raises(TorchlessError) as ei:
        torchless.save({"ok": np.zeros(2), name: np.ones(2)}, out)
    assert ascii(name)[1:-1] in str(ei.value)  # named, escaped
    assert not out.exists() and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name", ["__metadata__", "a\ud800b"])
def test_sharded_safetensors_refuses_a_bad_name_before_any_shard(name, tmp_path):
    items = {f"t{i}": np.zeros(64, np.float32) for i in range(4)}
    items[name] = np.zeros(64, np.float32)
    with pytest.raises(TorchlessError):
        torchless.write_tensors(items, tmp_path / "model.safetensors", max_shard_size=300)
    assert list(tmp_path.iterdir()) == []


def test_safetensors_metadata_must_be_utf8(tmp_path):
    with pytest.raises(TorchlessError):
        write_safetensors([("a", np.zeros(1))], tmp_path / "m.safetensors", metadata={"k": "\udc80"})
    assert list(tmp_path.iterdir()) == []
