"""Helpers shared by the tests: compare torchless objects with torch's, build hostile files."""

from __future__ import annotations

import dataclasses
import io
import struct
import sys
import tarfile
import zlib
from typing import Any

import numpy as np

import torchless
from torchless.core.errors import TorchlessError
from torchless.core.tensor import NestedTensor, SparseTensor, Tensor
from torchless.pickle.writer import Global, Persistent, Pickler2


def small_dcp_state(seed: int = 0) -> dict[str, Any]:
    """A small flat state dict for DCP round trips: float32, bfloat16 and int64 tensors and
    one non-tensor value (``step``), drawn from torch's generator seeded with ``seed``."""
    import torch

    g = torch.Generator().manual_seed(seed)
    return {
        "w": torch.randn(96, 40, generator=g),
        "e": torch.randn(64, 8, generator=g).to(torch.bfloat16),
        "i": torch.arange(300, dtype=torch.int64),
        "step": 7,
    }


def torch_dcp_load(sd_like: dict[str, Any], reader: Any) -> dict[str, Any]:
    """What torch's ``dcp.load`` puts into tensors shaped as ``sd_like``'s, from ``reader``
    (a storage reader, or a local folder for its ``FileSystemReader``)."""
    import os
    import warnings

    import torch
    import torch.distributed.checkpoint as dcp

    if isinstance(reader, (str, os.PathLike)):
        reader = dcp.FileSystemReader(reader)
    out = {k: (torch.empty_like(v) if isinstance(v, torch.Tensor) else v) for k, v in sd_like.items()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(out, storage_reader=reader, no_dist=True)
    return out


def assert_same_state(a: dict[str, Any], b: dict[str, Any]) -> None:
    """Two flat torch state dicts hold the same keys, dtypes and bits (other values equal)."""
    import torch

    assert sorted(a) == sorted(b)
    for k in a:
        if isinstance(a[k], torch.Tensor):
            assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k
        else:
            assert a[k] == b[k], k


def torch_storage_bytes(t: Any) -> bytes:
    """All bytes of a torch tensor's storage (the whole storage, not just the view)."""
    return untyped_storage_bytes(t.untyped_storage())


def untyped_storage_bytes(us: Any) -> bytes:
    """The bytes of a torch ``UntypedStorage``, through one uint8 view of it
    (``bytes(storage)`` indexes it byte by byte, a Python call each)."""
    import torch

    return torch.empty(0, dtype=torch.uint8).set_(us).numpy().tobytes()


def torch_value_bytes(t: Any) -> bytes:
    """The logical values of a torch tensor, C-contiguous (conj/neg resolved)."""
    import torch

    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    c = torch.empty(t.shape, dtype=t.dtype)
    c.copy_(t)
    return untyped_storage_bytes(c.untyped_storage())


def assert_tensor_matches(tl: Any, tt: Any, *, values: bool = True) -> None:
    """torchless tensor ``tl`` is exactly torch tensor ``tt``: dtype, shape, strides,
    offset, whole-storage bytes, flags and (where NumPy can hold them) values."""
    import torch

    if tt.is_sparse or tt.layout in (torch.sparse_csr, torch.sparse_csc, torch.sparse_bsr, torch.sparse_bsc):
        assert isinstance(tl, SparseTensor), type(tl)
        assert tl.layout == str(tt.layout)[6:]
        assert tl.shape == tuple(tt.shape)
        if tt.layout == torch.sparse_coo:
            assert tl.is_coalesced == tt.is_coalesced()
            assert_tensor_matches(tl.tensors["indices"], tt._indices())
            assert_tensor_matches(tl.tensors["values"], tt._values())
        else:
            comp, plain = (
                (tt.crow_indices(), tt.col_indices())
                if tt.layout in (torch.sparse_csr, torch.sparse_bsr)
                else (tt.ccol_indices(), tt.row_indices())
            )
            assert_tensor_matches(tl.tensors["compressed_indices"], comp)
            assert_tensor_matches(tl.tensors["plain_indices"], plain)
            assert_tensor_matches(tl.tensors["values"], tt.values())
        np.testing.assert_array_equal(tl.to_dense(), tt.to_dense().numpy())
        return
    assert isinstance(tl, Tensor), type(tl)
    assert tl.dtype.torch_name == str(tt.dtype), (tl.dtype, tt.dtype)
    assert tl.shape == tuple(tt.shape)
    assert tl.requires_grad == tt.requires_grad
    assert tl.is_parameter == isinstance(tt, torch.nn.Parameter)
    if tt.device.type == "meta":
        assert tl.storage is None and tl.is_meta
        assert tl.stride() == tt.stride()
        return
    assert tl.stride() == tt.stride()
    assert tl.storage_offset() == tt.storage_offset()
    raw = tl.storage.bytes()
    if tl.storage.byteorder != sys.byteorder and tl.storage.dtype.itemsize > 1:
        raw = np.frombuffer(raw, tl.storage.dtype.storage.newbyteorder(">")).astype(tl.storage.dtype.storage).tobytes()
    if tt.is_quantized:
        q = tl.quantizer
        assert q is not None
        scheme = str(tt.qscheme())[6:]
        if scheme.startswith("per_tensor"):
            assert q["scale"] == tt.q_scale() and q["zero_point"] == tt.q_zero_point()
        else:
            assert q["axis"] == tt.q_per_channel_axis()
            np.testing.assert_array_equal(q["scales"].numpy(), tt.q_per_channel_scales().numpy())
            np.testing.assert_array_equal(q["zero_points"].numpy(), tt.q_per_channel_zero_points().numpy())
        assert bytes(raw) == torch_storage_bytes(tt)
        np.testing.assert_array_equal(tl.numpy(), tt.int_repr().numpy())
        return
    assert tl.is_conj() == tt.is_conj() and tl.is_neg() == tt.is_neg()
    assert bytes(raw) == torch_storage_bytes(tt)
    if values and tl.dtype.numpy is not None:
        arr = np.ascontiguousarray(tl.numpy())
        if arr.dtype.byteorder == ">":
            arr = arr.astype(arr.dtype.newbyteorder("="))
        assert arr.tobytes() == torch_value_bytes(tt), tl
    if values and tl.dtype.name == "complex32":
        assert np.ascontiguousarray(tl.numpy(raw=True)).tobytes() == torch_value_bytes(tt)


def assert_tree_matches(tl: Any, tt: Any, path: str = "") -> None:
    """Walk torch's object tree and torchless's side by side."""
    import torch

    if isinstance(tt, torch.Tensor):
        assert_tensor_matches(tl, tt)
        return
    if isinstance(tt, dict):
        assert isinstance(tl, dict), (path, type(tl))
        assert list(tl.keys()) == list(tt.keys()), path
        for k in tt:
            assert_tree_matches(tl[k], tt[k], f"{path}.{k}")
        return
    if isinstance(tt, (list, tuple)):
        assert type(tl) is type(tt) or (isinstance(tt, tuple) and isinstance(tl, tuple)), (path, type(tl), type(tt))
        assert len(tl) == len(tt), path
        for i, (a, b) in enumerate(zip(tl, tt, strict=False)):
            assert_tree_matches(a, b, f"{path}.{i}")
        return
    if isinstance(tt, (torch.dtype,)):
        assert tl.torch_name == str(tt)
        return
    if isinstance(tt, torch.device):
        assert str(tl) == str(tt)
        return
    assert tl == tt or (isinstance(tt, float) and tt != tt and tl != tl), (path, tl, tt)


def torch_tensors(obj: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """Every torch tensor of a tree with the same dotted names iter_tensors gives
    (containers walked once, tensors yielded under each path)."""
    import torch

    out: list[tuple[str, Any]] = []
    seen: set[int] = set()

    def go(name: str, x: Any) -> None:
        if isinstance(x, torch.Tensor):
            out.append((name or "tensor", x))  # tied tensors: under every path, like iter_tensors
            return
        if id(x) in seen:
            return
        if isinstance(x, dict):
            seen.add(id(x))
            for k, v in x.items():
                go(f"{name}.{k}" if name else str(k), v)
        elif isinstance(x, (list, tuple)):
            seen.add(id(x))
            for i, v in enumerate(x):
                go(f"{name}.{i}" if name else str(i), v)

    go(prefix, obj)
    return out


def sharing_pattern_torch(tensors: list[Any]) -> list[int]:
    """For each tensor, the index of the first tensor with the same storage."""
    # empty storages all have data_ptr 0: count each as its own
    ptrs = [
        t.untyped_storage().data_ptr() if t.device.type != "meta" and t.untyped_storage().nbytes() else -1 - i
        for i, t in enumerate(tensors)
    ]
    return [ptrs.index(p) for p in ptrs]


def sharing_pattern_tl(tensors: list[Any]) -> list[int]:
    ids = [id(t.storage) if t.storage is not None and t.storage.nbytes else -1 - i for i, t in enumerate(tensors)]
    return [ids.index(p) for p in ids]


def only_torchless_errors(fn: Any, *args: Any, **kw: Any) -> Any:
    """Run ``fn``; return its result or the TorchlessError it raised; any other
    exception type fails the test."""
    try:
        return fn(*args, **kw)
    except TorchlessError as e:
        return e


def load_and_touch(data: bytes, weights_only: bool = True) -> Any:
    """torchless.load a checkpoint from bytes and read every tensor's values."""
    art = torchless.open(data, format="pt", weights_only=weights_only)
    for _n, t in art.tensors():
        if isinstance(t, Tensor) and t.storage is not None:
            t.numpy()
        elif isinstance(t, (SparseTensor, NestedTensor)):
            for c in t.tensors.values() if isinstance(t, SparseTensor) else []:
                if c.storage is not None:
                    c.numpy()
    art.info()
    return art


# -- hand-built zip pieces -------------------------------------------------------------
def local_header(
    name: bytes, extra: bytes = b"", *, crc: int = 0, csize: int = 0, usize: int = 0, flags: int = 0x0808, method: int = 0
) -> bytes:
    return (
        struct.pack("<4sHHHHHIIIHH", b"PK\x03\x04", 0, flags, method, 0, 0, crc, csize, usize, len(name), len(extra))
        + name
        + extra
    )


def central_header(
    name: bytes,
    offset: int,
    size: int,
    crc: int,
    extra: bytes = b"",
    *,
    csize: int | None = None,
    method: int = 0,
    flags: int = 0x0808,
) -> bytes:
    cs = size if csize is None else csize
    return (
        struct.pack(
            "<4sHHHHHHIIIHHHHHII",
            b"PK\x01\x02",
            0,
            0,
            flags,
            method,
            0,
            0,
            crc,
            cs,
            size,
            len(name),
            len(extra),
            0,
            0,
            0,
            0,
            offset,
        )
        + name
        + extra
    )


def build_zip(
    records: list[tuple[bytes, bytes]], *, central_names: list[bytes] | None = None, eocd_entries: int | None = None
) -> bytes:
    """A plain stored zip of ``(name, data)`` records (no descriptors, no padding);
    ``central_names`` may name entries differently in the central directory."""
    out = bytearray()
    cds = []
    for i, (name, data) in enumerate(records):
        off = len(out)
        crc = zlib.crc32(data) & 0xFFFFFFFF
        out += local_header(name, crc=crc, csize=len(data), usize=len(data), flags=0)
        out += data
        cname = central_names[i] if central_names else name
        cds.append(central_header(cname, off, len(data), crc, flags=0))
    cd_off = len(out)
    for c in cds:
        out += c
    n = len(cds) if eocd_entries is None else eocd_entries
    out += struct.pack("<4sHHHHIIH", b"PK\x05\x06", 0, 0, n, n, len(out) - cd_off, cd_off, 0)
    return bytes(out)


# -- legacy tar (spec pt.md §3) --------------------------------------------------------
def _pk(obj) -> bytes:
    return Pickler2().dumps(obj)


def build_legacy_tar(path) -> None:
    """A pre-0.1.10 checkpoint (spec pt.md §3) built by hand."""
    storages = bytearray(_pk(2))
    storages += _pk((0, "cpu", Global("torch", "FloatStorage")))
    storages += struct.pack("<q", 6) + np.arange(6, dtype="<f4").tobytes()
    storages += _pk((1, "cpu", Global("torch", "LongStorage")))
    storages += struct.pack("<q", 3) + np.array([7, -8, 9], dtype="<i8").tobytes()
    storages += _pk([(5, 0, 2, 3)])  # storage view: key 5 = storage 0 [2:5]
    tensors = bytearray(_pk(2))
    tensors += _pk((10, 0, Global("torch", "FloatTensor")))
    tensors += struct.pack("<i4x", 2) + struct.pack("<2q", 2, 2) + struct.pack("<2q", 1, 2) + struct.pack("<q", 1)
    tensors += _pk((11, 1, Global("torch", "LongTensor")))
    tensors += struct.pack("<i4x", 1) + struct.pack("<q", 3) + struct.pack("<q", 1) + struct.pack("<q", 0)
    obj = {"w": Persistent("10"), "ids": Persistent("11"), "n": 4}
    pkl = _pk(obj)
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tf:
        for name, data in (("storages", storages), ("tensors", tensors), ("pickle", pkl)):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(bytes(data)))


def left_for_the_collector(fn: Any, cls: type) -> list[Any]:
    """The ``cls`` objects that only a GC pass would free after ``fn()`` ran with the
    collector off: what ``fn`` made and dropped inside reference cycles (``fn`` drops its
    own references before it returns).

    Garbage that other threads make meanwhile is counted too (in the suite's process,
    fsspec's event-loop thread once a remote test has started it): ask for a ``cls``
    only the code under test makes, or call this in a fresh interpreter."""
    import gc

    gc.collect()
    was = gc.isenabled()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        fn()
        gc.collect()
        return [o for o in gc.garbage if isinstance(o, cls)]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        if was:
            gc.enable()


def run_daily_fuzz(
    run_case: Any, stats: Any, tmp_path: Any, *, name: str, env: str, replay: str, seconds: float, cases: int = 60
) -> None:
    """Run ``run_case(seed, stats, folder)`` over seeds from a base that changes daily
    (UTC date * 1000; ``$env`` replays a day, ``$env_CASES`` sets the count) until ``cases``
    seeds or ``seconds`` have passed; a failure names its seed and how to replay it."""
    import datetime
    import os
    import time
    import warnings

    base = int(os.environ.get(env) or int(datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d")) * 1000)
    cases = int(os.environ.get(f"{env.removesuffix('_SEED')}_CASES", str(cases)))
    print(f"{name} fuzz: seeds {base}..{base + cases - 1} ({env}={base} replays)")
    t0 = time.monotonic()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for seed in range(base, base + cases):
            root = tmp_path / str(seed)
            root.mkdir()
            try:
                run_case(seed, stats, str(root))
            except Exception as e:  # name the seed: `python tests/<name>_fuzz.py SEED` replays it
                raise AssertionError(f"seed {seed} ({env}={base}; {replay} {seed}): {type(e).__name__}: {e}") from e
            if time.monotonic() - t0 > seconds:
                break
    print(stats)


def long_run_setup() -> str:
    """Process settings for a long fuzz run (``scripts/fuzz_*.py``); none changes what a
    case builds or compares. torch runs on one thread: its intra-op pool costs far more
    than it saves on these tiny tensors (``to_dense`` of a small uncoalesced COO tensor
    takes ~6 ms on two threads, ~6 us on one). Temporary files (the cases' folders, the
    ``mmap=True`` loads) go to a new folder on a RAM-backed file system where there is
    one: removing folders and DCP's fsync on the shared disk cost more than a case.
    Warnings and torch's log lines are off. Returns the folder (the caller removes it)."""
    import logging
    import os
    import tempfile
    import warnings

    import torch

    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    logging.getLogger("torch").setLevel(logging.ERROR)
    ram = "/dev/shm"
    where = ram if os.path.isdir(ram) and os.access(ram, os.W_OK) else None
    tempfile.tempdir = tempfile.mkdtemp(prefix="tlfuzz", dir=where)
    return tempfile.tempdir


@dataclasses.dataclass
class LongRun:
    """What :func:`long_run` did: the seeds run (from ``start``), their failures (seed,
    message) and the wall and CPU seconds."""

    start: int
    seeds: int
    failed: list[tuple[int, str]]
    wall: float
    cpu: float

    @property
    def last(self) -> int:
        return self.start + self.seeds - 1


def long_run(description: str, run_case: Any, *, default_cases: int, message_chars: int = 200) -> LongRun:
    """The loop of the ``scripts/fuzz_*.py`` long runs: ``--cases N --start S --minutes M``
    from the command line, :func:`long_run_setup`, ``run_case(seed)`` for each seed (an
    exception is a failure recorded with its seed), stopping after ``--minutes`` or at
    Ctrl-C (the counts are still returned; the interrupted seed is not counted)."""
    import argparse
    import shutil
    import time

    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--cases", type=int, default=default_cases)
    ap.add_argument("--start", type=int, default=0)
    ap.add_argument("--minutes", type=float, default=0.0, help="stop after this long (0: run every case)")
    args = ap.parse_args()
    tmp = long_run_setup()  # one thread, temporary files in RAM
    failed: list[tuple[int, str]] = []
    t0, c0 = time.monotonic(), time.process_time()
    seeds = 0
    try:
        for seed in range(args.start, args.start + args.cases):
            try:
                run_case(seed)
            except Exception as e:  # noqa: BLE001 - every failure is reported with its seed
                failed.append((seed, f"{type(e).__name__}: {str(e)[:message_chars]}"))
            seeds += 1
            if args.minutes and time.monotonic() - t0 > args.minutes * 60:
                print(f"stopped after {args.minutes} minutes at seed {seed}")
                break
    except KeyboardInterrupt:
        print(f"interrupted in seed {args.start + seeds} (not in the seed count; its case may be counted in part)")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return LongRun(args.start, seeds, failed, time.monotonic() - t0, time.process_time() - c0)
