"""Distributed checkpoints: ``.distcp`` items located by the ``.metadata`` byte ranges."""

from __future__ import annotations

import os
import struct
from typing import Any, Iterable

from ...core.source import ByteSource
from ..analysis import Sym, analyse
from .common import _EOCD_SIG, _ZIP_SIG

__all__ = ["DcpCarrier", "split_zips", "dcp_items_for"]


class DcpCarrier:
    """Mixin of :class:`~torchless.scan.carriers.Scanner`: ``.distcp`` files."""

    # -- DCP -------------------------------------------------------------------------
    def scan_distcp(self, src: ByteSource) -> None:
        items = dcp_items_for(self.path)
        size = src.size
        if items is None:
            ranges = list(split_zips(src))
            if not ranges:
                self.scan_source(src, None, 0, 0)
                return
        else:
            ranges = sorted(items)
            covered = 0
            for off, ln in ranges:
                if off < covered:
                    self.add("dcp-layout", "high", f"items overlap at {off:#x}", None, off)
                elif off > covered:
                    self.add("dcp-layout", "high", f"bytes {covered:#x}..{off:#x} belong to no item in .metadata (scanned as a carrier)", None, covered)
                    self.scan_bytes(src.view(covered, off - covered), f"[{covered}:{off}] (unaccounted)", covered, 1)
                if off + ln > size:
                    self.add("dcp-layout", "high", f"item [{off}:{off + ln}] runs past the end of the file", None, off)
                covered = max(covered, off + ln)
            if covered < size:
                self.add("dcp-layout", "high", f"{size - covered} bytes after the last item (scanned as a carrier)", None, covered)
                self.scan_bytes(src.view(covered, size - covered), f"[{covered}:{size}] (unaccounted)", covered, 1)
        for off, ln in ranges:
            ln = max(0, min(ln, size - off))
            if ln:
                self.scan_bytes(src.view(off, ln), f"[{off}:{off + ln}]", off, 1)


def split_zips(src: ByteSource) -> Iterable[tuple[int, int]]:
    """(offset, length) of zips laid end to end (DCP ``.distcp`` without metadata)."""
    n = src.size
    mm = getattr(src, "_map", None)
    find = mm.find if mm is not None else bytes(src.view(0, n)).find
    pos = 0
    while pos + 4 <= n and bytes(src.view(pos, 4)) == _ZIP_SIG:
        e = find(_EOCD_SIG, pos)
        if e < 0 or e + 22 > n:
            return
        clen = struct.unpack_from("<H", bytes(src.view(e + 20, 2)))[0]
        end = min(n, e + 22 + clen)
        yield pos, end - pos
        pos = end


def _walk_syms(v: Any, out: list[Sym], seen: set[int], depth: int = 0) -> None:
    if depth > 12 or id(v) in seen or len(out) > 1_000_000:
        return
    seen.add(id(v))
    if isinstance(v, Sym):
        out.append(v)
        _walk_syms(v.state, out, seen, depth + 1)
        _walk_syms(v.args, out, seen, depth + 1)
        for it in v.items:
            _walk_syms(it, out, seen, depth + 1)
    elif isinstance(v, dict):
        for k, x in v.items():
            _walk_syms(k, out, seen, depth + 1)
            _walk_syms(x, out, seen, depth + 1)
    elif isinstance(v, (list, tuple)):
        for x in v:
            _walk_syms(x, out, seen, depth + 1)


def dcp_items_for(path: str) -> list[tuple[int, int]] | None:
    """Byte ranges of this ``.distcp`` file's items from the sibling ``.metadata``."""
    d = os.path.dirname(path) or "."
    name = os.path.basename(path)
    metas = [os.path.join(d, ".metadata")] + [os.path.join(d, f) for f in sorted(os.listdir(d)) if f.endswith(".metadata") and f != ".metadata"]
    out: list[tuple[int, int]] = []
    found = False
    for mp in metas:
        if not os.path.isfile(mp):
            continue
        with open(mp, "rb") as f:
            data = f.read(1 << 28)
        res = analyse(data)
        syms: list[Sym] = []
        _walk_syms(res.value, syms, set())
        for s in syms:
            if s.kind == "result" and s.callee is not None and s.callee.qualname.endswith("_StorageInfo") and isinstance(s.state, dict):
                st = s.state
                rp, off, ln = st.get("relative_path"), st.get("offset"), st.get("length")
                if isinstance(rp, str) and type(off) is int and type(ln) is int and off >= 0 and ln >= 0:
                    found = True
                    if rp == name:
                        out.append((off, ln))
    return out if found else None
