"""Just enough Mach-O to describe an AOTInductor shared object built on macOS, never loaded.

On macOS ``AotCodeCompiler`` links the constants into ``__DATA,__data`` between the
symbols ``__binary_constants_bin_start`` and ``__binary_constants_bin_end`` (the C names
with Mach-O's leading underscore; ``codecache.py`` ``_compile_consts``). torchless reads
the header (thin 32/64-bit, either byte order; a universal binary's first slice), the
load commands (``LC_SEGMENT``/``LC_SEGMENT_64`` with their sections, ``LC_SYMTAB``),
the symbol table, and maps the symbols' addresses to file offsets through the section
holding them. Every offset and count is checked against the file first.
"""

from __future__ import annotations

import struct
from typing import Any

from ...core.errors import FormatError, LimitError, TruncatedError
from ...io.source import ByteSource, SliceSource
from .elf import BLOB_END, BLOB_START, ElfInfo, Section, as_source

__all__ = ["is_macho", "parse_macho", "MAGICS"]

#: magic (as read little-endian) -> (bits, struct byte order)
MAGICS = {0xFEEDFACE: (32, "<"), 0xFEEDFACF: (64, "<"), 0xCEFAEDFE: (32, ">"), 0xCFFAEDFE: (64, ">")}
FAT_MAGIC = b"\xca\xfe\xba\xbe"
LC_SEGMENT, LC_SYMTAB, LC_SEGMENT_64 = 0x1, 0x2, 0x19
N_EXT, N_TYPE, N_SECT = 0x01, 0x0E, 0x0E
FILETYPES = {1: "relocatable", 2: "executable", 6: "shared object", 8: "bundle"}
CPUS = {7: "x86", 0x01000007: "x86-64", 12: "arm", 0x0100000C: "arm64", 0x0200000C: "arm64_32"}
MAX_COMMANDS = 1 << 16
MAX_SYMBOLS = 1 << 24
MAX_FAT_ARCHS = 64


def is_macho(head: bytes) -> bool:
    """A thin Mach-O magic, or a universal (fat) binary header."""
    if len(head) < 4:
        return False
    return struct.unpack("<I", head[:4])[0] in MAGICS or head[:4] == FAT_MAGIC


def _name(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode("utf-8", "replace")


def parse_macho(data: ByteSource | memoryview | bytes, *, name: str = "<so>", member: str | None = None) -> ElfInfo:
    """Header, sections, AOTI exports and the constants blob of a Mach-O file (bytes, or
    a ByteSource read by ranges: the headers, load commands and symbol tables only).

    Raises:
        FormatError: not Mach-O, or a table outside the file.
        TruncatedError: the header cut short.
        LimitError: absurd counts.
    """
    src = as_source(data, name)
    size = src.size
    where: dict[str, Any] = {"path": name, "member": member}
    base = 0
    note = None
    if src.read_at(0, min(size, 4), what="Mach-O magic") == FAT_MAGIC:
        # universal binary: big-endian fat header, first slice
        if size < 8:
            raise TruncatedError("Mach-O universal header cut short", **where)
        (nfat,) = struct.unpack(">I", src.read_at(4, 4, what="Mach-O universal header"))
        if not 0 < nfat <= MAX_FAT_ARCHS or 8 + 20 * nfat > size:
            raise FormatError("bad Mach-O universal header", offset=4, found=f"{nfat} architectures", **where)
        _cpu, _sub, off, ln, _align = struct.unpack(">iiIII", src.read_at(8, 20, what="Mach-O universal header"))
        if off + ln > size or ln < 28:
            raise FormatError("Mach-O universal slice lies outside the file", offset=8, **where)
        base, src = off, SliceSource(src, off, ln, name=src.name)
        note = f"universal binary with {nfat} slices: the first was read"
        size = src.size
    if size < 28:
        raise TruncatedError("Mach-O header cut short", expected=">= 28 bytes", found=f"{size} bytes", **where)
    head = src.view(0, min(size, 32), what="Mach-O header")
    magic = struct.unpack_from("<I", head, 0)[0]
    if magic not in MAGICS:
        raise FormatError("not a Mach-O file", expected="a Mach-O magic", found=hex(magic), **where)
    bits, e = MAGICS[magic]
    hsize = 32 if bits == 64 else 28
    if size < hsize:
        raise TruncatedError("Mach-O header cut short", expected=f">= {hsize} bytes", found=f"{size} bytes", **where)
    _m, cputype, _sub, filetype, ncmds, sizeofcmds, _flags = struct.unpack_from(e + "IiiIIII", head, 0)
    info = ElfInfo(
        bits,
        "little" if e == "<" else "big",
        FILETYPES.get(filetype, f"filetype {filetype}"),
        CPUS.get(cputype, f"cpu {cputype:#x}"),
        size,
        container="macho",
    )
    if note:
        info.notes.append(note)
    if ncmds > MAX_COMMANDS:
        raise LimitError("too many Mach-O load commands", expected=f"<= {MAX_COMMANDS}", found=ncmds, **where)
    if hsize + sizeofcmds > size:
        raise FormatError(
            "Mach-O load commands run past the end of the file",
            offset=hsize,
            expected=f"{sizeofcmds} bytes",
            found=f"{size - hsize}",
            **where,
        )
    info.end_of_elf = hsize + sizeofcmds
    cmds = src.view(hsize, sizeofcmds, what="Mach-O load commands")  # one range; ``pos - hsize`` indexes it
    segments: list[tuple[int, int, int]] = []  # (vmaddr, fileoff, filesize)
    symtab = None
    pos, end = hsize, hsize + sizeofcmds
    for i in range(ncmds):
        if pos + 8 > end:
            raise FormatError("Mach-O load command outside the command area", offset=base + pos, found=f"command {i}", **where)
        cmd, cmdsize = struct.unpack_from(e + "II", cmds, pos - hsize)
        if cmdsize < 8 or pos + cmdsize > end:
            raise FormatError("bad Mach-O load command size", offset=base + pos, found=cmdsize, **where)
        if cmd in (LC_SEGMENT, LC_SEGMENT_64):
            is64 = cmd == LC_SEGMENT_64
            seg = struct.Struct(e + ("16sQQQQiiII" if is64 else "16sIIIIiiII"))
            sec = struct.Struct(e + ("16s16sQQIIIIIIII" if is64 else "16s16sIIIIIIIII"))
            if seg.size > cmdsize - 8:
                raise FormatError("Mach-O segment command too short", offset=base + pos, **where)
            _sn, vmaddr, _vmsize, fileoff, filesize, _mp, _ip, nsects, _fl = seg.unpack_from(cmds, pos - hsize + 8)
            if 8 + seg.size + nsects * sec.size > cmdsize:
                raise FormatError(
                    "Mach-O segment's sections run past its command", offset=base + pos, found=f"{nsects} sections", **where
                )
            segments.append((vmaddr, fileoff, filesize))
            if fileoff + filesize > size:
                info.problems.append(f"segment {_name(_sn)} ({fileoff}+{filesize}) runs past the end of the file")
            else:
                info.end_of_elf = max(info.end_of_elf, fileoff + filesize)
            for j in range(nsects):
                f = sec.unpack_from(cmds, pos - hsize + 8 + seg.size + j * sec.size)
                sectname, segname, addr, ssize, offset = f[0], f[1], f[2], f[3], f[4]
                stype = f[8] & 0xFF
                zerofill = stype in (0x1, 0xC, 0x12)  # S_ZEROFILL, S_GB_ZEROFILL, S_THREAD_LOCAL_ZEROFILL
                info.sections.append(
                    Section(f"{_name(segname)},{_name(sectname)}", 8 if zerofill else 1, 0x2, addr, offset, ssize, 0, 0)
                )
                if not zerofill and offset + ssize > size:
                    info.problems.append(
                        f"section {_name(segname)},{_name(sectname)} ({offset}+{ssize}) runs past the end of the file ({size})"
                    )
                elif not zerofill:
                    info.end_of_elf = max(info.end_of_elf, offset + ssize)
        elif cmd == LC_SYMTAB:
            if cmdsize < 24:
                raise FormatError("Mach-O LC_SYMTAB too short", offset=base + pos, **where)
            symtab = struct.unpack_from(e + "IIII", cmds, pos - hsize + 8)
        pos += cmdsize
    if symtab is not None:
        _symbols(info, src, e, bits, symtab, where)
    start, stop = info.symbols.get(BLOB_START), info.symbols.get(BLOB_END)
    if start is not None and stop is not None and stop >= start:
        off = _vaddr_to_offset(info, segments, start)
        if off is None or off + (stop - start) > size:
            info.problems.append("the constants blob symbols point outside the file's data")
        else:
            info.blob = (base + off, stop - start)
    return info


def _symbols(info: ElfInfo, src: ByteSource, e: str, bits: int, symtab: tuple[int, int, int, int], where: dict[str, Any]) -> None:
    symoff, nsyms, stroff, strsize = symtab
    size = src.size
    ent = struct.Struct(e + ("IBBHQ" if bits == 64 else "IBBHI"))
    if nsyms > MAX_SYMBOLS:
        raise LimitError("too many Mach-O symbols", expected=f"<= {MAX_SYMBOLS}", found=nsyms, **where)
    if symoff + nsyms * ent.size > size or stroff + strsize > size:
        raise FormatError("Mach-O symbol or string table lies outside the file", offset=symoff, **where)
    info.end_of_elf = max(info.end_of_elf, symoff + nsyms * ent.size, stroff + strsize)
    strtab = src.read_at(stroff, strsize, what="Mach-O string table")
    table = src.view(symoff, nsyms * ent.size, what="Mach-O symbol table")
    wanted = {f"_{BLOB_START}": BLOB_START, f"_{BLOB_END}": BLOB_END, BLOB_START: BLOB_START, BLOB_END: BLOB_END}
    exports = set()
    for k in range(nsyms):
        strx, ntype, nsect, _desc, value = ent.unpack_from(table, k * ent.size)
        if ntype & N_TYPE != N_SECT or nsect == 0 or strx >= len(strtab):
            continue
        endx = strtab.find(b"\0", strx)
        sym = strtab[strx : endx if endx >= 0 else len(strtab)].decode("utf-8", "replace")
        if sym in wanted:
            info.symbols.setdefault(wanted[sym], value)
        elif ntype & N_EXT and sym.startswith("_AOTInductor"):
            exports.add(sym[1:])
    info.exports = sorted(exports)


def _vaddr_to_offset(info: ElfInfo, segments: list[tuple[int, int, int]], vaddr: int) -> int | None:
    for s in info.sections:
        if s.type != 8 and s.addr <= vaddr < s.addr + s.size:
            return s.offset + (vaddr - s.addr)
    for s in info.sections:  # an empty blob at the very end of its section
        if s.type != 8 and vaddr == s.addr + s.size:
            return s.offset + s.size
    for va, off, filesz in segments:
        if va <= vaddr < va + filesz:
            return off + (vaddr - va)
    return None
