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


@pytest.mark.parametrize(
    "arr",
    [
        np.zeros(3, ">M8[10ms]"),
        np.arange(3, dtype=">i4"),
        np.array(["ab", "c"], dtype=">U2"),
        np.zeros(2, np.dtype({"names": ["a", "b"], "formats": ["<i4", "<f8"], "offsets": [0, 8], "itemsize": 24})),
        np.zeros(2, np.dtype([("a", "u1"), ("b", "<f4")], align=True)),
        np.zeros((2,), (">i4", (2,))),
        np.array([np.timedelta64(5, "us")]),
    ],
    ids=["datetime-unit", "big-endian", "unicode-be", "struct-padding", "struct-aligned", "subarray", "timedelta"],
)
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
    for call in (
        lambda: torchless.open(p, mmapp=True),
        lambda: torchless.load(p, mmapp=True),
        lambda: torchless.save({"w": np.ones(1)}, tmp_path / f"o{ext}", mmapp=1),
        lambda: torchless.convert(p, tmp_path / f"c{ext}", mmapp=1),
    ):
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
        "sd": sd,
        "counter": collections.Counter(a=2, b=1),
        "set": {1, 2},
        "nested": nt,
        "sparse": sp,
        "q": q,
        "meta": torch.empty(2, 3, device="meta"),
        "c": 1 + 2j,
        "ba": bytearray(b"x"),
        "dtype": torch.bfloat16,
        "size": torch.Size([2, 3]),
        "dev": torch.device("cpu"),
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
    for a, b in zip(again["nested"].unbind(), ref["nested"].unbind(), strict=False):
        assert torch.equal(a, b)
    assert torch.equal(again["sparse"].to_dense(), ref["sparse"].to_dense())
    assert torch.equal(again["q"].int_repr(), ref["q"].int_repr()) and again["q"].q_scale() == ref["q"].q_scale()
    assert again["meta"].is_meta and again["meta"].shape == ref["meta"].shape
    assert again["dtype"] is torch.bfloat16 and again["size"] == ref["size"] and again["dev"] == ref["dev"]


def test_load_save_closed_python_values():
    obj = {
        "slice": slice(1, 5, 2),
        "range": range(1, 9, 3),
        "fs": frozenset({1, 2}),
        "dq": collections.deque([1, 2], 3),
        "dd": collections.defaultdict(list, {"a": [1]}),
        "ns": argparse.Namespace(lr=0.1, name="x"),
        "path": pathlib.PurePosixPath("/a/b"),
        "dt": datetime.datetime(2020, 1, 2, 3, 4, 5, 6),
        "d": datetime.date(2021, 5, 6),
        "td": datetime.timedelta(3, 4, 5),
        "dec": decimal.Decimal("1.25"),
        "np": np.array(["ab", "c"]),
        "npdt": np.dtype(">i4"),
        "m8": np.datetime64("2020-01-01", "ms"),
        "obj": np.array([1, "a", None], dtype=object),
        "arr": np.arange(3.0),
        "f64": np.float64(0.5),
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


# -- exactness classes found by the differential fuzzer ----------------------------------
from torchless.container.zip import TorchZipWriter  # noqa: E402
from torchless.pickle.writer import Global, Persistent, Pickler2, Reduce  # noqa: E402

_EMPTY_HOOKS = Reduce(Global("collections", "OrderedDict"), ())


def _pid(storage_class: str, key, numel: int, location: str = "cpu") -> Persistent:
    mod = "torch.storage" if storage_class == "UntypedStorage" else "torch"
    return Persistent(("storage", Global(mod, storage_class), key, location, numel))


def _v2(pid, size, stride=None, offset=0, memo=None) -> Reduce:
    stride = stride if stride is not None else tuple(int(np.prod(size[i + 1 :])) for i in range(len(size)))
    return Reduce(
        Global("torch._utils", "_rebuild_tensor_v2"),
        (pid, offset, tuple(size), tuple(stride), False, _EMPTY_HOOKS),
        memo_key=memo,
    )


def _v3(pid, size, dtype: str, memo=None) -> Reduce:
    stride = tuple(int(np.prod(size[i + 1 :])) for i in range(len(size)))
    return Reduce(
        Global("torch._utils", "_rebuild_tensor_v3"),
        (pid, 0, tuple(size), stride, False, _EMPTY_HOOKS, Global("torch", dtype)),
        memo_key=memo,
    )


def crafted(obj, records: dict[str, bytes], *, byteorder: str = "little") -> bytes:
    """A zip checkpoint with a hand-written data.pkl (torch's layout otherwise)."""
    buf = io.BytesIO()
    with TorchZipWriter(buf, "archive") as zw:
        zw.write("data.pkl", Pickler2().dumps(obj))
        zw.write("byteorder", byteorder.encode())
        for name, data in records.items():
            zw.write(name, data)
        zw.write("version", b"3\n")
    return buf.getvalue()


def both(data: bytes, weights_only: bool = True):
    return tl_load(data, weights_only), torch.load(io.BytesIO(data), weights_only=weights_only)


def test_empty_storage_is_not_cached_per_key():
    obj = {"f": _v2(_pid("FloatStorage", "0", 0), (0,)), "l": _v2(_pid("LongStorage", "0", 0), (0,))}
    got, ref = both(crafted(obj, {"data/0": b""}))
    assert ref["f"].dtype == torch.float32 and ref["l"].dtype == torch.int64
    assert got["f"].dtype.name == "float32" and got["l"].dtype.name == "int64"


def test_meta_storage_is_not_cached_per_key():
    obj = {"m": _v2(_pid("FloatStorage", "0", 2, "meta"), (2,)), "c": _v2(_pid("FloatStorage", "0", 2), (2,))}
    got, ref = both(crafted(obj, {"data/0": np.array([1.5, 2.5], "<f4").tobytes()}))
    assert ref["m"].is_meta and not ref["c"].is_meta
    assert got["m"].device == "meta" and got["c"].device == "cpu"
    np.testing.assert_array_equal(got["c"].numpy(), ref["c"].numpy())


def test_str_and_int_keys_are_two_storages_of_one_record():
    obj = {"a": _v2(_pid("FloatStorage", "0", 2), (2,)), "b": _v2(_pid("FloatStorage", 0, 2), (2,))}
    got, ref = both(crafted(obj, {"data/0": np.array([1.0, 2.0], "<f4").tobytes()}))
    assert ref["a"].untyped_storage().data_ptr() != ref["b"].untyped_storage().data_ptr()
    assert got["a"].storage is not got["b"].storage
    np.testing.assert_array_equal(got["b"].numpy(), ref["b"].numpy())


def test_storage_record_named_in_another_case():
    obj = {"a": _v2(_pid("FloatStorage", "0", 2), (2,))}
    got, ref = both(crafted(obj, {"DATA/0": np.array([3.0, 4.0], "<f4").tobytes()}))
    np.testing.assert_array_equal(got["a"].numpy(), ref["a"].numpy())


def test_parameter_does_not_mark_the_shared_tensor():
    t = _v2(_pid("FloatStorage", "0", 3), (3,), memo="t")
    obj = {"t": t, "p": Reduce(Global("torch._utils", "_rebuild_parameter"), (t, True, _EMPTY_HOOKS))}
    got, ref = both(crafted(obj, {"data/0": np.ones(3, "<f4").tobytes()}))
    assert not isinstance(ref["t"], torch.nn.Parameter) and isinstance(ref["p"], torch.nn.Parameter)
    assert not got["t"].is_parameter and got["p"].is_parameter and got["p"].requires_grad
    assert got["t"].storage is got["p"].storage


@pytest.mark.parametrize(
    "storage_class,dtype,view",
    [
        ("FloatStorage", "int16", "<i2"),
        ("DoubleStorage", "float32", "<f4"),
        ("ComplexFloatStorage", "int16", "<i2"),
        ("ShortStorage", "bfloat16", None),
    ],
)
def test_big_endian_typed_storage_swapped_in_storage_units(storage_class, dtype, view):
    raw = np.arange(16, dtype=np.uint8).tobytes()
    isz = {"FloatStorage": 4, "DoubleStorage": 8, "ComplexFloatStorage": 8, "ShortStorage": 2}[storage_class]
    obj = {
        "x": _v3(
            _pid(storage_class, "0", 16 // isz),
            (16 // np.dtype(ml_dtypes.bfloat16 if dtype == "bfloat16" else view).itemsize,),
            dtype,
        )
    }
    got, ref = both(crafted(obj, {"data/0": raw}, byteorder="big"))
    assert got["x"].tobytes() == bytes(ref["x"].contiguous().view(torch.uint8).numpy())


def test_complex32_with_infinite_or_nan_imaginary_part():
    c = torch.tensor([complex(1, float("inf")), complex(2, float("nan")), complex(float("-inf"), 0)]).to(torch.complex32)
    got, ref = both(torch_bytes({"c": c}))
    want = ref["c"].to(torch.complex64).numpy()
    np.testing.assert_array_equal(got["c"].numpy().real, want.real)
    np.testing.assert_array_equal(got["c"].numpy().imag, want.imag)


@pytest.mark.parametrize("proto", [3, 4, 5])
def test_legacy_stream_any_protocol_any_name(tmp_path, proto):
    p = tmp_path / "weights.bin2"
    torch.save({"w": torch.arange(3.0)}, p, _use_new_zipfile_serialization=False, pickle_protocol=proto)
    assert torchless.detect(p) == "pt"
    np.testing.assert_array_equal(torchless.load(p)["w"].numpy(), [0.0, 1.0, 2.0])


def test_deque_loads():
    dq = collections.deque([1, torch.ones(2)], maxlen=5)
    got, ref = both(torch_bytes({"d": dq}), weights_only=False)
    assert type(got["d"]) is collections.deque and got["d"].maxlen == 5 and got["d"][0] == 1


def test_whole_module_in_the_legacy_format(tmp_path):
    p = tmp_path / "m.pt"
    m = torch.nn.Linear(2, 3)
    torch.save(m, p, _use_new_zipfile_serialization=False)
    o = torchless.load(p, weights_only=False)
    assert o.class_name == "torch.nn.modules.linear.Linear"
    np.testing.assert_array_equal(o.weight.numpy(), m.weight.detach().numpy())


@pytest.mark.parametrize("qdtype", ["quint4x2", "quint2x4"])
def test_packed_quantized_numpy_is_int_repr(qdtype):
    q = torch.quantize_per_tensor(torch.linspace(0, 1, 7), 0.1, 0, getattr(torch, qdtype))
    got, ref = both(torch_bytes({"q": q}))
    np.testing.assert_array_equal(got["q"].numpy(), ref["q"].int_repr().numpy())


def test_quantized_from_torch():
    from torchless.interop.torch import from_torch

    q = torch.quantize_per_channel(
        torch.randn(2, 3), torch.tensor([0.1, 0.2], dtype=torch.float64), torch.tensor([1, 2]), 0, torch.qint8
    )
    t = from_torch(q)
    assert t.quantizer["axis"] == 0 and t.quantizer["qscheme"] == "per_channel_affine"
    np.testing.assert_array_equal(t.numpy(), q.int_repr().numpy())
    np.testing.assert_allclose(t.dequantize(), q.dequantize().numpy())


# -- writes ------------------------------------------------------------------------------
def test_parameter_with_conj_neg_and_v3_dtypes_loads_in_torch():
    obj = {
        "conj": torch.nn.Parameter(torch.tensor([1 + 2j, 3 - 1j]).conj(), requires_grad=False),
        "neg": torch.nn.Parameter(torch.tensor([1 + 2j])._neg_view(), requires_grad=False),
        "f8": torch.nn.Parameter(torch.zeros(3, dtype=torch.float8_e4m3fn), requires_grad=False),
        "c32": torch.nn.Parameter(torch.zeros(2, dtype=torch.complex32), requires_grad=False),
        "u64": torch.nn.Parameter(torch.zeros(2, dtype=torch.uint64), requires_grad=False),
    }
    for wo in (True, False):
        back = torch.load(io.BytesIO(tl_bytes(obj)), weights_only=wo)
        for k, v in obj.items():
            assert isinstance(back[k], torch.nn.Parameter) and back[k].dtype == v.dtype, k
            assert back[k].is_conj() == v.is_conj() and back[k].is_neg() == v.is_neg(), k
            assert torch.equal(
                back[k].resolve_conj().resolve_neg().view(torch.uint8), v.resolve_conj().resolve_neg().view(torch.uint8)
            ), k


def test_same_tensor_twice_is_one_object():
    t = torch.arange(4.0)
    p = torch.nn.Parameter(torch.ones(2))
    back = torch.load(io.BytesIO(tl_bytes({"a": t, "b": t, "l": [t], "p": p, "q": p})), weights_only=True)
    assert back["a"] is back["b"] is back["l"][0] and back["p"] is back["q"]
    tl = Tensor.from_numpy(np.ones(2))
    back = torch.load(io.BytesIO(tl_bytes({"a": tl, "b": tl})), weights_only=True)
    assert back["a"] is back["b"]


def test_two_dtypes_viewing_one_storage_are_refused_like_torch():
    s = torch.zeros(4)
    with pytest.raises(RuntimeError):
        torch.save({"a": s, "b": s.view(torch.int32)}, io.BytesIO())
    with pytest.raises(UsageError, match="different types"):
        tl_bytes({"a": s, "b": s.view(torch.int32)})
    # uint8 and an UntypedStorage dtype (float8) over one storage: torch saves it
    u = torch.zeros(4, dtype=torch.uint8)
    back = torch.load(io.BytesIO(tl_bytes({"a": u, "b": u.view(torch.float8_e5m2)})), weights_only=True)
    assert back["b"].dtype == torch.float8_e5m2


def test_python_attributes_on_tensors_and_parameters_are_kept():
    x = torch.zeros(2)
    x.tag = "x"
    p = torch.nn.Parameter(torch.ones(2))
    p.lr_scale = 0.5
    for wo in (True, False):
        back = torch.load(io.BytesIO(tl_bytes({"x": x, "p": p})), weights_only=wo)
        assert back["x"].tag == "x" and back["p"].lr_scale == 0.5 and isinstance(back["p"], torch.nn.Parameter)
    got = tl_load(torch_bytes({"x": x, "p": p}))
    assert got["x"].attrs == {"tag": "x"} and got["p"].attrs == {"lr_scale": 0.5}


def test_empty_tensors_of_different_item_sizes():
    obj = {"a": torch.zeros(0), "b": torch.zeros(0, dtype=torch.float64), "c": torch.zeros(0, 3, dtype=torch.int8)}
    back = torch.load(io.BytesIO(tl_bytes(obj)), weights_only=True)
    for k, v in obj.items():
        assert back[k].dtype == v.dtype and back[k].shape == v.shape


def test_weight_writers_of_other_formats_use_the_same_coercion():
    """TorchScript set-weights and .pt2 state dicts take torch tensors of every dtype
    (bf16, Parameters) through as_tensor."""
    from torchless.formats.pt2.write import _as_tensor
    from torchless.formats.torchscript.write import replacement_array

    p = torch.nn.Parameter(torch.arange(4, dtype=torch.bfloat16).reshape(2, 2), requires_grad=False)
    t = _as_tensor("w", p)
    assert t.dtype.name == "bfloat16" and t.is_parameter and t.tobytes() == bytes(p.detach().view(torch.uint8).numpy())
    assert _as_tensor("s", 2.5).shape == ()
    target = Tensor.from_numpy(np.zeros((2, 2), ml_dtypes.bfloat16))
    arr = replacement_array(target, p, "w")
    np.testing.assert_array_equal(arr.astype(np.float32), p.detach().float().numpy())


def test_build_replacements_are_bounded():
    """BUILD that replaces its object rewrites the memo; a pickle doing it many times over
    a large memo hits a LimitError instead of running quadratically."""
    from torchless.core.errors import LimitError
    from torchless.pickle.globals import AllowlistResolver
    from torchless.pickle.machine import unpickle
    from torchless.pickle.torch_globals import DEFAULT_ALLOWLIST

    body = bytearray(b"\x80\x02")
    for i in range(60_000):
        body += b"]r" + i.to_bytes(4, "little") + b"0"
    state = b"(K\x03X\x01\x00\x00\x00>NNNJ\xff\xff\xff\xffJ\xff\xff\xff\xffK\x00t"
    for _ in range(400):
        body += b"cnumpy\ndtype\nX\x02\x00\x00\x00i4\x89\x88\x87R" + state + b"b0"
    body += b"N."
    with pytest.raises(LimitError, match="replace"):
        unpickle(bytes(body), AllowlistResolver(DEFAULT_ALLOWLIST))


def test_onnx_set_weights_takes_torch_bfloat16(tmp_path):
    onnx = pytest.importorskip("onnx", reason="ONNX models need the onnx package")
    from onnx import helper, numpy_helper

    from torchless.formats.onnx.write import set_weights

    b = np.arange(6, dtype=np.float32).astype(ml_dtypes.bfloat16)
    g = helper.make_graph([], "g", [], [], initializer=[numpy_helper.from_array(b, "b")])
    (tmp_path / "m.onnx").write_bytes(helper.make_model(g).SerializeToString())
    new = torch.nn.Parameter(-torch.arange(6, dtype=torch.bfloat16), requires_grad=False)
    set_weights(tmp_path / "m.onnx", {"b": new}, tmp_path / "n.onnx")
    got = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(tmp_path / "n.onnx")).graph.initializer}
    assert got["b"].tobytes() == bytes(new.detach().view(torch.uint8).numpy())
