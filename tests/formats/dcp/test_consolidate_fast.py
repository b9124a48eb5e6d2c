"""DCP consolidation's shortcuts against the longer way round: the CRC-32 of a storage
record taken from the source item's zip directory (same bytes as computed, and a flipped
payload byte in the item gives an output that ``verify`` reports), and the facts of an
item's one-tensor pickle taken from another shape's of the same frame (same outcome as
building the tensor, a tensor past its storage refused alike)."""

from __future__ import annotations

import os
import shutil
import warnings

import pytest

import torchless
import torchless.formats.dcp.reader as dcpreader
import torchless.formats.dcp.spans as dcpspans
from torchless.cli.main import main as cli
from torchless.core.errors import TorchlessError
from torchless.core.settings import SETTINGS
from torchless.formats.dcp.consolidate import consolidate
from torchless.formats.dcp.reader import DCPReader
from torchless.pickle import fastpath

torch = pytest.importorskip("torch", reason="torch writes the checkpoints and reads the output (the oracle)")
dcp = pytest.importorskip("torch.distributed.checkpoint", reason="torch.distributed.checkpoint is missing")


@pytest.fixture(autouse=True)
def _fast(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fast paths on, the array checks of the items on every call (as for a large
    checkpoint; TORCHLESS_GENERAL_PATHS=1 would turn them off for the suite)."""
    monkeypatch.setattr(SETTINGS, "dcp_metadata", True)
    monkeypatch.setattr(SETTINGS, "dcp_items", True)
    monkeypatch.setattr(DCPReader, "batch_min", 0)
    monkeypatch.setattr(SETTINGS, "pt_pickle", True)


@pytest.fixture(scope="module")
def state() -> dict:
    g = torch.Generator().manual_seed(3)
    sd = {f"w.{i}": torch.randn(1 + i % 4, 3 + i % 7 * 150, generator=g) for i in range(24)}  # records small and large
    sd.update({f"h.{i}": torch.randn(2 + i % 3, generator=g).half() for i in range(5)})
    sd["i64"] = torch.arange(9)
    return sd


@pytest.fixture()
def saved(state, tmp_path) -> str:
    d = str(tmp_path / "ck")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(state, checkpoint_id=d, no_dist=True)
    return d


def _computed_crcs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every record's CRC-32 computed from the bytes (none taken from the items)."""
    plain = DCPReader._direct_spans
    monkeypatch.setattr(
        DCPReader, "_direct_spans", lambda self, items: [None if s is None else (*s[:4], None) for s in plain(self, items)]
    )


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def test_directory_crcs_write_the_computed_bytes(saved, state, tmp_path, monkeypatch):
    spans = []
    plain_crcs = dcpspans.crc32_spans
    monkeypatch.setattr(dcpspans, "crc32_spans", lambda buf, o, n: spans.extend(n) or plain_crcs(buf, o, n))
    os.makedirs(tmp_path / "fast")
    os.makedirs(tmp_path / "computed")
    fast = str(tmp_path / "fast" / "out.pt")  # (one name: the archive's folder is the file's stem)
    consolidate(saved, fast)
    assert spans == []  # every record's CRC-32 came from its item's directory
    _computed_crcs(monkeypatch)
    computed = str(tmp_path / "computed" / "out.pt")
    consolidate(saved, computed)
    assert len(spans) == len(state)
    assert _read(fast) == _read(computed)
    got = torch.load(fast, weights_only=True)
    assert list(got) == list(state)
    for k, v in state.items():
        assert torch.equal(got[k], v), k
    assert torchless.open(fast).verify() == []


def test_flipped_item_payload_byte_fails_verify_of_the_output(saved, tmp_path, monkeypatch):
    r = DCPReader(saved)
    ref = r.chunks("w.5")[0]
    r.locate(ref)
    path = os.path.join(saved, ref.info.relative_path)
    r.close()
    with open(path, "r+b") as f:
        f.seek(ref.data_offset + 7)
        b = f.read(1)
        f.seek(ref.data_offset + 7)
        f.write(bytes([b[0] ^ 0x10]))
    out = str(tmp_path / "out.pt")
    consolidate(saved, out)
    probs = torchless.open(out).verify()
    assert [p.code for p in probs] == ["crc"], probs
    assert cli(["verify", out]) == 1
    # the CRC-32 computed from the bytes would bless the flipped byte
    _computed_crcs(monkeypatch)
    os.makedirs(tmp_path / "blessed")
    blessed = str(tmp_path / "blessed" / "out.pt")
    consolidate(saved, blessed)
    assert torchless.open(blessed).verify() == []
    assert _read(blessed) != _read(out)


def _facts(reader: DCPReader) -> list[tuple]:
    refs = [r for n in reader.tensor_names() for r in reader.chunks(n)]
    reader.locate_many(refs)
    return [(r.fqn, r.data_offset, r.stride, r.storage_nbytes, r.byteorder) for r in refs]


def test_item_facts_from_frames_equal_built_tensors(saved, monkeypatch):
    built = []
    plain = dcpreader.fast_tensor
    monkeypatch.setattr(dcpreader, "fast_tensor", lambda *a: built.append(1) or plain(*a))
    fast = DCPReader(saved)
    got = _facts(fast)
    fast.close()
    assert len(built) == 3  # one tensor built per frame (f32 2-d, f16 1-d, i64 1-d)
    general = DCPReader(saved)
    general.general_only = True
    try:
        assert got == _facts(general)
    finally:
        general.close()


def _pickle_at(reader: DCPReader, fqn: str) -> tuple[str, int, bytes]:
    """(file, offset, bytes) of the one-tensor pickle of ``fqn``'s item."""
    from torchless.container.zip import ZipReader

    ref = reader.chunks(fqn)[0]
    zr = ZipReader(reader._item_source(ref.info, "item"))
    e = next(e for e in zr.entries if e.name.endswith("/data.pkl"))
    at = zr.data_offset(e)
    return os.path.join(reader.path, ref.info.relative_path), ref.info.offset + at, bytes(zr.read(e))


def test_frame_refuses_a_tensor_past_its_storage(saved, tmp_path):
    """An item whose strides reach past its storage, after items of its frame: refused
    with the error building the tensor gives."""
    d = str(tmp_path / "broken")
    shutil.copytree(saved, d)
    r = DCPReader(d)
    path, at, pk = _pickle_at(r, "w.22")  # (3, 153): its frame was seen on w.0 .. w.21
    r.close()
    m = fastpath._TENSOR_RE.match(pk)
    assert m is not None
    s = m.start("stride")
    assert pk[s : s + 4] == b"K\x99K\x01"  # stride (153, 1)
    with open(path, "r+b") as f:
        f.seek(at + s + 1)
        f.write(b"\x9a")  # (154, 1): the last row reaches one element past the storage
    want = None
    general = DCPReader(d)
    general.general_only = True
    try:
        with pytest.raises(TorchlessError) as e:
            general.locate(general.chunks("w.22")[0])
        want = (type(e.value), str(e.value))
    finally:
        general.close()
    assert "past the end of its storage" in want[1]
    fast = DCPReader(d)
    try:
        with pytest.raises(TorchlessError) as e:
            _facts(fast)
        assert (type(e.value), str(e.value)) == want
    finally:
        fast.close()


def test_records_by_writev_and_a_full_disk(saved, tmp_path, monkeypatch):
    """The records go to the output by ``writev`` through the atomic file's guard, on
    its helper thread (written behind, while the next batch is located): a full disk in
    the middle is a WriteError naming the output, and nothing is left."""
    import threading

    import torchless.io.atomic as atomic
    from torchless.core.errors import WriteError

    if not hasattr(os, "writev"):
        pytest.skip("no os.writev here")
    calls = []
    plain = atomic._Guarded._writev

    def counting(self, bufs):
        calls.append((len(bufs), threading.current_thread().name))
        return plain(self, bufs)

    monkeypatch.setattr(atomic._Guarded, "_writev", counting)
    os.makedirs(tmp_path / "ok")
    consolidate(saved, str(tmp_path / "ok" / "out.pt"))
    assert sum(n for n, _ in calls) >= 2 * 24  # a header and the bytes (and a descriptor) of each record
    assert all(name.startswith("torchless-write") for _, name in calls), calls
    size = os.path.getsize(tmp_path / "ok" / "out.pt")
    monkeypatch.setattr(atomic, "_fault_written", 0)
    monkeypatch.setenv(atomic.FAULT_ENV, f"{size // 2}:ENOSPC")
    os.makedirs(tmp_path / "full")
    out = str(tmp_path / "full" / "out.pt")
    with pytest.raises(WriteError) as e:
        consolidate(saved, out)
    assert out in str(e.value)
    assert os.listdir(tmp_path / "full") == []


def test_consolidate_in_an_atexit_hook(saved, tmp_path):
    """A consolidation from an atexit hook, when no new thread may start: the records
    are written on the calling thread (it failed with RuntimeError: can't register
    atexit), the same bytes as a consolidation in the ordinary way."""
    import subprocess
    import sys

    out, ref = str(tmp_path / "a" / "out.pt"), str(tmp_path / "b" / "out.pt")
    os.makedirs(os.path.dirname(out))
    os.makedirs(os.path.dirname(ref))
    consolidate(saved, ref)
    script = (
        "import atexit\n"
        "from torchless.core.settings import SETTINGS\n"
        "from torchless.formats.dcp.consolidate import consolidate\n"
        "from torchless.formats.dcp.reader import DCPReader\n"
        "SETTINGS.dcp_metadata = True\n"
        "SETTINGS.dcp_items = True\n"
        "DCPReader.batch_min = 0\n"
        f"atexit.register(consolidate, {saved!r}, {out!r})\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert os.path.exists(out), r.stderr[-2000:]
    assert _read(out) == _read(ref)


def test_batches_located_just_before_written(saved, state, tmp_path, monkeypatch):
    """Each batch of storages is located just before its records are written: no item's
    pages are dropped between its checks and the write (they would be faulted in again),
    every record is written from the map, and the file is the one that locating
    everything first (the general order) gives."""
    import torchless.formats.pt.write as ptw

    monkeypatch.setattr(dcpreader, "_RELEASE_BATCH", 1)  # every release dropped at once
    monkeypatch.setattr(ptw, "_BLOCK_BATCH", 8)  # several batches
    dropped: list[tuple[int, int]] = []
    plain_drop, plain_view = DCPReader._drop, DCPReader._view_spans
    viewed: list[int] = []
    early: list[tuple[int, int]] = []

    def drop(self, rel, start, end):
        dropped.append((start, end))
        return plain_drop(self, rel, start, end)

    def view(self, spans, sizes, crcs=None):
        for sp in spans:
            if sp is not None:
                early.extend((a, b) for a, b in dropped if a < sp[3] and sp[2] < b)
        out = plain_view(self, spans, sizes, crcs)
        viewed.extend(v is not None for v in out)
        return out

    monkeypatch.setattr(DCPReader, "_drop", drop)
    monkeypatch.setattr(DCPReader, "_view_spans", view)
    os.makedirs(tmp_path / "a")
    os.makedirs(tmp_path / "b")
    out = str(tmp_path / "a" / "out.pt")
    consolidate(saved, out)
    assert early == []  # no item dropped before its record was written
    assert len(viewed) == len(state) and all(viewed)  # every record from the map
    assert dropped  # (the pages are dropped, after the write)
    # everything located first (as before this step), then written: the same bytes
    reader = DCPReader(saved)
    reader.locate_many([r for n in reader.tensor_names() for r in reader.chunks(n)])
    other = str(tmp_path / "b" / "out.pt")
    consolidate(reader, other)
    reader.close()
    assert _read(out) == _read(other)
    got = torch.load(out, weights_only=True)
    for k, v in state.items():
        assert torch.equal(got[k], v), k
