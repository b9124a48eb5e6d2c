"""Kernels of the symbolic-shape and runtime-check operators of exported graphs.

* sizes: ``aten.sym_size``, ``sym_numel``, ``sym_stride``, ``sym_storage_offset``; strides
  are those of a contiguous tensor (the interpreter's results are strides-independent).
* ``torch.sym_int/sym_float/sym_max/sym_min/sym_not/sym_sqrt/sym_ite/sym_sum``, on Python
  scalars.
* checks: ``aten._assert_scalar``, ``_assert_async``, ``_assert_tensor_metadata``,
  ``sym_constrain_range(_for_size)`` and their functional forms, ``torch._check*``. A
  failed check raises :class:`~torchless.core.errors.UsageError` (the input broke a
  condition the program was exported under), as torch raises ``RuntimeError``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ...core.errors import UsageError
from ...graph import bounded
from ..registry import kernel


def _contiguous_strides(shape: tuple[int, ...]) -> list[int]:
    out = []
    acc = 1
    for s in reversed(shape):
        out.append(acc)
        acc *= max(int(s), 1)
    return out[::-1]


@kernel("aten.sym_size.int")
def sym_size_int(self: np.ndarray, dim: int) -> int:
    return int(np.shape(self)[dim])


@kernel("aten.sym_size.default")
def sym_size(self: np.ndarray) -> list[int]:
    return [int(s) for s in np.shape(self)]


@kernel("aten.sym_numel.default")
def sym_numel(self: np.ndarray) -> int:
    return int(np.size(self))


@kernel("aten.sym_stride.int")
def sym_stride_int(self: np.ndarray, dim: int) -> int:
    return _contiguous_strides(np.shape(self))[dim]


@kernel("aten.sym_stride.default")
def sym_stride(self: np.ndarray) -> list[int]:
    return _contiguous_strides(np.shape(self))


@kernel("aten.sym_storage_offset.default")
def sym_storage_offset(self: np.ndarray) -> int:
    return 0


@kernel("aten.sym_is_contiguous.default")
def sym_is_contiguous(self: np.ndarray, memory_format: Any = None) -> bool:
    return True


# -- torch.sym_* -------------------------------------------------------------------------


@kernel("torch.sym_int", "torch.fx.experimental.sym_node.sym_int")
def sym_int(a: Any) -> int:
    return int(math.trunc(a)) if isinstance(a, float) else int(a)


@kernel("torch.sym_float")
def sym_float(a: Any) -> float:
    return float(a)


@kernel("torch.sym_max")
def sym_max(a: Any, b: Any) -> Any:
    r = max(a, b)
    return float(r) if isinstance(a, float) or isinstance(b, float) else r


@kernel("torch.sym_min")
def sym_min(a: Any, b: Any) -> Any:
    r = min(a, b)
    return float(r) if isinstance(a, float) or isinstance(b, float) else r


@kernel("torch.sym_not")
def sym_not(a: Any) -> bool:
    return not a


@kernel("torch.sym_sqrt", "torch._sym_sqrt", "torch.fx.experimental.sym_node.sym_sqrt")
def sym_sqrt(a: Any) -> float:
    return math.sqrt(a)


@kernel("torch.sym_ite")
def sym_ite(b: Any, t: Any, f: Any) -> Any:
    return t if b else f


@kernel("torch.sym_sum")
def sym_sum(args: Any) -> Any:
    return bounded.call("add", *args)


# -- checks ------------------------------------------------------------------------------


def _truth(v: Any) -> bool:
    if isinstance(v, np.ndarray):
        if v.size != 1:
            raise UsageError("a runtime assertion got a tensor with more than one element", found=str(v.shape))
        return bool(v.reshape(()))
    return bool(v)


@kernel("aten._assert_scalar.default")
def assert_scalar(self: Any, assert_msg: str = "") -> None:
    if not _truth(self):
        raise UsageError(f"runtime assertion failed: {assert_msg or 'condition is false'}")
    return None


@kernel("aten._functional_assert_scalar.default")
def functional_assert_scalar(self: Any, assert_msg: str = "", dep_token: Any = None) -> np.ndarray:
    assert_scalar(self, assert_msg)
    return _token()


@kernel("aten._assert_async.default")
def assert_async(self: Any) -> None:
    if not _truth(self):
        raise UsageError("runtime assertion failed: expected a non-zero value")
    return None


@kernel("aten._assert_async.msg")
def assert_async_msg(self: Any, assert_msg: str = "") -> None:
    if not _truth(self):
        raise UsageError(f"runtime assertion failed: {assert_msg or 'expected a non-zero value'}")
    return None


@kernel("aten._functional_assert_async.msg")
def functional_assert_async(self: Any, assert_msg: str = "", dep_token: Any = None) -> np.ndarray:
    assert_async_msg(self, assert_msg)
    return _token()


@kernel("aten._assert_tensor_metadata.default")
def assert_tensor_metadata(
    a: np.ndarray, size: Any = None, stride: Any = None, dtype: Any = None, *, device: Any = None, layout: Any = None
) -> None:
    arr = np.asarray(a)
    if dtype is not None and getattr(dtype, "numpy", None) is not None and arr.dtype != dtype.numpy:
        raise UsageError(
            "tensor metadata assertion failed: wrong dtype", expected=getattr(dtype, "name", str(dtype)), found=str(arr.dtype)
        )
    if size is not None and tuple(int(s) for s in size) != tuple(arr.shape):
        raise UsageError("tensor metadata assertion failed: wrong size", expected=str(list(size)), found=str(list(arr.shape)))
    return None


def _constrain(size: Any, min: Any, max: Any, for_size: bool) -> None:  # noqa: A002 - schema names
    v = int(size)
    lo = min if min is not None else (0 if for_size else None)
    if lo is not None and v < lo:
        raise UsageError(f"value {v} is below the range the program was exported for", expected=f">= {lo}", found=v)
    if max is not None and v > max:
        raise UsageError(f"value {v} is above the range the program was exported for", expected=f"<= {max}", found=v)


@kernel("aten.sym_constrain_range.default")
def sym_constrain_range(size: Any, *, min: Any = None, max: Any = None) -> None:  # noqa: A002
    _constrain(size, min, max, False)
    return None


@kernel("aten.sym_constrain_range_for_size.default")
def sym_constrain_range_for_size(size: Any, *, min: Any = None, max: Any = None) -> None:  # noqa: A002
    _constrain(size, min, max, True)
    return None


@kernel("aten._functional_sym_constrain_range.default")
def functional_sym_constrain_range(size: Any, min: Any = None, max: Any = None, dep_token: Any = None) -> np.ndarray:  # noqa: A002
    _constrain(size, min, max, False)
    return _token()


@kernel("aten._functional_sym_constrain_range_for_size.default")
def functional_sym_constrain_range_for_size(
    size: Any,
    min: Any = None,  # noqa: A002
    max: Any = None,  # noqa: A002
    dep_token: Any = None,
) -> np.ndarray:
    _constrain(size, min, max, True)
    return _token()


@kernel("aten._make_dep_token.default")
def make_dep_token(
    *, dtype: Any = None, layout: Any = None, device: Any = None, pin_memory: Any = None, memory_format: Any = None
) -> np.ndarray:
    return _token()


def _token() -> np.ndarray:
    return np.empty((0,), np.float32)


@kernel("torch._check", "torch._check_with")
def check(cond: Any, message: Any = None) -> None:
    if not _truth(cond):
        raise UsageError(f"runtime check failed: {message if isinstance(message, str) else 'condition is false'}")
    return None


@kernel("torch._check_is_size")
def check_is_size(i: Any, message: Any = None, *, max: Any = None) -> None:  # noqa: A002
    _constrain(i, 0, max, True)
    return None
