"""The kernels the transformers model zoo needed (tests/interp/zoo_hf.py), each against torch
over dtypes and layouts (contiguous, strided, 0-d, empty): values exact, dtype and shape equal."""

from __future__ import annotations

import numpy as np
import pytest

from torchless.core.errors import UsageError
from torchless.interp.registry import require

torch = pytest.importorskip("torch", reason="torch is the oracle of the differential tests")

_DTYPES = ("float32", "float64", "int64", "int32", "bool", "bfloat16", "float16")


def _np(t: torch.Tensor) -> np.ndarray:
    if t.dtype == torch.bfloat16:
        import ml_dtypes

        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def _t(n: int | None, dt: torch.dtype, g: torch.Generator, step: int = 1) -> torch.Tensor:
    shape = () if n is None else (n * step,)
    x = torch.randint(-5, 6, shape, generator=g).to(dt)
    return x[::step] if step > 1 else x


@pytest.mark.differential
@pytest.mark.parametrize("indexing", ["ij", "xy", None])
@pytest.mark.parametrize("dtype", _DTYPES)
def test_meshgrid_matches_torch(dtype: str, indexing: str | None) -> None:
    dt = getattr(torch, dtype)
    g = torch.Generator().manual_seed(0)
    key = "aten.meshgrid.default" if indexing is None else "aten.meshgrid.indexing"
    op = torch.ops.aten.meshgrid.default if indexing is None else torch.ops.aten.meshgrid.indexing
    kw = {} if indexing is None else {"indexing": indexing}
    cases = [
        [_t(3, dt, g), _t(4, dt, g)],
        [_t(2, dt, g), _t(3, dt, g), _t(5, dt, g)],
        [_t(4, dt, g)],
        [_t(None, dt, g), _t(3, dt, g)],  # 0-d counts as one element
        [_t(0, dt, g), _t(2, dt, g)],  # empty
        [_t(4, dt, g, step=2), _t(3, dt, g)],  # strided
    ]
    for ts in cases:
        want = op(ts, **kw)
        got = require(key)([_np(t) for t in ts], **kw)
        assert len(got) == len(want)
        for w, o in zip(want, got, strict=True):
            assert o.dtype == _np(w).dtype and o.shape == tuple(w.shape), (ts, indexing)
            np.testing.assert_array_equal(o.astype(np.float64), w.double().numpy())


def test_meshgrid_refusals_name_the_op() -> None:
    fn = require("aten.meshgrid.indexing")
    with pytest.raises(UsageError, match="aten.meshgrid: indexing must be"):
        fn([np.arange(3)], indexing="yx")
    with pytest.raises(UsageError, match="scalar or 1D"):
        fn([np.ones((2, 2))], indexing="ij")
    with pytest.raises(UsageError, match="same dtype"):
        fn([np.arange(2), np.arange(2.0)], indexing="ij")
    with pytest.raises(UsageError, match="non-empty"):
        fn([], indexing="ij")


@pytest.mark.differential
@pytest.mark.parametrize("dtype", _DTYPES)
def test_broadcast_to_matches_torch(dtype: str) -> None:
    dt = getattr(torch, dtype)
    g = torch.Generator().manual_seed(1)
    base = torch.randint(-5, 6, (3, 1, 4), generator=g).to(dt)
    cases = [
        (base, [2, 3, 5, 4]),
        (base, [-1, 6, -1]),
        (base.transpose(0, 2), [4, 2, 3]),  # strided
        (torch.randint(0, 3, (), generator=g).to(dt), [2, 2]),  # 0-d
        (base[:0], [2, 0, 3, 4]),  # empty
        (base[::2], [2, 2, 4]),
    ]
    fn = require("aten.broadcast_to.default")
    for x, size in cases:
        want = torch.ops.aten.broadcast_to.default(x, size)
        got = fn(_np(x), size)
        assert got.dtype == _np(want).dtype and got.shape == tuple(want.shape), (tuple(x.shape), size)
        np.testing.assert_array_equal(got.astype(np.float64), want.double().numpy())
    with pytest.raises(UsageError):
        fn(_np(base), [2, 2, 4])
