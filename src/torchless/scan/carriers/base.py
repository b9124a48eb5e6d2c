"""The scanner core: findings, the entry point and the dispatch by carrier."""

from __future__ import annotations

import os
import time
from typing import Any

from ...core.errors import TorchlessError
from ...core.source import ByteSource, BytesSource, MmapSource
from ..findings import FileReport, Finding
from .common import MAX_DEPTH, sniff

__all__ = ["ScannerBase"]


class ScannerBase:
    """Scan one file; findings accumulate in :attr:`report`.

    Args:
        path: the file.
        unknown_severity: severity of ``unknown-global`` findings.
    """

    def __init__(self, path: str, *, unknown_severity: str = "medium") -> None:
        self.path = os.fspath(path)
        self.unknown_severity = unknown_severity
        self.report = FileReport(self.path)
        self._seen: set[tuple[str, int, str]] = set()

    # -- findings ----------------------------------------------------------------------
    def add(self, rule: str, severity: str, message: str, member: str | None = None, offset: int | None = None, file_offset: int | None = None, global_name: str | None = None, disassembly: list[str] | None = None, loader: str | None = None) -> None:
        key = (rule + message, offset or 0, member or "")
        if key in self._seen:
            return
        self._seen.add(key)
        self.report.findings.append(Finding(rule, severity, message, self.path, member, offset, file_offset, global_name, disassembly or [], loader))

    # -- entry -------------------------------------------------------------------------
    def run(self) -> FileReport:
        t0 = time.perf_counter()
        try:
            src = MmapSource(self.path)
        except (TorchlessError, OSError) as e:
            self.report.error = str(e)
            self.add("unreadable", "high", f"cannot read the file: {e}")
            return self.report
        try:
            name = os.path.basename(self.path)
            from ..cache import scan_if_cache

            if scan_if_cache(self, src):  # a TORCHINDUCTOR_CACHE_DIR entry: judged as torch.compile loads it
                pass
            elif name.endswith(".distcp"):
                self.report.kind = "distcp"
                self.scan_distcp(src)
            else:
                self.scan_source(src, None, 0, 0, toplevel=True)
        except TorchlessError as e:  # a carrier we could not walk: say so, never crash
            self.add("malformed-pickle" if "pickle" in str(e) else "limit", "high", f"scan stopped: {e}", e.member, e.offset)
        except (RecursionError, MemoryError) as e:  # pragma: no cover
            self.add("limit", "high", f"scan stopped: {type(e).__name__}")
        except Exception as e:  # pragma: no cover - a scanner bug must not hide the file
            self.report.error = f"internal error: {type(e).__name__}: {e}"
            self.add("unreadable", "high", f"the scan failed on this file ({type(e).__name__}: {e}); treat it as unscanned")
        finally:
            src.close()
        self.report.seconds = time.perf_counter() - t0
        return self.report

    # -- dispatch ----------------------------------------------------------------------
    def scan_source(self, src: ByteSource, member: str | None, base: int | None, depth: int, *, toplevel: bool = False) -> None:
        if depth > MAX_DEPTH:
            self.add("limit", "high", f"carriers nested more than {MAX_DEPTH} deep; not analysed further", member)
            return
        if src.size == 0:
            return
        head = src.read_at(0, min(src.size, 512))
        kind = sniff(head)
        if toplevel:
            self.report.kind = {"zip": "zip", "npy": "npy", "tar": "tar", "pickle": "pickle"}.get(kind, kind)
        if kind == "zip":
            self.scan_zip(src, member, base, depth)
        elif kind == "npy":
            self.scan_npy(src, member, base, depth)
        elif kind in ("gzip", "bz2", "xz", "lzma", "zlib"):
            self.scan_compressed(src, kind, member, depth)
        elif kind == "tar":
            self.scan_tar(src, member, base, depth)
        else:
            self.scan_pickles(src, member, base, depth, strict=(kind == "pickle"))
            if toplevel or depth == 0:
                self.check_polyglot(src, member, depth)

    def scan_bytes(self, data: Any, member: str | None, base: int | None, depth: int) -> None:
        """Scan bytes or a zero-copy memoryview (item of a .distcp, nested archive ...)."""
        self.scan_source(BytesSource(data, member or self.path), member, base, depth)
