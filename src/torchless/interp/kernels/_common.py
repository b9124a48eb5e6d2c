"""Helpers the kernel modules share: dims, dtypes of ScalarType arguments, elementwise application."""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ...core.dtypes import DType, by_name
from ...core.errors import UnsupportedError, UsageError
from .. import promote

__all__ = ["row_max", "norm_dim", "norm_dims", "np_dtype", "tensor", "unary", "binary", "quiet", "refuse", "bad"]


_QUIET = threading.local()


class quiet(np.errstate):
    """NumPy's floating point warnings off (torch produces inf/nan silently).

    Nested in another ``quiet`` of the same thread it does nothing (the interpreter runs a
    whole graph in one, so each kernel's own costs no setup)."""

    def __init__(self) -> None:
        super().__init__(all="ignore")

    def __enter__(self) -> None:
        depth = getattr(_QUIET, "depth", 0)
        _QUIET.depth = depth + 1
        self._outer = depth == 0
        if self._outer:
            super().__enter__()
            self._w = warnings.catch_warnings()
            self._w.__enter__()
            warnings.simplefilter("ignore", RuntimeWarning)

    def __exit__(self, *exc: Any) -> None:
        _QUIET.depth -= 1
        if self._outer:
            self._w.__exit__(*exc)
            super().__exit__(*exc)


def row_max(x: np.ndarray, axis: int) -> np.ndarray:
    """The max over ``axis`` (kept) that softmax-style kernels subtract before ``exp``.

    NaN is skipped (``np.fmax``: NumPy's NaN-propagating max reduction is 1.5x slower over
    short rows): a NaN still reaches every result of its row through the row's sum, so the
    softmax/log-softmax is the same as with torch's NaN max."""
    return np.fmax.reduce(x, axis=axis, keepdims=True)


def refuse(op: str, what: str) -> UnsupportedError:
    return UnsupportedError(f"{op}: {what}")


def bad(op: str, what: str) -> UsageError:
    """An input torch rejects at run time (index out of range, integer division by zero)."""
    return UsageError(f"{op}: {what}")


def norm_dim(d: int, ndim: int, op: str = "op") -> int:
    """``d`` wrapped into ``range(ndim)`` (a 0-d tensor accepts dims 0 and -1, as in torch)."""
    n = max(ndim, 1)
    if not -n <= d < n:
        raise bad(op, f"dim {d} out of range for a {ndim}-d tensor")
    return d % n


def norm_dims(dims: Sequence[int] | int | None, ndim: int, op: str = "op") -> tuple[int, ...]:
    """Every dim when ``dims`` is None or empty (torch's reduction convention), else them wrapped."""
    if dims is None:
        return tuple(range(ndim))
    if isinstance(dims, int):
        dims = [dims]
    if len(dims) == 0:
        return tuple(range(ndim))
    out = tuple(norm_dim(d, ndim, op) for d in dims)
    return tuple(d for d in out if d < ndim) if ndim == 0 else out


def np_dtype(dt: DType | str | np.dtype | None, default: Any = None) -> np.dtype | None:
    """The NumPy dtype of a ScalarType argument (a :class:`DType`), ``default`` when None."""
    if dt is None:
        return None if default is None else np.dtype(default)
    if isinstance(dt, np.dtype):
        return dt
    if isinstance(dt, str):
        dt = by_name(dt)
    if isinstance(dt, DType):
        if dt.numpy is None:
            raise UnsupportedError(f"the interpreter cannot compute in {dt.torch_name}")
        return np.dtype(dt.numpy)
    return np.dtype(dt)


def tensor(x: Any, dt: Any = None) -> np.ndarray:
    """``x`` as an ndarray (of ``dt`` if given, converted as torch converts), never a NumPy scalar."""
    if dt is not None:
        return promote.cast(x, dt)
    if isinstance(x, np.ndarray):
        return x
    if isinstance(x, (bool, int, float, complex)):
        return np.asarray(x, dtype=promote.scalar_dtype(x))
    return np.asarray(x)


def unary(fn: Callable[[np.ndarray], Any], x: np.ndarray, kind: str = promote.DEFAULT) -> np.ndarray:
    """Apply ``fn`` the way torch's CPU kernels do: in the compute dtype, rounded once to the result dtype."""
    compute, result = promote.elementwise_dtypes(x, kind=kind)
    with quiet():
        return promote.cast(fn(promote.cast(x, compute)), result)


def binary(
    fn: Callable[[np.ndarray, np.ndarray], Any], a: Any, b: Any, kind: str = promote.DEFAULT, op: str = "op"
) -> np.ndarray:
    """Apply ``fn`` to two broadcast operands (tensors or scalars) with torch's promotion."""
    compute, result = promote.elementwise_dtypes(a, b, kind=kind)
    with quiet():
        out = fn(promote.cast(a, compute), promote.cast(b, compute))
        return promote.cast(out, result)
