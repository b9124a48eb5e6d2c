"""torch dtypes as torchless knows them, and their NumPy counterparts.

torch's dtype table (``torch/storage.py``, spec ``pt.md`` §1.7) is reproduced here as
data: the name torch prints (``torch.bfloat16``), the element size, the legacy typed
storage class a checkpoint names (``BFloat16Storage``) and the NumPy dtype that holds
the same bytes. bfloat16 and the float8 family are real NumPy dtypes through
``ml_dtypes``, imported the first time one of them is asked for (listing a float32
checkpoint never loads it: ``tests/cli/test_startup.py``); dtypes NumPy cannot express (complex32, packed sub-byte and ``bits*``
types, quantized integers) keep a ``storage`` dtype with the same bytes so that data is
never lost.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .errors import UnsupportedError

__all__ = ["DType", "DTYPES", "by_name", "from_numpy", "from_storage_name", "STORAGE_NAMES"]


@dataclass(frozen=True, slots=True)
class DType:
    """One torch dtype.

    Attributes:
        name: torch's short name (``"float32"``, ``"bfloat16"``, ``"qint8"``).
        itemsize: bytes per element in a storage.
        numpy: the NumPy dtype with the element's meaning, or None when NumPy has none
            (complex32, quantized, packed and ``bits*`` types).
        storage: the NumPy dtype of the raw element bytes (same itemsize); what
            ``Tensor.numpy(raw=True)`` returns.
        legacy_storage: the typed storage class a zip checkpoint names for it
            (``"FloatStorage"``), or None for dtypes written with ``UntypedStorage``.
        kind: ``"bool"``, ``"int"``, ``"uint"``, ``"float"``, ``"complex"``,
            ``"quantized"`` or ``"bits"``.
    """

    name: str
    itemsize: int
    # an ml_dtypes type name until first asked for (then the NumPy dtype): see :attr:`numpy`
    _numpy: np.dtype | str | None = field(compare=False, repr=False)
    _storage: np.dtype | str = field(compare=False, repr=False)
    legacy_storage: str | None = None
    kind: str = "float"

    @property
    def numpy(self) -> np.dtype | None:
        """The NumPy dtype with the element's meaning, or None when NumPy has none."""
        v = self._numpy
        return _resolve(self)[0] if isinstance(v, str) else v

    @property
    def storage(self) -> np.dtype:
        """The NumPy dtype of the raw element bytes (same itemsize)."""
        v = self._storage
        return _resolve(self)[1] if isinstance(v, str) else v

    @property
    def torch_name(self) -> str:
        """The name as torch prints it: ``torch.float32``."""
        return f"torch.{self.name}"

    @property
    def is_floating_point(self) -> bool:
        return self.kind == "float"

    @property
    def is_complex(self) -> bool:
        return self.kind == "complex"

    @property
    def is_quantized(self) -> bool:
        return self.kind == "quantized"

    def __repr__(self) -> str:
        return self.torch_name

    def __str__(self) -> str:
        return self.torch_name


def _d(name: str, itemsize: int, npd: Any, storage: Any, legacy: str | None, kind: str) -> DType:
    return DType(
        name,
        itemsize,
        None if npd is None else np.dtype(npd),
        np.dtype(storage),
        legacy,
        kind,
    )


def _ml(name: str, itemsize: int, legacy: str | None = None) -> DType:
    """A dtype whose NumPy type is ``ml_dtypes.<name>``, imported when first asked for
    (``import ml_dtypes`` costs a command line start-up a fifth of its time)."""
    return DType(name, itemsize, name, name, legacy, "float")


def _resolve(d: DType) -> tuple[np.dtype | None, np.dtype]:
    """Fill in ``d``'s ml_dtypes types. A type this ml_dtypes lacks (float8_e8m0fnu
    arrived in 0.5) keeps its bytes as unsigned integers of the same size."""
    import ml_dtypes

    t = getattr(ml_dtypes, d.name, None)
    npd = None if t is None else np.dtype(t)
    storage = np.dtype(f"u{d.itemsize}") if npd is None else npd
    object.__setattr__(d, "_numpy", npd)
    object.__setattr__(d, "_storage", storage)
    return npd, storage


_TABLE = [
    _d("float64", 8, np.float64, np.float64, "DoubleStorage", "float"),
    _d("float32", 4, np.float32, np.float32, "FloatStorage", "float"),
    _d("float16", 2, np.float16, np.float16, "HalfStorage", "float"),
    _ml("bfloat16", 2, "BFloat16Storage"),
    _d("int64", 8, np.int64, np.int64, "LongStorage", "int"),
    _d("int32", 4, np.int32, np.int32, "IntStorage", "int"),
    _d("int16", 2, np.int16, np.int16, "ShortStorage", "int"),
    _d("int8", 1, np.int8, np.int8, "CharStorage", "int"),
    _d("uint8", 1, np.uint8, np.uint8, "ByteStorage", "uint"),
    _d("bool", 1, np.bool_, np.bool_, "BoolStorage", "bool"),
    _d("complex128", 16, np.complex128, np.complex128, "ComplexDoubleStorage", "complex"),
    _d("complex64", 8, np.complex64, np.complex64, "ComplexFloatStorage", "complex"),
    _d("qint8", 1, None, np.int8, "QInt8Storage", "quantized"),
    _d("qint32", 4, None, np.int32, "QInt32Storage", "quantized"),
    _d("quint8", 1, None, np.uint8, "QUInt8Storage", "quantized"),
    _d("quint4x2", 1, None, np.uint8, "QUInt4x2Storage", "quantized"),
    _d("quint2x4", 1, None, np.uint8, "QUInt2x4Storage", "quantized"),
    # "new" dtypes: written as UntypedStorage + _rebuild_tensor_v3
    _d("complex32", 4, None, np.dtype([("real", np.float16), ("imag", np.float16)]), None, "complex"),
    _d("uint16", 2, np.uint16, np.uint16, None, "uint"),
    _d("uint32", 4, np.uint32, np.uint32, None, "uint"),
    _d("uint64", 8, np.uint64, np.uint64, None, "uint"),
    _ml("float8_e4m3fn", 1),
    _ml("float8_e5m2", 1),
    _ml("float8_e4m3fnuz", 1),
    _ml("float8_e5m2fnuz", 1),
    _ml("float8_e8m0fnu", 1),
    _d("float4_e2m1fn_x2", 1, None, np.uint8, None, "bits"),
    _d("bits8", 1, None, np.uint8, None, "bits"),
    _d("bits16", 2, None, np.uint16, None, "bits"),
    _d("bits1x8", 1, None, np.uint8, None, "bits"),
    _d("bits2x4", 1, None, np.uint8, None, "bits"),
    _d("bits4x2", 1, None, np.uint8, None, "bits"),
]
# torch.uint1..7 / int1..7 exist as dtype objects (allowlisted for weights_only) but no
# storage of them can be saved; they are kept so a pickled dtype object resolves.
for _n in range(1, 8):
    _TABLE.append(_d(f"uint{_n}", 1, None, np.uint8, None, "bits"))
    _TABLE.append(_d(f"int{_n}", 1, None, np.int8, None, "bits"))

#: name -> DType for every dtype torch 2.13 can serialize.
DTYPES: dict[str, DType] = {d.name: d for d in _TABLE}

#: legacy typed storage class name -> DType (``FloatStorage`` -> float32).
STORAGE_NAMES: dict[str, DType] = {d.legacy_storage: d for d in _TABLE if d.legacy_storage}

_ALIASES = {
    "float": "float32",
    "double": "float64",
    "half": "float16",
    "long": "int64",
    "int": "int32",
    "short": "int16",
    "cfloat": "complex64",
    "cdouble": "complex128",
    "chalf": "complex32",
    "bf16": "bfloat16",
    "fp16": "float16",
    "fp32": "float32",
    "fp64": "float64",
}

#: NumPy dtype -> DType; the ml_dtypes entries join on the first miss (:func:`from_numpy`)
_FROM_NUMPY: dict[np.dtype, DType] = {}
_ml_done = False


def _fill_from_numpy(everything: bool) -> None:
    for d in _TABLE:
        if d.kind != "quantized" and (everything or not isinstance(d._numpy, str)) and (npd := d.numpy) is not None:
            _FROM_NUMPY.setdefault(npd, d)


_fill_from_numpy(everything=False)


def by_name(name: str) -> DType:
    """The DType for ``name`` (``"float32"``, ``"torch.float32"``, ``"half"`` ...).

    Raises:
        UnsupportedError: the name is no torch dtype torchless knows.
    """
    key = name[6:] if name.startswith("torch.") else name
    key = _ALIASES.get(key, key)
    try:
        return DTYPES[key]
    except KeyError:
        raise UnsupportedError(f"unknown dtype {name!r}", expected="one of " + ", ".join(sorted(DTYPES))) from None


def from_numpy(dtype: Any) -> DType:
    """The torch dtype holding NumPy ``dtype`` (byte order ignored).

    Raises:
        UnsupportedError: NumPy dtypes torch has no counterpart for (strings, objects).
    """
    nd = np.dtype(dtype)
    if nd.byteorder not in ("=", "|"):
        nd = nd.newbyteorder("=")
    found = _FROM_NUMPY.get(nd)
    if found is None:
        global _ml_done
        if not _ml_done:  # an ml_dtypes type (bfloat16...) before any was asked for by name
            _ml_done = True
            _fill_from_numpy(everything=True)
            found = _FROM_NUMPY.get(nd)
        if found is None:
            raise UnsupportedError(f"NumPy dtype {nd} has no torch counterpart")
    return found


def from_storage_name(name: str) -> DType | None:
    """DType of a legacy storage class name such as ``FloatStorage``; None if unknown."""
    return STORAGE_NAMES.get(name)
