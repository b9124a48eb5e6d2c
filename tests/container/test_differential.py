"""Every container is read with its loader's rules (issue 10, root causes 11 and 12).

Layouts built to be read two ways (classic vs zip64 end records, an end record at offset
< 76 behind a zip64 locator, bytes between the central directory and the end record,
two end records, data before the archive, duplicate names, uncounted entries) are read
by the real loaders: ``torch.load`` (miniz) for torch files, ``numpy.load`` (zipfile) for
``.npz``. torchless must return what the real loader returns or refuse with a
TorchlessError, and :func:`zip_differentials` must flag every layout the two readers
read differently (and none of the plain ones).
"""

from __future__ import annotations

import io
import struct
import zipfile
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import zipkit as zk
from zipkit import Rec

import torchless
from torchless import TorchlessError
from torchless.container.differentials import zip_differentials
from torchless.container.pyzip import PyZipReader

# -- oracles ----------------------------------------------------------------------------


def _torch_view(torch: Any, path: str) -> dict[str, np.ndarray] | BaseException:
    try:
        obj = torch.load(path, weights_only=True)
    except Exception as e:  # noqa: BLE001 - the oracle's refusal
        return e
    return {k: v.numpy() for k, v in obj.items()}


def _numpy_view(path: str) -> dict[str, Any] | BaseException:
    try:
        with np.load(path) as f:
            return {k: f[k] for k in f.files}
    except Exception as e:  # noqa: BLE001
        return e


def _tl_view(path: str) -> dict[str, Any] | TorchlessError:
    try:
        obj = torchless.load(path)
        return {k: (v.numpy() if hasattr(v, "numpy") else v) for k, v in obj.items()}
    except TorchlessError as e:
        return e


def _same(tl: dict[str, Any], ref: dict[str, Any]) -> bool:
    if list(tl) != list(ref):
        return False
    for k in ref:
        a, b = tl[k], ref[k]
        if isinstance(b, np.ndarray):
            if not (isinstance(a, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)):
                return False
        elif a != b:
            return False
    return True


def _check(ref: Any, tl: Any, name: str) -> str:
    """'same' or 'refused'; fails on silent wrong data or a non-torchless error."""
    if isinstance(ref, BaseException):
        assert isinstance(tl, TorchlessError), f"{name}: the real loader refuses ({ref!r}) but torchless returned {tl!r}"
        return "refused"
    if isinstance(tl, TorchlessError):
        return "refused"
    assert _same(tl, ref), f"{name}: torchless returned {tl!r}, the real loader {ref!r}"
    return "same"


# -- torch archives ---------------------------------------------------------------------
def _torch_records(torch: Any, value: float) -> list[Rec]:
    buf = io.BytesIO()
    torch.save({"w": torch.full((3,), value), "b": torch.arange(4)}, buf)
    return zk.records_of(buf.getvalue())


def _torch_layouts(torch: Any) -> dict[str, tuple[bytes, bool]]:
    """name -> (file bytes, read two ways?)"""
    a = _torch_records(torch, 1.0)
    b = _torch_records(torch, 7.0)
    dup = a + [Rec(r.name, r2.data) for r, r2 in zip(a, b, strict=False) if r.name.endswith(b"data/0")]
    upper = a + [
        Rec(r.name.replace(b"data/0", b"DATA/0"), r2.data) for r, r2 in zip(a, b, strict=False) if r.name.endswith(b"data/0")
    ]
    counted = zk.plain(a + [Rec(b"archive/extra", b"x" * 5)])
    n = len(a)
    cut = bytearray(counted)
    e = cut.rfind(zk.END)
    struct.pack_into("<HH", cut, e + 8, n, n)  # the end record counts one entry less
    return {
        "plain": (zk.plain(a), False),
        "zip64": (zk.with_zip64(a), False),
        "deflated": (zk.plain([Rec(r.name, r.data, method=8 if r.name.endswith(b".pkl") else 0) for r in a]), False),
        "zip64-extra-offset": (zk.plain([Rec(r.name, r.data, z64_offset=True) for r in a]), False),
        "split-view": (zk.split_view(a, b), True),
        "zip64-vs-classic": (zk.zip64_split(a, b), True),
        "eocd-below-76": (zk.low_eocd_locator(a, b), True),
        "prepended-archive": (zk.plain(a) + zk.plain(b), True),
        "trailing-end-signature": (zk.plain(a) + zk.END + b"\0" * 10, True),
        "eocd-beyond-zipfile-window": (zk.plain(a + [Rec(b"archive/pad", b"p" * 5000)]) + b"\0" * 66978, True),
        "eocd-in-miniz-blind-spot": (zk.plain(a) + b"\0" * 5000, True),
        "duplicate-names": (zk.plain(dup), True),
        "case-duplicates": (zk.plain(upper), True),
        "uncounted-entry": (bytes(cut), True),
        "overlapping-members": (
            zk.overlapping(a, b"archive/data/9", next(r.name for r in a if r.name.endswith(b"data/0"))),
            True,
        ),
    }


def test_torch_layouts_read_as_torch_reads_them(torch, tmp_path):
    seen = {}
    for name, (data, two_ways) in _torch_layouts(torch).items():
        p = str(tmp_path / f"{name}.pt")
        with open(p, "wb") as f:
            f.write(data)
        ref = _torch_view(torch, p)
        seen[name] = _check(ref, _tl_view(p), name)
        flags = zip_differentials(data)
        if two_ways:
            assert flags, f"{name}: read two ways but not flagged"
        else:
            assert flags == [], f"{name}: {flags}"
    # the layouts really are read by torch (not only refused): the differential matters
    for name in (
        "plain",
        "zip64",
        "split-view",
        "zip64-vs-classic",
        "eocd-below-76",
        "trailing-end-signature",
        "eocd-beyond-zipfile-window",
        "duplicate-names",
        "case-duplicates",
        "uncounted-entry",
    ):
        assert seen[name] == "same", (name, seen[name])


def test_split_views_really_differ(torch, tmp_path):
    """The two-way layouts hold two archives: torch sees one, zipfile the other."""
    layouts = _torch_layouts(torch)
    for name in ("split-view", "zip64-vs-classic"):
        data, _ = layouts[name]
        p = tmp_path / "x.pt"
        p.write_bytes(data)
        tv = _torch_view(torch, str(p))
        with zipfile.ZipFile(str(p)) as zf:
            zv = zf.read("archive/data/0")
        assert isinstance(tv, dict)
        assert tv["w"].tobytes() != zv[: tv["w"].nbytes]
        assert bytes(PyZipReader(data).read("archive/data/0")) == zv


# -- npz archives -----------------------------------------------------------------------
def _npz_records(**arrays: np.ndarray) -> list[Rec]:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return zk.records_of(buf.getvalue())


def _npz_layouts() -> dict[str, tuple[bytes, bool]]:
    a = _npz_records(x=np.arange(6, dtype=np.float32), y=np.ones((2, 2), dtype=np.int16))
    b = _npz_records(x=np.full(6, 5, dtype=np.float32), y=np.zeros((2, 2), dtype=np.int16))
    extra = a + [Rec(b"z.npy", _npz_records(z=np.arange(3))[0].data)]
    cut = bytearray(zk.plain(extra))
    e = cut.rfind(zk.END)
    struct.pack_into("<HH", cut, e + 8, len(a), len(a))
    bad_crc = bytearray(zk.plain(a))
    c = bad_crc.find(zk.CEN)
    struct.pack_into("<I", bad_crc, c + 16, 0x12345678)
    named = [
        Rec(b"x.npy\x00junk", a[0].data),
        Rec(b"x", b"raw bytes, not an array"),
        Rec(b"w.npy.npy", a[1].data),
        Rec(b"w.npy", b"shadow"),
    ]
    return {
        "plain": (zk.plain(a), False),
        "zip64": (zk.with_zip64(a), False),
        "deflated": (zk.plain([Rec(r.name, r.data, method=8) for r in a]), False),
        "split-view": (zk.split_view(a, b), True),
        "zip64-vs-classic": (zk.zip64_split(a, b), True),
        "eocd-below-76": (zk.low_eocd_locator(a, b), True),
        "prepended-archive": (zk.plain(a) + zk.plain(b), True),
        "trailing-end-signature": (zk.plain(a) + zk.END + b"\0" * 10, True),
        "eocd-beyond-zipfile-window": (zk.plain(a + [Rec(b"pad", b"p" * 5000)]) + b"\0" * 66978, True),
        "eocd-in-miniz-blind-spot": (zk.plain(a) + b"\0" * 5000, True),
        "duplicate-names": (zk.plain(a + b), True),
        "uncounted-entry": (bytes(cut), True),
        "bad-crc": (bytes(bad_crc), False),
        "name-rules": (zk.plain(named), True),
        "comment": (zk.plain(a, comment=b"PK\x01\x02 not a directory"), False),
        "overlapping-members": (zk.overlapping(a, b"z.npy", b"x.npy"), True),
    }


def test_npz_layouts_read_as_numpy_reads_them(tmp_path):
    seen = {}
    for name, (data, two_ways) in _npz_layouts().items():
        p = str(tmp_path / f"{name}.npz")
        with open(p, "wb") as f:
            f.write(data)
        ref = _numpy_view(p)
        seen[name] = _check(ref, _tl_view(p), name)
        flags = zip_differentials(data)
        if two_ways:
            assert flags, f"{name}: read two ways but not flagged"
        elif name != "bad-crc":
            assert flags == [], f"{name}: {flags}"
    # numpy reads these; torchless must read the same arrays, not refuse
    for name in (
        "plain",
        "zip64",
        "deflated",
        "split-view",
        "zip64-vs-classic",
        "prepended-archive",
        "eocd-in-miniz-blind-spot",
        "duplicate-names",
        "uncounted-entry",
        "name-rules",
        "comment",
    ):
        assert seen[name] == "same", (name, seen[name])
    assert seen["bad-crc"] == "refused"


def test_npz_stored_arrays_stay_zero_copy(tmp_path):
    p = tmp_path / "a.npz"
    p.write_bytes(zk.split_view(_npz_records(x=np.arange(6.0)), _npz_records(x=np.arange(6.0) + 1)))
    with torchless.open(str(p)) as art:
        arr = art["x"].numpy()
        assert arr.tolist() == (np.arange(6.0) + 1).tolist()
        assert not arr.flags.owndata  # a view of the memory map


# -- limits -----------------------------------------------------------------------------
@pytest.mark.parametrize("reader", ["miniz", "zipfile"])
def test_hostile_directory_sizes_fail_fast(reader):
    """An end record claiming 2^32 - 1 entries / a zip64 size of 2^63: refused at once."""
    from torchless.container.zip import ZipReader

    make: Callable[[bytes], Any] = (lambda d: ZipReader(d, require_prefix=False)) if reader == "miniz" else PyZipReader
    huge = zk.LOC + b"\0" * 26 + zk.eocd64(2**32 - 1, 2**63, 0) + zk.locator(30) + zk.eocd(0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF)
    many = zk.LOC + b"\0" * 26 + zk.eocd(0xFFFF, 0xFFFF * 46, 0)
    for data in (huge, many):
        with pytest.raises(TorchlessError):
            make(data)


def test_crc_is_checked_like_zipfile(tmp_path):
    data = _npz_layouts()["bad-crc"][0]
    p = tmp_path / "bad.npz"
    p.write_bytes(data)
    with pytest.raises(zipfile.BadZipFile):
        dict(np.load(str(p)))
    with pytest.raises(torchless.ChecksumError):
        torchless.load(str(p))["x"].numpy()
    assert zlib.crc32(b"") == 0


def test_scanner_flags_every_two_way_layout(torch, tmp_path):
    layouts = {f"{k}.pt": v for k, v in _torch_layouts(torch).items()}
    layouts.update({f"{k}.npz": v for k, v in _npz_layouts().items()})
    for name, (data, two_ways) in layouts.items():
        p = tmp_path / name
        p.write_bytes(data)
        rep = torchless.scan(str(p)).files[0]
        rules = {f.rule for f in rep.findings}
        if two_ways:
            assert rep.verdict != "clean", f"{name}: read two ways, scanned {rep.verdict}"
            assert "zip-reader-differential" in rules or "polyglot" in rules or "zip-duplicate" in rules, (name, rules)
        elif name in ("plain.pt", "zip64.pt", "plain.npz", "zip64.npz"):
            assert "zip-reader-differential" not in rules, (name, [f.message for f in rep.findings])


@pytest.mark.parametrize("size", [0xFFFFFFFE, 2**63, 2**64 - 1])
def test_hostile_member_sizes_fail_fast(size):
    """A deflated member claiming 4 GiB or 2^63 bytes: refused before any inflation."""
    from torchless.container.zip import ZipReader

    body = zlib.compress(b"x" * 100)[2:-4]
    name = b"archive/data.pkl"
    usize, extra = (size, b"") if size < 0xFFFFFFFF else (0xFFFFFFFF, struct.pack("<HHQ", 1, 8, size))
    loc = struct.pack("<4sHHHHHIIIHH", zk.LOC, 20, 0, 8, 0, 0, 0, len(body), 0, len(name), 0) + name + body
    cen = (
        struct.pack("<4sHHHHHHIIIHHHHHII", zk.CEN, 20, 20, 0, 8, 0, 0, 0, len(body), usize, len(name), len(extra), 0, 0, 0, 0, 0)
        + name
        + extra
    )
    data = loc + cen + zk.eocd(1, len(cen), len(loc))
    with pytest.raises(TorchlessError):
        ZipReader(data).read("data.pkl")
    with pytest.raises(TorchlessError):
        PyZipReader(data).read("archive/data.pkl")
