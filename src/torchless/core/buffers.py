"""Predicates on buffers that values hold (a tensor's storage bytes)."""

from __future__ import annotations

import mmap

__all__ = ["is_mapped"]


def is_mapped(buf: object) -> bool:
    """True when ``buf`` is a zero-copy view of a file mapping (what :meth:`MmapSource.view`
    returns). Such a view must not be kept past the read that asked for it (cache the
    source and the range instead), or ``close()`` cannot unmap the file."""
    return type(buf) is memoryview and type(buf.obj) is mmap.mmap
