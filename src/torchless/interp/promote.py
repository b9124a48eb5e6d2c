"""torch's type promotion, on NumPy dtypes.

torch promotes differently from NumPy, so kernels never let NumPy choose a result dtype:

* :func:`promote_types` is torch's ``promote_types`` table (``c10/core/ScalarType.cpp``):
  ``int64 + float16 -> float16`` (NumPy: float64), ``bfloat16 + float16 -> float32``,
  ``uint8 + int8 -> int16``; float8 and uint16/32/64 promote only with themselves (and the
  unsigned ones with floats), as in torch.
* :func:`result_type` is ``torch.result_type`` over a kernel's operands: three priority
  groups (tensors with dimensions, then 0-d tensors, then Python scalars) each promoted
  on its own and then combined by category (bool < integer < float < complex). A lower
  group only decides the result when it is of a higher category: ``int32 tensor + 5`` is
  int32, ``int32 tensor + 2.5`` is float32 (the default dtype), ``float16 tensor +
  float64 0-d tensor`` is float16.
* :func:`elementwise_dtypes` adds the result kinds of torch's elementwise ops (``sin`` of
  an int tensor is float32, comparisons are bool, ``abs`` of complex is real) and the
  compute dtype: float16/bfloat16/float8 are computed in float32 and rounded once, as
  torch's CPU kernels do (``opmath``).

Operands are ``numpy.ndarray`` (a tensor; 0-d counts as 0-d tensor), Python
``bool``/``int``/``float``/``complex`` (a Scalar) or None (ignored).
"""

from __future__ import annotations

import warnings
from typing import Any

import ml_dtypes
import numpy as np

from ..core.dtypes import from_numpy
from ..core.errors import UnsupportedError

__all__ = [
    "DEFAULT_FLOAT",
    "DEFAULT_COMPLEX",
    "category",
    "is_bool",
    "is_int",
    "is_float",
    "is_complex",
    "promote_types",
    "result_type",
    "elementwise_dtypes",
    "opmath",
    "scalar_dtype",
    "to_real",
    "to_complex",
    "cast",
]

#: torch's default dtype (``torch.get_default_dtype()``) and its complex counterpart.
DEFAULT_FLOAT = np.dtype(np.float32)
DEFAULT_COMPLEX = np.dtype(np.complex64)

_BF16 = np.dtype(ml_dtypes.bfloat16)
_F16 = np.dtype(np.float16)
_F32 = np.dtype(np.float32)
_F64 = np.dtype(np.float64)
_C64 = np.dtype(np.complex64)
_C128 = np.dtype(np.complex128)
_BOOL = np.dtype(np.bool_)
_I64 = np.dtype(np.int64)

_FLOAT8 = frozenset(
    np.dtype(getattr(ml_dtypes, n))
    for n in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu")
    if hasattr(ml_dtypes, n)
)
_E4M3FN = np.dtype(ml_dtypes.float8_e4m3fn)
_BAREBONES_UNSIGNED = frozenset(np.dtype(t) for t in (np.uint16, np.uint32, np.uint64))
_SIGNED = (np.dtype(np.int8), np.dtype(np.int16), np.dtype(np.int32), _I64)
_FLOATS_BY_RANK = {_F16: 1, _BF16: 1, _F32: 2, _F64: 3}

BOOL, INT, FLOAT, COMPLEX = 0, 1, 2, 3


def category(dt: np.dtype) -> int:
    """0 bool, 1 integer, 2 floating point, 3 complex."""
    dt = np.dtype(dt)
    if dt == _BOOL:
        return BOOL
    if dt.kind in "iu":
        return INT
    if dt.kind == "c":
        return COMPLEX
    return FLOAT  # "f" and the ml_dtypes floats (kind "V")


def is_bool(dt: Any) -> bool:
    return np.dtype(dt) == _BOOL


def is_int(dt: Any) -> bool:
    """Integral, bool excluded (torch's ``isIntegralType(t, includeBool=False)``)."""
    return np.dtype(dt).kind in "iu"


def is_float(dt: Any) -> bool:
    return category(dt) == FLOAT


def is_complex(dt: Any) -> bool:
    return np.dtype(dt).kind == "c"


def _name(dt: np.dtype) -> str:
    try:
        return from_numpy(dt).torch_name
    except UnsupportedError:
        return str(dt)


def _refuse(a: np.dtype, b: np.dtype, what: str) -> UnsupportedError:
    return UnsupportedError(f"torch does not promote {_name(a)} and {_name(b)}: {what}")


def promote_types(a: Any, b: Any) -> np.dtype:
    """torch.promote_types(a, b) on NumPy dtypes.

    Raises:
        UnsupportedError: pairs torch refuses (float8 with another dtype; uint16/32/64 with
            a different integer or bool).
    """
    a, b = np.dtype(a), np.dtype(b)
    if a == b:
        return a
    if a in _FLOAT8 or b in _FLOAT8:
        raise _refuse(a, b, "promotion of float8 types is not supported")
    if a in _BAREBONES_UNSIGNED or b in _BAREBONES_UNSIGNED:
        if category(a) == FLOAT:
            return a
        if category(b) == FLOAT:
            return b
        raise _refuse(a, b, "promotion of uint16, uint32, uint64 with other integers, bool or complex is not supported")
    ca, cb = category(a), category(b)
    if ca == BOOL:
        return b
    if cb == BOOL:
        return a
    if ca != cb:
        hi, lo = (a, b) if ca > cb else (b, a)
        if category(hi) == COMPLEX and category(lo) == FLOAT:
            return _C128 if lo == _F64 or hi == _C128 else hi
        return hi
    if ca == INT:
        if a == np.uint8 or b == np.uint8:
            other = b if a == np.uint8 else a
            return _SIGNED[max(1, _SIGNED.index(other))]
        return a if a.itemsize >= b.itemsize else b
    if ca == FLOAT:
        ra, rb = _FLOATS_BY_RANK[a], _FLOATS_BY_RANK[b]
        if ra == rb:  # float16 and bfloat16
            return _F32
        return a if ra > rb else b
    return _C128  # complex64 with complex128


def scalar_dtype(value: Any) -> np.dtype:
    """The dtype a Python scalar has as a wrapped number: bool, int64, the default float or complex."""
    if isinstance(value, (bool, np.bool_)):
        return _BOOL
    if isinstance(value, (int, np.integer)):
        return _I64
    if isinstance(value, (float, np.floating)):
        return DEFAULT_FLOAT
    if isinstance(value, (complex, np.complexfloating)):
        return DEFAULT_COMPLEX
    raise UnsupportedError(f"not a tensor or scalar operand: {type(value).__name__}")


def to_complex(dt: Any) -> np.dtype:
    """The complex dtype with ``dt``'s precision (float64 -> complex128, others -> complex64)."""
    dt = np.dtype(dt)
    if dt.kind == "c":
        return dt
    return _C128 if dt == _F64 else _C64


def to_real(dt: Any) -> np.dtype:
    """The real dtype of a complex one (complex64 -> float32); others unchanged."""
    dt = np.dtype(dt)
    if dt == _C128:
        return _F64
    if dt == _C64:
        return _F32
    return dt


def _combine(higher: np.dtype | None, lower: np.dtype | None) -> np.dtype | None:
    # torch's combine_categories (TensorIterator / result_type): the higher-priority group
    # wins unless the lower one is of a higher category.
    if higher is None:
        return lower
    if lower is None:
        return higher
    if is_complex(higher):
        return higher
    if is_complex(lower):
        return to_complex(higher) if is_float(higher) else lower
    if is_float(higher):
        return higher
    if higher == _BOOL or is_float(lower):
        return promote_types(higher, lower)
    return higher


def _acc(cur: np.dtype | None, dt: np.dtype) -> np.dtype:
    return dt if cur is None else promote_types(cur, dt)


def result_type(*operands: Any) -> np.dtype:
    """torch.result_type over tensors (``ndarray``), Python scalars and Nones (ignored).

    Where torch's answer is complex32 (a float16 tensor with a complex 0-d tensor or
    scalar), NumPy has no such dtype and the result is complex64.

    Raises:
        UnsupportedError: no operand, or a pair torch refuses to promote.
    """
    dim: np.dtype | None = None
    zero: np.dtype | None = None
    wrapped: np.dtype | None = None
    for op in operands:
        if op is None:
            continue
        if isinstance(op, np.ndarray):
            if op.ndim:
                dim = _acc(dim, op.dtype)
            else:
                zero = _acc(zero, op.dtype)
        elif isinstance(op, np.generic):  # a NumPy scalar: count it a 0-d tensor
            zero = _acc(zero, op.dtype)
        else:
            wrapped = _acc(wrapped, scalar_dtype(op))
    out = _combine(dim, _combine(zero, wrapped))
    if out is None:
        raise UnsupportedError("result_type of no tensor or scalar")
    return out


def opmath(dt: Any) -> np.dtype:
    """The dtype torch's CPU kernels compute ``dt`` in: float32 for float16/bfloat16/float8."""
    dt = np.dtype(dt)
    if dt in (_F16, _BF16) or dt in _FLOAT8:
        return _F32
    return dt


# torch._prims_common.ELEMENTWISE_TYPE_PROMOTION_KIND
DEFAULT = "default"
NO_OPMATH = "no_opmath"
INT_TO_FLOAT = "int_to_float"
ALWAYS_BOOL = "always_bool"
COMPLEX_TO_FLOAT = "complex_to_float"
BOOL_TO_LONG = "bool_to_long"


def elementwise_dtypes(*operands: Any, kind: str = DEFAULT) -> tuple[np.dtype, np.dtype]:
    """(compute dtype, result dtype) of an elementwise op, as torch's ``elementwise_dtypes``.

    ``kind`` is one of :data:`DEFAULT`, :data:`NO_OPMATH`, :data:`INT_TO_FLOAT`,
    :data:`ALWAYS_BOOL`, :data:`COMPLEX_TO_FLOAT`, :data:`BOOL_TO_LONG`.
    """
    promoted = result_type(*operands)
    if kind == INT_TO_FLOAT and category(promoted) <= INT:
        promoted = DEFAULT_FLOAT
    if kind == BOOL_TO_LONG and promoted == _BOOL:
        promoted = _I64
    compute = promoted if kind == NO_OPMATH else opmath(promoted)
    if kind == ALWAYS_BOOL:
        return compute, _BOOL
    if kind == COMPLEX_TO_FLOAT:
        return compute, to_real(promoted)
    return compute, promoted


def cast(x: Any, dt: Any) -> np.ndarray:
    """``x`` (tensor or scalar) as an ndarray of ``dt``, converting as torch does.

    Float to integer truncates toward zero; anything to bool is ``!= 0``; complex to real
    keeps the real part. NumPy already does these for finite values; warnings about
    invalid casts (NaN to int) are silenced, the value is undefined as in torch.
    """
    dt = np.dtype(dt)
    arr = np.asarray(x)
    if arr.dtype == dt:
        return arr
    if dt == _BOOL:
        return np.asarray(arr != 0)
    with np.errstate(all="ignore"):
        if is_complex(arr.dtype) and not is_complex(dt):
            arr = arr.real
        if category(arr.dtype) == FLOAT and arr.dtype.kind != "f" and dt.kind in "iu":
            arr = arr.astype(_F32)  # ml_dtypes floats: go through float32 for int casts
        if dt.kind in "iu" and arr.dtype.kind == "f":
            arr = np.trunc(arr)
        if dt == _E4M3FN and arr.dtype != _BOOL:
            # torch saturates float8_e4m3fn conversions (inf too) at +-448; NaN stays NaN
            arr = np.clip(arr.astype(_F64 if arr.dtype == _F64 else _F32), -448.0, 448.0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            return np.asarray(arr.astype(dt))
