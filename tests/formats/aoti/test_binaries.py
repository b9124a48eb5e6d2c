"""AOTInductor libraries built on macOS (Mach-O) and Windows (PE/COFF): parsed as bytes,
never loaded; the constants blob found between the same symbols AotCodeCompiler emits
there, and the weights extracted through the package reader exactly as for ELF."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

import torchless
from torchless.core.errors import FormatError, LimitError, TorchlessError, TruncatedError
from torchless.formats.aoti.binary import parse_binary
from torchless.formats.aoti.macho import parse_macho
from torchless.formats.aoti.pe import parse_pe
from torchless.io.source import BytesSource

from .synth import STEM, blob, make_elf, make_package, sample_consts
from .synth_bin import EXPORTS, make_coff, make_macho, make_pe

D = "data/aotinductor/model/"
PAYLOAD = bytes(range(256)) * 3


@pytest.mark.parametrize("kw", [{}, {"big_endian": True}, {"fat": True}, {"relocatable": True}])
def test_macho_blob_and_exports(kw):
    raw = make_macho(PAYLOAD, **kw)
    info = parse_binary(raw)
    assert info.container == "macho" and info.bits == 64
    assert info.type == ("relocatable" if kw.get("relocatable") else "shared object")
    off, n = info.blob
    assert raw[off : off + n] == PAYLOAD
    assert info.exports == sorted(EXPORTS)
    assert info.to_dict()["binary"].startswith("Mach-O 64-bit")


@pytest.mark.parametrize("end_symbol", [False, True])
def test_pe_dll_blob_and_exports(end_symbol):
    raw = make_pe(PAYLOAD, end_symbol=end_symbol)
    info = parse_binary(raw)
    assert info.container == "pe" and info.type == "shared object" and info.machine == "x86-64"
    off, n = info.blob
    assert raw[off : off + len(PAYLOAD)] == PAYLOAD
    assert n == len(PAYLOAD) if end_symbol else n >= len(PAYLOAD)
    assert info.exports == sorted(EXPORTS)


def test_coff_object_blob():
    raw = make_coff(PAYLOAD)
    info = parse_binary(raw)
    assert info.type == "relocatable" and raw[info.blob[0] : info.blob[0] + info.blob[1]] == PAYLOAD


def _consts_equal(path: Path, consts) -> None:
    with torchless.open(path) as art:
        got = dict(art.tensors())
        assert set(got) == set(consts)
        for k, v in consts.items():
            assert got[k].numpy().tobytes() == np.ascontiguousarray(v).tobytes(), k
        assert art.verify() == []


@pytest.mark.parametrize(
    "lib, data",
    [
        (f"{STEM}.wrapper.so", lambda b: make_macho(b)),  # macOS: .so, Mach-O
        (f"{STEM}.wrapper.so", lambda b: make_macho(b, fat=True)),
        (f"{STEM}.wrapper.pyd", lambda b: make_pe(b)),  # Windows: .pyd, PE DLL
        (f"{STEM}.wrapper.pyd", lambda b: make_pe(b, end_symbol=True)),
    ],
)
def test_packages_with_foreign_libraries(tmp_path, lib, data):
    consts = sample_consts()
    p = make_package(tmp_path / "pkg.pt2", consts, layout="none", extra={D + lib: data(blob(consts))})
    _consts_equal(p, consts)
    info = torchless.open(p).info()
    assert "embedded" in str(info)


def test_cpp_only_package_with_coff_object(tmp_path):
    consts = sample_consts()
    p = make_package(
        tmp_path / "pkg.pt2",
        consts,
        layout="none",
        extra={D + "cbbb.weights.obj": make_coff(blob(consts)), D + "CMakeLists.txt": b""},
    )
    _consts_equal(p, consts)


# -- hostile ----------------------------------------------------------------------------


def _flip(raw: bytes, at: int, fmt: str, value: int) -> bytes:
    b = bytearray(raw)
    struct.pack_into(fmt, b, at, value)
    return bytes(b)


def test_macho_hostile():
    raw = make_macho(PAYLOAD)
    with pytest.raises(TruncatedError):
        parse_macho(raw[:20])
    with pytest.raises(FormatError):
        parse_macho(_flip(raw, 20, "<I", 1 << 30))  # sizeofcmds past the end
    with pytest.raises(LimitError):
        parse_macho(_flip(raw, 16, "<I", 1 << 20))  # ncmds
    with pytest.raises(FormatError):
        parse_macho(_flip(raw, 32 + 4, "<I", 4))  # a load command smaller than its header
    sym_cmd = 32 + 152
    with pytest.raises(FormatError):
        parse_macho(_flip(raw, sym_cmd + 8, "<I", len(raw)))  # symbol table past the end
    with pytest.raises(LimitError):
        parse_macho(_flip(raw, sym_cmd + 12, "<I", 1 << 30))
    # the blob symbols point outside every section: reported, no blob
    sec_addr = 32 + 72 + 32
    info = parse_macho(_flip(_flip(raw, sec_addr, "<Q", 0x900000), 32 + 8 + 16, "<Q", 0x900000))  # section and segment
    assert info.blob is None and any("outside" in p for p in info.problems)
    with pytest.raises(FormatError):
        parse_macho(b"\xca\xfe\xba\xbe" + struct.pack(">I", 1000) + b"\0" * 40)


def test_pe_hostile():
    raw = make_pe(PAYLOAD)
    with pytest.raises(FormatError):
        parse_pe(_flip(raw, 0x3C, "<I", len(raw) + 10))  # e_lfanew past the end
    with pytest.raises(LimitError):
        parse_pe(_flip(raw, 0x46, "<H", 0xFFFF) if False else _flip(raw, 0x44 + 12, "<I", 1 << 30))  # symbol count
    with pytest.raises(FormatError):
        parse_pe(_flip(raw, 0x58, "<H", 0x999))  # optional header magic
    with pytest.raises(FormatError):
        parse_pe(_flip(raw, 0x44 + 2, "<H", 5000))  # sections past the end
    info = parse_pe(_flip(raw, 0x58 + 112, "<I", 0x7FFF0000))  # export directory outside every section
    assert any("export" in p for p in info.problems) and info.exports == []
    with pytest.raises(FormatError):
        parse_binary(b"\0" * 64)
    for cut in (10, 100, 400):
        try:
            parse_binary(raw[:cut])
        except TorchlessError:
            pass


def test_package_with_corrupt_foreign_library_reports(tmp_path):
    consts = sample_consts()
    bad = make_macho(blob(consts))[:100]
    p = make_package(tmp_path / "pkg.pt2", consts, layout="none", extra={D + f"{STEM}.wrapper.so": bad})
    with torchless.open(p) as art:
        assert list(art.tensors()) == []
        assert "Mach-O" in str(art.info())


class _Counting(BytesSource):
    """Bytes in memory that record every range a parser asks for."""

    def __init__(self, data: bytes) -> None:
        super().__init__(data, "lib")
        self.ranges: list[tuple[int, int]] = []

    def view(self, offset: int, length: int, *, what: str = "data") -> memoryview:
        self.ranges.append((offset, length))
        return super().view(offset, length, what=what)

    def read_at(self, offset: int, length: int, *, what: str = "data") -> bytes:
        self.ranges.append((offset, length))
        return super().read_at(offset, length, what=what)


@pytest.mark.parametrize(
    "make",
    [
        make_elf,
        lambda b: make_elf(b, relocatable=True),
        make_macho,
        lambda b: make_macho(b, fat=True),
        make_pe,
        make_coff,
    ],
)
def test_parsers_read_tables_not_payload(make):
    """Over a byte source the parsers ask for the headers and tables only: never a byte of
    the constants (what lets a remote binary be read by ranges), and the facts are those
    of the same bytes in memory."""
    payload = bytes(range(256)) * (1 << 12)  # 1 MiB
    raw = make(payload)
    src = _Counting(raw)
    info = parse_binary(src)
    assert info.to_dict() == parse_binary(raw).to_dict() and info.blob is not None
    off, n = info.blob
    assert raw[off : off + len(payload)] == payload
    assert sum(length for _o, length in src.ranges) < 8192, src.ranges
    assert all(o + length <= off or o >= off + len(payload) for o, length in src.ranges), src.ranges
