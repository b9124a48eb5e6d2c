"""Every core ATen overload the interpreter's kernels own, against torch on torch's own sample inputs.

The harness (``core_ops_harness.py``) takes each overload's OpInfo samples (``op_db``,
cpu) and generated ones, binds them to the overload's schema as a graph records them and
compares ``torch.ops.aten.<op>.<overload>`` with the kernel: exact for integer and bool
results, within the harness's ``TOL``/``LOOSE`` for floating point. Each sample also runs
with its array arguments re-laid-out (Fortran order / reversed strides) to show results
do not depend on strides. The dtypes each overload is compared in must be the ones the
coverage table in docs/interpreter.md claims (``scripts/interp_coverage.json``).
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is the oracle of the differential tests")
pytest.importorskip("expecttest", reason="torch's OpInfo database (op_db) imports expecttest")

from torchless.core.dtypes import by_name  # noqa: E402
from torchless.core.errors import UsageError  # noqa: E402
from torchless.interp import registry  # noqa: E402

from . import core_ops_harness as harness  # noqa: E402

_COVERAGE = os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "interp_coverage.json")


def _claimed() -> dict:
    with open(_COVERAGE, encoding="utf-8") as f:
        return {row["op"]: row for row in json.load(f)["ops"]}


@pytest.mark.parametrize("key", sorted(harness.SPECS))
def test_kernel_matches_torch(key: str) -> None:
    spec = harness.SPECS[key]
    torch.manual_seed(0)
    covered = [dt for dt in spec.dtypes if harness.run(spec, dt) > 0]
    assert covered, f"{key}: no sample compared"
    claimed = _claimed()[key]["dtypes"]
    assert covered == claimed, f"{key}: compared in {covered}, the coverage table says {claimed}"


def test_harness_catches_a_wrong_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    real = registry.require("aten.relu.default")
    monkeypatch.setitem(registry._KERNELS, "aten.relu.default", lambda x: np.asarray(real(x) + np.asarray(1e-3, x.dtype)))
    with pytest.raises(AssertionError, match="beyond rtol"):
        harness.run(harness.SPECS["aten.relu.default"], "float32")
    monkeypatch.setitem(registry._KERNELS, "aten.relu.default", lambda x: real(x).astype(np.float64))
    with pytest.raises(AssertionError, match="dtype"):
        harness.run(harness.SPECS["aten.relu.default"], "float32")
    monkeypatch.setitem(registry._KERNELS, "aten.relu.default", lambda x: real(x).reshape(-1)[0] if x.size else real(x))
    with pytest.raises(AssertionError):
        harness.run(harness.SPECS["aten.relu.default"], "float32")


def _k(key: str):
    return registry.require(key)


def test_integer_division_semantics() -> None:
    a = np.array([7, -7, 7, -7], np.int64)
    b = np.array([2, 2, -2, -2], np.int64)
    for mode in ("trunc", "floor"):
        want = torch.div(torch.from_numpy(a), torch.from_numpy(b), rounding_mode=mode).numpy()
        assert np.array_equal(_k("aten.div.Tensor_mode")(a, b, rounding_mode=mode), want)
    for key, fn in (("aten.remainder.Tensor", torch.remainder), ("aten.fmod.Tensor", torch.fmod)):
        assert np.array_equal(_k(key)(a, b), fn(torch.from_numpy(a), torch.from_numpy(b)).numpy())
    with pytest.raises(UsageError, match="ZeroDivisionError"):
        _k("aten.div.Tensor_mode")(a, np.zeros(4, np.int64), rounding_mode="floor")
    with pytest.raises(UsageError):
        _k("aten.remainder.Tensor")(a, np.zeros(4, np.int64))


def test_reduction_dtype_rules() -> None:
    x = np.arange(6, dtype=np.int32).reshape(2, 3)
    assert _k("aten.sum.dim_IntList")(x, [1]).dtype == np.int64
    assert _k("aten.sum.dim_IntList")(x.astype(bool), None).dtype == np.int64
    with pytest.raises(UsageError, match="floating point or complex"):
        _k("aten.mean.dim")(x, [1])
    assert _k("aten.any.dims")(x.astype(np.uint8), None).dtype == np.uint8


def test_nan_propagation() -> None:
    a = np.array([1.0, np.nan, 3.0], np.float32)
    b = np.array([np.nan, 2.0, 1.0], np.float32)
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    for key, fn in (("aten.maximum.default", torch.maximum), ("aten.minimum.default", torch.minimum)):
        np.testing.assert_array_equal(_k(key)(a, b), fn(ta, tb).numpy())
    np.testing.assert_array_equal(_k("aten.amax.default")(a, [0]), torch.amax(ta, 0).numpy())
    np.testing.assert_array_equal(_k("aten.clamp.default")(a, 0.0, 2.0), torch.clamp(ta, 0.0, 2.0).numpy())
    assert _k("aten.argmax.default")(a).item() == torch.argmax(ta).item()


def test_views_write_through() -> None:
    x = np.zeros((3, 4), np.float32)
    for key, args in (
        ("aten.select.int", (0, 1)),
        ("aten.slice.Tensor", (1, 1, 3)),
        ("aten.diagonal.default", ()),
        ("aten.permute.default", ([1, 0],)),
        ("aten.view.default", ([12],)),
        ("aten.unsqueeze.default", (0,)),
        ("aten.as_strided.default", ([2], [5], 1)),
    ):
        v = _k(key)(x, *args)
        assert np.shares_memory(v, x), key


@pytest.mark.parametrize(
    ("key", "args"),
    [
        ("aten.add_.Tensor", (np.ones((2, 3), np.float32), 2.0)),
        ("aten.mul_.Scalar", (np.arange(6, dtype=np.int64).reshape(2, 3), 3)),
        ("aten.clamp_.default", (np.linspace(-2, 2, 6, dtype=np.float32), -1.0, 1.0)),
        ("aten.gt_.Scalar", (np.linspace(-2, 2, 6, dtype=np.float32), 0.5)),
        ("aten.div_.Tensor_mode", (np.arange(-3, 3, dtype=np.int32), 2)),
    ],
)
def test_inplace_variants_write_into_self(key: str, args: tuple) -> None:
    x = args[0].copy()
    kwargs = {"rounding_mode": "floor"} if "mode" in key else {}
    out = _k(key)(x, *args[1:], **kwargs)
    assert out is x
    t = torch.from_numpy(args[0].copy())
    getattr(torch.ops.aten, key.split(".")[1]).__getattr__(key.split(".")[2])(t, *args[1:], **kwargs)
    np.testing.assert_array_equal(x, t.numpy())


def test_inplace_refuses_a_wider_result() -> None:
    with pytest.raises(UsageError, match="can't be cast"):
        _k("aten.add_.Tensor")(np.zeros(3, np.int64), 0.5)
    with pytest.raises(UsageError, match="broadcast shape"):
        _k("aten.add_.Tensor")(np.zeros(3, np.float32), np.zeros((2, 3), np.float32))


def test_erf_against_math_erf() -> None:
    import math

    from torchless.interp.kernels.elementwise import erf

    x = np.concatenate([np.linspace(-8, 8, 40001), [0.0, -0.0, 1e-30, 2.5, -2.5, 6.0, np.inf, -np.inf]])
    want = np.array([math.erf(v) for v in x])
    np.testing.assert_allclose(erf(x), want, rtol=1e-13, atol=0)
    x32 = x.astype(np.float32)
    want32 = np.array([math.erf(v) for v in x32.astype(np.float64)])
    np.testing.assert_allclose(erf(x32), want32, rtol=3e-6, atol=0)
    assert np.isnan(erf(np.array([np.nan]))[0])


@pytest.mark.parametrize("name", ["int32", "int16", "uint8", "float64", "bfloat16"])
def test_view_dtype_reads_the_same_bytes(name: str) -> None:
    from torchless.core.dtypes import by_name

    x = torch.randn(3, 4)
    want = x.view(getattr(torch, name))
    got = _k("aten.view.dtype")(x.numpy(), by_name(name))
    assert got.shape == tuple(want.shape)
    assert np.array_equal(got.view(np.uint8), want.view(torch.uint8).numpy())


def test_to_is_an_alias_unless_it_converts_or_copies() -> None:
    from torchless.core.values import Layout

    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    t = torch.from_numpy(x.copy())
    f32, other, tother = by_name("float32"), np.zeros(1, np.float32), torch.zeros(1)
    # same dtype, no copy: torch returns self, and so does the kernel
    assert harness._overload("aten.to.dtype")(t, torch.float32) is t
    assert _k("aten.to.dtype")(x, f32) is x
    assert harness._overload("aten.to.dtype_layout")(t, dtype=torch.float32) is t
    assert _k("aten.to.dtype_layout")(x, dtype=f32) is x
    assert harness._overload("aten.to.other")(t, tother) is t
    assert _k("aten.to.other")(x, other) is x
    # copy=True, or another dtype: a new tensor
    assert harness._overload("aten.to.dtype")(t, torch.float32, False, True) is not t
    assert not np.shares_memory(_k("aten.to.dtype")(x, f32, False, True), x)
    assert not np.shares_memory(_k("aten.to.dtype_layout")(x, dtype=f32, copy=True), x)
    got = _k("aten.to.dtype")(x, by_name("bfloat16"))
    assert got.dtype == np.dtype("bfloat16") and not np.shares_memory(got, x)
    with pytest.raises(UsageError, match="layout"):
        _k("aten.to.dtype_layout")(x, layout=Layout("sparse_coo"))


def test_complex_views_write_through() -> None:
    z = np.array([[1 + 2j, 3 - 4j]], np.complex64)
    r = _k("aten.view_as_real.default")(z)
    r[0, 1, 1] = 9.0
    assert z[0, 1] == 3 + 9j  # a view, as torch's
    f = np.arange(8, dtype=np.float64).reshape(2, 2, 2)
    c = _k("aten.view_as_complex.default")(f)
    assert c.shape == (2, 2) and np.shares_memory(c, f)
    assert all(np.shares_memory(b, a) for b, a in zip(_k("aten.broadcast_tensors.default")([f, f[0]]), [f, f[0]], strict=True))


def test_half_to_complex_gives_complex64_with_torch_values() -> None:
    """float16 in: torch gives complex32 (chalf), which NumPy lacks; the values match in complex64."""
    a, b = torch.randn(3, 2).half(), torch.randn(3, 2).half()
    want = torch.complex(a, b).to(torch.complex64).numpy()
    got = _k("aten.complex.default")(a.numpy(), b.numpy())
    assert got.dtype == np.complex64 and np.array_equal(got, want)
    want = torch.view_as_complex(a).to(torch.complex64).numpy()
    got = _k("aten.view_as_complex.default")(a.numpy())
    assert got.dtype == np.complex64 and np.array_equal(got, want)


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
def test_relu_keeps_the_sign_of_zero_as_torch_does(dtype):
    """Signed zeros compare equal, so the tolerance checks cannot see them: torch's relu
    keeps -0.0 (and NaN); the kernel gives the same bits."""
    values = [-0.0, 0.0, -1.5, 2.0, float("nan"), float("-inf")] * 300  # long enough for NumPy's SIMD loops
    want = torch.relu(torch.tensor(values, dtype=getattr(torch, dtype))).float().numpy()
    x = np.asarray(values, dtype=np.float64).astype(by_name(dtype).numpy)
    got = np.asarray(registry.require("aten.relu.default")(x)).astype(np.float32)
    assert got.dtype == want.dtype and np.array_equal(got, want, equal_nan=True)
    num = ~np.isnan(want)  # a NaN's sign bit is not part of torch's contract
    assert np.array_equal(np.signbit(got[num]), np.signbit(want[num]))
