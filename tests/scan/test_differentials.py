"""One test per container differential: the scanner reports what torch and other readers disagree on."""

from __future__ import annotations

import io
import struct
import zipfile
import zlib

import pytest

from torchless.container.zip import ZipReader
from torchless.scan import scan


def rules(rep) -> dict[str, list]:  # type: ignore[no-untyped-def]
    out: dict[str, list] = {}
    for f in rep.findings:
        out.setdefault(f.rule, []).append(f)
    return out


def benign_pickle(gen) -> bytes:  # type: ignore[no-untyped-def]
    return gen.pk(gen.D())


def evil_pickle(gen, tag: str = "x") -> bytes:  # type: ignore[no-untyped-def]
    return gen.pk(gen.call(gen.G("os", "system"), gen.S(f"echo {tag}")))


def write(tmp_path, name: str, data: bytes):  # type: ignore[no-untyped-def]
    p = tmp_path / name
    p.write_bytes(data)
    return p


def test_duplicate_members_and_which_copy_each_reader_reads(gen, tmp_path, torch):  # type: ignore[no-untyped-def]
    ents = [("archive/data.pkl", benign_pickle(gen)), ("archive/version", b"3\n"), ("archive/data.pkl", evil_pickle(gen))]
    data = gen.raw_zip(ents)
    p = write(tmp_path, "dup.pt", data)
    r = rules(scan(p))
    (dup,) = r["zip-duplicate"]
    chosen = ZipReader(data).lookup("data.pkl")
    # the copy torch reads, checked against torch itself
    torch_reads = torch._C.PyTorchFileReader(io.BytesIO(data)).get_record("data.pkl")
    assert bytes(ZipReader(data).read(chosen)) == bytes(torch_reads)
    assert f"torch reads entry #{chosen.index}" in dup.message
    assert "zipfile reads entry #2" in dup.message  # Python's zipfile: the last one
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        assert z.read("archive/data.pkl") == evil_pickle(gen)
    # the payload is found whichever copy it is in
    assert r["dangerous-global"]


def test_case_variant_member(gen, tmp_path, torch):  # type: ignore[no-untyped-def]
    data = gen.raw_zip([("archive/DATA.PKL", evil_pickle(gen)), ("archive/version", b"3\n")])
    assert bytes(torch._C.PyTorchFileReader(io.BytesIO(data)).get_record("data.pkl")) == evil_pickle(gen)
    r = rules(scan(write(tmp_path, "case.pt", data)))
    assert r["zip-case-variant"] and r["dangerous-global"]


def test_local_central_name_mismatch(gen, tmp_path):  # type: ignore[no-untyped-def]
    data = gen.raw_zip([("archive/data.pkl", benign_pickle(gen))], local_names={0: "archive/other.pk"})
    r = rules(scan(write(tmp_path, "mm.pt", data)))
    (f,) = r["zip-name-mismatch"]
    assert "archive/other.pk" in f.message


def test_crc_mismatch(gen, tmp_path, torch):  # type: ignore[no-untyped-def]
    data = gen.raw_zip([("archive/data.pkl", benign_pickle(gen)), ("archive/version", b"3\n")], bad_crc={0})
    with zipfile.ZipFile(io.BytesIO(data)) as z, pytest.raises(zipfile.BadZipFile):
        z.read("archive/data.pkl")
    assert bytes(torch._C.PyTorchFileReader(io.BytesIO(data)).get_record("data.pkl")) == benign_pickle(gen)
    r = rules(scan(write(tmp_path, "crc.pt", data)))
    assert [f.severity for f in r["zip-crc"]] == ["high"]


def test_crc_zero_is_info_only(gen, tmp_path):  # type: ignore[no-untyped-def]
    data = bytearray(gen.raw_zip([("archive/data.pkl", benign_pickle(gen))]))
    # zero both CRC fields (what compute_crc32=False writes)
    lh = data.index(b"PK\x03\x04")
    data[lh + 14 : lh + 18] = b"\0\0\0\0"
    ch = data.index(b"PK\x01\x02")
    data[ch + 16 : ch + 20] = b"\0\0\0\0"
    rep = scan(write(tmp_path, "crc0.pt", bytes(data)))
    assert rep.clean and [f.severity for f in rep.findings] == ["info"]


def test_encrypted_and_unusual_flags(gen, tmp_path):  # type: ignore[no-untyped-def]
    data = gen.raw_zip([("archive/data.pkl", benign_pickle(gen)), ("archive/x", b"1")], flags={0: 0x1, 1: 0x40})
    r = rules(scan(write(tmp_path, "flags.pt", data)))
    sev = sorted(f.severity for f in r["zip-flags"])
    assert sev == ["high", "low"]


def test_frame_length_lies(gen, tmp_path):  # type: ignore[no-untyped-def]
    body = gen.SB("a") + gen.SB("b") + b"\x86."
    short = b"\x80\x04\x95" + struct.pack("<Q", 3) + body  # frame ends inside an opcode
    ok = b"\x80\x04\x95" + struct.pack("<Q", len(body)) + body
    long_ = b"\x80\x04\x95" + struct.pack("<Q", len(body) + 50) + body
    assert "frame-length" in rules(scan(write(tmp_path, "short.pkl", short)))
    assert "frame-length" not in rules(scan(write(tmp_path, "ok.pkl", ok)))
    assert "frame-length" in rules(scan(write(tmp_path, "long.pkl", long_)))
    # a frame that ends before the opcodes do: the rest runs outside any frame
    early = b"\x80\x04\x95" + struct.pack("<Q", 2) + body
    assert "frame-length" in rules(scan(write(tmp_path, "early.pkl", early)))


def test_opcodes_after_stop(gen, tmp_path):  # type: ignore[no-untyped-def]
    p = write(tmp_path, "two.pkl", benign_pickle(gen) + evil_pickle(gen))
    r = rules(scan(p))
    assert [f.severity for f in r["trailing-data"]] == ["high"]
    assert r["dangerous-global"][0].member == "pickle #2"
    p = write(tmp_path, "junk.pkl", benign_pickle(gen) + b"\xff\xfe not a pickle")
    r = rules(scan(p))
    assert [f.severity for f in r["trailing-data"]] == ["medium"] and "dangerous-global" not in r


def test_trailing_data_after_zip_end(gen, tmp_path):  # type: ignore[no-untyped-def]
    data = gen.raw_zip([("archive/data.pkl", benign_pickle(gen))]) + b"extra bytes"
    # a shifted end record still parses (miniz and zipfile scan the tail)
    r = rules(scan(write(tmp_path, "tail.pt", data)))
    assert "trailing-data" in r or "zip-reader-differential" in r


def test_overlapping_members(gen, tmp_path):  # type: ignore[no-untyped-def]
    payload = benign_pickle(gen)
    lname = b"archive/data.pkl"
    local = (
        struct.pack(
            "<4sHHHHHIIIHH", b"PK\x03\x04", 20, 0, 0, 0, 0, zlib.crc32(payload), len(payload), len(payload), len(lname), 0
        )
        + lname
        + payload
    )
    cd = b""
    for name in (b"archive/data.pkl", b"archive/alias.pkl"):
        cd += (
            struct.pack(
                "<4sHHHHHHIIIHHHHHII",
                b"PK\x01\x02",
                20,
                20,
                0,
                0,
                0,
                0,
                zlib.crc32(payload),
                len(payload),
                len(payload),
                len(name),
                0,
                0,
                0,
                0,
                0,
                0,
            )
            + name
        )
    data = local + cd + struct.pack("<4sHHHHIIH", b"PK\x05\x06", 0, 0, 2, 2, len(cd), len(local), 0)
    r = rules(scan(write(tmp_path, "overlap.pt", data)))
    assert "zip-overlap" in r and "zip-name-mismatch" in r


def test_member_zipfile_reads_but_torch_does_not(gen, tmp_path, torch):  # type: ignore[no-untyped-def]
    data = bytearray(
        gen.raw_zip(
            [("archive/data.pkl", benign_pickle(gen)), ("archive/version", b"3\n"), ("archive/hidden.pkl", evil_pickle(gen))]
        )
    )
    e = data.rindex(b"PK\x05\x06")
    struct.pack_into("<HH", data, e + 8, 2, 2)  # the end record counts two entries; the directory holds three
    data = bytes(data)
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        assert "archive/hidden.pkl" in z.namelist()
    assert "hidden.pkl" not in torch._C.PyTorchFileReader(io.BytesIO(data)).get_all_records()
    r = rules(scan(write(tmp_path, "uncounted.pt", data)))
    assert r["zip-reader-differential"] and r["dangerous-global"]


def test_member_outside_prefix(gen, tmp_path):  # type: ignore[no-untyped-def]
    data = gen.raw_zip([("archive/data.pkl", benign_pickle(gen)), ("other/data.pkl", evil_pickle(gen))])
    r = rules(scan(write(tmp_path, "prefix.pt", data)))
    assert r["zip-reader-differential"] and r["dangerous-global"]


def test_path_traversal(gen, tmp_path):  # type: ignore[no-untyped-def]
    data = gen.raw_zip([("archive/data.pkl", benign_pickle(gen)), ("archive/../../etc/evil", b"x")])
    assert "path-traversal" in rules(scan(write(tmp_path, "trav.zip", data)))


def test_polyglot_pickle_then_zip(gen, tmp_path):  # type: ignore[no-untyped-def]
    z = gen.raw_zip([("archive/data.pkl", benign_pickle(gen))])
    r = rules(scan(write(tmp_path, "poly.pt", evil_pickle(gen) + z)))
    assert r["polyglot"] and r["dangerous-global"]
    # benign head, malicious archive tail: zip tools would read the tail
    z2 = gen.raw_zip([("archive/data.pkl", evil_pickle(gen))])
    r = rules(scan(write(tmp_path, "poly2.pt", benign_pickle(gen) + z2)))
    assert r["polyglot"] and r["dangerous-global"]


def test_hidden_pickle_in_nested_zip(gen, tmp_path):  # type: ignore[no-untyped-def]
    inner = gen.raw_zip([("archive/data.pkl", evil_pickle(gen))])
    outer = gen.raw_zip([("pkg/data/weights/weight_0", inner), ("pkg/archive_format", b"pt2")])
    r = rules(scan(write(tmp_path, "nested.pt2", outer)))
    assert r["dangerous-global"][0].member.startswith("pkg/data/weights/weight_0 > ")
