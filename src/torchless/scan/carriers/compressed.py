"""Compressed carriers (joblib's compressed files): inflated, then scanned."""

from __future__ import annotations

import bz2
import lzma
import os
import zlib

from ...core.source import BytesSource, ByteSource
from .common import MAX_INFLATE

__all__ = ["CompressedCarrier"]


class CompressedCarrier:
    """Mixin of :class:`~torchless.scan.carriers.Scanner`: gzip/bz2/xz/lzma/zlib streams."""

    def scan_compressed(self, src: ByteSource, kind: str, member: str | None, depth: int) -> None:
        raw = src.view(0, src.size)
        try:
            if kind == "gzip":
                d = zlib.decompressobj(31)
                data = d.decompress(raw, MAX_INFLATE)
            elif kind == "zlib":
                d = zlib.decompressobj()
                data = d.decompress(raw, MAX_INFLATE)
            elif kind == "bz2":
                data = bz2.BZ2Decompressor().decompress(raw, MAX_INFLATE)
            elif kind == "xz":
                data = lzma.LZMADecompressor(lzma.FORMAT_XZ).decompress(raw, MAX_INFLATE)
            else:
                data = lzma.LZMADecompressor(lzma.FORMAT_ALONE).decompress(raw, MAX_INFLATE)
        except (zlib.error, OSError, lzma.LZMAError, EOFError, ValueError):
            return  # not actually compressed data
        if member is None:
            self.report.kind = f"{kind}-compressed"
        if len(data) >= MAX_INFLATE:
            self.add("limit", "high", f"{kind} data inflates beyond {MAX_INFLATE} bytes; analysed the first part only", member)
        self.scan_source(BytesSource(data), f"{member or os.path.basename(self.path)} ({kind})", None, depth + 1)
