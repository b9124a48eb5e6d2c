"""Legacy torch tars are read with ``tarfile``'s rules, as torch reads them (issue 10,
root causes 9 and 12): the last member of a name wins, headers without ``ustar`` magic are
tars, links are never followed; torch.load (``weights_only=False``, on files we build with
inert content) is the oracle."""

from __future__ import annotations

import io
import struct
import tarfile
from typing import Any

import pytest
from tl_testutil import build_legacy_tar

import torchless
from torchless import TorchlessError
from torchless.formats.pt.read import detect_layout, is_tar_header
from torchless.io.source import MmapSource


def _members(path: str) -> list[tuple[str, bytes]]:
    with tarfile.open(path) as tf:
        return [(m.name, tf.extractfile(m).read()) for m in tf.getmembers()]  # type: ignore[union-attr]


def _write(path: str, members: list[tuple[str, bytes]], fmt: int = tarfile.PAX_FORMAT) -> None:
    with tarfile.open(path, "w", format=fmt) as tf:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))


def _strip_magic(path: str) -> None:
    """Turn every ustar header into a pre-POSIX (v7) one: no magic, checksum redone."""
    data = bytearray(open(path, "rb").read())
    pos = 0
    while pos + 512 <= len(data) and any(data[pos : pos + 512]):
        hdr = data[pos : pos + 512]
        size = int(hdr[124:136].strip(b"\0 ") or b"0", 8)
        hdr[257:265] = b"\0" * 8
        hdr[148:156] = b" " * 8
        hdr[148:156] = b"%06o\0 " % sum(hdr)
        data[pos : pos + 512] = hdr
        pos += 512 + (size + 511) // 512 * 512
    open(path, "wb").write(bytes(data))


def _view(obj: Any) -> dict[str, Any]:
    return {k: (v.numpy().tolist() if hasattr(v, "numpy") else v) for k, v in obj.items()}


def _both(torch: Any, path: str) -> tuple[Any, Any]:
    try:
        ref: Any = _view(torch.load(path, weights_only=False))
    except Exception as e:  # noqa: BLE001
        ref = e
    try:
        tl: Any = _view(torchless.load(path, weights_only=False))
    except TorchlessError as e:
        tl = e
    return ref, tl


def test_tar_layouts_read_as_torch_reads_them(torch, tmp_path):
    base = str(tmp_path / "base.tar")
    build_legacy_tar(base)
    members = _members(base)
    pkl = dict(members)["pickle"]
    other = pkl.replace(b"K\x04", b"K\x63")  # "n": 4 -> 99 (BININT1)
    assert other != pkl
    cases = {
        "plain": members,
        "duplicate-pickle-last-wins": members + [("pickle", other)],
        "duplicate-pickle-first-shadowed": [("pickle", other)] + members,
        "duplicate-storages": [("storages", b"\x80\x02K\x00.")] + members,
    }
    for name, mem in cases.items():
        p = str(tmp_path / f"{name}.pt")
        _write(p, mem)
        ref, tl = _both(torch, p)
        assert not isinstance(ref, BaseException), (name, ref)
        assert tl == ref, (name, tl, ref)
    assert _both(torch, str(tmp_path / "duplicate-pickle-last-wins.pt"))[1]["n"] == 99


def test_tar_without_ustar_magic(torch, tmp_path):
    p = str(tmp_path / "v7.pt")
    build_legacy_tar(p)
    raw = _members(p)
    _write(p, raw, tarfile.USTAR_FORMAT)
    _strip_magic(p)
    head = open(p, "rb").read(512)
    assert head[257:262] != b"ustar" and is_tar_header(head)
    src = MmapSource(p)
    assert detect_layout(src) == "tar"
    ref, tl = _both(torch, p)
    assert not isinstance(ref, BaseException), ref
    assert tl == ref


def test_tar_links_are_refused(torch, tmp_path):
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"\x80\x02K\x07.")
    p = str(tmp_path / "link.pt")
    build_legacy_tar(p)
    members = [m for m in _members(p) if m[0] != "pickle"]
    with tarfile.open(p, "w", format=tarfile.PAX_FORMAT) as tf:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
        link = tarfile.TarInfo("pickle")
        link.type = tarfile.SYMTYPE
        link.linkname = str(outside)
        tf.addfile(link)
    with pytest.raises(TorchlessError, match="link"):
        torchless.load(p, weights_only=False)


def test_tar_member_limit(tmp_path):
    from torchless.formats.pt import read as ptread

    p = str(tmp_path / "many.pt")
    _write(p, [(f"m{i}", b"") for i in range(50)])
    old = ptread.MAX_TAR_MEMBERS
    ptread.MAX_TAR_MEMBERS = 10
    try:
        with pytest.raises(torchless.LimitError):
            torchless.load(p, weights_only=False)
    finally:
        ptread.MAX_TAR_MEMBERS = old


def _sparse_member(name: str, data: bytes, hole: tuple[int, int]) -> bytes:
    """An old-GNU sparse member (type 'S'): ``data`` with ``data[hole[0]:hole[1]]`` (all
    zeros) left out of the archive; tarfile (and so torch) reassembles it."""
    a, b = hole
    assert not any(data[a:b])
    rest = len(data) - b
    q = rest // 3
    segs = [(0, a), (b, q), (b + q, q), (b + 2 * q, rest - 2 * q)]
    stored = data[:a] + data[b:]
    info = tarfile.TarInfo(name)
    info.size = len(stored)
    hdr = bytearray(info.tobuf(tarfile.GNU_FORMAT))
    assert len(hdr) == 512
    hdr[156:157] = b"S"
    pos = 386
    for off, n in segs:
        hdr[pos : pos + 12] = b"%011o\0" % off
        hdr[pos + 12 : pos + 24] = b"%011o\0" % n
        pos += 24
    hdr[482] = 0
    hdr[483:495] = b"%011o\0" % len(data)
    hdr[148:156] = b" " * 8
    hdr[148:156] = b"%06o\0 " % sum(hdr)
    return bytes(hdr) + stored + b"\0" * (-len(stored) % 512)


def test_sparse_members_are_reassembled(torch, tmp_path):
    from tl_testutil import Global, Persistent, _pk

    storages = bytearray(_pk(1))
    storages += _pk((0, "cpu", Global("torch", "FloatStorage")))
    storages += struct.pack("<q", 4096)
    zeros_at = len(storages)
    storages += bytes(4 * 4096)
    storages += _pk([])
    p = str(tmp_path / "sparse.pt")
    tensors = bytearray(_pk(1))
    tensors += _pk((10, 0, Global("torch", "FloatTensor")))
    tensors += struct.pack("<i4x", 1) + struct.pack("<q", 4096) + struct.pack("<q", 1) + struct.pack("<q", 0)
    pkl = _pk({"w": Persistent("10")})
    with open(p, "wb") as f:
        f.write(_sparse_member("storages", bytes(storages), (zeros_at + 512, zeros_at + 4 * 4096 - 512)))
        for name, data in (("tensors", bytes(tensors)), ("pickle", pkl)):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            f.write(info.tobuf(tarfile.GNU_FORMAT) + data + b"\0" * (-len(data) % 512))
        f.write(b"\0" * 1024)
    with tarfile.open(p) as tf:
        assert tf.getmember("storages").issparse()
    ref, tl = _both(torch, p)
    assert not isinstance(ref, BaseException), ref
    assert tl == ref and len(tl["w"]) == 4096
