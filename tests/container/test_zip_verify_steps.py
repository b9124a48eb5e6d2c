"""``ZipReader.verify`` keeps every problem of an archive when the CRC-32 step of one
record fails: a record whose flags ``read`` refuses (encrypted, strong encryption,
compressed patch) is reported as that record's problem, beside a bad CRC-32 found
earlier, instead of an exception that dropped the list (``torchless verify`` printed one
error line and exit 2, without the CRC problem).

torch writes the ``.pt``; Python's zipfile is the oracle for the bad CRC-32 and torch for
the flagged record ("unsupported encryption"/"feature")."""

from __future__ import annotations

import io
import struct
import zipfile

import pytest

import torchless
from torchless.cli.main import main as cli
from torchless.container.zip import ZipReader
from torchless.core.errors import UnsupportedError

torch = pytest.importorskip("torch", reason="torch writes the checkpoint and is the oracle")

FLAGS = {"encrypted": 0x1, "compressed-patch": 0x20, "strong-encryption": 0x40}


def _central(data: bytes) -> dict[str, int]:
    """Offsets of every central directory entry, by name (walked from zipfile's start)."""
    z = zipfile.ZipFile(io.BytesIO(data))
    out, p = {}, z.start_dir
    for _ in z.namelist():
        nlen, xlen, clen = struct.unpack_from("<HHH", data, p + 28)
        out[data[p + 46 : p + 46 + nlen].decode()] = p
        p += 46 + nlen + xlen + clen
    return out


@pytest.fixture(params=sorted(FLAGS))
def damaged(request, tmp_path):
    g = torch.Generator().manual_seed(0)
    path = tmp_path / "m.pt"
    torch.save({"a": torch.randn(64, generator=g), "b": torch.randn(64, generator=g)}, path)
    data = bytearray(path.read_bytes())
    z = zipfile.ZipFile(io.BytesIO(bytes(data)))
    names = z.namelist()
    bad_crc = next(n for n in names if n.endswith("/data/0"))
    flagged = next(n for n in names if n.endswith("/data/1"))
    info = z.getinfo(bad_crc)
    (nlen, xlen) = struct.unpack_from("<HH", data, info.header_offset + 26)
    data[info.header_offset + 30 + nlen + xlen + 9] ^= 0x10  # a payload byte of data/0
    at = _central(bytes(data))[flagged] + 8  # data/1's general-purpose flags
    data[at : at + 2] = struct.pack("<H", struct.unpack_from("<H", data, at)[0] | FLAGS[request.param])
    path.write_bytes(bytes(data))
    return path, bad_crc, flagged


def test_oracles_see_both_problems(damaged):
    path, bad_crc, flagged = damaged
    z = zipfile.ZipFile(path)
    with pytest.raises(zipfile.BadZipFile, match="CRC"):
        z.read(bad_crc)
    with pytest.raises(RuntimeError, match="unsupported (encryption|feature)"):
        torch.load(path, weights_only=True)["b"].sum()


def test_verify_reports_the_crc_problem_and_the_failed_step(damaged, capsys):
    path, bad_crc, flagged = damaged
    with ZipReader(str(path)) as zr:
        probs = zr.verify(crc=True)
        flagged_entry = zr.get(flagged, full=True)
        data_off = zr.data_offset(flagged_entry)
        with pytest.raises(UnsupportedError) as refused:  # what reading the record says
            zr.read(flagged_entry)
    errors = [p for p in probs if p.severity == "error"]
    assert ("crc", bad_crc) in [(p.code, p.member) for p in errors], probs
    step = [p for p in errors if p.member == flagged and p.code == "data"]
    assert len(step) == 1 and step[0].offset == data_off and step[0].message == refused.value.message, probs

    with torchless.open(str(path)) as art:
        codes = {(p.code, p.member) for p in art.verify()}
    assert {("crc", bad_crc), ("data", flagged)} <= codes, codes

    capsys.readouterr()
    assert cli(["verify", str(path)]) == 1
    out = capsys.readouterr()
    lines = out.out.splitlines()
    assert any(ln.startswith("error: crc") and bad_crc in ln for ln in lines), lines
    assert any(ln.startswith("error: data") and flagged in ln and f"@{data_off}" in ln for ln in lines), lines
    assert "Traceback" not in out.err, out.err


@pytest.mark.parametrize("failure", ["store", "os"])
def test_a_failure_that_is_not_the_files_propagates(failure, tmp_path, monkeypatch):
    """A store that fails mid-check (torchless raises UsageError naming the URL) or an
    OS error is no verdict on the file: verify raises it, it is not a record's problem."""
    from torchless.core.errors import UsageError

    path = tmp_path / "ok.pt"
    torch.save({"a": torch.arange(8.0)}, path)

    def fail(self, entry):
        if failure == "store":
            raise UsageError("cannot read this URL: connection reset", path=str(path), offset=0)
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(ZipReader, "crc32", fail)
    with ZipReader(str(path)) as zr, pytest.raises(UsageError if failure == "store" else OSError):
        zr.verify(crc=True)


BIT = {"encrypted": 0, "compressed-patch": 5, "strong-encryption": 6}


def test_each_refused_flag_is_named_for_what_it_is(damaged):
    """The refusal said "encrypted zip records" for the compressed-patch flag (bit 5) too;
    now it names the flag bit set and miniz's own error for it, which torch prints (the
    oracle: "unsupported encryption" for bits 0 and 6, "unsupported feature" for bit 5),
    and the flags word found (read from the file by zipfile)."""
    path, _bad_crc, flagged = damaged
    with pytest.raises(RuntimeError) as torch_err:
        torch.load(path, weights_only=True)["b"].sum()
    import re

    miniz = re.search(r": (unsupported \w+)\.", str(torch_err.value))
    assert miniz, str(torch_err.value)
    flags = zipfile.ZipFile(path).getinfo(flagged).flag_bits
    which = next(name for name, bit in FLAGS.items() if flags & bit)
    with ZipReader(str(path)) as zr, pytest.raises(UnsupportedError) as ei:
        zr.read(zr.get(flagged, full=True))
    msg = ei.value.message
    assert f"flag bit {BIT[which]})" in msg and f"torch: {miniz.group(1)}" in msg, msg
    assert ("encrypt" in msg) == (which != "compressed-patch"), msg
    assert ei.value.found == f"flags {flags:#06x}" and ei.value.member == flagged, str(ei.value)
    with torchless.open(str(path)) as art:
        step = [p for p in art.verify() if (p.code, p.member) == ("data", flagged)]
    assert len(step) == 1 and step[0].message == msg, step
