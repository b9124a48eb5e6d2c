"""Issue 31: jagged-layout nested tensors (``torch.nested`` with ``layout=torch.jagged``,
torch's ``NestedTensor`` subclass) read from torch's files and written for torch, both
``weights_only`` modes, against torch 2.13 as the oracle."""

from __future__ import annotations

import io
import warnings

import numpy as np
import pytest

import torchless
from torchless.core.errors import FormatError
from torchless.core.tensor import JaggedTensor, Tensor

pytestmark = pytest.mark.differential
torch = pytest.importorskip("torch", reason="torch is the differential oracle")

warnings.filterwarnings("ignore", message=".*nested tensors.*")


def tsave(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def tlsave(obj) -> bytes:
    buf = io.BytesIO()
    torchless.save(obj, buf)
    return buf.getvalue()


def tload(data: bytes, **kw):
    return torch.load(io.BytesIO(data), **kw)


def tlload(data: bytes, **kw):
    return torchless.open(data, format="pt", **kw).load()


def _items():
    return torch.nested.nested_tensor([torch.arange(6.0).reshape(2, 3), torch.arange(9.0).reshape(3, 3)], layout=torch.jagged)


def _lengths():  # items shorter than the gaps between offsets
    return torch.nested.nested_tensor_from_jagged(
        torch.arange(20.0).reshape(10, 2), offsets=torch.tensor([0, 3, 7, 10]), lengths=torch.tensor([2, 4, 1])
    )


def _dim2():  # ragged in dimension 2 (values' dimension 1)
    return torch.nested.nested_tensor_from_jagged(
        torch.arange(24, dtype=torch.int32).reshape(2, 6, 2), offsets=torch.tensor([0, 2, 6]), jagged_dim=2
    )


def _attr():
    n = torch.nested.nested_tensor(
        [torch.ones(1, dtype=torch.bfloat16), torch.zeros(4, dtype=torch.bfloat16)], layout=torch.jagged
    )
    n.note = "kept"
    return n


def _grad():
    return torch.nested.nested_tensor([torch.ones(2, 2), torch.zeros(0, 2)], layout=torch.jagged, requires_grad=True)


MAKERS = {"items": _items, "lengths": _lengths, "dim2": _dim2, "attribute": _attr, "requires_grad": _grad}


def _same_njt(a, b) -> None:
    """Two torch jagged nested tensors are the same: components, flags, items."""
    assert a.is_nested and a.layout == torch.jagged and type(a) is type(b)
    assert a._ragged_idx == b._ragged_idx and a.requires_grad == b.requires_grad and a.dtype == b.dtype
    assert torch.equal(a._values.detach(), b._values.detach()) and torch.equal(a._offsets, b._offsets)
    assert (a._lengths is None) == (b._lengths is None)
    assert b._lengths is None or torch.equal(a._lengths, b._lengths)
    assert {k: v.shape for k, v in a._metadata_cache.items()} == {k: v.shape for k, v in b._metadata_cache.items()}
    assert getattr(a, "note", None) == getattr(b, "note", None)
    for x, y in zip(a.detach().unbind(), b.detach().unbind(), strict=True):
        assert torch.equal(x, y)


@pytest.mark.parametrize("name", list(MAKERS))
def test_read_torch_file(name):
    """torch.save's file (torch.load accepts it with weights_only=True) reads as a
    JaggedTensor whose components and items are torch's."""
    n = MAKERS[name]()
    data = tsave({"n": n, "again": n})
    ref = tload(data, weights_only=True)["n"]
    for wo in (True, False):
        out = tlload(data, weights_only=wo)
        jt = out["n"]
        assert isinstance(jt, JaggedTensor) and out["again"] is jt
        assert jt.ragged_idx == ref._ragged_idx and jt.requires_grad == ref.requires_grad
        assert jt.dtype.torch_name == str(ref.dtype)
        np.testing.assert_array_equal(
            jt.values.numpy(), ref._values.detach().float().numpy() if name == "attribute" else ref._values.detach().numpy()
        )
        np.testing.assert_array_equal(jt.offsets.numpy(), ref._offsets.numpy())
        assert (jt.lengths is None) == (ref._lengths is None)
        cache = ref._metadata_cache
        assert (jt.min_seqlen, jt.max_seqlen) == tuple(
            cache[k].shape[0] if k in cache else None for k in ("min_seqlen", "max_seqlen")
        )
        assert jt.attrs == ({"note": "kept"} if name == "attribute" else {})
        assert jt.shape == tuple(s if isinstance(s, int) else None for s in ref.shape)
        items = jt.unbind()
        assert len(items) == len(ref.unbind())
        for a, b in zip(items, ref.detach().unbind(), strict=True):
            assert isinstance(a, Tensor) and a.shape == tuple(b.shape) and a.stride() == b.stride()
            assert a.numpy().tobytes() == b.contiguous().numpy().tobytes() if b.dtype != torch.bfloat16 else True
            np.testing.assert_array_equal(np.asarray(a.numpy(), dtype=np.float64), b.double().numpy())


@pytest.mark.parametrize("name", list(MAKERS))
def test_written_for_torch(name):
    """torchless.save of torch's object and of what torchless read from torch's file:
    torch.load (both modes) gives torch's object back, shared identity kept."""
    n = MAKERS[name]()
    data = tsave({"n": n, "again": n})
    for source in ({"n": n, "again": n}, tlload(data, weights_only=True)):
        out = tlsave(source)
        for wo in (True, False):
            back = tload(out, weights_only=wo)
            assert back["n"] is back["again"]
            _same_njt(back["n"], n)


def test_written_from_torchless_values():
    """A JaggedTensor built from NumPy arrays loads in torch as the jagged tensor torch
    builds from the same components."""
    vals = np.arange(15, dtype=np.float32).reshape(5, 3)
    offs = np.array([0, 1, 1, 5], dtype=np.int64)
    jt = JaggedTensor(Tensor.from_numpy(vals), Tensor.from_numpy(offs), max_seqlen=4, min_seqlen=0)
    back = tload(tlsave({"j": jt}), weights_only=True)["j"]
    want = torch.nested.nested_tensor_from_jagged(
        torch.from_numpy(vals), offsets=torch.from_numpy(offs), min_seqlen=0, max_seqlen=4
    )
    _same_njt(back, want)
    assert [tuple(t.shape) for t in back.unbind()] == [(1, 3), (0, 3), (4, 3)]
    assert [a.shape for a in jt.numpy()] == [(1, 3), (0, 3), (4, 3)]


def test_hostile_components_refused():
    """Items outside the values and foreign constructor arguments are FormatErrors."""
    jt = JaggedTensor(Tensor.from_numpy(np.zeros((2, 1), np.float32)), Tensor.from_numpy(np.array([0, 5])))
    with pytest.raises(FormatError, match="outside its values"):
        jt.unbind()
    with pytest.raises(FormatError, match="ragged dimension"):
        JaggedTensor(Tensor.from_numpy(np.zeros((2,), np.float32)), Tensor.from_numpy(np.array([0, 2])), ragged_idx=2)
    # keyword arguments torch's constructor ignores are ignored; without offsets, refused
    data = tsave({"n": _items()})
    odd = data.replace(b"requires_grad", b"requires_grae")
    _same_njt(tload(odd, weights_only=True)["n"], _items())
    assert tlload(odd, weights_only=True)["n"].numpy()[1].shape == (3, 3)
    bad = data.replace(b"offsets", b"offsetz")
    with pytest.raises(TypeError):
        tload(bad, weights_only=True)
    with pytest.raises(FormatError, match="_rebuild_njt"):
        tlload(bad, weights_only=True)
