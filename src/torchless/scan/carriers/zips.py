"""Zip archives read with torch's rules; polyglots; TorchScript code."""

from __future__ import annotations

import struct
import zlib

from ...container.differentials import zip_differentials
from ...container.zip import CENTRAL_SIG, LOC64_SIG, ZipEntry, ZipReader
from ...container.zip import EOCD_SIG as _EOCD_SIG
from ...container.zip import LOCAL_SIG as _ZIP_SIG
from ...core.errors import TorchlessError
from ...formats.aoti.spec import AOTINDUCTOR_DIR
from ...formats.npz_spec import NPY_SUFFIX, is_npy
from ...formats.package.spec import is_package_records
from ...formats.pt.spec import DATA_PKL
from ...formats.pt2.spec import TORCH_LOAD, is_pt2_records, is_torch_loaded, unpickled_payloads
from ...formats.torchscript import spec as ts_spec
from ...io.source import ByteSource, BytesSource
from .common import _KNOWN_RECORDS, _OK_FLAGS, MAX_MEMBER, Carrier, _is_storage_record, walks
from .dcp import split_zips as _split_zips
from .package import report_packaged_code
from .pickles import PickleCarrier

__all__ = ["ZipCarrier"]


def _head(zr: ZipReader, e: ZipEntry, n: int = 16) -> bytes:
    """The first ``n`` bytes of a member, inflating only what is needed."""
    try:
        off = zr.data_offset(e)
        if e.method == 0:
            return bytes(zr.source.view(off, min(n, e.compressed_size)))
        raw = zr.source.view(off, min(e.compressed_size, 1 << 16))
        return zlib.decompressobj(-15).decompress(raw, n)
    except (TorchlessError, zlib.error):
        return b""


class ZipCarrier(Carrier):
    """A carrier run by the scan engine (:class:`~torchless.scan.carriers.base.ScanEngine`): zip archives (torch zips,
    TorchScript, ``.pt2``, ``.npz``), archives appended to other bytes, TorchScript code."""

    # -- polyglots ---------------------------------------------------------------------
    @walks("torch.load(weights_only=False)")
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
            if pos >= 20 and tail[pos - 20 : pos - 16] == LOC64_SIG:
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
        self.engine.add(
            "polyglot",
            "high",
            "the file does not start as a zip, so torch.load reads it as a legacy pickle stream, but it ends with a "
            f"zip archive ({len(zr.entries)} members from offset {first:#x}) that zip-based tools read instead",
            member,
            first,
        )
        self._scan_zip_reader(zr, f"{member + ' > ' if member else ''}appended zip @ {first:#x}", delta, depth + 1)

    # -- zip ---------------------------------------------------------------------------
    @walks("torch.load(weights_only=False)")
    def scan_zip(self, src: ByteSource, member: str | None, base: int | None, depth: int) -> None:
        try:
            zr = ZipReader(src, require_prefix=False)
        except TorchlessError as e:
            # torch.save streams concatenated (DCP items) or a broken archive
            items = list(_split_zips(src))
            if len(items) > 1:
                for off, ln in items:
                    self.engine.scan_bytes(
                        src.view(off, ln),
                        f"{member + ' > ' if member else ''}[{off}:{off + ln}]",
                        None if base is None else base + off,
                        depth + 1,
                    )
                return
            # torch.load raises on it (the pickle view of the same bytes is decided by the
            # real unpicklers in scan_source)
            self.engine.add(
                "zip-reader-differential", "high", f"zip archive that torch's reader cannot open: {e.message}", member, e.offset
            )
            return
        self._scan_zip_reader(zr, member, base, depth)

    def _scan_zip_reader(self, zr: ZipReader, member: str | None, base: int | None, depth: int) -> None:
        recs = zr.records()
        lowered = {r.lower() for r in recs}
        torchscript = ts_spec.may_be_torchscript(recs)
        is_pt2 = is_pt2_records(recs)
        package = is_package_records(recs) and DATA_PKL not in lowered  # torch.package
        if member is None:
            self.engine.report.kind = (
                "torch-package"
                if package
                else "torchscript"
                if torchscript
                else (
                    "pt2"
                    if is_pt2
                    else ("torch-zip" if DATA_PKL in lowered else ("npz" if any(r.endswith(NPY_SUFFIX) for r in recs) else "zip"))
                )
            )
        loader = (
            "torch.package.PackageImporter"
            if package
            else "torch.jit.load"
            if torchscript
            else ("torch.export.load" if is_pt2 else "torch.load(weights_only=False)")
        )
        with self.engine.loading(loader):
            self._scan_zip_members(zr, member, base, depth, torchscript, is_pt2)
            if package:  # every packaged .py is code PackageImporter may run
                report_packaged_code(self.engine, zr, member)

    def _scan_zip_members(
        self, zr: ZipReader, member: str | None, base: int | None, depth: int, torchscript: bool, is_pt2: bool
    ) -> None:
        pre = f"{member} > " if member else ""
        src = zr.source
        recs = zr.records()
        rel_of = {e.index: r for e, r in zip(zr.entries, recs, strict=False)}
        self.zip_structure(zr, member, base)
        # which entry each reader picks for a name
        torch_pick: dict[str, int] = {}
        for e in zr.entries:
            t = zr.lookup(e.name, full=True)
            if t is not None:
                torch_pick[e.name.lower()] = t.index
        code_texts: list[tuple[str, str]] = []
        bytecode: list[tuple[str, bytes]] = []
        unpickled = self._pt2_unpickled(zr, recs) if is_pt2 else {}
        for e in zr.entries:
            rel = rel_of[e.index]
            loc = f"{pre}{e.name}"
            dup_note = ""
            if e.raw_name.lower() in zr._dups:
                dup_note = f" (copy #{e.index})"
            loc += dup_note
            if e.flags & 0x1 or e.method not in (0, 8):
                continue  # reported by zip_structure; neither torch nor zipfile reads it as is
            try:
                off = zr.data_offset(e)
            except TorchlessError:
                continue
            fbase = None if base is None or e.method != 0 else base + off
            storage = _is_storage_record(rel)
            how = unpickled.get(e.index)
            if how is None and (storage or (e.size > (64 << 20) and not rel.endswith(".pkl"))):
                # tensor payload: never unpickled by torch; only a nested archive matters
                # (and, for big members that are not storage records, a pickle head)
                peek = bytes(src.view(off, 4)) if e.method == 0 and e.compressed_size >= 4 else b""
                if storage and is_torch_loaded(rel):
                    # torch.load()ed by torch.export.load / the AOTI loader: any pickle
                    # or archive head is analysed, stored or deflated
                    peek = _head(zr, e)
                    if peek[:4] == _ZIP_SIG or (peek[:1] == b"\x80" and len(peek) > 1 and peek[1] <= 5):
                        self.engine.scan_bytes(zr.read(e, max_size=MAX_MEMBER), loc, fbase, depth + 1)
                        continue
                if peek == _ZIP_SIG:
                    self.engine.scan_bytes(zr.read(e), loc, fbase, depth + 1)
                    continue
                if storage or not (peek[:1] == b"\x80" and len(peek) > 1 and peek[1] <= 5):
                    continue
            if not self.engine.budget.once(("zip-member", self.engine.source_key(src), off, e.compressed_size, e.method)):
                continue  # the same bytes under another entry: analysed once (overlaps are reported)
            if e.method != 0 and not self.engine.spend("inflate", e.size, loc, "inflating zip members"):
                return
            try:
                data = bytes(zr.read(e, max_size=MAX_MEMBER))
            except TorchlessError as err:
                self.engine.add(
                    "limit", "high", f"member not analysed: {err.message}", loc, loader="torch.load(weights_only=False)"
                )
                continue
            if e.crc != (zlib.crc32(data) & 0xFFFFFFFF):
                if e.crc == 0:
                    self.engine.add(
                        "zip-crc",
                        "info",
                        "CRC-32 is 0 (written with compute_crc32=False); Python's zipfile refuses to read this member",
                        loc,
                        None,
                        fbase,
                    )
                else:
                    self.engine.add(
                        "zip-crc",
                        "high",
                        f"CRC-32 mismatch (stored {e.crc:08x}, computed {zlib.crc32(data) & 0xFFFFFFFF:08x}): "
                        "torch reads this member, Python's zipfile (and scanners built on it) refuses it",
                        loc,
                        None,
                        fbase,
                    )
            low = rel.lower()
            kind = ts_spec.classify_record(rel)  # code / pickle (.pkl, .debug_pkl: by name) / other
            if kind == "code":
                code_texts.append((loc, data.decode("utf-8", "replace")))
                continue
            # a .debug_pkl is read by torch's C++ unpickler into tuples only; still scanned for globals
            if torchscript and low in (ts_spec.BYTECODE_PKL, ts_spec.CONSTANTS_PKL):
                bytecode.append((loc, data))
            torch_load = member is None and low == DATA_PKL and not torchscript
            if how is not None:
                # torch.export.load unpickles this record (its config says so): analysed as
                # its loader reads it, whatever its first bytes (protocol 0/1 have no PROTO)
                if how == TORCH_LOAD and data[:4] == _ZIP_SIG:
                    self.engine.scan_bytes(data, loc, fbase, depth + 1)  # torch.load of a torch.save archive
                else:  # torch.load's legacy stream, pickle.loads, torch's C++ unpickler
                    self.engine.carrier(PickleCarrier).scan_pickles(
                        BytesSource(data), f"{loc} ({how})", fbase, depth, strict=True
                    )
                continue
            if is_npy(data):
                continue  # only numpy.load reads .npy members, through zipfile: scan_npz
            if kind == "pickle":
                # records torch unpickles by name, whatever their first bytes
                self.engine.carrier(PickleCarrier).scan_pickles(
                    BytesSource(data), loc, fbase, depth, strict=True, torch_load=torch_load, torchscript=torchscript
                )
            else:
                # any other member: every carrier it could be, and the pickle view decided
                # by the real unpicklers (never skipped because it "does not look like" one)
                self.engine.scan_bytes(data, loc, fbase, depth + 1)
        if code_texts or bytecode:
            self.scan_torchscript_code(code_texts, bytecode)
        if is_pt2 or any(r.startswith(AOTINDUCTOR_DIR) for r in recs):
            from ..aoti import report_aoti

            report_aoti(self.engine, zr, member)

    def _pt2_unpickled(self, zr: ZipReader, recs: list[str]) -> dict[int, str]:
        """Entry index -> loader of every record ``torch.export.load`` unpickles, decided
        from the archive's configs as torch decides (:func:`~torchless.formats.pt2.spec.unpickled_payloads`)."""

        def read(rec: str) -> bytes | None:
            e = zr.lookup(rec)
            if e is None:
                return None
            try:
                return bytes(zr.read(e, max_size=MAX_MEMBER))
            except TorchlessError:
                return None

        names, unclear = unpickled_payloads(recs, read)
        out: dict[int, str] = {}
        for rec, how in names.items():
            e = zr.lookup(rec)
            if e is not None:
                out[e.index] = how
        if unclear:
            self.engine.add(
                "unanalysable",
                "info",
                f".pt2 payload config(s) in {', '.join(unclear)} not read entry by entry: every record there is analysed "
                "as a pickle torch.export.load may unpickle",
                None,
                loader="torch.export.load",
            )
            for e, rel in zip(zr.entries, recs, strict=False):
                if rel.startswith(tuple(unclear)) and not rel.endswith(".json"):
                    out.setdefault(e.index, TORCH_LOAD)
        return out

    def zip_structure(self, zr: ZipReader, member: str | None, base: int | None) -> None:
        pre = f"{member} > " if member else ""
        src = zr.source
        for p in zip_differentials(src):  # layouts miniz (torch) and zipfile (NumPy) read two ways
            self.engine.add("zip-reader-differential", "high", p.message, pre + p.member if p.member else member, p.offset)
        # duplicates: torch (miniz binary search) vs Python's zipfile (last exact name)
        for dups in zr.duplicates().values():
            t = zr.lookup(dups[0].name, full=True)
            by_exact: dict[bytes, ZipEntry] = {}
            for d in dups:
                by_exact[d.raw_name] = d
            zf = [d.index for d in by_exact.values()]
            names = sorted({d.name for d in dups})
            self.engine.add(
                "zip-duplicate",
                "high",
                f"{len(dups)} members named {' / '.join(repr(n) for n in names)} (entries {[d.index for d in dups]}): "
                f"torch reads entry #{t.index if t else '?'}, Python's zipfile reads "
                f"entr{'y' if len(zf) == 1 else 'ies'} #{', #'.join(map(str, zf))}; every copy is scanned",
                pre + dups[0].name,
                dups[0].header_offset,
            )
        recs = zr.records()
        for e, rel in zip(zr.entries, recs, strict=False):
            loc = pre + e.name
            if rel != rel.lower() and rel.lower() in _KNOWN_RECORDS and not any(r == rel.lower() for r in recs):
                self.engine.add(
                    "zip-case-variant",
                    "high",
                    f"member {e.name!r} is read by torch as {rel.lower()!r} (case-insensitive "
                    f"lookup); tools that look up {rel.lower()!r} exactly do not find it",
                    loc,
                    e.header_offset,
                )
            parts = e.name.replace("\\", "/").split("/")
            if e.name.startswith(("/", "\\")) or ".." in parts or (len(e.name) > 1 and e.name[1] == ":"):
                self.engine.add(
                    "path-traversal", "medium", f"member name {e.name!r} escapes the extraction folder", loc, e.header_offset
                )
            if zr.prefix and not e.name.startswith(zr.prefix + "/") and member is None and e.index > 0:
                self.engine.add(
                    "zip-reader-differential",
                    "medium",
                    f"member {e.name!r} is outside the archive folder {zr.prefix!r}: "
                    "torch's record lookup never finds it, Python's zipfile does",
                    loc,
                    e.header_offset,
                )
            if e.flags & 0x1:
                self.engine.add(
                    "zip-flags",
                    "high",
                    "encrypted member: torch refuses it, zipfile needs a password, scanners usually skip it",
                    loc,
                    e.header_offset,
                )
            elif e.flags & ~_OK_FLAGS & 0xFFFF:
                self.engine.add("zip-flags", "low", f"unusual general-purpose flag bits {e.flags:#06x}", loc, e.header_offset)
            if e.method not in (0, 8):
                self.engine.add(
                    "zip-flags",
                    "medium",
                    f"compression method {e.method}: torch and zipfile read this member differently (or not at all)",
                    loc,
                    e.header_offset,
                )
            try:
                local = zr.local_name(e)
            except TorchlessError as err:
                self.engine.add(
                    "zip-reader-differential", "high", f"local header unreadable: {err.message}", loc, e.header_offset
                )
                continue
            if local != e.raw_name:
                self.engine.add(
                    "zip-name-mismatch",
                    "high",
                    f"local header names {local!r}, central directory {e.raw_name!r}: torch and "
                    "zipfile use the central name, streaming extractors the local one",
                    loc,
                    e.header_offset,
                )
        # overlaps, among records and with the central directory
        spans = []
        for e in zr.entries:
            try:
                spans.append((e.header_offset, zr.data_offset(e) + e.compressed_size, e.name))
            except TorchlessError:
                continue
        spans.sort()
        for (_s1, e1, n1), (s2, _e2, n2) in zip(spans, spans[1:], strict=False):
            if s2 < e1:
                self.engine.add(
                    "zip-overlap",
                    "high",
                    f"members {n1!r} and {n2!r} overlap (bytes {s2:#x}..{e1:#x}): one payload is read through two names",
                    pre + n2,
                    s2,
                )
        for s, e_, n in spans:
            if e_ > zr.cd_offset:
                self.engine.add("zip-overlap", "high", f"member {n!r} runs into the central directory", pre + n, s)
        # entries beyond the declared count: zipfile walks the directory by size, miniz by count
        try:
            last = zr.entries[-1] if zr.entries else None
            if last is not None:
                nlen, xlen, clen = struct.unpack_from("<HHH", bytes(src.view(last.central_offset + 28, 6)))
                after = last.central_offset + 46 + nlen + xlen + clen
                cd_end = zr.cd_offset + zr.cd_size
                if after + 4 <= cd_end and bytes(src.view(after, 4)) == CENTRAL_SIG:
                    self.engine.add(
                        "zip-reader-differential",
                        "high",
                        "the central directory holds more entries than its end record "
                        "counts: Python's zipfile lists them, torch does not",
                        member,
                        after,
                    )
                    self._scan_uncounted(src, after, cd_end, member)
        except (TorchlessError, struct.error):
            pass
        # data before the first record / after the end record
        first = min((e.header_offset for e in zr.entries), default=0)
        if first > 0:
            self.engine.add(
                "polyglot" if member is None else "trailing-data",
                "high",
                f"{first} bytes before the first zip record: torch.load reads "
                "the head as a pickle stream, zip tools see the archive",
                member,
                0,
            )
        try:
            clen = struct.unpack_from("<H", bytes(src.view(zr.eocd_offset + 20, 2)))[0]
            end = zr.eocd_offset + 22 + clen
            if end < src.size:
                self.engine.add("trailing-data", "medium", f"{src.size - end} bytes after the zip end record", member, end)
        except (TorchlessError, struct.error):
            pass

    def _scan_uncounted(self, src: ByteSource, pos: int, end: int, member: str | None) -> None:
        # entries zipfile would add: scan their data with the local header's sizes
        while (
            pos + 46 <= end
            and bytes(src.view(pos, 4)) == CENTRAL_SIG
            and self.engine.spend("nodes", 1, member, "visiting uncounted zip entries")
        ):
            f = struct.unpack_from("<4sHHHHHHIIIHHHHHII", bytes(src.view(pos, 46)))
            nlen, xlen, clen, hoff, csize, method = f[10], f[11], f[12], f[16], f[8], f[4]
            name = bytes(src.view(pos + 46, nlen)).decode("utf-8", "replace")
            try:
                lh = struct.unpack_from("<HH", bytes(src.view(hoff + 26, 4)))
                doff = hoff + 30 + lh[0] + lh[1]
                raw = bytes(src.view(doff, csize))
                data = raw if method == 0 else zlib.decompressobj(-15).decompress(raw, max(0, self.engine.budget.inflate) + 1)
                if method != 0 and not self.engine.spend("inflate", len(data), member, "inflating uncounted zip entries"):
                    return
                self.engine.scan_bytes(data, f"{member + ' > ' if member else ''}{name} (uncounted entry)", None, 1)
            except (TorchlessError, zlib.error, struct.error):
                pass
            pos += 46 + nlen + xlen + clen

    # -- TorchScript code --------------------------------------------------------------
    def scan_torchscript_code(self, texts: list[tuple[str, str]], bytecode: list[tuple[str, bytes]] | None = None) -> None:
        """TorchScript code and bytecode operator tables (:mod:`torchless.scan.torchscript`)."""
        from ..torchscript import report_archive

        report_archive(self.engine, texts, bytecode or [])
