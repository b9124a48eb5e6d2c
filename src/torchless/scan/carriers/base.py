"""The scan engine: findings, the work budget, the entry point and the dispatch by carrier.

:class:`ScanEngine` holds what one file's scan accumulates and runs the carriers
(:class:`.common.Carrier` objects, one per carrier, made by the engine): its dispatch
(:meth:`ScanEngine.scan_source`) takes a byte source in every view a loader could take of
it and hands each view to the carrier that reads it."""

from __future__ import annotations

import hashlib
import os
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, cast

from ...core.errors import TorchlessError
from ...core.findings import Finding
from ...formats.dcp.spec import is_metadata_name
from ...formats.executorch.spec import is_pte
from ...formats.npz_spec import is_npy, is_npz_head
from ...formats.pt.spec import ZIP_MAGIC, opens_as_tar
from ...formats.registry import readers_format
from ...formats.torchscript.spec import is_flatbuffer
from ...io.source import ByteSource, BytesSource, MmapSource, open_source
from ...io.store import store_for
from ..budget import BUDGET_NAMES, Budget
from ..findings import FileReport
from .common import MAX_DEPTH, C, Carrier
from .compressed import CompressedCarrier
from .dcp import DcpCarrier
from .nested import NestedCarrier
from .numpy import NumpyCarrier
from .onnx import OnnxCarrier
from .pickles import PickleCarrier
from .recognize import MODEL_SUFFIXES, compressor_of, probe_pickle
from .tar import TarCarrier
from .zips import ZipCarrier

if TYPE_CHECKING:
    from ...io.store import Store

__all__ = ["ScanEngine", "Budget", "MAX_FINDINGS"]

MAX_FINDINGS = 2000  # findings kept per file; more are counted in one note


class ScanEngine:
    """Scan one file; findings accumulate in :attr:`report`.

    Args:
        path: the file.
        unknown_severity: severity of ``unknown-global`` findings.
        root: the folder being scanned (links that leave it are not followed).
        coverage: list what was analysed (:attr:`FileReport.coverage`).
        store: the store holding ``path``, as the scan's entry resolved it (the walk of
            :func:`torchless.scan.scan` hands each file its location's store); None: an
            engine made directly of a path, whose store is resolved here, once. Kept as
            :attr:`store`.

    The carriers it runs are attributes (:attr:`pickles`, :attr:`nested`, :attr:`zips`,
    :attr:`tar`, :attr:`dcp`, :attr:`numpy`, :attr:`onnx`, :attr:`compressed`); each can
    also be made on an engine and run alone.
    """

    def __init__(
        self,
        path: str,
        *,
        unknown_severity: str = "medium",
        root: str | None = None,
        coverage: bool = False,
        store: Store | None = None,
    ) -> None:
        self.path = os.fspath(path)
        self.store: Store = store if store is not None else store_for(self.path)
        self.root = root  # the folder being scanned: sibling files are never read outside it
        self.unknown_severity = unknown_severity
        self.report = FileReport(self.path, coverage=[] if coverage else None)
        self._covered: set[tuple[Any, ...]] = set()
        self._seen: set[tuple[str, int, str]] = set()
        self._dropped = 0
        self._kinds: set[tuple[str, str]] = set()
        self.budget = Budget(0)
        # a serial number per source seen (see source_key); weak: a source's bytes are not kept
        self._sources: weakref.WeakKeyDictionary[ByteSource, int] = weakref.WeakKeyDictionary()
        self._next_source = 0
        self.loader_ctx: str | None = None  # the loader of the carrier being walked (Finding.loader)
        # the carriers: each reads one kind of carrier and hands what it holds back to
        # scan_source. They refer back to the engine weakly: an engine and its carriers are
        # no reference cycle, so a finished scan leaves nothing to the garbage collector
        me = cast("ScanEngine", weakref.proxy(self))
        self.pickles = PickleCarrier(me)
        self.nested = NestedCarrier(me)
        self.zips = ZipCarrier(me)
        self.tar = TarCarrier(me)
        self.dcp = DcpCarrier(me)
        self.numpy = NumpyCarrier(me)
        self.onnx = OnnxCarrier(me)
        self.compressed = CompressedCarrier(me)
        self._carriers: dict[type[Carrier], Carrier] = {
            type(c): c for c in (self.pickles, self.nested, self.zips, self.tar, self.dcp, self.numpy, self.onnx, self.compressed)
        }

    def carrier(self, kind: type[C]) -> C:
        """This engine's carrier of class ``kind`` (made on first use for a class the engine
        does not make itself)."""
        c = self._carriers.get(kind)
        if c is None:
            c = self._carriers[kind] = kind(cast("ScanEngine", weakref.proxy(self)))
        return cast(C, c)

    def source_key(self, src: ByteSource) -> int:
        """A number for ``src`` that no other source of this scan gets (keys of
        :meth:`Budget.once`): ``id(src)`` is not one, since a source freed after its walk
        (a DCP item, a nested payload) leaves its id to the next, and the next would then
        be skipped as "already analysed", as the allocator decides (a report that changed
        from run to run)."""
        n = self._sources.get(src)
        if n is None:
            self._next_source += 1
            n = self._sources[src] = self._next_source
        return n

    @contextmanager
    def loading(self, loader: str | None) -> Iterator[None]:
        """Findings added inside name ``loader`` unless they name one themselves."""
        saved = self.loader_ctx
        if loader is not None:
            self.loader_ctx = loader
        try:
            yield
        finally:
            self.loader_ctx = saved

    # -- findings ----------------------------------------------------------------------
    def add(
        self,
        rule: str,
        severity: str,
        message: str,
        member: str | None = None,
        offset: int | None = None,
        file_offset: int | None = None,
        global_name: str | None = None,
        disassembly: list[str] | None = None,
        loader: str | None = None,
    ) -> None:
        loader = loader or self.loader_ctx
        key = (rule + message, offset or 0, member or "")
        if key in self._seen:
            return
        self._seen.add(key)
        if len(self.report.findings) >= MAX_FINDINGS and (severity == "info" or (rule, severity) in self._kinds):
            self._dropped += 1  # the first finding of each rule and severity is always kept
            return
        self._kinds.add((rule, severity))
        self.report.findings.append(
            Finding(rule, severity, message, self.path, member, offset, file_offset, global_name, disassembly or [], loader)
        )

    def covered(self, what: str, member: str | None, data: bytes | str, offset: int | None = None, finished: bool = True) -> None:
        """List what was analysed (``scan(..., coverage=True)``; see :attr:`FileReport.coverage`):
        a pickle stream's exact bytes, first opcode through STOP, or a source text."""
        if self.report.coverage is None:
            return
        raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else bytes(data)
        entry: dict[str, Any] = {"what": what, "member": member}
        if what == "pickle":
            entry |= {"offset": offset, "finished": finished}
        entry |= {"length": len(raw), "sha256": hashlib.sha256(raw).hexdigest()}
        key = tuple(entry.values())
        if key not in self._covered:  # a stream analysed in several views is listed once
            self._covered.add(key)
            self.report.coverage.append(entry)

    def spend(self, what: str, n: int, member: str | None, doing: str, loader: str | None = None) -> bool:
        """Draw from the scan's budget; on exhaustion report a ``limit`` finding, return False."""
        if self.budget.take(what, n):
            return True
        self.add(
            "limit",
            "high",
            self.budget_message(self.budget.exhausted or what, doing),
            member,
            loader=loader,
        )
        return False

    def budget_message(self, what: str, doing: str) -> str:
        """The ``limit`` finding's message for budget ``what`` (a name of :data:`BUDGET_NAMES`)."""
        if what == "seconds":
            return (
                f"timeout: the scan's wall-clock watchdog ({self.budget.watchdog:.0f} s) fired while {doing}; the rest "
                "was not analysed (no work budget ran out: the machine was too slow, or some work is not counted)"
            )
        return f"the scan's work budget ({BUDGET_NAMES.get(what, what)}) ran out while {doing}; the rest was not analysed"

    # -- entry -------------------------------------------------------------------------
    def run(self) -> FileReport:
        t0 = time.perf_counter()
        remote = self.store.remote
        if self.root is not None and not remote:
            real, home = os.path.realpath(self.path), os.path.realpath(self.root)
            if os.path.commonpath([real, home]) != home:
                if self.dcp.dcp_items(None) is not None:  # a DCP item: reported with dcp.load named
                    self.report.kind = "distcp"
                    return self.report
                self.add(
                    "link-escape",
                    "high",
                    f"a symbolic link to {real}, outside the scanned folder: loaders read that file; the scanner "
                    "does not follow links out of the folder (scan the target itself if you trust it)",
                )
                self.add("unanalysable", "high", "what the link reaches is read by any loader of the folder and was not analysed")
                self.report.kind = "link"
                return self.report
        try:
            src = MmapSource(self.path) if not remote else open_source(self.path)
        except (TorchlessError, OSError) as e:
            self.report.error = str(e)
            self.add("unreadable", "high", f"cannot read the file: {e}")
            return self.report
        self.budget = Budget(src.size)
        try:
            from ..cache import scan_if_cache

            items = self.dcp.dcp_items(src)
            if is_metadata_name(os.path.basename(self.path)):
                self.dcp.check_dcp_metadata()
            if scan_if_cache(self, src):  # a TORCHINDUCTOR_CACHE_DIR entry: judged as torch.compile loads it
                pass
            elif not remote and self.path.endswith((".json", ".py")):
                from ..remote_code import scan_if_remote_code

                scan_if_remote_code(self)  # Hugging Face remote code named by a config, or a .py beside a model
                self.scan_source(src, None, 0, 0, toplevel=True, context="file")
            elif items is not None or self.path.endswith(".distcp"):
                self.report.kind = "distcp"
                self.dcp.scan_distcp(src, items)
            else:
                self.scan_source(src, None, 0, 0, toplevel=True, context="file")
        except TorchlessError as e:  # a carrier we could not walk: say so, never crash
            self.add("malformed-pickle" if "pickle" in str(e) else "limit", "high", f"scan stopped: {e}", e.member, e.offset)
        except (RecursionError, MemoryError) as e:
            self.add("limit", "high", f"scan stopped: {type(e).__name__}")
        except Exception as e:  # pragma: no cover - a scanner bug must not hide the file
            self.report.error = f"internal error: {type(e).__name__}: {e}"
            self.add("unreadable", "high", f"the scan failed on this file ({type(e).__name__}: {e}); treat it as unscanned")
        finally:
            src.close()
        if self._dropped:
            self.add("limit", "info", f"{self._dropped} more findings not listed (at most {MAX_FINDINGS} per file)")
        self.report.seconds = time.perf_counter() - t0
        return self.report

    # -- dispatch ----------------------------------------------------------------------
    def scan_source(
        self,
        src: ByteSource,
        member: str | None,
        base: int | None,
        depth: int,
        *,
        toplevel: bool = False,
        context: str = "member",
        loader: str | None = None,
    ) -> None:
        """Every view a loader could take of ``src``.

        ``context``: ``file`` (a file on disk: torch.load also tries ``tarfile``),
        ``memory`` (bytes a loader reads from memory: nested payloads, DCP items,
        inflated data) or ``member`` (an archive member; loaded only by name).
        ``loader``: the loader known to deserialise these bytes (nested payloads).
        """
        with self.loading(loader):
            self._scan_source(src, member, base, depth, toplevel=toplevel, context=context, loader=loader)

    def _scan_source(
        self,
        src: ByteSource,
        member: str | None,
        base: int | None,
        depth: int,
        *,
        toplevel: bool,
        context: str,
        loader: str | None,
    ) -> None:
        if depth > MAX_DEPTH:
            self.add("limit", "high", f"carriers nested more than {MAX_DEPTH} deep; not analysed further", member, loader=loader)
            return
        if not self.spend("nodes", 1, member, "visiting carriers"):
            return
        if src.size == 0:
            if toplevel or loader:
                self.add("unrecognized", "info", "empty: every loader raises before executing anything", member, loader=loader)
            return
        head = src.read_at(0, min(src.size, 512))
        kinds: list[str] = []
        if head[:4] == ZIP_MAGIC:
            kinds.append("zip")
            self.zips.scan_zip(src, member, base, depth)
        if is_npz_head(head):
            kinds.append("npz")
            self.numpy.scan_npz(src, member, base, depth)
        if is_npy(head):
            kinds.append("npy")
            self.numpy.scan_npy(src, member, base, depth)
        comp = compressor_of(head)
        if comp is not None and self.compressed.scan_compressed(src, comp[0], member, depth, who=comp[1]):
            kinds.append(f"{comp[0]}-compressed")
        if is_flatbuffer(head):  # flatbuffer TorchScript module: torch.jit.load reads it by content
            from ..torchscript import report_flatbuffer

            kinds.append("torchscript-flatbuffer")
            report_flatbuffer(self, bytes(src.view(0, src.size)), member)
        if context == "file" and member is None and self.onnx.onnx_view(src, head):
            kinds.append("onnx")
            self.onnx.scan_onnx(src, member)
        if is_pte(head):  # ExecuTorch program: a flatbuffer, no pickle
            from ...formats.executorch.spec import program_view
            from ..executorch import report_pte

            kinds.append("executorch")
            report_pte(self, program_view(src)[0], member)  # the program: a remote file's segments stay there
        if context == "file" and opens_as_tar(src):
            kinds.append("tar")
            self.tar.scan_tar(src, member, base, depth)
        # what the readers call it (their own sniffers: one place per format's magic), where
        # the walkers named nothing more exact than a zip or a compressed stream: a
        # safetensors file whose header length starts with b"\x78" is a joblib zlib
        # look-alike, not a zlib file; a .pt2 of torch 2.5 is a pt2, not a plain zip
        fmt = None
        if toplevel and member is None and (self.report.kind in ("unknown", "zip") or self.report.kind.endswith("-compressed")):
            fmt = readers_format(src, self.path)
            if fmt == "joblib":  # a pickle, maybe compressed: the carriers' name (zlib-compressed) says more
                fmt = None
        # the pickle view: pickle.load, torch.load's legacy stream, numpy's and joblib's fallbacks
        if fmt is not None and not all(k in ("zip", "npz") or k.endswith("-compressed") for k in kinds):
            fmt = None  # a carrier of its own (a flatbuffer TorchScript, ONNX...) named it already
            # (every zip is also taken in numpy's view: "npz" there is a view, a real one names the report)
        if not self.spend("probes", 1, member, "asking the real unpicklers about carriers"):
            if fmt is not None:
                self.report.kind = fmt
            return
        probe = probe_pickle(src, py_limit=max(0, self.budget.ops))
        self.budget.ops -= probe.py_cost // 4  # the pure-Python probe's work, roughly (C runs far faster)
        if probe.timeout:  # the engine's watchdog, a last resort: said as such, never silent
            self.add(
                "unanalysable",
                "high",
                f"timeout: {probe.detail} (the engine child's wall-clock watchdog, a last resort no work budget "
                "should reach); the bytes are analysed as a pickle, but the real unpicklers' view of them is missing",
                member,
                loader=loader,
            )
        if not probe.inert:
            if not kinds or probe.outcome == "resolves":
                kinds.insert(0, "pickle")
            with self.loading(self.loader_ctx or ("torch.load(weights_only=False)" if probe.legacy else "pickle.load")):
                self.pickles.scan_pickles(src, member, base, depth, strict=True)
        elif not kinds and fmt is None:
            self.unrecognized(src, member, probe.detail, toplevel=toplevel, loader=loader)
        if fmt is not None and "pickle" not in kinds:  # (a stream that imports: called a pickle)
            self.report.kind = fmt
        elif toplevel and self.report.kind == "unknown":  # walkers name what they found more exactly
            self.report.kind = kinds[0] if kinds else "unrecognized"
        if (toplevel or depth == 0) and "zip" not in kinds:
            self.zips.check_polyglot(src, member, depth)

    def unrecognized(self, src: ByteSource, member: str | None, why: str, *, toplevel: bool, loader: str | None) -> None:
        """Bytes no carrier recognises and from which no loader imports anything."""
        name = (member or os.path.basename(self.path)).lower()
        claims = name.endswith(MODEL_SUFFIXES) or name.rsplit(" > ", 1)[-1].endswith(MODEL_SUFFIXES)
        what = "no pickle-based carrier (no zip, tar, .npy or compressed stream that a loader opens, and no pickle it would run)"
        if claims and (toplevel or member is not None) and not loader:
            self.add(
                "unrecognized",
                "high",
                f"{what}, yet its name says it is one; the real unpicklers stop before importing anything "
                f"({why}), but a loader or version the scanner does not model could read it differently",
                member,
                loader="pickle.load",
            )
        elif toplevel or loader:  # archive members no loader unpickles by name need no note
            self.add(
                "unrecognized",
                "info",
                f"{what}; no supported loader executes anything from it: the "
                f"real unpicklers stop before importing anything ({why})",
                member,
                loader=loader or "pickle.load",
            )

    def scan_bytes(
        self, data: Any, member: str | None, base: int | None, depth: int, *, context: str = "member", loader: str | None = None
    ) -> None:
        """Scan bytes or a zero-copy memoryview (item of a .distcp, nested archive ...)."""
        self.scan_source(BytesSource(data, member or self.path), member, base, depth, context=context, loader=loader)
