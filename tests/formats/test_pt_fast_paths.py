"""The per-tensor fast paths against the general code they stand in for (issue 12).

* the pickle machine's one-step run of torch's state-dict entries
  (``SETTINGS.tensor_calls``) against the opcode-by-opcode loop:
  the same object, the same globals, the same error (type, offset, message) on every
  input, the differential fuzzer's checkpoints and byte-flipped mutations included;
* the pickler's direct tensor writer (``SETTINGS.pickle_tensors``) and
  ``TorchZipWriter.write_small`` against the general ones: the same bytes;
* eager reads through ``BatchReader`` (runs of small records in one read) against the
  memory-mapped bytes, with a damaged record in the middle of a run.

The oracle for the fast paths is the general code (itself checked against torch by the
differential suite); every comparison here also checks that the fast path ran.
"""

from __future__ import annotations

import io
import os
import random
import struct
import warnings
import zipfile

import numpy as np
import pytest

import torchless
from torchless.container.zip import TorchZipWriter, ZipReader
from torchless.core.dtypes import DTYPES
from torchless.core.errors import FormatError, TorchlessError
from torchless.core.settings import SETTINGS
from torchless.core.tensor import Storage, Tensor
from torchless.core.tree import iter_tensors
from torchless.core.values import StorageType
from torchless.formats.pt.read import make_resolver, read_zip_checkpoint
from torchless.io.crc import crc32_spans
from torchless.pickle.machine import Unpickler

torch = pytest.importorskip("torch", reason="torch writes the checkpoints")


import pt_fuzz  # noqa: E402


@pytest.fixture(autouse=True)
def _read_ahead_on(monkeypatch):
    """The eager load's read-ahead is one of the fast paths this file compares with the
    general code: on here, whatever the suite's setting (TORCHLESS_GENERAL_PATHS)."""
    monkeypatch.setattr(SETTINGS, "pt_read_ahead", True)


def _picture(x, seen=None):
    """A comparable picture of a loaded tree (tensors by every field and their bytes)."""
    if isinstance(x, Tensor):
        st = x.storage
        return (
            "T",
            x.dtype.name,
            x.shape,
            tuple(x.stride()),
            x.storage_offset(),
            x.requires_grad,
            sorted(x.metadata.items()),
            x.device,
            None if st is None else (st.key, st.nbytes, st.dtype.name, st.location, st.byteorder, st.origin),
        )
    if isinstance(x, dict):
        return (type(x).__name__, [(k, _picture(v)) for k, v in x.items()], sorted(getattr(x, "attributes", {}) or {}))
    if isinstance(x, (list, tuple)):
        return (type(x).__name__, [_picture(v) for v in x])
    return (type(x).__name__, repr(x))


def _pl(pid):
    """A persistent_load shaped like torch's (refusing the rest)."""
    if type(pid) is not tuple or len(pid) != 5 or pid[0] != "storage" or type(pid[1]) is not StorageType:
        raise FormatError("bad pid")
    if type(pid[4]) is not int or pid[4] < 0:
        raise FormatError("bad numel")
    dt = pid[1].dtype or DTYPES["uint8"]
    return Storage(str(pid[2]), pid[4] * dt.itemsize, dt, str(pid[3]))


def _run_pickle(data: bytes, fast: bool, monkeypatch):
    """(outcome, globals seen, fast entries) of the machine on a torch data.pkl."""
    monkeypatch.setattr(SETTINGS, "tensor_calls", fast)
    r = make_resolver(True)
    up = Unpickler(data, resolver=r, persistent_load=_pl)
    try:
        out = ("ok", _picture(up.load()))
    except TorchlessError as e:
        out = ("error", type(e).__name__, e.offset, str(e))
    return out, list(r.seen), up.info.fast_entries


def _state_dict(n: int, seed: int = 0):
    """n tensors of varied shapes, dtypes, views, shared storages and flags."""
    g = torch.Generator().manual_seed(seed)
    sd = {}
    base = torch.randn(64, generator=g)
    for i in range(n):
        k = i % 9
        if k == 0:
            t = torch.randn(int(torch.randint(1, 300, (1,), generator=g)), generator=g)
        elif k == 1:
            t = torch.tensor(float(i))  # 0-d: EMPTY_TUPLE size and stride
        elif k == 2:
            t = torch.randn(2, 3, 4, 5, generator=g)  # MARK ... TUPLE
        elif k == 3:
            t = torch.randn(6, 5, generator=g).t()  # non-contiguous
        elif k == 4:
            t = base[i % 32 :]  # shared storage, an offset
        elif k == 5:
            t = torch.zeros(70000, dtype=torch.int8)[: 2 + i % 5]  # BININT numel
        elif k == 6:
            t = torch.ones(3, dtype=torch.float16).requires_grad_(False)
        elif k == 7:
            t = torch.nn.Parameter(torch.randn(4, generator=g))  # not the plain shape
        else:
            t = torch.arange(5, dtype=torch.int64)
        sd[f"layer.{i}.w"] = t
    return sd


def _saved(obj) -> bytes:
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.save(obj, buf)
    return buf.getvalue()


def _pkl(data: bytes) -> bytes:
    zf = zipfile.ZipFile(io.BytesIO(data))
    return zf.read(next(n for n in zf.namelist() if n.endswith("/data.pkl")))


@pytest.mark.parametrize("n", [3, 40, 300])
def test_state_dicts_same_with_and_without_the_fast_path(n, monkeypatch):
    data = _pkl(_saved(_state_dict(n)))
    fast, seen_f, hits = _run_pickle(data, True, monkeypatch)
    slow, seen_s, none = _run_pickle(data, False, monkeypatch)
    assert fast[0] == "ok" and fast == slow and seen_f == seen_s
    assert none == 0 and hits >= (n * 6) // 9 - 2  # every plain tensor after the first


def test_ordered_state_dict_with_metadata_and_nesting(monkeypatch):
    sd = torch.nn.Sequential(*[torch.nn.Linear(3, 3) for _ in range(60)]).state_dict()
    for obj in (sd, {"model": sd, "opt": {"step": 3, "m": [torch.ones(2)] * 3}}):
        data = _pkl(_saved(obj))
        fast, seen_f, hits = _run_pickle(data, True, monkeypatch)
        assert (fast, seen_f) == _run_pickle(data, False, monkeypatch)[:2]
        assert fast[0] == "ok" and hits > 100


def test_mutated_pickles_fail_or_load_the_same_way(monkeypatch):
    """Byte flips, cuts and memo-index rewrites of a 300-entry pickle: the fast path
    returns what the loop returns, or the same error at the same offset."""
    data = _pkl(_saved(_state_dict(300, seed=1)))
    rng = random.Random(12)
    hits = 0
    for i in range(160):
        b = bytearray(data)
        if i % 4 == 0:
            b = b[: rng.randrange(len(b))]
        else:
            for _ in range(rng.randint(1, 3)):
                b[rng.randrange(len(b))] = rng.choice([0x71, 0x72, 0x68, 0x6A, 0x28, 0x85, 0x4B, 0x52, rng.randrange(256)])
        fast, seen_f, h = _run_pickle(bytes(b), True, monkeypatch)
        slow, seen_s, _ = _run_pickle(bytes(b), False, monkeypatch)
        assert fast == slow, f"mutation {i}"
        assert seen_f == seen_s
        hits += h
    assert hits > 1000


def test_a_memo_read_of_a_value_stored_in_the_run_is_left_to_the_loop(monkeypatch):
    """An entry that fetches what an earlier entry of the same run stored (here: its key
    string used as the next storage's location) must see that value, as the loop does."""
    data = bytearray(_pkl(_saved({f"k{i}": torch.ones(2) for i in range(5)})))
    # the 3rd entry's location read ('cpu', h\x06) now reads the 2nd entry's key string
    first = data.index(b"X\x02\x00\x00\x00k1")
    put = data[first + 7 : first + 9]
    assert put[:1] == b"q"
    loc = data.index(b"h\x06", data.index(b"X\x02\x00\x00\x00k2"))
    data[loc + 1] = put[1]
    fast = _run_pickle(bytes(data), True, monkeypatch)
    slow = _run_pickle(bytes(data), False, monkeypatch)
    assert fast[:2] == slow[:2] and fast[0][0] == "ok"
    assert "'k1'" in repr(fast[0])  # the location really is the stored key


def test_fuzzer_checkpoints_read_and_write_the_same_with_and_without_fast_paths(monkeypatch):
    hits = 0
    for seed in range(11_000, 11_060):
        g = pt_fuzz.Gen(seed)
        layout = g.pick([x for x in pt_fuzz.LAYOUTS if x != "legacy"])
        protocol = int(g.pick([2, 3, 4, 5]))
        obj = g.checkpoint()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            data = pt_fuzz.torch_save(obj, layout, protocol)
        pics, saved = [], []
        for fast in (True, False):
            monkeypatch.setattr(SETTINGS, "tensor_calls", fast)
            monkeypatch.setattr(SETTINGS, "pickle_tensors", fast)
            for mm in (True, False):
                zr = ZipReader(data)
                cp = read_zip_checkpoint(zr, mmap=mm)
                hits += _fast_entries(zr) if fast else 0
                pics.append(_picture(cp.obj))
                byts = [bytes(t.storage.bytes()) for _n, t in iter_tensors(cp.obj) if getattr(t, "storage", None) is not None]
                pics.append(byts)
            buf = io.BytesIO()
            torchless.save(obj, buf)
            saved.append(buf.getvalue())
        assert pics[0] == pics[2] == pics[4] == pics[6], f"seed {seed}"
        assert pics[1] == pics[3] == pics[5] == pics[7], f"seed {seed}"
        assert saved[0] == saved[1], f"seed {seed}"
    assert hits > 0  # small random trees: the many-entry cases are the tests above


def _fast_entries(zr) -> int:
    """How many entries of the archive's data.pkl the fast path runs."""
    pkl = bytes(zr.read(zr.get("data.pkl")))
    up = Unpickler(pkl, resolver=make_resolver(True), persistent_load=_pl)
    try:
        up.load()
    except TorchlessError:
        return 0
    return up.info.fast_entries


def test_save_writes_the_same_bytes_either_way(monkeypatch, tmp_path):
    sd = torchless.load(_saved(_state_dict(120, seed=3)))
    sd["again"] = next(iter(sd.values()))  # the same tensor twice: a memo read
    outs = []
    for fast in (True, False):
        monkeypatch.setattr(SETTINGS, "pickle_tensors", fast)
        (tmp_path / str(fast)).mkdir()
        p = tmp_path / str(fast) / "m.pt"  # the archive folder comes from the name
        torchless.save(sd, p)
        outs.append(p.read_bytes())
    assert outs[0] == outs[1]
    back = torch.load(io.BytesIO(outs[0]), weights_only=True)
    assert back["again"] is back[next(iter(back))]


def test_write_small_writes_what_write_writes():
    rng = np.random.default_rng(0)
    recs = [(f"data/{i}", rng.bytes(int(rng.integers(0, 5000)))) for i in range(300)]
    recs.append(("data/big", rng.bytes(70000)))
    outs = []
    for small in (True, False):
        buf = io.BytesIO()
        with TorchZipWriter(buf, "arch") as zw:
            for name, body in recs:
                (zw.write_small if small else zw.write)(name, body)
        outs.append(buf.getvalue())
    assert outs[0] == outs[1]
    zf = zipfile.ZipFile(io.BytesIO(outs[0]))
    assert zf.testzip() is None and zf.read("arch/data/7") == recs[7][1]


@pytest.mark.parametrize("crc", [True, False])
def test_write_small_many_writes_what_write_small_writes(crc):
    rng = np.random.default_rng(1)
    recs = [(f"data/{i}", memoryview(rng.bytes(int(rng.integers(0, 9000))))) for i in range(400)]
    raw = b"".join(bytes(v) for _, v in recs)  # the records' bytes as one buffer, as in a mapped file
    spans, at = [], 0
    for _, v in recs:
        spans.append((at, len(v)))
        at += len(v)
    outs = []
    for many in (True, False):
        buf = io.BytesIO()
        with TorchZipWriter(buf, "arch", alignment=64 if crc else 512, compute_crc=crc) as zw:
            zw.write("data.pkl", b"x" * 37)
            if many:
                zw.write_small_many([n for n, _ in recs[:250]], [v for _, v in recs[:250]])
                # the CRC-32s given by the caller (consolidation takes them from the map)
                crcs = crc32_spans(raw, [o for o, _ in spans[250:]], [len(v) for _, v in recs[250:]])
                zw.write_small_many([n for n, _ in recs[250:]], [v for _, v in recs[250:]], crcs)
            else:
                for name, body in recs:
                    zw.write_small(name, body)
            zw.write("version", b"3\n")
            zw.write("serialization_id", zw.serialization_id())
        outs.append(buf.getvalue())
    assert outs[0] == outs[1]
    if crc:  # zipfile checks the CRC-32s
        zf = zipfile.ZipFile(io.BytesIO(outs[0]))
        assert zf.testzip() is None and zf.read("arch/data/9") == bytes(recs[9][1])


def test_eager_runs_read_the_bytes_of_each_record(tmp_path):
    sd = {f"t{i}": torch.arange(i % 50 + 1, dtype=torch.float32) + i for i in range(500)}
    sd["big"] = torch.ones(400_000)  # read on its own
    p = tmp_path / "m.pt"
    p.write_bytes(_saved(sd))
    eager = torchless.load(p, mmap=False)
    mapped = torchless.load(p, mmap=True)
    for k in reversed(list(sd)):  # out of file order
        assert bytes(eager[k].storage.bytes()) == bytes(mapped[k].storage.bytes()) == sd[k].numpy().tobytes()


def test_a_damaged_record_in_a_run_fails_alone(tmp_path):
    sd = {f"t{i}": torch.full((8,), float(i)) for i in range(40)}
    data = bytearray(_saved(sd))
    zr = ZipReader(bytes(data))
    victim = zr.get("data/17")
    data[victim.header_offset : victim.header_offset + 4] = b"PK\x09\x09"  # its local header signature
    p = tmp_path / "bad.pt"
    p.write_bytes(bytes(data))
    eager = torchless.load(p, mmap=False)
    assert eager["t3"].numpy().tolist() == [3.0] * 8  # the run around it still reads
    with pytest.raises(FormatError, match="local header") as e:
        eager["t17"].numpy()
    mapped = torchless.load(p, mmap=True)
    with pytest.raises(FormatError, match="local header") as e2:
        mapped["t17"].numpy()
    assert str(e.value) == str(e2.value)
    assert eager["t30"].numpy().tolist() == [30.0] * 8


def _directory_outcome(data: bytes, fast: bool, monkeypatch):
    monkeypatch.setattr(SETTINGS, "zip_directory", fast)
    try:
        zr = ZipReader(data)
    except TorchlessError as e:
        return ("error", type(e).__name__, e.offset, str(e))
    return ("ok", zr.prefix, list(zr.entries), sorted(zr.duplicates()))


def test_central_directory_runs_read_as_entry_by_entry(monkeypatch):
    """Runs of same-sized central-directory entries parsed as NumPy rows
    (``SETTINGS.zip_directory``) give the entries the loop gives, and the same
    error on byte flips of the directory (sizes, offsets, name lengths, signatures,
    disk numbers, flags, names)."""
    data = _saved({f"w{i}": torch.ones(1 + i % 3) for i in range(300)})
    fast = _directory_outcome(data, True, monkeypatch)
    assert fast == _directory_outcome(data, False, monkeypatch)
    assert fast[0] == "ok" and len(fast[2]) == 306
    zr = ZipReader(data)
    cd, end = zr.cd_offset, zr.cd_offset + zr.cd_size
    rng = random.Random(5)
    errors = 0
    for i in range(300):
        b = bytearray(data)
        for _ in range(rng.randint(1, 3)):
            pos = rng.randrange(cd, end)
            b[pos] = rng.choice([0, 0xFF, 0x20, b[pos] ^ 1, rng.randrange(256)])
        f = _directory_outcome(bytes(b), True, monkeypatch)
        assert f == _directory_outcome(bytes(b), False, monkeypatch), f"mutation {i}"
        errors += f[0] == "error"
    assert 20 < errors < 290  # both outcomes were exercised


@pytest.mark.parametrize("last", [0x00, 0x41, 0xC3])
def test_directory_runs_with_names_ending_in_a_zero_byte_or_upper_case(last, monkeypatch):
    """The rows of a run cut in one NumPy call (fixed-width bytes, which drop trailing
    zero bytes) and the lowercased names taken as the raw ones when nothing changes: a
    name in mid-run ending in a zero byte, an upper-case letter or a non-ASCII byte gives
    the entries, names and case-insensitive index the entry-by-entry loop gives."""
    data = bytearray(_saved({f"w{i}": torch.ones(2) for i in range(120)}))
    zr = ZipReader(bytes(data))
    e = zr.entries[60]  # a data record in mid-run (same name length as its neighbours)
    name_at = e.central_offset + 46
    data[name_at + len(e.raw_name) - 1] = last  # its name's last byte, in the directory only
    fast = _directory_outcome(bytes(data), True, monkeypatch)
    assert fast == _directory_outcome(bytes(data), False, monkeypatch)
    assert fast[0] == "ok" and fast[2][60].raw_name.endswith(bytes([last]))
    both = []
    for flag in (True, False):
        monkeypatch.setattr(SETTINGS, "zip_directory", flag)
        z = ZipReader(bytes(data))
        both.append((z._lowered_names(), sorted((k, v.index) for k, v in z._by_lower.items())))
    assert both[0] == both[1]
    assert bytes(data[name_at : name_at + len(e.raw_name)]).lower() in both[0][0]


def _archive_outcome(data: bytes, fast: bool, monkeypatch):
    """What the reader and the checkpoint checks make of an archive: the record names,
    the data index, the case-insensitive index, and ``_check_all_records``'s verdict
    (with ``fast``: the central directory's runs as columns and the checks on them)."""
    import torchless.formats.pt.read as ptread

    monkeypatch.setattr(SETTINGS, "zip_directory", fast)
    monkeypatch.setattr(SETTINGS, "pt_record_checks", fast)
    try:
        zr = ZipReader(data)
    except TorchlessError as e:
        return ("error", type(e).__name__, e.offset, str(e))
    idx = zr.data_index("data")
    index = sorted((k, e.index) for k, e in idx.items()) if isinstance(idx, dict) else "lookups"
    try:
        ptread._check_all_records(zr)
        checked: tuple = ("ok",)
    except TorchlessError as e:
        checked = ("error", type(e).__name__, e.offset, e.member, str(e))
    lowered = [(k, e.index) for k, e in zr._by_lower.items()]
    hit = zr.lookup("data/150")
    return ("ok", zr.records(), index, lowered, sorted(zr.duplicates()), checked, hit.index if hit else None)


def test_directory_columns_give_what_the_entries_give(monkeypatch):
    """The central directory's runs as columns (records, the data index, the lowercased
    names, ``_check_all_records`` on the columns) against the entry-by-entry code, on
    edits of single entries in mid-run (a name out of the folder, not UTF-8, non-ASCII,
    upper case, a duplicate, a directory name or attribute, sizes, method) and on random
    byte flips of the directory: the same names, indices and errors."""

    data = _saved({f"w{i}": torch.ones(1 + i % 3) for i in range(300)})
    monkeypatch.setattr(SETTINGS, "zip_directory", True)  # (whatever the suite runs on)
    zr = ZipReader(data)
    assert any(run is not None for _a, _b, run in zr.segments())  # the columns are there to compare
    fast = _archive_outcome(data, True, monkeypatch)
    assert fast == _archive_outcome(data, False, monkeypatch) and fast[5] == ("ok",)

    def entry_at(name):
        e = zr.get(name)
        return e.central_offset, e.central_offset + 46  # the entry, its name

    edits = []
    for victim in ("data/50", "data/150", "data/299"):
        c, nm = entry_at(victim)
        plen = len(zr.prefix) + 1
        edits += [
            [(nm, b"X")],  # out of the archive folder
            [(nm + plen + 2, b"\xff")],  # not UTF-8
            [(nm + plen + 1, b"\xc3\xa9")],  # UTF-8, not ASCII
            [(nm + plen, b"D")],  # upper case: out of data/ for the index, the same key lowercased
            [(nm + plen + 3, b"x")],  # data/x.. : not a storage
            [(nm + plen + len(victim) - 1, b"/")],  # a directory name holding data
            [(c + 38, b"\x10\x00\x00\x00")],  # the DOS directory attribute
            [(c + 38, b"\x20\x00\x00\x00")],  # another attribute: harmless
            [(c + 10, b"\x08\x00")],  # deflated
            [(c + 20, b"\x00\x00\x00\x00")],  # compressed size 0
            [(c + 24, b"\x01\x00\x00\x00")],  # sizes differ
            [(c + 24, b"\x01\x00\x00\x00"), (c + 12, b"\x01\x00")],  # sizes differ, a time: miniz lets it by
            [(c + 8, b"\x00\x20")],  # masked headers
        ]
    c1, n1 = entry_at("data/151")
    edits.append([(n1 + len(zr.prefix) + 1 + 7, b"0")])  # data/151 -> data/150: a duplicate name
    results = []
    for i, edit in enumerate(edits):
        b = bytearray(data)
        for pos, rep in edit:
            b[pos : pos + len(rep)] = rep
        f = _archive_outcome(bytes(b), True, monkeypatch)
        assert f == _archive_outcome(bytes(b), False, monkeypatch), f"edit {i}"
        results.append(f[0] == "ok" and f[5][0])
    assert results.count("error") >= 12 and results.count("ok") >= 6  # both verdicts were compared
    cd, end = zr.cd_offset, zr.cd_offset + zr.cd_size
    rng = random.Random(9)
    for i in range(200):
        b = bytearray(data)
        for _ in range(rng.randint(1, 3)):
            pos = rng.randrange(cd, end)
            b[pos] = rng.choice([0, 0xFF, 0x2F, 0x44, 0x10, b[pos] ^ 1, rng.randrange(256)])
        assert _archive_outcome(bytes(b), True, monkeypatch) == _archive_outcome(bytes(b), False, monkeypatch), f"flip {i}"


def test_entry_names_not_ascii_in_a_batched_run(monkeypatch):
    """Names taken as slices of the window's Latin-1 text are checked to be ASCII: a batched
    run with UTF-8 names (two-, three- and four-byte characters) gives the loop's names."""
    sd = {}
    for i in range(400):
        sd[f"blöcke.{i}.∑.🙂" if i % 97 == 5 else f"blocks.{i}.w"] = torch.ones(1 + i % 4)
    data = _saved(sd)
    pics = []
    for fast in (True, False):
        monkeypatch.setattr(SETTINGS, "tensor_calls", fast)
        zr = ZipReader(data)
        cp = read_zip_checkpoint(zr)
        pics.append(_picture(cp.obj))
        if fast:
            assert _fast_entries(zr) > 300
    assert pics[0] == pics[1] and "blöcke.5.∑.🙂" in repr(pics[0])


def test_entries_found_together_match_the_one_by_one_path_and_the_loop(monkeypatch):
    """The windowed tokeniser (``SETTINGS.scan_entries``: every candidate entry of a window
    tokenised at once, then chained) against the regex one-entry path and the opcode
    loop: the same outcome on uniform and mixed state dicts and on byte flips of them
    (memo indices, int widths, tuple opcodes, keys)."""
    uniform = {f"blocks.{i // 10}.p{i % 10}.weight": torch.ones(1 + (i * 37) % 400) for i in range(1500)}
    rng = random.Random(7)
    hits = 0
    for obj in (uniform, _state_dict(400, seed=4)):
        data = _pkl(_saved(obj))
        for i in range(60):
            b = bytearray(data)
            if i:
                for _ in range(rng.randint(1, 4)):
                    b[rng.randrange(len(b))] = rng.choice([0x71, 0x72, 0x68, 0x6A, 0x4B, 0x4D, 0x4A, 0x28, 0x85, 0x58, 0x30])
            outs = []
            for scan in (True, False):
                monkeypatch.setattr(SETTINGS, "scan_entries", scan)
                outs.append(_run_pickle(bytes(b), True, monkeypatch))
            slow = _run_pickle(bytes(b), False, monkeypatch)
            assert outs[0][:2] == outs[1][:2] == slow[:2], f"mutation {i}"
            monkeypatch.setattr(SETTINGS, "scan_entries", True)
            monkeypatch.setattr(SETTINGS, "tensor_calls", True)
            up = Unpickler(bytes(b), resolver=make_resolver(True), persistent_load=_pl)
            try:
                up.load()
            except TorchlessError:
                pass
            hits += up.info.scanned_entries
    assert hits > 30 * 1500  # the tokeniser ran most of the uniform dict's entries


@pytest.mark.parametrize("scratch", [None, 3000, 100_000])
def test_write_small_many_to_a_path_writes_what_write_small_writes(scratch, tmp_path, monkeypatch):
    """To a file of its own the records go through the reused scratch buffer: the same
    bytes with a buffer that fills many times, or that a record does not fit in."""
    import torchless.container.zip_write as zipmod

    if scratch is not None:
        monkeypatch.setattr(zipmod, "_SCRATCH", scratch)
    rng = np.random.default_rng(2)
    recs = [(f"data/{i}", memoryview(rng.bytes(int(rng.integers(0, 9000))))) for i in range(300)]
    outs = []
    for many in (True, False):
        path = tmp_path / f"{many}.pt"
        with TorchZipWriter(path, "arch") as zw:
            zw.write("data.pkl", b"x" * 37)
            if many:
                zw.write_small_many([n for n, _ in recs[:120]], [v for _, v in recs[:120]])
                zw.write("byteorder", b"little")  # a record through the write buffer between two runs
                zw.write_small_many([n for n, _ in recs[120:]], [v for _, v in recs[120:]])
            else:
                for name, body in recs[:120]:
                    zw.write_small(name, body)
                zw.write("byteorder", b"little")
                for name, body in recs[120:]:
                    zw.write_small(name, body)
            zw.write("version", b"3\n")
        outs.append(path.read_bytes())
    assert outs[0] == outs[1]
    zf = zipfile.ZipFile(io.BytesIO(outs[0]))
    assert zf.testzip() is None and zf.read("arch/data/250") == bytes(recs[250][1])


def test_entry_scan_window_without_entries_is_scanned_once(tmp_path, monkeypatch):
    """A legacy stream's entries (six-part persistent ids) are not the shape the entry scan
    recognises, and its pickle is followed by the storages in the same buffer: the scan of
    a window that holds no entry is remembered, not made again at every entry (a thousand
    8 MiB scans took 40 s for 3,000 tensors). The values are torch's."""
    import torchless.pickle.entryscan as entryscan

    monkeypatch.setattr(SETTINGS, "tensor_calls", True)  # (the scan is the fast path's, whatever the suite's setting)
    sd = {f"layer{i}.w": torch.full((2,), float(i)) for i in range(1500)}
    sd["big"] = torch.arange(1 << 19, dtype=torch.float32)
    p = tmp_path / "legacy.pt"
    torch.save(sd, str(p), _use_new_zipfile_serialization=False)
    calls = []
    real = entryscan.scan

    def counting(data, lo, hi):
        calls.append((lo, hi))
        return real(data, lo, hi)

    monkeypatch.setattr(entryscan, "scan", counting)
    got = torchless.load(str(p))
    assert list(got) == list(sd)
    for k, v in sd.items():
        assert got[k].numpy().tobytes() == v.numpy().tobytes(), k
    assert 1 <= len(calls) <= 2, len(calls)


# -- the batched entry runs: persistent_load_many, tensors built together, memo deferred ----

_MODES = {  # (SETTINGS.tensor_calls, .scan_entries, .batch_entries)
    "batch": (True, True, True),
    "scan": (True, True, False),
    "regex": (True, False, False),
    "loop": (False, True, True),
}


def _identities(obj) -> list[int]:
    """Which objects of a loaded tree are the same object: each container, tensor and
    storage (in walk order) numbered by its first appearance."""
    seen: dict[int, int] = {}
    out: list[int] = []
    keep = []  # hold what was numbered: ids stay unique

    def walk(x):
        out.append(seen.setdefault(id(x), len(seen)))
        keep.append(x)
        if isinstance(x, Tensor):
            walk(x.storage)
        elif isinstance(x, dict):
            for v in x.values():
                walk(v)
        elif isinstance(x, (list, tuple)):
            for v in x:
                walk(v)

    walk(obj)
    return out


def _rezip(data: bytes, pkl: bytes | None = None, drop: str | None = None, cut: str | None = None) -> bytes:
    """A torch archive with its data.pkl replaced, a record left out or cut short."""
    src = zipfile.ZipFile(io.BytesIO(data))
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zf:
        for info in src.infolist():
            body = src.read(info)
            if info.filename.endswith("/data.pkl") and pkl is not None:
                body = pkl
            if drop is not None and info.filename.endswith("/" + drop):
                continue
            if cut is not None and info.filename.endswith("/" + cut):
                body = body[:-4]
            zf.writestr(info.filename, body)
    return buf.getvalue()


def _read_mode(data: bytes, mode: str, monkeypatch, *, mm: bool = True, limits=None):
    """(outcome, globals seen) of read_zip_checkpoint with the entry paths of ``mode``:
    the tree's picture, which of its objects are the same, the storages in first-use order
    and every storage's bytes; or the error's type, offset and message."""
    calls, scan, batch = _MODES[mode]
    monkeypatch.setattr(SETTINGS, "tensor_calls", calls)
    monkeypatch.setattr(SETTINGS, "scan_entries", scan)
    monkeypatch.setattr(SETTINGS, "batch_entries", batch)
    r = make_resolver(True)
    kw = {} if limits is None else {"limits": limits}
    try:
        zr = ZipReader(data)
        cp = read_zip_checkpoint(zr, resolver=r, mmap=mm, **kw)
        sts = list(cp.storages.values())
        byts = []
        for st in sts:
            try:
                byts.append(bytes(st.bytes()))
            except TorchlessError as e:
                byts.append(("error", type(e).__name__, str(e)))
        out = ("ok", _picture(cp.obj), _identities(cp.obj), list(cp.storages), [_picture(s) for s in sts], byts)
    except TorchlessError as e:
        out = ("error", type(e).__name__, e.offset, str(e))
    return out, list(r.seen)


@pytest.fixture
def batched_rows(monkeypatch):
    """Counts the tensors the batched runs build (proof that the path ran)."""
    monkeypatch.setattr(SETTINGS, "tensor_calls", True)  # (batched runs are the fast path's, whatever the suite's setting)
    count = [0]
    orig = Tensor._make_many.__func__

    def counting(cls, storages, *rest):
        count[0] += len(storages)
        return orig(cls, storages, *rest)

    monkeypatch.setattr(Tensor, "_make_many", classmethod(counting))
    return count


def _uniform(n: int):
    return {f"blocks.{i // 10}.p{i % 10}.weight": torch.full((1 + (i * 37) % 40,), float(i)) for i in range(n)}


@pytest.mark.parametrize("mm", [True, False])
def test_batched_runs_read_what_the_other_paths_read(mm, monkeypatch, batched_rows):
    """Whole archives through read_zip_checkpoint: a uniform dict, a mixed one (views,
    shared storages, Parameters, 0-d), torch's ``state_dict()`` with ``_metadata``, a tensor
    stored twice (tied weights: a memo read of a deferred tensor): the same tree, the same
    identities, storages and bytes, eager and mapped, on every path."""
    tied = _uniform(300)
    tied["tied"] = tied["blocks.3.p4.weight"]
    objs = [
        _uniform(1200),
        _state_dict(500, seed=9),
        torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(150)]).state_dict(),
        tied,
    ]
    for obj in objs:
        data = _saved(obj)
        outs = [_read_mode(data, m, monkeypatch, mm=mm) for m in _MODES]
        assert outs[0][0][0] == "ok"
        assert all(o == outs[0] for o in outs[1:])
    assert batched_rows[0] > 1500


def test_batched_runs_on_byte_flips_fail_or_read_the_same(monkeypatch, batched_rows):
    """Byte flips of the data.pkl of an archive (memo indices, int widths, tuple opcodes,
    keys, storage key digits): every path gives the same outcome, or the same error."""
    data = _saved({**_uniform(700), **_state_dict(90, seed=2)})
    pkl = _pkl(data)
    rng = random.Random(31)
    errors = 0
    for i in range(70):
        b = bytearray(pkl)
        for _ in range(rng.randint(1, 4)):
            b[rng.randrange(len(b))] = rng.choice([0x71, 0x72, 0x68, 0x6A, 0x4B, 0x4D, 0x4A, 0x28, 0x85, 0x58, 0x30, 0x39, 0xFF])
        z = _rezip(data, bytes(b))
        outs = [_read_mode(z, m, monkeypatch, mm=bool(i % 2)) for m in ("batch", "scan", "loop")]
        assert outs[0] == outs[1] == outs[2], f"mutation {i}"
        errors += outs[0][0][0] == "error"
    assert 3 < errors < 67 and batched_rows[0] > 20_000


@pytest.mark.parametrize("change", ["drop", "cut"])
def test_batched_runs_leave_a_bad_storage_record_to_persistent_load(change, monkeypatch, batched_rows):
    """A storage record missing or smaller than its tensor's storage, in the middle of a
    run: the same error (persistent_load's, at its BINPERSID) on every path."""
    data = _saved(_uniform(400))
    z = _rezip(data, **{change: "data/217"})
    outs = [_read_mode(z, m, monkeypatch) for m in _MODES]
    assert outs[0][0][0] == "error" and all(o == outs[0] for o in outs[1:])
    assert batched_rows[0] >= 216  # every entry before it (the first one is the loop's)


def test_a_damaged_record_in_a_batched_eager_run_fails_alone(tmp_path, batched_rows):
    sd = _uniform(400)
    data = bytearray(_saved(sd))
    victim = ZipReader(bytes(data)).get("data/217")
    data[victim.header_offset : victim.header_offset + 4] = b"PK\x09\x09"
    p = tmp_path / "bad.pt"
    p.write_bytes(bytes(data))
    eager = torchless.load(p, mmap=False)
    names = list(sd)
    assert eager[names[216]].numpy().tolist() == sd[names[216]].tolist()  # its run is read, the others held
    with pytest.raises(FormatError, match="local header") as e:
        eager[names[217]].numpy()
    with pytest.raises(FormatError, match="local header") as e2:
        torchless.load(p, mmap=True)[names[217]].numpy()
    assert str(e.value) == str(e2.value)
    assert all(eager[k].numpy().tolist() == sd[k].tolist() for k in names if k != names[217])
    assert batched_rows[0] == 2 * 399  # both loads (the first entry is the loop's)


def _puts(pkl: bytes) -> list[int]:
    """The memo keys the pickle stores, in order."""
    import pickletools

    return [arg for op, arg, _pos in pickletools.genops(pkl) if op.name in ("BINPUT", "LONG_BINPUT")]


def _spliced(pkl: bytes, tail: bytes) -> bytes:
    """``tail`` (key/value opcodes) added to the last SETITEMS batch of a dict pickle."""
    assert pkl.endswith(b"u.")
    return pkl[:-2] + tail + b"u."


def _s(text: str) -> bytes:
    return b"X" + len(text).to_bytes(4, "little") + text.encode()


def _get(k: int) -> bytes:
    return b"j" + k.to_bytes(4, "little")


def test_deferred_memo_values_read_back_after_the_run(monkeypatch, batched_rows):
    """Memo reads, after a batched run, of each kind of value its entries stored (name,
    storage key, pid, size, stride, OrderedDict, args, tensor), a store over a deferred
    key read before and after the others are made, and a MEMOIZE (whose key is the memo's
    length): the same values and the same identities as the opcode loop."""
    data = _saved(_uniform(600))
    pkl = _pkl(data)
    puts = _puts(pkl)
    assert len(set(puts)) == len(puts) > 4000
    mid = puts.index(max(puts)) - 8 * 300  # the stores of an entry in the middle of the run
    tails = [b"".join(_s(f"read{j}") + _get(puts[mid + j]) for j in range(8))]
    k1, k2 = puts[mid + 2], puts[mid + 11]
    tails.append(_s("a") + b"K\x05r" + k1.to_bytes(4, "little") + _s("b") + _get(k1) + _s("c") + _get(k2) + _s("d") + _get(k1))
    tails.append(_s("m") + _s("memoized") + b"\x94" + _s("n") + _get(len(puts)))
    tails.append(_s("x") + _get(max(puts) + 5))  # never stored: the loop's error
    for tail in tails:
        z = _rezip(data, _spliced(pkl, tail))
        outs = [_read_mode(z, m, monkeypatch) for m in _MODES]
        assert all(o == outs[0] for o in outs[1:]), tail
        assert outs[0][0][0] == ("error" if tail is tails[-1] else "ok")
    assert batched_rows[0] == 4 * 599


def test_memo_limit_counts_the_deferred_stores(monkeypatch, batched_rows):
    """max_memo reached by stores after a batched run (or inside it): the same error, at
    the same offset, as the loop's."""
    from torchless.pickle.machine import Limits

    data = _saved(_uniform(600))
    pkl = _pkl(data)
    n = len(_puts(pkl))
    tail = b"".join(_s(f"k{j}") + b"K\x01r" + (n + 10 + j).to_bytes(4, "little") for j in range(6))
    z = _rezip(data, _spliced(pkl, tail))
    for limit in (n + 3, n, n - 1000, n + 6):
        outs = [_read_mode(z, m, monkeypatch, limits=Limits(max_memo=limit)) for m in _MODES]
        assert all(o == outs[0] for o in outs[1:]), limit
        assert outs[0][0][0] == ("ok" if limit == n + 6 else "error")
    assert batched_rows[0] > 0


@pytest.mark.parametrize("chunk", [2048, 1 << 20])
def test_eager_runs_of_records_out_of_file_order(chunk, monkeypatch, tmp_path):
    """Records stored in another order than the pickle uses them (the batch reader sorts
    them), runs cut by a small CHUNK and by gaps (records nobody asked for between them):
    every storage has its record's bytes, read in any order."""
    from torchless.container.zip import BatchReader

    monkeypatch.setattr(BatchReader, "CHUNK", chunk)
    sd = {f"t{i}": torch.arange(1 + (i * 13) % 90, dtype=torch.float32) + i for i in range(300)}
    data = _saved(sd)
    src = zipfile.ZipFile(io.BytesIO(data))
    infos = src.infolist()
    rng = random.Random(4)
    recs = [x for x in infos if "/data/" in x.filename]
    rng.shuffle(recs)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zf:
        for j, info in enumerate([x for x in infos if "/data/" not in x.filename] + recs):
            zf.writestr(info.filename, src.read(info))
            if j % 7 == 0:
                zf.writestr(f"{info.filename.split('/')[0]}/extra/{j}", b"z" * rng.randrange(1, 300))  # a gap
    p = tmp_path / "shuffled.pt"
    p.write_bytes(buf.getvalue())
    eager = torchless.load(p, mmap=False)
    names = list(sd)
    rng.shuffle(names)
    for k in names:
        assert bytes(eager[k].storage.bytes()) == sd[k].numpy().tobytes(), k


def test_eager_read_of_large_records_only(tmp_path):
    """No record small enough for a run (the batch reader has nothing to sort): each
    storage is read on its own."""
    sd = {"a": torch.arange(300_000, dtype=torch.float32), "b": torch.ones(290_000)}
    p = tmp_path / "big.pt"
    p.write_bytes(_saved(sd))
    eager = torchless.load(p, mmap=False)
    assert all(bytes(eager[k].storage.bytes()) == sd[k].numpy().tobytes() for k in sd)


@pytest.mark.parametrize("chunk", [4096, 32 << 20])
def test_read_ahead_gives_the_runs_their_bytes(chunk, tmp_path, monkeypatch):
    """An eager load reads its small records ahead, on a helper thread, while the pickle
    is parsed: the same bytes as the mapped load and torch, and no run read again on
    this thread (with many runs or one)."""
    from torchless.container.zip import BatchReader
    from torchless.io.source import MmapSource

    monkeypatch.setattr(BatchReader, "CHUNK", chunk)
    g = torch.Generator().manual_seed(3)
    sd = {f"t{i}": torch.randn(int(torch.randint(1, 700, (1,), generator=g)), generator=g) for i in range(600)}
    sd["big"] = torch.ones(300_000)  # read on its own, not ahead
    sd["empty"] = torch.zeros(0)
    p = tmp_path / "m.pt"
    p.write_bytes(_saved(sd))
    copies = []
    real_copy = MmapSource.copy

    def counting_copy(self, offset, length, **kw):
        copies.append(length)
        return real_copy(self, offset, length, **kw)

    monkeypatch.setattr(MmapSource, "copy", counting_copy)
    eager = torchless.load(p, mmap=False)
    for k in reversed(list(sd)):  # out of file order
        assert eager[k].numpy().tobytes() == sd[k].numpy().tobytes(), k
    assert copies == [sd["big"].numel() * 4], copies  # only the large record, on its own


def test_without_read_ahead_the_same_bytes_and_errors(tmp_path, monkeypatch):
    """The same loads with read-ahead switched off: equal bytes, and a record whose
    local header is damaged fails alone, with the same error either way."""
    from torchless.container.zip import BatchReader

    sd = {f"t{i}": torch.full((300,), float(i)) for i in range(60)}
    p = tmp_path / "m.pt"
    data = bytearray(_saved(sd))
    z = zipfile.ZipFile(io.BytesIO(bytes(data)))
    victim = next(i for i in z.infolist() if i.filename.endswith("/data/30"))
    data[victim.header_offset] ^= 0xFF  # its local header signature
    p.write_bytes(bytes(data))

    def outcome():
        sd2 = torchless.load(p, mmap=False)
        got = {}
        for k in sd:
            try:
                got[k] = sd2[k].numpy().tobytes()
            except TorchlessError as e:
                got[k] = (type(e).__name__, e.message, e.offset)
        return got

    ahead = outcome()
    monkeypatch.setattr(BatchReader, "read_ahead", lambda self, entries: None)
    plain = outcome()
    assert ahead == plain
    assert isinstance(ahead["t30"], tuple) and ahead["t29"] == sd["t29"].numpy().tobytes()


def test_closing_while_reading_ahead_reads_the_right_file(tmp_path):
    """The read-ahead thread reads from a descriptor of its own: closing the archive
    and opening other files at once (the closed descriptor's number reused) takes
    nothing from under it."""
    sd = {f"t{i}": torch.full((2000,), float(i)) for i in range(400)}
    p = tmp_path / "m.pt"
    p.write_bytes(_saved(sd))
    other = tmp_path / "other.bin"
    other.write_bytes(b"\x55" * 5_000_000)
    for _ in range(5):
        with torchless.open(p, mmap=False) as art:
            ck = dict(art.tensors())
        held = [open(other, "rb") for _ in range(4)]  # take the freed descriptor numbers
        try:
            for k, v in sd.items():
                try:
                    assert ck[k].numpy().tobytes() == v.numpy().tobytes(), k
                except TorchlessError as e:  # (closed before its bytes were read: refused, never wrong)
                    assert "closed" in e.message
        finally:
            for f in held:
                f.close()


def test_an_eager_load_of_colliding_record_names_reads_as_the_mapped_one(tmp_path):
    """Two records named alike (each found by torch's lookup, no read-ahead): the eager
    load gives what the mapped load gives, values or the same error."""
    sd = {"a": torch.full((64,), 1.0), "b": torch.full((64,), 2.0), "c": torch.full((64,), 3.0)}
    data = bytearray(_saved(sd))
    z = zipfile.ZipFile(io.BytesIO(bytes(data)))
    names = [i.filename for i in z.infolist()]
    src = next(n for n in names if n.endswith("/data/2")).encode()
    dst = src[:-1] + b"1"
    assert data.count(src) == 2  # its local header and its central entry
    data[:] = data.replace(src, dst)
    p = tmp_path / "dup.pt"
    p.write_bytes(bytes(data))

    def outcome(mmap):
        try:
            got = torchless.load(p, mmap=mmap)
            return {k: got[k].numpy().tobytes() for k in got}
        except TorchlessError as e:
            return (type(e).__name__, e.message)

    assert outcome(False) == outcome(True)


def test_read_ahead_of_overlapping_records_reads_no_more_than_the_file(tmp_path, monkeypatch):
    """A hostile central directory naming one 1 MiB record many times (each name a
    storage record the pickle never asks for): nothing is read ahead once per name (it
    was, 200 MiB for this file of about 1 MiB), and the load gives what it gives without
    read-ahead."""
    from torchless.io.source import MmapSource

    raw = _saved({"w": torch.arange(262144, dtype=torch.float32)})
    eocd = raw.rfind(b"PK\x05\x06")
    cd_size, cd_off = struct.unpack_from("<II", raw, eocd + 12)
    cd, pos, out = raw[cd_off : cd_off + cd_size], 0, []
    while pos < len(cd):
        nlen, elen, clen = struct.unpack_from("<HHH", cd, pos + 28)
        rec, name = cd[pos : pos + 46 + nlen + elen + clen], cd[pos + 46 : pos + 46 + nlen]
        out.append(rec)
        if name.endswith(b"/data/0"):  # the same record under 200 more names
            for k in range(1, 201):
                nm = name[:-1] + str(k).encode()
                r = bytearray(rec[:46]) + nm + rec[46 + nlen :]
                struct.pack_into("<H", r, 28, len(nm))
                out.append(bytes(r))
        pos += len(rec)
    newcd = b"".join(out)
    tail = bytearray(raw[eocd : eocd + 22])
    struct.pack_into("<HHII", tail, 8, len(out), len(out), len(newcd), cd_off)
    p = tmp_path / "overlap.pt"
    p.write_bytes(raw[:cd_off] + newcd + bytes(tail))
    asked = []
    real = MmapSource.read_ahead

    def counting(self, spans):
        asked.extend(n for _, n in spans)
        return real(self, spans)

    monkeypatch.setattr(MmapSource, "read_ahead", counting)
    got = torchless.load(p, mmap=False)["w"].numpy()
    assert sum(asked) <= 2 * p.stat().st_size, sum(asked)
    assert got.tobytes() == torch.load(p, mmap=False)["w"].numpy().tobytes()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_a_child_forked_while_reading_ahead_reads_its_tensors(tmp_path, monkeypatch):
    """A process forked after an eager load, while the helper thread is still reading
    ahead (held here): the child has no such thread, and reads its tensors itself (it
    waited forever on the parent's unfinished read)."""
    import signal
    import threading

    from torchless.io import source as source_mod

    sd = {f"t{i}": torch.full((3000,), float(i)) for i in range(50)}
    p = tmp_path / "m.pt"
    p.write_bytes(_saved(sd))
    gate = threading.Event()
    real = source_mod._pread_new

    def held(*args):
        if threading.current_thread().name.startswith("torchless-read"):
            gate.wait(30)
        return real(*args)

    monkeypatch.setattr(source_mod, "_pread_new", held)
    ck = torchless.load(p, mmap=False)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        signal.alarm(10)
        ok = ck["t49"].numpy().tobytes() == sd["t49"].numpy().tobytes()
        os._exit(0 if ok else 1)
    try:
        _, status = os.waitpid(pid, 0)
    finally:
        gate.set()
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
    assert ck["t0"].numpy().tobytes() == sd["t0"].numpy().tobytes()


def test_closing_while_copying_a_record_never_reads_another_file(tmp_path, monkeypatch):
    """A large record read by copy() on one thread while another closes the archive and
    opens other files (the freed descriptor number reused): the right bytes or a
    'closed' error, never the other file's bytes (it read 0x55... from it)."""
    import threading
    import time

    from torchless.io import source as source_mod

    p = tmp_path / "m.pt"
    p.write_bytes(_saved({"big": torch.ones(1 << 20)}))  # 4 MiB: copied on its own
    other = tmp_path / "other.bin"
    other.write_bytes(b"\x55" * (8 << 20))
    art = torchless.open(p, mmap=False)
    ck = dict(art.tensors())
    gate = threading.Event()
    real = os.preadv

    def held(fd, bufs, off):
        if threading.current_thread().name == "copier":
            gate.wait(10)  # (the window between taking the descriptor and reading, widened)
        return real(fd, bufs, off)

    monkeypatch.setattr(source_mod.os, "preadv", held)
    got: list = []

    def copier():
        try:
            got.append(ck["big"].numpy().tobytes())
        except TorchlessError as e:
            got.append(e.message)

    t = threading.Thread(target=copier, name="copier")
    t.start()
    time.sleep(0.2)
    art.close()
    files = [open(other, "rb") for _ in range(4)]  # take the freed descriptor numbers
    try:
        gate.set()
        t.join(20)
    finally:
        for f in files:
            f.close()
    assert got and (got[0] == torch.ones(1 << 20).numpy().tobytes() or "closed" in got[0]), got[0][:16]


def test_an_eager_load_in_an_atexit_hook(tmp_path):
    """load(mmap=False) from an atexit hook, when no new thread may start: the records
    are read without read-ahead (it failed with RuntimeError: can't register atexit)."""
    import subprocess
    import sys

    sd = {f"t{i}": torch.full((100,), float(i)) for i in range(30)}
    p = tmp_path / "m.pt"
    p.write_bytes(_saved(sd))
    script = (
        "import atexit, torchless\n"
        "def hook():\n"
        f"    ck = torchless.load({str(p)!r}, mmap=False)\n"
        "    print('loaded', sum(float(ck[k].numpy()[0]) for k in ck))\n"
        "atexit.register(hook)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert r.stdout.strip() == f"loaded {float(sum(range(30)))}", r.stderr[-2000:]


@pytest.mark.parametrize("read", ["all", "one", "none"])
@pytest.mark.parametrize("ahead", [True, False])
def test_a_dropped_eager_load_is_freed_without_a_gc_pass(ahead, read, tmp_path, monkeypatch):
    """The storages of an eager load referenced their batch reader (through the loader),
    which referenced them all: a dropped load was a cycle, freed only by a full GC pass,
    so repeated loads in one process each held their bytes until then (four loads of
    20,000 tensors: 0.8 GB and 4x the time of one). A storage that holds its bytes drops
    its loader, and the reader refers to the storages weakly: nothing of a dropped load
    is left for the collector, whether its tensors were read or not."""
    from tl_testutil import left_for_the_collector

    monkeypatch.setattr(SETTINGS, "pt_read_ahead", ahead)
    p = tmp_path / "m.pt"
    p.write_bytes(_saved({f"t{i}": torch.full((100 + i,), float(i)) for i in range(60)}))

    def load_and_drop() -> None:
        sd = torchless.load(str(p), mmap=False)
        if read == "all":
            assert [float(sd[f"t{i}"].numpy()[-1]) for i in range(60)] == [float(i) for i in range(60)]
            assert all(sd[k].storage.loaded for k in sd)
        elif read == "one":
            assert float(sd["t7"].numpy()[-1]) == 7.0

    assert left_for_the_collector(load_and_drop, Storage) == []


@pytest.mark.parametrize("ahead", [True, False])
def test_a_tensor_kept_from_an_eager_load_keeps_only_its_own_run(ahead, tmp_path, monkeypatch):
    """One tensor kept from an eager load keeps its storage and the run of records read
    with it (at most BatchReader.CHUNK bytes), not every storage of the load: the batch
    reader held them all while any storage's loader held the reader."""
    import gc

    from torchless.container.zip import BatchReader

    monkeypatch.setattr(SETTINGS, "pt_read_ahead", ahead)
    monkeypatch.setattr(BatchReader, "CHUNK", 16 << 10)  # many runs of a few records
    p = tmp_path / "m.pt"
    p.write_bytes(_saved({f"t{i}": torch.full((500,), float(i)) for i in range(80)}))
    was = gc.isenabled()
    gc.disable()  # freed by reference counts alone, or not at all
    try:
        sd = torchless.load(str(p), mmap=False)
        assert all(float(sd[k].numpy()[0]) == float(k[1:]) for k in sd)
        ids = {id(sd[k].storage): k for k in sd}
        kept = sd["t40"]
        del sd
        alive = sorted(ids[id(o)] for o in gc.get_objects() if type(o) is Storage and id(o) in ids)
        assert alive == ["t40"]
        assert kept.numpy().tolist() == [40.0] * 500
    finally:
        if was:
            gc.enable()
