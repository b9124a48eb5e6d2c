"""Writing DCP directories: reshard N ranks to M, or split one file into M ranks.

The work is planned as independent :class:`FileTask` objects, one per output
``__<rank>_0.distcp`` file; each names its source by path and lists the items to write,
so tasks run in any order, in this process or in a pool of processes (``jobs``), and
could be shipped to a cluster executor. The coordinator writes ``.metadata`` last, from
the byte ranges the tasks report, so a crashed run never leaves a loadable half-written
checkpoint.

A sharding plan says, per tensor, how the global tensor is split across the M ranks:
along a dimension (``row`` = dim 0, ``col`` = dim 1, ``dim:N``; ``torch.chunk``'s split,
empty pieces dropped) or ``replicate`` (one full chunk, written by the least-loaded
rank, as DCP's save-plan deduplication does). Rules are ``PATTERN=SPEC`` (fnmatch on the
flattened key) separated by commas; a bare ``SPEC`` sets the default. The default
``auto`` shards along dim 0 when it has at least M rows, and replicates otherwise.
"""

from __future__ import annotations

import fnmatch
import io
import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np

from ...core.errors import NotFoundError, UnsupportedError, UsageError
from ...core.tensor import Storage, Tensor
from ...io.atomic import AtomicDir, AtomicFile, atomic_write_bytes
from ...io.remote import accepts_storage_options as _remote_opts
from ...io.source import RemoteSource
from ...io.store import LOCAL, Store, resolve
from .metadata import dump_metadata
from .read import BlockStorage as _BlockStorage
from .read import pread_into
from .readers import open_reader
from .spec import (
    CURRENT_DCP_VERSION,
    METADATA_NAME,
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    StorageInfo,
    StorageMeta,
    TensorProperties,
    TensorStorageMetadata,
    numel,
)

__all__ = [
    "ShardSpec",
    "parse_plan",
    "plan_reshard",
    "FileTask",
    "run_task",
    "reshard",
    "FileSource",
    "open_source_checkpoint",
    "flatten_state_dict",
]


# -- sharding plans ---------------------------------------------------------------------------
@dataclass(frozen=True)
class ShardSpec:
    """``kind`` is ``"dim"`` (split along ``dim``), ``"replicate"`` or ``"auto"``."""

    kind: str
    dim: int = 0

    @classmethod
    def parse(cls, text: str) -> ShardSpec:
        t = text.strip().lower()
        if t in ("row", "rows", "rowwise", "row-wise"):
            return cls("dim", 0)
        if t in ("col", "cols", "colwise", "column", "column-wise"):
            return cls("dim", 1)
        if t in ("replicate", "replicated", "rep"):
            return cls("replicate")
        if t == "auto":
            return cls("auto")
        if t.startswith("dim:") or t.startswith("dim="):
            try:
                return cls("dim", int(t[4:]))
            except ValueError:
                pass
        raise UsageError(f"bad sharding spec {text!r}", expected="row, col, dim:N, replicate or auto")


@dataclass
class Plan:
    default: ShardSpec = ShardSpec("auto")
    rules: list[tuple[str, ShardSpec]] = field(default_factory=list)

    def spec_for(self, fqn: str) -> ShardSpec:
        for pat, spec in self.rules:
            if fnmatch.fnmatchcase(fqn, pat):
                return spec
        return self.default


def parse_plan(text: str | None) -> Plan:
    """``"auto"``, ``"row"``, ``"*.bias=replicate,lm_head.*=col,row"`` ..."""
    plan = Plan()
    if not text:
        return plan
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if "=" in part and not part.lower().startswith("dim="):
            pat, spec = part.rsplit("=", 1)
            plan.rules.append((pat.strip(), ShardSpec.parse(spec)))
        else:
            plan.default = ShardSpec.parse(part)
    return plan


def split_tensor(size: tuple[int, ...], spec: ShardSpec, ranks: int) -> list[ChunkStorageMetadata] | None:
    """Per-rank chunks (None: replicate). ``torch.chunk`` semantics; empty pieces dropped."""
    if spec.kind == "auto":
        spec = ShardSpec("dim", 0) if size and size[0] >= ranks and ranks > 1 else ShardSpec("replicate")
    if spec.kind == "replicate" or ranks == 1:
        return None
    d = spec.dim if spec.dim >= 0 else spec.dim + len(size)
    if not 0 <= d < len(size):
        return None
    n = size[d]
    step = -(-n // ranks) if n else 0
    out: list[ChunkStorageMetadata] = []
    for r in range(ranks):
        a = min(r * step, n)
        b = min(a + step, n)
        if b <= a:
            continue
        offs = tuple(a if i == d else 0 for i in range(len(size)))
        sizes = tuple(b - a if i == d else s for i, s in enumerate(size))
        out.append(ChunkStorageMetadata(offs, sizes))
    return out


# -- sources: a DCP directory or one checkpoint file ---------------------------------------------
def flatten_state_dict(obj: Any) -> tuple[dict[str, Any], dict[str, tuple]]:
    """DCP's flattening (``traverse_state_dict``): mappings are walked by ``str(key)``
    (an empty one vanishes), lists holding a tensor, a mapping or such a list by index;
    anything else (tuples included) is a leaf. Returns
    ``({dotted key: leaf}, {dotted key: key path})``."""

    def has_tensor(v: Any) -> bool:  # torch's ``not _is_terminal`` for lists
        return any(isinstance(x, (Tensor, dict)) or isinstance(x, list) and has_tensor(x) for x in v)

    flat: dict[str, Any] = {}
    paths: dict[str, tuple] = {}

    def walk(path: tuple, v: Any) -> None:
        if isinstance(v, dict):
            for k, x in v.items():
                walk(path + (str(k),), x)
        elif isinstance(v, list) and has_tensor(v):
            for i, x in enumerate(v):
                walk(path + (i,), x)
        else:
            key = ".".join(str(p) for p in path)
            flat[key] = v
            paths[key] = path

    if not isinstance(obj, dict):
        raise UsageError("a DCP checkpoint holds a state dict", expected="a dict at the top", found=type(obj).__name__)
    for k, v in obj.items():
        walk((str(k),), v)
    return flat, paths


class FileSource:
    """A single checkpoint file (``.pt``, ``.safetensors``, ``.npz`` ...) seen as DCP items."""

    def __init__(self, path: Any, *, weights_only: bool = True) -> None:
        from ..dispatch import open_artifact
        from ..registry import detect

        self.path = os.fspath(path)
        if detect(self.path).name == "pt":
            obj = open_artifact(self.path, weights_only=weights_only).load(weights_only=weights_only)
        else:
            self._art = open_artifact(self.path)
            obj = dict(self._art.tensors())
        flat, self.planner_data = flatten_state_dict(obj)
        self.entries: dict[str, Any] = {}
        self._tensors: dict[str, Tensor] = {}
        self._values: dict[str, Any] = {}
        for k, v in flat.items():
            if isinstance(v, Tensor):
                if v.quantizer is not None or v.storage is None:
                    raise UnsupportedError("quantized or meta tensors cannot be written to DCP", path=self.path, member=k)
                self._tensors[k] = v
                self.entries[k] = TensorStorageMetadata(
                    TensorProperties(v.dtype, requires_grad=v.requires_grad), tuple(v.shape), []
                )
            else:
                self._values[k] = v
                self.entries[k] = BytesStorageMetadata()

    def read_block(self, fqn: str, offsets: tuple[int, ...], sizes: tuple[int, ...]) -> np.ndarray:
        t = self._tensors[fqn]
        arr = t.numpy(raw=True)
        sl = tuple(slice(o, o + s) for o, s in zip(offsets, sizes, strict=False))
        block = np.ascontiguousarray(arr[sl])
        if block.dtype.byteorder == ">":
            block = block.astype(block.dtype.newbyteorder("<"))
        return block.reshape(-1).view(np.uint8)

    def raw_item(self, fqn: str) -> bytes:
        from ..pt.write import save_checkpoint

        bio = io.BytesIO()
        save_checkpoint(self._values[fqn], bio)
        return bio.getvalue()

    def exact_chunk(self, fqn: str, offsets: tuple[int, ...], sizes: tuple[int, ...]) -> None:
        return None

    def close(self) -> None:
        art = getattr(self, "_art", None)
        if art is not None:
            art.close()


class _DCPSource:
    """A DCP directory as a source (wraps :class:`DCPReader`)."""

    def __init__(self, path: Any, store: Store) -> None:
        self.reader = open_reader(path, store)
        self.path = self.reader.path
        self.entries = self.reader.entries
        self.planner_data = self.reader.metadata.planner_data

    def read_block(self, fqn: str, offsets: tuple[int, ...], sizes: tuple[int, ...]) -> np.ndarray:
        return self.reader.read_block(fqn, offsets, sizes)

    def raw_item(self, fqn: str) -> bytes:
        return self.reader.raw_item(fqn)

    def exact_chunk(self, fqn: str, offsets: tuple[int, ...], sizes: tuple[int, ...]) -> StorageInfo | None:
        """A saved chunk identical to the one to write (its torch.save bytes are copied)."""
        if getattr(self.reader, "flavour", "torch_save") != "torch_save":
            return None  # safetensors payloads are raw bytes, not torch.save streams
        for ref in self.reader.chunks(fqn):
            if ref.chunk.offsets == offsets and ref.chunk.sizes == sizes:
                return ref.info
        return None

    def close(self) -> None:
        self.reader.close()


def open_source_checkpoint(path: Any, *, weights_only: bool = True) -> Any:
    """The checkpoint to reshard (a DCP folder or any file): the source's location enters
    here (the public :func:`reshard`, and each task's worker), resolved once."""
    store, p = resolve(os.fspath(path))
    if store.isdir(p):
        return _DCPSource(p, store)
    if not store.remote and not os.path.exists(p):  # (a URL's reader says it is missing)
        raise NotFoundError("no such file or directory", path=p)
    return FileSource(p, weights_only=weights_only)


# -- tasks ------------------------------------------------------------------------------------------
@dataclass
class WriteItem:
    fqn: str
    offsets: tuple[int, ...] | None = None  # None: a bytes item
    sizes: tuple[int, ...] | None = None


@dataclass
class FileTask:
    """Write one ``.distcp`` file: ``items`` read from ``src``, in order."""

    src: str
    dst_dir: str
    name: str
    items: list[WriteItem]
    weights_only: bool = True
    format: str = "torch_save"  # or "hf": one safetensors file with DCP_SHARDING_INFO


@dataclass
class WrittenItem:
    fqn: str
    offsets: tuple[int, ...] | None
    relative_path: str
    offset: int
    length: int


def _copy_range(src_path: str, info: StorageInfo, out: Any, at_url: bool) -> None:
    if at_url:  # a saved chunk of a remote checkpoint: its range, in 64 MiB requests
        rs = RemoteSource(src_path)
        for done in range(0, info.length, 64 << 20):
            out.write(rs.read_at(info.offset + done, min(64 << 20, info.length - done), what="chunk"))
        return
    fd = os.open(src_path, os.O_RDONLY)
    try:
        buf = np.empty(min(info.length, 64 << 20), dtype=np.uint8)
        done = 0
        while done < info.length:
            n = min(len(buf), info.length - done)
            pread_into(fd, buf.data[:n], info.offset + done, path=src_path)
            out.write(buf.data[:n])
            done += n
    finally:
        os.close(fd)


def run_task(task: FileTask, source: Any = None) -> list[WrittenItem]:
    """Write one file; returns where each item landed. Opens ``task.src`` unless given."""
    from ...jobs.hooks import task_fault
    from ..pt.write import save_checkpoint

    task_fault()
    own = source is None
    src = open_source_checkpoint(task.src, weights_only=task.weights_only) if own else source
    written: list[WrittenItem] = []
    try:
        if task.format == "hf":
            return _run_hf_task(task, src)
        target = os.path.join(task.dst_dir, task.name)
        with AtomicFile(target) as af:
            f = af.file
            pos = 0
            for it in task.items:
                start = pos
                if it.offsets is None:
                    data = src.raw_item(it.fqn)
                    f.write(data)
                    pos += len(data)
                else:
                    assert it.sizes is not None
                    exact = src.exact_chunk(it.fqn, it.offsets, it.sizes)
                    if exact is not None:
                        _copy_range(src.reader.real_path(exact.relative_path), exact, f, src.reader.remote)
                        pos += exact.length
                    else:
                        tmd = src.entries[it.fqn]
                        block = src.read_block(it.fqn, it.offsets, it.sizes)
                        st = Storage("0", block.nbytes, tmd.dtype, "cpu", data=block)
                        counter = _Counting(f)
                        save_checkpoint(Tensor(st, tmd.dtype, it.sizes), counter)
                        del block, st
                        pos += counter.n
                written.append(WrittenItem(it.fqn, it.offsets, task.name, start, pos - start))
    finally:
        if own:
            src.close()
    return written


class _Counting:
    """A write-only file wrapper counting bytes (TorchZipWriter writes sequentially)."""

    def __init__(self, f: Any) -> None:
        self.f = f
        self.n = 0

    def write(self, b: Any) -> int:
        n = len(memoryview(b).cast("B")) if not isinstance(b, (bytes, bytearray)) else len(b)
        self.f.write(b)
        self.n += n
        return n

    def flush(self) -> None:
        pass


def _run_hf_task(task: FileTask, src: Any) -> list[WrittenItem]:
    import json

    from ..safetensors import write_safetensors
    from .constants import SHARDING_KEY, VERSION_KEY

    items = []
    info = {}
    for it in task.items:
        if it.offsets is None or it.sizes is None:  # a bytes item
            continue
        tmd = src.entries[it.fqn]
        dt = tmd.dtype
        nbytes = numel(it.sizes) * dt.itemsize
        st = _BlockStorage(it.fqn, nbytes, dt, "cpu", loader=partial(src.read_block, it.fqn, it.offsets, it.sizes))
        items.append((it.fqn, Tensor(st, dt, it.sizes)))
        info[it.fqn] = {"saved_offsets": list(it.offsets)}
    meta = {"format": "pt", SHARDING_KEY: json.dumps(info), VERSION_KEY: "1.0"}
    write_safetensors(items, os.path.join(task.dst_dir, task.name), metadata=meta)
    return [WrittenItem(it.fqn, it.offsets, task.name, 0, 0) for it in task.items if it.offsets is not None]


def plan_reshard(
    source: Any, dst_dir: str, ranks: int, plan: Plan, *, weights_only: bool = True, format: str = "torch_save"
) -> tuple[list[FileTask], Metadata]:
    """The tasks (one per rank file) and the metadata skeleton (chunks, no storage data)."""
    from .hf import hf_file_name

    if ranks < 1:
        raise UsageError("ranks must be at least 1", found=ranks)
    if format not in ("torch_save", "hf"):
        raise UsageError(f"unknown DCP storage format {format!r}", expected="torch_save or hf")
    names = [f"__{r}_0.distcp" if format == "torch_save" else hf_file_name(r) for r in range(ranks)]
    load = [0] * ranks
    bytes_items: list[list[WriteItem]] = [[] for _ in range(ranks)]
    tensor_items: list[list[WriteItem]] = [[] for _ in range(ranks)]
    sdm: dict[str, Any] = {}
    src_path = os.fspath(source.path)
    for fqn, it in source.entries.items():
        if isinstance(it, BytesStorageMetadata):
            r = min(range(ranks), key=lambda i: load[i])
            bytes_items[r].append(WriteItem(fqn))
            load[r] += 1024
            sdm[fqn] = BytesStorageMetadata()
            continue
        size = tuple(it.size)
        chunks = split_tensor(size, plan.spec_for(fqn), ranks)
        isz = it.dtype.itemsize
        if chunks is None:
            r = min(range(ranks), key=lambda i: load[i])
            c = ChunkStorageMetadata((0,) * len(size), size)
            tensor_items[r].append(WriteItem(fqn, c.offsets, c.sizes))
            load[r] += numel(size) * isz
            chunks = [c]
        else:
            # the largest piece to the least loaded file: torch.chunk's pieces are unequal
            # (a short last piece, or fewer pieces than ranks), and always on the same
            # ranks, so rank files drift apart over many tensors; any file may hold any
            # chunk (.metadata says where). Equal pieces on equal files keep piece r in file r.
            if len(chunks) == ranks and len({c.sizes for c in chunks}) == 1 and len(set(load)) == 1:
                slots = list(range(ranks))
            else:
                order = sorted(range(ranks), key=lambda i: (load[i], i))
                by_size = sorted(range(len(chunks)), key=lambda k: (-numel(chunks[k].sizes), k))
                slots = [0] * len(chunks)
                for pos, k in enumerate(by_size):
                    slots[k] = order[pos]
            for k, c in enumerate(chunks):
                r = slots[k]
                tensor_items[r].append(WriteItem(fqn, c.offsets, c.sizes))
                load[r] += numel(c.sizes) * isz
        props = TensorProperties(
            it.dtype, it.properties.layout, it.properties.requires_grad, it.properties.memory_format, it.properties.pin_memory
        )
        sdm[fqn] = TensorStorageMetadata(props, size, list(chunks))
    tasks = [FileTask(src_path, dst_dir, names[r], bytes_items[r] + tensor_items[r], weights_only, format) for r in range(ranks)]
    md = Metadata(
        sdm, _planner_data(source), None, StorageMeta(checkpoint_id=dst_dir, save_id=str(uuid.uuid4())), CURRENT_DCP_VERSION
    )
    return tasks, md


def _planner_data(source: Any) -> dict[str, tuple]:
    pd = source.planner_data if isinstance(source.planner_data, dict) else {}
    return {k: tuple(pd.get(k) or (k,)) for k in source.entries}


def _check_dest(dst: str, resume: bool = False, store: Store = LOCAL) -> None:
    """Refuse a destination that already holds a DCP checkpoint (the temporaries of a
    killed run are not one: they are removed by :class:`~torchless.io.atomic.AtomicDir`;
    nor, with ``resume``, the rank files an interrupted job with a staging for ``dst``
    had moved into place before its ``.metadata``: the resumed job overwrites them)."""
    if store.remote:
        # a failed check is never taken as "nothing there": that would write over a
        # checkpoint the store could not show us
        names: list[str] = []
        if store.exists(dst, "cannot check the reshard destination"):
            if not store.isdir(dst):
                raise UsageError("destination exists and is not a directory", path=dst)
            names = store.list(dst)  # raises with the store's reason when it cannot list
        stale = [n for n in names if n == METADATA_NAME or n.endswith((".distcp", ".safetensors"))]
        if stale and resume and METADATA_NAME not in stale:
            from ...jobs.staging import remote_staging_for

            if remote_staging_for(dst):
                return
        if stale:
            raise UsageError(
                "destination already holds a DCP checkpoint",
                path=dst,
                found=", ".join(sorted(stale)[:4]),
                hint="choose an empty directory",
            )
        return
    if os.path.exists(dst):
        if not os.path.isdir(dst):
            raise UsageError("destination exists and is not a directory", path=dst)
        stale = [n for n in os.listdir(dst) if n == METADATA_NAME or n.endswith((".distcp", ".safetensors"))]
        if stale:
            raise UsageError(
                "destination already holds a DCP checkpoint",
                path=dst,
                found=", ".join(sorted(stale)[:4]),
                hint="choose an empty directory",
            )


@_remote_opts
def reshard(
    src: Any,
    dst: Any,
    ranks: int,
    *,
    plan: str | Plan | None = None,
    jobs: int = 1,
    weights_only: bool = True,
    format: str = "torch_save",
    progress: Callable[[int], None] | None = None,
    executor: Any = None,
    max_task_bytes: int | None = None,
    resume: bool = False,
) -> dict[str, Any]:
    """Write a DCP directory of ``ranks`` rank files from a DCP directory or one file.

    Args:
        src: a DCP directory (``.metadata`` or DCP-sharded safetensors) or one
            ``.pt``/``.safetensors``/``.npz`` file.
        plan: sharding rules (see the module doc); default ``auto``.
        jobs: processes writing rank files in parallel.
        progress: called with the bytes each finished task wrote (a rank file, or a
            range task's range).
        format: ``"torch_save"`` (``__R_0.distcp`` + ``.metadata``, torch's default) or
            ``"hf"`` (per-rank safetensors with ``DCP_SHARDING_INFO``, read by
            ``HuggingFaceStorageReader``; non-tensor values are skipped).
        executor: where the tasks run: ``"local:N"`` (processes), ``"dask://HOST:PORT"``
            or a ``distributed.Client`` (see :mod:`torchless.jobs.executor`). With an
            executor, ``max_task_bytes`` or ``resume``, the job runs as range tasks
            (:mod:`torchless.jobs.outputs`); otherwise one task per rank file in
            ``jobs`` processes.
        max_task_bytes: the most bytes one task writes (a rank file larger than that is
            written by several tasks into the pre-sized staged file); bounds a
            worker's memory.
        resume: pick up the staging an interrupted job left for ``dst`` (files it
            completed are verified by size and CRC-32, and kept; at a URL, so are the
            part objects it finished), and keep this job's staging if it is interrupted.

    Returns ``{"files": [...], "tensors": n, "chunks": n, "bytes_items": n, "skipped": [...]}``
    (with an executor also ``"tasks"``, ``"resumed"``, ``"resumed_parts"`` and ``"peak_rss"``).
    """
    p = plan if isinstance(plan, Plan) else parse_plan(plan)
    store, dst = resolve(os.fspath(dst))  # the destination's store, asked once
    _check_dest(dst, resume, store)
    source = open_source_checkpoint(src, weights_only=weights_only)
    if executor is not None or max_task_bytes is not None or resume:
        try:
            return _reshard_ranged(
                source, dst, ranks, p, weights_only, format, executor, jobs, max_task_bytes, resume, progress, store
            )
        finally:
            source.close()
    try:
        # the rank files and .metadata are built in a hidden folder beside ``dst`` and
        # published by one rename (or moved in, .metadata last, into an existing folder)
        out = AtomicDir(dst, merge=True, store=store)
        try:
            tasks, md = plan_reshard(source, out.tmp, ranks, p, weights_only=weights_only, format=format)
            md.storage_meta = (
                StorageMeta(checkpoint_id=dst if store.remote else os.path.abspath(dst), save_id=md.storage_meta.save_id)
                if md.storage_meta
                else None
            )
            results: list[list[WrittenItem]] = []
            if jobs <= 1 or len(tasks) <= 1:
                for t in tasks:
                    results.append(run_task(t, source))
                    if progress is not None:
                        progress(sum(w.length for w in results[-1]))
            else:
                results = _run_parallel(tasks, jobs, progress)
            summary = _finish_metadata(out.tmp, tasks, md, results, format)
            out.commit(last=(METADATA_NAME,))
        except BaseException as e:
            out.abort()
            out.public(e)
            raise
    finally:
        source.close()
    return summary


def _finish_metadata(
    folder: str | Callable[[bytes], None],
    tasks: list[FileTask],
    md: Metadata,
    results: list[list[WrittenItem]],
    format: str,
) -> dict[str, Any]:
    n_t = sum(1 for v in md.state_dict_metadata.values() if isinstance(v, TensorStorageMetadata))
    n_c = sum(len(v.chunks) for v in md.state_dict_metadata.values() if isinstance(v, TensorStorageMetadata))
    if format == "hf":
        skipped = [k for k, v in md.state_dict_metadata.items() if not isinstance(v, TensorStorageMetadata)]
        return {"files": [t.name for t in tasks], "tensors": n_t, "chunks": n_c, "bytes_items": 0, "skipped": skipped}
    storage: dict[MetadataIndex, StorageInfo] = {}
    where = {(w.fqn, w.offsets): w for res in results for w in res}
    for fqn, it in md.state_dict_metadata.items():
        if isinstance(it, TensorStorageMetadata):
            for i, c in enumerate(it.chunks):
                w = where[(fqn, c.offsets)]
                storage[MetadataIndex(fqn, c.offsets, i)] = StorageInfo(w.relative_path, w.offset, w.length)
        else:
            w = where[(fqn, None)]
            storage[MetadataIndex(fqn, None, None)] = StorageInfo(w.relative_path, w.offset, w.length)
    md.storage_data = storage
    if callable(folder):
        folder(dump_metadata(md))
    else:
        atomic_write_bytes(os.path.join(folder, METADATA_NAME), dump_metadata(md))
    return {
        "files": [t.name for t in tasks],
        "tensors": n_t,
        "chunks": n_c,
        "bytes_items": len(md.state_dict_metadata) - n_t,
        "skipped": [],
    }


def _run_parallel(tasks: list[FileTask], jobs: int, progress: Callable[[int], None] | None) -> list[list[WrittenItem]]:
    """Run the tasks in ``jobs`` worker processes (:func:`~torchless.jobs.executor.pool_map`:
    Ctrl-C is the coordinator's; a worker that dies or a stalled pool fails the run
    instead of leaving it waiting; the workers' remote traffic is counted here)."""
    from ...jobs.executor import pool_map

    def done(written: list[WrittenItem]) -> None:
        if progress is not None:
            progress(sum(w.length for w in written or []))

    out = pool_map(run_task, tasks, jobs, done, where=tasks[0].dst_dir, what="a worker process writing rank files")
    return [r or [] for r in out]


# -- range tasks on an executor (local processes, Dask) -------------------------------------------
def _reshard_ranged(
    source: Any,
    dst: str,
    ranks: int,
    p: Plan,
    weights_only: bool,
    format: str,
    executor: Any,
    jobs: int,
    max_task_bytes: int | None,
    resume: bool,
    progress: Callable[[int], None] | None,
    store: Store = LOCAL,
) -> dict[str, Any]:
    from ...jobs.executor import parse_executor
    from ...jobs.outputs import write_outputs
    from ...jobs.staging import LocalDirStaging, RemoteStaging
    from ...jobs.tasks import close_sources
    from ..pt.item import pt_item_template, write_item

    ex = parse_executor(executor, jobs=jobs, where=dst, paths=(getattr(source, "path", None), dst))
    staging: Any = None
    try:
        staging = RemoteStaging(dst, resume=resume) if store.remote else LocalDirStaging(dst, resume=resume)
        tasks, md = plan_reshard(source, "<staged>", ranks, p, weights_only=weights_only, format=format)
        md.storage_meta = StorageMeta(
            checkpoint_id=dst if store.remote else os.path.abspath(dst),
            save_id=md.storage_meta.save_id if md.storage_meta else str(uuid.uuid4()),
        )
        files, results = _ranged_layout(source, tasks, format, max_task_bytes)
        info = write_outputs(
            files,
            staging,
            ex,
            max_task_bytes=max_task_bytes,
            opener=open_source_checkpoint,
            weights_only=weights_only,
            fingerprint={"source": os.fspath(source.path), "ranks": ranks, "format": format},
            progress=progress,
            seal=lambda piece, crc: pt_item_template(piece.dtype, piece.sizes, crc)[2],
            item_writer=write_item,
        )
        summary = _finish_metadata(lambda data: staging.put(METADATA_NAME, data), tasks, md, results, format)
        staging.publish(last=(METADATA_NAME,))
    except BaseException as e:
        if staging is not None:
            staging.abort(e)
        raise
    finally:
        close_sources()
        ex.close()
    summary.update(
        {
            "tasks": info["tasks"],
            "resumed": info["resumed"],
            "resumed_parts": info["resumed_parts"],
            "peak_rss": max(info["rss"], default=0),
        }
    )
    summary["executor"] = ex.name
    return summary


def _ranged_layout(
    source: Any, tasks: list[FileTask], format: str, budget: int | None
) -> tuple[list[Any], list[list[WrittenItem]]]:
    """Every rank file as pieces at known offsets, and where each item lands (for
    ``.metadata``); computed from metadata alone (non-tensor values of a single-file
    source are pickled here: they are small)."""
    from ...jobs.plan import OutputFile, Piece, split_rows
    from ..pt.item import pt_item_template

    files: list[OutputFile] = []
    results: list[list[WrittenItem]] = []
    src_path = os.fspath(source.path)
    item_no = 0
    for t in tasks:
        pieces: list[Piece] = []
        written: list[WrittenItem] = []
        pos = 0
        if format == "hf":
            hdr, entries = _hf_header(source, t)
            pieces.append(Piece(0, len(hdr), "bytes", data=hdr))
            pos = len(hdr)
            for it, dt, _n in entries:
                assert it.offsets is not None and it.sizes is not None
                for offs, sizes in split_rows(it.offsets, it.sizes, dt.itemsize, budget) if budget else [(it.offsets, it.sizes)]:
                    m = numel(sizes) * dt.itemsize
                    pieces.append(Piece(pos, m, "rows", src=src_path, fqn=it.fqn, offsets=offs, sizes=sizes))
                    pos += m
                written.append(WrittenItem(it.fqn, it.offsets, t.name, 0, 0))
            files.append(OutputFile(t.name, pos, pieces))
            results.append(written)
            continue
        for it in t.items:
            start = pos
            if it.offsets is None:
                info = _bytes_info(source, it.fqn)
                if info is not None:
                    path, off, n = info
                    pieces.append(Piece(pos, n, "copy", src=path, src_offset=off, remote=source.reader.remote))
                else:
                    data = source.raw_item(it.fqn)
                    n = len(data)
                    pieces.append(Piece(pos, n, "bytes", data=data))
                pos += n
                written.append(WrittenItem(it.fqn, None, t.name, start, n))
                continue
            assert it.sizes is not None
            exact = source.exact_chunk(it.fqn, it.offsets, it.sizes)
            if exact is not None:
                real = source.reader.real_path(exact.relative_path)
                step = budget or exact.length
                for a in range(0, exact.length, step):
                    n = min(step, exact.length - a)
                    pieces.append(Piece(pos, n, "copy", src=real, src_offset=exact.offset + a, remote=source.reader.remote))
                    pos += n
                written.append(WrittenItem(it.fqn, it.offsets, t.name, start, exact.length))
                continue
            dt = source.entries[it.fqn].dtype
            payload = numel(it.sizes) * dt.itemsize
            if budget is None or payload + 4096 <= budget or payload < (1 << 18):
                n = _pt_item_length(dt.name, it.sizes)
                pieces.append(
                    Piece(pos, n, "ptitem", src=src_path, fqn=it.fqn, offsets=it.offsets, sizes=it.sizes, dtype=dt.name)
                )
                pos += n
            else:  # larger than a task: header, payload rows, then a seal once the payload's CRC is known
                head, plen, tail = pt_item_template(dt.name, it.sizes)
                pieces.append(Piece(pos, len(head), "bytes", data=head))
                pos += len(head)
                for offs, sizes in split_rows(it.offsets, it.sizes, dt.itemsize, budget):
                    m = numel(sizes) * dt.itemsize
                    pieces.append(Piece(pos, m, "rows", src=src_path, fqn=it.fqn, offsets=offs, sizes=sizes, item=item_no))
                    pos += m
                pieces.append(Piece(pos, len(tail), "seal", fqn=it.fqn, sizes=it.sizes, dtype=dt.name, item=item_no))
                pos += len(tail)
                item_no += 1
            written.append(WrittenItem(it.fqn, it.offsets, t.name, start, pos - start))
        files.append(OutputFile(t.name, pos, pieces))
        results.append(written)
    return files, results


def _bytes_info(source: Any, fqn: str) -> tuple[str, int, int] | None:
    """A DCP source's stored bytes item as ``(file, offset, length)`` (copied as is)."""
    reader = getattr(source, "reader", None)
    if reader is None:
        return None
    info = reader._by_key.get((fqn, None))
    if info is None:
        return None
    return reader.real_path(info.relative_path), info.offset, info.length


_ITEM_LENGTHS: dict[tuple[str, tuple[int, ...]], int] = {}


def _pt_item_length(dtype: str, sizes: tuple[int, ...]) -> int:
    """The length of the ``torch.save`` stream of one tensor (computed without its data)."""
    key = (dtype, tuple(sizes))
    n = _ITEM_LENGTHS.get(key)
    if n is not None:
        return n
    from ...core.dtypes import by_name

    dt = by_name(dtype)
    nbytes = numel(sizes) * dt.itemsize
    if nbytes >= 1 << 18:
        from ..pt.item import pt_item_template

        head, plen, tail = pt_item_template(dtype, sizes)
        n = len(head) + plen + len(tail)
    else:
        from ..pt.write import save_checkpoint

        counter = _Counting(_Null())
        zeros = np.zeros(nbytes, dtype=np.uint8)
        save_checkpoint(Tensor(Storage("0", nbytes, dt, "cpu", data=zeros), dt, tuple(sizes)), counter)
        n = counter.n
    if len(_ITEM_LENGTHS) < 4096:
        _ITEM_LENGTHS[key] = n
    return n


class _Null:
    def write(self, b: Any) -> int:
        return len(memoryview(b).cast("B"))


def _hf_header(source: Any, task: FileTask) -> tuple[bytes, list[tuple[WriteItem, Any, int]]]:
    """The safetensors header of one ``hf`` rank file (what :func:`_run_hf_task` writes)."""
    import json

    from ..safetensors import safetensors_header
    from .constants import SHARDING_KEY, VERSION_KEY

    entries = []
    info = {}
    for it in task.items:
        if it.offsets is None or it.sizes is None:
            continue
        dt = source.entries[it.fqn].dtype
        entries.append((it, dt, numel(it.sizes) * dt.itemsize))
        info[it.fqn] = {"saved_offsets": list(it.offsets)}
    meta = {"format": "pt", SHARDING_KEY: json.dumps(info), VERSION_KEY: "1.0"}
    hdr = safetensors_header([(it.fqn, dt, tuple(it.sizes or ()), n) for it, dt, n in entries], meta)
    return hdr, entries
