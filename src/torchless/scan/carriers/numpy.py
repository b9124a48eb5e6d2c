"""NumPy ``.npy`` files: the pickle after the header of object arrays."""

from __future__ import annotations

import ast
import os
import struct

from ...core.source import BytesSource, ByteSource

__all__ = ["NumpyCarrier"]


class NumpyCarrier:
    """Mixin of :class:`~torchless.scan.carriers.Scanner`: ``.npy`` files."""

    def scan_npy(self, src: ByteSource, member: str | None, base: int | None, depth: int) -> None:
        head = src.read_at(0, min(src.size, 16))
        if len(head) < 10:
            return
        major = head[6]
        if major == 1:
            hlen = struct.unpack_from("<H", head, 8)[0]
            start = 10
        else:
            hlen = struct.unpack_from("<I", head, 8)[0] if len(head) >= 12 else 0
            start = 12
        if start + hlen > src.size:
            self.add("malformed-pickle", "medium", ".npy header runs past the end", member, 8)
            return
        text = src.read_at(start, hlen).decode("latin1", "replace")
        try:
            hdr = ast.literal_eval(text.strip())
            descr = hdr.get("descr") if isinstance(hdr, dict) else None
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            descr = None
        is_object = descr is None or "O" in str(descr)
        if descr is None:
            self.add("malformed-pickle", "medium", ".npy header is not a Python literal dict", member, start)
        if not is_object:
            return
        n = src.size - start - hlen
        if member is None:
            self.report.kind = "npy"
        self.scan_pickles(BytesSource(src.view(start + hlen, n)), f"{member or os.path.basename(self.path)} > object array pickle", None if base is None else base + start + hlen, depth, strict=True)
