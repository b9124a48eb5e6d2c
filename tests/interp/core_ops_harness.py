"""Differential harness for the interpreter's core-op kernels: torch's own sample inputs, torch as the oracle.

For every overload in :data:`SPECS`, samples come from the OpInfo named (``op_db``'s
``sample_inputs`` on cpu) and/or a generator; each sample is bound to the overload's
schema the way an exported graph records it (positional arguments by position,
keyword-only ones by name), run through ``torch.ops.aten.<op>.<overload>`` and through the
kernel on the same values as NumPy arrays, and the results are compared: exact for
integer and bool results, within :data:`TOL` for floating point. Samples torch itself
rejects are skipped. ``tests/interp/test_core_ops.py`` runs this per overload and
``scripts/interp_coverage.py --refresh`` records what it covered.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Iterator
from typing import Any

import ml_dtypes
import numpy as np
import torch
from torch.testing import make_tensor

from torchless.core import values as tv
from torchless.core.dtypes import by_name, from_numpy
from torchless.interp import registry

#: the dtypes every op is tried in (where torch supports them)
DTYPES = ["float32", "float64", "int64", "int32", "bool", "bfloat16", "float16", "complex64"]

#: DTYPES without complex (ops torch does not define on complex numbers)
_REAL = tuple(d for d in DTYPES if not d.startswith("complex"))

#: (rtol, atol) per result dtype for floating point results
TOL = {
    "float64": (1e-7, 1e-7),
    "float32": (1e-5, 1e-5),
    "float16": (1e-3, 1e-3),
    "bfloat16": (1.6e-2, 1e-2),
    "complex64": (1e-5, 1e-5),
    "complex128": (1e-7, 1e-7),
}
#: ops whose float results accumulate (sums, products, distances): a looser float32/float64 bound
LOOSE = {"float64": (1e-6, 1e-6), "float32": (1e-4, 1e-4), "float16": (1e-2, 1e-2), "bfloat16": (3e-2, 3e-2)}

#: samples compared per op, dtype and sample source (keeps the suite fast)
MAX_SAMPLES = 6


@dataclasses.dataclass
class Spec:
    key: str  # "aten.add.Tensor"
    opinfo: tuple[str, ...] = ()
    adapt: Callable[[Any], tuple[tuple, dict] | None] | None = None  # SampleInput -> (args, kwargs)
    gen: Callable[[torch.dtype], Iterator[tuple[tuple, dict]]] | None = None
    check: str = "values"  # "values", "meta" (shape/dtype only), "sort" (values, indices by gather)
    loose: bool = False
    dtypes: tuple[str, ...] = tuple(DTYPES)
    gen_cap: int = MAX_SAMPLES + 2  # generated samples compared per dtype


def _default(s: Any) -> tuple[tuple, dict]:
    return (s.input, *s.args), dict(s.kwargs)


def _t(shape: Any, dt: torch.dtype, **kw: Any) -> torch.Tensor:
    return make_tensor(shape, dtype=dt, device="cpu", **kw)


def _drop(*names: str) -> Callable[[Any], tuple[tuple, dict]]:
    def f(s: Any) -> tuple[tuple, dict]:
        a, k = _default(s)
        return a, {n: v for n, v in k.items() if n not in names}

    return f


def _softmax_adapt(s: Any) -> tuple[tuple, dict] | None:
    if s.kwargs.get("dtype") is not None:
        return None
    dim = s.args[0] if s.args else s.kwargs.get("dim")
    return (s.input, dim, False), {}


def _where_adapt(s: Any) -> tuple[tuple, dict]:
    return (s.args[0], s.input, s.args[1]), {}


def _rpow_adapt(s: Any) -> tuple[tuple, dict] | None:
    if not s.args or isinstance(s.args[0], torch.Tensor):
        return None
    return (s.args[0], s.input), {}


_CDIST_MODES = {
    None: None,
    "use_mm_for_euclid_dist_if_necessary": 0,
    "use_mm_for_euclid_dist": 1,
    "donot_use_mm_for_euclid_dist": 2,
}


def _cdist_adapt(s: Any) -> tuple[tuple, dict]:
    a = list(s.args) + [None] * 3
    p = s.kwargs.get("p", a[1] if a[1] is not None else 2.0)
    mode = s.kwargs.get("compute_mode", a[2])
    return (s.input, a[0], float(p), _CDIST_MODES[mode]), {}


def _pdist_adapt(s: Any) -> tuple[tuple, dict]:
    return (s.input, float(s.args[0] if s.args else s.kwargs.get("p", 2.0))), {}


def _cumsum_adapt(s: Any) -> tuple[tuple, dict]:
    return _default(s)


# -- generators for ops without a usable OpInfo ---------------------------------------------


def _gen_unary(shapes: tuple = ((3, 4), (), (2, 0, 3))) -> Callable[[torch.dtype], Iterator]:
    def g(dt: torch.dtype) -> Iterator:
        for sh in shapes:
            yield (_t(sh, dt),), {}
        yield (_t((4, 6), dt)[:, ::2],), {}  # non-contiguous

    return g


def _gen_scalar_binary(dt: torch.dtype) -> Iterator:
    x = _t((3, 4), dt)
    for v in (2, -3, 2.5, True, 0.5):
        yield (x, v), {}
    yield (_t((), dt), 3), {}


def _gen_clamp_scalar(dt: torch.dtype) -> Iterator:
    x = _t((4, 5), dt)
    yield (x, -2, 3), {}
    yield (x, None, 1.5), {}
    yield (x, 0.5, None), {}
    yield (x, 3, -2), {}
    if dt.is_floating_point:
        y = x.clone()
        y[0, 0] = float("nan")
        yield (y, -1.0, 1.0), {}


def _gen_copy(dt: torch.dtype) -> Iterator:
    for src_dt in (torch.float32, torch.int64, torch.bool, dt):
        yield (_t((3, 4), dt), _t((4,), src_dt)), {}
    yield (_t((2, 3), dt), _t((), torch.float64)), {}


def _gen_to_copy(dt: torch.dtype) -> Iterator:
    x = _t((3, 5), dt)
    if dt.is_floating_point:  # with values beyond float8's range
        yield (x * 300,), {"dtype": torch.float8_e4m3fn}
        yield (x * 3e4,), {"dtype": torch.float8_e5m2}
    for out in (
        torch.float32,
        torch.float64,
        torch.int64,
        torch.int32,
        torch.bool,
        torch.bfloat16,
        torch.float16,
        torch.uint8,
        torch.float8_e4m3fn,
        torch.float8_e5m2,
    ):
        yield (x,), {"dtype": out}
    yield (x,), {}


def _gen_local_scalar(dt: torch.dtype) -> Iterator:
    yield (_t((), dt),), {}
    yield (_t((1, 1), dt),), {}


def _gen_arange(dt: torch.dtype) -> Iterator:
    if dt.is_floating_point:
        yield (0.0, 1.0, 0.1), {"dtype": dt}
        yield (-2.5, 3, 0.7), {"dtype": dt}
        yield (5, -1.5, -0.25), {"dtype": dt}
    elif dt != torch.bool:
        yield (0, 10, 3), {"dtype": dt}
        yield (-5, 7, 2), {"dtype": dt}
        yield (10, 0, -3), {"dtype": dt}
    if dt == torch.float32:
        yield (0, 10, 3), {}
        yield (0, 1, 0.25), {}


def _gen_full(dt: torch.dtype) -> Iterator:
    for v in (2, -1.5, True):
        yield ([2, 3], v), {"dtype": dt}
    if dt == torch.float32:
        for v in (2, -1.5, True):
            yield ([2, 3], v), {}


def _gen_full_like(dt: torch.dtype) -> Iterator:
    x = _t((2, 3), dt)
    for v in (2, -1.5, True):
        yield (x, v), {}
    yield (x, 7), {"dtype": torch.float64}


def _gen_empty(dt: torch.dtype) -> Iterator:
    yield ([2, 3],), {"dtype": dt}
    yield ([0],), {"dtype": dt}


def _gen_empty_strided(dt: torch.dtype) -> Iterator:
    yield ([2, 3], [3, 1]), {"dtype": dt}
    yield ([2, 3], [1, 2]), {"dtype": dt}


def _gen_random(dt: torch.dtype) -> Iterator:
    yield ([3, 4],), {"dtype": dt}
    yield ([0, 2],), {"dtype": dt}


def _gen_randperm(dt: torch.dtype) -> Iterator:
    yield (7,), {"dtype": dt}
    yield (0,), {"dtype": dt}


def _gen_scalar_tensor(dt: torch.dtype) -> Iterator:
    for v in (3, -2.5, True):
        yield (v,), {"dtype": dt}


def _gen_alias(dt: torch.dtype) -> Iterator:
    yield (_t((2, 3), dt),), {}
    yield (_t((), dt),), {}


def _gen_index(dt: torch.dtype) -> Iterator:
    x = _t((4, 5, 6), dt)
    i = torch.tensor([0, 3, -1, 2])
    j = torch.tensor([[1], [4]])
    yield (x, [i]), {}
    yield (x, [None, torch.tensor([0, 2, 4])]), {}
    yield (x, [i[:2], None, torch.tensor([5, 0])]), {}
    yield (x, [None, j, torch.tensor([1, 2, 3])]), {}
    yield (x, [x.abs().float() > 0.5 if dt != torch.bool else x]), {}
    yield (x, [torch.tensor([True, False, True, True]), None, torch.tensor([0, 1, 2])]), {}


def _gen_atan2_out(dt: torch.dtype) -> Iterator:
    a, b = _t((3, 4), dt), _t((4,), dt)
    out_dt = dt if dt.is_floating_point else torch.float32
    yield (a, b), {"out": torch.empty((3, 4), dtype=out_dt)}
    yield (a, b), {"out": torch.empty((0,), dtype=out_dt)}


def _gen_fft_r2c(dt: torch.dtype) -> Iterator:
    for shape, dim in (((8,), [0]), ((3, 6), [1]), ((4, 5, 6), [0, 2]), ((5, 7), [0, 1])):
        x = _t(shape, dt)
        for norm in (0, 1, 2):
            yield (x, dim, norm, True), {}
        yield (x, dim, 0, False), {}


def _gen_fft_c2r(dt: torch.dtype) -> Iterator:
    cdt = torch.complex64 if dt == torch.float32 else torch.complex128
    for shape, dim, last in (((5,), [0], 8), ((3, 4), [1], 7), ((4, 5, 6), [0, 2], 10)):
        x = _t(shape, cdt)
        for norm in (0, 1, 2):
            yield (x, dim, norm, last), {}


def _gen_var(correction: bool) -> Callable[[torch.dtype], Iterator]:
    def g(dt: torch.dtype) -> Iterator:
        x = _t((4, 5, 6), dt)
        if correction:
            yield (x, [1]), {"correction": 0, "keepdim": True}
            yield (x, None), {"correction": 2}
            yield (x, [0, 2]), {}
            yield (x,), {}
            yield (_t((1, 3), dt), [0]), {}
        else:
            yield (x, [1], True, True), {}
            yield (x, [0, 2], False), {}
            yield (x, None), {}

    return g


def _gen_resize(dt: torch.dtype) -> Iterator:
    yield (_t((3, 4), dt), [2, 6]), {}
    yield (_t((3, 4), dt), [2, 2]), {}


def _gen_softmax_h2f(dt: torch.dtype) -> Iterator:
    yield (_t((3, 5), dt), 1, False), {}
    yield (_t((3, 5), dt), 0, False), {}
    yield (_t((), dt), 0, False), {}
    if dt.is_floating_point:
        x = _t((2, 4), dt)
        x[0] = float("-inf")
        yield (x, 1, False), {}


def _gen_sum(dt: torch.dtype) -> Iterator:
    x = _t((4, 5, 6), dt)
    yield (x, [1]), {}
    yield (x, None), {}
    yield (x, [0, 2], True), {}
    yield (x, []), {}
    yield (x, [-1]), {"dtype": torch.float64}
    yield (_t((3, 0), dt), [1]), {}


def _gen_slice(dt: torch.dtype) -> Iterator:
    x = _t((6, 7), dt)
    yield (x, 0, 1, 5, 2), {}
    yield (x, 1, -3, None), {}
    yield (x, 1, None, 100), {}
    yield (x, 0, 2, 1), {}
    yield (x, -1, -100, -2, 3), {}


def _gen_split_with_sizes(dt: torch.dtype) -> Iterator:
    x = _t((6, 7), dt)
    yield (x, [2, 4]), {}
    yield (x, [3, 0, 4], 1), {}


def _gen_index_select(dt: torch.dtype) -> Iterator:
    x = _t((4, 5), dt)
    yield (x, 0, torch.tensor([3, 0, 0])), {}
    yield (x, 1, torch.tensor([4])), {}
    yield (x, -1, torch.tensor(2)), {}


def _gen_scatter_value(dt: torch.dtype) -> Iterator:
    x = _t((4, 5), dt)
    idx = torch.tensor([[0, 1, 2], [3, 0, 1]])
    yield (x, 0, idx, 2), {}
    yield (x, 1, idx, 1.5 if dt.is_floating_point else 1), {}


def _gen_any_dims(dt: torch.dtype) -> Iterator:
    x = _t((3, 4, 5), dt)
    yield (x, [0, 2]), {}
    yield (x, None, True), {}
    yield (x, [1], True), {}


def _gen_sort(dt: torch.dtype) -> Iterator:
    x = _t((4, 6), dt, low=-3, high=3) if dt != torch.bool else _t((4, 6), dt)
    yield (x,), {}
    yield (x, 0, True), {}
    if dt.is_floating_point:
        y = x.clone()
        y[0, 1] = float("nan")
        y[1, 2] = float("inf")
        yield (y, 1, True), {}
        yield (y, 1, False), {}


def _gen_topk(dt: torch.dtype) -> Iterator:
    x = _t((4, 6), dt, low=-3, high=3) if dt != torch.bool else _t((4, 6), dt)
    yield (x, 3), {}
    yield (x, 2, 0, False), {}
    yield (x, 6, 1, True, True), {}


def _gen_mean(dt: torch.dtype) -> Iterator:
    x = _t((4, 5, 6), dt)
    yield (x, [1]), {}
    yield (x, None, True), {}
    yield (x, [0, 2]), {"dtype": torch.float64}


def _gen_expand(dt: torch.dtype) -> Iterator:
    yield (_t((3, 1), dt), [2, 3, 4]), {}
    yield (_t((3, 1), dt), [-1, 5]), {}


def _gen_masked_scatter(dt: torch.dtype) -> Iterator:
    x = _t((3, 4), dt)
    yield (x, torch.rand(3, 4) > 0.5, _t((12,), dt)), {}
    yield (x, torch.rand(4) > 0.5, _t((3, 5), dt)), {}


def _gen_nonzero(dt: torch.dtype) -> Iterator:
    yield (_t((3, 4), dt),), {}
    yield (_t((), dt),), {}
    yield (torch.zeros((2, 3), dtype=dt),), {}


def _gen_erfinv(dt: torch.dtype) -> Iterator:
    if dt.is_floating_point:
        yield (_t((50,), dt, low=-1, high=1),), {}
        yield (torch.tensor([-1.0, 1.0, 0.0, 0.999999, -0.5, 1.5], dtype=dt),), {}
    else:
        yield (_t((3, 4), dt, low=-1, high=2),), {}


def _gen_div_mode(dt: torch.dtype) -> Iterator:
    a = _t((4, 5), dt, low=-9, high=9)
    b = _t((4, 5), dt, low=-9, high=9, exclude_zero=True)
    for m in ("trunc", "floor", None):
        yield (a, b), {"rounding_mode": m}
        yield (a, -3), {"rounding_mode": m}
        yield (a, 2.5), {"rounding_mode": m}


def _gen_remainder(dt: torch.dtype) -> Iterator:
    a = _t((4, 5), dt, low=-9, high=9)
    b = _t((4, 5), dt, low=-9, high=9, exclude_zero=True)
    yield (a, b), {}
    yield (a, -3), {}
    yield (a, 2.5), {}


def _gen_pow_scalar(dt: torch.dtype) -> Iterator:
    e = _t((3, 4), dt, low=-3, high=3)
    for base in (2, -2, 1, 0.5, True):
        yield (base, e), {}


def _gen_pow(dt: torch.dtype) -> Iterator:
    b = _t((3, 4), dt, low=-4, high=4)
    e = _t((3, 4), dt, low=-3, high=3)
    yield (b, e), {}
    yield (b, 2), {}
    yield (b, -1), {}
    yield (b, 0.5), {}


def _gen_to(dt: torch.dtype) -> Iterator:
    x = _t((3, 4), dt)
    for out in (torch.float32, torch.float64, torch.int64, torch.int32, torch.bool, torch.bfloat16, torch.float16, dt):
        yield (x, out), {}
        yield (x,), {"dtype": out}
        yield (x, torch.device("cpu"), out), {}
        yield (x, _t((2,), out)), {}
    yield (x, dt, False, True), {}  # copy=True
    yield (x,), {"dtype": dt, "copy": True, "layout": torch.strided, "device": torch.device("cpu")}


def _gen_numpy_t(dt: torch.dtype) -> Iterator:
    for sh in ((2, 3, 4), (5,), (), (2, 1, 3, 2)):
        yield (_t(sh, dt),), {}


def _broadcast_adapt(s: Any) -> tuple[tuple, dict]:
    return ([s.input, *s.args],), {}


def _gen_broadcast(dt: torch.dtype) -> Iterator:
    yield ([_t((3, 1), dt), _t((4,), dt), _t((), dt)],), {}
    yield ([_t((2, 1, 3), dt)],), {}


def _with_nan_and_ties(dt: torch.dtype, shape: tuple = (4, 7)) -> torch.Tensor:
    x = _t(shape, dt, low=-3, high=3) if dt != torch.bool else _t(shape, dt)
    if dt.is_floating_point:
        x = x.round()  # ties
        x[0, 2] = float("nan")
        x[0, 5] = float("nan")
        x[1, 0] = float("nan")
        x[2, 3] = float("inf")
        x[3, 1] = float("-inf")
    return x


def _gen_cum_extreme(dt: torch.dtype) -> Iterator:
    x = _with_nan_and_ties(dt)
    yield (x, 1), {}
    yield (x, 0), {}
    yield (x, -1), {}
    yield (_t((), dt), 0), {}
    yield (_t((3, 0), dt), 1), {}


def _gen_logcumsumexp(dt: torch.dtype) -> Iterator:
    yield (_t((4, 6), dt), 1), {}
    yield (_t((4, 6), dt) * 60, 0), {}  # large values: no overflow
    if dt.is_floating_point:
        x = _t((3, 5), dt)
        x[0, :2] = float("-inf")
        x[1, 1] = float("inf")
        x[2, 3] = float("nan")
        yield (x, 1), {}
    if dt.is_complex:
        x = _t((3, 5), dt) * 30
        x[0, 0] = complex(float("-inf"), 0)
        x[1, :2] = complex(float("-inf"), 0)
        yield (x, 1), {}
    yield (_t((), dt), 0), {}


def _gen_moments(correction: bool) -> Callable[[torch.dtype], Iterator]:
    """``var``'s samples (one element included: NaN for correction 1), and for the
    ``unbiased`` forms also the ``default`` overload's ``(x, unbiased)`` and ``(x,)``."""
    var_samples = _gen_var(correction)

    def g(dt: torch.dtype) -> Iterator:
        yield from var_samples(dt)
        if not correction:
            x = _t((4, 5, 6), dt)
            yield (x, False), {}
            yield (x,), {}

    return g


def _sorted(shape: tuple, dt: torch.dtype) -> torch.Tensor:
    return _t(shape, dt, low=-5, high=5).sort(-1).values


def _gen_searchsorted(dt: torch.dtype) -> Iterator:
    seq = _sorted((7,), dt)
    seq[2] = seq[3]  # ties
    v = _t((3, 4), dt, low=-6, high=6)
    v.view(-1)[0] = seq[2]
    yield (seq, v), {}
    yield (seq, v), {"right": True}
    yield (seq, v), {"side": "right", "out_int32": True}
    yield (seq, v), {"side": "left"}
    rows = _sorted((3, 6), dt)
    yield (rows, _t((3, 5), dt, low=-6, high=6)), {}
    perm = torch.randperm(7)
    yield (seq[perm], v), {"sorter": perm.argsort()}
    if dt.is_floating_point:
        seqn = torch.cat([seq, torch.tensor([float("nan")], dtype=dt)])
        vn = v.clone()
        vn.view(-1)[1] = float("nan")
        vn.view(-1)[2] = float("inf")
        yield (seqn, vn), {}
        yield (seqn, vn), {"right": True}
    yield (seq, 1), {}
    yield (seq, 2.5), {"right": True}


def _gen_bucketize(dt: torch.dtype) -> Iterator:
    b = _sorted((6,), dt)
    x = _t((3, 4), dt, low=-6, high=6)
    x.view(-1)[0] = b[1]
    yield (x, b), {}
    yield (x, b), {"right": True, "out_int32": True}
    yield (1, b), {}
    yield (_t((), dt, low=-6, high=6), b), {"right": True}


def _gen_shift(dt: torch.dtype) -> Iterator:
    a = _t((4, 6), dt, low=-100, high=100)
    counts = torch.tensor([0, 1, 3, 7, 8, 15, 16, 31, 32, 63, 64, 70, -1, -5, 100, 2] * 2, dtype=torch.int64)[:24]
    yield (a, counts.reshape(4, 6).to(dt)), {}
    yield (a, 2), {}
    yield (a, 40), {}
    yield (a, -2), {}
    yield (a, _t((6,), dt, low=0, high=9)), {}
    yield (3, _t((4,), dt, low=0, high=9)), {}


def _gen_view_as_real(dt: torch.dtype) -> Iterator:
    yield (_t((3, 4), dt),), {}
    yield (_t((), dt),), {}
    yield (_t((4, 6), dt)[:, ::2],), {}


def _gen_view_as_complex(dt: torch.dtype) -> Iterator:
    yield (_t((3, 4, 2), dt),), {}
    yield (_t((2,), dt),), {}
    yield (_t((5, 2), dt)[::2],), {}


def _gen_complex(dt: torch.dtype) -> Iterator:
    yield (_t((3, 4), dt), _t((3, 4), dt)), {}
    yield (_t((3, 1), dt), _t((4,), dt)), {}
    if dt.is_floating_point:
        r = torch.tensor([float("inf"), float("-inf"), float("nan"), 1.0, 0.0], dtype=dt)
        yield (r, r.flip(0)), {}


def _gen_angle(dt: torch.dtype) -> Iterator:
    yield from _gen_unary()(dt)
    if dt.is_floating_point:
        yield (torch.tensor([-1.0, 0.0, -0.0, 2.0, float("nan"), float("-inf")], dtype=dt),), {}


#: aten overload -> how it is tested
SPECS: dict[str, Spec] = {}


def _spec(key: str, *opinfo: str, **kw: Any) -> None:
    SPECS[key] = Spec(key, tuple(opinfo), **kw)


for _u in [
    "abs",
    "acos",
    "acosh",
    "asin",
    "asinh",
    "atan",
    "atanh",
    "ceil",
    "cos",
    "cosh",
    "erf",
    "exp",
    "expm1",
    "floor",
    "isinf",
    "isnan",
    "log",
    "log10",
    "log1p",
    "log2",
    "logical_not",
    "neg",
    "reciprocal",
    "round",
    "rsqrt",
    "sigmoid",
    "sign",
    "sin",
    "sinh",
    "sqrt",
    "tan",
    "tanh",
    "trunc",
    "bitwise_not",
    "nonzero",
    "clone",
]:
    _spec(f"aten.{_u}.default", _u, gen=_gen_unary() if _u not in ("nonzero",) else _gen_nonzero)

for _b in ["add", "sub", "mul"]:
    _spec(f"aten.{_b}.Tensor", _b)
    _spec(f"aten.{_b}.Scalar", _b, gen=_gen_scalar_binary)
for _b in ["eq", "ne", "lt", "le", "gt", "ge", "bitwise_and", "bitwise_or", "bitwise_xor", "remainder", "fmod"]:
    _spec(f"aten.{_b}.Tensor", _b, gen=_gen_remainder if _b in ("remainder", "fmod") else None)
    _spec(f"aten.{_b}.Scalar", _b, gen=_gen_scalar_binary)
for _b in ["logical_and", "logical_or", "logical_xor", "maximum", "minimum"]:
    _spec(f"aten.{_b}.default", _b)
_spec("aten.div.Tensor", "div/no_rounding_mode", gen=_gen_remainder)
_spec("aten.div.Scalar", "div/no_rounding_mode", gen=_gen_scalar_binary)
_spec("aten.div.Tensor_mode", "div/trunc_rounding", "div/floor_rounding", gen=_gen_div_mode)
_spec("aten.div.Scalar_mode", "div/trunc_rounding", "div/floor_rounding", gen=_gen_div_mode)
_spec("aten.pow.Tensor_Tensor", "pow", gen=_gen_pow)
_spec("aten.pow.Tensor_Scalar", "pow", gen=_gen_pow)
_spec("aten.pow.Scalar", "__rpow__", adapt=_rpow_adapt, gen=_gen_pow_scalar)
_spec("aten.atan2.default", "atan2")
_spec("aten.atan2.out", gen=_gen_atan2_out)
_spec("aten.clamp.Tensor", "clamp")
_spec("aten.clamp.default", "clamp", gen=_gen_clamp_scalar)
_spec("aten.where.self", "where", adapt=_where_adapt)
_spec("aten.relu.default", "nn.functional.relu", adapt=_drop("inplace"))
_spec("aten.gelu.default", "nn.functional.gelu")
_spec("aten.elu.default", "nn.functional.elu", adapt=_drop("inplace"))
_spec("aten.hardtanh.default", "nn.functional.hardtanh", adapt=_drop("inplace"))
_spec("aten.leaky_relu.default", "nn.functional.leaky_relu", adapt=_drop("inplace"))
_spec("aten._softmax.default", "softmax", adapt=_softmax_adapt, gen=_gen_softmax_h2f)
_spec("aten._log_softmax.default", "log_softmax", adapt=_softmax_adapt, gen=_gen_softmax_h2f)
_spec("aten.sum.dim_IntList", "sum", gen=_gen_sum, loose=True)
_spec("aten.mean.default", "mean", loose=True)
_spec("aten.mean.dim", "mean", gen=_gen_mean, loose=True)
_spec("aten.prod.default", "prod", loose=True)
_spec("aten.prod.dim_int", "prod", loose=True)
_spec("aten.amax.default", "amax")
_spec("aten.amin.default", "amin")
_spec("aten.any.default", "any")
_spec("aten.any.dim", "any")
_spec("aten.any.dims", "any", gen=_gen_any_dims)
_spec("aten.argmax.default", "argmax")
_spec("aten.argmin.default", "argmin")
_spec("aten.max.dim", "max/reduction_with_dim")
_spec("aten.min.dim", "min/reduction_with_dim")
_spec("aten.var.correction", "var", gen=_gen_var(True), loose=True)
_spec("aten.var.dim", "var", gen=_gen_var(False), loose=True)
_spec("aten.cumsum.default", "cumsum", loose=True)
_spec("aten.sort.default", "sort", gen=_gen_sort, check="sort")
_spec("aten.topk.default", "topk", gen=_gen_topk, check="sort")
_spec("aten.alias.default", gen=_gen_alias)
_spec("aten.as_strided.default", "as_strided")
_spec("aten.view.default", "view")
_spec("aten.permute.default", "permute")
_spec("aten.expand.default", "expand", gen=_gen_expand)
_spec("aten.squeeze.dim", "squeeze")
_spec("aten.squeeze.dims", "squeeze/multiple")
_spec("aten.unsqueeze.default", "unsqueeze")
_spec("aten.select.int", "select")
_spec("aten.slice.Tensor", "slice", gen=_gen_slice)
_spec("aten.diagonal.default", "diagonal")
_spec("aten.flip.default", "flip")
_spec("aten.repeat.default", "repeat")
_spec("aten.cat.default", "cat")
_spec("aten.copy.default", gen=_gen_copy)
_spec("aten.split_with_sizes.default", "split_with_sizes", gen=_gen_split_with_sizes)
_spec("aten.constant_pad_nd.default", "constant_pad_nd")
_spec("aten.resize_.default", "resize_", gen=_gen_resize, check="resize")
_spec("aten.gather.default", "gather")
_spec("aten.index.Tensor", gen=_gen_index)
_spec("aten.index_put.default", "index_put")
_spec("aten.index_select.default", "index_select", gen=_gen_index_select)
_spec("aten.scatter.src", "scatter")
_spec("aten.scatter.value", "scatter", gen=_gen_scatter_value)
_spec("aten.scatter_add.default", "scatter_add", loose=True)
_spec(
    "aten.scatter_reduce.two",
    "scatter_reduce/sum",
    "scatter_reduce/prod",
    "scatter_reduce/mean",
    "scatter_reduce/amax",
    "scatter_reduce/amin",
    loose=True,
)
_spec("aten.select_scatter.default", "select_scatter")
_spec("aten.slice_scatter.default", "slice_scatter")
_spec("aten.masked_scatter.default", "masked_scatter", gen=_gen_masked_scatter)
_spec("aten.arange.start_step", gen=_gen_arange)
_spec("aten.empty.memory_format", gen=_gen_empty, check="meta")
_spec("aten.empty_strided.default", gen=_gen_empty_strided, check="meta")
_spec("aten.full.default", gen=_gen_full)
_spec("aten.full_like.default", gen=_gen_full_like)
_spec("aten.scalar_tensor.default", gen=_gen_scalar_tensor)
_spec("aten.fill.Scalar", "fill")
_spec("aten.rand.default", gen=_gen_random, check="meta", dtypes=("float32", "float64", "bfloat16", "float16"))
_spec("aten.randn.default", gen=_gen_random, check="meta", dtypes=("float32", "float64", "bfloat16", "float16"))
_spec("aten.randperm.default", gen=_gen_randperm, check="perm", dtypes=("int64", "int32", "float32", "float64"))
_spec("aten.mm.default", "mm", loose=True)
_spec("aten.bmm.default", "bmm", loose=True)
_spec("aten.addmm.default", "addmm", loose=True)
_spec("aten._to_copy.default", gen=_gen_to_copy, gen_cap=13)
_spec("aten._local_scalar_dense.default", gen=_gen_local_scalar)
_spec("aten._cdist_forward.default", "cdist", adapt=_cdist_adapt, loose=True)
_spec("aten._pdist_forward.default", "nn.functional.pdist", adapt=_pdist_adapt, loose=True)
_spec("aten._fft_r2c.default", gen=_gen_fft_r2c, loose=True, dtypes=("float32", "float64"))
_spec("aten._fft_c2r.default", gen=_gen_fft_c2r, loose=True, dtypes=("float32", "float64"))
_spec("aten.to.dtype", "to", gen=_gen_to, gen_cap=9)
_spec("aten.to.dtype_layout", "to", gen=_gen_to, gen_cap=9)
_spec("aten.to.device", "to", gen=_gen_to, gen_cap=9)
_spec("aten.to.other", "to", gen=_gen_to, gen_cap=9)
_spec("aten.numpy_T.default", "T", gen=_gen_numpy_t)
_spec("aten.broadcast_tensors.default", "broadcast_tensors", adapt=_broadcast_adapt, gen=_gen_broadcast)
_spec("aten.cummax.default", "cummax", gen=_gen_cum_extreme)
_spec("aten.cummin.default", "cummin", gen=_gen_cum_extreme)
_spec("aten.logcumsumexp.default", "logcumsumexp", gen=_gen_logcumsumexp, loose=True)
_spec("aten.var_mean.correction", "var_mean", gen=_gen_moments(True), loose=True)
_spec("aten.var_mean.dim", "var_mean/unbiased", gen=_gen_moments(False), loose=True)
_spec("aten.var_mean.default", "var_mean/unbiased", gen=_gen_moments(False), loose=True)
_spec("aten.std.correction", "std", gen=_gen_moments(True), loose=True)
_spec("aten.std.dim", "std/unbiased", gen=_gen_moments(False), loose=True)
_spec("aten.std.default", "std/unbiased", gen=_gen_moments(False), loose=True)
_spec("aten.std_mean.correction", "std_mean", gen=_gen_moments(True), loose=True)
_spec("aten.std_mean.dim", "std_mean/unbiased", gen=_gen_moments(False), loose=True)
_spec("aten.std_mean.default", "std_mean/unbiased", gen=_gen_moments(False), loose=True)
_spec("aten.searchsorted.Tensor", "searchsorted", gen=_gen_searchsorted, gen_cap=12, dtypes=_REAL)
_spec("aten.searchsorted.Scalar", "searchsorted", gen=_gen_searchsorted, gen_cap=12, dtypes=_REAL)
_spec("aten.bucketize.Tensor", "bucketize", gen=_gen_bucketize, dtypes=_REAL)
_spec("aten.bucketize.Scalar", "bucketize", gen=_gen_bucketize, dtypes=_REAL)
for _sh, _info in (("__lshift__", "bitwise_left_shift"), ("__rshift__", "bitwise_right_shift")):
    _spec(f"aten.{_sh}.Tensor", _info, gen=_gen_shift)
    _spec(f"aten.{_sh}.Scalar", _info, gen=_gen_shift)
for _sh in ("bitwise_left_shift", "bitwise_right_shift"):
    for _ov in ("Tensor", "Tensor_Scalar", "Scalar_Tensor"):
        _spec(f"aten.{_sh}.{_ov}", _sh, gen=_gen_shift)
# float16 in gives complex32 (chalf), which NumPy lacks: those are compared in test_core_ops.py
_spec("aten.view_as_real.default", "view_as_real", gen=_gen_view_as_real, dtypes=("complex64", "complex128"))
_spec("aten.view_as_complex.default", "view_as_complex", gen=_gen_view_as_complex, dtypes=("float32", "float64"))
_spec("aten.complex.default", "complex", gen=_gen_complex, dtypes=("float32", "float64"))
_spec("aten.real.default", "real", gen=_gen_unary())
_spec("aten.imag.default", "imag", gen=_gen_unary())
_spec("aten.conj.default", "conj", gen=_gen_unary())
_spec("aten._conj.default", "conj", gen=_gen_unary())
_spec("aten.conj_physical.default", "conj_physical", gen=_gen_unary())
_spec("aten.resolve_conj.default", "resolve_conj", gen=_gen_unary())
_spec("aten.resolve_neg.default", "resolve_neg", gen=_gen_unary())
_spec("aten.angle.default", "angle", gen=_gen_angle)
_spec("aten.polar.default", "polar", dtypes=("float32", "float64"))
# common non-core operators that run_decompositions() leaves in a graph
_spec("aten.hypot.default", "hypot")
_spec("aten.erfinv.default", "erfinv", gen=_gen_erfinv, loose=True)
_spec("aten.median.dim", "median", check="indexed")
_spec("aten.kthvalue.default", "kthvalue", check="indexed")
_spec("aten.unfold.default", "unfold")
_spec("aten.linalg_vector_norm.default", "linalg.vector_norm", loose=True)
_spec("aten.bincount.default", "bincount")
_spec("aten.dist.default", "dist", loose=True)


# -- running ---------------------------------------------------------------------------------


@functools.cache
def _opinfos() -> dict[str, Any]:
    from torch.testing._internal.common_methods_invocations import op_db

    return {o.name + (f"/{o.variant_test_name}" if o.variant_test_name else ""): o for o in op_db}


def _overload(key: str) -> Any:
    _, name, ov = key.split(".")
    return getattr(getattr(torch.ops.aten, name), ov)


def _bind(op: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
    """(args, kwargs) as an exported graph records them for ``op``'s schema; None if they do not fit."""
    schema = op._schema
    params = schema.arguments
    bound: dict[str, Any] = {}
    pos = [p for p in params if not p.kwarg_only]
    if len(args) > len(pos):
        return None
    for p, v in zip(pos, args, strict=False):
        bound[p.name] = v
    names = {p.name for p in params}
    for k, v in kwargs.items():
        if k in ("inplace", "requires_grad") or (k == "device" and "device" not in names):
            continue
        if k not in names or k in bound:
            return None
        bound[k] = v
    for p in params:
        v = bound.get(p.name)
        ty = str(p.type)
        if ty in ("Scalar", "Scalar?") and isinstance(v, torch.Tensor):
            return None  # a Scalar argument is a number in a graph
        if ty == "Tensor" and p.name in bound and not isinstance(v, (torch.Tensor, int, float, bool, complex)):
            return None
    out_args: list[Any] = []
    last = max((i for i, p in enumerate(pos) if p.name in bound), default=-1)
    for p in pos[: last + 1]:
        out_args.append(bound.get(p.name, p.default_value))
    out_kwargs = {p.name: bound[p.name] for p in params if p.kwarg_only and p.name in bound}
    return tuple(out_args), out_kwargs


def to_numpy(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        t = v.detach().resolve_conj().resolve_neg()
        if t.dtype == torch.bfloat16:
            return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
        if str(t.dtype).startswith("torch.float8"):
            return t.view(torch.uint8).numpy().view(getattr(ml_dtypes, str(t.dtype).removeprefix("torch.")))
        return t.numpy()
    if isinstance(v, (list, tuple)):
        return type(v)(to_numpy(x) for x in v)
    if isinstance(v, dict):
        return {k: to_numpy(x) for k, x in v.items()}
    if isinstance(v, torch.dtype):
        return by_name(str(v))
    if isinstance(v, torch.memory_format):
        return tv.MemoryFormat(str(v).removeprefix("torch."))
    if isinstance(v, torch.layout):
        return tv.Layout(str(v).removeprefix("torch."))
    if isinstance(v, torch.device):
        return tv.Device(str(v))
    return v


def _clone(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        return v.detach().clone()
    if isinstance(v, (list, tuple)):
        return type(v)(_clone(x) for x in v)
    if isinstance(v, dict):
        return {k: _clone(x) for k, x in v.items()}
    return v


def _np_of(t: torch.Tensor) -> np.ndarray:
    return to_numpy(t)


def _tname(dt: torch.dtype) -> str:
    return str(dt).removeprefix("torch.")


def compare(want: Any, got: Any, spec: Spec, where: str) -> None:
    if isinstance(want, torch.Tensor):
        assert isinstance(got, np.ndarray), f"{where}: expected an ndarray, got {type(got).__name__}"
        wname = _tname(want.dtype)
        gname = from_numpy(got.dtype).name
        assert gname == wname or (wname == "complex32" and gname == "complex64"), f"{where}: dtype {gname} != torch's {wname}"
        assert tuple(got.shape) == tuple(want.shape), f"{where}: shape {got.shape} != torch's {tuple(want.shape)}"
        if spec.check in ("meta",):
            return
        w = _np_of(want)
        if want.dtype.is_floating_point or want.dtype.is_complex:
            rtol, atol = (LOOSE if spec.loose else TOL).get(wname, TOL["float32"])
            g64 = got.astype(np.complex128 if want.dtype.is_complex else np.float64)
            w64 = w.astype(np.complex128 if want.dtype.is_complex else np.float64)
            ok = np.isclose(g64, w64, rtol=rtol, atol=atol, equal_nan=True)
            if not ok.all():
                i = np.argwhere(~ok)[0]
                raise AssertionError(
                    f"{where}: {int((~ok).sum())} of {ok.size} elements beyond rtol={rtol} atol={atol}; "
                    f"first at {tuple(i)}: got {g64[tuple(i)]}, torch {w64[tuple(i)]}"
                )
        else:
            assert np.array_equal(got, w), f"{where}: values differ\n got {got!r}\n torch {w!r}"
    elif isinstance(want, (tuple, list)):
        assert isinstance(got, (tuple, list)) and len(got) == len(want), f"{where}: expected {len(want)} outputs"
        for i, (w, g) in enumerate(zip(want, got, strict=True)):
            compare(w, g, spec, f"{where}[{i}]")
    elif isinstance(want, (bool, int, float, complex)):
        assert type(got) is type(want), f"{where}: {type(got).__name__} != torch's {type(want).__name__}"
        if isinstance(want, float) and math.isnan(want):
            assert math.isnan(got)
        else:
            assert got == want, f"{where}: {got} != {want}"
    else:
        raise AssertionError(f"{where}: unexpected torch output {type(want).__name__}")


def _compare_sorted(want: Any, got: Any, inputs: tuple, spec: Spec, where: str) -> None:
    compare(want[0], got[0], spec, where + "[values]")
    assert isinstance(got[1], np.ndarray) and got[1].dtype == np.int64 and got[1].shape == tuple(want[1].shape), where
    x = inputs[0]
    dim = (inputs[2] if spec.key.startswith("aten.topk") else inputs[1]) if len(inputs) > (2 if "topk" in spec.key else 1) else -1
    if x.ndim:
        picked = np.take_along_axis(x, got[1], axis=dim)
        compare(want[0], picked, spec, where + "[values at indices]")


def _compare_indexed(want: Any, got: Any, inputs: tuple, spec: Spec, where: str) -> None:
    """(values, indices) of a selection along a dim (median, kthvalue): values equal, indices pick them."""
    compare(want[0], got[0], spec, where + "[values]")
    assert isinstance(got[1], np.ndarray) and got[1].dtype == np.int64 and got[1].shape == tuple(want[1].shape), where
    x = inputs[0]
    if x.ndim == 0:
        return
    pos = 1 if spec.key.startswith("aten.median") else 2
    dim = inputs[pos] if len(inputs) > pos else -1
    keepdim = inputs[pos + 1] if len(inputs) > pos + 1 else False
    idx = got[1] if keepdim else np.expand_dims(got[1], dim)
    picked = np.take_along_axis(x, idx, axis=dim)
    compare(want[0], picked if keepdim else np.squeeze(picked, dim), spec, where + "[values at indices]")


def samples(spec: Spec, dtype: str) -> Iterator[tuple[tuple, dict]]:
    """(args, kwargs) in graph form, at most MAX_SAMPLES per source."""
    tdt = getattr(torch, dtype)
    op = _overload(spec.key)
    for name in spec.opinfo:
        info = _opinfos()[name]
        if tdt not in info.supported_dtypes("cpu"):
            continue
        n = 0
        for s in info.sample_inputs("cpu", tdt):
            ak = (spec.adapt or _default)(s)
            if ak is None:
                continue
            b = _bind(op, *ak)
            if b is None:
                continue
            yield b
            n += 1
            if n >= MAX_SAMPLES:
                break
    if spec.gen is not None:
        n = 0
        for ak in spec.gen(tdt):
            b = _bind(op, *ak)
            if b is None:
                continue
            yield b
            n += 1
            if n >= spec.gen_cap:
                break


def run(spec: Spec, dtype: str) -> int:
    """Compare the kernel with torch on every sample of ``dtype``; the number compared."""
    op = _overload(spec.key)
    fn = registry.require(spec.key)
    n = 0
    for args, kwargs in samples(spec, dtype):
        try:
            want = op(*_clone(args), **_clone(kwargs))
        except (RuntimeError, TypeError, ValueError, IndexError, NotImplementedError):
            continue  # torch refuses this sample for this overload
        np_args, np_kwargs = to_numpy(args), to_numpy(kwargs)
        # the re-strided copies are made first: an in-place kernel writes into np_args
        re_args, re_kwargs = _restride(np_args), _restride(np_kwargs)
        where = f"{spec.key} {dtype} sample {n}"
        got = fn(*np_args, **np_kwargs)
        if spec.check == "sort":
            _compare_sorted(want, got, np_args, spec, where)
        elif spec.check == "indexed":
            _compare_indexed(want, got, np_args, spec, where)
        elif spec.check == "perm":
            compare(want, got, Spec(spec.key, check="meta"), where)
            assert sorted(got.tolist()) == sorted(want.tolist()), where
        elif spec.check == "resize":
            assert got.shape == tuple(want.shape), where
            k = min(got.size, args[0].numel())
            compare(want.reshape(-1)[:k], got.reshape(-1)[:k], spec, where)
        else:
            compare(want, got, spec, where)
            if spec.key not in _LAYOUT_BOUND:
                # the same values laid out differently in memory give the same result
                got2 = fn(*re_args, **re_kwargs)
                compare(want, got2, spec, where + " (re-strided inputs)")
        n += 1
    return n


#: ops whose result depends on the input's memory layout by definition
_LAYOUT_BOUND = {"aten.as_strided.default", "aten.resize_.default", "aten.atan2.out"}


def _restride(v: Any) -> Any:
    """``v`` with each array copied to another memory layout (Fortran order, or reversed strides)."""
    if isinstance(v, np.ndarray):
        if v.ndim >= 2:
            return np.asfortranarray(v)
        if v.ndim == 1:
            return np.ascontiguousarray(v[::-1])[::-1]
        return v.copy()
    if isinstance(v, (list, tuple)):
        return type(v)(_restride(x) for x in v)
    if isinstance(v, dict):
        return {k: _restride(x) for k, x in v.items()}
    return v
