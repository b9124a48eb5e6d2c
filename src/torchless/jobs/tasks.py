"""Range tasks: what a worker runs (this process, a local pool's worker, a Dask worker).

A task reads its sources itself (local paths or URLs) and writes its range into the
staged file (``pwrite`` at the range's offset, into a file pre-sized by the coordinator)
or, for a URL destination, as one part object that the coordinator composes when the
file is complete. A task returns only its range's CRC-32 and length (and peak memory), so
no payload byte passes through the coordinator, and a task run twice writes the same
bytes at the same place (Dask's retries on a lost worker are safe).

What a piece's bytes are is the job's to say: ``rows`` and ``ptitem`` pieces read blocks
through the task's ``opener`` (a format's checkpoint reader) and a ``ptitem`` block is
encoded by its ``item_writer`` (a format's); this layer knows no format. Also here: the
workers' check of a file an interrupted job completed (:func:`verify_staged`) and the
join of a file's part objects (:func:`compose_parts`).
"""

from __future__ import annotations

import os
import zlib
from typing import Any

import numpy as np

from ..core.errors import InternalError
from ..io import remote
from ..io.atomic import fault_tick, write_error
from ..io.source import RemoteSource, pread_into
from .hooks import current_rss, task_fault
from .plan import Piece, RangeTask

__all__ = ["run_range_task", "close_sources", "verify_staged", "compose_parts", "worker_options", "install_options"]

_OPEN: dict[tuple[str, str], Any] = {}


def _source(opener: Any, path: str, weights_only: bool) -> Any:
    """A checkpoint opened once per worker process (tasks of one job share it)."""
    key = (getattr(opener, "__qualname__", "opener"), path)
    src = _OPEN.get(key)
    if src is None:
        if opener is None:
            raise InternalError("a range task reads a checkpoint but its job gave no opener")
        src = opener(path, weights_only=weights_only)
        while len(_OPEN) >= 4:
            old = _OPEN.pop(next(iter(_OPEN)))
            try:
                old.close()
            except Exception:  # noqa: BLE001 - closing a source another task no longer needs
                pass
        _OPEN[key] = src
    return src


def close_sources() -> None:
    """Close the checkpoints this process opened for tasks (after an in-process job)."""
    while _OPEN:
        src = _OPEN.pop(next(iter(_OPEN)))
        try:
            src.close()
        except Exception:  # noqa: BLE001
            pass


class _Sink:
    """Where a task's bytes go: a pwrite at increasing offsets, or a part object; every
    byte is counted into the range's CRC-32."""

    def __init__(self, task: RangeTask) -> None:
        self.task = task
        self.pos = task.offset
        self.crc = 0
        self.af: Any = None
        self.fd = -1
        self.dest = task.dest or task.name
        if task.part:
            from ..io.atomic import AtomicFile

            self.af = AtomicFile(task.target, dest=self.dest)
        else:
            try:
                self.fd = os.open(task.target, os.O_WRONLY | getattr(os, "O_CLOEXEC", 0))
            except OSError as e:
                raise write_error(e, self.dest) from None

    def write(self, b: Any) -> int:
        mv = memoryview(b).cast("B")
        n = len(mv)
        if not n:
            return 0
        self.crc = zlib.crc32(mv, self.crc)
        if self.af is not None:
            self.af.file.write(mv)
        else:
            done = 0
            try:  # a full disk, a quota: the error names the output file, as the one-process writers' do
                fault_tick(n, self.dest)
                while done < n:
                    done += os.pwrite(self.fd, mv[done:], self.pos + done)
            except OSError as e:
                raise write_error(e, self.dest) from None
        self.pos += n
        return n

    def flush(self) -> None:
        pass

    def close(self, ok: bool) -> None:
        if self.af is not None:
            if ok:
                self.af.commit()
            else:
                self.af.abort()
        elif self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def install_options(opts: dict[str, Any] | None) -> dict[str, Any]:
    """The job's storage options, in a worker process (a coordinator's own are kept)."""
    opts = opts or {}
    if opts.get("default") and not remote._DEFAULT_OPTIONS:
        remote.set_default_options(opts["default"])
    for loc, o in (opts.get("by_location") or {}).items():
        remote._BY_LOCATION.setdefault(loc, o)
    return opts


def run_range_task(task: RangeTask) -> dict[str, Any]:
    """Write one task's range (runs on a worker). Returns ``{"name", "offset", "length",
    "crc", "items": {item: [crc, length]}, "rss"}``: metadata only."""
    from ..core.errors import WriteError
    from ..io.remote import storage_options_ctx

    task_fault()
    opts = install_options(task.options)
    with storage_options_ctx(opts.get("ctx")):
        sink = _Sink(task)
        ok = False
        items: dict[int, list[int]] = {}
        rss = [current_rss()]
        try:
            for p in task.pieces:
                start = sink.pos
                if start != p.offset:
                    raise InternalError(f"range task out of order at {p.offset} (at {start})")
                _write_piece(task, p, sink, items, rss)
                if sink.pos - start != p.length:
                    raise WriteError(
                        f"a piece of {p.length} bytes came out as {sink.pos - start} (the source changed?)",
                        path=task.name,
                        offset=p.offset,
                    )
            ok = True
        finally:
            sink.close(ok)
    return {
        "name": task.name,
        "offset": task.offset,
        "length": task.length,
        "crc": sink.crc & 0xFFFFFFFF,
        "items": items,
        "rss": max(rss),  # the largest resident size seen while a piece was in memory
    }


def _write_piece(task: RangeTask, p: Piece, sink: _Sink, items: dict[int, list[int]], rss: list[int]) -> None:
    if p.kind in ("bytes", "seal"):
        sink.write(p.data)
    elif p.kind == "copy":
        _copy(p.src, p.src_offset, p.length, sink, p.remote)
    elif p.kind == "rows":
        block = _source(task.opener, p.src, task.weights_only).read_block(p.fqn, p.offsets, p.sizes)
        if p.item >= 0:
            c, n = items.get(p.item, [0, 0])
            items[p.item] = [zlib.crc32(block, c) & 0xFFFFFFFF, n + block.nbytes]
        sink.write(block)
        rss.append(current_rss())
        del block
    elif p.kind == "ptitem":
        if task.item_writer is None:
            raise InternalError("a ptitem piece but its job gave no item writer")
        block = _source(task.opener, p.src, task.weights_only).read_block(p.fqn, p.offsets, p.sizes)
        task.item_writer(block, p.dtype, p.sizes, sink)
        rss.append(current_rss())
        del block
    else:
        raise InternalError(f"unknown piece kind {p.kind!r}")


def _copy(src: str, offset: int, length: int, sink: _Sink, at_url: bool) -> None:
    step = 16 << 20
    if at_url:  # (the planner's store said so: the location is not asked again)
        rs = RemoteSource(src)
        for done in range(0, length, step):
            sink.write(rs.read_at(offset + done, min(step, length - done), what="chunk"))
        return
    fd = os.open(src, os.O_RDONLY)
    try:
        buf = np.empty(min(length, step), dtype=np.uint8)
        done = 0
        while done < length:
            n = min(len(buf), length - done)
            pread_into(fd, buf.data[:n], offset + done, path=src, short="file ends inside a chunk")
            sink.write(buf.data[:n])
            done += n
    finally:
        os.close(fd)


# -- the coordinator's work done on workers ---------------------------------------------------
def worker_options() -> dict[str, Any]:
    return {
        "default": dict(remote._DEFAULT_OPTIONS),
        "by_location": dict(remote._BY_LOCATION),
        "ctx": remote._OPTIONS.get(),
    }


def verify_staged(args: tuple[str, bool, int, int, dict[str, Any]]) -> bool:
    """A worker's check of a file a previous run completed: its size and CRC-32 (``args``:
    the staged path, whether it is a URL, the size and CRC-32 recorded, storage options)."""
    path, is_remote, size, crc, opts = args
    from ..io.remote import storage_options_ctx

    opts = install_options(opts)
    with storage_options_ctx(opts.get("ctx")):
        try:
            if is_remote:
                rs: Any = RemoteSource(path)
                if rs.size != size:
                    return False
                c = 0
                for done in range(0, size, 16 << 20):
                    c = zlib.crc32(rs.read_at(done, min(16 << 20, size - done)), c)
                return (c & 0xFFFFFFFF) == crc
            if os.path.getsize(path) != size:
                return False
            c = 0
            with open(path, "rb") as fh:
                while True:
                    b = fh.read(16 << 20)
                    if not b:
                        break
                    c = zlib.crc32(b, c)
            return (c & 0xFFFFFFFF) == crc
        except Exception:  # noqa: BLE001 - unreadable: not complete
            return False


def compose_parts(args: tuple[list[str], str, dict[str, Any], list[int]]) -> int:
    """A worker joins part objects into one object, then removes the parts. On S3, one
    multipart upload of server-side copies, in which a part under S3's 5 MiB minimum
    travels with the bytes next to it; on Azure, blocks staged from the parts' URLs, or
    uploaded by this worker where the service cannot read them
    (:func:`~torchless.io.remote.join_objects`); elsewhere the parts are read and
    uploaded in 16 MiB pieces. Returns the bytes that passed through this worker."""
    parts, dest, opts, sizes = args
    from ..io.atomic import AtomicFile, holding_signals
    from ..io.remote import storage_options_ctx

    opts = install_options(opts)
    with storage_options_ctx(opts.get("ctx")):
        if remote.can_join(dest, sizes):
            with holding_signals():  # a Ctrl-C lands once the upload is completed or aborted
                n = remote.join_objects(dest, parts, sizes)
        else:
            n = 0
            with AtomicFile(dest) as af:
                for p in parts:
                    rs = RemoteSource(p)
                    for done in range(0, rs.size, 16 << 20):
                        af.file.write(rs.read_at(done, min(16 << 20, rs.size - done)))
                    n += rs.size
        for p in parts:
            remote.remove(p)
    return n
