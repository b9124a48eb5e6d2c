"""Multi-file outputs written by independent range tasks, on any executor.

An output (a DCP folder of rank files, a set of safetensors shards) is laid out in full
by the coordinator before any byte is read: every output file is a list of
:class:`Piece` objects at known offsets (literal header bytes, a byte range copied from a
source file, rows of a tensor block, one whole ``torch.save`` item). The file's byte
range is then cut into :class:`RangeTask` objects of at most ``max_task_bytes`` each; a
task reads its sources itself (local paths or URLs) and writes its range into the
staged file (``pwrite`` at the range's offset, into a file pre-sized by the coordinator)
or, for a URL destination, as one part object that the coordinator composes when the
file is complete. A task returns only its range's CRC-32 and length (and peak memory), so
no payload byte passes through the coordinator, and a task run twice writes the same
bytes at the same place (Dask's retries on a lost worker are safe).

A ``torch.save`` item larger than a task (a DCP chunk of a big tensor) is split too: its
zip header is known before its payload (torch's records carry their CRC-32 in a data
descriptor after the payload), so tasks write the header and payload rows, each returns
the CRC-32 of its rows, and one small sealing task per item writes the descriptor and
central directory once :func:`~torchless.io.crc.crc32_combine` has joined them.

Staging and publication: files are built under a staging name (a hidden folder beside a
local destination, a ``.torchless-staging`` prefix beside a remote one) and published
only when all are complete, the index / ``.metadata`` last. A manifest in the staging
area records each completed file's size and CRC-32 (and, beside a remote destination, a
record beside each finished part object): a resumed job (``resume=True``) verifies and
keeps those and runs only the rest; :func:`cleanup` removes what an interrupted job left,
incomplete S3 multipart uploads and Azure blobs of uncommitted blocks included.
"""

from __future__ import annotations

import hashlib
import json
import os
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..container.zip import LOCAL_SIG
from ..core.errors import InternalError, UsageError
from ..io import remote
from ..io.atomic import _fault_tick, _write_error
from ..io.crc import crc32_combine
from ..io.source import RemoteSource
from ..jobs.executor import Executor
from ..jobs.hooks import current_rss, task_fault

__all__ = [
    "Piece",
    "OutputFile",
    "RangeTask",
    "run_range_task",
    "split_rows",
    "close_sources",
    "pt_item_template",
    "write_outputs",
    "write_shards",
    "cleanup",
    "MIN_TASK_BYTES",
]

#: the smallest ``max_task_bytes`` accepted (a task always holds a whole small piece)
MIN_TASK_BYTES = 1 << 20
STAGING = ".torchless-staging"
MANIFEST = ".torchless-manifest.json"


@dataclass
class Piece:
    """``length`` bytes at ``offset`` of an output file.

    ``kind``: ``"bytes"`` (``data``), ``"copy"`` (``length`` bytes of file ``src`` at
    ``src_offset``), ``"rows"`` (the C-order bytes of block ``offsets``/``sizes`` of tensor
    ``fqn`` of checkpoint ``src``: a row range of a larger block when split), ``"ptitem"``
    (the block written as one whole ``torch.save`` stream), ``"seal"`` (the tail of a
    split ``torch.save`` item: filled in once its payload's CRC-32 is known).
    """

    offset: int
    length: int
    kind: str
    data: bytes = b""
    src: str = ""
    src_offset: int = 0
    fqn: str = ""
    offsets: tuple[int, ...] = ()
    sizes: tuple[int, ...] = ()
    dtype: str = ""
    item: int = -1  # a split item's number: its payload rows' CRCs are joined by item

    def key(self) -> tuple:
        return (self.offset, self.length, self.kind, self.src, self.src_offset, self.fqn, self.offsets, self.sizes)


@dataclass
class OutputFile:
    name: str
    size: int
    pieces: list[Piece]


@dataclass
class RangeTask:
    """Write ``[offset, offset + length)`` of output file ``name`` from ``pieces``."""

    name: str
    offset: int
    length: int
    pieces: list[Piece]
    target: str  # the staged file (local) or the part object's URL
    part: bool  # a part object (a URL destination) rather than a pwrite into ``target``
    opener: Any = None  # opens ``rows`` sources: f(path, weights_only) (module-level: pickled by name)
    weights_only: bool = True
    options: dict[str, Any] = field(default_factory=dict)  # storage options for the worker
    dest: str = ""  # the output file as the user named it (for messages; ``name`` when empty)


# -- worker side ------------------------------------------------------------------------------
_OPEN: dict[tuple[str, str], Any] = {}


def _source(opener: Any, path: str, weights_only: bool) -> Any:
    """A checkpoint opened once per worker process (tasks of one job share it)."""
    key = (getattr(opener, "__qualname__", "tensors"), path)
    src = _OPEN.get(key)
    if src is None:
        src = opener(path, weights_only=weights_only) if opener is not None else _TensorSource(path)
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


class _TensorSource:
    """Blocks of the tensors of any checkpoint (a DCP folder through its reader, any
    other file through its artifact), by the names ``tensors()`` gives."""

    def __init__(self, path: str) -> None:
        from .dispatch import open_artifact

        p = remote.local_path(path)
        isdir = remote.isdir(p) if remote.is_url(p) else os.path.isdir(p)
        if isdir:
            from .dcp.readers import open_reader

            self.reader: Any = open_reader(p)
            self.art = None
            return
        self.reader = None
        self.art = open_artifact(p, weights_only=False)
        self.tensors = dict(self.art.tensors())

    def read_block(self, fqn: str, offsets: tuple[int, ...], sizes: tuple[int, ...]) -> np.ndarray:
        if self.reader is not None:
            return self.reader.read_block(fqn, offsets, sizes)
        arr = self.tensors[fqn].numpy(raw=True)
        block = np.ascontiguousarray(arr[tuple(slice(o, o + s) for o, s in zip(offsets, sizes, strict=False))])
        if block.dtype.byteorder == ">":
            block = block.astype(block.dtype.newbyteorder("<"))
        return block.reshape(-1).view(np.uint8)

    def close(self) -> None:
        if self.reader is not None:
            self.reader.close()
        if self.art is not None:
            self.art.close()


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
                raise _write_error(e, self.dest) from None

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
                _fault_tick(n, self.dest)
                while done < n:
                    done += os.pwrite(self.fd, mv[done:], self.pos + done)
            except OSError as e:
                raise _write_error(e, self.dest) from None
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


def _install_options(opts: dict[str, Any] | None) -> dict[str, Any]:
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
    opts = _install_options(task.options)
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
        _copy(p.src, p.src_offset, p.length, sink)
    elif p.kind == "rows":
        block = _source(task.opener, p.src, task.weights_only).read_block(p.fqn, p.offsets, p.sizes)
        if p.item >= 0:
            c, n = items.get(p.item, [0, 0])
            items[p.item] = [zlib.crc32(block, c) & 0xFFFFFFFF, n + block.nbytes]
        sink.write(block)
        rss.append(current_rss())
        del block
    elif p.kind == "ptitem":
        from ..core.dtypes import by_name
        from ..core.tensor import Storage, Tensor
        from .pt.write import save_checkpoint

        dt = by_name(p.dtype)
        block = _source(task.opener, p.src, task.weights_only).read_block(p.fqn, p.offsets, p.sizes)
        st = Storage("0", block.nbytes, dt, "cpu", data=block)
        save_checkpoint(Tensor(st, dt, p.sizes), sink)
        rss.append(current_rss())
        del block, st
    else:
        raise InternalError(f"unknown piece kind {p.kind!r}")


def _copy(src: str, offset: int, length: int, sink: _Sink) -> None:
    step = 16 << 20
    if remote.is_url(src):
        rs = RemoteSource(src)
        for done in range(0, length, step):
            sink.write(rs.read_at(offset + done, min(step, length - done), what="chunk"))
        return
    from .dcp.read import pread_into

    fd = os.open(src, os.O_RDONLY)
    try:
        buf = np.empty(min(length, step), dtype=np.uint8)
        done = 0
        while done < length:
            n = min(len(buf), length - done)
            pread_into(fd, buf.data[:n], offset + done, path=src)
            sink.write(buf.data[:n])
            done += n
    finally:
        os.close(fd)


# -- torch.save items split over tasks ----------------------------------------------------------
class _HeadTail:
    """A write-only sink keeping the first and last 64 KiB of what passes through."""

    KEEP = 1 << 16

    def __init__(self) -> None:
        self.head = bytearray()
        self.tail = bytearray()
        self.n = 0

    def write(self, b: Any) -> int:
        mv = memoryview(b).cast("B")
        n = len(mv)
        if len(self.head) < self.KEEP:
            self.head += mv[: self.KEEP - len(self.head)]
        if n >= self.KEEP:
            self.tail = bytearray(mv[n - self.KEEP :])
        else:
            self.tail += mv
            del self.tail[: max(0, len(self.tail) - self.KEEP)]
        self.n += n
        return n

    def flush(self) -> None:
        pass


def pt_item_template(dtype: str, sizes: tuple[int, ...], crc: int = 0) -> tuple[bytes, int, bytes]:
    """``(header, payload length, tail)`` of the ``torch.save`` stream of one tensor of
    ``dtype``/``sizes`` whose payload has CRC-32 ``crc``: the bytes before and after the
    payload, computed without the payload (a zero-filled buffer that is never touched)."""
    from ..core.dtypes import by_name
    from ..core.tensor import Storage, Tensor
    from .dcp.spec import numel
    from .pt.write import save_checkpoint

    dt = by_name(dtype)
    n = numel(sizes) * dt.itemsize
    if n < 2 * _HeadTail.KEEP:
        raise InternalError("pt_item_template is for items larger than 128 KiB")
    zeros = np.zeros(n, dtype=np.uint8)  # calloc'd: pages stay unmapped as nothing reads them
    sink = _HeadTail()
    save_checkpoint(Tensor(Storage("0", n, dt, "cpu", data=zeros), dt, sizes), sink, storage_crc=crc)
    head = bytes(sink.head)
    name = b"archive/data/0"
    at = head.find(name)
    if at < 30 or head[at - 30 : at - 26] != LOCAL_SIG:
        raise InternalError("cannot find the payload record in a torch.save template")
    nlen = int.from_bytes(head[at - 4 : at - 2], "little")
    xlen = int.from_bytes(head[at - 2 : at], "little")
    start = at + nlen + xlen
    tail_len = sink.n - start - n
    if tail_len <= 0 or tail_len > _HeadTail.KEEP or start > _HeadTail.KEEP:
        raise InternalError("unexpected torch.save template layout")
    return head[:start], n, bytes(sink.tail[len(sink.tail) - tail_len :])


def split_rows(offsets: tuple[int, ...], sizes: tuple[int, ...], itemsize: int, budget: int) -> list[tuple[tuple, tuple]]:
    """Cut block ``offsets``/``sizes`` into row ranges of at most ``budget`` bytes each
    (one row at least); each range is contiguous in the block's C-order bytes."""
    if not sizes or sizes[0] <= 1:
        return [(offsets, sizes)]
    row = itemsize
    for s in sizes[1:]:
        row *= s
    per = max(1, budget // max(row, 1))
    out = []
    for a in range(0, sizes[0], per):
        b = min(sizes[0], a + per)
        out.append(((offsets[0] + a, *offsets[1:]), (b - a, *sizes[1:])))
    return out


# -- cutting files into tasks -------------------------------------------------------------------
def _segments(pieces: list[Piece], budget: int | None, min_part: int = 0) -> list[list[Piece]]:
    """Consecutive pieces in task ranges of about ``budget`` bytes (a task holds one piece
    in memory at a time, and no piece is larger than the budget once split); a range is
    closed only once it holds ``min_part`` bytes (S3's smallest multipart part, for parts
    joined server-side); a seal is a range of its own."""
    segs: list[list[Piece]] = []
    cur: list[Piece] = []
    size = 0
    for p in pieces:
        if p.kind == "seal":  # written in the second phase, in a segment of its own
            if cur:
                segs.append(cur)
            segs.append([p])
            cur, size = [], 0
            continue
        if cur and budget is not None and size + p.length > budget and size >= min_part:
            segs.append(cur)
            cur, size = [], 0
        cur.append(p)
        size += p.length
    if cur:
        segs.append(cur)
    return segs


def _fingerprint(files: list[OutputFile], extra: Any) -> str:
    h = hashlib.sha256(json.dumps(extra, sort_keys=True, default=str).encode())
    for f in files:
        h.update(json.dumps([f.name, f.size, [list(map(str, p.key())) for p in f.pieces if p.kind != "seal"]]).encode())
    return h.hexdigest()[:32]


# -- staging areas -----------------------------------------------------------------------------
class _Staging:
    """Where files are built before they are published (see the module doc)."""

    remote = False
    shown_dir = ""  # the output files' folder as the user named it

    def target(self, name: str, offset: int) -> str:
        raise NotImplementedError

    def presize(self, f: OutputFile) -> None:
        pass

    def complete(self, f: OutputFile, segments: list[dict[str, Any]]) -> tuple[list[str], str, list[int]] | None:
        """Finish a file whose segments are all written; or ``(parts, staged URL, sizes)``
        to be joined by a worker (:func:`compose_parts`)."""
        return None

    def read_manifest(self) -> dict[str, Any] | None:
        raise NotImplementedError

    def write_manifest(self, m: dict[str, Any]) -> None:
        raise NotImplementedError

    def staged_path(self, name: str) -> str:
        raise NotImplementedError

    def drop(self, name: str) -> None:
        pass

    def shown(self, name: str) -> str:
        """Output file ``name`` in the folder the user named (for messages)."""
        d = self.shown_dir
        return remote.join(d, name) if remote.is_url(d) else os.path.join(d, name)


class LocalDirStaging(_Staging):
    """A hidden folder beside a local destination folder (an :class:`AtomicDir`)."""

    def __init__(self, dst: str, *, resume: bool) -> None:
        from ..io.atomic import AtomicDir, _temp_path, _untrack

        self.dst = os.path.abspath(dst)
        self.shown_dir = dst
        parent = os.path.dirname(self.dst)
        adopted = _adopt_local(parent, self.dst) if resume else None
        if adopted is not None:  # renamed to a name of this process's before AtomicDir sweeps stale ones
            mine = _temp_path(parent, "dir")
            os.rename(adopted, mine)
            adopted = mine
        self.out = AtomicDir(dst, merge=True)
        self.root = self.out.tmp
        self.keep = resume
        if resume:  # an interrupted resumable job keeps its staging folder for the next --resume
            _untrack(self.out)
        if adopted is not None:
            for n in os.listdir(adopted):
                os.replace(os.path.join(adopted, n), os.path.join(self.root, n))
            import shutil

            shutil.rmtree(adopted, ignore_errors=True)

    def target(self, name: str, offset: int) -> str:
        return os.path.join(self.root, name)

    def staged_path(self, name: str) -> str:
        return os.path.join(self.root, name)

    def presize(self, f: OutputFile) -> None:
        p = os.path.join(self.root, f.name)
        with open(p, "ab") as fh:
            fh.truncate(f.size)

    def read_manifest(self) -> dict[str, Any] | None:
        try:
            with open(os.path.join(self.root, MANIFEST), "rb") as fh:
                return json.loads(fh.read())
        except (OSError, ValueError):
            return None

    def write_manifest(self, m: dict[str, Any]) -> None:
        tmp = os.path.join(self.root, MANIFEST + ".new")
        with open(tmp, "w") as fh:
            json.dump(m, fh)
        os.replace(tmp, os.path.join(self.root, MANIFEST))

    def put(self, name: str, data: bytes) -> None:
        with open(os.path.join(self.root, name), "wb") as fh:
            fh.write(data)

    def publish(self, last: tuple[str, ...]) -> None:
        try:
            os.unlink(os.path.join(self.root, MANIFEST))
        except OSError:
            pass
        from ..io.atomic import _track

        if self.keep:
            _track(self.out, self.out.tmp, True)
        self.out.commit(last=last)

    def abort(self, e: BaseException | None = None) -> None:
        if self.keep:
            return
        self.out.abort()
        if e is not None:
            self.out.public(e)


def _adopt_local(parent: str, dst: str) -> str | None:
    """The staging folder an interrupted job (its process gone) left for ``dst``."""
    from ..io.atomic import TEMP_PREFIX, TEMP_SUFFIX, _alive, _host, _owner

    try:
        names = os.listdir(parent)
    except OSError:
        return None
    for n in sorted(names):
        if not (n.startswith(TEMP_PREFIX) and n.endswith(TEMP_SUFFIX)):
            continue
        who = _owner(n)
        if who is None or who[1] != _host() or (who[0] != os.getpid() and _alive(who[0])):
            continue
        p = os.path.join(parent, n)
        try:
            with open(os.path.join(p, MANIFEST), "rb") as fh:
                m = json.loads(fh.read())
        except (OSError, ValueError):
            continue
        if m.get("destination") == dst:
            return p
    return None


class RemoteStaging(_Staging):
    """A ``.torchless-staging-<name>`` prefix beside a remote destination: parts, then
    each complete file, then a server-side move into place on publication."""

    remote = True

    def __init__(self, dst: str, *, resume: bool, folder: bool = True) -> None:
        remote.check_writable(dst)
        self.dst = dst.rstrip("/")
        self.folder = folder  # a destination folder (DCP) or files beside a path (shards)
        base = self.dst if folder else remote.dirname(self.dst)
        self.base = self.shown_dir = base
        self.root = remote.join(base, f"{STAGING}-{remote.basename(self.dst)}")
        self.keep = resume
        self.fs, self.inner = remote.filesystem(self.root)
        # a join a killed job left half done is never completed: abort it (S3 keeps, and
        # bills, the parts of an incomplete multipart upload until it is aborted)
        remote.abort_uploads(self.root)
        if not resume:
            self._rm_all()

    def _rm_all(self) -> None:
        try:
            if self.fs.exists(self.inner):
                self.fs.rm(self.inner, recursive=True)
        except Exception:  # noqa: BLE001 - best effort
            pass

    def _record(self, name: str, offset: int) -> str:
        return remote.filesystem(remote.join(self.root, f"done/{name}.{offset:020d}"))[1]

    def record_part(self, r: dict[str, Any]) -> None:
        """Note a finished part (its length and CRC-32s) beside it, so that a resumed job
        keeps it: one small object per part, written after the part object exists (an
        object store creates it whole or not at all)."""
        rec = {k: r[k] for k in ("name", "offset", "length", "crc", "items")}
        self.fs.pipe_file(self._record(r["name"], r["offset"]), json.dumps(rec).encode())

    def recorded_parts(self) -> dict[tuple[str, int], dict[str, Any]]:
        """The finished parts of an interrupted run: each recorded, and its part object
        still there with the recorded length."""
        try:
            sizes = {
                str(e["name"]).rsplit("/", 1)[-1]: int(e.get("size") or 0)
                for e in self.fs.ls(remote.filesystem(remote.join(self.root, "parts"))[1], detail=True)
            }
            recs = self.fs.cat([str(e) for e in self.fs.ls(remote.filesystem(remote.join(self.root, "done"))[1], detail=False)])
        except FileNotFoundError:
            return {}
        out: dict[tuple[str, int], dict[str, Any]] = {}
        for data in recs.values():
            try:
                r = json.loads(data)
                key = (str(r["name"]), int(r["offset"]))
                length = int(r["length"])
            except (ValueError, KeyError, TypeError):
                continue  # a torn record (a store without atomic puts): the part is written again
            if sizes.get(f"{key[0]}.{key[1]:020d}") == length:
                out[key] = r
        return out

    def clear_parts(self) -> None:
        """Forget the parts of an earlier, different job in this staging."""
        for sub in ("parts", "done"):
            try:
                self.fs.rm(remote.filesystem(remote.join(self.root, sub))[1], recursive=True)
            except Exception:  # noqa: BLE001 - none there
                pass

    def target(self, name: str, offset: int) -> str:
        return remote.join(self.root, f"parts/{name}.{offset:020d}")

    def staged_path(self, name: str) -> str:
        return remote.join(self.root, f"files/{name}")

    def complete(self, f: OutputFile, segments: list[dict[str, Any]]) -> tuple[list[str], str, list[int]] | None:
        """Join the file's part objects into one staged object: a server-side move (one
        part) or a server-side join (:func:`~torchless.io.remote.join_objects`) when no
        payload byte would pass through this process (on S3: every part but the last has
        S3's 5 MiB minimum; on Azure: the parts' URLs can be authorized); otherwise
        ``(parts, staged URL, sizes)``, joined by a worker (:func:`compose_parts`), so no
        payload byte passes through the coordinator."""
        segs = sorted(segments, key=lambda s: s["offset"])
        if not segs:  # an empty file
            self.put(f.name, b"")
            return None
        parts = [self.target(f.name, s["offset"]) for s in segs]
        sizes = [s["length"] for s in segs]
        if len(parts) == 1:
            remote.move(parts[0], self.staged_path(f.name))
            return None
        if remote.joins_server_side(self.root, sizes):
            from ..io.atomic import holding_signals

            with holding_signals():  # a Ctrl-C lands once the upload is completed or aborted
                remote.join_objects(self.staged_path(f.name), parts, sizes)
            self.fs.rm([remote.filesystem(p)[1] for p in parts])
            return None
        return parts, self.staged_path(f.name), sizes

    def read_manifest(self) -> dict[str, Any] | None:
        try:
            return json.loads(remote.read_bytes(remote.join(self.root, "manifest.json")))
        except Exception:  # noqa: BLE001 - none, or unreadable: start afresh
            return None

    def write_manifest(self, m: dict[str, Any]) -> None:
        # one put: an object store creates it whole; a torn manifest elsewhere does not
        # parse, and the next --resume starts afresh
        self.fs.pipe_file(remote.filesystem(remote.join(self.root, "manifest.json"))[1], json.dumps(m).encode())

    def put(self, name: str, data: bytes) -> None:
        from ..io.atomic import atomic_write_bytes

        atomic_write_bytes(self.staged_path(name), data)

    def drop(self, name: str) -> None:
        remote.remove(self.staged_path(name))

    def publish(self, last: tuple[str, ...]) -> None:
        """Move every staged file into place, those named in ``last`` after all others."""
        from ..io.atomic import holding_signals

        names = sorted(remote.listdir(remote.join(self.root, "files")), key=lambda n: (n in last, n))

        def move(n: str) -> None:  # on Azure: waited for until the service's copy is complete
            remote.move(self.staged_path(n), remote.join(self.base, n))

        for n in names:
            if n not in last:
                move(n)
        with holding_signals():  # the index / .metadata: published whole, or not at all
            for n in names:
                if n in last:
                    move(n)
        self._rm_all()

    def abort(self, e: BaseException | None = None) -> None:
        if not self.keep:
            # the staging objects, and the uploads left incomplete (S3's multipart parts,
            # Azure's uncommitted blocks) in the staging and at the destination
            try:
                cleanup(self.dst, folder=self.folder)
            except Exception:  # noqa: BLE001 - best effort: the job's own error is raised
                self._rm_all()


def remote_staging_for(dst: str, *, folder: bool = True) -> bool:
    """True when URL ``dst`` has the staging of an interrupted job for it (its manifest
    names ``dst``): a ``--resume`` picks it up, and overwrites any of its files that job
    had already moved into place."""
    d = dst.rstrip("/")
    base = d if folder else remote.dirname(d)
    root = remote.join(base, f"{STAGING}-{remote.basename(d)}")
    try:
        m = json.loads(remote.read_bytes(remote.join(root, "manifest.json")))
    except Exception:  # noqa: BLE001 - none, or unreadable
        return False
    return isinstance(m, dict) and m.get("destination") == d


@remote.accepts_storage_options
def cleanup(dst: Any, *, folder: bool = True) -> list[str]:
    """Remove what interrupted jobs left for destination ``dst`` (their staging folders
    or prefixes, never a published file; on S3 also the incomplete multipart uploads,
    on Azure the blobs of uncommitted blocks, under the staging prefix and at the
    destination). Returns what was removed: local staging folders; at a URL each object,
    and ``URL (incomplete multipart upload)`` / ``URL (uncommitted blocks)``.

    Args:
        dst: the destination the job wrote: a DCP folder (``folder=True``) or a file
            (shards are staged beside it: ``folder=False``); a path or a URL.
    """
    d = remote.local_path(os.fspath(dst))
    removed: list[str] = []
    if remote.is_url(d):
        d = d.rstrip("/")
        base = d if folder else remote.dirname(d)
        root = remote.join(base, f"{STAGING}-{remote.basename(d)}")
        fs, inner = remote.filesystem(root)
        scheme = d.partition("://")[0]
        try:
            objects = sorted(str(p) for p in fs.find(inner))
        except FileNotFoundError:
            objects = []
        if objects:
            fs.rm(objects)
            removed += [f"{scheme}://{p}" for p in objects]
        try:
            if fs.exists(inner):  # a folder marker some stores keep
                fs.rm(inner, recursive=True)
        except (FileNotFoundError, OSError):
            pass
        remote.forget(root)
        # uploads a killed process left incomplete: its joins in the staging, and its
        # single-object uploads (a file, or a move of a file over 5 GiB) at the destination
        removed += remote.abort_uploads(d if folder else root)
        if not folder:
            removed += remote.abort_uploads(d, exact=True)
            stem = remote.basename(d)
            stem = stem[: -len(".safetensors")] if stem.endswith(".safetensors") else stem
            removed += [
                u
                for u in remote.abort_uploads(remote.join(base, stem), exact=False, under=False)
                if _shard_name(u.rsplit("/", 1)[-1].partition(" ")[0], stem)
            ]
        return removed
    import shutil

    d = os.path.abspath(d)
    while True:
        p = _adopt_local(os.path.dirname(d), d)
        if p is None:
            break
        shutil.rmtree(p, ignore_errors=True)
        removed.append(p)
    return removed


def _shard_name(name: str, stem: str) -> bool:
    """``name`` is a shard or the index of ``stem`` (``stem-00001-of-00004.safetensors``)."""
    import re

    return (
        re.fullmatch(re.escape(stem) + r"-\d{5}-of-\d{5}\.safetensors|" + re.escape(stem) + r"\.safetensors\.index\.json", name)
        is not None
    )


# -- the job ------------------------------------------------------------------------------------
def _worker_options() -> dict[str, Any]:
    return {
        "default": dict(remote._DEFAULT_OPTIONS),
        "by_location": dict(remote._BY_LOCATION),
        "ctx": remote._OPTIONS.get(),
    }


def _verify_staged(args: tuple[str, int, int, dict[str, Any]]) -> bool:
    """A worker's check of a file a previous run completed: its size and CRC-32."""
    path, size, crc, opts = args
    from ..io.remote import storage_options_ctx

    opts = _install_options(opts)
    with storage_options_ctx(opts.get("ctx")):
        try:
            if remote.is_url(path):
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

    opts = _install_options(opts)
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
) -> dict[str, Any]:
    """Build every file of ``files`` in ``staging`` with ``executor``; the caller then
    adds its index / metadata and publishes. Returns ``{"tasks", "resumed": [names],
    "resumed_parts", "rss": [peak RSS per task], "crc": {name: crc32}}``.

    A resumed job keeps the files the interrupted one completed (verified by size and
    CRC-32) and, at a remote destination, the part objects it finished (recorded beside
    them, and still there with their length): only the rest is written."""
    if max_task_bytes is not None and max_task_bytes < MIN_TASK_BYTES:
        raise UsageError("max_task_bytes is too small", found=max_task_bytes, expected=f">= {MIN_TASK_BYTES}")
    fp = _fingerprint(files, fingerprint)
    opts = _worker_options()
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
        checks = executor.map(_verify_staged, [(staging.staged_path(n), v["size"], v["crc32"], opts) for n, v in cands])
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
    kept1: list[dict[str, Any]] = []
    kept2: list[dict[str, Any]] = []
    for f in todo:
        for seg in _segments(f.pieces, max_task_bytes, remote.s3_min_part(f.size, min_part) if min_part else 0):
            off = seg[0].offset
            k = kept_parts.get((f.name, off))
            if k is not None and k["length"] == sum(p.length for p in seg):
                (kept2 if seg[0].kind == "seal" else kept1).append(k)
                continue
            if seg[0].kind == "seal":
                seals.append((f, seg[0]))
                continue
            tasks1.append(
                RangeTask(
                    f.name,
                    off,
                    sum(p.length for p in seg),
                    seg,
                    staging.target(f.name, off),
                    staging.remote,
                    opener,
                    weights_only,
                    opts,
                    staging.shown(f.name),
                )
            )
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
            tasks2.append(
                RangeTask(
                    f.name,
                    p.offset,
                    p.length,
                    [q],
                    staging.target(f.name, p.offset),
                    staging.remote,
                    opener,
                    weights_only,
                    opts,
                    staging.shown(f.name),
                )
            )
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


# -- sharded safetensors (consolidate, convert) -----------------------------------------------------
class LocalFilesStaging(LocalDirStaging):
    """A hidden folder inside the destination's folder; published by renaming each file
    into that folder, the index last (the folder itself is not replaced)."""

    def __init__(self, dst: str, *, resume: bool) -> None:
        from ..io.atomic import _temp_path, _track, _untrack, clean_stale

        self.dst = os.path.abspath(dst)
        self.shown_dir = os.path.dirname(dst)
        self.folder = os.path.dirname(self.dst)
        adopted = _adopt_local(self.folder, self.dst) if resume else None
        self.root = _temp_path(self.folder, "dir")
        if adopted is not None:  # renamed to this process's name before stale ones are swept
            os.rename(adopted, self.root)
        else:
            os.mkdir(self.root, 0o777)
        clean_stale(self.folder)
        self.keep = resume
        self.out = self  # type: ignore[assignment]  # this staging publishes its files itself (no AtomicDir)
        if not resume:
            _track(self, self.root, True)
        self._untrack = _untrack

    def publish(self, last: tuple[str, ...]) -> None:
        import shutil

        from ..io.atomic import holding_signals

        try:
            os.unlink(os.path.join(self.root, MANIFEST))
        except OSError:
            pass
        with holding_signals():
            for n in sorted(os.listdir(self.root), key=lambda n: (n in last, n)):
                os.replace(os.path.join(self.root, n), os.path.join(self.folder, n))
            shutil.rmtree(self.root, ignore_errors=True)
            self._untrack(self)

    def abort(self, e: BaseException | None = None) -> None:
        import shutil

        if self.keep:
            return
        shutil.rmtree(self.root, ignore_errors=True)
        self._untrack(self)


def write_shards(
    src: str,
    entries: list[tuple[str, Any, tuple[int, ...], int]],
    dst: Any,
    *,
    max_shard_size: Any = None,
    metadata: dict[str, str] | None = None,
    executor: Any = None,
    max_task_bytes: int | None = None,
    resume: bool = False,
    progress: Callable[[int], None] | None = None,
) -> list[str]:
    """Write the tensors ``entries`` (``(name, dtype, shape, nbytes)``) of checkpoint
    ``src`` as safetensors at ``dst`` (Hugging Face shards + index with
    ``max_shard_size``, laid out as :func:`~torchless.formats.safetensors.write_safetensors_sharded`
    does), by range tasks on ``executor``. Returns the files written, the index last."""
    from ..jobs.executor import parse_executor
    from .safetensors import parse_size, safetensors_header

    d = remote.local_path(os.fspath(dst))
    groups: list[list[tuple[str, Any, tuple[int, ...], int]]] = [[]]
    size = total = 0
    limit = parse_size(max_shard_size) if max_shard_size else None
    for e in entries:
        if groups[-1] and limit is not None and size + e[3] > limit:
            groups.append([])
            size = 0
        groups[-1].append(e)
        size += e[3]
        total += e[3]
    base = remote.basename(d) if remote.is_url(d) else os.path.basename(d)
    stem = base[: -len(".safetensors")] if base.endswith(".safetensors") else base
    n = len(groups)
    names = [base] if n == 1 else [f"{stem}-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]
    files: list[OutputFile] = []
    weight_map: dict[str, str] = {}
    for fname, group in zip(names, groups, strict=False):
        hdr = safetensors_header(group, metadata)
        pieces = [Piece(0, len(hdr), "bytes", data=hdr)]
        pos = len(hdr)
        for name, dt, shape, _nb in group:
            zero = (0,) * len(shape)
            cuts = split_rows(zero, tuple(shape), dt.itemsize, max_task_bytes) if max_task_bytes else [(zero, tuple(shape))]
            for offs, sizes in cuts:
                m = dt.itemsize
                for s in sizes:
                    m *= s
                pieces.append(Piece(pos, m, "rows", src=src, fqn=name, offsets=offs, sizes=sizes))
                pos += m
            weight_map[name] = fname
        files.append(OutputFile(fname, pos, pieces))
    ex = parse_executor(executor, where=d, paths=(src, d))
    staging: Any = None
    index = base + ".index.json"
    try:
        if remote.is_url(d):
            staging = RemoteStaging(d, resume=resume, folder=False)
        else:
            staging = LocalFilesStaging(d, resume=resume)
        write_outputs(
            files,
            staging,
            ex,
            max_task_bytes=max_task_bytes,
            fingerprint={"source": src, "shards": n, "metadata": metadata},
            progress=progress,
        )
        if n > 1:
            staging.put(index, json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2).encode())
        staging.publish(last=(index,))
    except BaseException as e:
        if staging is not None:
            staging.abort(e)
        raise
    finally:
        close_sources()
        ex.close()
    folder = remote.dirname(d) if remote.is_url(d) else os.path.dirname(d)
    out = [remote.join(folder, f.name) if remote.is_url(d) else os.path.join(folder, f.name) for f in files]
    return out + ([remote.join(folder, index) if remote.is_url(d) else os.path.join(folder, index)] if n > 1 else [])
