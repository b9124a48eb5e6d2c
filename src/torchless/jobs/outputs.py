"""A multi-file output written by independent range tasks, on any executor: the coordinator.

:func:`write_outputs` takes files laid out as :class:`~torchless.jobs.plan.Piece` lists
(:mod:`torchless.jobs.plan`), a staging area (:mod:`torchless.jobs.staging`) and an
executor (:mod:`torchless.jobs.executor`); it keeps what an interrupted run completed
(``resume``), cuts the rest into range tasks (:mod:`torchless.jobs.tasks`) and runs them.

A ``torch.save`` item larger than a task (a DCP chunk of a big tensor) is split too: its
zip header is known before its payload (torch's records carry their CRC-32 in a data
descriptor after the payload), so tasks write the header and payload rows, each returns
the CRC-32 of its rows, and one small sealing task per item writes the descriptor and
central directory once :func:`~torchless.io.crc.crc32_combine` has joined them (the
job's ``seal`` computes those bytes: this layer knows no format).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..core.errors import InternalError, UsageError
from ..io import remote
from ..io.cloud.s3 import s3_min_part
from ..io.crc import crc32_combine
from .executor import Executor
from .plan import MIN_TASK_BYTES, OutputFile, Piece, RangeTask, segments
from .plan import fingerprint as layout_fingerprint
from .tasks import compose_parts, run_range_task, verify_staged, worker_options

__all__ = ["write_outputs"]


def write_outputs(
    files: list[OutputFile],
    staging: Any,
    executor: Executor,
    *,
    max_task_bytes: int | None,
    opener: Any = None,
    weights_only: bool = True,
    fingerprint: Any = None,
    progress: Callable[[int], None] | None = None,
    seal: Callable[[Piece, int], bytes] | None = None,
    item_writer: Any = None,
) -> dict[str, Any]:
    """Build every file of ``files`` in ``staging`` with ``executor``; the caller then
    adds its index / metadata and publishes. Returns ``{"tasks", "resumed": [names],
    "resumed_parts", "rss": [peak RSS per task], "crc": {name: crc32}}``.

    A resumed job keeps the files the interrupted one completed (verified by size and
    CRC-32) and, at a remote destination, the part objects it finished (recorded beside
    them, and still there with their length): only the rest is written.

    ``opener`` opens the checkpoints ``rows``/``ptitem`` pieces read (``f(path,
    weights_only)``), ``item_writer`` writes a ``ptitem`` block (``f(block, dtype, sizes,
    sink)``), ``seal`` gives a split item's tail from its payload's CRC-32: all
    module-level functions of the format (the tasks are pickled to the workers)."""
    if max_task_bytes is not None and max_task_bytes < MIN_TASK_BYTES:
        raise UsageError("max_task_bytes is too small", found=max_task_bytes, expected=f">= {MIN_TASK_BYTES}")
    fp = layout_fingerprint(files, fingerprint)
    opts = worker_options()
    manifest: dict[str, Any] = {"version": 1, "destination": getattr(staging, "dst", ""), "fingerprint": fp, "files": {}}
    resumed: list[str] = []
    old = staging.read_manifest()
    kept_parts: dict[tuple[str, int], dict[str, Any]] = {}
    if staging.remote:
        if old and old.get("fingerprint") == fp:
            kept_parts = staging.recorded_parts()
        elif old:  # an earlier, different job's staging
            staging.clear_parts()
    if old and old.get("fingerprint") == fp:
        by_name = {f.name: f for f in files}
        cands = [(n, v) for n, v in (old.get("files") or {}).items() if n in by_name and by_name[n].size == v.get("size")]
        checks = executor.map(
            verify_staged, [(staging.staged_path(n), staging.remote, v["size"], v["crc32"], opts) for n, v in cands]
        )
        for (n, v), ok in zip(cands, checks, strict=False):
            if ok:
                manifest["files"][n] = v
                resumed.append(n)
    staging.write_manifest(manifest)
    todo = [f for f in files if f.name not in manifest["files"]]
    for f in todo:
        staging.drop(f.name)
        if not staging.remote:
            staging.presize(f)
    # phase 1: every piece but the seals; phase 2: the seals, once their items' CRCs are known
    tasks1: list[RangeTask] = []
    # parts joined server-side on S3 hold its 5 MiB minimum (remote.join_min_part)
    # (and, for a large file, parts large enough that it has at most S3's 10,000 parts)
    min_part = remote.join_min_part(staging.root) if staging.remote else 0
    seals: list[tuple[OutputFile, Piece]] = []

    def task(f: OutputFile, off: int, length: int, pieces: list[Piece]) -> RangeTask:
        """The range task writing ``[off, off+length)`` of ``f`` from ``pieces``."""
        target = staging.target(f.name, off)
        return RangeTask(
            f.name, off, length, pieces, target, staging.remote, opener, weights_only, opts, staging.shown(f.name), item_writer
        )

    kept1: list[dict[str, Any]] = []
    kept2: list[dict[str, Any]] = []
    for f in todo:
        for seg in segments(f.pieces, max_task_bytes, s3_min_part(f.size, min_part) if min_part else 0):
            off = seg[0].offset
            k = kept_parts.get((f.name, off))
            if k is not None and k["length"] == sum(p.length for p in seg):
                (kept2 if seg[0].kind == "seal" else kept1).append(k)
                continue
            if seg[0].kind == "seal":
                seals.append((f, seg[0]))
                continue
            tasks1.append(task(f, off, sum(p.length for p in seg), seg))
    done_segments: dict[str, list[dict[str, Any]]] = {f.name: [] for f in todo}
    need = {f.name: 0 for f in todo}
    for t in tasks1:
        need[t.name] += 1
    for _f, _p in seals:
        need[_f.name] += 1
    for k in kept1 + kept2:
        need[k["name"]] += 1
    rss: list[int] = []

    def finished(r: dict[str, Any], kept: bool = False) -> None:  # (the executor counts the workers' remote traffic)
        if not kept and staging.remote:
            staging.record_part(r)
        done_segments[r["name"]].append(r)
        if not kept:
            rss.append(int(r.get("rss", 0)))
        if progress is not None:
            progress(int(r["length"]))
        if len(done_segments[r["name"]]) == need[r["name"]]:
            _file_done(r["name"])

    by_name = {f.name: f for f in todo}
    composing: list[tuple[str, tuple[list[str], str, list[int]], int]] = []

    def _file_done(name: str) -> None:
        segs = sorted(done_segments[name], key=lambda s: s["offset"])
        crc = 0
        for s in segs:
            crc = crc32_combine(crc, s["crc"], s["length"])
        f = by_name[name]
        if sum(s["length"] for s in segs) != f.size:
            raise InternalError(f"file {name}: segments do not cover it")
        join = staging.complete(f, segs)
        if join is not None:  # a worker joins the parts (below), then the file counts as complete
            composing.append((name, join, crc))
            return
        manifest["files"][name] = {"size": f.size, "crc32": crc}
        staging.write_manifest(manifest)

    for k in kept1 + kept2:
        finished(k, kept=True)
    for f in todo:
        if need[f.name] == 0:  # an empty file: no task writes it
            _file_done(f.name)
    res1 = kept1 + executor.map(run_range_task, tasks1, progress=finished)
    n_tasks = len(tasks1)
    if seals:
        if seal is None:
            raise InternalError("seal pieces without a sealer")
        item_crc: dict[int, list[int]] = {}
        parts: dict[int, list[tuple[int, int, int]]] = {}
        for r in res1:
            for item, (c, n) in r["items"].items():
                parts.setdefault(int(item), []).append((r["offset"], c, n))
        for item, lst in parts.items():
            c = 0
            for _off, ci, ni in sorted(lst):
                c = crc32_combine(c, ci, ni)
            item_crc[item] = [c, sum(x[2] for x in lst)]
        tasks2 = []
        for f, p in seals:
            data = seal(p, item_crc[p.item][0])
            if len(data) != p.length:
                raise InternalError("a seal's length differs from the planned one")
            q = Piece(p.offset, p.length, "bytes", data=data)
            tasks2.append(task(f, p.offset, p.length, [q]))
        executor.map(run_range_task, tasks2, progress=finished)
        n_tasks += len(tasks2)
    if composing:
        executor.map(compose_parts, [(parts, dest, opts, sizes) for _n, (parts, dest, sizes), _c in composing])
        n_tasks += len(composing)
        for name, _join, crc in composing:
            manifest["files"][name] = {"size": by_name[name].size, "crc32": crc}
        staging.write_manifest(manifest)
    return {
        "tasks": n_tasks,
        "resumed": sorted(resumed),
        "resumed_parts": len(kept1) + len(kept2),
        "rss": rss,
        "crc": {n: v["crc32"] for n, v in manifest["files"].items()},
    }
