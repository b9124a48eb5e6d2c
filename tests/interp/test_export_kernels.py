"""The kernels training-IR exports need (issue 32): each against torch on torch's OpInfo
samples and generated ones, over dtypes and layouts (contiguous, strided, broadcast, 0-d,
empty), through the core-op harness (``core_ops_harness.run``: exact for ints and bools,
``TOL``/``LOOSE`` for floats, every sample also re-strided)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is the oracle of the differential tests")
pytest.importorskip("expecttest", reason="torch's OpInfo database (op_db) imports expecttest")

from torchless.core.errors import UsageError  # noqa: E402
from torchless.interp import registry  # noqa: E402

from . import core_ops_harness as harness  # noqa: E402

_t = harness._t
_INTS = ("int64", "int32", "bool")
_FLOATS = ("float32", "float64", "bfloat16", "float16")
_NUMERIC = ("float32", "float64", "int64", "int32", "bfloat16", "float16", "complex64")


def _gen_bitwise(dt: torch.dtype) -> Iterator:
    yield (_t((3, 4), dt), _t((3, 4), dt)), {}
    yield (_t((3, 1), dt), _t((4,), dt)), {}  # broadcast
    yield (_t((4, 6), dt)[:, ::2], _t((3,), dt)), {}  # strided
    yield (_t((), dt), _t((2, 3), dt)), {}  # 0-d
    yield (_t((0, 3), dt), _t((3,), dt)), {}  # empty
    yield (_t((2, 3), dt).t(), _t((3, 2), dt)), {}  # transposed


def _gen_bitwise_scalar(dt: torch.dtype) -> Iterator:
    x = _t((3, 4), dt)
    for v in (True, False, 5, -3, 0):
        yield (x, v), {}
    yield (_t((), dt), 6), {}
    yield (_t((4, 6), dt)[:, ::2], 3), {}


def _gen_scalar_tensor(dt: torch.dtype) -> Iterator:
    for v in (True, 5, -3):
        yield (v, _t((3, 4), dt)), {}


def _gen_binary(dt: torch.dtype) -> Iterator:
    yield from _gen_bitwise(dt)
    if dt.is_floating_point:
        a = torch.tensor([1.0, float("nan"), -2.0, float("inf")], dtype=dt)
        yield (a, a.flip(0)), {}


def _gen_diff(dt: torch.dtype) -> Iterator:
    x = _t((4, 5), dt)
    yield (x,), {}
    yield (x, 2, 0), {}
    yield (x, 1, -1, _t((4, 2), dt), _t((4, 1), dt)), {}
    yield (x.t(), 3, 1), {}
    yield (_t((6,), dt), 7), {}  # order beyond the length
    yield (_t((0, 3), dt), 1, 0), {}
    yield (x, 0), {}


def _gen_histc(dt: torch.dtype) -> Iterator:
    x = _t((50,), dt, low=-3, high=3)
    yield (x,), {}
    yield (x, 7, -1, 1), {}
    yield (x.reshape(5, 10).t(), 10, -2.5, 2.5), {}
    yield (torch.full((4,), 2.0, dtype=dt), 5), {}  # min == max from the data
    yield (_t((0,), dt), 4), {}
    yield (torch.linspace(0, 1, 11, dtype=dt), 10, 0, 1), {}  # values on the edges


def _gen_type_as(dt: torch.dtype) -> Iterator:
    for other in (torch.float32, torch.int64, torch.bool, torch.bfloat16, dt):
        yield (_t((3, 4), dt), _t((2,), other)), {}
    yield (_t((4, 6), dt)[:, ::2], _t((), torch.float64)), {}


def _gen_ri_int(dt: torch.dtype) -> Iterator:
    x = _t((3, 4), dt)
    yield (x, 2), {}
    yield (x, 3, 0), {}
    yield (x.t(), 2, -1), {}
    yield (_t((), dt), 3), {}
    yield (x, 0, 1), {}
    yield (x, 2, 1), {"output_size": 8}


def _gen_ri_tensor(dt: torch.dtype) -> Iterator:
    x = _t((3, 4), dt)
    yield (x, torch.tensor([1, 0, 2]), 0), {}
    yield (x, torch.tensor([2, 1, 0, 3]), 1), {}
    yield (x, torch.tensor(2), 1), {}


def _gen_ri_repeats(dt: torch.dtype) -> Iterator:
    yield (torch.tensor([1, 0, 3, 2], dtype=dt),), {}
    yield (torch.tensor([], dtype=dt),), {}


def _gen_baddbmm(dt: torch.dtype) -> Iterator:
    b1, b2 = _t((2, 3, 4), dt), _t((2, 4, 5), dt)
    yield (_t((2, 3, 5), dt), b1, b2), {}
    yield (_t((5,), dt), b1, b2), {"beta": 0.5, "alpha": 2}  # broadcast self
    yield (torch.full((2, 3, 5), float("nan"), dtype=dt) if dt.is_floating_point else _t((1, 3, 1), dt), b1, b2), {"beta": 0}
    yield (_t((2, 3, 5), dt), b1.transpose(1, 2).contiguous().transpose(1, 2), b2), {}


def _gen_addbmm(dt: torch.dtype) -> Iterator:
    b1, b2 = _t((2, 3, 4), dt), _t((2, 4, 5), dt)
    yield (_t((3, 5), dt), b1, b2), {}
    yield (_t((5,), dt), b1, b2), {"beta": 2, "alpha": 0.5}


def _gen_int_mm(dt: torch.dtype) -> Iterator:
    yield (_t((17, 32), torch.int8), _t((32, 8), torch.int8)), {}
    yield (_t((32, 17), torch.int8).t(), _t((8, 32), torch.int8).t()), {}


def _gen_int8pack(dt: torch.dtype) -> Iterator:
    yield (_t((3, 16), dt), _t((8, 16), torch.int8), _t((8,), dt, low=0.01, high=0.1)), {}
    yield (_t((16, 5), dt).t(), _t((4, 16), torch.int8), _t((4,), dt, low=0.01, high=0.1)), {}


def _gen_weight_norm(dt: torch.dtype) -> Iterator:
    v = _t((4, 3, 2), dt)
    yield (v, _t((4, 1, 1), dt), 0), {}
    yield (v, _t((1, 1, 2), dt), 2), {}
    yield (v, _t((), dt), -1), {}
    # (not a transposed v: torch's fused kernel reads a non-contiguous v in the wrong order)
    yield (_t((3, 4), dt), _t((1, 4), dt), 1), {}


def _gen_empty_permuted(dt: torch.dtype) -> Iterator:
    yield ([2, 3, 4], [0, 2, 1]), {"dtype": dt}
    yield ([2, 0, 4], [2, 1, 0]), {"dtype": dt}


_SPECS = [
    harness.Spec("aten.min.other", ("minimum",), gen=_gen_binary, dtypes=harness._REAL),
    harness.Spec("aten.max.other", ("maximum",), gen=_gen_binary, dtypes=harness._REAL),
    harness.Spec("aten.diff.default", ("diff",), gen=_gen_diff),
    harness.Spec("aten.histc.default", ("histc",), gen=_gen_histc, dtypes=_FLOATS),
    harness.Spec("aten.type_as.default", gen=_gen_type_as),
    harness.Spec("aten.detach.default", gen=harness._gen_unary()),
    harness.Spec("aten.repeat_interleave.self_int", gen=_gen_ri_int),
    harness.Spec("aten.repeat_interleave.self_Tensor", gen=_gen_ri_tensor),
    harness.Spec("aten.repeat_interleave.Tensor", gen=_gen_ri_repeats, dtypes=("int64", "int32")),
    harness.Spec("aten.baddbmm.default", ("baddbmm",), gen=_gen_baddbmm, loose=True, dtypes=_NUMERIC),
    harness.Spec("aten.addbmm.default", ("addbmm",), gen=_gen_addbmm, loose=True, dtypes=_NUMERIC),
    harness.Spec("aten._int_mm.default", gen=_gen_int_mm, dtypes=("int64",)),
    harness.Spec("aten._weight_int8pack_mm.default", gen=_gen_int8pack, dtypes=("float32", "bfloat16", "float16"), loose=True),
    harness.Spec("aten._weight_norm.default", gen=_gen_weight_norm, dtypes=_FLOATS, loose=True),
    harness.Spec("aten._weight_norm_interface.default", gen=_gen_weight_norm, dtypes=("float32", "float64"), loose=True),
    harness.Spec("aten.empty_permuted.default", gen=_gen_empty_permuted, check="meta"),
    harness.Spec("aten.tril.default", ("tril",), dtypes=harness._REAL),
    harness.Spec("aten.triu.default", ("triu",), dtypes=harness._REAL),
]
for _name in ("__and__", "__or__", "__xor__", "bitwise_and", "bitwise_or", "bitwise_xor", "__lshift__", "__rshift__"):
    _d = _INTS if "shift" not in _name else ("int64", "int32")
    _SPECS.append(harness.Spec(f"aten.{_name}.Tensor", gen=_gen_bitwise, dtypes=_d))
    _SPECS.append(harness.Spec(f"aten.{_name}.Scalar", gen=_gen_bitwise_scalar, dtypes=_d))
for _name in ("bitwise_and", "bitwise_or", "bitwise_xor"):
    _SPECS.append(harness.Spec(f"aten.{_name}.Scalar_Tensor", gen=_gen_scalar_tensor, dtypes=_INTS))
for _name in ("logical_and", "logical_or", "logical_xor"):
    _SPECS.append(harness.Spec(f"aten.{_name}.default", gen=_gen_bitwise, dtypes=(*_INTS, "float32", "bfloat16")))
SPECS = {s.key: s for s in _SPECS}


@pytest.mark.parametrize("key", sorted(SPECS))
def test_kernel_matches_torch(key: str) -> None:
    spec = SPECS[key]
    torch.manual_seed(0)
    covered = [dt for dt in spec.dtypes if harness.run(spec, dt) > 0]
    assert covered == list(spec.dtypes), f"{key}: compared only in {covered}"


# in-place variants: the same values written into self (and self returned), as torch does
_INPLACE = [
    ("aten.__iand__.Tensor", np.array([[True, False, True]]), np.array([True, True, False])),
    ("aten.__ior__.Scalar", np.arange(6, dtype=np.int64).reshape(2, 3), 9),
    ("aten.__ixor__.Tensor", np.arange(6, dtype=np.int32).reshape(2, 3), np.array([1, 2, 3], np.int32)),
    ("aten.__ilshift__.Scalar", np.arange(6, dtype=np.int64), 3),
    ("aten.__irshift__.Tensor", np.arange(-3, 3, dtype=np.int32), np.array(1, np.int32)),
    ("aten.bitwise_and_.Scalar", np.arange(6, dtype=np.int64), 5),
    ("aten.bitwise_or_.Scalar", np.array([True, False]), True),
    ("aten.bitwise_xor_.Scalar", np.arange(6, dtype=np.int64), 3),
    ("aten.bitwise_left_shift_.Tensor_Scalar", np.arange(6, dtype=np.int64), 2),
    ("aten.bitwise_right_shift_.Tensor", np.arange(6, dtype=np.int64), np.array(1, np.int64)),
    ("aten.logical_xor_.default", np.array([0.0, 1.5, -2.0], np.float32), np.array([1, 0, 0], np.int64)),
    ("aten.detach_.default", np.ones(3, np.float32)),
    ("aten.tril_.default", np.arange(12, dtype=np.float32).reshape(3, 4), -1),
    ("aten.triu_.default", np.ones((2, 3, 3), np.bool_), 1),
]


@pytest.mark.parametrize("case", _INPLACE, ids=[c[0] for c in _INPLACE])
def test_inplace_writes_into_self(case: tuple) -> None:
    key, x0, *rest = case
    x = x0.copy()
    out = registry.require(key)(x, *rest)
    assert out is x
    t = torch.from_numpy(x0.copy())
    harness._overload(key)(t, *[torch.from_numpy(np.asarray(r)) if isinstance(r, np.ndarray) else r for r in rest])
    np.testing.assert_array_equal(x, t.numpy())


def test_inplace_refuses_a_type_self_cannot_hold() -> None:
    with pytest.raises(UsageError, match="can't be cast"):
        registry.require("aten.__iand__.Tensor")(np.array([True, False]), np.array([1, 2], np.int64))


@pytest.mark.parametrize(
    ("key", "args", "want"),
    [
        ("aten.__and__.int", (12, 10), 8),
        ("aten.__or__.int", (12, 3), 15),
        ("aten.__xor__.int", (6, 3), 5),
        ("aten.__and__.bool", (True, False), False),
        ("aten.__or__.bool", (True, False), True),
        ("aten.__xor__.bool", (True, True), False),
        ("aten.__lshift__.int", (3, 4), 48),
        ("aten.__rshift__.int", (-17, 2), -5),
    ],
)
def test_symint_overloads(key: str, args: tuple, want: object) -> None:
    got = registry.require(key)(*args)
    assert got == want and type(got) is type(want)
    assert harness._overload(key)(*args) == want  # torch agrees


def test_refusals_name_the_op() -> None:
    with pytest.raises(UsageError, match="diff"):
        registry.require("aten.diff.default")(np.asarray(1.0))
    with pytest.raises(UsageError, match="repeat_interleave"):
        registry.require("aten.repeat_interleave.self_Tensor")(np.ones(3), np.array([1, -1, 2]), 0)


# -- spectral: the fft_* family, windows, stft ---------------------------------------------

_FFT_DTYPES = ("float32", "float64", "int64", "complex64")


def _gen_fft_1d(dt: torch.dtype) -> Iterator:
    x = _t((3, 8), dt)
    yield (x,), {}
    yield (x, 5, 0, "ortho"), {}
    yield (x.t(), 12, -1, "forward"), {}
    yield (_t((7,), dt), None, -1, "backward"), {}


def _gen_fft_nd(dt: torch.dtype) -> Iterator:
    x = _t((2, 4, 6), dt)
    yield (x,), {}
    yield (x, [3, 8]), {}
    yield (x, None, [0, 2], "ortho"), {}
    yield (x.transpose(0, 2), [5], [1], "forward"), {}


def _gen_freq(dt: torch.dtype) -> Iterator:
    for n, d in ((8, 1.0), (7, 0.5), (1, 2.0), (0, 1.0)):
        yield (n, d), {"dtype": dt}


def _gen_shift(dt: torch.dtype) -> Iterator:
    x = _t((4, 5), dt)
    yield (x,), {}
    yield (x, [1]), {}
    yield (x.t(), [0, 1]), {}
    yield (_t((7,), dt), [-1]), {}


def _gen_window(dt: torch.dtype) -> Iterator:
    for n in (0, 1, 2, 7, 16):
        yield (n,), {"dtype": dt}
        yield (n, False), {"dtype": dt}


def _gen_window_params(*params: float) -> object:
    def g(dt: torch.dtype) -> Iterator:
        for n in (1, 7, 16):
            yield (n, True, *params), {"dtype": dt}
            yield (n, False, *params), {"dtype": dt}

    return g


def _gen_stft(dt: torch.dtype) -> Iterator:
    x = _t((2, 64), dt)
    yield (x, 16), {"return_complex": True}
    yield (x, 16, 5, 12, torch.hann_window(12, dtype=dt)), {"return_complex": True, "normalized": True}
    yield (x[0], 8, 3), {"return_complex": False, "onesided": False}
    yield (x, 16, 4, None, torch.hann_window(16, dtype=dt), True, "reflect"), {"return_complex": True}
    yield (x, 16, 8, None, None, True, "constant"), {"return_complex": True}


_FFT_SPECS = [
    harness.Spec("aten.fft_fftfreq.default", gen=_gen_freq, dtypes=("float32", "float64")),
    harness.Spec("aten.fft_rfftfreq.default", gen=_gen_freq, dtypes=("float32", "float64")),
    harness.Spec(
        "aten.fft_fftshift.default", ("fft.fftshift",), gen=_gen_shift, dtypes=("float32", "int64", "bool", "complex64")
    ),
    harness.Spec(
        "aten.fft_ifftshift.default", ("fft.ifftshift",), gen=_gen_shift, dtypes=("float32", "int64", "bool", "complex64")
    ),
    harness.Spec("aten.stft.default", gen=_gen_stft, dtypes=("float32", "float64"), loose=True),
    harness.Spec("aten.stft.center", gen=_gen_stft, dtypes=("float32", "float64"), loose=True),
    harness.Spec("aten.hamming_window.periodic_alpha", gen=_gen_window_params(0.6), dtypes=_FLOATS),
    harness.Spec("aten.hamming_window.periodic_alpha_beta", gen=_gen_window_params(0.6, 0.3), dtypes=_FLOATS),
    harness.Spec("aten.kaiser_window.beta", gen=_gen_window_params(5.0), dtypes=_FLOATS),
]
for _name in ("fft_fft", "fft_ifft", "fft_rfft", "fft_irfft", "fft_hfft", "fft_ihfft"):
    _d = _FFT_DTYPES if _name not in ("fft_rfft", "fft_ihfft") else ("float32", "float64", "int64")
    _FFT_SPECS.append(harness.Spec(f"aten.{_name}.default", (_name.replace("_", "."),), gen=_gen_fft_1d, dtypes=_d, loose=True))
for _name in ("fft_fft2", "fft_ifft2", "fft_rfft2", "fft_irfft2", "fft_fftn", "fft_ifftn", "fft_rfftn", "fft_irfftn"):
    _d = _FFT_DTYPES if "rfft" not in _name or "irfft" in _name else ("float32", "float64", "int64")
    _FFT_SPECS.append(harness.Spec(f"aten.{_name}.default", gen=_gen_fft_nd, dtypes=_d, loose=True))
for _name in ("hann", "hamming", "blackman", "bartlett", "kaiser"):
    for _ov in ("default", "periodic"):
        _FFT_SPECS.append(harness.Spec(f"aten.{_name}_window.{_ov}", gen=_gen_window, dtypes=_FLOATS))
FFT_SPECS = {s.key: s for s in _FFT_SPECS}


@pytest.mark.parametrize("key", sorted(FFT_SPECS))
def test_spectral_kernel_matches_torch(key: str) -> None:
    spec = FFT_SPECS[key]
    torch.manual_seed(0)
    covered = [dt for dt in spec.dtypes if harness.run(spec, dt) > 0]
    assert covered == list(spec.dtypes), f"{key}: compared only in {covered}"


# -- sampling: antialiased resizing, grid sampling, affine grids ----------------------------


def _gen_aa(vec: bool) -> object:
    def g(dt: torch.dtype) -> Iterator:
        x = _t((2, 3, 12, 10), dt)
        for size, ac in (([5, 4], False), ([20, 17], True), ([7, 10], False), ([12, 3], True)):
            yield ((x, size, ac, None) if vec else (x, size, ac)), {}
        if vec:
            yield (x, None, False, [0.4, 0.75]), {}
            yield (x.transpose(2, 3), None, True, [1.5, 0.5]), {}
        else:
            yield (x, [6, 4], False, 0.5, 0.4), {}

    return g


def _gen_grid(nd: int) -> object:
    def g(dt: torch.dtype) -> Iterator:
        x = _t((2, 3, *([4] * (nd - 1)), 5), dt)
        grid = _t((2, *([3] * (nd - 1)), 4, nd), dt, low=-1.3, high=1.3)
        for mode in (0, 1):
            for pad in (0, 1, 2):
                yield (x, grid, mode, pad, pad == 1), {}

    return g


def _gen_affine(dt: torch.dtype) -> Iterator:
    for size in ([2, 3, 4, 5], [2, 1, 3, 4, 5], [2, 3, 1, 1]):
        nd = len(size) - 2
        th = _t((2, nd, nd + 1), dt)
        yield (th, size, False), {}
        yield (th, size, True), {}


_SAMPLE_SPECS = [
    harness.Spec("aten._upsample_bilinear2d_aa.vec", gen=_gen_aa(True), dtypes=("float32", "float64"), loose=True),
    harness.Spec("aten._upsample_bilinear2d_aa.default", gen=_gen_aa(False), dtypes=("float32", "float64"), loose=True),
    harness.Spec("aten._upsample_bicubic2d_aa.vec", gen=_gen_aa(True), dtypes=("float32", "float64"), loose=True),
    harness.Spec("aten._upsample_bicubic2d_aa.default", gen=_gen_aa(False), dtypes=("float32", "float64"), loose=True),
    harness.Spec(
        "aten.grid_sampler.default", ("nn.functional.grid_sample",), gen=_gen_grid(3), dtypes=("float32", "float64"), loose=True
    ),
    harness.Spec("aten.grid_sampler_3d.default", gen=_gen_grid(3), dtypes=("float32", "float64"), loose=True),
    harness.Spec("aten.affine_grid_generator.default", gen=_gen_affine, dtypes=("float32", "float64"), loose=True),
]
SAMPLE_SPECS = {s.key: s for s in _SAMPLE_SPECS}


@pytest.mark.parametrize("key", sorted(SAMPLE_SPECS))
def test_sampling_kernel_matches_torch(key: str) -> None:
    spec = SAMPLE_SPECS[key]
    torch.manual_seed(0)
    covered = [dt for dt in spec.dtypes if harness.run(spec, dt) > 0]
    assert covered == list(spec.dtypes), f"{key}: compared only in {covered}"


# -- in-place variants of other families' kernels (kernels/inplace.py) ----------------------

_INPLACE_OPINFO = {
    "aten.acos_.default": "acos",
    "aten.acosh_.default": "acosh",
    "aten.asin_.default": "asin",
    "aten.asinh_.default": "asinh",
    "aten.atan_.default": "atan",
    "aten.atanh_.default": "atanh",
    "aten.cosh_.default": "cosh",
    "aten.sinh_.default": "sinh",
    "aten.tan_.default": "tan",
    "aten.exp2_.default": "exp2",
    "aten.expm1_.default": "expm1",
    "aten.log10_.default": "log10",
    "aten.log1p_.default": "log1p",
    "aten.log2_.default": "log2",
    "aten.erfinv_.default": "erfinv",
    "aten.sgn_.default": "sgn",
    "aten.hypot_.default": "hypot",
    "aten.cumsum_.default": "cumsum",
    "aten.cumprod_.default": "cumprod",
    "aten.addmm_.default": "addmm",
    "aten.addbmm_.default": "addbmm",
    "aten.baddbmm_.default": "baddbmm",
    "aten.masked_scatter_.default": "masked_scatter",
    "aten.scatter_add_.default": "scatter_add",
    "aten.scatter_.src": "scatter",
    "aten.scatter_.value": "scatter",
    "aten.conj_physical_.default": "conj_physical",
    "aten.scatter_reduce_.two": "scatter_reduce/sum",
    "aten.floor_divide_.Scalar": "floor_divide",
    "aten.round_.decimals": "round/decimals_3",
    "aten.clamp_min_.Tensor": "clamp_min",
    "aten.clamp_max_.Tensor": "clamp_max",
}
_ACCUMULATING = {
    "aten.cumsum_.default",
    "aten.cumprod_.default",
    "aten.addmm_.default",
    "aten.addbmm_.default",
    "aten.baddbmm_.default",
}


def _same_shape_self(s: object) -> tuple | None:
    """addbmm_'s samples whose self already has the result's shape: torch's in-place addbmm_
    resizes a smaller self (it is addbmm.out into self), which a NumPy array cannot do (the
    kernel refuses it with torch's broadcast message instead)."""
    args, kwargs = harness._default(s)
    b1, b2 = args[1], args[2]
    return (args, kwargs) if tuple(args[0].shape) == (b1.shape[1], b2.shape[2]) else None


@pytest.mark.parametrize("key", sorted(_INPLACE_OPINFO))
def test_inplace_variant_matches_torch(key: str) -> None:
    gen = (
        harness._gen_scalar_binary
        if key.endswith(".Scalar")
        else harness._gen_scatter_value
        if key == "aten.scatter_.value"
        else None
    )
    adapt = _same_shape_self if key == "aten.addbmm_.default" else None
    spec = harness.Spec(key, (_INPLACE_OPINFO[key],), adapt, gen, loose=key in _ACCUMULATING, dtypes=("float32", "int64"))
    torch.manual_seed(0)
    assert harness.run(spec, "float32") > 0, f"{key}: no sample compared"
    harness.run(spec, "int64")  # (torch refuses most integer in-place math: such samples are skipped)
