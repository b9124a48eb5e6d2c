"""Issue 11: data correctness, each case against torch/NumPy as the oracle.

Items 1-5 and 7 of the issue (NumPy arrays referenced twice, the load policy, unknown
options, one tensor coercion for every writer, load -> save closure, 0-d and bfloat16
in .npz) and the exactness classes found by differential fuzzing.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import decimal
import io
import pathlib
import pickle

import ml_dtypes
import numpy as np
import pytest

import torchless
from torchless.core.errors import UsageError
from torchless.core.tensor import Tensor, as_tensor

torch = pytest.importorskip("torch", reason="torch is the differential oracle")


def torch_bytes(obj, **kw) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf, **kw)
    return buf.getvalue()


def tl_bytes(obj) -> bytes:
    buf = io.BytesIO()
    torchless.save(obj, buf)
    return buf.getvalue()


def tl_load(data: bytes, weights_only: bool = True):
    return torchless.open(data, format="pt", weights_only=weights_only).load()


# -- item 1: BUILD that replaces its object ------------------------------------------
def test_numpy_array_referenced_twice_is_one_array():
    a = np.arange(6.0).reshape(2, 3)
    got = tl_load(torch_bytes({"x": a, "y": a, "l": [a]}, pickle_protocol=2))
    ref = torch.load(io.BytesIO(torch_bytes({"x": a, "y": a, "l": [a]})), weights_only=False)
    assert type(got["y"]) is np.ndarray and got["x"] is got["y"] is got["l"][0]
    assert ref["x"] is ref["y"]
    np.testing.assert_array_equal(got["y"], a)


@pytest.mark.parametrize("arr", [
    np.zeros(3, ">M8[10ms]"),
    np.arange(3, dtype=">i4"),
    np.array(["ab", "c"], dtype=">U2"),
    np.zeros(2, np.dtype({"names": ["a", "b"], "formats": ["<i4", "<f8"], "offsets": [0, 8], "itemsize": 24})),
    np.zeros(2, np.dtype([("a", "u1"), ("b", "<f4")], align=True)),
    np.zeros((2,), (">i4", (2,))),
    np.array([np.timedelta64(5, "us")]),
], ids=["datetime-unit", "big-endian", "unicode-be", "struct-padding", "struct-aligned", "subarray", "timedelta"])
def test_numpy_values_as_numpy_unpickles_them(arr):
    data = torch_bytes({"v": arr, "w": arr.dtype, "again": arr.dtype})
    ref = pickle.loads(pickle.dumps(arr))  # NumPy's own unpickling is the oracle
    got = tl_load(data)
    assert got["v"].dtype == ref.dtype and got["v"].dtype.str == ref.dtype.str
    assert got["w"] == arr.dtype and got["again"] is got["w"]
    assert got["v"].tobytes() == ref.tobytes()


def test_fortran_object_array_cells():
    o = np.empty((2, 3), object, order="F")
    o[:] = [[1, "a", None], [4.0, (5,), 6]]
    got = tl_load(torch_bytes({"o": o}))
    assert got["o"].tolist() == o.tolist() and got["o"].flags.f_contiguous


# -- items 2 and 3: one load policy, unknown options refused ------------------------------
def test_load_policy_is_decided_once(tmp_path):
    p = tmp_path / "m.pt"
    torch.save({"w": torch.ones(2), "o": argparse.ArgumentParser}, p)  # a class: not allowlisted
    art = torchless.open(p, weights_only=False)
    with pytest.raises(UsageError, match="weights_only=False"):
        art.load(weights_only=True)
    assert art.load(weights_only=False)["w"].shape == (2,)
    assert art.load()["w"].shape == (2,)
    st = tmp_path / "m.safetensors"
    torchless.save({"w": np.ones(2, np.float32)}, st)
    with pytest.raises(UsageError):
        torchless.open(st).load(weights_only=False)
    assert torchless.load(st, weights_only=False)["w"].shape == (2,)


@pytest.mark.parametrize("ext", [".pt", ".safetensors", ".npz"])
def test_unknown_options_are_usage_errors(tmp_path, ext):
    p = tmp_path / f"m{ext}"
    torchless.save({"w": np.ones(2, np.float32)}, p)
    for call in (lambda: torchless.open(p, mmapp=True), lambda: torchless.load(p, mmapp=True),
                 lambda: torchless.save({"w": np.ones(1)}, tmp_path / f"o{ext}", mmapp=1),
                 lambda: torchless.convert(p, tmp_path / f"c{ext}", mmapp=1)):
        with pytest.raises(UsageError, match="mmapp") as ei:
            call()
        assert "weights_only" in str(ei.value) or "progress" in str(ei.value)
    with pytest.raises(UsageError, match="max_shard_size"):
        torchless.save({"w": np.ones(1)}, tmp_path / "x.pt", max_shard_size="1MB")


# -- item 4: one coercion for every writer ----------------------------------------------
WRITER_INPUTS = {
    "bf16": lambda: torch.arange(4, dtype=torch.bfloat16),
    "param": lambda: torch.nn.Parameter(torch.ones(2, 2)),
    "f8": lambda: torch.zeros(3, dtype=torch.float8_e4m3fn),
    "u16": lambda: torch.tensor([1, 2, 65535], dtype=torch.int32).to(torch.uint16),
    "strided": lambda: torch.arange(12.0).reshape(3, 4).t(),
    "np_bf16": lambda: np.arange(3).astype(ml_dtypes.bfloat16),
    "np_be": lambda: np.arange(3, dtype=">f4"),
    "tl": lambda: Tensor.from_numpy(np.ones(2, np.int16)),
    "scalar": lambda: torch.tensor(2.5),
}


@pytest.mark.parametrize("ext", [".pt", ".safetensors", ".npz"])
def test_every_writer_takes_every_tensor_kind(tmp_path, ext):
    src = {k: f() for k, f in WRITER_INPUTS.items()}
    p = tmp_path / f"m{ext}"
    torchless.save(src, p)
    back = torchless.load(p)
    for k, v in src.items():
        want = as_tensor(v)
        assert back[k].dtype == want.dtype and back[k].shape == want.shape, k
        assert back[k].tobytes() == want.tobytes(), k


def test_as_tensor_refuses_non_tensors():
    with pytest.raises(UsageError, match="not a tensor"):
        as_tensor([1, 2])
    with pytest.raises(UsageError):
        as_tensor(np.array(["a"]))


# -- item 5: load -> save is closed -----------------------------------------------------
def closure_objects():
    sd = torch.nn.Linear(2, 2).state_dict()  # OrderedDict with _metadata
    nt = torch.nested.nested_tensor([torch.ones(2), torch.zeros(3)])
    sp = torch.sparse_coo_tensor(torch.tensor([[0, 1]]), torch.tensor([1.0, 2.0]), (3,))
    q = torch.quantize_per_tensor(torch.linspace(-1, 1, 4), 0.1, 2, torch.quint8)
    return {
        "sd": sd, "counter": collections.Counter(a=2, b=1), "set": {1, 2}, "nested": nt, "sparse": sp,
        "q": q, "meta": torch.empty(2, 3, device="meta"), "c": 1 + 2j, "ba": bytearray(b"x"),
        "dtype": torch.bfloat16, "size": torch.Size([2, 3]), "dev": torch.device("cpu"),
    }


def test_load_save_closed_weights_only():
    obj = closure_objects()
    data = torch_bytes(obj)
    tl = tl_load(data)
    again = torch.load(io.BytesIO(tl_bytes(tl)), weights_only=True)
    ref = torch.load(io.BytesIO(data), weights_only=True)
    assert again["sd"]._metadata == ref["sd"]._metadata and type(again["sd"]) is collections.OrderedDict
    assert again["counter"] == ref["counter"] and type(again["counter"]) is collections.Counter
    assert again["set"] == ref["set"] and again["c"] == ref["c"] and again["ba"] == ref["ba"]
    for a, b in zip(again["nested"].unbind(), ref["nested"].unbind()):
        assert torch.equal(a, b)
    assert torch.equal(again["sparse"].to_dense(), ref["sparse"].to_dense())
    assert torch.equal(again["q"].int_repr(), ref["q"].int_repr()) and again["q"].q_scale() == ref["q"].q_scale()
    assert again["meta"].is_meta and again["meta"].shape == ref["meta"].shape
    assert again["dtype"] is torch.bfloat16 and again["size"] == ref["size"] and again["dev"] == ref["dev"]


def test_load_save_closed_python_values():
    obj = {
        "slice": slice(1, 5, 2), "range": range(1, 9, 3), "fs": frozenset({1, 2}), "dq": collections.deque([1, 2], 3),
        "dd": collections.defaultdict(list, {"a": [1]}), "ns": argparse.Namespace(lr=0.1, name="x"),
        "path": pathlib.PurePosixPath("/a/b"), "dt": datetime.datetime(2020, 1, 2, 3, 4, 5, 6), "d": datetime.date(2021, 5, 6),
        "td": datetime.timedelta(3, 4, 5), "dec": decimal.Decimal("1.25"), "np": np.array(["ab", "c"]),
        "npdt": np.dtype(">i4"), "m8": np.datetime64("2020-01-01", "ms"), "obj": np.array([1, "a", None], dtype=object),
        "arr": np.arange(3.0), "f64": np.float64(0.5),
    }
    tl = tl_load(torch_bytes(obj))
    again = torch.load(io.BytesIO(tl_bytes(tl)), weights_only=False)
    for k, v in obj.items():
        if k == "arr":  # NumPy arrays of torch dtypes are written as tensors
            assert torch.equal(again[k], torch.from_numpy(v))
        elif isinstance(v, np.ndarray):
            assert again[k].dtype == v.dtype and again[k].tolist() == v.tolist(), k
        elif k == "ns":
            assert vars(again[k]) == vars(v)
        else:
            assert again[k] == v and (type(again[k]) is type(v) or k == "f64"), k


# -- item 7: .npz shapes and non-NumPy dtypes ----------------------------------------------
def test_npz_zero_d_and_bfloat16_open_in_numpy(tmp_path):
    p = tmp_path / "x.npz"
    torchless.save({"s": torch.tensor(3.5), "bf": torch.arange(4, dtype=torch.bfloat16), "e": np.float16(1)}, p)
    with np.load(p) as z:
        d = dict(z)
    assert set(d) == {"s", "bf", "e"}
    assert d["s"].shape == () and d["s"] == 3.5 and d["e"].shape == ()
    assert d["bf"].dtype == np.dtype("V2")
    np.testing.assert_array_equal(d["bf"].view(ml_dtypes.bfloat16).astype(np.float32), np.arange(4, dtype=np.float32))
    back = torchless.load(p)
    assert back["s"].shape == () and back["bf"].dtype.name == "bfloat16"
