"""Custom-operator plugins (torchless.interp.custom_ops): transformers' grouped_mm_fallback
against the operator itself (called through torch), the registry's rules, and a custom
operator without a plugin refused by name before anything runs."""

from __future__ import annotations

import numpy as np
import pytest

import torchless
from torchless.core.errors import UnsupportedError, UsageError
from torchless.interp import custom_ops
from torchless.interp.registry import lookup, mutable_args

torch = pytest.importorskip("torch", reason="torch runs the custom operators and is the oracle")

_DTYPES = {"float32": (1e-5, 1e-5), "float64": (1e-12, 1e-12), "bfloat16": (1.6e-2, 1e-2), "float16": (1e-3, 1e-3)}


def _grouped_mm_op():
    pytest.importorskip("transformers", reason="transformers defines grouped_mm_fallback")
    import transformers.integrations.moe  # noqa: F401  registers torch.ops.transformers.*

    return torch.ops.transformers.grouped_mm_fallback.default


def _offsets(rng: np.random.Generator, rows: int, experts: int, tail: int) -> list[int]:
    """Non-decreasing cumulative counts (empty groups included) ending ``tail`` rows short."""
    cuts = np.sort(rng.integers(0, rows - tail + 1, size=experts - 1))
    return [int(c) for c in cuts] + [rows - tail]


@pytest.mark.differential
@pytest.mark.parametrize("dtype", sorted(_DTYPES))
@pytest.mark.parametrize("offs_dtype", ["int32", "int64"])
def test_grouped_mm_fallback_matches_the_operator(dtype, offs_dtype):
    op = _grouped_mm_op()
    fn = lookup("transformers.grouped_mm_fallback.default")
    assert fn is not None
    tdt = getattr(torch, dtype)
    rtol, atol = _DTYPES[dtype]
    rng = np.random.default_rng(0)
    cases = 0
    for rows, k, n, experts, tail in [(7, 5, 3, 3, 0), (10, 4, 6, 4, 2), (1, 3, 2, 2, 0), (0, 3, 2, 2, 0), (6, 2, 3, 1, 0)]:
        for layout in ("contiguous", "transposed"):
            x = torch.randn(rows, k, dtype=torch.float64).to(tdt)
            w = torch.randn(experts, k, n, dtype=torch.float64).to(tdt)
            if layout == "transposed":  # the same values through non-contiguous strides
                x = x.t().contiguous().t()
                w = w.transpose(1, 2).contiguous().transpose(1, 2)
            offs = torch.tensor(_offsets(rng, rows, experts, min(tail, rows)), dtype=getattr(torch, offs_dtype))
            want = op(x, w, offs)
            got = fn(_np(x), _np(w), _np(offs))
            assert got.dtype == _np(want).dtype and got.shape == tuple(want.shape)
            np.testing.assert_allclose(got.astype(np.float64), want.double().numpy(), rtol=rtol, atol=atol)
            cases += 1
    assert cases == 10


def _np(t):
    """A torch tensor as the NumPy array the interpreter would hold (bf16 via ml_dtypes), strides kept."""
    if t.dtype == torch.bfloat16:
        import ml_dtypes

        base = t.view(torch.int16).numpy()
        return base.view(ml_dtypes.bfloat16)
    return t.numpy()


def test_grouped_mm_fallback_checks_its_arguments():
    fn = lookup("transformers.grouped_mm_fallback.default")
    x, w = np.ones((4, 3), np.float32), np.ones((2, 3, 5), np.float32)
    with pytest.raises(UsageError, match="number of experts"):
        fn(x, w, np.array([4], np.int64))
    with pytest.raises(UsageError, match="input_dim mismatch"):
        fn(np.ones((4, 2), np.float32), w, np.array([2, 4], np.int64))
    with pytest.raises(UsageError, match="int32 or int64"):
        fn(x, w, np.array([2.0, 4.0], np.float32))
    with pytest.raises(UnsupportedError, match="do not fit the plugin's schema"):
        fn(x, w, np.array([2, 4]), np.array([1]))
    # the schema binds keywords too
    out = fn(input=x, weight=w, offs=np.array([1, 3], np.int64))
    assert out.shape == (4, 5) and (out[3] == 0).all() and (out[:3] == 3).all()


def test_plugins_are_listed_with_their_schema():
    p = custom_ops.plugins()["transformers.grouped_mm_fallback.default"]
    assert str(p.schema) == "transformers::grouped_mm_fallback(Tensor input, Tensor weight, Tensor offs) -> Tensor"
    assert "moe.py" in p.origin
    assert mutable_args("transformers.grouped_mm_fallback.default") == ()


def test_a_plugin_without_results_returns_none():
    @custom_ops.custom_op("torchless_test_plugins::bump_", "(Tensor(a!) x) -> ()")
    def bump_(x):
        x += 1

    fn = lookup("torchless_test_plugins.bump_.default")
    x = np.zeros(2)
    assert fn(x) is None and (x == 1).all()
    assert mutable_args("torchless_test_plugins.bump_.default") == ("x",)


def test_registry_rules():
    with pytest.raises(UsageError, match="namespace::name"):
        custom_ops.custom_op("scale", "(Tensor x) -> Tensor")
    with pytest.raises(UsageError, match="torch's own"):
        custom_ops.custom_op("aten::relu", "(Tensor self) -> Tensor")
    with pytest.raises(UsageError, match="names other::op"):
        custom_ops.custom_op("mine::op", "other::op(Tensor x) -> Tensor")
    with pytest.raises(UsageError, match="two plugins"):
        custom_ops.custom_op("transformers::grouped_mm_fallback", "(Tensor input, Tensor weight, Tensor offs) -> Tensor")(
            lambda input, weight, offs: input
        )


@pytest.mark.differential
def test_unknown_custom_op_refused_by_name_then_run_with_a_plugin(tmp_path):
    """A program with a custom operator torchless has no plugin for is refused before
    anything runs, naming it; registering a plugin (with a mutated argument, through
    auto_functionalized) makes the same file run and match torch."""
    lib = "torchless_test_plugins"

    @torch.library.custom_op(f"{lib}::scale_add", mutates_args=("acc",))
    def scale_add(x: torch.Tensor, acc: torch.Tensor, factor: float = 2.0) -> torch.Tensor:
        acc.add_(x)
        return x * factor

    @scale_add.register_fake
    def _(x, acc, factor=2.0):
        return torch.empty_like(x)

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("acc", torch.zeros(3))

        def forward(self, x):
            return torch.ops.torchless_test_plugins.scale_add(x, self.acc, factor=3.0) + 1

    m = M()
    x = torch.arange(3.0)
    path = tmp_path / "custom.pt2"
    torch.export.save(torch.export.export(m, (x,)), path)
    prog = torchless.load(path)
    with pytest.raises(UnsupportedError, match=f"{lib}.scale_add.default"):
        prog.module()

    key = f"{lib}.scale_add.default"
    if lookup(key) is None:  # registered once per process

        @custom_ops.custom_op(f"{lib}::scale_add", "(Tensor x, Tensor(a!) acc, float factor=2.0) -> Tensor")
        def _scale_add(x, acc, factor=2.0):
            acc += x
            return x * np.asarray(factor, x.dtype)

    assert mutable_args(key) == ("acc",)
    mod = prog.module()
    got = mod(x.numpy())
    want = M()(x)
    np.testing.assert_array_equal(got, want.detach().numpy())
    np.testing.assert_array_equal(mod.buffers["acc"], np.arange(3.0, dtype=np.float32))
