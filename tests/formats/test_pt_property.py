"""Property-based round trips between torchless and torch 2.13 (hypothesis)."""

from __future__ import annotations

import io
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tl_testutil import assert_tree_matches, sharing_pattern_tl, sharing_pattern_torch, torch_tensors

import torchless
from torchless.core.dtypes import DTYPES
from torchless.core.tensor import Tensor
from torchless.core.tree import iter_tensors
from torchless.formats.pt.read import read_checkpoint
from torchless.io.source import BytesSource

pytestmark = pytest.mark.differential
torch = pytest.importorskip("torch", reason="torch is the differential oracle")

DTYPE_NAMES = [
    "bool",
    "uint8",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint16",
    "uint32",
    "uint64",
    "float16",
    "bfloat16",
    "float32",
    "float64",
    "float8_e4m3fn",
    "float8_e5m2",
    "float8_e4m3fnuz",
    "float8_e5m2fnuz",
    "float8_e8m0fnu",
    "complex64",
    "complex128",
]
SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@st.composite
def base_array(draw):
    """A C-contiguous NumPy array of random bytes with a random torch dtype."""
    name = draw(st.sampled_from(DTYPE_NAMES))
    shape = tuple(draw(st.lists(st.integers(0, 5), min_size=0, max_size=3)))
    dt = DTYPES[name]
    n = int(np.prod(shape)) if shape else 1
    raw = np.frombuffer(draw(st.binary(min_size=n * dt.itemsize, max_size=n * dt.itemsize)), np.uint8).copy()
    if name == "bool":
        raw &= 1
    return name, raw.view(dt.numpy).reshape(shape)


@st.composite
def view_of(draw, arr):
    """A random NumPy view of ``arr`` (slices with steps, transposes, broadcast)."""
    v = arr
    for _ in range(draw(st.integers(0, 2))):
        kind = draw(st.sampled_from(["slice", "T", "index", "expand"]))
        if kind == "slice" and v.ndim:
            d = draw(st.integers(0, v.ndim - 1))
            start = draw(st.integers(0, v.shape[d]))
            step = draw(st.integers(1, 3))
            idx = [slice(None)] * v.ndim
            idx[d] = slice(start, None, step)
            v = v[tuple(idx)]
        elif kind == "T" and v.ndim >= 2:
            v = v.T
        elif kind == "index" and v.ndim and v.shape[0]:
            v = v[draw(st.integers(0, v.shape[0] - 1)), ...]  # a 0-d or smaller view
        elif kind == "expand" and v.ndim and v.shape[-1] == 1:
            v = np.broadcast_to(v, v.shape[:-1] + (3,))
    return v


@st.composite
def tree(draw):
    """A nested state dict: bases, views of them (sharing), scalars, containers."""
    bases = draw(st.lists(base_array(), min_size=1, max_size=4))
    leaves = []
    for name, arr in bases:
        leaves.append((name, arr, arr))
        for _ in range(draw(st.integers(0, 2))):
            leaves.append((name, arr, draw(view_of(arr))))
    out: dict = {}
    for i, leaf in enumerate(leaves):
        where = draw(st.sampled_from(["top", "nested", "list"]))
        key = f"t{i}"
        if where == "top":
            out[key] = leaf
        elif where == "nested":
            out.setdefault("sub", {}).setdefault("deeper", {})[key] = leaf
        else:
            out.setdefault("lst", []).append(leaf)
    out["meta"] = draw(
        st.dictionaries(
            st.text(max_size=5),
            st.one_of(st.integers(-(2**70), 2**70), st.floats(allow_nan=False), st.text(max_size=8), st.none(), st.booleans()),
            max_size=3,
        )
    )
    return out


def _to_torch_tree(obj, cache):
    if isinstance(obj, tuple) and len(obj) == 3 and isinstance(obj[1], np.ndarray):
        name, base, view = obj
        tb = cache.get(id(base))
        if tb is None:
            u8 = torch.from_numpy(np.ascontiguousarray(base).reshape(-1).view(np.uint8).copy())
            tb = (
                u8.view(getattr(torch, name)).reshape(base.shape)
                if base.size
                else torch.empty(base.shape, dtype=getattr(torch, name))
            )
            cache[id(base)] = tb
        isz = base.itemsize
        off = (view.__array_interface__["data"][0] - base.__array_interface__["data"][0]) // isz if view.size else 0
        strides = tuple(s // isz for s in view.strides)
        return tb.as_strided(view.shape, strides, off) if base.size else torch.empty(view.shape, dtype=tb.dtype)
    if isinstance(obj, dict):
        return {k: _to_torch_tree(v, cache) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_to_torch_tree(v, cache) for v in obj]
    return obj


def _to_tl_tree(obj, cache):
    if isinstance(obj, tuple) and len(obj) == 3 and isinstance(obj[1], np.ndarray):
        name, base, view = obj
        tb = cache.get(id(base))
        if tb is None:
            tb = Tensor.from_numpy(base, DTYPES[name])
            cache[id(base)] = tb
        if not base.size:
            return Tensor.from_numpy(np.empty(view.shape, base.dtype), DTYPES[name])
        isz = base.itemsize
        off = (view.__array_interface__["data"][0] - base.__array_interface__["data"][0]) // isz if view.size else 0
        return Tensor(tb.storage, tb.dtype, view.shape, tuple(s // isz for s in view.strides), off)
    if isinstance(obj, dict):
        return {k: _to_tl_tree(v, cache) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_to_tl_tree(v, cache) for v in obj]
    return obj


@SETTINGS
@given(tree())
def test_torch_save_torchless_load(spec):
    obj = _to_torch_tree(spec, {})
    buf = io.BytesIO()
    torch.save(obj, buf)
    cp = read_checkpoint(BytesSource(buf.getvalue()))
    assert_tree_matches(cp.obj, obj)
    tl = [t for _, t in iter_tensors(cp.obj)]
    tt = [t for _, t in torch_tensors(obj)]
    assert sharing_pattern_tl(tl) == sharing_pattern_torch(tt)


@SETTINGS
@given(tree())
def test_torchless_save_torch_load(spec):
    obj = _to_tl_tree(spec, {})
    expect = _to_torch_tree(spec, {})
    buf = io.BytesIO()
    torchless.save(obj, buf)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = torch.load(io.BytesIO(buf.getvalue()), weights_only=True)
    gt = torch_tensors(got)
    et = torch_tensors(expect)
    assert [n for n, _ in gt] == [n for n, _ in et]
    for (n, g), (_, e) in zip(gt, et, strict=False):
        assert g.dtype == e.dtype and g.shape == e.shape, n
        if e.numel():
            assert g.stride() == e.stride() and g.storage_offset() == e.storage_offset(), n
        assert bytes(g.untyped_storage()) == bytes(e.untyped_storage()), n
    nonempty = [i for i, (_, e) in enumerate(et) if e.untyped_storage().nbytes()]
    assert sharing_pattern_torch([gt[i][1] for i in nonempty]) == sharing_pattern_torch([et[i][1] for i in nonempty])
    assert got["meta"] == expect["meta"]
