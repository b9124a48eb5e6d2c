"""Distributed checkpoints, read as ``dcp.load`` reads them.

``FileSystemReader.read_data`` opens ``checkpoint_dir / relative_path`` for every
``_StorageInfo`` of the ``.metadata`` pickle's ``storage_data`` and ``torch.load``s exactly
``[offset, offset + length)`` of it (an in-memory slice: zip or pickle, never tar;
``weights_only=False`` for byte items). So an item file is recognised by the metadata
that names it, whatever its name, and each range is scanned on its own; bytes no range
covers are scanned and flagged; ranges stored through transforms are ``unanalysable``.
Item paths and symlinks that leave the checkpoint folder are ``link-escape`` and are not
followed.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterable
from typing import Any

from ...container.zip import EOCD_SIG as _EOCD_SIG
from ...container.zip import LOCAL_SIG as _ZIP_SIG
from ...core.errors import TorchlessError
from ...formats.dcp.spec import STORAGE_INFO_NAME, is_metadata_name, storage_info_location
from ...formats.safetensors_spec import is_safetensors_head, parse_header
from ...io.paths import within
from ...io.source import ByteSource, BytesSource
from ..analysis import Sym, analyse, describe
from .common import Carrier, walks

__all__ = ["DcpCarrier", "split_zips"]

_DCP = "torch.distributed.checkpoint.load"


class DcpCarrier(Carrier):
    """A carrier run by the scan engine (:class:`~torchless.scan.carriers.base.ScanEngine`): DCP item files and ``.metadata``."""

    def dcp_items(self, src: ByteSource | None) -> list[tuple[int, int]] | None:
        """Byte ranges ``dcp.load`` reads from this file, from every ``.metadata`` in its
        folder or the folders above it (within the scanned folder) whose ``storage_data``
        names it, *whatever the file's name*; None when no metadata names it."""
        d = os.path.dirname(os.path.abspath(self.engine.path))
        found: list[tuple[int, int]] | None = None
        for _level in range(4):
            for meta in _metadata_files(d):
                recs = self._storage_records(meta)
                for rp, off, ln, transforms in recs:
                    target = os.path.normpath(os.path.join(d, rp))
                    if target != os.path.normpath(os.path.abspath(self.engine.path)):
                        continue
                    found = found if found is not None else []
                    if transforms:
                        self.engine.add(
                            "unanalysable",
                            "high",
                            f"item [{off}:{off + ln}] is stored through transforms {transforms!r} (named in "
                            f"{os.path.basename(meta)}): dcp.load undoes them before torch.load; the scanner does not",
                            f"[{off}:{off + ln}]",
                            off,
                            loader=_DCP,
                        )
                        continue
                    found.append((off, ln))
            if found is not None or (
                self.engine.root and os.path.normpath(d) == os.path.normpath(os.path.abspath(self.engine.root))
            ):
                break
            parent = os.path.dirname(d)
            if parent == d:
                break
            d = parent
        if found is None and self.engine.path.endswith(".distcp"):
            return None
        if found is not None:
            real = os.path.realpath(self.engine.path)
            home = os.path.realpath(d)
            if os.path.commonpath([real, home]) != home:
                self.engine.add(
                    "link-escape",
                    "high",
                    f"this DCP item file resolves to {real}, outside the checkpoint folder: dcp.load "
                    "reads that file; the scanner does not follow links out of the folder",
                    None,
                    loader=_DCP,
                )
                self.engine.add("unanalysable", "high", "the item bytes behind the link were not analysed", None, loader=_DCP)
                return []
        return found

    def _storage_records(self, meta: str) -> list[tuple[str, int, int, Any]]:
        """(relative_path, offset, length, transform_descriptors) of every ``_StorageInfo``
        (parsed once per process and metadata version: a folder of many items shares it)."""
        try:
            st = os.stat(meta)
        except OSError:
            return []
        key = (os.path.abspath(meta), st.st_mtime_ns, st.st_size)
        # drawn from the budget whether or not an earlier file of this process parsed it:
        # a report must not depend on which files one worker process scanned before
        if not self.engine.spend("pickle", min(st.st_size, _MAX_METADATA), None, "reading DCP metadata", _DCP):
            return []
        hit = _RECORDS.get(key)
        if hit is None:
            hit = _parse_records(meta)
            if len(_RECORDS) > 32:
                _RECORDS.clear()
            _RECORDS[key] = hit
        records, problems = hit
        for p in problems:
            self.engine.add(
                "unanalysable",
                "high",
                f"a _StorageInfo record in {os.path.basename(meta)} that the "
                f"scanner cannot read ({p}): the item it locates is not analysed",
                None,
                loader=_DCP,
            )
        return records

    def check_dcp_metadata(self) -> None:
        """For a ``.metadata`` file: item paths that leave the checkpoint folder."""
        d = os.path.dirname(os.path.abspath(self.engine.path))
        home = os.path.realpath(d)
        for rp, off, ln, _t in self._storage_records(self.engine.path):
            target = os.path.join(d, rp)
            real = os.path.realpath(target)
            if os.path.isabs(rp) or os.path.commonpath([real, home]) != home:
                self.engine.add(
                    "link-escape",
                    "high",
                    f"storage_data names {rp!r} (bytes [{off}:{off + ln}]), which resolves "
                    f"outside the checkpoint folder ({real}): dcp.load reads it there",
                    None,
                    loader=_DCP,
                )
                self.engine.add(
                    "unanalysable",
                    "high",
                    f"the item bytes dcp.load reads from {rp!r} are outside the checkpoint and were not analysed",
                    None,
                    loader=_DCP,
                )

    @walks(_DCP)
    def scan_distcp(self, src: ByteSource, items: list[tuple[int, int]] | None = None) -> None:
        size = src.size
        if items is None:
            ranges = list(split_zips(src))
            if not ranges:
                self.engine.scan_source(src, None, 0, 0, toplevel=True, context="file")
                return
        else:
            ranges = sorted(set(items))
            covered = 0
            for off, ln in _with_safetensors_blob(src, ranges):
                if off < covered:
                    self.engine.add("dcp-layout", "high", f"items overlap at {off:#x}", None, off, loader=_DCP)
                elif off > covered:
                    self.engine.add(
                        "dcp-layout",
                        "high",
                        f"bytes {covered:#x}..{off:#x} belong to no item in .metadata (scanned as a carrier)",
                        None,
                        covered,
                    )
                    self.engine.scan_bytes(
                        src.view(covered, min(off, size) - covered),
                        f"[{covered}:{off}] (unaccounted)",
                        covered,
                        1,
                        context="memory",
                    )
                if off + ln > size:
                    self.engine.add(
                        "dcp-layout", "high", f"item [{off}:{off + ln}] runs past the end of the file", None, off, loader=_DCP
                    )
                covered = max(covered, off + ln)
            if covered < size:
                self.engine.add(
                    "dcp-layout", "high", f"{size - covered} bytes after the last item (scanned as a carrier)", None, covered
                )
                self.engine.scan_bytes(
                    src.view(covered, size - covered), f"[{covered}:{size}] (unaccounted)", covered, 1, context="memory"
                )
        for off, ln in ranges:
            ln = max(0, min(ln, size - off))
            if ln and self.engine.budget.once(("dcp-item", off, ln)):
                # dcp.load: torch.load of exactly this slice (an in-memory reader: no tar)
                self.engine.scan_bytes(src.view(off, ln), f"[{off}:{off + ln}]", off, 1, context="memory", loader=_DCP)


_MAX_METADATA = 1 << 28


def _with_safetensors_blob(src: ByteSource, ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The item ranges for the layout check: with ``SerializationFormat.SAFETENSORS``
    every tensor item of a rank file points at one safetensors blob that runs to the end
    of the file; when that blob parses, it is one item (the tensor items inside it do not
    overlap and nothing trails). The slices are still scanned as dcp.load reads them."""
    starts = sorted({off for off, _ln in ranges})
    for off in starts:
        if off + 9 > src.size or not is_safetensors_head(bytes(src.view(off, 9))):
            continue
        try:
            parse_header(BytesSource(src.view(off, src.size - off)))
        except TorchlessError:
            return ranges
        return sorted([r for r in ranges if r[0] != off] + [(off, src.size - off)])
    return ranges


_RECORDS: dict[tuple[str, int, int], tuple[list[tuple[str, int, int, Any]], list[str]]] = {}


def _parse_records(meta: str) -> tuple[list[tuple[str, int, int, Any]], list[str]]:
    """Every ``_StorageInfo`` of a ``.metadata`` pickle, found in the symbolic result of
    :func:`~torchless.scan.analysis.analyse` (the pickle machine's symbolic mode: nothing
    is resolved, imported or called), with the record's description (class name, fields,
    validity) taken from :mod:`torchless.formats.dcp.spec`.

    Why not the reader (:func:`torchless.formats.dcp.metadata.parse_metadata`): it builds
    the whole ``Metadata`` through an allowlist and refuses the file at the first foreign
    global or malformed record. A hostile ``.metadata`` is exactly what the scanner must
    read further: ``dcp.load``'s plain ``pickle.load`` would run its globals *and* read
    every item it locates, so the item ranges are wanted from a file the reader refuses,
    and each malformed record is reported on its own (``problems``) rather than failing
    the lot. The walk is the scanner's; the layout is the spec's."""
    out: list[tuple[str, int, int, Any]] = []
    problems: list[str] = []
    try:
        with open(meta, "rb") as f:
            data = f.read(_MAX_METADATA)
    except OSError:
        return out, problems
    res = analyse(data)
    if res.budget_hit is not None:  # the records after the stop are not known: say so
        problems.append(f"the metadata pickle stops at {res.error}")
    syms: list[Sym] = []
    _walk_syms(res.value, syms, set())
    for s in syms:
        # any module's class of that name: dcp.load imports whatever the pickle names
        if s.kind == "result" and s.callee is not None and s.callee.qualname.endswith(STORAGE_INFO_NAME):
            st = s.state
            loc = storage_info_location(st)
            if loc is not None:
                out.append((*loc, st.get("transform_descriptors")))
                continue
            problems.append(describe(st))
    return out, problems


def _metadata_files(d: str) -> list[str]:
    try:
        names = sorted(os.listdir(d))
    except OSError:
        return []
    home = os.path.realpath(d)
    # regular files inside the folder only: a link out (to a FIFO, a file elsewhere) is never opened
    return [
        os.path.join(d, n)
        for n in names
        if is_metadata_name(n) and os.path.isfile(os.path.join(d, n)) and within(os.path.realpath(os.path.join(d, n)), home)
    ]


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
