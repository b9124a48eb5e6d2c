"""Find every pickle stream in a file, whatever carries it, and analyse each.

Carriers (sniffed from the bytes, never from the file name):

* raw pickles (any extension), several in a row, and the legacy torch stream format
  (five pickles, then storage bytes that are never read);
* zip archives read with torch's rules (:class:`~torchless.container.zip.ZipReader`):
  torch checkpoints, TorchScript (``data.pkl``, ``constants.pkl``, ``bytecode.pkl``,
  ``code/``), ``.pt2`` (sample inputs, pickled weights: nested zips), ``.npz``; every
  member that torch *or* Python's zipfile could unpickle, duplicates included; storage
  records (``data/0`` ...) are only peeked at (4 bytes) for nested archives;
* concatenated zips (DCP ``.distcp``), split by the byte ranges of the sibling
  ``.metadata`` (itself a pickle, analysed symbolically) or, without one, by end records;
* the legacy tar layout (``storages``/``tensors``/``pickle`` walked as torch walks them);
* ``.npy`` with object arrays (a pickle after the header); gzip/bz2/xz/lzma/zlib
  compressed pickles (joblib's compressed files);
* bytes that a pickle passes to a call and that are themselves pickles or archives
  (``torch.storage._load_from_bytes``, ``pickle.loads``).

Container differentials (duplicates, name mismatches, CRCs, flags, frame lies, trailing
data, polyglots) are findings of their own.
"""

from __future__ import annotations

import ast
import bz2
import lzma
import os
import re
import struct
import tarfile
import time
import zlib
from typing import Any, Iterable

from ..container.zip import ZipEntry, ZipReader
from ..core.dtypes import STORAGE_NAMES
from ..core.errors import TorchlessError, TruncatedError
from ..core.source import ByteSource, BytesSource, MmapSource, SourceFile
from .analysis import Sym, StreamResult, analyse, describe, disassemble
from .findings import AllowNote, FileReport, Finding
from .policy import torch_allows

__all__ = ["Scanner", "scan_file", "MAX_DEPTH"]

LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
MAX_DEPTH = 6  # nesting of carriers (zip in pickle in zip ...)
MAX_INFLATE = 1 << 30  # decompressed bytes accepted from one compressed carrier
MAX_MEMBER = 1 << 31  # bytes of one pickle-carrying member read for analysis
_WINDOW = 1 << 22  # bytes of a raw file analysed before deciding whether it is a pickle

_STORAGE_RECORD = re.compile(r"^(?:.*/)?(?:data|constants|tensors)/\d+$|^(?:.*/)?data/weights/weight_\d+$|^(?:.*/)?data/constants/tensor_\d+$|^(?:.*/)?xl_model_weights/")
_KNOWN_RECORDS = ("data.pkl", "constants.pkl", "bytecode.pkl", "traced_inputs.pkl", "version", "byteorder", ".data/version", ".format_version", ".storage_alignment", ".data/serialization_id", "archive_format")
_TS_RISKY = re.compile(r"\b(?:torch\.)?from_file\s*\(|\btorch\.(?:save|load|_load_for_mobile|jit\.load)\s*\(|\bload_library\s*\(")
_ZIP_SIG = b"PK\x03\x04"
_EOCD_SIG = b"PK\x05\x06"
_OK_FLAGS = 0x0808 | 0x0006  # data descriptor, UTF-8 names, deflate speed bits


#: allowlisted callables that call (or instantiate) some of their arguments: those
#: arguments must be plain globals (classified on their own), never computed values.
_HIGHER_ORDER: dict[str, tuple[int, ...]] = {
    "torch._tensor._rebuild_from_type_v2": (0, 1),
    "torch.tensor._rebuild_from_type_v2": (0, 1),
    "copyreg._reconstructor": (0, 1),
    "copyreg.__newobj__": (0,),
    "copyreg.__newobj_ex__": (0,),
    "torch._utils._rebuild_wrapper_subclass": (0,),
}


def _sniff(head: bytes) -> str:
    if head[:4] == _ZIP_SIG:
        return "zip"
    if head[:6] == b"\x93NUMPY":
        return "npy"
    if head[:2] == b"\x1f\x8b":
        return "gzip"
    if head[:3] == b"BZh":
        return "bz2"
    if head[:6] == b"\xfd7zXZ\x00":
        return "xz"
    if head[:3] == b"\x5d\x00\x00":
        return "lzma"
    if len(head) >= 2 and head[0] == 0x78 and (head[0] * 256 + head[1]) % 31 == 0:
        return "zlib"
    if len(head) >= 262 and head[257:262] == b"ustar":
        return "tar"
    if head[:1] == b"\x80" and len(head) > 1 and head[1] <= 5:
        return "pickle"
    return "other"


class Scanner:
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
            if name.endswith(".distcp"):
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
        kind = _sniff(head)
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

    # -- pickles -----------------------------------------------------------------------
    def analyse_stream(self, data: bytes, start: int, member: str | None, base: int | None, depth: int, *, torchscript: bool = False, report_errors: bool = True, torch_load: bool = False) -> StreamResult:
        res = analyse(data, start=start, torchscript=torchscript)
        self.report.streams += 1
        self.report_stream(res, data, member, base, depth, report_errors=report_errors, torch_load=torch_load)
        return res

    def report_stream(self, res: StreamResult, data: bytes, member: str | None, base: int | None, depth: int, *, report_errors: bool = True, torch_load: bool = False) -> None:
        def fo(off: int | None) -> int | None:
            return None if base is None or off is None else base + off

        def dis(off: int) -> list[str]:
            return disassemble(data, off, res.op_offsets)

        for g in res.globals:
            self.report.globals[g.qualname] = g.verdict.verdict
            how = []
            if g.opcode == "STACK_GLOBAL":
                how.append("assembled by STACK_GLOBAL" + (" from memoized strings" if g.from_memo else ""))
            elif g.opcode:
                how.append(f"named by {g.opcode}")
            if g.raw:
                how.append(f"written as {g.raw} (renamed by the Python-2 compatibility table)")
            if g.called:
                how.append("called through " + "/".join(sorted(set(g.called))))
            else:
                how.append("referenced, not called")
            if g.verdict.verdict == "dangerous":
                calls = [c for c in res.calls if c.callee.kind == "global" and c.callee.pos == g.offset]
                detail = ""
                if calls:
                    c = calls[0]
                    detail = f"; {c.opcode} at {c.offset:#x}: {describe(c.callee)}{describe(tuple(c.args) if isinstance(c.args, (tuple, list)) else (c.args,))}"
                self.add("dangerous-global", "critical", f"{g.qualname} ({', '.join(how)}): {g.verdict.reason}{detail}", member, g.offset, fo(g.offset), g.qualname, dis(calls[0].offset if calls else g.offset))
            elif g.verdict.verdict == "unknown":
                self.add("unknown-global", self.unknown_severity, f"{g.qualname} ({', '.join(how)}): {g.verdict.reason}", member, g.offset, fo(g.offset), g.qualname, dis(g.offset))
            if torch_load and not torch_allows(g.qualname) and g.qualname not in [n.global_name for n in self.report.weights_only]:
                self.report.weights_only.append(AllowNote(g.qualname, g.verdict.verdict, g.verdict.reason))
        for c in res.calls:
            hof = _HIGHER_ORDER.get(c.callee.qualname) if c.callee.kind == "global" else None
            if hof and isinstance(c.args, tuple):
                for i in hof:
                    a = c.args[i] if i < len(c.args) else None
                    if isinstance(a, Sym) and a.kind != "global":
                        self.add("indirect-call", "critical", f"{c.callee.qualname} calls its argument #{i}, a value computed at load time: {describe(a)}", member, c.offset, fo(c.offset), c.callee.qualname, dis(c.offset))
            if c.callee.kind != "global":
                what = "a value computed at load time" if c.callee.kind == "result" else "a persistent-load object"
                self.add("indirect-call", "critical", f"{c.opcode} calls {what}: {describe(c.callee)}{describe(tuple(c.args) if isinstance(c.args, (tuple, list)) else (c.args,))}; whatever that value is, the loader calls it", member, c.offset, fo(c.offset), None, dis(c.offset))
        for b in res.builds:
            if b.callee.kind == "global":
                self.add("global-mutation", "critical", f"BUILD sets state {describe(b.args)} on {b.callee.qualname} itself, not on an instance: Python's unpickler setattr()s it on the class or function, changing it for the whole process", member, b.offset, fo(b.offset), b.callee.qualname, dis(b.offset))
        if torch_load and res.protocol >= 4 and "pickle protocol >= 4 (FRAME and other opcodes the weights_only unpickler rejects)" not in self.report.weights_only_blockers:
            self.report.weights_only_blockers.append("pickle protocol >= 4 (FRAME and other opcodes the weights_only unpickler rejects)")
        # frames: every FRAME must end where an opcode begins, and the last at STOP's end
        if res.frames:
            starts = set(res.op_offsets)
            end = res.end if res.end is not None else len(data)
            for fpos, flen in res.frames:
                fend = fpos + 9 + flen
                if fend > len(data):
                    self.add("frame-length", "high", f"FRAME declares {flen} bytes but only {len(data) - fpos - 9} follow", member, fpos, fo(fpos), None, dis(fpos))
                elif fend != end and fend not in starts:
                    self.add("frame-length", "high", f"FRAME declares {flen} bytes, which ends inside an opcode at {fend:#x}: readers that trust frame lengths see different opcodes", member, fpos, fo(fpos), None, dis(fpos))
                elif fend < end and fend in starts and not any(p == fend for p, _ in res.frames):
                    self.add("frame-length", "high", f"FRAME declares {flen} bytes but opcodes continue outside any frame after {fend:#x}: readers that stop at the frame end miss them", member, fpos, fo(fpos), None, dis(fend))
        if res.error is not None and report_errors:
            off = res.error.offset
            self.add("malformed-pickle", "high", f"pickle stream stops with an error: {res.error.message if hasattr(res.error, 'message') else res.error} (what ran before it is analysed above)", member, off, fo(off), None, dis(off) if off is not None else [])
        for i, (op, blob, off) in enumerate(res.nested):
            sub = f"{member or os.path.basename(self.path)} > bytes passed to {op} at {off:#x}"
            self.scan_bytes(blob, sub, None, depth + 1)

    def scan_pickles(self, src: ByteSource, member: str | None, base: int | None, depth: int, *, strict: bool, torch_load: bool | None = None, torchscript: bool = False) -> None:
        """Consecutive pickles from offset 0; legacy torch files stop before storage bytes."""
        # Read a window, not the whole file: legacy checkpoints are five small pickles
        # followed by gigabytes of storage, and unknown binaries are rarely pickles. The
        # window grows only while a stream runs past it.
        size = src.size
        window = min(size, _WINDOW)

        def run(start: int) -> tuple[StreamResult, bytes]:
            nonlocal window
            while True:
                buf = bytes(src.view(0, window))
                r = analyse(buf, start=start, torchscript=torchscript)
                looks_like_pickle = strict or start > 0 or bool(r.globals) or len(r.op_offsets) > 16
                if r.end is None and window < size and isinstance(r.error, TruncatedError) and looks_like_pickle:
                    window = min(size, window * 8)
                    continue
                return r, buf

        first, data = run(0)
        if not strict and first.end is None and not any(g.verdict.verdict == "dangerous" for g in first.globals) and not first.calls:
            return  # not a pickle: bytes that merely start with an opcode letter
        self.report.streams += 1
        legacy = first.end is not None and type(first.value) is int and first.value == LEGACY_MAGIC
        if legacy and member is None:
            self.report.kind = "legacy"
        label = (lambda i: f"{member + ' > ' if member else ''}legacy pickle #{i}") if legacy else (lambda i: member if i == 1 else f"{member + ' > ' if member else ''}pickle #{i}")
        self.report_stream(first, data, label(1), base, depth, torch_load=bool(torch_load) if torch_load is not None else False)
        pos = first.end
        if pos is None:
            return
        count = 1
        limit = 5 if legacy else 64
        while pos < size and count < limit:
            res, data = run(pos)
            if not legacy:
                if res.end is None and not res.globals and not res.calls:
                    self.add("trailing-data", "medium", f"{size - pos} bytes after the pickle's STOP (not a further pickle)", member, pos, None if base is None else base + pos, None, disassemble(data, pos, None))
                    return
                self.add("trailing-data", "high", f"opcodes after STOP: a further pickle starts at {pos:#x} (read by loaders that call pickle.load again; most scanners stop at the first STOP)", member, pos, None if base is None else base + pos, None, disassemble(data, pos, res.op_offsets))
            count += 1
            self.report.streams += 1
            self.report_stream(res, data, label(count), base, depth, torch_load=legacy and count == 4)
            if res.end is None:
                return
            pos = res.end
        if legacy and count < 5:
            self.add("malformed-pickle", "medium", f"legacy stream has {count} of its 5 pickles", member, pos)

    # -- polyglots ---------------------------------------------------------------------
    def check_polyglot(self, src: ByteSource, member: str | None, depth: int) -> None:
        """A non-zip head with a zip end record at the tail: zipfile sees an archive."""
        n = src.size
        if n < 22:
            return
        tail = src.read_at(max(0, n - 65557), min(n, 65557))
        if _EOCD_SIG not in tail:
            return
        try:
            zr = ZipReader(src, require_prefix=False)
            delta = 0
        except TorchlessError:
            # an archive appended to other bytes: its offsets are relative to its own start;
            # Python's zipfile finds that start from the end record, so do the same
            pos = tail.rfind(_EOCD_SIG)
            if pos < 0 or pos + 22 > len(tail):
                return
            cd_size, cd_off = struct.unpack_from("<II", tail, pos + 12)
            eocd = n - len(tail) + pos
            delta = eocd - cd_size - cd_off
            if pos >= 20 and tail[pos - 20 : pos - 16] == b"PK\x06\x07":
                e64_off = struct.unpack_from("<Q", tail, pos - 12)[0]
                delta = (eocd - 20 - 56) - e64_off  # the zip64 end record sits right before
            if delta <= 0:
                return
            try:
                zr = ZipReader(BytesSource(src.view(delta, n - delta)), require_prefix=False)
            except TorchlessError:
                return
        if not zr.entries:
            return
        first = delta + min(e.header_offset for e in zr.entries)
        self.add("polyglot", "high", f"the file does not start as a zip, so torch.load reads it as a legacy pickle stream, but it ends with a zip archive ({len(zr.entries)} members from offset {first:#x}) that zip-based tools read instead", member, first)
        self._scan_zip_reader(zr, f"{member + ' > ' if member else ''}appended zip @ {first:#x}", delta, depth + 1)

    # -- zip ---------------------------------------------------------------------------
    def scan_zip(self, src: ByteSource, member: str | None, base: int | None, depth: int) -> None:
        try:
            zr = ZipReader(src, require_prefix=False)
        except TorchlessError as e:
            # torch.save streams concatenated (DCP items) or a broken archive
            items = list(_split_zips(src))
            if len(items) > 1:
                for off, ln in items:
                    self.scan_bytes(src.view(off, ln), f"{member + ' > ' if member else ''}[{off}:{off + ln}]", None if base is None else base + off, depth + 1)
                return
            self.add("zip-reader-differential", "high", f"zip archive that torch's reader cannot open: {e.message}", member, e.offset)
            self.scan_pickles(src, member, base, depth, strict=False)
            return
        self._scan_zip_reader(zr, member, base, depth)

    def _scan_zip_reader(self, zr: ZipReader, member: str | None, base: int | None, depth: int) -> None:
        pre = f"{member} > " if member else ""
        src = zr.source
        recs = zr.records()
        rel_of = {e.index: r for e, r in zip(zr.entries, recs)}
        lowered = {r.lower() for r in recs}
        torchscript = ("constants.pkl" in lowered) or any(r.lower().startswith("code/") for r in recs)
        is_pt2 = "archive_format" in lowered
        if member is None:
            self.report.kind = "torchscript" if torchscript else ("pt2" if is_pt2 else ("torch-zip" if "data.pkl" in lowered else ("npz" if any(r.endswith(".npy") for r in recs) else "zip")))
        self.zip_structure(zr, member, base)
        # which entry each reader picks for a name
        torch_pick: dict[str, int] = {}
        for e in zr.entries:
            t = zr.lookup(e.name, full=True)
            if t is not None:
                torch_pick[e.name.lower()] = t.index
        code_texts: list[tuple[str, str]] = []
        for e in zr.entries:
            rel = rel_of[e.index]
            loc = f"{pre}{e.name}"
            dup_note = ""
            if len(zr._by_lower.get(e.raw_name.lower(), [])) > 1:
                dup_note = f" (copy #{e.index})"
            loc += dup_note
            if e.flags & 0x1 or e.method not in (0, 8):
                continue  # reported by zip_structure; neither torch nor zipfile reads it as is
            try:
                off = zr.data_offset(e)
            except TorchlessError:
                continue
            fbase = None if base is None or e.method != 0 else base + off
            storage = bool(_STORAGE_RECORD.match(rel))
            if storage or (e.size > (64 << 20) and not rel.endswith(".pkl")):
                # tensor payload: never unpickled by torch; only a nested archive matters
                # (and, for big members that are not storage records, a pickle head)
                peek = bytes(src.view(off, 4)) if e.method == 0 and e.compressed_size >= 4 else b""
                if peek == _ZIP_SIG:
                    self.scan_bytes(zr.read(e), loc, fbase, depth + 1)
                    continue
                if storage or not (peek[:1] == b"\x80" and len(peek) > 1 and peek[1] <= 5):
                    continue
            try:
                data = bytes(zr.read(e, max_size=MAX_MEMBER))
            except TorchlessError as err:
                self.add("limit", "medium", f"member not analysed: {err.message}", loc)
                continue
            if e.crc != (zlib.crc32(data) & 0xFFFFFFFF):
                if e.crc == 0:
                    self.add("zip-crc", "info", "CRC-32 is 0 (written with compute_crc32=False); Python's zipfile refuses to read this member", loc, None, fbase)
                else:
                    self.add("zip-crc", "high", f"CRC-32 mismatch (stored {e.crc:08x}, computed {zlib.crc32(data) & 0xFFFFFFFF:08x}): torch reads this member, Python's zipfile (and scanners built on it) refuses it", loc, None, fbase)
            low = rel.lower()
            if low.startswith("code/") and low.endswith(".py"):
                code_texts.append((loc, data.decode("utf-8", "replace")))
                continue
            if low.endswith(".debug_pkl"):
                # read by torch's C++ unpickler into tuples only; still scanned for globals
                pass
            kind = _sniff(data[:512])
            torch_load = member is None and low == "data.pkl" and not torchscript
            if kind == "pickle" or low.endswith(".pkl") or low.endswith("debug_pkl"):
                self.scan_pickles(BytesSource(data), loc, fbase, depth, strict=True, torch_load=torch_load, torchscript=torchscript)
            elif kind != "other":
                self.scan_bytes(data, loc, fbase, depth + 1)
            elif len(data) <= (1 << 20):
                self.scan_pickles(BytesSource(data), loc, fbase, depth, strict=False, torchscript=torchscript)
        if code_texts:
            self.scan_torchscript_code(code_texts)

    def zip_structure(self, zr: ZipReader, member: str | None, base: int | None) -> None:
        pre = f"{member} > " if member else ""
        src = zr.source
        # duplicates: torch (miniz binary search) vs Python's zipfile (last exact name)
        for lname, dups in zr.duplicates().items():
            t = zr.lookup(dups[0].name, full=True)
            by_exact: dict[bytes, ZipEntry] = {}
            for d in dups:
                by_exact[d.raw_name] = d
            zf = [d.index for d in by_exact.values()]
            names = sorted({d.name for d in dups})
            self.add("zip-duplicate", "high", f"{len(dups)} members named {' / '.join(repr(n) for n in names)} (entries {[d.index for d in dups]}): torch reads entry #{t.index if t else '?'}, Python's zipfile reads entr{'y' if len(zf) == 1 else 'ies'} #{', #'.join(map(str, zf))}; every copy is scanned", pre + dups[0].name, dups[0].header_offset)
        recs = zr.records()
        for e, rel in zip(zr.entries, recs):
            loc = pre + e.name
            if rel != rel.lower() and rel.lower() in _KNOWN_RECORDS and not any(r == rel.lower() for r in recs):
                self.add("zip-case-variant", "high", f"member {e.name!r} is read by torch as {rel.lower()!r} (case-insensitive lookup); tools that look up {rel.lower()!r} exactly do not find it", loc, e.header_offset)
            parts = e.name.replace("\\", "/").split("/")
            if e.name.startswith(("/", "\\")) or ".." in parts or (len(e.name) > 1 and e.name[1] == ":"):
                self.add("path-traversal", "medium", f"member name {e.name!r} escapes the extraction folder", loc, e.header_offset)
            if zr.prefix and not e.name.startswith(zr.prefix + "/") and member is None and e.index > 0:
                self.add("zip-reader-differential", "medium", f"member {e.name!r} is outside the archive folder {zr.prefix!r}: torch's record lookup never finds it, Python's zipfile does", loc, e.header_offset)
            if e.flags & 0x1:
                self.add("zip-flags", "high", "encrypted member: torch refuses it, zipfile needs a password, scanners usually skip it", loc, e.header_offset)
            elif e.flags & ~_OK_FLAGS & 0xFFFF:
                self.add("zip-flags", "low", f"unusual general-purpose flag bits {e.flags:#06x}", loc, e.header_offset)
            if e.method not in (0, 8):
                self.add("zip-flags", "medium", f"compression method {e.method}: torch and zipfile read this member differently (or not at all)", loc, e.header_offset)
            try:
                local = zr.local_name(e)
            except TorchlessError as err:
                self.add("zip-reader-differential", "high", f"local header unreadable: {err.message}", loc, e.header_offset)
                continue
            if local != e.raw_name:
                self.add("zip-name-mismatch", "high", f"local header names {local!r}, central directory {e.raw_name!r}: torch and zipfile use the central name, streaming extractors the local one", loc, e.header_offset)
        # overlaps, among records and with the central directory
        spans = []
        for e in zr.entries:
            try:
                spans.append((e.header_offset, zr.data_offset(e) + e.compressed_size, e.name))
            except TorchlessError:
                continue
        spans.sort()
        for (s1, e1, n1), (s2, _e2, n2) in zip(spans, spans[1:]):
            if s2 < e1:
                self.add("zip-overlap", "high", f"members {n1!r} and {n2!r} overlap (bytes {s2:#x}..{e1:#x}): one payload is read through two names", pre + n2, s2)
        for s, e_, n in spans:
            if e_ > zr.cd_offset:
                self.add("zip-overlap", "high", f"member {n!r} runs into the central directory", pre + n, s)
        # entries beyond the declared count: zipfile walks the directory by size, miniz by count
        try:
            last = zr.entries[-1] if zr.entries else None
            if last is not None:
                nlen, xlen, clen = struct.unpack_from("<HHH", bytes(src.view(last.central_offset + 28, 6)))
                after = last.central_offset + 46 + nlen + xlen + clen
                cd_end = zr.cd_offset + zr.cd_size
                if after + 4 <= cd_end and bytes(src.view(after, 4)) == b"PK\x01\x02":
                    self.add("zip-reader-differential", "high", "the central directory holds more entries than its end record counts: Python's zipfile lists them, torch does not", member, after)
                    self._scan_uncounted(src, after, cd_end, member)
        except (TorchlessError, struct.error):
            pass
        # data before the first record / after the end record
        first = min((e.header_offset for e in zr.entries), default=0)
        if first > 0:
            self.add("polyglot" if member is None else "trailing-data", "high", f"{first} bytes before the first zip record: torch.load reads the head as a pickle stream, zip tools see the archive", member, 0)
        try:
            clen = struct.unpack_from("<H", bytes(src.view(zr.eocd_offset + 20, 2)))[0]
            end = zr.eocd_offset + 22 + clen
            if end < src.size:
                self.add("trailing-data", "medium", f"{src.size - end} bytes after the zip end record", member, end)
        except (TorchlessError, struct.error):
            pass

    def _scan_uncounted(self, src: ByteSource, pos: int, end: int, member: str | None) -> None:
        # entries zipfile would add: scan their data with the local header's sizes
        while pos + 46 <= end and bytes(src.view(pos, 4)) == b"PK\x01\x02":
            f = struct.unpack_from("<4sHHHHHHIIIHHHHHII", bytes(src.view(pos, 46)))
            nlen, xlen, clen, hoff, csize, method = f[10], f[11], f[12], f[16], f[8], f[4]
            name = bytes(src.view(pos + 46, nlen)).decode("utf-8", "replace")
            try:
                lh = struct.unpack_from("<HH", bytes(src.view(hoff + 26, 4)))
                doff = hoff + 30 + lh[0] + lh[1]
                raw = bytes(src.view(doff, csize))
                data = raw if method == 0 else zlib.decompressobj(-15).decompress(raw, MAX_INFLATE)
                self.scan_bytes(data, f"{member + ' > ' if member else ''}{name} (uncounted entry)", None, 1)
            except (TorchlessError, zlib.error, struct.error):
                pass
            pos += 46 + nlen + xlen + clen

    # -- TorchScript code --------------------------------------------------------------
    def scan_torchscript_code(self, texts: list[tuple[str, str]]) -> None:
        for loc, text in texts:
            has_setstate = "def __setstate__" in text
            for m in _TS_RISKY.finditer(text):
                line = text.count("\n", 0, m.start()) + 1
                snippet = text.splitlines()[line - 1].strip()[:120]
                if has_setstate:
                    self.add("torchscript-code", "critical", f"TorchScript code calls {m.group(0).strip()!r} (line {line}: {snippet}) in an archive whose __setstate__ runs at torch.jit.load: file-system or native-code access with no Python global in any pickle", loc, m.start())
                else:
                    self.add("torchscript-code", "high", f"TorchScript code calls {m.group(0).strip()!r} (line {line}: {snippet}): file-system or native-code access when the module runs", loc, m.start())
            if has_setstate and not _TS_RISKY.search(text):
                self.add("torchscript-code", "medium", "TorchScript __setstate__: archive code runs at torch.jit.load time", loc, text.find("def __setstate__"))

    # -- DCP -------------------------------------------------------------------------
    def scan_distcp(self, src: ByteSource) -> None:
        items = _dcp_items_for(self.path)
        size = src.size
        if items is None:
            ranges = list(_split_zips(src))
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

    # -- tar ---------------------------------------------------------------------------
    def scan_tar(self, src: ByteSource, member: str | None, base: int | None, depth: int) -> None:
        pre = f"{member} > " if member else ""
        try:
            tf = tarfile.open(fileobj=SourceFile(src), mode="r:")
            members = tf.getmembers()[:10_000]
        except (tarfile.TarError, EOFError, OSError, ValueError) as e:
            self.add("malformed-pickle", "medium", f"unreadable tar archive: {e}", member)
            self.scan_pickles(src, member, base, depth, strict=False)
            return
        names = {m.name for m in members if m.isfile()}
        legacy = {"storages", "tensors", "pickle"} <= names
        if legacy and member is None:
            self.report.kind = "tar"
        for m in members:
            if not m.isfile():
                continue
            if ".." in m.name.split("/") or m.name.startswith("/"):
                self.add("path-traversal", "medium", f"tar member name {m.name!r} escapes the extraction folder", pre + m.name)
            if m.size <= 0 or m.offset_data + m.size > src.size:
                continue
            data = bytes(src.view(m.offset_data, m.size))
            mb = None if base is None else base + m.offset_data
            if legacy and m.name == "storages":
                self._walk_tar_storages(data, pre + m.name, mb, depth)
            elif legacy and m.name == "tensors":
                self._walk_tar_tensors(data, pre + m.name, mb, depth)
            else:
                self.scan_bytes(data, pre + m.name, mb, depth + 1) if _sniff(data[:512]) not in ("pickle", "other") else self.scan_pickles(BytesSource(data), pre + m.name, mb, depth, strict=(m.name == "pickle"))

    def _walk_tar_storages(self, data: bytes, loc: str, base: int | None, depth: int) -> None:
        res = self.analyse_stream(data, 0, loc, base, depth)
        if res.end is None or type(res.value) is not int:
            return
        pos = res.end
        for _ in range(min(res.value, 1_000_000)):
            r = self.analyse_stream(data, pos, loc, base, depth)
            if r.end is None:
                return
            itemsize = 1
            for g in r.globals:
                short = g.qualname.rsplit(".", 1)[-1]
                if short in STORAGE_NAMES:
                    itemsize = STORAGE_NAMES[short].itemsize
            pos = r.end
            if pos + 8 > len(data):
                return
            (count,) = struct.unpack_from("<q", data, pos)
            pos += 8 + max(0, count) * itemsize
        if pos < len(data):
            self.analyse_stream(data, pos, loc, base, depth)

    def _walk_tar_tensors(self, data: bytes, loc: str, base: int | None, depth: int) -> None:
        res = self.analyse_stream(data, 0, loc, base, depth)
        if res.end is None or type(res.value) is not int:
            return
        pos = res.end
        for _ in range(min(res.value, 1_000_000)):
            r = self.analyse_stream(data, pos, loc, base, depth)
            if r.end is None or r.end + 8 > len(data):
                return
            pos = r.end
            (ndim,) = struct.unpack_from("<i", data, pos)
            if ndim < 0 or ndim > 64:
                return
            pos += 8 + 16 * ndim + 8

    # -- npy / compressed ------------------------------------------------------------
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


def _split_zips(src: ByteSource) -> Iterable[tuple[int, int]]:
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


def _dcp_items_for(path: str) -> list[tuple[int, int]] | None:
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


def scan_file(path: str, unknown_severity: str = "medium") -> FileReport:
    """Scan one file (never raises for bad content)."""
    return Scanner(path, unknown_severity=unknown_severity).run()
