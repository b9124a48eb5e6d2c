"""Helpers of the nn kernels' differential tests: run one aten overload in torch and the
same overload's torchless kernel on the same inputs, and compare.

Tolerances (documented in docs/interpreter.md): exact for integer and boolean results;
float64 rtol 1e-7/atol 1e-7; float32 rtol 1e-4/atol 1e-5; bfloat16 rtol 1.6e-2/atol 4e-2;
float16 rtol 2e-3/atol 2e-3 (torch and torchless both compute the 16-bit floats in float32
and round once, but sum in a different order, so the last bit may differ).
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import torch

from torchless.interp import registry

TOL = {
    torch.float64: (1e-7, 1e-7),
    torch.float32: (1e-4, 1e-5),
    torch.bfloat16: (1.6e-2, 4e-2),
    torch.float16: (2e-3, 2e-3),
    torch.complex64: (1e-4, 1e-5),
    torch.complex128: (1e-7, 1e-7),
}


def to_np(v: Any) -> Any:
    """torch values -> the kernels' calling convention (ndarray, DType, lists)."""
    if isinstance(v, torch.Tensor):
        t = v.detach()
        if t.dtype == torch.bfloat16:
            return t.contiguous().view(torch.int16).numpy().view(ml_dtypes.bfloat16).copy()
        return t.numpy().copy()
    if isinstance(v, (list, tuple)):
        return type(v)(to_np(x) for x in v)
    if isinstance(v, torch.dtype):
        from torchless.core.dtypes import by_name

        return by_name(str(v).removeprefix("torch."))
    return v


def to_torch(a: np.ndarray) -> torch.Tensor:
    a = np.array(a, order="C", copy=True)  # (np.ascontiguousarray makes a 0-d array 1-d)
    if a.dtype == ml_dtypes.bfloat16:
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def torch_op(key: str):
    ns, name, overload = key.split(".")
    return getattr(getattr(getattr(torch.ops, ns), name), overload)


def clone(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        return v.detach().clone()
    if isinstance(v, (list, tuple)):
        return type(v)(clone(x) for x in v)
    return v


def assert_same(ref: Any, got: Any, what: str, tol: tuple[float, float] | None = None) -> None:
    if ref is None:
        assert got is None, f"{what}: expected None, got {type(got)}"
        return
    if isinstance(ref, (list, tuple)):
        assert isinstance(got, (list, tuple)) and len(got) == len(ref), f"{what}: {len(ref)} outputs, got {got!r:.200}"
        for i, (r, g) in enumerate(zip(ref, got, strict=True)):
            assert_same(r, g, f"{what}[{i}]", tol)
        return
    assert isinstance(got, np.ndarray), f"{what}: expected an ndarray, got {type(got)}"
    g = to_torch(got)
    assert tuple(g.shape) == tuple(ref.shape), f"{what}: shape {tuple(g.shape)} != torch's {tuple(ref.shape)}"
    assert g.dtype == ref.dtype, f"{what}: dtype {g.dtype} != torch's {ref.dtype}"
    if ref.dtype.is_floating_point or ref.dtype.is_complex:
        rtol, atol = tol or TOL[ref.dtype]
        torch.testing.assert_close(g, ref, rtol=rtol, atol=atol, equal_nan=True, msg=lambda m: f"{what}: {m}")
    else:
        assert torch.equal(g, ref), f"{what}: values differ from torch's"


def _upcast(v: Any) -> Any:
    if isinstance(v, torch.Tensor) and v.dtype in (torch.bfloat16, torch.float16):
        return v.float()
    if isinstance(v, (list, tuple)):
        return type(v)(_upcast(x) for x in v)
    return v


def _downcast(v: Any, dtype: torch.dtype) -> Any:
    if isinstance(v, torch.Tensor) and v.dtype == torch.float32:
        return v.to(dtype)
    if isinstance(v, (list, tuple)):
        return type(v)(_downcast(x, dtype) for x in v)
    return v


def _half_dtype(args: Any) -> torch.dtype | None:
    for a in args:
        if isinstance(a, torch.Tensor) and a.dtype in (torch.bfloat16, torch.float16):
            return a.dtype
    return None


#: ops whose torch CPU kernel does not compute bfloat16/float16 as "upcast, compute in
#: float32, round once" (grid_sampler_2d computes its coordinates in bfloat16, the
#: transposed convolution accumulates its columns in bfloat16): for these the oracle is
#: torch in float32, rounded once, which is what torchless computes.
ROUND_ONCE_ORACLE = {"aten.grid_sampler_2d.default"}


def check(key: str, *args: Any, tol: tuple[float, float] | None = None, **kwargs: Any) -> None:
    """Run ``key`` in torch and in torchless on copies of the same inputs; outputs and any
    input the op mutates (running stats) must agree."""
    targs, tkw = clone(args), clone(kwargs)
    half = _half_dtype(args)
    transposed_conv = "conv_transpose" in key or (key == "aten.convolution.default" and args[6])
    if half is not None and (key in ROUND_ONCE_ORACLE or transposed_conv):
        ref = _downcast(torch_op(key)(*_upcast(targs), **_upcast(tkw)), half)
        targs = ()  # in-place updates are not compared on this path
    else:
        ref = torch_op(key)(*targs, **tkw)
    nargs, nkw = to_np(args), {k: to_np(v) for k, v in kwargs.items()}
    got = registry.require(key)(*nargs, **nkw)
    assert_same(ref, got, key, tol)
    for i, (t, n) in enumerate(zip(targs, nargs, strict=False)):  # in-place updates
        if isinstance(t, torch.Tensor) and t.dtype.is_floating_point:
            assert_same(t, n, f"{key} argument {i} after the call", tol)
