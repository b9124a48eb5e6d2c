"""verify checks the CRC-32 of every record of every DCP item (each item is a small
``torch.save`` archive): a flipped payload byte, which torch's DCP loader does not notice,
is reported, for tensor chunks and bytes items alike."""

from __future__ import annotations

import io
import os
import struct
import warnings
import zipfile

import pytest

import torchless
from torchless.cli.main import main as cli
from torchless.formats.dcp.reader import DCPReader

torch = pytest.importorskip("torch", reason="torch writes the checkpoints (the oracle)")
dcp = pytest.importorskip("torch.distributed.checkpoint", reason="torch.distributed.checkpoint is missing")


@pytest.fixture()
def saved(tmp_path):
    g = torch.Generator().manual_seed(0)
    sd = {"w": torch.randn(64, 8, generator=g), "b": torch.randn(8, generator=g), "extra": {"step": 7, "name": "run"}}
    d = str(tmp_path / "ck")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(sd, checkpoint_id=d, no_dist=True)
    return d


def _flip(path: str, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x10]))


def test_clean_checkpoint_verifies(saved):
    assert torchless.open(saved).verify() == []
    assert cli(["verify", saved]) == 0


def test_flipped_tensor_payload_byte_is_a_crc_error(saved):
    r = DCPReader(saved)
    ref = r.chunks("w")[0]
    r.locate(ref)
    path = os.path.join(saved, ref.info.relative_path)
    r.close()
    _flip(path, ref.data_offset + 100)
    probs = torchless.open(saved).verify()
    assert [(p.code, p.member) for p in probs] == [("crc", "w")], probs
    assert "stored" in probs[0].message and ref.info.relative_path in probs[0].message
    assert cli(["verify", saved]) == 1


def test_flipped_bytes_item_is_reported(saved):
    r = DCPReader(saved)
    names = r.bytes_names()
    assert names, "torch wrote no bytes item"
    info = r.bytes_info(names[0])
    path = os.path.join(saved, info.relative_path)
    r.close()
    _flip(path, info.offset + 40)  # inside the item's first record (its pickle)
    probs = torchless.open(saved).verify()
    assert probs and all(p.member == names[0] for p in probs), probs
    assert cli(["verify", saved]) == 1


def test_zip_error_inside_an_item_names_its_file_item_record_and_offset(saved, capsys):
    """A chunk item whose central directory marks its payload record as encrypted
    (locating the chunk refuses it, as a .pt read of the record does): verify reports the
    .distcp file, the tensor and its chunk, the record and the absolute offset of the
    damaged entry (it gave the item's start only), through the API and as one line of
    ``torchless verify`` with exit 1. Python's zipfile is the oracle for the record and
    where its entry lies."""
    r = DCPReader(saved)
    ref = r.chunks("w")[0]
    r.locate(ref)
    info, chunk = ref.info, list(ref.chunk.offsets)
    r.close()
    path = os.path.join(saved, info.relative_path)
    with open(path, "rb") as f:
        item = f.read()[info.offset : info.offset + info.length]
    z = zipfile.ZipFile(io.BytesIO(item))
    names = [zi.filename for zi in z.infolist()]
    victim = next(n for n in names if n.endswith("/data/0"))
    p = z.start_dir  # walk the central directory to the victim's entry
    for _ in names:
        fields = struct.unpack_from("<IHHHHHHIIIHHHHHII", item, p)
        if item[p + 46 : p + 46 + fields[10]].decode() == victim:
            break
        p += 46 + fields[10] + fields[11] + fields[12]
    else:
        raise AssertionError("no central entry for the record")
    with open(path, "r+b") as f:
        f.seek(info.offset + p + 8)  # the entry's general-purpose flags
        f.write(struct.pack("<H", fields[3] | 1))  # bit 0: encrypted
        f.seek(info.offset)
        damaged = zipfile.ZipFile(io.BytesIO(f.read(info.length)))
    assert damaged.getinfo(victim).flag_bits & 1
    with pytest.raises(RuntimeError, match="encrypted"):
        damaged.read(victim)

    probs = torchless.open(saved).verify()
    assert [(p_.code, p_.member, p_.offset) for p_ in probs] == [("chunk", "w", info.offset + p)], probs
    msg = probs[0].message
    assert victim in msg and info.relative_path in msg and str(chunk) in msg, msg
    capsys.readouterr()
    assert cli(["verify", saved]) == 1
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and f"@{info.offset + p}" in lines[0] and victim in lines[0], lines
    assert info.relative_path in lines[0] and str(chunk) in lines[0], lines


def _largest_offset_item(d: str) -> tuple[str, object]:
    """The tensor whose item lies furthest into its .distcp file, and that item's place."""
    r = DCPReader(d)
    try:
        refs = [r.chunks(k)[0] for k in r.tensor_names()]
        ref = max(refs, key=lambda x: x.info.offset)
        return ref.fqn, ref.info
    finally:
        r.close()


def test_error_that_stops_an_item_check_is_told_at_its_absolute_offset(saved):
    """An item whose first central directory entry is damaged stops its zip check: the
    problem names the .distcp file and the entry's absolute offset (the item's start plus
    where Python's zipfile finds the central directory)."""
    fqn, info = _largest_offset_item(saved)
    assert info.offset > 0
    path = os.path.join(saved, info.relative_path)
    with open(path, "rb") as f:
        item = f.read()[info.offset : info.offset + info.length]
    start_dir = zipfile.ZipFile(io.BytesIO(item)).start_dir
    _flip(path, info.offset + start_dir)  # the entry's signature
    r = DCPReader(saved)
    try:
        probs = r.item_problems(info, fqn)
    finally:
        r.close()
    assert [(p.code, p.member, p.offset) for p in probs] == [("item", fqn, info.offset + start_dir)], probs
    assert probs[0].message.startswith(f"{path}, offset {info.offset + start_dir}: "), probs[0].message


def test_read_failure_of_a_remote_item_keeps_its_file_offset(tmp_path, monkeypatch):
    """A remote DCP file whose read fails inside an item's zip check (a connection reset
    while the item's central directory is fetched): the remote source already names the
    file and the absolute offset of the failed range, which the problem keeps (adding the
    item's start to it named a place past the end of the file)."""
    fsspec = pytest.importorskip("fsspec", reason="the remote extra (fsspec) is not installed")
    from torchless.io import remote
    from torchless.io.source import RemoteSource

    g = torch.Generator().manual_seed(1)
    d = str(tmp_path / "ck")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # items of several remote blocks each: the central directory is in a later block
        dcp.save({k: torch.randn(96, 512, generator=g) for k in ("a", "b")}, checkpoint_id=d, no_dist=True)
    fs = fsspec.filesystem("memory")
    url = f"memory:///verify-{os.getpid()}-{id(tmp_path)}"
    try:
        for n in os.listdir(d):
            with open(os.path.join(d, n), "rb") as f:
                fs.pipe(f"{url[len('memory://') :]}/{n}", f.read())
        fqn, info = _largest_offset_item(url)
        block = RemoteSource.__init__.__kwdefaults__["block"]
        first_later_block = (info.offset // block + 1) * block
        assert info.offset > 0 and info.offset + info.length > first_later_block
        size = os.path.getsize(os.path.join(d, info.relative_path))
        real, failed = remote.cat_range, []

        def cat_range(fs_, p, start, end):
            if start >= first_later_block:
                failed.append(start)
                raise ConnectionResetError("injected: connection reset by peer")
            return real(fs_, p, start, end)

        remote.SHARED_BLOCKS.clear()
        monkeypatch.setattr(remote, "cat_range", cat_range)
        r = DCPReader(url)
        try:
            probs = r.item_problems(info, fqn)
        finally:
            r.close()
        assert failed, "no read failed"
        assert [(p.code, p.member, p.offset) for p in probs] == [("item", fqn, failed[0])], probs
        assert failed[0] < size and f"{url}/{info.relative_path}, offset {failed[0]}: " in probs[0].message, probs
        assert "ConnectionResetError" in probs[0].message, probs
    finally:
        remote.SHARED_BLOCKS.clear()
        fs.rm(url[len("memory://") :], recursive=True)
