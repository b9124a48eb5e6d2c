"""The zip container: torch's reader rules, the writer's exact layout, zip64, CRCs."""

from __future__ import annotations

import io
import struct
import zipfile
import zlib

import pytest
from tl_testutil import build_zip, central_header, local_header

from torchless.container.zip import MAX32, TorchZipWriter, ZipReader
from torchless.container.zip_spec import miniz_heapsort as _miniz_heapsort
from torchless.core.errors import FormatError, LimitError, NotFoundError, TorchlessError, TruncatedError, UnsupportedError
from torchless.io.source import BytesSource


def _write(records, **kw) -> bytes:
    buf = io.BytesIO()
    with TorchZipWriter(buf, "arch", **kw) as zw:
        for name, data, *rest in records:
            zw.write(name, data, compress=bool(rest and rest[0]))
    return buf.getvalue()


def test_writer_layout_and_python_zipfile_agree():
    data = _write(
        [("data.pkl", b"\x80\x02K\x01."), ("data/0", bytes(range(200))), ("empty", b""), ("code/x.py", b"print(1)\n" * 50, True)]
    )
    zr = ZipReader(data)
    assert zr.prefix == "arch"
    assert zr.records() == ["data.pkl", "data/0", "empty", "code/x.py"]
    for e in zr.entries:
        if e.method == 0:
            assert zr.data_offset(e) % 64 == 0
    zf = zipfile.ZipFile(io.BytesIO(data))
    for e in zr.entries:
        assert zf.read(e.name) == zr.read_bytes(e)
    assert zr.read_bytes("code/x.py") == b"print(1)\n" * 50
    assert zr.get("code/x.py").method == 8
    # zip64 end record + locator + classic end record, always
    assert data[-22:-18] == b"PK\x05\x06" and data[-42:-38] == b"PK\x06\x07" and data[-98:-94] == b"PK\x06\x06"
    assert zr.zip64
    # FB extra field on every record, zero time/date, flags 0x0808 (0x0800 when empty)
    for e in zr.entries:
        sig, need, flags, method, t, d = struct.unpack_from("<4sHHHHH", data, e.header_offset)
        nlen, xlen = struct.unpack_from("<HH", data, e.header_offset + 26)
        extra = data[e.header_offset + 30 + nlen : e.header_offset + 30 + nlen + xlen]
        assert extra[:2] == b"FB" and set(extra[4:]) <= {0x5A}
        assert (t, d) == (0, 0)
        assert flags == (0x0808 if e.size else 0x0800)
    assert zr.verify() == []


@pytest.mark.parametrize("alignment", [1, 64, 4096, 65535])
def test_alignment(alignment):
    data = _write([("a", b"x" * 10), ("b", b"y" * 3)], alignment=alignment)
    zr = ZipReader(data)
    for e in zr.entries:
        assert zr.data_offset(e) % alignment == 0
    with pytest.raises(ValueError):  # a UsageError, which is a ValueError
        TorchZipWriter(io.BytesIO(), alignment=65536)


def test_crc_verification_flags_corruption():
    data = bytearray(_write([("data.pkl", b"\x80\x02K\x01."), ("data/0", b"\x01" * 64)]))
    zr = ZipReader(bytes(data))
    off = zr.data_offset(zr.get("data/0"))
    data[off + 5] ^= 0xFF
    problems = ZipReader(bytes(data)).verify()
    assert [(p.code, p.severity) for p in problems] == [("crc", "error")]
    assert problems[0].member == "arch/data/0"
    # reading does not check CRCs (torch's miniz is built without it)
    assert ZipReader(bytes(data)).read_bytes("data/0")[5] == 0xFE
    zero = _write([("x", b"abc")], compute_crc=False)
    assert {p.code for p in ZipReader(zero).verify()} == {"crc-zero"}
    assert ZipReader(zero).verify(crc=False) == []


def test_deflate_records_and_corrupt_deflate():
    payload = b"hello world " * 100
    comp = zlib.compressobj(9, zlib.DEFLATED, -15)
    body = comp.compress(payload) + comp.flush()
    crc = zlib.crc32(payload)
    name = b"arch/data.pkl"
    out = local_header(name, crc=crc, csize=len(body), usize=len(payload), flags=0, method=8) + body
    cd_off = len(out)
    cd = central_header(name, 0, len(payload), crc, csize=len(body), method=8, flags=0)
    out += cd + struct.pack("<4sHHHHIIH", b"PK\x05\x06", 0, 0, 1, 1, len(cd), cd_off, 0)
    zr = ZipReader(out)
    assert zr.read_bytes("data.pkl") == payload
    bad = bytearray(out)
    bad[30 + len(name) : 30 + len(name) + len(body)] = b"\xff" * len(body)  # invalid block type
    with pytest.raises(FormatError):
        ZipReader(bytes(bad)).read("data.pkl")
    # declared size smaller than the inflated data (a bomb in disguise)
    liar = out[:cd_off] + central_header(name, 0, 10, crc, csize=len(body), method=8, flags=0) + out[cd_off + len(cd) :]
    with pytest.raises(FormatError):
        ZipReader(liar).read("data.pkl")
    with pytest.raises(LimitError):
        ZipReader(out).read("data.pkl", max_size=100)
    # unknown method, encryption
    m12 = out[:cd_off] + central_header(name, 0, len(payload), crc, csize=len(body), method=12, flags=0) + out[cd_off + len(cd) :]
    with pytest.raises(UnsupportedError):
        ZipReader(m12).read("data.pkl")
    enc = out[:cd_off] + central_header(name, 0, len(payload), crc, csize=len(body), method=8, flags=1) + out[cd_off + len(cd) :]
    with pytest.raises(UnsupportedError):
        ZipReader(enc).read("data.pkl")


def _zip64_archive(size_in_extra: bool = True, offset_in_extra: bool = True) -> bytes:
    """A small archive whose central entry keeps its sizes and offset in a zip64 extra."""
    name = b"arch/data.pkl"
    data = b"\x80\x02K\x07."
    crc = zlib.crc32(data)
    out = bytearray(b"JUNK" * 4)  # the record does not start at 0
    hoff = len(out)
    out += local_header(name, crc=crc, csize=len(data), usize=len(data), flags=0) + data
    body = b""
    usize = csize = len(data)
    off = hoff
    if size_in_extra:
        body += struct.pack("<QQ", len(data), len(data))
        usize = csize = MAX32
    if offset_in_extra:
        body += struct.pack("<Q", hoff)
        off = MAX32
    extra = struct.pack("<HH", 0x5A5A, 2) + b"zz" + struct.pack("<HH", 1, len(body)) + body
    cd_off = len(out)
    cd = (
        struct.pack(
            "<4sHHHHHHIIIHHHHHII", b"PK\x01\x02", 45, 45, 0, 0, 0, 0, crc, csize, usize, len(name), len(extra), 0, 0, 0, 0, off
        )
        + name
        + extra
    )
    out += cd
    e64 = len(out)
    out += struct.pack("<4sQHHIIQQQQ", b"PK\x06\x06", 44, 45, 45, 0, 0, 1, 1, len(cd), cd_off)
    out += struct.pack("<4sIQI", b"PK\x06\x07", 0, e64, 1)
    out += struct.pack("<4sHHHHIIH", b"PK\x05\x06", 0, 0, 0xFFFF, 0xFFFF, MAX32, MAX32, 0)
    return bytes(out)


@pytest.mark.parametrize("sizes,offset", [(True, True), (True, False), (False, True)])
def test_zip64_extra_fields_and_end_records(sizes, offset):
    data = _zip64_archive(sizes, offset)
    zr = ZipReader(data)
    assert zr.zip64
    e = zr.get("data.pkl")
    assert e.size == 5 and e.header_offset == 16
    assert zr.read_bytes(e) == b"\x80\x02K\x07."
    assert zipfile.ZipFile(io.BytesIO(data)).read("arch/data.pkl") == b"\x80\x02K\x07."
    assert any(p.code == "leading-data" for p in zr.verify())


def test_zip64_extra_too_short_and_bad_locator():
    data = bytearray(_zip64_archive())
    i = data.find(b"\x01\x00\x18\x00")
    struct.pack_into("<H", data, i + 2, 8)  # declares 8 bytes where 24 are needed
    with pytest.raises(TorchlessError):
        ZipReader(bytes(data)).read("data.pkl")
    data = bytearray(_zip64_archive())
    loc = data.rfind(b"PK\x06\x07")
    struct.pack_into("<Q", data, loc + 8, 3)  # locator points at no zip64 record: miniz ignores it ...
    with pytest.raises(FormatError):  # ... and the classic record's 0xFFFFFFFF offsets fail
        ZipReader(bytes(data))
    struct.pack_into("<Q", data, loc + 8, 2**40)
    with pytest.raises(TruncatedError):
        ZipReader(bytes(data))


def test_writer_zip64_paths_by_position():
    """Records past 4 GiB get zip64 extras and 24-byte descriptors; simulate the cursor."""
    buf = io.BytesIO()
    zw = TorchZipWriter(buf, "arch")
    zw._pos = MAX32 + 10  # as if 4 GiB had been written already
    zw.write("data/9", b"abc")
    zw.close()
    raw = buf.getvalue()
    # local header: zip64 extra (offset) then FB padding; descriptor with 64-bit sizes
    nlen, xlen = struct.unpack_from("<HH", raw, 26)
    extra = raw[30 + nlen : 30 + nlen + xlen]
    assert extra[:4] == struct.pack("<HH", 1, 8) and struct.unpack_from("<Q", extra, 4)[0] == MAX32 + 10
    assert extra[12:14] == b"FB"
    start = 30 + nlen + xlen
    assert (MAX32 + 10 + start) % 64 == 0
    assert raw[start + 3 : start + 7] == b"PK\x07\x08" and struct.unpack_from("<IQQ", raw, start + 7)[1:] == (3, 3)
    cd = raw.find(b"PK\x01\x02")
    assert struct.unpack_from("<I", raw, cd + 42)[0] == MAX32
    ce = raw[cd + 46 + nlen : cd + 46 + nlen + 12]
    assert ce == struct.pack("<HHQ", 1, 8, MAX32 + 10)


def test_reader_rules():
    with pytest.raises(FormatError):
        ZipReader(build_zip([(b"data.pkl", b"x")]))  # not inside a folder
    assert ZipReader(build_zip([(b"data.pkl", b"x")]), require_prefix=False).read_bytes("data.pkl") == b"x"
    zr = ZipReader(build_zip([(b"a/Data.PKL", b"1"), (b"a/x", b"2")]))
    assert zr.lookup("data.pkl").name == "a/Data.PKL"  # case-insensitive, like miniz
    assert zr.lookup("missing") is None
    with pytest.raises(NotFoundError):
        zr.get("missing")
    for junk in (b"", b"PK", b"x" * 100, b"PK\x05\x06" + b"\x00" * 18):
        with pytest.raises(TorchlessError):
            ZipReader(junk)
    with pytest.raises(LimitError):
        ZipReader(build_zip([(b"a/x", b"1"), (b"a/y", b"2")]), max_entries=1)
    # EOCD entry count larger than the directory can hold
    with pytest.raises(FormatError):
        ZipReader(build_zip([(b"a/x", b"1")], eocd_entries=1000))
    # a local header that is not one
    z = bytearray(build_zip([(b"a/x", b"1")]))
    z[0:4] = b"XXXX"
    with pytest.raises(FormatError):
        ZipReader(bytes(z)).read("x")
    # record running past the end of the file
    z = build_zip([(b"a/x", b"12345")])
    zr = ZipReader(z)
    big = z[: zr.cd_offset] + central_header(b"a/x", 0, 10**6, 0, flags=0) + z[zr.cd_offset + 46 + 3 :]
    with pytest.raises(TruncatedError):
        ZipReader(big).read("x")


def test_miniz_heapsort_is_a_sort():
    import random

    rng = random.Random(3)
    for n in range(1, 40):
        keys = [bytes(rng.choice(b"abAB/._") for _ in range(rng.randint(0, 4))) for _ in range(n)]
        order = _miniz_heapsort(keys)
        assert sorted(order) == list(range(n))
        assert [keys[i] for i in order] == sorted(keys)


def test_duplicates_against_torch(tmp_path):
    torch = pytest.importorskip("torch", reason="torch's reader is the oracle for duplicate names")
    import pickle
    import random

    rng = random.Random(11)
    for trial in range(12):
        n = rng.randint(2, 6)
        names = ["data.pkl"] * n + [rng.choice(["version", "byteorder", "data/0", "a", "zz"]) for _ in range(rng.randint(0, 5))]
        rng.shuffle(names)
        names.append("version")
        buf = io.BytesIO()
        with TorchZipWriter(buf, "archive") as zw:
            k = 0
            for nm in names:
                if nm == "data.pkl":
                    zw.write(nm, pickle.dumps({"copy": k}, protocol=2))
                    k += 1
                elif nm == "version":
                    zw.write(nm, b"3\n")
                else:
                    zw.write(nm, b"little" if nm == "byteorder" else b"")
        data = buf.getvalue()
        expect = torch.load(io.BytesIO(data), weights_only=True)
        zr = ZipReader(data)
        got = pickle.loads(zr.read_bytes("data.pkl"))  # test only: plain data
        assert got == expect, (trial, names)


class _CountingSource(BytesSource):
    """Bytes in memory that record the length of every view asked of them."""

    def __init__(self, data: bytes) -> None:
        super().__init__(data, "<counted>")
        self.views: list[int] = []

    def view(self, offset: int, length: int, *, what: str = "data") -> memoryview:
        self.views.append(length)
        return super().view(offset, length, what=what)


def test_crc_pass_streams_records_and_check_read_reads_no_payload(monkeypatch):
    """crc32 reads a record in pieces of at most source.PIECE bytes (stored and deflated),
    with zlib's CRC of the payload as the oracle; check_read then raises what read raises
    without reading a stored payload or inflating a deflated one a second time."""
    from torchless.io import source

    monkeypatch.setattr(source, "PIECE", 4096)
    payload = bytes(range(256)) * 97 + b"tail"  # 24836 bytes: seven pieces
    noisy = zlib.compress(payload * 3, 1)[: len(payload)]  # bytes deflate cannot shrink: several raw pieces
    data = _write([("data.pkl", b"\x80\x02K\x01."), ("data/0", payload), ("data/1", noisy, True)])
    src = _CountingSource(data)
    zr = ZipReader(src)
    for name, want in (("data/0", payload), ("data/1", noisy)):
        src.views.clear()
        assert zr.crc32(name) == zlib.crc32(want) == zr.get(name).crc
        assert max(src.views) <= 4096 and sum(src.views) >= zr.get(name).compressed_size, (name, src.views)
        src.views.clear()
        assert zr.check_read(zr.get(name)) == len(want)
        assert sum(src.views) < 100, (name, src.views)  # a local header at most: no payload
    assert zr.verify() == []
    # a corrupt deflated record: check_read raises what read raises, the CRC pass reports it
    e = ZipReader(data).get("data/1")
    bad = bytearray(data)
    off = ZipReader(data).data_offset(e)
    bad[off : off + 64] = b"\xff" * 64
    with pytest.raises(FormatError) as by_read:
        ZipReader(bytes(bad)).read("data/1")
    zr = ZipReader(bytes(bad))
    with pytest.raises(FormatError) as by_check:
        zr.check_read(zr.get("data/1"))
    assert str(by_check.value) == str(by_read.value)
    assert [p.code for p in zr.verify()] == ["data"]
