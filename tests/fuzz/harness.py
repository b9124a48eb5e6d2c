"""Mutation fuzzing of every format torchless reads, for the API, the scanner and the CLI.

Seeds are the committed samples plus small artifacts built here (safetensors, npy/npz,
legacy tar, inductor cache entries...). A *case* is one seed and one deterministic
mutation of it (bit flips, overwrites with interesting values, truncation at record
boundaries, zip member swaps/duplicates/drops, JSON header mutations, deep nesting),
numbered so that ``(base seed, case number)`` rebuilds the same input anywhere.

Every case runs every target (``open`` + ``info`` + ``tensors`` + each tensor's bytes,
``load`` with ``weights_only`` True and False, ``verify``, ``scan``, and the CLI's
``info``/``ls``/``verify``/``scan``) in a worker process limited to ``MEM_LIMIT`` of
address space (RLIMIT_AS), each target under a ``CASE_TIMEOUT`` alarm on CPU time
(``ITIMER_PROF``: the work, not the machine's load), and the parent kills a worker that
stays silent for ``WATCHDOG`` wall seconds (blocked, or stuck in a long C call). A failure is any exception that is not a
``TorchlessError``, any ``InternalError``, a ``MemoryError``, a timeout, or a CLI run
that exits with another code than 0/1/2, prints more than one line on stderr or a
traceback. Failing inputs are saved under the failure folder with a ``case.json`` that
names the seed, the mutation and the error.

Used by ``tests/fuzz/test_fuzz_formats.py`` (bounded) and ``scripts/fuzz_formats.py``
(long runs). Run ``python harness.py --worker`` only through :func:`run_campaign`.
"""

from __future__ import annotations

import contextlib
import gc
import io
import json
import os
import pickletools
import random
import resource
import select
import shutil
import signal
import struct
import subprocess
import sys
import time
import traceback
import zipfile
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent
REPO = TESTS.parent
SAMPLES = REPO / "samples"

CASE_TIMEOUT = 5.0  # CPU seconds per target of a case (CPU time: fair on a shared machine)
WATCHDOG = 120.0  # wall seconds a worker may stay silent before it is killed as hung
MEM_LIMIT = 1 << 30  # bytes of address space for a worker process

API_TARGETS = ("open", "load", "load_unsafe", "verify", "scan")
CLI_TARGETS = ("cli_info", "cli_ls", "cli_verify", "cli_scan")
CACHE_TARGETS = ("inventory", "cli_cache", "scan")

INTERESTING = [
    b"\x00",
    b"\xff",
    b"\x7f",
    b"\x80",
    b"\x01",
    b"\x00\x00",
    b"\xff\xff",
    b"\xff\x7f",
    b"\x00\x00\x00\x00",
    b"\xff\xff\xff\xff",
    b"\xff\xff\xff\x7f",
    b"\x00\x00\x00\x80",
    b"\x00\x00\x00\x40",
    struct.pack("<Q", 2**63 - 1),
    struct.pack("<Q", 2**64 - 1),
    struct.pack("<Q", 1 << 40),
    struct.pack("<Q", 1 << 31),
]


# ------------------------------------------------------------------------------------ seeds
@dataclass
class Seed:
    """One fuzz seed: a file, or a folder (``entry`` names what the targets open in it)."""

    name: str
    path: Path
    kind: str  # "file" | "dir" | "cache"
    entry: str | None = None

    def files(self) -> list[Path]:
        if self.kind == "file":
            return [self.path]
        return sorted(p for p in self.path.rglob("*") if p.is_file() and not p.is_symlink())


def _pk(obj: Any) -> bytes:
    from torchless.pickle.writer import Pickler2

    return Pickler2().dumps(obj)


def build_seeds(out: Path) -> list[Seed]:
    """Copy the samples and build the generated seeds into ``out``; list them all."""
    import numpy as np

    import torchless

    out.mkdir(parents=True, exist_ok=True)
    seeds: list[Seed] = []

    def add_file(src: Path, name: str | None = None) -> None:
        dst = out / (name or src.name)
        shutil.copyfile(src, dst)
        seeds.append(Seed(dst.name, dst, "file"))

    for p in sorted(SAMPLES.iterdir()):
        if p.is_file() and p.suffix in (".pt", ".ptl", ".pt2", ".onnx", ".pkl"):
            add_file(p)
    for p in sorted((SAMPLES / "scan").iterdir()):
        if p.is_file():
            add_file(p, "scan_" + p.name)
    dcp = out / "dcp_ckpt"
    shutil.copytree(SAMPLES / "dcp_ckpt", dcp, dirs_exist_ok=True)
    seeds.append(Seed("dcp_ckpt", dcp, "dir"))
    onnx_fix = TESTS / "formats" / "onnx" / "fixtures"
    for name in ("cnn.onnx", "cond.onnx", "half.onnx", "legacy.onnx"):
        if (onnx_fix / name).exists():
            add_file(onnx_fix / name, "fx_" + name)
    if (onnx_fix / "mlp_ext.onnx").exists():
        ext = out / "onnx_external"
        ext.mkdir(exist_ok=True)
        shutil.copyfile(onnx_fix / "mlp_ext.onnx", ext / "mlp_ext.onnx")
        shutil.copyfile(onnx_fix / "mlp_ext.onnx.data", ext / "mlp_ext.onnx.data")
        seeds.append(Seed("onnx_external", ext, "dir", "mlp_ext.onnx"))

    rng = np.random.default_rng(0)
    arrays = {
        "w": rng.standard_normal((4, 6)).astype("<f4"),
        "ids": np.arange(5, dtype="<i8"),
        "half": rng.standard_normal(3).astype("<f2"),
        "flag": np.array([True, False]),
        "big": np.arange(6, dtype=">i4").reshape(2, 3),
    }
    import ml_dtypes

    bf16 = arrays["w"].astype(ml_dtypes.bfloat16)
    torchless.save({k: v for k, v in arrays.items() if k != "big"} | {"bf": bf16}, out / "tensors.safetensors")
    seeds.append(Seed("tensors.safetensors", out / "tensors.safetensors", "file"))
    np.savez(out / "arrays.npz", **arrays)
    np.savez_compressed(out / "arrays_deflate.npz", **arrays)
    np.save(out / "array.npy", arrays["w"])
    np.save(out / "fortran.npy", np.asfortranarray(arrays["w"]))
    struct_arr = np.zeros(2, dtype=[("a", "<i4"), ("b", "<f8", (2,))])
    np.save(out / "structured.npy", struct_arr)
    for n in ("arrays.npz", "arrays_deflate.npz", "array.npy", "fortran.npy", "structured.npy"):
        seeds.append(Seed(n, out / n, "file"))
    try:
        torchless.save({"w": arrays["w"], "bf": bf16}, out / "torchless_bf16.npz")
        seeds.append(Seed("torchless_bf16.npz", out / "torchless_bf16.npz", "file"))
    except Exception:  # noqa: BLE001 - only a seed variant; the others cover npz
        pass

    sys.path.insert(0, str(TESTS))
    try:
        from tl_testutil import build_legacy_tar
    finally:
        sys.path.remove(str(TESTS))
    build_legacy_tar(out / "legacy.tar")
    seeds.append(Seed("legacy.tar", out / "legacy.tar", "file"))

    # a plain pickle stream with protocol-0 text opcodes, memo use and nesting
    import pickle

    (out / "plain_p0.pkl").write_bytes(
        pickle.dumps({"a": [1, 2.5, "x", (True, None)], "b": {"c": b"\x00\x01"}, "n": 10**20}, protocol=0)
    )
    (out / "plain_p4.pkl").write_bytes(
        pickle.dumps({"a": [1, 2.5, "x", (True, None)], "s": {1, 2}, "f": frozenset([3])}, protocol=4)
    )
    seeds.append(Seed("plain_p0.pkl", out / "plain_p0.pkl", "file"))
    seeds.append(Seed("plain_p4.pkl", out / "plain_p4.pkl", "file"))

    seeds.append(_build_cache(out / "inductor_cache"))
    global BOMB_DIR
    BOMB_DIR = out
    for mib in BOMB_SIZES:
        _bomb(mib)
    return seeds


def _build_cache(root: Path) -> Seed:
    """A small TORCHINDUCTOR_CACHE_DIR: FX graph and AOTAutograd pickles, output code, a kernel."""
    from torchless.pickle.writer import Global, Reduce

    key = "c" + "abcdefghijklmnopqrstuvwxyz0123456789abcdefghijklmn"[:51]
    code = (
        "# AOT ID: ['0_inference']\nfrom ctypes import c_void_p\nimport "
        "torch\n\ndef call(args):\n    (arg0_1,) = args\n    return (arg0_1,)\n"
    )
    (root / "ab").mkdir(parents=True, exist_ok=True)
    (root / "ab" / f"{key}.py").write_text(code)
    (root / "ab" / f"{key}.cpp").write_text(
        'extern "C" void kernel(const float* in_ptr0, float* out_ptr0) { out_ptr0[0] = in_ptr0[0]; }\n'
    )
    graph = Reduce(
        Global("torch._inductor.output_code", "CompiledFxGraph"),
        (),
        state={
            "current_callable": None,
            "source_code": code,
            "cache_key": "fabc",
            "device_types": ["cpu"],
            "output_strides": [(8, 1)],
            "constants": {},
            "guards_expr": None,
        },
    )
    fx = root / "fxgraph" / "ab" / "fabcdefabcdef" / "0123456789"
    fx.parent.mkdir(parents=True, exist_ok=True)
    fx.write_bytes(_pk(graph))
    aot = Reduce(
        Global("torch._functorch._aot_autograd.autograd_cache", "AOTAutogradCacheEntry"),
        (),
        state={
            "compiled_fw": Reduce(Global("torch._functorch._aot_autograd.autograd_cache", "CompiledForward"), ("fabc",)),
            "indices_of_inps_to_detach": [],
        },
    )
    ap = root / "aotautograd" / "aabcdef" / "9876543210"
    ap.parent.mkdir(parents=True, exist_ok=True)
    ap.write_bytes(_pk(aot))
    (root / "locks").mkdir(exist_ok=True)
    (root / "locks" / f"{key}.lock").write_bytes(b"")
    return Seed("inductor_cache", root, "cache")


# ------------------------------------------------------------------------------ structure
def _zip_entries(data: bytes) -> list[zipfile.ZipInfo] | None:
    if not data.startswith(b"PK"):
        return None
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as zf:
            return zf.infolist()
    except Exception:  # noqa: BLE001 - not a zip Python reads: byte mutations only
        return None


def _pickle_boundaries(data: bytes, start: int = 0) -> list[int]:
    out = []
    try:
        for _op, _arg, pos in pickletools.genops(io.BytesIO(data[start:])):
            out.append(start + pos)
    except Exception:  # noqa: BLE001 - the stream ends or is not a pickle: what was found
        pass
    return out


def _boundaries(data: bytes) -> list[int]:
    """Record boundaries: zip headers and member starts/ends, pickle opcodes, JSON/npy headers."""
    b = {0, len(data)}
    for magic in (b"PK\x03\x04", b"PK\x01\x02", b"PK\x05\x06", b"PK\x06\x06", b"PK\x06\x07", b"PK\x07\x08"):
        i = data.find(magic)
        while i >= 0 and len(b) < 4000:
            b.add(i)
            i = data.find(magic, i + 1)
    ents = _zip_entries(data)
    if ents:
        for e in ents:
            off = e.header_offset
            if off >= 0 and off + 30 <= len(data):
                n, x = struct.unpack_from("<HH", data, off + 26)
                start = off + 30 + n + x
                b.update((start, start + e.compress_size))
    if data[:8].startswith(b"\x93NUMPY"):
        b.update((8, 10, 12))
    if len(data) >= 8 and not data.startswith(b"PK"):
        n = struct.unpack_from("<Q", data)[0]
        if 8 + n <= len(data):
            b.update((8, 8 + n))
    if data[:1] == b"\x80" or data[:1] in b"(}]cl":
        b.update(_pickle_boundaries(data)[:2000])
    return sorted(x for x in b if 0 <= x <= len(data))


# ------------------------------------------------------------------------------ mutators
def _deep_pickle(rng: random.Random) -> bytes:
    n = rng.choice([1000, 5000, 100_000])
    kind = rng.randrange(5)
    if kind == 0:  # nested lists: ] ... then APPEND back up
        return b"\x80\x02" + b"]" * n + b"a" * (n - 1) + b"."
    if kind == 1:  # nested dicts via SETITEM
        return b"\x80\x02" + b"}K\x01" * n + b"s" * (n - 1) + b"."
    if kind == 2:  # tuples built with TUPLE1
        return b"\x80\x02N" + b"\x85" * n + b"."
    if kind == 3:  # MARK bombs
        return b"\x80\x02" + b"(" * n + b"N."
    # a DAG that doubles at every level (memo reuse): small bytes, huge tree
    body = b"\x80\x02K\x01"
    for i in range(min(n, 200)):
        body += b"q" + bytes([i % 256]) + b"h" + bytes([i % 256]) + b"\x86"
    return body + b"."


def _deep_json(rng: random.Random) -> bytes:
    n = rng.choice([500, 5000, 200_000])
    if rng.random() < 0.5:
        return b"[" * n + b"]" * n
    return b'{"a":' * n + b"1" + b"}" * n


def _mutate_json(text: bytes, rng: random.Random) -> tuple[str, bytes]:
    try:
        obj = json.loads(text)
    except Exception:  # noqa: BLE001
        return "json-deep", _deep_json(rng)
    paths: list[tuple[Any, Any]] = []

    def walk(o: Any, depth: int) -> None:
        if depth > 6 or len(paths) > 500:
            return
        if isinstance(o, dict):
            for k, v in o.items():
                paths.append((o, k))
                walk(v, depth + 1)
        elif isinstance(o, list):
            for i, v in enumerate(o):
                paths.append((o, i))
                walk(v, depth + 1)

    walk(obj, 0)
    choice = rng.randrange(8)
    if not paths or choice == 0:
        return "json-deep", _deep_json(rng)
    parent, key = rng.choice(paths)
    values = [
        None,
        True,
        -1,
        0,
        2**63,
        2**64 + 5,
        -(2**63) - 1,
        1e308,
        "",
        "x" * 300,
        "F32",
        [],
        {},
        [[[[]]]],
        [-1, 2**62],
        {"a": {"b": []}},
        "\u0000",
        1.5,
    ]
    if choice in (1, 2, 3):
        v = rng.choice(values)
        parent[key] = v
        desc = f"json-set {key!r}={v!r}"[:120]
    elif choice == 4 and isinstance(parent, dict):
        del parent[key]
        desc = f"json-del {key!r}"
    elif choice == 5:
        v = parent[key]
        parent[key] = [v, v] if not isinstance(v, list) else v * 2
        desc = f"json-dup {key!r}"
    elif choice == 6 and isinstance(parent, dict):
        parent[str(key) + "_"] = parent[key]
        desc = f"json-copy-key {key!r}"
    else:
        v = parent[key]
        if isinstance(v, int) and not isinstance(v, bool):
            parent[key] = rng.choice([v + 1, v - 1, v * 1000, -v, v + 2**32])
        elif isinstance(v, list) and v:
            rng.shuffle(v)
        else:
            parent[key] = rng.choice(values)
        desc = f"json-tweak {key!r}"
    try:
        return desc, json.dumps(obj).encode()
    except (ValueError, TypeError):
        return "json-deep", _deep_json(rng)


TEXT_CHUNKS = [
    b"(" * 5000,
    b"[" * 3000 + b"]" * 3000,
    b"9" * 5000,
    b"'" * 3,
    b'"',
    b"\\\n",
    b"\t" * 100,
    b"x" * 100_000,
    b"\x00",
    b"#" * 10,
    b"lambda: " * 500,
    b"a." * 3000 + b"b",
    b"\xff\xfe",
    b"\r",
    b"def f(:\n",
]


def _mutate_text(data: bytes, rng: random.Random) -> tuple[str, bytes]:
    """Source-code mutations (TorchScript code/, inductor output code): deep brackets,
    long lines, huge numbers, stray quotes and continuations."""
    at = rng.randrange(len(data) + 1)
    chunk = rng.choice(TEXT_CHUNKS)
    return f"text-insert@{at} {chunk[:16]!r}x{len(chunk)}", data[:at] + chunk + data[at:]


def _mutate_pickle(data: bytes, rng: random.Random) -> tuple[str, bytes]:
    bounds = _pickle_boundaries(data)
    choice = rng.randrange(6)
    if choice == 0 or len(bounds) < 3:
        return "pickle-deep", _deep_pickle(rng)
    i = rng.randrange(1, len(bounds) - 1)
    a, b = bounds[i], bounds[i + 1] if i + 1 < len(bounds) else len(data)
    if choice == 1:
        return f"pickle-truncate-op@{a}", data[:a]
    if choice == 2:
        return f"pickle-drop-op@{a}", data[:a] + data[b:]
    if choice == 3:
        return f"pickle-dup-op@{a}", data[:b] + data[a:b] + data[b:]
    if choice == 4:
        j = rng.randrange(1, len(bounds) - 1)
        c, d = bounds[j], bounds[j + 1] if j + 1 < len(bounds) else len(data)
        if c < a:
            a, b, c, d = c, d, a, b
        if b <= c:
            return f"pickle-swap-ops@{a},{c}", data[:a] + data[c:d] + data[b:c] + data[a:b] + data[d:]
        return f"pickle-truncate-op@{a}", data[:a]
    v = rng.choice(INTERESTING)
    at = min(a + 1, len(data))
    return f"pickle-arg@{at}={v.hex()}", data[:at] + v + data[at + len(v) :]


def mutate_bytes(data: bytes, rng: random.Random, *, name: str = "") -> tuple[str, bytes]:
    """One mutation of ``data``: ``(description, new bytes)``."""
    if not data:
        return "grow", bytes(rng.randrange(256) for _ in range(rng.randrange(1, 64)))
    ents = _zip_entries(data)
    r = rng.random()
    if ents and r < 0.45:
        try:
            return _mutate_zip(data, ents, rng)
        except (zipfile.BadZipFile, OSError, EOFError, NotImplementedError, ValueError, zlib.error):
            pass  # a zip Python cannot read back (an earlier stacked mutation): bytes only
    if name.endswith(".safetensors") and r < 0.6 and len(data) >= 8:
        n = struct.unpack_from("<Q", data)[0]
        if 8 + n <= len(data):
            desc, hdr = _mutate_json(data[8 : 8 + n], rng)
            return "header " + desc, struct.pack("<Q", len(hdr)) + hdr + data[8 + n :]
    if data.startswith(b"\x93NUMPY") and r < 0.6:
        return _mutate_npy(data, rng)
    if name.endswith((".py", ".cpp")) and r < 0.5:
        return _mutate_text(data, rng)
    if (data[:1] == b"\x80" or name.endswith(".pkl")) and r < 0.6:
        return _mutate_pickle(data, rng)
    return _mutate_raw(data, rng)


def _mutate_raw(data: bytes, rng: random.Random) -> tuple[str, bytes]:
    choice = rng.random()
    buf = bytearray(data)
    if choice < 0.3:
        k = rng.choice([1, 1, 2, 4, 8])
        offs = []
        for _ in range(k):
            bit = rng.randrange(len(buf) * 8)
            buf[bit // 8] ^= 1 << (bit % 8)
            offs.append(bit)
        return f"bitflip bits={offs}", bytes(buf)
    if choice < 0.6:
        bounds = _boundaries(data)
        v = rng.choice(INTERESTING)
        if rng.random() < 0.6 and len(bounds) > 2:
            at = min(len(buf) - 1, rng.choice(bounds) + rng.randrange(0, 48))
        else:
            at = rng.randrange(len(buf))
        buf[at : at + len(v)] = v[: max(0, len(buf) - at)]
        return f"overwrite@{at}={v.hex()}", bytes(buf)
    if choice < 0.8:
        bounds = _boundaries(data)
        if rng.random() < 0.6:
            at = rng.choice(bounds)
            at = max(0, at - rng.choice([0, 0, 1]))
            return f"truncate-boundary@{at}", data[:at]
        at = rng.randrange(len(data))
        return f"truncate@{at}", data[:at]
    if choice < 0.9:
        at = rng.randrange(len(data) + 1)
        chunk = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 32)))
        return f"insert@{at}+{len(chunk)}", data[:at] + chunk + data[at:]
    at = rng.randrange(len(data))
    n = rng.randrange(1, 64)
    return f"delete@{at}-{n}", data[:at] + data[at + n :]


def _mutate_npy(data: bytes, rng: random.Random) -> tuple[str, bytes]:
    major = data[6]
    hl = struct.unpack_from("<H", data, 8)[0] if major == 1 else struct.unpack_from("<I", data, 8)[0]
    start = 10 if major == 1 else 12
    header = data[start : start + hl]
    body = data[start + hl :]
    choice = rng.randrange(7)
    variants = [
        b"{'descr': '<f4', 'fortran_order': False, 'shape': (" + b"(" * 3000 + b")" * 3000 + b",), }",
        b"{'descr': " + b"[" * 2000 + b"]" * 2000 + b", 'fortran_order': False, 'shape': (), }",
        b"{'descr': '<f4', 'fortran_order': False, 'shape': (2**80,), }",
        b"{'descr': '<f4', 'fortran_order': False, 'shape': (-1, 3), }",
        b"{'descr': '<f4', 'fortran_order': False, 'shape': (1L, 2L), }",
        b"{'descr': '<f4', 'fortran_order': 0, 'shape': (4, 6), 'x': 1}",
        b"{'descr': [('a', '<i4', (" + b"1," * 40 + b"))], 'fortran_order': False, 'shape': (1,), }",
        b"{'descr': '|O', 'fortran_order': False, 'shape': (1,), }",
        b"{'descr': 'V' + '1', 'fortran_order': False, 'shape': (1,), }",
        b"{'descr': '<f4', 'fortran_order': False, 'shape': (4, 6), } \"\"\"",
        b"{'descr': '<U99999999999', 'fortran_order': False, 'shape': (1,), }",
        b"{'descr': [('a', [('b', " * 200 + b"'<i4'" + b")])" * 200 + b"], 'fortran_order': False, 'shape': (1,), }",
        b"{'descr': '<f4', 'fortran_order': False, 'shape': (4, 6), }\x00\xff",
        b"{'descr': '<f4', 'fortran_order': False, 'shape': (4, 6), }'",
    ]
    if choice < 3:
        new = rng.choice(variants)
        desc = f"npy-header {new[:60]!r}"
    elif choice == 3:
        desc, new = _mutate_raw(header, rng)
        desc = "npy-header " + desc
    else:
        return _mutate_raw(data, rng)
    new = new.ljust(len(header)) if len(new) < len(header) else new + b"\n"
    if major == 1 and len(new) > 0xFFFF:
        new = new[:0xFFFF]
    lenfield = struct.pack("<H", len(new)) if major == 1 else struct.pack("<I", len(new))
    return desc, data[:8] + lenfield + new + body


def _rebuild_zip(members: list[tuple[zipfile.ZipInfo, bytes]]) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as zf:
        for info, payload in members:
            zi = zipfile.ZipInfo(info.filename, date_time=(1980, 1, 1, 0, 0, 0))
            zi.compress_type = info.compress_type
            with contextlib.suppress(UserWarning):
                import warnings

                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    zf.writestr(zi, payload)
    return out.getvalue()


_BOMBS: dict[int, tuple[bytes, int]] = {}
BOMB_SIZES = (16, 128, 384)  # MiB of zeros: a member's declared content is read into memory (docs/robustness.md)
BOMB_DIR: Path | None = None  # where build_seeds left the streams (building one takes seconds)


def _bomb(mib: int) -> tuple[bytes, int]:
    """A raw deflate stream of ``mib`` MiB of zeros (about 1 KiB per MiB) and its CRC-32."""
    cached = BOMB_DIR / f"bomb-{mib}.deflate" if BOMB_DIR is not None else None
    if mib not in _BOMBS and cached is not None and cached.exists():
        raw = cached.read_bytes()
        _BOMBS[mib] = (raw[4:], struct.unpack_from("<I", raw)[0])
    if mib not in _BOMBS:
        co = zlib.compressobj(9, zlib.DEFLATED, -15)
        block = bytes(1 << 20)
        crc = 0
        parts = []
        for _ in range(mib):
            parts.append(co.compress(block))
            crc = zlib.crc32(block, crc)
        parts.append(co.flush())
        _BOMBS[mib] = (b"".join(parts), crc & 0xFFFFFFFF)
        if cached is not None:
            cached.write_bytes(struct.pack("<I", _BOMBS[mib][1]) + _BOMBS[mib][0])
    return _BOMBS[mib]


def _zip_with_bomb(members: list[tuple[zipfile.ZipInfo, bytes]], i: int, mib: int, *, lie: bool) -> bytes:
    """The members as a stored zip, except member ``i``: deflated zeros of ``mib`` MiB
    (with ``lie``, the headers claim a small uncompressed size)."""
    out = bytearray()
    central = bytearray()
    for j, (info, payload) in enumerate(members):
        name = info.filename.encode()
        if j == i:
            data, crc = _bomb(mib)
            method, usize = 8, (len(data) * 2 if lie else mib << 20)
        else:
            data, crc, method, usize = payload, zlib.crc32(payload) & 0xFFFFFFFF, 0, len(payload)
        off = len(out)
        out += (
            struct.pack("<4sHHHHHIIIHH", b"PK\x03\x04", 20, 0, method, 0, 0x21, crc, len(data), usize, len(name), 0) + name + data
        )
        central += (
            struct.pack(
                "<4sHHHHHHIIIHHHHHII",
                b"PK\x01\x02",
                20,
                20,
                0,
                method,
                0,
                0x21,
                crc,
                len(data),
                usize,
                len(name),
                0,
                0,
                0,
                0,
                0,
                off,
            )
            + name
        )
    cd = len(out)
    out += central
    out += struct.pack("<4sHHHHIIH", b"PK\x05\x06", 0, 0, len(members), len(members), len(central), cd, 0)
    return bytes(out)


def _mutate_zip(data: bytes, ents: list[zipfile.ZipInfo], rng: random.Random) -> tuple[str, bytes]:
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        members = [(e, zf.read(e)) for e in ents]
    choice = rng.random()
    names = [e.filename for e in ents]
    if choice < 0.55 or len(members) < 2:
        i = rng.randrange(len(members))
        info, payload = members[i]
        nm = info.filename
        if nm.endswith((".json", "__torchless_dtypes__.json")) or payload[:1] == b"{":
            desc, payload = _mutate_json(payload, rng)
        elif nm.endswith(".py") and payload and rng.random() < 0.5:
            desc, payload = _mutate_text(payload, rng)
        elif nm.endswith(".npy"):
            desc, payload = _mutate_npy(payload, rng) if payload.startswith(b"\x93NUMPY") else _mutate_raw(payload, rng)
        elif nm.endswith(".pkl") or payload[:2] in (b"\x80\x02", b"\x80\x03", b"\x80\x04", b"\x80\x05"):
            desc, payload = _mutate_pickle(payload, rng) if rng.random() < 0.7 else _mutate_raw(payload, rng)
        elif payload:
            desc, payload = _mutate_raw(payload, rng)
        else:
            desc, payload = "member-fill", b"\x80\x02}q\x00."
        members[i] = (info, payload)
        return f"member {nm!r}: {desc}", _rebuild_zip(members)
    if choice < 0.7:
        i, j = rng.sample(range(len(members)), 2)
        (a, pa), (b, pb) = members[i], members[j]
        members[i], members[j] = (a, pb), (b, pa)
        return f"member-swap {names[i]!r}<->{names[j]!r}", _rebuild_zip(members)
    if choice < 0.8:
        i = rng.randrange(len(members))
        info, payload = members[i]
        other = members[rng.randrange(len(members))][1]
        members.append((info, other))
        return f"member-dup {names[i]!r}", _rebuild_zip(members)
    if choice < 0.87:
        i = rng.randrange(len(members))
        del members[i]
        return f"member-drop {names[i]!r}", _rebuild_zip(members)
    if choice < 0.92:
        i = rng.randrange(len(members))
        mib = rng.choice(BOMB_SIZES)
        lie = rng.random() < 0.3
        return f"member-bomb {names[i]!r} {mib} MiB{' (size lies)' if lie else ''}", _zip_with_bomb(members, i, mib, lie=lie)
    i = rng.randrange(len(members))
    info, payload = members[i]
    if info.filename.endswith(".json"):
        new = _deep_json(rng)
    else:
        new = _deep_pickle(rng)
    members[i] = (info, new)
    return f"member-deep {names[i]!r}", _rebuild_zip(members)


def _safe_mutate(data: bytes, rng: random.Random, name: str) -> tuple[str, bytes]:
    """:func:`mutate_bytes`, falling back to a bit flip should a structure-aware mutator
    trip over an input an earlier mutation broke (the harness itself never crashes)."""
    state = rng.getstate()
    try:
        return mutate_bytes(data, rng, name=name)
    except Exception:  # noqa: BLE001 - deterministic: the same case falls back the same way
        rng.setstate(state)
        if not data:
            return "grow", b"\x00"
        bit = rng.randrange(len(data) * 8)
        buf = bytearray(data)
        buf[bit // 8] ^= 1 << (bit % 8)
        return f"bitflip bits=[{bit}] (fallback)", bytes(buf)


# -------------------------------------------------------------------------------- cases
@dataclass
class Case:
    """One materialized case."""

    index: int
    seed: Seed
    description: str
    target: Path  # what the targets open
    root: Path  # what to copy to reproduce (file or folder)


def case_rng(base_seed: int, index: int) -> random.Random:
    return random.Random(f"torchless-fuzz:{base_seed}:{index}")


def materialize(seeds: list[Seed], base_seed: int, index: int, dest: Path) -> Case:
    """Build case ``index`` under ``dest`` (emptied first)."""
    rng = case_rng(base_seed, index)
    seed = seeds[index % len(seeds)]
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    if seed.kind == "file":
        data = seed.path.read_bytes()
        desc, new = _safe_mutate(data, rng, seed.name)
        while rng.random() < 0.2 and len(new) < 4 << 20:  # stacked mutations
            more, new = _safe_mutate(new, rng, seed.name)
            desc = f"{desc} + {more}"
        out = dest / seed.name
        out.write_bytes(new)
        return Case(index, seed, desc, out, out)
    root = dest / seed.path.name
    shutil.copytree(seed.path, root, symlinks=True)
    files = seed.files()
    pick = rng.choice(files)
    rel = pick.relative_to(seed.path)
    r = rng.random()
    if r < 0.05 and len(files) > 1:
        (root / rel).unlink()
        desc = f"{rel}: removed"
    else:
        desc, new = _safe_mutate(pick.read_bytes(), rng, pick.name)
        (root / rel).write_bytes(new)
        desc = f"{rel}: {desc}"
    target = root / seed.entry if seed.entry else root
    return Case(index, seed, desc, target, root)


# ------------------------------------------------------------------------------- worker
class CaseTimeout(BaseException):
    """Raised by the alarm: a target ran past CASE_TIMEOUT (BaseException: nothing catches it)."""


def _alarm(_sig: int, _frame: Any) -> None:
    raise CaseTimeout()


def _touch_tensor(t: Any) -> None:
    from torchless.core.tensor import NestedTensor, SparseTensor, Tensor

    if isinstance(t, Tensor):
        if t.storage is not None:
            t.numpy()
    elif isinstance(t, SparseTensor):
        for c in t.tensors.values():
            _touch_tensor(c)
    elif isinstance(t, NestedTensor):
        for c in getattr(t, "tensors", {}).values() if isinstance(getattr(t, "tensors", None), dict) else []:
            _touch_tensor(c)


def _target_open(p: Path) -> None:
    import torchless

    with torchless.open(p) as art:
        json.dumps(art.info(), default=str)
        for _n, t in art.tensors():
            _touch_tensor(t)


def _target_load(p: Path, weights_only: bool) -> None:
    import torchless
    from torchless.core.tree import describe, iter_tensors

    obj = torchless.load(p, weights_only=weights_only)
    for _n, t in iter_tensors(obj, max_nodes=2_000_000):
        _touch_tensor(t)
    json.dumps(describe(obj), default=str)


def _target_verify(p: Path) -> None:
    import torchless

    with torchless.open(p) as art:
        for prob in art.verify():
            str(prob)


def _target_scan(p: Path) -> None:
    import torchless

    report = torchless.scan(p, jobs=1)
    report.exit_code  # noqa: B018 - computing it is the check
    text = json.dumps(report.to_dict(), default=str)
    # the scanner turns its own exceptions into an "unreadable"/"scan stopped" finding so
    # that a file is never reported clean; for the fuzzer those are still bugs
    for marker in ("torchless bug", "internal error", "scan stopped: RecursionError", "scan stopped: MemoryError"):
        if marker in text:
            i = text.index(marker)
            raise ScanInternal(text[max(0, i - 200) : i + 300])


class ScanInternal(Exception):
    """The scanner reported an internal error (or a Python limit) as a finding."""


def _target_inventory(p: Path) -> None:
    from torchless.formats.inductor_cache.inventory import describe_pickle, entry_source, inventory

    inv = inventory(p)
    json.dumps(inv.to_dict(), default=str)
    for e in inv.entries if hasattr(inv, "entries") else []:
        if e.kind in ("fxgraph", "aotautograd"):
            for f in e.files:
                describe_pickle(str(p / f.rel))
        if e.kind in ("fxgraph", "output_code", "cpp_kernel", "code"):
            entry_source(inv, e.id)


class CliFailure(Exception):
    """The CLI broke its contract (exit code, stderr shape)."""


def _target_cli(argv: list[str]) -> None:
    from torchless.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(argv)
    check_cli_output(rc, err.getvalue())


def check_cli_output(rc: int, stderr: str) -> None:
    """Raise CliFailure unless the CLI kept its contract: exit 0/1/2, at most one stderr line, no traceback, no bug."""
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    if rc not in (0, 1, 2):
        raise CliFailure(f"exit code {rc}: {stderr[-300:]!r}")
    if "Traceback" in stderr:
        raise CliFailure(f"traceback on stderr: {stderr[-500:]!r}")
    if len(lines) > 1:
        raise CliFailure(f"{len(lines)} lines on stderr: {stderr[-300:]!r}")
    if "torchless bug" in stderr or "internal error" in stderr:
        raise CliFailure(f"internal error: {stderr[-300:]!r}")


TARGETS: dict[str, Callable[[Path], None]] = {
    "open": _target_open,
    "load": lambda p: _target_load(p, True),
    "load_unsafe": lambda p: _target_load(p, False),
    "verify": _target_verify,
    "scan": _target_scan,
    "inventory": _target_inventory,
    "cli_info": lambda p: _target_cli(["info", str(p)]),
    "cli_ls": lambda p: _target_cli(["ls", str(p)]),
    "cli_verify": lambda p: _target_cli(["verify", str(p)]),
    "cli_scan": lambda p: _target_cli(["scan", str(p)]),
    "cli_cache": lambda p: _target_cli(["cache", str(p)]),
}


def targets_for(seed: Seed, cli: bool) -> tuple[str, ...]:
    if seed.kind == "cache":
        return CACHE_TARGETS if cli else tuple(t for t in CACHE_TARGETS if not t.startswith("cli"))
    return API_TARGETS + (CLI_TARGETS if cli else ())


def run_target(name: str, path: Path, timeout: float) -> dict[str, Any] | None:
    """Run one target; None when it kept the contract, else a failure record."""
    from torchless.core.errors import InternalError, TorchlessError

    signal.setitimer(signal.ITIMER_PROF, timeout)
    try:
        TARGETS[name](path)
    except CaseTimeout:
        return {"target": name, "kind": "timeout", "error": f"ran past {timeout} s"}
    except InternalError as e:
        return {"target": name, "kind": "internal", "error": str(e), "traceback": _tb(e.__cause__ or e)}
    except TorchlessError:
        return None
    except MemoryError as e:
        return {"target": name, "kind": "memory", "error": f"MemoryError: {e}", "traceback": _tb(e)}
    except CliFailure as e:
        return {"target": name, "kind": "cli", "error": str(e)}
    except ScanInternal as e:
        return {"target": name, "kind": "internal", "error": f"scan report: {e}"}
    except BaseException as e:  # noqa: BLE001 - every other exception is the finding
        return {"target": name, "kind": "exception", "error": f"{type(e).__name__}: {str(e)[:300]}", "traceback": _tb(e)}
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
    return None


def _tb(e: BaseException) -> str:
    return "".join(traceback.format_exception(type(e), e, e.__traceback__, limit=-8))[-3000:]


def worker_main(argv: list[str]) -> int:
    """``harness.py --worker SEEDS_JSON BASE_SEED WORKDIR FAILDIR CLI_EVERY IDS...``: run
    cases, one JSON line per event on the protocol pipe (the original stdout)."""
    seeds_json, base_seed, workdir, faildir, cli_every = argv[0], int(argv[1]), Path(argv[2]), Path(argv[3]), int(argv[4])
    ids = [int(x) for x in argv[5:]]
    seeds = [Seed(d["name"], Path(d["path"]), d["kind"], d.get("entry")) for d in json.loads(Path(seeds_json).read_text())]
    global BOMB_DIR
    BOMB_DIR = seeds[0].path.parent
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    sys.stdout = io.StringIO()
    sys.stderr = io.StringIO()
    signal.signal(signal.SIGPROF, _alarm)
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 1000))
    import torchless  # noqa: F401 - imported before the first case, not inside its budget
    import torchless.cli.main  # noqa: F401
    import torchless.scan  # noqa: F401

    for i in ids:
        proto.write(json.dumps({"ev": "begin", "i": i}) + "\n")
        try:
            case = materialize(seeds, base_seed, i, workdir / f"case{i}")
        except Exception as e:  # noqa: BLE001 - a harness bug: reported, the run goes on
            fail = {"target": "materialize", "kind": "harness", "error": f"{type(e).__name__}: {e}", "traceback": _tb(e)}
            proto.write(
                json.dumps({"ev": "end", "i": i, "seed": seeds[i % len(seeds)].name, "mutation": "?", "fails": [fail]}) + "\n"
            )
            continue
        fails = []
        cli = cli_every > 0 and i % cli_every == 0
        for t in targets_for(case.seed, cli):
            proto.write(json.dumps({"ev": "target", "i": i, "t": t}) + "\n")
            res = run_target(t, case.target, CASE_TIMEOUT)
            if res is not None:
                fails.append(res)
        if fails:
            save_failure(case, fails, faildir)
        shutil.rmtree(workdir / f"case{i}", ignore_errors=True)
        # each case is measured on its own: buffers an earlier case left in reference
        # cycles (freed only by a full collection) must not count against the next one
        gc.collect()
        proto.write(
            json.dumps({"ev": "end", "i": i, "seed": case.seed.name, "mutation": case.description, "fails": fails}) + "\n"
        )
    return 0


def save_failure(case: Case, fails: list[dict[str, Any]], faildir: Path) -> Path:
    """Copy the case's input to ``faildir/case-<n>-<seed>/`` with a ``case.json``."""
    d = faildir / f"case-{case.index}-{case.seed.name}"
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    if case.root.is_dir():
        shutil.copytree(case.root, d / case.root.name, symlinks=True)
    elif case.root.exists():
        shutil.copyfile(case.root, d / case.root.name)
    (d / "case.json").write_text(
        json.dumps(
            {
                "case": case.index,
                "seed": case.seed.name,
                "mutation": case.description,
                "target": str(case.target.relative_to(case.root.parent)),
                "failures": fails,
            },
            indent=1,
        )
    )
    return d


# ------------------------------------------------------------------------------- parent
@dataclass
class Summary:
    """What a campaign ran and found."""

    cases: int = 0
    targets: int = 0
    failures: list[dict[str, Any]] = field(default_factory=list)
    by_seed: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    killed: int = 0
    skipped: int = 0  # cases not started because the deadline passed

    def report(self, limit: int = 20) -> str:
        lines = [
            f"{self.cases} cases, {self.targets} target runs, {len(self.failures)} failures, {self.seconds:.1f} s"
            + (f", {self.skipped} cases skipped at the deadline" if self.skipped else "")
        ]
        for f in self.failures[:limit]:
            lines.append(
                f"  case {f['case']} seed={f['seed']} mutation={f['mutation']}: {f['target']} {f['kind']}: {f['error'][:300]}"
            )
            if f.get("traceback"):
                lines.append(
                    "    " + f["traceback"].strip().splitlines()[-3].strip()
                    if len(f["traceback"].strip().splitlines()) >= 3
                    else ""
                )
        return "\n".join(lines)


def _limits() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEM_LIMIT, MEM_LIMIT))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    os.nice(5)


def _env() -> dict[str, str]:
    env = dict(
        os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", MALLOC_ARENA_MAX="2", PYTHONHASHSEED="0"
    )
    src = REPO / "src"
    paths = [str(src)] if (src / "torchless").is_dir() else []
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


def run_campaign(
    cases: int,
    *,
    base_seed: int = 0,
    start: int = 0,
    workers: int = 2,
    workdir: Path,
    faildir: Path,
    cli_every: int = 1,
    progress: Callable[[Summary], None] | None = None,
    seeds: list[Seed] | None = None,
    deadline: float | None = None,
    chunk: int = 300,
) -> Summary:
    """Run cases ``start .. start+cases-1`` over ``workers`` processes; returns the summary.

    With ``deadline`` (wall seconds), no new batch of ``chunk`` cases starts after it: on a
    loaded machine the run covers fewer cases (``summary.cases`` says how many) instead of
    running past a test timeout.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    faildir.mkdir(parents=True, exist_ok=True)
    if seeds is None:
        seeds = build_seeds(workdir / "seeds")
    seeds_json = workdir / "seeds.json"
    seeds_json.write_text(json.dumps([{"name": s.name, "path": str(s.path), "kind": s.kind, "entry": s.entry} for s in seeds]))
    summary = Summary()
    t0 = time.monotonic()
    pending = [list(range(start + w, start + cases, workers)) for w in range(workers)]
    procs: dict[int, dict[str, Any]] = {}

    def spawn(w: int) -> None:
        ids = pending[w]
        if not ids:
            return
        if deadline is not None and time.monotonic() - t0 > deadline:
            summary.skipped += len(ids)
            pending[w] = []
            return
        # at most a few hundred ids per process: the command line stays short and a
        # process that leaks memory is renewed
        batch, pending[w] = ids[:chunk], ids[chunk:]
        argv = [
            sys.executable,
            str(Path(__file__).resolve()),
            "--worker",
            str(seeds_json),
            str(base_seed),
            str(workdir / f"w{w}"),
            str(faildir),
            str(cli_every),
            *map(str, batch),
        ]
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=_env(), preexec_fn=_limits)
        procs[w] = {"p": p, "todo": list(batch), "last": time.monotonic(), "cur": None, "target": None, "buf": b""}

    for w in range(workers):
        spawn(w)
    watchdog = WATCHDOG  # a worker silent this long is stuck (blocked, or in a C call past its alarm)
    while procs:
        fds = {st["p"].stdout.fileno(): w for w, st in procs.items()}
        ready, _, _ = select.select(list(fds), [], [], 1.0)
        now = time.monotonic()
        for fd in ready:
            w = fds[fd]
            st = procs[w]
            got = os.read(fd, 1 << 16)
            if not got:
                _finish_worker(w, st, procs, pending, summary, seeds, base_seed, faildir, workdir, "exited")
                spawn(w)
                continue
            st["buf"] += got
            *lines, st["buf"] = st["buf"].split(b"\n")
            st["last"] = now
            for line in lines:
                ev = json.loads(line)
                if ev["ev"] == "begin":
                    st["cur"] = ev["i"]
                    st["target"] = "materialize"
                elif ev["ev"] == "target":
                    st["target"] = ev["t"]
                    summary.targets += 1
                elif ev["ev"] == "end":
                    summary.cases += 1
                    summary.by_seed[ev["seed"]] = summary.by_seed.get(ev["seed"], 0) + 1
                    for f in ev["fails"]:
                        summary.failures.append({"case": ev["i"], "seed": ev["seed"], "mutation": ev["mutation"], **f})
                    st["todo"].remove(ev["i"])
                    st["cur"] = None
                    if progress:
                        progress(summary)
        for w, st in list(procs.items()):
            if now - st["last"] > watchdog:
                st["p"].kill()
                summary.killed += 1
                _finish_worker(w, st, procs, pending, summary, seeds, base_seed, faildir, workdir, "hung")
                spawn(w)
    summary.seconds = time.monotonic() - t0
    return summary


def _finish_worker(
    w: int,
    st: dict[str, Any],
    procs: dict[int, Any],
    pending: list[list[int]],
    summary: Summary,
    seeds: list[Seed],
    base_seed: int,
    faildir: Path,
    workdir: Path,
    how: str,
) -> None:
    p = st["p"]
    try:
        p.wait(timeout=10)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
    del procs[w]
    if st["cur"] is not None:
        i = st["cur"]
        case = materialize(seeds, base_seed, i, workdir / f"replay{i}")
        kind = "timeout" if how == "hung" else ("memory" if p.returncode in (-9, -11, -6) else "crash")
        f = {"target": st["target"] or "?", "kind": kind, "error": f"worker {how} (exit {p.returncode}) during this case"}
        save_failure(case, [f], faildir)
        shutil.rmtree(workdir / f"replay{i}", ignore_errors=True)
        summary.failures.append({"case": i, "seed": case.seed.name, "mutation": case.description, **f})
        summary.cases += 1
        st["todo"].remove(i)
    # the ids this process did not reach go back to the front of its queue
    pending[w] = [i for i in st["todo"]] + pending[w]


def iter_seed_names(seeds: list[Seed]) -> Iterator[str]:
    return (s.name for s in seeds)


if __name__ == "__main__" and len(sys.argv) > 1 and sys.argv[1] == "--worker":
    sys.exit(worker_main(sys.argv[2:]))
