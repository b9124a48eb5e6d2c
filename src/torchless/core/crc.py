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

__all__ = ["crc32", "backend", "NATIVE_MIN"]

#: below this many bytes the ctypes call costs more than it saves
NATIVE_MIN = 1 << 16


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
