"""torchless.interp.promote against torch's own promote_types / result_type."""

from __future__ import annotations

import itertools

import ml_dtypes
import numpy as np
import pytest

from torchless.core.errors import UnsupportedError
from torchless.interp import promote

torch = pytest.importorskip("torch", reason="torch is the oracle for type promotion")

NAMES = [
    "bool",
    "uint8",
    "int8",
    "int16",
    "int32",
    "int64",
    "float16",
    "bfloat16",
    "float32",
    "float64",
    "complex64",
    "complex128",
    "uint16",
    "uint32",
    "uint64",
    "float8_e4m3fn",
    "float8_e5m2",
]


def _np(name: str) -> np.dtype:
    return np.dtype(getattr(ml_dtypes, name)) if name in ("bfloat16",) or name.startswith("float8") else np.dtype(name)


@pytest.mark.parametrize("a", NAMES)
def test_promote_types_matches_torch(a: str) -> None:
    for b in NAMES:
        try:
            want = str(torch.promote_types(getattr(torch, a), getattr(torch, b))).removeprefix("torch.")
        except RuntimeError:
            with pytest.raises(UnsupportedError):
                promote.promote_types(_np(a), _np(b))
            continue
        assert promote.promote_types(_np(a), _np(b)) == _np(want), (a, b, want)


OPERAND_DTYPES = [
    "bool",
    "uint8",
    "int8",
    "int32",
    "int64",
    "float16",
    "bfloat16",
    "float32",
    "float64",
    "complex64",
    "complex128",
]
SCALARS = [True, 3, 2.5, 1 + 2j]


def _operands():
    # (tensor with dims, 0-d tensor, Python scalar) combinations
    for d1, d2 in itertools.product(OPERAND_DTYPES, repeat=2):
        yield ("dim", d1), ("zero", d2)
        yield ("dim", d1), ("dim", d2)
        yield ("zero", d1), ("zero", d2)
    for d1 in OPERAND_DTYPES:
        for s in SCALARS:
            yield ("dim", d1), ("scalar", s)
            yield ("zero", d1), ("scalar", s)


def test_result_type_matches_torch() -> None:
    n = 0
    for ops in _operands():
        t_ops, n_ops = [], []
        for kind, v in ops:
            if kind == "scalar":
                t_ops.append(v)
                n_ops.append(v)
            else:
                shape = (2,) if kind == "dim" else ()
                t_ops.append(torch.zeros(shape, dtype=getattr(torch, v)))
                n_ops.append(np.zeros(shape, dtype=_np(v)))
        want = str(torch.result_type(t_ops[0], t_ops[1])).removeprefix("torch.")
        want = "complex64" if want == "complex32" else want  # NumPy has no complex32
        got = promote.result_type(*n_ops)
        assert got == _np(want), (ops, want, got)
        n += 1
    assert n > 300


def test_elementwise_kinds() -> None:
    i = np.zeros(3, np.int32)
    h = np.zeros(3, np.float16)
    assert promote.elementwise_dtypes(i, kind=promote.INT_TO_FLOAT) == (np.float32, np.float32)
    assert promote.elementwise_dtypes(h, 1.5) == (np.float32, np.float16)
    assert promote.elementwise_dtypes(h, i, kind=promote.ALWAYS_BOOL) == (np.float32, np.bool_)
    assert promote.elementwise_dtypes(np.zeros(2, np.complex64), kind=promote.COMPLEX_TO_FLOAT)[1] == np.float32


def test_cast_truncates_and_booleans() -> None:
    x = np.array([-1.7, 2.9, 0.0, 0.5], np.float32)
    assert promote.cast(x, np.int64).tolist() == torch.from_numpy(x).to(torch.int64).tolist()
    assert promote.cast(x, np.bool_).tolist() == torch.from_numpy(x).to(torch.bool).tolist()
    b = x.astype(ml_dtypes.bfloat16)
    assert promote.cast(b, np.int32).tolist() == torch.from_numpy(x).to(torch.bfloat16).to(torch.int32).tolist()


def test_three_operands_against_torch_where() -> None:
    # where.self promotes its two value operands only; clamp.Tensor promotes all three
    for a, b, c in [("int32", 2.5, "float16"), ("uint8", "int8", 3), ("bool", "bfloat16", "float16")]:
        t, n = [], []
        for v, shape in zip((a, b, c), ((2,), (), ()), strict=True):
            if isinstance(v, str):
                t.append(torch.zeros(shape, dtype=getattr(torch, v)))
                n.append(np.zeros(shape, dtype=_np(v)))
            else:
                t.append(v)
                n.append(v)
        want = torch.ops.aten.clamp.Tensor(
            t[0], *(torch.as_tensor(x) if not isinstance(x, torch.Tensor) else x for x in t[1:])
        ).dtype
        # clamp.Tensor sees the scalars as 0-d tensors
        n = [np.asarray(x, dtype=promote.scalar_dtype(x)) if not isinstance(x, np.ndarray) else x for x in n]
        assert promote.result_type(*n) == _np(str(want).removeprefix("torch."))
