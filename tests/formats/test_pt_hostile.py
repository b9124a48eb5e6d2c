"""Hostile eager checkpoints: every bad input gives a TorchlessError subclass (or, where
the bytes are still a valid checkpoint, the same parse torch makes), in bounded time,
without importing or running anything the file names."""

from __future__ import annotations

import io
import os
import pickle
import random
import struct
import sys
import warnings

import numpy as np
import pytest
from tl_testutil import build_legacy_tar, build_zip, load_and_touch

import torchless
from torchless.cli.main import main as cli_main
from torchless.container.zip import TorchZipWriter, ZipReader
from torchless.core.errors import LimitError, TorchlessError, TruncatedError, UnsafeGlobalError
from torchless.core.tree import describe, iter_tensors
from torchless.formats.pt.read import read_checkpoint
from torchless.io.source import BytesSource

torch = pytest.importorskip("torch", reason="torch builds the base checkpoints and is the oracle")


def _ckpt_bytes(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


@pytest.fixture(scope="module")
def small() -> bytes:
    t = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    return _ckpt_bytes({"w": t, "v": t[1:], "b": torch.ones(2, dtype=torch.bfloat16), "n": [1, "x", 2.5]})


def _records(data: bytes) -> list[tuple[str, bytes]]:
    zr = ZipReader(data)
    return [(r, zr.read_bytes(e)) for r, e in zip(zr.records(), zr.entries, strict=False)]


def _rebuild(records, prefix="archive") -> bytes:
    out = io.BytesIO()
    with TorchZipWriter(out, prefix) as zw:
        for r, d in records:
            zw.write(r, d)
    return out.getvalue()


def _with_pickle(base: bytes, pkl: bytes) -> bytes:
    return _rebuild([(r, pkl if r == "data.pkl" else d) for r, d in _records(base)])


def _outcome(data: bytes, weights_only: bool = True):
    """Parse + touch every tensor; a TorchlessError is an acceptable outcome."""
    try:
        return load_and_touch(data, weights_only)
    except TorchlessError as e:
        return e


# -- truncation and corruption -----------------------------------------------------------
def test_truncation_at_every_record_boundary(small):
    zr = ZipReader(small)
    cuts = {0, 1, 3, 4, 21, 22, len(small) - 1, len(small) - 22, len(small) - 42, len(small) - 98, zr.cd_offset}
    for e in zr.entries:
        d = zr.data_offset(e)
        cuts |= {e.header_offset, e.header_offset + 10, e.header_offset + 30, d, d + e.size // 2, d + e.size, d + e.size + 8}
        cuts |= {e.central_offset, e.central_offset + 46}
    for cut in sorted(c for c in cuts if 0 <= c < len(small)):
        res = _outcome(small[:cut])
        assert isinstance(res, TorchlessError), cut


def test_truncated_data_pkl_at_every_byte(small):
    pkl = dict(_records(small))["data.pkl"]
    for i in range(len(pkl)):
        res = _outcome(_with_pickle(small, pkl[:i]))
        assert isinstance(res, TorchlessError), i


def test_random_bit_flips_in_the_pickle(small):
    rng = random.Random(1234)
    zr = ZipReader(small)
    e = zr.get("data.pkl")
    start = zr.data_offset(e)
    outcomes = {"ok": 0, "error": 0}
    for _ in range(400):
        b = bytearray(small)
        for _k in range(rng.randint(1, 3)):
            i = start + rng.randrange(e.size)
            b[i] ^= 1 << rng.randrange(8)
        for wo in (True, False):
            res = _outcome(bytes(b), wo)
            outcomes["error" if isinstance(res, TorchlessError) else "ok"] += 1
    assert outcomes["error"] > 0


def test_random_byte_corruption_anywhere(small):
    rng = random.Random(99)
    for _ in range(300):
        b = bytearray(small)
        i = rng.randrange(len(b))
        b[i] = rng.randrange(256)
        _outcome(bytes(b))


def _pid_pickle(numel: int, key: str = "0", storage: str = "FloatStorage") -> bytes:
    return (
        b"\x80\x02ctorch._utils\n_rebuild_tensor_v2\n((X\x07\x00\x00\x00storagectorch\n"
        + storage.encode()
        + b"\nX"
        + struct.pack("<I", len(key))
        + key.encode()
        + b"X\x03\x00\x00\x00cpu\x8a\x08"
        + struct.pack("<q", numel)
        + b"tQK\x00K\x01\x85K\x01\x85\x89ccollections\nOrderedDict\n)RtR."
    )


def test_huge_declared_sizes(small):
    # storage numel far beyond the record
    for numel in (2**31, 2**62, 2**63 - 1):
        res = _outcome(_with_pickle(small, _pid_pickle(numel)))
        assert isinstance(res, TruncatedError), numel
    # a storage key that names no record / a path outside data/
    for key in ("99", "../data.pkl", "0/../../x"):
        assert isinstance(_outcome(_with_pickle(small, _pid_pickle(3, key))), TorchlessError)
    # BINUNICODE / BINBYTES8 lengths
    for pkl in (b"\x80\x02X\xff\xff\xff\x7fab.", b"\x80\x04\x8e" + struct.pack("<Q", 2**62) + b"ab."):
        assert isinstance(_outcome(_with_pickle(small, pkl)), TruncatedError)
    # zip sizes: central directory entry claims a huge size / offset
    zr = ZipReader(small)
    e = zr.get("data.pkl")
    for field, value in ((24, 0xFFFFFFF0), (20, 0xFFFFFFF0), (42, 0xFFFFFF00)):
        b = bytearray(small)
        struct.pack_into("<I", b, e.central_offset + field, value)
        assert isinstance(_outcome(bytes(b)), TorchlessError), field
    # zip64 end record declares an enormous central directory / entry count
    b = bytearray(small)
    e64 = small.rfind(b"PK\x06\x06")
    struct.pack_into("<Q", b, e64 + 32, 2**40)
    assert isinstance(_outcome(bytes(b)), TorchlessError)
    b = bytearray(small)
    struct.pack_into("<Q", b, e64 + 40, 2**50)
    assert isinstance(_outcome(bytes(b)), TorchlessError)


def test_hostile_tensor_geometry(small):
    """Strides/offsets that reach outside the storage are refused when read."""
    base = (
        b"\x80\x02ctorch._utils\n_rebuild_tensor_v2\n((X\x07\x00\x00\x00storagectorch\nFloatStorage\n"
        b"X\x01\x00\x00\x000X\x03\x00\x00\x00cpuK\x0ctQ"
    )
    tail = b"\x89ccollections\nOrderedDict\n)RtR."
    for geom in (
        b"K\x0bK\x02\x85K\x01\x85",
        b"K\x00K\x04\x85K\x05\x85",
        b"\x8a\x08" + struct.pack("<q", 2**62) + b"K\x01\x85K\x01\x85",
        b"K\x00J\xff\xff\xff\xff\x85K\x01\x85",
        b"K\x00K\x02\x85K\x01K\x01\x86",
    ):
        res = _outcome(_with_pickle(small, base + geom + tail))
        assert isinstance(res, TorchlessError), geom


# -- nesting and memo bombs ---------------------------------------------------------------
def test_deep_nesting():
    d = 30_000  # far beyond Python's recursion limit; the hashing cases crash C at ~100k
    h = 150_000
    cases = [
        b"\x80\x02" + b"(" * d + b"N.",  # MARK chain
        b"\x80\x02N" + b"\x85" * d + b".",  # TUPLE1 chain: a legal 100k-deep tuple
        b"\x80\x02" + b"]" * d + b"a" * (d - 1) + b".",  # deep list
        b"\x80\x02}" + b"N" + b"\x85" * d + b"K\x01s.",  # deep tuple as a dict key
        b"\x80\x02c__builtin__\nset\n]N" + b"\x85" * h + b"a\x85R.",  # deep tuple in set(): segfault in C if unchecked
        b"\x80\x02ccollections\nOrderedDict\n]N" + b"\x85" * h + b"K\x01\x86a\x85R.",
        b"\x80\x02c__builtin__\nfrozenset\n]N" + b"\x85" * h + b"a\x85R.",
    ]
    for i, pkl in enumerate(cases):
        for wo in (True, False) if i < 4 else (True,):
            try:
                cp = read_checkpoint(BytesSource(_with_pickle_plain(pkl)), weights_only=wo)
            except TorchlessError:
                continue
            list(iter_tensors(cp.obj))
            describe(cp.obj)


def _with_pickle_plain(pkl: bytes) -> bytes:
    return _rebuild([("data.pkl", pkl), ("version", b"3\n")])


def test_memo_bombs_stay_fast(tmp_path):
    t = torch.arange(3.0)
    a = [t]
    for _ in range(80):
        a = [a, a]
    d = {"bomb": a}
    for _ in range(60):
        d = {"x": d, "y": d}
    path = tmp_path / "bomb.pt"
    torch.save({"list": a, "dict": d, "w": t}, path)
    assert os.path.getsize(path) < 100_000
    art = torchless.open(path)
    names = [n for n, _ in art.tensors()]
    assert "w" in names and len(names) < 1000
    info = art.info()
    assert info["storages"] == 1
    assert cli_main(["info", str(path), "--json"]) == 0
    assert cli_main(["ls", str(path)]) == 0
    # exponentially shared tuples hashed as a set item are refused, not hashed 2**80 times
    s = (1,)
    for _ in range(80):
        s = (s, s)
    bomb = pickle.dumps({"s": s}, protocol=2).replace(b"}q\x00", b"}q\x00", 1)
    set_bomb = b"\x80\x02c__builtin__\nset\n]" + pickle.dumps(s, protocol=2)[2:-1] + b"a\x85R."
    assert isinstance(_outcome(_with_pickle_plain(set_bomb)), LimitError)
    dict_bomb = b"\x80\x02}" + pickle.dumps(s, protocol=2)[2:-1] + b"K\x01s."
    assert isinstance(_outcome(_with_pickle_plain(dict_bomb)), LimitError)
    assert bomb


def test_range_expansion_is_refused():
    """builtins.range is data, but list(range(10**12)) must not be materialized."""
    for fn in (b"list", b"tuple", b"set", b"frozenset"):
        pkl = b"\x80\x02c__builtin__\n" + fn + b"\nc__builtin__\nrange\nJ\x00\xca\x9a;\x85R\x85R."
        res = _outcome(_with_pickle_plain(pkl), False)
        assert isinstance(res, TorchlessError), fn


# -- zip tricks ---------------------------------------------------------------------------------
def _torch_outcome(data: bytes):
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return torch.load(io.BytesIO(data), weights_only=True)
    except Exception as e:  # noqa: BLE001 - torch's exception types vary
        return e


def _pkl(value) -> bytes:
    return pickle.dumps(value, protocol=2)


@pytest.mark.parametrize("copies", [2, 3, 4, 5, 7])
def test_duplicate_member_names_read_the_copy_torch_reads(small, copies):
    recs = _records(small)
    out = []
    for r, d in recs:
        if r == "data.pkl":
            out.extend(("data.pkl", _pkl({"which": i})) for i in range(copies))
        else:
            out.append((r, d))
    data = _rebuild(out)
    expect = _torch_outcome(data)
    zr = ZipReader(data)
    assert len(zr.duplicates()) == 1
    got = torchless.load(data, format="pt")
    assert got == expect
    assert zr.lookup("data.pkl").index == expect["which"]
    assert any(p.code == "duplicate-name" for p in zr.verify())


def test_case_variant_names(small):
    recs = [("DATA.PKL" if r == "data.pkl" else r, _pkl({"case": 1}) if r == "data.pkl" else d) for r, d in _records(small)]
    data = _rebuild(recs)
    assert torchless.load(data, format="pt") == _torch_outcome(data) == {"case": 1}
    # both spellings present: the binary search decides, as in torch
    recs = _records(small)
    recs.insert(1, ("Data.Pkl", _pkl({"case": 2})))
    data = _rebuild(recs)
    expect = _torch_outcome(data)
    got = torchless.load(data, format="pt")
    assert not isinstance(expect, Exception)
    assert set(got) == set(expect) and all(
        np.array_equal(np.asarray(got[k].numpy()), expect[k].float().numpy())
        if hasattr(expect[k], "numpy")
        else got[k] == expect[k]
        for k in expect
    )


def test_local_central_name_mismatch(small):
    zr = ZipReader(small)
    e = zr.get("data.pkl")
    b = bytearray(small)
    name_at = e.header_offset + 30
    b[name_at : name_at + len(e.raw_name)] = e.raw_name.upper()
    data = bytes(b)
    expect = _torch_outcome(data)
    got = _outcome(data)
    assert not isinstance(expect, Exception) and not isinstance(got, TorchlessError)
    assert any(p.code == "name-mismatch" for p in ZipReader(data).verify())


def test_overlapping_records_and_path_traversal(small):
    pk = _pkl({"a": 1})
    # two central entries pointing at the same local header
    data = build_zip([(b"archive/data.pkl", pk), (b"archive/version", b"3\n")])
    zr = ZipReader(data)
    cd = bytearray(data)
    second = zr.entries[1].central_offset
    struct.pack_into("<I", cd, second + 42, 0)
    data2 = bytes(cd)
    res = _outcome(data2)
    assert isinstance(res, TorchlessError) or res.load() == {"a": 1}
    codes = {p.code for p in ZipReader(data2).verify()}
    assert "overlap" in codes or "name-mismatch" in codes
    # path traversal member names are listed, never extracted
    data3 = build_zip([(b"archive/data.pkl", pk), (b"archive/../../evil", b"x"), (b"/abs/path", b"y")])
    zr3 = ZipReader(data3)
    assert {p.code for p in zr3.verify()} >= {"path-traversal", "prefix"}
    # a member outside the archive folder: torch.load refuses the archive (getAllRecords)
    assert isinstance(_torch_outcome(data3), Exception)
    assert isinstance(_outcome(data3), TorchlessError)
    data4 = build_zip([(b"archive/data.pkl", pk), (b"archive/version", b"3\n"), (b"archive/../../evil", b"x")])
    assert _torch_outcome(data4) == {"a": 1} == torchless.load(data4, format="pt")


def test_member_names_torch_refuses(small):
    zr = ZipReader(small)
    e = zr.get(".data/serialization_id")
    for pos, byte in ((e.central_offset + 46 + 3, 0x97), (zr.entries[-1].central_offset + 46, ord("X"))):
        b = bytearray(small)
        b[pos] = byte
        data = bytes(b)
        assert isinstance(_torch_outcome(data), Exception)
        assert isinstance(_outcome(data), TorchlessError)


def test_first_entry_outside_a_folder_and_garbage():
    assert isinstance(_outcome(build_zip([(b"data.pkl", _pkl(1))])), TorchlessError)
    for junk in (
        b"",
        b"PK\x03\x04",
        b"PK\x03\x04" + b"\x00" * 100,
        b"\x80\x02K\x01.",
        b"PYTORCH1" + b"\x00" * 50,
        os.urandom(300),
    ):
        assert isinstance(_outcome(junk), TorchlessError)


# -- nothing named by a file is imported or run -------------------------------------------------------
def _evil_pickles(marker: str) -> dict[str, bytes]:
    cmd = f"touch {marker}".encode()
    x = lambda s: b"X" + struct.pack("<I", len(s)) + s  # noqa: E731
    return {
        "os.system": b"\x80\x02cos\nsystem\n" + x(cmd) + b"\x85R.",
        "posix.system": b"\x80\x02cposix\nsystem\n" + x(cmd) + b"\x85R.",
        "builtins.eval": b"\x80\x02c__builtin__\neval\n" + x(b"__import__('os').system('" + cmd + b"')") + b"\x85R.",
        "builtins.exec": b"\x80\x02cbuiltins\nexec\n" + x(b"open('" + marker.encode() + b"','w')") + b"\x85R.",
        "subprocess.Popen": b"\x80\x04\x8c\nsubprocess\x8c\x05Popen\x93" + x(b"touch") + x(marker.encode()) + b"\x86\x85R.",
        "builtins.getattr": b"\x80\x02c__builtin__\ngetattr\nc__builtin__\n__import__\n"
        + x(b"os")
        + b"\x85R"
        + x(b"system")
        + b"\x86R"
        + x(cmd)
        + b"\x85R.",
        "INST": b"(" + x(cmd) + b"ios\nsystem\n.",
        "OBJ": b"(cos\nsystem\n" + x(cmd) + b"o.",
        "BUILD setstate": b"\x80\x02cos\n_wrap_close\n)\x81cos\nsystem\nb.",
        "copyreg": b"\x80\x02ccopyreg\n_reconstructor\ncos\nsystem\nc__builtin__\nobject\nN\x87R.",
        "torch.load nested": b"\x80\x02ctorch\nload\n" + x(marker.encode()) + b"\x85R.",
        "numpy.load": b"\x80\x02cnumpy\nload\n" + x(marker.encode()) + b"\x85R.",
    }


@pytest.mark.parametrize("weights_only", [True, False])
def test_malicious_globals_run_nothing(tmp_path, weights_only):
    marker = str(tmp_path / "pwned")
    for name, pkl in _evil_pickles(marker).items():
        before = set(sys.modules)
        for data in (_with_pickle_plain(pkl),):
            try:
                obj = torchless.load(data, format="pt", weights_only=weights_only)
                assert not weights_only, name
                list(iter_tensors(obj))
                describe(obj)
            except UnsafeGlobalError:
                assert weights_only, name
            except TorchlessError:
                pass
        assert not os.path.exists(marker), name
        assert set(sys.modules) - before == set(), (name, set(sys.modules) - before)


def test_weights_only_error_names_the_global():
    with pytest.raises(UnsafeGlobalError) as ei:
        torchless.load(_with_pickle_plain(b"\x80\x02cos\nsystem\nX\x02\x00\x00\x00ls\x85R."), format="pt")
    assert ei.value.global_name == "os.system"
    assert "os.system" in str(ei.value)


def test_corrupt_legacy_stream_and_tar(tmp_path):
    build_legacy_tar(tmp_path / "old.tar")
    tar = (tmp_path / "old.tar").read_bytes()
    buf = io.BytesIO()
    torch.save({"a": torch.arange(5), "b": torch.ones(2, 2)}, buf, _use_new_zipfile_serialization=False)
    legacy = buf.getvalue()
    rng = random.Random(7)
    for data in (tar, legacy):
        variants = [data[:i] for i in range(0, len(data), 5)]
        for _ in range(300):
            b = bytearray(data)
            b[rng.randrange(len(b))] = rng.randrange(256)
            variants.append(bytes(b))
        for v in variants:
            _outcome(v, False)


def _storage_ckpt(tensors: dict, record: bytes) -> bytes:
    from torchless.pickle.writer import Global, Persistent, Pickler2, Reduce

    od = Reduce(Global("collections", "OrderedDict"), ())
    obj = {}
    for name, (stype, numel, size) in tensors.items():
        pid = Persistent(("storage", Global("torch", stype), "0", "cpu", numel))
        obj[name] = Reduce(Global("torch._utils", "_rebuild_tensor_v2"), (pid, 0, (size,), (1,), False, od))
    return _rebuild([("data.pkl", Pickler2().dumps(obj)), ("data/0", record), ("version", b"3\n")])


@pytest.mark.parametrize(
    "tensors,nbytes",
    [
        ({"a": ("FloatStorage", 4, 4), "b": ("DoubleStorage", 2, 2)}, 16),  # same key, other class: first wins
        ({"a": ("DoubleStorage", 2, 2), "b": ("FloatStorage", 4, 4)}, 16),  # ... and then overflows
        ({"a": ("ByteStorage", 16, 16), "b": ("LongStorage", 2, 2)}, 16),
        ({"a": ("FloatStorage", 4, 4)}, 12),  # record shorter than the pid says
        ({"a": ("FloatStorage", 4, 4)}, 20),  # record longer: torch.load refuses it too
        ({"a": ("FloatStorage", 4, 4)}, 16),
    ],
)
def test_storage_pids_resolve_like_torch(tensors, nbytes):
    data = _storage_ckpt(tensors, bytes(range(nbytes)))
    expect = _torch_outcome(data)
    got = _outcome(data)
    if isinstance(expect, Exception):
        assert isinstance(got, TorchlessError)
        return
    assert not isinstance(got, TorchlessError), got
    obj = got.load()
    for k, v in expect.items():
        assert obj[k].dtype.torch_name == str(v.dtype) and obj[k].shape == tuple(v.shape)
        assert obj[k].numpy().tobytes() == v.numpy().tobytes()


def test_archive_level_checks_match_torch(small):
    """Corrupting container metadata: where torch (miniz) still reads the file torchless
    does too, and where it refuses, torchless refuses."""
    zr = ZipReader(small)
    cases = []
    b = bytearray(small)
    e64 = small.rfind(b"PK\x06\x06")
    b[e64] = 0  # zip64 record signature gone: miniz falls back to the classic end record
    cases.append(bytes(b))
    for rec, data in (("version", b"x\n"), ("version", b"99\n"), (".storage_alignment", b"ZZ")):
        cases.append(_rebuild([(r, data if r == rec else d) for r, d in _records(small)]))
    cases.append(_rebuild([(r, d) for r, d in _records(small) if r != "version"]))
    b = bytearray(small)
    struct.pack_into("<H", b, zr.get("data/0").central_offset + 8, 0x2808)  # masked local header flag
    cases.append(bytes(b))
    b = bytearray(small)
    struct.pack_into("<I", b, zr.get("data/1").central_offset + 20, 7)  # stored with csize != size
    cases.append(bytes(b))
    for data in cases:
        expect = _torch_outcome(data)
        got = _outcome(data)
        assert isinstance(expect, Exception) == isinstance(got, TorchlessError), (expect, got)
