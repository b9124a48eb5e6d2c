"""Hand-built zip layouts for the differential tests (records, directories, end records
placed byte by byte, so that one file can be read as two archives)."""

from __future__ import annotations

import io
import struct
import zipfile
import zlib
from dataclasses import dataclass

LOC = b"PK\x03\x04"
CEN = b"PK\x01\x02"
END = b"PK\x05\x06"
END64 = b"PK\x06\x06"
LOC64 = b"PK\x06\x07"


@dataclass
class Rec:
    name: bytes
    data: bytes
    method: int = 0  # 0 stored, 8 deflate
    external_attr: int = 0
    z64_offset: bool = False  # header offset in a zip64 extra field


def records_of(archive: bytes) -> list[Rec]:
    """The members of a zip (as zipfile lists them), stored."""
    with zipfile.ZipFile(io.BytesIO(archive)) as zf:
        return [Rec(i.filename.encode(), zf.read(i)) for i in zf.infolist()]


def lay(recs: list[Rec], at: int, bias: int = 0) -> tuple[bytes, bytes]:
    """``(local records, central directory)`` for records placed at absolute offset ``at``;
    the directory names each header at ``offset - bias`` (what a reader adding ``bias``
    to every offset, like zipfile's ``concat``, needs)."""
    loc = bytearray()
    cen = bytearray()
    for r in recs:
        off = at + len(loc)
        body = r.data if r.method == 0 else _deflate(r.data)
        crc = zlib.crc32(r.data) & 0xFFFFFFFF
        loc += (
            struct.pack("<4sHHHHHIIIHH", LOC, 20, 0, r.method, 0, 0, crc, len(body), len(r.data), len(r.name), 0) + r.name + body
        )
        hoff = off - bias
        extra = b""
        if r.z64_offset:
            extra = struct.pack("<HHQ", 1, 8, hoff)
            hoff = 0xFFFFFFFF
        cen += (
            struct.pack(
                "<4sHHHHHHIIIHHHHHII",
                CEN,
                20,
                20,
                0,
                r.method,
                0,
                0,
                crc,
                len(body),
                len(r.data),
                len(r.name),
                len(extra),
                0,
                0,
                0,
                r.external_attr,
                hoff,
            )
            + r.name
            + extra
        )
    return bytes(loc), bytes(cen)


def _deflate(data: bytes) -> bytes:
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    return c.compress(data) + c.flush()


def eocd(n: int, cd_size: int, cd_off: int, comment: bytes = b"", *, comment_len: int | None = None) -> bytes:
    cl = len(comment) if comment_len is None else comment_len
    return struct.pack("<4sHHHHIIH", END, 0, 0, n, n, cd_size, cd_off, cl) + comment


def eocd64(n: int, cd_size: int, cd_off: int) -> bytes:
    return struct.pack("<4sQHHIIQQQQ", END64, 44, 45, 45, 0, 0, n, n, cd_size, cd_off)


def locator(target: int) -> bytes:
    return struct.pack("<4sIQI", LOC64, 0, target, 1)


def plain(recs: list[Rec], comment: bytes = b"") -> bytes:
    loc, cen = lay(recs, 0)
    return loc + cen + eocd(len(recs), len(cen), len(loc), comment)


def with_zip64(recs: list[Rec]) -> bytes:
    loc, cen = lay(recs, 0)
    e64 = len(loc) + len(cen)
    return loc + cen + eocd64(len(recs), len(cen), len(loc)) + locator(e64) + eocd(0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF)


def split_view(a: list[Rec], b: list[Rec]) -> bytes:
    """miniz reads ``a``, zipfile reads ``b``: one end record whose offset names a's
    directory while b's directory (same size) sits right before it (zipfile's ``concat``)."""
    la, ca = lay(a, 0)
    out = la + ca
    b_cd_pos = len(out) + len(lay(b, 0)[0])
    concat = b_cd_pos - len(la)
    lb, cb = lay(b, len(out), bias=concat)
    assert len(ca) == len(cb), "the two directories must have the same size"
    out += lb + cb
    return out + eocd(len(a), len(ca), len(la))


def zip64_split(a: list[Rec], b: list[Rec]) -> bytes:
    """miniz follows the zip64 locator to b's directory; zipfile finds no zip64 record at
    ``eocd - 76`` and reads a through the classic end record."""
    lb, cb = lay(b, 0)
    out = bytearray(lb + cb)
    rec_at = len(out)
    out += eocd64(len(b), len(cb), len(lb))
    a_at = len(out)
    la, ca = lay(a, a_at)
    out += la
    a_cd = len(out)
    tail = b"\x00" * 56 + locator(rec_at)  # swallowed as the comment of a's last entry
    ca = _with_last_comment(ca, tail)
    out += ca
    return bytes(out + eocd(len(a), len(ca), a_cd))


def _with_last_comment(cd: bytes, comment: bytes) -> bytes:
    # find the last central entry and give it a comment
    pos = cd.rfind(CEN)
    nlen, xlen, clen = struct.unpack_from("<HHH", cd, pos + 28)
    assert clen == 0
    head = bytearray(cd[pos:])
    struct.pack_into("<H", head, 32, len(comment))
    return cd[:pos] + bytes(head) + comment


def low_eocd_locator(a: list[Rec], b: list[Rec]) -> bytes:
    """End record at offset < 76 behind a zip64 locator that points at a valid zip64
    record for ``b``: miniz ignores the locator (end record below 76) and reads ``a``;
    zipfile follows it and cannot seek to ``eocd - 76``. Both archives live in the end
    record's comment."""
    head = struct.pack("<4sHHHHHIIIHH", LOC, 20, 0, 0, 0, 0, 0, 0, 0, 0, 0)  # 30 bytes: the file starts like a zip
    at = len(head) + 20 + 22
    la, ca = lay(a, at)
    lb, cb = lay(b, at + len(la) + len(ca))
    rec_at = at + len(la) + len(ca) + len(lb) + len(cb)
    comment = la + ca + lb + cb + eocd64(len(b), len(cb), at + len(la) + len(ca) + len(lb))
    return head + locator(rec_at) + eocd(len(a), len(ca), at + len(la), comment)


def overlapping(recs: list[Rec], alias: bytes, target: bytes) -> bytes:
    """``recs`` plus a central entry named ``alias`` that points at ``target``'s local
    header (two names, one record: miniz reads it under both names, zipfile refuses the
    alias because the local header names ``target``)."""
    loc, cen = lay(recs, 0)
    i = [r.name for r in recs].index(target)
    pos = 0
    for _ in range(i):
        pos = cen.index(CEN, pos) + 1
    pos = cen.index(CEN, pos)
    nlen, xlen, clen = struct.unpack_from("<HHH", cen, pos + 28)
    entry = bytearray(cen[pos : pos + 46 + nlen + xlen + clen])
    struct.pack_into("<H", entry, 28, len(alias))
    extra_comment = bytes(entry[46 + nlen :])
    alias_entry = bytes(entry[:46]) + alias + extra_comment
    cen2 = cen + alias_entry
    return loc + cen2 + eocd(len(recs) + 1, len(cen2), len(loc))
