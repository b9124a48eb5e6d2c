"""Just enough ELF to describe an AOTInductor ``wrapper.so`` without loading it.

The shared object is never opened with ``dlopen``/``ctypes``: it is parsed as bytes. What
torchless reads from it:

* the header (class, byte order, type, machine) and the section table, bounds-checked
  against the file (a sanity check: a truncated or corrupt ``.so`` is reported);
* exported ``AOTInductor*`` entry points (from ``.dynsym``);
* the constants blob that ``AotCodeCompiler`` links in between the symbols
  ``_binary_constants_bin_start`` and ``_binary_constants_bin_end`` (spec ``aoti.md`` §1.2):
  the symbol values are virtual addresses, mapped to file offsets through the section
  (or, failing that, the ``PT_LOAD`` segment) that contains them.

The parsers (this one, :mod:`.macho` and :mod:`.pe`) read through a
:class:`~torchless.io.source.ByteSource`, each table by its own range after checking it
against the file: the header, the program and section header tables, the section-name
table, the symbol tables and their string tables; never the code or the constants. A
shared object in a remote archive is therefore read by ranges (a stored record's
:class:`~torchless.io.source.SliceSource`), a local one through the file mapping.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...core.errors import FormatError, LimitError, TruncatedError, Where
from ...io.source import ByteSource, BytesSource

__all__ = ["ElfInfo", "Section", "as_source", "parse_elf", "is_elf", "MACHINES"]

ELF_MAGIC = b"\x7fELF"
SHT_SYMTAB = 2
SHT_NOBITS = 8
SHT_DYNSYM = 11
SHF_ALLOC = 0x2
PT_LOAD = 1
SHN_UNDEF = 0
MAX_SECTIONS = 1 << 16
MAX_SYMBOLS = 1 << 24

MACHINES = {3: "x86", 40: "arm", 62: "x86-64", 183: "aarch64", 243: "riscv", 21: "ppc64", 22: "s390"}
TYPES = {1: "relocatable", 2: "executable", 3: "shared object", 4: "core"}


def is_elf(head: bytes | memoryview) -> bool:
    return bytes(head[:4]) == ELF_MAGIC


@dataclass
class Section:
    name: str
    type: int
    flags: int
    addr: int
    offset: int
    size: int
    link: int
    entsize: int


@dataclass
class ElfInfo:
    """What :func:`parse_elf` found.

    Attributes:
        bits: 32 or 64.
        byteorder: ``"little"`` or ``"big"``.
        type: ``"shared object"``, ...
        machine: ``"x86-64"``, ``"aarch64"`` ... (or the number).
        sections: the section table.
        exports: defined ``AOTInductor*`` symbols from ``.dynsym``.
        symbols: addresses of the constants-blob symbols that were found.
        blob: ``(file offset, length)`` of the constants blob, when both symbols resolve.
        end_of_elf: the end of the last section or table; bytes after it were appended.
        problems: findings that do not stop the parse (messages).
    """

    bits: int
    byteorder: str
    type: str
    machine: str
    size: int
    sections: list[Section] = field(default_factory=list)
    segments: list[tuple[int, int, int, int]] = field(default_factory=list)  # (offset, vaddr, filesz, memsz)
    exports: list[str] = field(default_factory=list)
    symbols: dict[str, int] = field(default_factory=dict)
    rel_symbols: dict[str, tuple[int, int]] = field(default_factory=dict)  # object files: (section, value)
    blob: tuple[int, int] | None = None
    end_of_elf: int = 0
    problems: list[str] = field(default_factory=list)
    #: the container: ``"elf"``, ``"macho"`` or ``"pe"`` (formats/aoti/macho.py, pe.py)
    container: str = "elf"
    #: facts worth showing that are not problems (a universal binary's slice, a start-only blob)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        if self.container != "elf":
            names = {"macho": "Mach-O", "pe": "PE/COFF"}
            return {
                "binary": (
                    f"{names.get(self.container, self.container)} {self.bits}-bit "
                    f"{self.byteorder}-endian {self.type}, {self.machine}"
                ),
                "sections": len(self.sections),
                "aoti_exports": len(self.exports),
                "constants_blob": None if self.blob is None else {"file_offset": self.blob[0], "size": self.blob[1]},
                "appended_bytes": max(0, self.size - self.end_of_elf),
                "problems": list(self.problems),
                "notes": list(self.notes),
            }
        return {
            "elf": f"ELF{self.bits} {self.byteorder}-endian {self.type}, {self.machine}",
            "sections": len(self.sections),
            "aoti_exports": len(self.exports),
            "constants_blob": None if self.blob is None else {"file_offset": self.blob[0], "size": self.blob[1]},
            "appended_bytes": max(0, self.size - self.end_of_elf),
            "problems": list(self.problems),
        }


def as_source(data: ByteSource | memoryview | bytes, name: str) -> ByteSource:
    """``data`` as a ByteSource (bytes in memory are wrapped, no copy)."""
    return data if isinstance(data, ByteSource) else BytesSource(data, name)


def _cstr(table: memoryview, off: int) -> bytes:
    if off < 0 or off >= len(table):
        return b""
    raw = bytes(table[off : off + 4096])
    end = raw.find(b"\0")
    return raw if end < 0 else raw[:end]


def parse_elf(data: ByteSource | memoryview | bytes, *, name: str = "<so>", member: str | None = None) -> ElfInfo:
    """Parse the ELF header, sections and the symbols torchless cares about.

    Args:
        data: the file: bytes, or a ByteSource read by ranges (a record of a remote
            archive: only the header, the tables and the symbols' strings are read).
        name: the path used in errors; ``member`` the archive member.

    Raises:
        FormatError: not ELF, or a header/table outside the file.
        TruncatedError: the header itself is cut short.
    """
    src = as_source(data, name)
    size = src.size
    where: Where = {"path": name, "member": member}
    head = src.view(0, min(size, 64), what="ELF header")
    if size < 16 or bytes(head[:4]) != ELF_MAGIC:
        raise FormatError("not an ELF file", expected="\\x7fELF", found=repr(bytes(head[:4])), **where)
    cls, data_enc = head[4], head[5]
    if cls not in (1, 2) or data_enc not in (1, 2):
        raise FormatError("bad ELF class or data encoding", offset=4, found=f"class={cls} data={data_enc}", **where)
    bits = 64 if cls == 2 else 32
    e = "<" if data_enc == 1 else ">"
    hdr = struct.Struct(e + ("16sHHIQQQIHHHHHH" if bits == 64 else "16sHHIIIIIHHHHHH"))
    if size < hdr.size:
        raise TruncatedError("ELF header cut short", expected=f"{hdr.size} bytes", found=f"{size} bytes", **where)
    (_id, e_type, e_machine, _ver, _entry, phoff, shoff, _flags, _ehsize, phentsize, phnum, shentsize, shnum, shstrndx) = (
        hdr.unpack_from(head, 0)
    )
    info = ElfInfo(
        bits,
        "little" if e == "<" else "big",
        TYPES.get(e_type, f"type {e_type}"),
        MACHINES.get(e_machine, f"machine {e_machine}"),
        size,
    )
    info.end_of_elf = hdr.size

    # program headers (segments) ------------------------------------------------------
    ph = struct.Struct(e + ("IIQQQQQQ" if bits == 64 else "IIIIIIII"))
    if phnum:
        if phentsize < ph.size or phoff + phnum * phentsize > size:
            raise FormatError("ELF program header table lies outside the file", offset=phoff, **where)
        table = src.view(phoff, phnum * phentsize, what="ELF program header table")
        for i in range(phnum):
            f = ph.unpack_from(table, i * phentsize)
            if bits == 64:
                p_type, _pf, p_off, p_vaddr, _pa, p_filesz, p_memsz, _al = f
            else:
                p_type, p_off, p_vaddr, _pa, p_filesz, p_memsz, _pf, _al = f
            if p_type == PT_LOAD:
                info.segments.append((p_off, p_vaddr, p_filesz, p_memsz))
                if p_off + p_filesz > size:
                    info.problems.append(f"PT_LOAD segment {i} runs past the end of the file")
                info.end_of_elf = max(info.end_of_elf, min(size, p_off + p_filesz))
        info.end_of_elf = max(info.end_of_elf, phoff + phnum * phentsize)

    # sections ---------------------------------------------------------------------------
    sh = struct.Struct(e + ("IIQQQQIIQQ" if bits == 64 else "IIIIIIIIII"))
    if shnum > MAX_SECTIONS:
        raise LimitError("too many ELF sections", expected=f"<= {MAX_SECTIONS}", found=shnum, **where)
    if shnum:
        if shentsize < sh.size or shoff + shnum * shentsize > size:
            raise FormatError(
                "ELF section header table lies outside the file",
                offset=shoff,
                expected=f"{shnum} x {shentsize} bytes",
                found=f"{size} bytes in file",
                **where,
            )
        table = src.view(shoff, shnum * shentsize, what="ELF section header table")
        raw: list[tuple[int, ...]] = [sh.unpack_from(table, i * shentsize) for i in range(shnum)]
        info.end_of_elf = max(info.end_of_elf, shoff + shnum * shentsize)
        names = memoryview(b"")
        if 0 < shstrndx < shnum:
            s = raw[shstrndx]
            if s[4] + s[5] <= size:
                names = src.view(s[4], s[5], what="ELF section-name table")
        for i, s in enumerate(raw):
            s_name, s_type, s_flags, s_addr, s_off, s_size, s_link, _s_info, _s_align, s_entsize = s
            sec = Section(
                _cstr(names, s_name).decode("utf-8", "replace"), s_type, s_flags, s_addr, s_off, s_size, s_link, s_entsize
            )
            info.sections.append(sec)
            if s_type != SHT_NOBITS and i:
                if s_off + s_size > size:
                    info.problems.append(f"section {sec.name or i} ({s_off}+{s_size}) runs past the end of the file ({size})")
                else:
                    info.end_of_elf = max(info.end_of_elf, s_off + s_size)
        _read_symbols(info, src, e)
    start = info.symbols.get(BLOB_START)
    end = info.symbols.get(BLOB_END)
    if info.type == "relocatable":
        rs, re_ = info.rel_symbols.get(BLOB_START), info.rel_symbols.get(BLOB_END)
        if rs is not None and re_ is not None and rs[0] == re_[0] and re_[1] >= rs[1]:
            sec = info.sections[rs[0]]
            if sec.type != SHT_NOBITS and sec.offset + re_[1] <= size:
                info.blob = (sec.offset + rs[1], re_[1] - rs[1])
            else:
                info.problems.append("the constants blob symbols point outside the file's data")
    elif start is not None and end is not None and end >= start:
        off = vaddr_to_offset(info, start)
        if off is None or off + (end - start) > size:
            info.problems.append("the constants blob symbols point outside the file's data")
        else:
            info.blob = (off, end - start)
    return info


BLOB_START = "_binary_constants_bin_start"
BLOB_END = "_binary_constants_bin_end"


def _sym_dtype(bits: int, e: str) -> np.dtype:
    if bits == 64:
        return np.dtype(
            [("name", e + "u4"), ("info", "u1"), ("other", "u1"), ("shndx", e + "u2"), ("value", e + "u8"), ("size", e + "u8")]
        )
    return np.dtype(
        [("name", e + "u4"), ("value", e + "u4"), ("size", e + "u4"), ("info", "u1"), ("other", "u1"), ("shndx", e + "u2")]
    )


def _read_symbols(info: ElfInfo, src: ByteSource, e: str) -> None:
    dt = _sym_dtype(info.bits, e)
    size = src.size
    wanted = {BLOB_START.encode(), BLOB_END.encode()}
    found = info.rel_symbols if info.type == "relocatable" else info.symbols
    for sec in info.sections:
        if sec.type not in (SHT_SYMTAB, SHT_DYNSYM) or sec.offset + sec.size > size:
            continue
        if not (0 <= sec.link < len(info.sections)):
            continue
        strsec = info.sections[sec.link]
        if strsec.offset + strsec.size > size:
            continue
        count = sec.size // dt.itemsize
        if count > MAX_SYMBOLS:
            info.problems.append(f"symbol table {sec.name} has {count} entries; only the first {MAX_SYMBOLS} were read")
            count = MAX_SYMBOLS
        if sec.type == SHT_SYMTAB and len(found) == len(wanted):
            # a .symtab (the larger table, with its string table) adds nothing once both
            # blob symbols are known (the first found is kept), and exports come from
            # .dynsym: it is not read
            continue
        strtab = src.view(strsec.offset, strsec.size, what=f"string table of {sec.name or 'symbols'}")
        syms = np.frombuffer(src.view(sec.offset, count * dt.itemsize, what=f"symbol table {sec.name}"), dtype=dt)
        defined = syms[syms["shndx"] != SHN_UNDEF]
        # look the wanted names up in the string table first, then match name offsets
        blob = bytes(strtab)
        for w in wanted:
            pos = blob.find(w + b"\0")
            while pos >= 0:
                if pos == 0 or blob[pos - 1] == 0:
                    hit = defined[defined["name"] == pos]
                    if len(hit):
                        value = int(hit["value"][0])
                        shndx = int(hit["shndx"][0])
                        if info.type != "relocatable":
                            info.symbols.setdefault(w.decode(), value)
                        elif 0 < shndx < len(info.sections):
                            # in object files a symbol's value is relative to its section
                            info.rel_symbols.setdefault(w.decode(), (shndx, value))
                            info.symbols.setdefault(w.decode(), value)
                pos = blob.find(w + b"\0", pos + 1)
        if sec.type == SHT_DYNSYM:
            # names starting with AOTInductor: find them in the string table, then keep
            # those a defined symbol points at
            starts: list[int] = []
            pos = blob.find(b"AOTInductor")
            while pos >= 0 and len(starts) < 100_000:
                if pos == 0 or blob[pos - 1] == 0:
                    starts.append(pos)
                pos = blob.find(b"AOTInductor", pos + 1)
            if starts:
                hits = np.intersect1d(np.asarray(starts, dtype=np.int64), defined["name"].astype(np.int64))
                for off in hits.tolist():
                    end = blob.find(b"\0", off)
                    info.exports.append(blob[off : end if end >= 0 else len(blob)].decode("utf-8", "replace"))
    info.exports = sorted(set(info.exports))


def vaddr_to_offset(info: ElfInfo, vaddr: int) -> int | None:
    """File offset of virtual address ``vaddr`` (section table first, then segments)."""
    for s in info.sections:
        if s.flags & SHF_ALLOC and s.type != SHT_NOBITS and s.addr <= vaddr < s.addr + s.size:
            return s.offset + (vaddr - s.addr)
    for s in info.sections:  # an empty blob sits at the very end of its section
        if s.flags & SHF_ALLOC and s.type != SHT_NOBITS and vaddr == s.addr + s.size:
            return s.offset + s.size
    for off, va, filesz, _memsz in info.segments:
        if va <= vaddr < va + filesz:
            return off + (vaddr - va)
    return None
