"""Compressed carriers: joblib's compressed files (every format of its prefix table, the
pre-0.9.3 ``ZF`` zfile included) and any other lzma/xz/zlib header the standard modules
accept. The stream is inflated incrementally, drawing from the scan's inflate budget, and
what it yields is scanned as bytes a loader reads from memory. A stream that breaks
part-way is still scanned up to the break (joblib unpickles while it inflates) and the
break is a finding.
"""

from __future__ import annotations

import bz2
import lzma
import os
import zlib
from typing import Any

from ...formats.joblib_spec import compression_of
from ...io.source import ByteSource
from .common import Carrier
from .recognize import probe_pickle

__all__ = ["CompressedCarrier"]

_CHUNK = 1 << 20
_MAX_STREAMS = (
    10_000  # concatenated streams followed (BGZF writes one per 64 KiB; 16 MiB of zeros are a million empty .lzma streams)
)
_PROBE = 1 << 20  # inflated bytes probed before inflating the rest
_ZF_HEADER = 2 + 19  # b"ZF" + the hex length padded to len("%#x" % 2**64) (joblib.numpy_pickle_compat)


def _decompressor(kind: str) -> Any:
    if kind in ("zlib", "zfile"):
        return zlib.decompressobj(15)
    if kind == "gzip":
        return zlib.decompressobj(31)
    if kind == "bz2":
        return bz2.BZ2Decompressor()
    if kind == "xz":
        return lzma.LZMADecompressor(lzma.FORMAT_XZ, memlimit=256 << 20)
    if kind == "lzma":
        return lzma.LZMADecompressor(lzma.FORMAT_ALONE, memlimit=256 << 20)
    return None


class _Done:
    """A finished decompressor (trailing bytes that are not a further stream)."""

    eof = True
    unused_data = b""


class CompressedCarrier(Carrier):
    """A carrier run by the scan engine (:class:`~torchless.scan.carriers.base.ScanEngine`): compressed streams."""

    def scan_compressed(self, src: ByteSource, kind: str, member: str | None, depth: int, *, who: str = "joblib.load") -> bool:
        """Inflate and scan; False when the bytes are not that kind of stream at all."""
        with self.engine.loading("joblib.load" if who == "joblib.load" else None):
            return self._inflate_and_scan(src, kind, member, depth, who)

    def _inflate_and_scan(self, src: ByteSource, kind: str, member: str | None, depth: int, who: str) -> bool:
        start = 0
        if kind == "zfile":
            head = src.read_at(0, min(src.size, _ZF_HEADER + 1))
            try:
                int(head[2:_ZF_HEADER], 16)
            except ValueError:
                return False  # joblib's int(length, 16) raises: nothing is read
            start = _ZF_HEADER + (1 if head[_ZF_HEADER : _ZF_HEADER + 1] == b" " else 0)
        if kind == "lz4":
            self.engine.add(
                "unanalysable",
                "high",
                "lz4-compressed (joblib's lz4 prefix): the scanner does not "
                "inflate lz4; joblib.load does when the lz4 package is installed",
                member,
                0,
                loader="joblib.load",
            )
            return True
        loader = "joblib.load" if who == "joblib.load" else "pickle.load"
        if who == "joblib.load" and self.engine.budget.inflate > _PROBE:
            # joblib only unpickles what it inflates: when the real unpicklers stop in the
            # first MiB, nothing further is read (a .tar.gz is not inflated whole)
            first, total, broken, limited, d = self._inflate(src, kind, start, _PROBE)
            if total and limited:
                probe = probe_pickle(_bytes_source(first, "head"), window=_PROBE)
                if probe.inert:
                    if member is None:
                        self.engine.report.kind = f"{kind}-compressed"
                    self.engine.add(
                        "unrecognized",
                        "info",
                        f"{kind} stream whose first {len(first)} inflated bytes are no pickle the "
                        f"real unpicklers would run ({probe.detail}): {who} stops there",
                        member,
                        0,
                        loader=loader,
                    )
                    return True
            del first
        data, total, broken, limited, d = self._inflate(src, kind, start, max(0, self.engine.budget.inflate))
        if who != "joblib.load" and (broken is not None or total == 0 or not d.eof):
            # beyond joblib's own prefixes, only a stream that decodes cleanly to its end
            # counts (lzma.decompress/zlib.decompress raise on anything less): a header
            # look-alike (the non-picky .lzma decoder accepts many) is not this carrier
            return False
        if total == 0:
            self.engine.add(
                "unrecognized",
                "info",
                f"{kind} stream yields no data ({broken or 'empty'}): {who} raises before unpickling anything",
                member,
                0,
                loader=loader,
            )
            return True
        self.engine.budget.inflate -= min(total, self.engine.budget.inflate + 1)
        self.engine.budget.pickle += total  # inflated bytes are input too (the opcode budget bounds the work)
        loc = f"{member or os.path.basename(self.engine.path)} ({kind})"
        if member is None:
            self.engine.report.kind = f"{kind}-compressed"
        if limited:
            self.engine.add(
                "limit",
                "high",
                f"{kind} data inflates beyond the scan's budget; analysed the first {total} bytes only",
                member,
                loader=loader,
            )
        elif broken is not None:
            self.engine.add(
                "trailing-data",
                "high",
                f"the {kind} stream breaks after {total} inflated bytes ({broken}): "
                f"{who} has already unpickled what came before the break (scanned)",
                member,
                loader=loader,
            )
        elif not d.eof:
            self.engine.add(
                "trailing-data",
                "medium",
                f"the {kind} stream ends without its end marker after {total} inflated bytes (scanned)",
                member,
                loader=loader,
            )
        self.engine.scan_source(_bytes_source(data, loc), loc, None, depth + 1, context="memory", loader=loader)
        return True

    def _inflate(self, src: ByteSource, kind: str, start: int, cap: int) -> tuple[bytes, int, str | None, bool, Any]:
        """Inflate up to ``cap`` bytes: (data, total, why it broke, cap reached, decompressor)."""
        d = _decompressor(kind)
        out: list[bytes] = []
        total = 0
        pos = start
        broken: str | None = None
        limited = False
        is_zlib = kind in ("zlib", "zfile", "gzip")
        streams = 1
        try:
            while True:
                if d.eof:
                    # gzip.open, bz2.open and lzma.open go on with a further stream (member)
                    # after the first: model them too (joblib stops at the first)
                    rest = d.unused_data or (bytes(src.view(pos, min(_CHUNK, src.size - pos))) if pos < src.size else b"")
                    if (
                        kind not in ("gzip", "bz2", "xz", "lzma")
                        or not rest
                        or (kind == "gzip" and compression_of(rest) != "gzip")
                    ):
                        break
                    if streams >= _MAX_STREAMS:  # bound the count (a finding: the rest is not analysed)
                        limited = True
                        break
                    if not d.unused_data:
                        pos += len(rest)  # a fresh chunk (leftovers are never read twice)
                    d = _decompressor(kind)
                    streams += 1
                    try:
                        piece = d.decompress(rest, cap - total + 1)
                    except (zlib.error, OSError, lzma.LZMAError, EOFError, ValueError):
                        if kind == "gzip":
                            raise  # gzip.open raises on a broken member; the others ignore trailing garbage
                        d = _Done()
                        break
                    total += len(piece)
                    out.append(piece)
                    continue
                if total > cap:
                    limited = True
                    break
                if is_zlib and d.unconsumed_tail:
                    inp = d.unconsumed_tail
                elif not is_zlib and not d.needs_input:
                    inp = b""
                elif pos < src.size:
                    inp = bytes(src.view(pos, min(_CHUNK, src.size - pos)))
                    pos += len(inp)
                else:
                    break  # input ends before the stream's end marker
                piece = d.decompress(inp, cap - total + 1)
                if not piece and not inp:
                    break
                total += len(piece)
                out.append(piece)
        except (zlib.error, OSError, lzma.LZMAError, EOFError, ValueError, MemoryError) as e:
            broken = f"{type(e).__name__}: {str(e)[:80]}"
        return b"".join(out), total, broken, limited, d


def _bytes_source(data: bytes, name: str) -> ByteSource:
    from ...io.source import BytesSource

    return BytesSource(data, name)
