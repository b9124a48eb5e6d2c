"""Pickle streams: raw pickles, several in a row, and the legacy torch stream format."""

from __future__ import annotations

from ...core.errors import TruncatedError
from ...io.source import ByteSource
from ..analysis import CallEvent, StreamResult, Sym, analyse, describe, disassemble, other_readers_go_on
from ..findings import AllowNote
from ..policy import torch_allows
from .common import _HIGHER_ORDER, _WINDOW, LEGACY_MAGIC, Carrier
from .nested import NestedCarrier

_JOBLIB_WRAPPER = "joblib.numpy_pickle.NumpyArrayWrapper"

__all__ = ["PickleCarrier"]


class PickleCarrier(Carrier):
    """A carrier run by the scan engine (:class:`~torchless.scan.carriers.base.ScanEngine`): pickle streams."""

    def analyse_stream(
        self,
        data: bytes,
        start: int,
        member: str | None,
        base: int | None,
        depth: int,
        *,
        torchscript: bool = False,
        report_errors: bool = True,
        torch_load: bool = False,
    ) -> StreamResult:
        res = self.analyse_budgeted(data, start, len(data), member, torchscript=torchscript)
        self.engine.report.streams += 1
        view = None if torchscript else self.joblib_view(res, data, start)
        if view is not None:
            jres, jdata, both = view
            if both:  # pickle.load runs something in the array bytes: that view is reported too
                self.report_stream(res, data, member, base, depth, report_errors=report_errors, torch_load=torch_load)
            self.report_joblib(jres, res, jdata, member, base, depth, report_errors=report_errors, torch_load=torch_load)
            return jres
        self.report_stream(res, data, member, base, depth, report_errors=report_errors, torch_load=torch_load)
        return res

    def joblib_view(
        self, res: StreamResult, data: bytes, start: int, src: ByteSource | None = None
    ) -> tuple[StreamResult, bytes, bool] | None:
        """The stream as ``joblib.load`` reads it: the plain run (``pickle.load``) names
        joblib's NumpyArrayWrapper and stops with an error (or at a STOP before the end of
        the data: array bytes can end it), and the joblib run (array bytes
        skipped, object arrays' pickles run on their own:
        :func:`~torchless.scan.analysis.joblib_array_bytes`) reaches its STOP. Returns that
        run, the bytes it read (the whole source when ``data`` was a window of it) and
        whether the plain run also did something at or after the first array's bytes (then
        both views are reported), or None: the plain run is then reported as it is (fail
        closed: a wrapper the joblib run cannot model stops it with an error)."""
        if res.budget_cut or not any(g.qualname == _JOBLIB_WRAPPER for g in res.globals):
            return None
        finished = res.error is None
        if finished and (res.end is None or res.end >= (src.size if src is not None else len(data))):
            return None  # pickle.load reads it all: joblib.load reads no other bytes as opcodes
        if src is not None and len(data) < src.size:
            if src.size - start > max(0, self.engine.budget.pickle):
                return None
            data = bytes(src.view(0, src.size))
        left = max(0, self.engine.budget.ops)
        jres = analyse(data, start=start, joblib=True, max_ops=left, max_arg_nodes=max(0, self.engine.budget.arg_nodes))
        self.engine.budget.ops -= len(jres.op_offsets) + sum(len(o.op_offsets) for o in jres.objects)
        self.engine.budget.arg_nodes -= jres.arg_nodes
        if jres.error is not None or not jres.skips or jres.end is None:
            return None
        self.engine.budget.pickle -= jres.end - start
        first = jres.skips[0][0]
        both = (
            finished
            or any(g.offset >= first for g in res.globals)
            or any(c.offset >= first for c in res.calls)
            or any(b.offset >= first for b in res.builds)
        )
        return jres, data, both

    def report_joblib(
        self,
        jres: StreamResult,
        plain: StreamResult,
        data: bytes,
        member: str | None,
        base: int | None,
        depth: int,
        *,
        report_errors: bool = True,
        torch_load: bool = False,
    ) -> None:
        """Report a stream by its joblib view (see :meth:`joblib_view`)."""
        first = jres.skips[0][0]
        self.engine.add(
            "nested-loader",
            "info",
            f"followed: joblib file: the bytes of {len(jres.skips)} array(s) follow their NumpyArrayWrapper and are skipped "
            "as joblib.load skips them; pickle.load stops with an error at the first array, having run nothing "
            "beyond what is analysed here",
            member,
            first,
            None if base is None else base + first,
            loader="joblib.load",
        )
        self.report_stream(jres, data, member, base, depth, report_errors=report_errors, torch_load=torch_load, readers=plain)
        for obj in jres.objects:  # the object arrays' pickles, each as joblib's fresh unpickler runs it
            self.engine.add(
                "nested-loader",
                "info",
                f"followed: joblib object array: its dtype holds an object (as NumPy computes it from the dtype's "
                f"state), so joblib.load unpickles the pickle at {obj.start:#x} ({(obj.end or obj.start) - obj.start} bytes) "
                "instead of reading array bytes",
                member,
                obj.start,
                None if base is None else base + obj.start,
                loader="joblib.load",
            )
            self.report_stream(obj, data, member, base, depth, report_errors=report_errors)

    def analyse_budgeted(
        self, buf: bytes, start: int, size: int, member: str | None, *, torchscript: bool = False
    ) -> StreamResult:
        """:func:`analyse` drawing from the scan's pickle budget: a stream is cut where the
        budget ends (a ``limit`` finding), so no input makes the scan run unbounded."""
        left = max(0, self.engine.budget.pickle)
        cut = start + left < len(buf)
        from .. import engine

        record = (  # for the second opinion
            engine.engine_enabled() and len(buf) - start <= engine.ENGINE_MAX_STREAM and self.engine.budget.record_nodes > 0
        )
        ops_left = max(0, self.engine.budget.ops)
        res = analyse(
            buf[: start + left] if cut else buf,
            start=start,
            torchscript=torchscript,
            record=record,
            max_ops=ops_left,
            max_arg_nodes=max(0, self.engine.budget.arg_nodes),
            record_nodes=self.engine.budget.record_nodes,
        )
        self.engine.budget.record_nodes -= res.norm_nodes
        used = (res.end if res.end is not None else (res.op_offsets[-1] + 1 if res.op_offsets else start + 1)) - start
        self.engine.budget.pickle -= max(1, used)
        self.engine.budget.ops -= len(res.op_offsets)
        self.engine.budget.arg_nodes -= res.arg_nodes
        if res.end is None and (cut or res.budget_hit is not None):
            self.engine.spend(res.budget_hit or "pickle", 1, member, "running pickle streams")
            res.budget_cut = True  # a larger window would not help
        return res

    def report_stream(
        self,
        res: StreamResult,
        data: bytes,
        member: str | None,
        base: int | None,
        depth: int,
        *,
        report_errors: bool = True,
        torch_load: bool = False,
        readers: StreamResult | None = None,
    ) -> None:
        """Findings for one analysed stream. ``readers``: the run the other-readers checks
        and the engine's second opinion look at, when ``res`` is the joblib view (the real
        unpicklers read the stream without skipping array bytes)."""
        if self.engine.report.coverage is not None:
            self.engine.covered(
                "pickle", member, data[res.start : res.end if res.end is not None else len(data)], res.start, res.finished
            )

        def fo(off: int | None) -> int | None:
            return None if base is None or off is None else base + off

        def dis(off: int) -> list[str]:
            return disassemble(data, off, res.op_offsets)

        calls_at: dict[int, list[CallEvent]] = {}  # global offset -> its calls (no quadratic scan per global)
        for c in res.calls:
            if c.callee.kind == "global":
                calls_at.setdefault(c.callee.pos, []).append(c)
        for g in res.globals:
            self.engine.report.globals[g.qualname] = g.verdict.verdict
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
                calls = calls_at.get(g.offset, [])
                detail = ""
                if calls:
                    c = calls[0]
                    detail = (
                        f"; {c.opcode} at {c.offset:#x}: "
                        f"{describe(c.callee)}{describe(tuple(c.args) if isinstance(c.args, (tuple, list)) else (c.args,))}"
                    )
                self.engine.add(
                    "dangerous-global",
                    "critical",
                    f"{g.qualname} ({', '.join(how)}): {g.verdict.reason}{detail}",
                    member,
                    g.offset,
                    fo(g.offset),
                    g.qualname,
                    dis(calls[0].offset if calls else g.offset),
                )
            elif g.verdict.verdict == "unknown":
                self.engine.add(
                    "unknown-global",
                    self.engine.unknown_severity,
                    f"{g.qualname} ({', '.join(how)}): {g.verdict.reason}",
                    member,
                    g.offset,
                    fo(g.offset),
                    g.qualname,
                    dis(g.offset),
                )
            if (
                torch_load
                and not torch_allows(g.qualname)
                and g.qualname not in {n.global_name for n in self.engine.report.weights_only}
            ):
                self.engine.report.weights_only.append(AllowNote(g.qualname, g.verdict.verdict, g.verdict.reason))
        for c in res.calls:
            hof = _HIGHER_ORDER.get(c.callee.qualname) if c.callee.kind == "global" else None
            if hof and isinstance(c.args, tuple):
                for i in hof:
                    a = c.args[i] if i < len(c.args) else None
                    if isinstance(a, Sym) and a.kind != "global":
                        self.engine.add(
                            "indirect-call",
                            "critical",
                            f"{c.callee.qualname} calls its argument #{i}, a value computed at load time: {describe(a)}",
                            member,
                            c.offset,
                            fo(c.offset),
                            c.callee.qualname,
                            dis(c.offset),
                        )
            if c.callee.kind != "global":
                what = "a value computed at load time" if c.callee.kind == "result" else "a persistent-load object"
                self.engine.add(
                    "indirect-call",
                    "critical",
                    f"{c.opcode} calls {what}: "
                    f"{describe(c.callee)}{describe(tuple(c.args) if isinstance(c.args, (tuple, list)) else (c.args,))}; "
                    "whatever that value is, the loader calls it",
                    member,
                    c.offset,
                    fo(c.offset),
                    None,
                    dis(c.offset),
                )
        for b in res.builds:
            if b.callee.kind == "global":
                self.engine.add(
                    "global-mutation",
                    "critical",
                    f"BUILD sets state {describe(b.args)} on {b.callee.qualname} itself, not on an instance: "
                    "Python's unpickler setattr()s it on the class or function, changing it for the whole process",
                    member,
                    b.offset,
                    fo(b.offset),
                    b.callee.qualname,
                    dis(b.offset),
                )
        if (
            torch_load
            and res.protocol >= 4
            and "pickle protocol >= 4 (FRAME and other opcodes the weights_only unpickler rejects)"
            not in self.engine.report.weights_only_blockers
        ):
            self.engine.report.weights_only_blockers.append(
                "pickle protocol >= 4 (FRAME and other opcodes the weights_only unpickler rejects)"
            )
        # frames: every FRAME must end where an opcode begins, and the last at STOP's end
        if res.frames:
            starts = set(res.op_offsets)
            skipped = {p for p, _n in res.skips}  # joblib: array bytes written after a frame ends
            end = res.end if res.end is not None else len(data)
            for fpos, flen in res.frames:
                fend = fpos + 9 + flen
                if fend > len(data):
                    self.engine.add(
                        "frame-length",
                        "high",
                        f"FRAME declares {flen} bytes but only {len(data) - fpos - 9} follow",
                        member,
                        fpos,
                        fo(fpos),
                        None,
                        dis(fpos),
                    )
                elif fend != end and fend not in starts and fend not in skipped:
                    self.engine.add(
                        "frame-length",
                        "high",
                        f"FRAME declares {flen} bytes, which ends inside an opcode at "
                        f"{fend:#x}: readers that trust frame lengths see different opcodes",
                        member,
                        fpos,
                        fo(fpos),
                        None,
                        dis(fpos),
                    )
                elif (
                    fend < end
                    and fend in starts
                    and not any(p == fend for p, _ in res.frames)
                    and not _large_unframed(data, fend)
                ):
                    self.engine.add(
                        "frame-length",
                        "high",
                        f"FRAME declares {flen} bytes but opcodes continue outside any frame "
                        f"after {fend:#x}: readers that stop at the frame end miss them",
                        member,
                        fpos,
                        fo(fpos),
                        None,
                        dis(fend),
                    )
        if res.error is not None and report_errors:
            off = res.error.offset
            self.engine.add(
                "malformed-pickle",
                "high",
                "pickle stream stops with an error: "
                f"{res.error.message if hasattr(res.error, 'message') else res.error} (what ran before it is analysed "
                "above)",
                member,
                off,
                fo(off),
                None,
                dis(off) if off is not None else [],
            )
        self.check_other_readers(readers or res, data, member, base, depth, torch_load=torch_load)
        self.engine.carrier(NestedCarrier).follow_nested(res, member, base, depth)

    def check_other_readers(
        self, res: StreamResult, data: bytes, member: str | None, base: int | None, depth: int, *, torch_load: bool = False
    ) -> None:
        """Fail closed where the machine's model (CPython's C unpickler reading memory)
        is not what every loader does: frame layouts that file readers read differently,
        stops that the pure-Python unpickler reads past (``unanalysable``); and, as a
        second opinion, the real C unpickler run on the stream in a resource-limited
        child process, whose record must match the model (``engine-disagreement``)."""
        from .. import differential, engine

        why = other_readers_go_on(res, data)
        off = res.frame_hazards[0][0] if res.frame_hazards else (res.op_offsets[-1] if res.op_offsets else res.start)
        fo = None if base is None else base + off
        if why is not None:
            self.engine.add(
                "unanalysable",
                "high",
                f"pickle stream not fully analysable: {why}",
                member,
                off,
                fo,
                None,
                disassemble(data, off, res.op_offsets),
            )
            if res.error is not None and "FRAME declares" in str(res.error) and not res.short_frames:
                more = analyse(data, start=res.start, short_frames=True)
                more.short_frames = True
                cut = off
                more.globals = [g for g in more.globals if g.offset >= cut]
                more.calls = [c for c in more.calls if c.offset >= cut]
                more.builds = [b for b in more.builds if b.offset >= cut]
                with self.engine.loading("joblib.load"):
                    self.report_stream(more, data, member, base, depth, report_errors=False, torch_load=torch_load)
            return
        # a stream not recorded (larger than the engine takes, or past the scan's
        # record_nodes budget) gets no second opinion: that is not a finding
        if engine.engine_enabled() and not res.budget_cut and not res.short_frames and res.events is not None:
            try:
                diff = differential.second_opinion(data, res.start, res.end, res)
            except engine.EngineTimeout as e:
                self.engine.add(
                    "unanalysable",
                    "high",
                    f"timeout: CPython's unpickler in the engine's child process gave no second opinion on this "
                    f"stream ({e}: its wall-clock watchdog, a last resort no work budget should reach)",
                    member,
                    res.start,
                    None if base is None else base + res.start,
                )
                return
            if diff is not None:
                self.engine.add(
                    "engine-disagreement",
                    "high",
                    f"CPython's unpickler (run inert in a child process) and the scanner's model disagree on this stream: {diff}",
                    member,
                    res.start,
                    None if base is None else base + res.start,
                )

    def scan_pickles(
        self,
        src: ByteSource,
        member: str | None,
        base: int | None,
        depth: int,
        *,
        strict: bool,
        torch_load: bool | None = None,
        torchscript: bool = False,
    ) -> None:
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
                r = self.analyse_budgeted(buf, start, size, member, torchscript=torchscript)
                looks_like_pickle = strict or start > 0 or bool(r.globals) or len(r.op_offsets) > 16
                if (
                    r.end is None
                    and window < size
                    and isinstance(r.error, TruncatedError)
                    and looks_like_pickle
                    and not r.budget_cut
                ):
                    window = min(size, window * 8)
                    continue
                return r, buf

        first, data = run(0)
        run_plain = first
        if (
            not strict
            and first.end is None
            and not any(g.verdict.verdict == "dangerous" for g in first.globals)
            and not first.calls
        ):
            return  # not a pickle: bytes that merely start with an opcode letter
        self.engine.report.streams += 1
        legacy = first.end is not None and type(first.value) is int and first.value == LEGACY_MAGIC
        if legacy and member is None:
            self.engine.report.kind = "legacy"
        pre = f"{member} > " if member else ""

        def label(i: int) -> str | None:
            if legacy:
                return f"{pre}legacy pickle #{i}"
            return member if i == 1 else f"{pre}pickle #{i}"

        view = None if torchscript or legacy else self.joblib_view(first, data, 0, src)
        if view is not None:
            plain_data = data
            first, data = view[0], view[1]
            if view[2]:  # pickle.load runs something in the array bytes: that view is reported too
                self.report_stream(run_plain, plain_data, label(1), base, depth, torch_load=bool(torch_load))
            self.report_joblib(first, run_plain, data, label(1), base, depth, torch_load=bool(torch_load))
        else:
            self.report_stream(
                first, data, label(1), base, depth, torch_load=bool(torch_load) if torch_load is not None else False
            )
        pos = first.end
        if pos is None:
            return
        count = 1
        limit = 5 if legacy else 64
        while pos < size and count < limit:
            res, data = run(pos)
            if not legacy:
                if res.end is None and not res.globals and not res.calls and other_readers_go_on(res, data) is None:
                    self.engine.add(
                        "trailing-data",
                        "medium",
                        f"{size - pos} bytes after the pickle's STOP (not a further pickle)",
                        member,
                        pos,
                        None if base is None else base + pos,
                        None,
                        disassemble(data, pos, None),
                    )
                    return
                self.engine.add(
                    "trailing-data",
                    "high",
                    f"opcodes after STOP: a further pickle starts at {pos:#x} (read by loaders "
                    "that call pickle.load again; most scanners stop at the first STOP)",
                    member,
                    pos,
                    None if base is None else base + pos,
                    None,
                    disassemble(data, pos, res.op_offsets),
                )
            count += 1
            self.engine.report.streams += 1
            self.report_stream(res, data, label(count), base, depth, torch_load=legacy and count == 4)
            if res.end is None:
                return
            pos = res.end
        if not legacy and count >= limit and pos < size:
            self.engine.add(
                "limit",
                "high",
                f"more than {limit} pickles in a row; the bytes from {pos:#x} on were "
                "not analysed (a loader calling pickle.load again would run them)",
                member,
                pos,
                None if base is None else base + pos,
            )
        if legacy and count < 5:
            self.engine.add("malformed-pickle", "medium", f"legacy stream has {count} of its 5 pickles", member, pos)


def _large_unframed(data: bytes, pos: int) -> bool:
    """CPython's picklers write a bytes/str object of 64 KiB or more outside any frame
    (``_Framer.write_large_bytes``): such an opcode right after a frame end is ordinary
    output, read identically by every reader."""
    if pos >= len(data):
        return False
    op = data[pos]
    width = {0x42: 4, 0x58: 4, 0x8E: 8, 0x8D: 8, 0x96: 8}.get(op)  # BINBYTES BINUNICODE BINBYTES8 BINUNICODE8 BYTEARRAY8
    if width is None or pos + 1 + width > len(data):
        return False
    n = int.from_bytes(data[pos + 1 : pos + 1 + width], "little")
    return n >= 64 * 1024 and pos + 1 + width + n <= len(data)
