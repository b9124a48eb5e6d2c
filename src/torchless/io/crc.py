"""CRC-32 (the zip/zlib polynomial) of large buffers, as fast as the machine allows.

:func:`crc32` returns exactly what ``zlib.crc32(data, value)`` returns. CPython's ``zlib``
is the system zlib (1.2.x: about 2 GB/s, as slow as writing the bytes to memory), so on
buffers of :data:`NATIVE_MIN` bytes or more it calls ``libdeflate_crc32`` from the system's
libdeflate when that shared library is present (carry-less multiply: about 4x faster here).
Nothing is installed for it: without libdeflate, or with ``TORCHLESS_CRC=zlib`` in the
environment at the first large call, every call is ``zlib.crc32``.

The C call releases the GIL (a ``ctypes.CDLL`` function), so a thread can checksum one
chunk while another writes the previous one, as with ``zlib.crc32``.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["crc32", "crc32_spans", "crc32_combine", "backend", "NATIVE_MIN", "SPAN_NATIVE_MIN"]

#: below this many bytes the ctypes call costs more than it saves
NATIVE_MIN = 1 << 16
#: :func:`crc32_spans` calls libdeflate from this many bytes on (its buffer's address is
#: found once for all the spans, so only the call itself is left to pay for)
SPAN_NATIVE_MIN = 1536


_NAMES = ("libdeflate.so.0", "libdeflate.so", "libdeflate.0.dylib", "libdeflate.dylib")


def _load_libdeflate() -> Callable[[int, int, int], int] | None:
    if os.environ.get("TORCHLESS_CRC", "").lower() == "zlib":
        return None
    try:
        import ctypes
    except ImportError:
        return None
    fn = None
    for name in _NAMES:  # dlopen by name: no ``ldconfig`` subprocess as ``find_library`` runs
        try:
            fn = ctypes.CDLL(name).libdeflate_crc32
            break
        except (OSError, AttributeError):
            continue
    if fn is None:
        return None
    fn.restype = ctypes.c_uint32
    fn.argtypes = [ctypes.c_uint32, ctypes.c_void_p, ctypes.c_size_t]
    # trust it only when it agrees with zlib (a library of that name that is something else)
    raw = bytes(range(256)) * 300
    probe = np.frombuffer(raw, np.uint8)
    if fn(7, probe.ctypes.data, probe.nbytes) != zlib.crc32(raw, 7):
        return None
    return fn


_UNSET: Any = object()
_NATIVE: Any = _UNSET  # loaded on the first large buffer (importing this module stays free)


def _native() -> Callable[[int, int, int], int] | None:
    global _NATIVE
    if _NATIVE is _UNSET:
        _NATIVE = _load_libdeflate()
    fn: Callable[[int, int, int], int] | None = _NATIVE
    return fn


def backend() -> str:
    """``"libdeflate"`` or ``"zlib"``: what :func:`crc32` uses for large buffers."""
    return "zlib" if _native() is None else "libdeflate"


def crc32(data: Any, value: int = 0) -> int:
    """``zlib.crc32(data, value)`` for any C-contiguous bytes-like ``data``."""
    mv = data if isinstance(data, memoryview) else memoryview(data)
    if mv.nbytes < NATIVE_MIN:
        return zlib.crc32(mv, value)
    fn = _NATIVE if _NATIVE is not _UNSET else _native()
    if fn is None:
        return zlib.crc32(mv, value)
    arr = np.frombuffer(mv.cast("B") if mv.format != "B" or mv.ndim != 1 else mv, np.uint8)
    return int(fn(value & 0xFFFFFFFF, arr.ctypes.data, arr.nbytes))


def crc32_spans(buf: Any, offsets: list[int], sizes: list[int]) -> list[int]:
    """``[zlib.crc32(buf[o : o + n]) for o, n in zip(offsets, sizes)]`` for the spans of
    one C-contiguous bytes-like ``buf`` (thousands of small records of one mapped file):
    the buffer's address is taken once and libdeflate called on each span of
    :data:`SPAN_NATIVE_MIN` bytes or more.

    Raises:
        ValueError: a span outside ``buf``.
    """
    mv = buf if isinstance(buf, memoryview) else memoryview(buf)
    if mv.format != "B" or mv.ndim != 1:
        mv = mv.cast("B")
    size = mv.nbytes
    for o, n in zip(offsets, sizes, strict=True):
        if o < 0 or n < 0 or o + n > size:
            raise ValueError(f"span [{o}, {o + n}) outside a buffer of {size} bytes")
    fn = _NATIVE if _NATIVE is not _UNSET else _native()
    zcrc = zlib.crc32
    if fn is None or not size:
        return [zcrc(mv[o : o + n]) for o, n in zip(offsets, sizes, strict=True)]
    arr = np.frombuffer(mv, np.uint8)
    base = arr.ctypes.data
    lo = SPAN_NATIVE_MIN
    out = [fn(0, base + o, n) if n >= lo else zcrc(mv[o : o + n]) for o, n in zip(offsets, sizes, strict=True)]
    del arr  # (holds the buffer until every call returned)
    return out


# -- CRC-32 of a concatenation from the parts' CRCs (zlib's crc32_combine) -------------------------
def _gf2_times(mat: list[int], vec: int) -> int:
    s = 0
    i = 0
    while vec:
        if vec & 1:
            s ^= mat[i]
        vec >>= 1
        i += 1
    return s


def _gf2_square(mat: list[int]) -> list[int]:
    return [_gf2_times(mat, mat[n]) for n in range(32)]


def crc32_combine(crc1: int, crc2: int, len2: int) -> int:
    """CRC-32 of ``A + B`` from ``crc32(A)``, ``crc32(B)`` and ``len(B)`` (zlib's
    ``crc32_combine``, which Python's zlib does not expose): tasks writing ranges of
    one file each return their range's CRC, and the coordinator joins them."""
    if len2 <= 0:
        return crc1
    odd = [0xEDB88320] + [1 << n for n in range(31)]  # the operator for one zero bit
    even = _gf2_square(odd)  # two zero bits
    odd = _gf2_square(even)  # four zero bits
    while True:
        even = _gf2_square(odd)
        if len2 & 1:
            crc1 = _gf2_times(even, crc1)
        len2 >>= 1
        if not len2:
            break
        odd = _gf2_square(even)
        if len2 & 1:
            crc1 = _gf2_times(odd, crc1)
        len2 >>= 1
        if not len2:
            break
    return (crc1 ^ crc2) & 0xFFFFFFFF
