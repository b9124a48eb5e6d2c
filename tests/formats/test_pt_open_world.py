"""Issue 31, classes 1-9: reads of torch-written checkpoints and writes that an open-world
differential fuzzer found differing from torch 2.13. Each test compares with torch:
``torch.load`` of torch's file against ``torchless`` on the same file, and ``torch.load``
of torchless's file against torch's own file of the same object (byte-for-byte where
torch's pickle is deterministic)."""

from __future__ import annotations

import io
import warnings
import zipfile

import numpy as np
import pytest

import torchless
from torchless.core.errors import TorchlessError

pytestmark = pytest.mark.differential
torch = pytest.importorskip("torch", reason="torch is the differential oracle")

warnings.filterwarnings("ignore", message=".*(ComplexHalf|nested tensors|TypedStorage).*")


def tsave(obj, **kw) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf, **kw)
    return buf.getvalue()


def tlsave(obj) -> bytes:
    buf = io.BytesIO()
    torchless.save(obj, buf)
    return buf.getvalue()


def tload(data: bytes, **kw):
    return torch.load(io.BytesIO(data), **kw)


def tlload(data: bytes, **kw):
    return torchless.open(data, format="pt", **kw).load()


def pkl(data: bytes) -> bytes:
    zf = zipfile.ZipFile(io.BytesIO(data))
    return zf.read(next(n for n in zf.namelist() if n.endswith("/data.pkl")))


def records(data: bytes) -> list[str]:
    return sorted(n.split("/", 1)[1] for n in zipfile.ZipFile(io.BytesIO(data)).namelist())


def partition(keys: list) -> list[int]:
    return [keys.index(k) for k in keys]


# -- 1. legacy: empty storages of several dtypes under one key ------------------------------
def test_legacy_empty_storage_key_shared_by_two_dtypes():
    """torch's legacy writer keys storages by StorageImpl and skips its dtype check for
    data pointer 0: an empty bfloat16 tensor and its float16 view share a key. torch's
    loader gives every later use of an empty key a new storage of that use's dtype."""
    a = torch.empty(0, dtype=torch.bfloat16)
    obj = {"a": a, "b": a.view(torch.float16), "c": a[0:0], "d": a.view(torch.float16).view(2, 0)}
    data = tsave(obj, _use_new_zipfile_serialization=False)
    ref = tload(data, weights_only=False)
    for mmap in (False, True):
        tl = tlload(data, mmap=mmap)
        assert {k: v.dtype.torch_name for k, v in tl.items()} == {k: str(v.dtype) for k, v in ref.items()}
        assert {k: v.shape for k, v in tl.items()} == {k: tuple(v.shape) for k, v in ref.items()}
        got = partition([id(v.storage) for v in tl.values()])
        want = partition([v.untyped_storage()._cdata for v in ref.values()])
        assert got == want == [0, 1, 2, 3]


# -- 2. nested tensors whose components have no dimensions --------------------------------
@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.nested.nested_tensor([torch.tensor(1.5), torch.tensor(-2.0), torch.tensor(3.0)]),
        lambda: torch.nested.nested_tensor([torch.ones(0, 3), torch.arange(6.0).reshape(2, 3)]).transpose(1, 2),
    ],
    ids=["0-d components", "empty component, transposed"],
)
def test_nested_components_read_as_torch(make):
    data = tsave({"n": make()})
    ref = tload(data, weights_only=True)["n"].unbind()
    got = tlload(data)["n"].unbind()
    assert len(got) == len(ref)
    for a, b in zip(got, ref, strict=True):
        assert a.shape == tuple(b.shape) and a.stride() == b.stride()
        np.testing.assert_array_equal(a.numpy(), b.numpy())


# -- 3. complex32 values: conj/neg bits and NaN payloads as torch resolves them --------------
def _c32(seed: int, n: int):
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 1 << 16, size=2 * n, dtype=np.uint16)
    raw[::3] = (raw[::3] & 0x83FF) | 0x7C00  # infinities and NaNs, signalling ones among them
    raw[1::7] = 0x7C01  # a signalling NaN for sure
    return torch.from_numpy(raw.view(np.int16).copy()).view(torch.float16).view(torch.complex32)


@pytest.mark.parametrize("kind", ["plain", "conj", "neg"])
def test_complex32_values_bit_exact(kind):
    c = _c32(31, 37)
    v = {"plain": c, "conj": c.conj(), "neg": c._neg_view()}[kind]
    data = tsave({"v": v})
    ref = tload(data, weights_only=True)["v"]
    assert (ref.is_conj(), ref.is_neg()) == (kind == "conj", kind == "neg")
    want = ref.resolve_conj().resolve_neg().to(torch.complex64).view(torch.float32).view(torch.int32).numpy()
    tl = tlload(data)["v"]
    got = np.ascontiguousarray(tl.numpy()).view(np.float32).view(np.int32)
    np.testing.assert_array_equal(got.reshape(want.shape), want)
    # the stored halves themselves are untouched
    assert np.ascontiguousarray(tl.numpy(raw=True)).tobytes() == bytes(c.untyped_storage())


# -- 4. per-channel quantizers with float qparams -------------------------------------------
def test_per_channel_float_qparams_qscheme():
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(4))
    q = torch.quantize_per_channel(x, torch.tensor([0.1, 0.2, 0.3]), torch.tensor([0.0, 1.5, 2.0]), 0, torch.quint8)
    assert q.qscheme() == torch.per_channel_affine_float_qparams
    data = tsave({"q": q})
    assert tload(data, weights_only=True)["q"].qscheme() == q.qscheme()
    tl = tlload(data)
    assert tl["q"].quantizer["qscheme"] == "per_channel_affine_float_qparams"
    for source in (tl, {"q": q}):
        out = tlsave(source)
        assert pkl(out) == pkl(data)  # torch writes per_channel_affine for both schemes
        for wo in (True, False):
            back = tload(out, weights_only=wo)["q"]
            assert back.qscheme() == q.qscheme()
            assert torch.equal(back.int_repr(), q.int_repr())
            assert torch.equal(back.q_per_channel_zero_points(), q.q_per_channel_zero_points())


# -- 5. legacy streams pickled at protocols 0 and 1 --------------------------------------------
def test_legacy_protocol_0_and_1(tmp_path):
    plain = {"a": 1, "b": [1.5, "x", None, (2, 3)], "c": b"\x00\xff", "d": {"e": -(2**70)}}
    tensors = {"a": torch.arange(5.0), "b": torch.ones(2, 3, dtype=torch.float16).t(), "n": 7}
    for protocol, obj in ((0, plain), (1, plain), (1, tensors)):
        data = tsave(obj, _use_new_zipfile_serialization=False, pickle_protocol=protocol)
        ref = tload(data, weights_only=False)
        p = tmp_path / f"p{protocol}.pt"
        p.write_bytes(data)
        for tl in (tlload(data, weights_only=False), torchless.load(p, weights_only=False)):
            assert list(tl) == list(ref)
            for k, v in ref.items():
                if isinstance(v, torch.Tensor):
                    assert tl[k].dtype.torch_name == str(v.dtype) and tl[k].stride() == v.stride()
                    np.testing.assert_array_equal(tl[k].numpy(), v.numpy())
                else:
                    assert tl[k] == v
    # protocol 0 writes a storage's persistent id as text: torch refuses it, so does torchless
    data = tsave(tensors, _use_new_zipfile_serialization=False, pickle_protocol=0)
    with pytest.raises(AssertionError):
        tload(data, weights_only=False)
    with pytest.raises(TorchlessError):
        tlload(data, weights_only=False)


# -- 6. bytes ---------------------------------------------------------------------------------
def test_empty_bytes_load_weights_only():
    """bytearray(b'') was written as bytearray(builtins.bytes()), which torch's weights-only
    loader refuses (torch writes bytearray()); b'' itself torch's protocol-2 pickler writes
    as builtins.bytes(), refused too: torchless writes every bytes value as
    _codecs.encode(text, 'latin1'), which that loader allows."""
    obj = {"ba": bytearray(b""), "bb": bytearray(b"a\xff"), "f": b"\x00\xff", "l": [b"x", b"x"]}
    out = tlsave(obj)
    assert pkl(out) == pkl(tsave(obj))
    for wo in (True, False):
        assert tload(out, weights_only=wo) == obj
    empty = {"e": b"", "l": [b"", bytearray()]}
    out = tlsave(empty)
    for wo in (True, False):
        assert tload(out, weights_only=wo) == empty
    assert b"builtins\nbytes\n" not in pkl(out) and b"__builtin__\nbytes\n" not in pkl(out)


# -- 7. Parameters: their data is pickled detached --------------------------------------------
@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.nn.Parameter(torch.randn(3, dtype=torch.complex64)._neg_view()),
        lambda: torch.nn.Parameter(torch.randn(3, dtype=torch.complex64).conj()),
        lambda: torch.nn.Parameter(torch.ones(3)),
        lambda: torch.nn.Parameter(torch.empty(2, device="meta")),
        lambda: torch.nn.Parameter(torch.arange(4.0).to(torch.float8_e4m3fn)),
        lambda: torch.nn.Parameter(torch.ones(2, dtype=torch.complex32)),
    ],
    ids=["neg", "conj", "plain", "meta", "float8", "complex32"],
)
def test_parameter_written_as_torch(make):
    """torch pickles a Parameter's data detached (requires_grad False) inside
    _rebuild_parameter; torchless wrote it with the Parameter's flag, and for the dtypes
    of _rebuild_tensor_v3 (float8, complex32...) torch's full load of that fails ("a leaf
    Variable that requires grad is being used in an in-place operation")."""
    p = make()
    data = tsave({"p": p})
    for source in ({"p": p}, tlload(data)):
        out = tlsave(source)
        for wo in (False, True):
            back = tload(out, weights_only=wo)["p"]
            assert isinstance(back, torch.nn.Parameter) and back.requires_grad
            assert back.is_neg() == p.is_neg() and back.is_conj() == p.is_conj()
        assert pkl(out) == pkl(data)


# -- 8. empty tensors sharing one storage ------------------------------------------------------
def test_empty_tensors_sharing_a_storage_written_once():
    a = torch.empty(0)
    obj = {"a": a, "b": a[0:0], "c": a.view(0, 3), "d": torch.empty(0)}
    data = tsave(obj)
    out = tlsave(obj)
    assert records(out) == records(data)
    assert pkl(out) == pkl(data)
    back = tload(out, weights_only=True)
    assert {k: (v.shape, v.dtype) for k, v in back.items()} == {k: (v.shape, v.dtype) for k, v in obj.items()}


# -- 9. nested tensors: Parameters, attributes --------------------------------------------
def _nested_with_attr():
    n = torch.nested.nested_tensor([torch.ones(2), torch.arange(3.0)])
    n.note = "x"
    return n


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.nn.Parameter(torch.nested.nested_tensor([torch.ones(2), torch.arange(3.0)])),
        _nested_with_attr,
        lambda: torch.nested.nested_tensor([torch.tensor(1.0), torch.tensor(2.0)]),
    ],
    ids=["parameter", "attribute", "0-d components"],
)
def test_nested_written_as_torch(make):
    n = make()
    data = tsave({"n": n, "again": n})
    for source in ({"n": n, "again": n}, tlload(data, weights_only=False)):
        out = tlsave(source)
        assert pkl(out) == pkl(data)
        back = tload(out, weights_only=False)
        assert back["n"] is back["again"]
        assert type(back["n"]) is type(n) and back["n"].is_nested and vars(back["n"]) == vars(n)
        for x, y in zip(back["n"].unbind(), n.unbind(), strict=True):
            assert torch.equal(x, y)
