"""ONNX ``TensorProto.DataType`` codes and their torchless dtypes.

The codes are onnx 1.23's (spec ``onnx.md`` §3). Whole-byte types map onto the torch
dtypes of :mod:`torchless.core.dtypes` (FLOAT -> float32, BFLOAT16 -> bfloat16,
FLOAT8E4M3FN -> float8_e4m3fn ...). Sub-byte types (UINT4, INT4, FLOAT4E2M1, UINT2, INT2,
FLOAT6E2M3, FLOAT6E3M2) are *packed* on disk: ``dims`` count logical elements and the
bytes hold 2 (4-bit), 4 (2-bit) or 4-per-3-bytes (6-bit) values, low bits first. torchless
keeps those bytes as they are (a :class:`PackedTensor` over a uint8 storage) and unpacks
only on ``numpy()``, into the ml_dtypes element type (``ml_dtypes.int4`` ...).

STRING tensors have no fixed-size representation and are refused with
:class:`~torchless.core.errors.UnsupportedError`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np

from ...core.dtypes import DTYPES, DType
from ...core.errors import FormatError, UnsupportedError
from ...core.tensor import Tensor

__all__ = [
    "OnnxType",
    "ONNX_TYPES",
    "PackedTensor",
    "onnx_type",
    "code_for",
    "pack_bits",
    "packed_nbytes",
    "unpack_bits",
]


def _local(name: str, npd: Any, kind: str) -> DType:
    # dtypes torch has no exact counterpart for: one unpacked element per NumPy item
    return DType(name, 1, None if npd is None else np.dtype(npd), np.dtype(np.uint8), None, kind)


@dataclass(frozen=True, slots=True)
class OnnxType:
    """One ``TensorProto.DataType``.

    Attributes:
        code: the enum value (``1`` for FLOAT).
        name: the enum name (``"FLOAT"``).
        dtype: the torchless dtype (None for STRING and UNDEFINED).
        bits: bits per element for packed sub-byte types, else 0.
        field: the typed repeated field used when ``raw_data`` is absent.
        element: NumPy dtype of one unpacked element (the value ``numpy()`` returns).
    """

    code: int
    name: str
    dtype: DType | None
    bits: int = 0
    field: str = "int32_data"
    element: Any = None

    @property
    def packed(self) -> bool:
        return self.bits != 0

    def nbytes(self, numel: int) -> int:
        """Bytes ``numel`` elements take in ``raw_data`` (packed for sub-byte types)."""
        if self.bits:
            return packed_nbytes(numel, self.bits)
        assert self.dtype is not None
        return numel * self.dtype.itemsize


def _t(code: int, name: str, dtype: str | DType | None, field: str, bits: int = 0, element: Any = None) -> OnnxType:
    dt = DTYPES[dtype] if isinstance(dtype, str) else dtype
    if element is None and dt is not None and dt.numpy is not None:
        element = dt.numpy
    return OnnxType(code, name, dt, bits, field, None if element is None else np.dtype(element))


_FP4 = _local("float4_e2m1fn", ml_dtypes.float4_e2m1fn, "float")
_FP6A = _local("float6_e2m3fn", ml_dtypes.float6_e2m3fn, "float")
_FP6B = _local("float6_e3m2fn", ml_dtypes.float6_e3m2fn, "float")

#: code -> OnnxType, for every code of onnx 1.23
ONNX_TYPES: dict[int, OnnxType] = {
    t.code: t
    for t in [
        _t(0, "UNDEFINED", None, ""),
        _t(1, "FLOAT", "float32", "float_data"),
        _t(2, "UINT8", "uint8", "int32_data"),
        _t(3, "INT8", "int8", "int32_data"),
        _t(4, "UINT16", "uint16", "int32_data"),
        _t(5, "INT16", "int16", "int32_data"),
        _t(6, "INT32", "int32", "int32_data"),
        _t(7, "INT64", "int64", "int64_data"),
        _t(8, "STRING", None, "string_data"),
        _t(9, "BOOL", "bool", "int32_data"),
        _t(10, "FLOAT16", "float16", "int32_data"),
        _t(11, "DOUBLE", "float64", "double_data"),
        _t(12, "UINT32", "uint32", "uint64_data"),
        _t(13, "UINT64", "uint64", "uint64_data"),
        _t(14, "COMPLEX64", "complex64", "float_data"),
        _t(15, "COMPLEX128", "complex128", "double_data"),
        _t(16, "BFLOAT16", "bfloat16", "int32_data"),
        _t(17, "FLOAT8E4M3FN", "float8_e4m3fn", "int32_data"),
        _t(18, "FLOAT8E4M3FNUZ", "float8_e4m3fnuz", "int32_data"),
        _t(19, "FLOAT8E5M2", "float8_e5m2", "int32_data"),
        _t(20, "FLOAT8E5M2FNUZ", "float8_e5m2fnuz", "int32_data"),
        _t(21, "UINT4", "uint4", "int32_data", 4, ml_dtypes.uint4),
        _t(22, "INT4", "int4", "int32_data", 4, ml_dtypes.int4),
        _t(23, "FLOAT4E2M1", _FP4, "int32_data", 4, ml_dtypes.float4_e2m1fn),
        _t(24, "FLOAT8E8M0", "float8_e8m0fnu", "int32_data"),
        _t(25, "UINT2", "uint2", "int32_data", 2, ml_dtypes.uint2),
        _t(26, "INT2", "int2", "int32_data", 2, ml_dtypes.int2),
        _t(27, "FLOAT6E2M3", _FP6A, "int32_data", 6, ml_dtypes.float6_e2m3fn),
        _t(28, "FLOAT6E3M2", _FP6B, "int32_data", 6, ml_dtypes.float6_e3m2fn),
    ]
}

_BY_DTYPE: dict[str, int] = {t.dtype.name: c for c, t in ONNX_TYPES.items() if t.dtype is not None}


def onnx_type(code: int, *, what: str = "tensor", path: Any = None) -> OnnxType:
    """The :class:`OnnxType` for ``code``.

    Raises:
        UnsupportedError: STRING, UNDEFINED or a code newer than onnx 1.23.
    """
    t = ONNX_TYPES.get(int(code))
    if t is None:
        raise UnsupportedError(
            f"unknown ONNX data type {code}", path=path, member=what, expected="a TensorProto.DataType of onnx 1.23 (1-28)"
        )
    if t.dtype is None:
        raise UnsupportedError(
            f"ONNX {t.name} tensors have no fixed-size representation",
            path=path,
            member=what,
            hint="torchless reads numeric tensors only",
        )
    return t


def code_for(dtype: DType | str) -> int:
    """The ONNX data type code of a torchless dtype.

    Raises:
        UnsupportedError: a dtype ONNX cannot store (complex32, quantized, bits*).
    """
    name = dtype if isinstance(dtype, str) else dtype.name
    try:
        return _BY_DTYPE[name]
    except KeyError:
        raise UnsupportedError(f"ONNX has no data type for {name}", expected="one of " + ", ".join(sorted(_BY_DTYPE))) from None


def packed_nbytes(numel: int, bits: int) -> int:
    """Bytes taken by ``numel`` packed ``bits``-bit values."""
    return (numel * bits + 7) // 8


def unpack_bits(data: Any, numel: int, bits: int) -> np.ndarray:
    """Unpack ``bits``-bit codes (low bits first) into one uint8 per element."""
    raw = np.frombuffer(data, dtype=np.uint8)
    need = packed_nbytes(numel, bits)
    if raw.size < need:
        raise FormatError("packed tensor data is too short", expected=f"{need} bytes", found=f"{raw.size}")
    raw = raw[:need]
    if bits == 4:
        out = np.empty(raw.size * 2, np.uint8)
        out[0::2] = raw & 0x0F
        out[1::2] = raw >> 4
    elif bits == 2:
        out = np.empty(raw.size * 4, np.uint8)
        for i in range(4):
            out[i::4] = (raw >> (2 * i)) & 0x03
    elif bits == 6:
        # a little-endian bit stream: element i occupies bits [6i, 6i+6)
        groups = -(-numel // 4)
        buf = np.zeros(groups * 3, np.uint8)
        buf[: raw.size] = raw
        g = buf.reshape(groups, 3).astype(np.uint32)
        word = g[:, 0] | (g[:, 1] << 8) | (g[:, 2] << 16)
        out = np.empty((groups, 4), np.uint8)
        for i in range(4):
            out[:, i] = (word >> (6 * i)) & 0x3F
        out = out.reshape(-1)
    else:  # pragma: no cover - table has only 2, 4, 6
        raise UnsupportedError(f"{bits}-bit packing")
    return out[:numel]


def pack_bits(codes: Any, bits: int) -> bytes:
    """Pack one-code-per-byte values (masked to ``bits``) into ONNX's packed layout."""
    flat = np.asarray(codes).reshape(-1).view(np.uint8) & np.uint8((1 << bits) - 1)
    n = flat.size
    per = {4: 2, 2: 4, 6: 4}[bits]
    pad = (-n) % per
    if pad:
        flat = np.concatenate([flat, np.zeros(pad, np.uint8)])
    if bits == 4:
        out = flat[0::2] | (flat[1::2] << 4)
    elif bits == 2:
        out = flat[0::4] | (flat[1::4] << 2) | (flat[2::4] << 4) | (flat[3::4] << 6)
    else:
        g = flat.reshape(-1, 4).astype(np.uint32)
        word = g[:, 0] | (g[:, 1] << 6) | (g[:, 2] << 12) | (g[:, 3] << 18)
        out = np.stack([word & 0xFF, (word >> 8) & 0xFF, (word >> 16) & 0xFF], axis=1).astype(np.uint8).reshape(-1)
    return out.astype(np.uint8).tobytes()[: packed_nbytes(n, bits)]


class PackedTensor(Tensor):
    """A sub-byte ONNX tensor: logical ``shape``, packed bytes in a uint8 storage.

    ``nbytes`` is the packed size (what the file holds). ``numpy()`` unpacks into the
    ml_dtypes element type (``ml_dtypes.int4``, ``float4_e2m1fn`` ...), which is a copy;
    ``numpy(raw=True)`` is the packed bytes as a zero-copy uint8 vector.

    Attributes:
        onnx: the :class:`OnnxType` (its ``bits`` and ``element``).
    """

    __slots__ = ("onnx",)

    def __init__(self, storage: Any, otype: OnnxType, shape: Any) -> None:
        assert otype.dtype is not None
        super().__init__(storage, otype.dtype, shape)
        self.onnx = otype

    @property
    def nbytes(self) -> int:
        return packed_nbytes(self.numel(), self.onnx.bits)

    def element_size(self) -> int:  # bits/8 is not an integer; report the storage byte
        return 1

    def is_contiguous(self) -> bool:
        return True

    def _check_bounds(self) -> None:
        assert self.storage is not None
        if self.storage.nbytes < self.nbytes:
            raise FormatError(
                "packed tensor is larger than its data",
                member=self.storage.origin or None,
                expected=f"{self.nbytes} bytes",
                found=f"{self.storage.nbytes}",
            )

    def numpy(self, *, raw: bool = False) -> np.ndarray:
        if self.storage is None:
            raise UnsupportedError("a meta tensor has no data")
        self._check_bounds()
        buf = self.storage.bytes()[: self.nbytes]
        if raw:
            return np.frombuffer(buf, dtype=np.uint8)
        codes = unpack_bits(buf, self.numel(), self.onnx.bits)
        return codes.view(self.onnx.element).reshape(self.shape)

    def tobytes(self) -> bytes:
        return bytes(self.numpy(raw=True))

    def __repr__(self) -> str:
        return f"PackedTensor(shape={list(self.shape)}, dtype={self.dtype.name}, bits={self.onnx.bits})"


def numel_of(dims: Any) -> int:
    return math.prod(int(d) for d in dims)
