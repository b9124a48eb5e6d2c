"""What ``convert`` can do to the tensors on their way: filter, rename, cast.

The steps, in this order (``torchless convert --include/--exclude/--strip-prefix/
--add-prefix/--dtype``, the same keywords of :func:`torchless.convert`):

1. ``include``: keep the names that match any of these globs (:func:`fnmatch.fnmatchcase`
   on the dotted source name; all names when none is given);
2. ``exclude``: then drop the names that match any of these;
3. ``strip_prefix``: remove it from the names that start with it (others are kept as they are);
4. ``add_prefix``: put it before every name;
5. two source tensors that end with one name are an error naming both;
6. ``dtype``: cast the floating-point tensors (float8 included) to this floating dtype, as
   torch's ``.to(dtype)`` does; with ``dtype_all`` also integer and bool tensors (complex
   and quantized tensors are never cast: an error with ``dtype_all``).

Casting is per tensor and lazy: a cast tensor's bytes are made when the writer reads
them and not kept after, so a conversion holds one tensor's cast bytes at a time. The
rounding is torch 2.13's: round-to-nearest-even (ml_dtypes and NumPy); float64 goes to
16-bit types through float32, as torch's CPU kernels do (two roundings); infinities,
overflow to infinity, subnormals and signed zeros as torch. A NaN stays a NaN, but its bits
(sign, payload) are not one rule in torch: they depend on the source dtype and on which
CPU loop runs (vectorized or scalar, by memory layout). torchless writes the bits torch
writes for float32 to bfloat16 (``0xFFFF`` for a source whose smallest stride is 1, else
``0x7FC0``) and otherwise NumPy's/ml_dtypes' (payload truncated, as the F16C instructions
do); other NaN bits may differ from torch's.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any

import numpy as np

from ..core.dtypes import DType, by_name
from ..core.errors import UsageError
from ..core.tensor import Storage, Tensor, as_tensor

__all__ = ["CAST_DTYPES", "Transform", "cast_tensor"]

#: the dtypes ``--dtype`` casts to
CAST_DTYPES = ("bfloat16", "float16", "float32", "float64")


class _CastStorage(Storage):
    """A storage whose bytes are computed on each read and not kept (a cast tensor's)."""

    __slots__ = ()

    def bytes(self) -> memoryview:
        if self._loader is None:  # never: cast_tensor always gives a loader
            return super().bytes()
        return memoryview(self._loader()).cast("B")


def _bf16_nan_bits(t: Tensor) -> int:
    """The bits torch 2.13's CPU copy writes for a NaN cast to bfloat16: ``0xFFFF`` from a
    float32 tensor whose smallest stride (over dimensions longer than 1) is 1 (its
    vectorized loop); ``0x7FC0`` otherwise (its scalar loop, and through float from float16)."""
    strides = [st for n, st in zip(t.shape, t.stride(), strict=True) if n > 1]
    vectorized = not strides or min(abs(x) for x in strides) == 1
    return 0xFFFF if t.dtype.name == "float32" and vectorized else 0x7FC0


def _cast_array(a: np.ndarray, target: DType, nan_bits: int) -> np.ndarray:
    if target.name in ("bfloat16", "float16") and a.dtype == np.float64:
        a = a.astype(np.float32)  # torch: double -> float -> half/bfloat16
    out = np.ascontiguousarray(a.astype(target.numpy))
    if target.name == "bfloat16":
        nan = np.isnan(a).reshape(-1)
        if nan.any():
            out.reshape(-1).view(np.uint16)[nan] = nan_bits
    return out


def cast_tensor(t: Any, dtype: str | DType, *, name: str = "") -> Tensor:
    """``t`` as ``dtype`` (as ``t.to(dtype)`` in torch), read and cast when its bytes are asked for."""
    t = as_tensor(t, name=name)
    target = by_name(dtype) if isinstance(dtype, str) else dtype
    if t.dtype == target:
        return t
    if t.dtype.numpy is None or t.dtype.kind in ("complex", "quantized", "bits") or t.quantizer is not None:
        raise UsageError(f"cannot cast {t.dtype.name} to {target.name}", member=name or None)
    shape = tuple(t.shape)
    n = int(np.prod(shape, dtype=np.int64)) if shape else 1

    nan_bits = _bf16_nan_bits(t)

    def load() -> np.ndarray:
        return _cast_array(np.asarray(t.numpy()), target, nan_bits).reshape(-1).view(np.uint8)

    origin = t.storage.origin if t.storage is not None else ""
    st = _CastStorage(f"{name}:{target.name}", n * target.itemsize, target, loader=load, origin=origin)
    return Tensor(st, target, shape, requires_grad=t.requires_grad, is_parameter=t.is_parameter)


@dataclass(frozen=True)
class Transform:
    """The filters, renames and cast of one conversion (see the module docstring)."""

    dtype: str | None = None
    dtype_all: bool = False
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    strip_prefix: str = ""
    add_prefix: str = ""

    @classmethod
    def make(
        cls,
        *,
        dtype: Any = None,
        dtype_all: bool = False,
        include: str | Iterable[str] | None = None,
        exclude: str | Iterable[str] | None = None,
        strip_prefix: str | None = None,
        add_prefix: str | None = None,
    ) -> Transform:
        """The transform of these options, checked.

        Raises:
            UsageError: a dtype outside :data:`CAST_DTYPES`, or ``dtype_all`` without ``dtype``.
        """
        name = None
        if dtype is not None:
            name = getattr(dtype, "name", None) or str(dtype).removeprefix("torch.")
            if name not in CAST_DTYPES:
                raise UsageError("convert casts to a floating dtype", expected=", ".join(CAST_DTYPES), found=name)
        if dtype_all and name is None:
            raise UsageError("dtype_all (--dtype-all) needs a dtype (--dtype)")

        def globs(v: Any) -> tuple[str, ...]:
            return (v,) if isinstance(v, str) else tuple(v or ())

        return cls(name, bool(dtype_all), globs(include), globs(exclude), strip_prefix or "", add_prefix or "")

    @property
    def active(self) -> bool:
        return bool(self.dtype or self.include or self.exclude or self.strip_prefix or self.add_prefix)

    def rename(self, name: str) -> str | None:
        """The new name of source tensor ``name``, or None when the filters drop it."""
        if self.include and not any(fnmatchcase(name, g) for g in self.include):
            return None
        if any(fnmatchcase(name, g) for g in self.exclude):
            return None
        if self.strip_prefix and name.startswith(self.strip_prefix):
            name = name[len(self.strip_prefix) :]
        return self.add_prefix + name

    def apply(self, items: Iterable[tuple[str, Any]], *, path: Any = None) -> list[tuple[str, Any]]:
        """The ``(new name, tensor)`` pairs: filtered, renamed, cast lazily.

        Raises:
            UsageError: two tensors end with one name (both named), or ``dtype_all`` meets
                a tensor that cannot be cast.
        """
        out: list[tuple[str, Any]] = []
        source: dict[str, str] = {}
        for name, t in items:
            new = self.rename(name)
            if new is None:
                continue
            if new in source:
                raise UsageError(
                    f"two tensors would be named {new!r}: {source[new]!r} and {name!r}",
                    path=path,
                    hint="change --strip-prefix/--add-prefix, or leave one out with --exclude",
                )
            source[new] = name
            if self.dtype is not None:
                dt = t.dtype
                if dt.is_floating_point or (self.dtype_all and dt.kind in ("int", "uint", "bool")):
                    t = cast_tensor(t, self.dtype, name=name)
                elif self.dtype_all and dt.name != self.dtype:
                    raise UsageError(f"cannot cast {dt.name} to {self.dtype}", path=path, member=name)
            out.append((new, t))
        return out
