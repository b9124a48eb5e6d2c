"""Just enough PE/COFF to describe an AOTInductor library built on Windows, never loaded.

On Windows ``AotCodeCompiler`` builds the constants as C++ (``unsigned char
_binary_constants_bin_start[N]``, MSVC name ``?_binary_constants_bin_start@@3PAEA``) into
a ``.obj`` linked into the ``.pyd``/``.dll`` (``codecache.py`` ``_compile_consts``).
torchless reads images (``MZ`` + ``PE\\0\\0``) and COFF object files: the COFF header,
the section table, the COFF symbol table when present (objects, MinGW images), and the
export directory (the ``AOTInductor*`` entry points a DLL exports). A symbol's value is
relative to its section; its file offset is the section's raw data plus the value. Only
the start symbol is defined in the C++ build: the blob then runs to the end of its
section's raw data (the constant table says how much of it the weights use). Every
offset and count is checked against the file first.
"""

from __future__ import annotations

import re
import struct
from typing import Any

from ...core.errors import FormatError, LimitError, TruncatedError
from ...io.source import ByteSource
from .elf import BLOB_END, BLOB_START, ElfInfo, Section, as_source

__all__ = ["is_pe", "parse_pe", "MACHINES"]

MACHINES = {0x14C: "x86", 0x8664: "x86-64", 0xAA64: "arm64", 0x1C4: "arm"}
IMAGE_FILE_DLL = 0x2000
IMAGE_SCN_CNT_UNINITIALIZED_DATA = 0x80
MAX_SECTIONS = 1 << 16
MAX_SYMBOLS = 1 << 24
MAX_EXPORTS = 1 << 20
_COFF = struct.Struct("<HHIIIHH")  # 20 bytes
_SECTION = struct.Struct("<8sIIIIIIHHI")  # 40 bytes
_SYMBOL = struct.Struct("<8sIhHBB")  # 18 bytes
#: ``_binary_constants_bin_start`` as C, Mach-O-style or MSVC-mangled (``?name@@...``)
_BLOB_NAME = re.compile(r"^[?_]?(_binary_constants_bin_(start|end))(@@.*)?$")


def is_pe(data: ByteSource | memoryview | bytes) -> bool:
    """An image (``MZ`` with a ``PE\\0\\0`` header) or a COFF object of a known machine."""
    src = as_source(data, "<so>")
    size = src.size
    if size >= 0x40 and src.read_at(0, 2) == b"MZ":
        (lfanew,) = struct.unpack("<I", src.read_at(0x3C, 4))
        return lfanew + 4 <= size and src.read_at(lfanew, 4) == b"PE\0\0"
    if size >= _COFF.size:
        machine, nsec, _t, _ps, _ns, opt, _c = _COFF.unpack(src.read_at(0, _COFF.size))
        return machine in MACHINES and 0 < nsec < MAX_SECTIONS and opt == 0
    return False


def parse_pe(data: ByteSource | memoryview | bytes, *, name: str = "<so>", member: str | None = None) -> ElfInfo:
    """Header, sections, exports and the constants blob of a PE image or COFF object
    (bytes, or a ByteSource read by ranges: the headers and tables only).

    Raises:
        FormatError: not PE/COFF, or a table outside the file.
        TruncatedError: a header cut short.
        LimitError: absurd counts.
    """
    src = as_source(data, name)
    size = src.size
    where: dict[str, Any] = {"path": name, "member": member}
    image = size >= 2 and src.read_at(0, 2) == b"MZ"
    if image:
        if size < 0x40:
            raise TruncatedError("DOS header cut short", **where)
        (lfanew,) = struct.unpack("<I", src.read_at(0x3C, 4))
        if lfanew + 4 + _COFF.size > size or src.read_at(lfanew, 4) != b"PE\0\0":
            raise FormatError("no PE signature where the DOS header points", offset=0x3C, found=lfanew, **where)
        coff = lfanew + 4
    else:
        coff = 0
        if size < _COFF.size:
            raise TruncatedError("COFF header cut short", **where)
    machine, nsec, _time, symptr, nsyms, optsize, chars = _COFF.unpack(src.read_at(coff, _COFF.size, what="COFF header"))
    if not image and (machine not in MACHINES or optsize != 0):
        raise FormatError("not a PE image or COFF object", found=f"machine {machine:#x}", **where)
    if nsec > MAX_SECTIONS:
        raise LimitError("too many PE sections", expected=f"<= {MAX_SECTIONS}", found=nsec, **where)
    opt = coff + _COFF.size
    bits = 32
    image_base = 0
    export_dir = (0, 0)
    if image:
        if opt + optsize > size or optsize < 2:
            raise FormatError("PE optional header outside the file", offset=opt, **where)
        ohdr = src.view(opt, optsize, what="PE optional header")  # ``x - opt`` indexes it
        (magic,) = struct.unpack_from("<H", ohdr, 0)
        if magic not in (0x10B, 0x20B):
            raise FormatError("bad PE optional header magic", offset=opt, expected="0x10b or 0x20b", found=hex(magic), **where)
        bits = 64 if magic == 0x20B else 32
        nrva_at = opt + (108 if bits == 64 else 92)
        if nrva_at + 4 <= opt + optsize:
            (nrva,) = struct.unpack_from("<I", ohdr, nrva_at - opt)
            if nrva >= 1 and nrva_at + 12 <= opt + optsize:
                export_dir = struct.unpack_from("<II", ohdr, nrva_at - opt + 4)
        base_at, base_fmt = opt + (24 if bits == 64 else 28), "<Q" if bits == 64 else "<I"
        if base_at + struct.calcsize(base_fmt) > size:
            raise TruncatedError("PE optional header cut short", offset=base_at, expected="its ImageBase field", **where)
        (image_base,) = struct.unpack(base_fmt, src.read_at(base_at, struct.calcsize(base_fmt), what="PE optional header"))
    elif machine in (0x8664, 0xAA64):
        bits = 64
    kind = ("shared object" if chars & IMAGE_FILE_DLL else "executable") if image else "relocatable"
    info = ElfInfo(bits, "little", kind, MACHINES.get(machine, f"machine {machine:#x}"), size, container="pe")
    shdr = opt + optsize
    if shdr + nsec * _SECTION.size > size:
        raise FormatError("PE section table lies outside the file", offset=shdr, expected=f"{nsec} x 40 bytes", **where)
    info.end_of_elf = shdr + nsec * _SECTION.size
    strtab = _string_table(src, symptr, nsyms, where)
    table = src.view(shdr, nsec * _SECTION.size, what="PE section table")
    vsizes: list[int] = []
    for i in range(nsec):
        raw_name, vsize, vaddr, rawsize, rawptr, _rel, _ln, _nrel, _nln, schars = _SECTION.unpack_from(table, i * _SECTION.size)
        sname = _section_name(raw_name, strtab)
        vsizes.append(vsize)
        nobits = bool(schars & IMAGE_SCN_CNT_UNINITIALIZED_DATA) or rawptr == 0
        info.sections.append(Section(sname, 8 if nobits else 1, 0x2, vaddr, rawptr, rawsize, 0, 0))
        if not nobits:
            if rawptr + rawsize > size:
                info.problems.append(f"section {sname} ({rawptr}+{rawsize}) runs past the end of the file ({size})")
            else:
                info.end_of_elf = max(info.end_of_elf, rawptr + rawsize)
    found: dict[str, tuple[int, int]] = {}  # blob symbol -> (section index, value)
    if symptr and nsyms:
        info.end_of_elf = max(info.end_of_elf, symptr + nsyms * _SYMBOL.size + (len(strtab) if strtab else 4))
        symbols = src.view(symptr, nsyms * _SYMBOL.size, what="COFF symbol table")
        for k in range(nsyms):
            raw_name, value, secnum, _typ, _cls, _naux = _SYMBOL.unpack_from(symbols, k * _SYMBOL.size)
            if secnum <= 0 or secnum > nsec:
                continue
            sym = _symbol_name(raw_name, strtab)
            m = _BLOB_NAME.match(sym)
            if m:
                found.setdefault(m.group(1), (secnum - 1, value))
            elif sym.lstrip("_").startswith("AOTInductor"):
                info.exports.append(sym.lstrip("_"))
    if export_dir[0] and export_dir[1]:
        info.exports += _exports(info, src, export_dir[0], where)
    info.exports = sorted(set(info.exports))
    for key, (sec_i, value) in found.items():
        info.symbols[key] = info.sections[sec_i].addr + value + image_base
    start = found.get(BLOB_START)
    if start is not None:
        sec = info.sections[start[0]]
        off = sec.offset + start[1]
        stop = found.get(BLOB_END)
        if sec.type == 8 or start[1] > sec.size or off > size:
            info.problems.append("the constants blob symbols point outside the file's data")
        elif stop is not None and stop[0] == start[0] and stop[1] >= start[1]:
            info.blob = (off, stop[1] - start[1])
        elif stop is None:
            used = min(vsizes[start[0]] or sec.size, sec.size, size - sec.offset)  # VirtualSize: the data without file padding
            info.blob = (off, max(0, used - start[1]))
            info.notes.append(
                "only the constants blob's start symbol is defined (C++ build): the blob runs to the end of its section"
            )
        else:
            info.problems.append("the constants blob symbols are in different sections")
    return info


def _string_table(src: ByteSource, symptr: int, nsyms: int, where: dict[str, Any]) -> bytes:
    if not symptr or not nsyms:
        return b""
    if nsyms > MAX_SYMBOLS:
        raise LimitError("too many COFF symbols", expected=f"<= {MAX_SYMBOLS}", found=nsyms, **where)
    at = symptr + nsyms * _SYMBOL.size
    if at + 4 > src.size:
        raise FormatError("COFF symbol table lies outside the file", offset=symptr, **where)
    (n,) = struct.unpack("<I", src.read_at(at, 4, what="COFF string table size"))
    if n < 4 or at + n > src.size:
        raise FormatError("COFF string table lies outside the file", offset=at, found=n, **where)
    return src.read_at(at, n, what="COFF string table")


def _cstr(table: bytes, off: int) -> str:
    if off < 4 or off >= len(table):
        return ""
    end = table.find(b"\0", off)
    return table[off : end if end >= 0 else len(table)].decode("utf-8", "replace")


def _section_name(raw: bytes, strtab: bytes) -> str:
    text = raw.split(b"\0", 1)[0].decode("utf-8", "replace")
    if text.startswith("/") and text[1:].isdigit():
        return _cstr(strtab, int(text[1:])) or text
    return text


def _symbol_name(raw: bytes, strtab: bytes) -> str:
    if raw[:4] == b"\0\0\0\0":
        return _cstr(strtab, struct.unpack_from("<I", raw, 4)[0])
    return raw.split(b"\0", 1)[0].decode("utf-8", "replace")


def _rva_to_offset(info: ElfInfo, rva: int) -> int | None:
    for s in info.sections:
        if s.type != 8 and s.addr <= rva < s.addr + s.size:
            return s.offset + (rva - s.addr)
    return None


def _exports(info: ElfInfo, src: ByteSource, rva: int, where: dict[str, Any]) -> list[str]:
    """Names in the export directory (``IMAGE_EXPORT_DIRECTORY``) that start with
    ``AOTInductor``."""
    off = _rva_to_offset(info, rva)
    if off is None or off + 40 > src.size:
        info.problems.append("the export directory lies outside the file's sections")
        return []
    edir = src.view(off, 40, what="PE export directory")
    nnames, names_rva = struct.unpack_from("<I", edir, 24)[0], struct.unpack_from("<I", edir, 32)[0]
    if nnames > MAX_EXPORTS:
        raise LimitError("too many PE exports", expected=f"<= {MAX_EXPORTS}", found=nnames, **where)
    if not nnames:
        return []
    table = _rva_to_offset(info, names_rva)
    if table is None or table + 4 * nnames > src.size:
        info.problems.append("the export name table lies outside the file's sections")
        return []
    rvas = src.view(table, 4 * nnames, what="PE export name table")
    out = []
    for i in range(nnames):
        (nrva,) = struct.unpack_from("<I", rvas, 4 * i)
        p = _rva_to_offset(info, nrva)
        if p is None or p >= src.size:
            continue
        raw = src.read_at(p, min(256, src.size - p), what="PE export name")
        sym = raw.split(b"\0", 1)[0].decode("utf-8", "replace")
        if sym.startswith("AOTInductor"):
            out.append(sym)
    return out
