"""Minimal Mach-O and PE/COFF files written by hand (no macOS or Windows toolchain here),
laid out as AotCodeCompiler links the constants on those systems (codecache.py
``_compile_consts``): Mach-O ``__DATA,__data`` between ``__binary_constants_bin_start`` /
``__binary_constants_bin_end``; Windows' C++ build ``?_binary_constants_bin_start@@3PAEA``
(start only) in ``.data``, the library a DLL exporting ``AOTInductor*``."""

from __future__ import annotations

import struct

EXPORTS = ("AOTInductorModelContainerCreate", "AOTInductorModelContainerRun")


def _pad(b: bytearray, align: int) -> None:
    while len(b) % align:
        b.append(0)


def make_macho(
    payload: bytes, *, relocatable: bool = False, exports: tuple[str, ...] = EXPORTS, big_endian: bool = False, fat: bool = False
) -> bytes:
    """A 64-bit Mach-O dylib (or MH_OBJECT) with the blob in ``__DATA,__data``."""
    e = ">" if big_endian else "<"
    addr = 0 if relocatable else 0x4000
    names = ["__binary_constants_bin_start", "__binary_constants_bin_end", *("_" + x for x in exports)]
    strtab = bytearray(b"\0")
    offs = []
    for n in names:
        offs.append(len(strtab))
        strtab += n.encode() + b"\0"
    values = [addr, addr + len(payload)] + [addr] * len(exports)
    seg_cmd = 72 + 80
    sizeofcmds = seg_cmd + 24
    data_off = (32 + sizeofcmds + 63) // 64 * 64
    body = bytearray(data_off) + payload
    _pad(body, 8)
    symoff = len(body)
    for o, v in zip(offs, values, strict=False):
        body += struct.pack(e + "IBBHQ", o, 0x0F, 1, 0, v)
    stroff = len(body)
    body += strtab
    hdr = struct.pack(e + "IiiIIIII", 0xFEEDFACF, 0x0100000C, 0, 1 if relocatable else 6, 2, sizeofcmds, 0, 0)
    seg = struct.pack(e + "II16sQQQQiiII", 0x19, seg_cmd, b"__DATA", addr, len(payload), data_off, len(payload), 3, 3, 1, 0)
    sec = struct.pack(e + "16s16sQQIIIIIIII", b"__data", b"__DATA", addr, len(payload), data_off, 6, 0, 0, 0, 0, 0, 0)
    sym = struct.pack(e + "IIIIII", 0x2, 24, symoff, len(names), stroff, len(strtab))
    cmds = hdr + seg + sec + sym
    body[: len(cmds)] = cmds
    if fat:
        head = bytearray(struct.pack(">II", 0xCAFEBABE, 1) + struct.pack(">iiIII", 0x0100000C, 0, 4096, len(body), 12))
        head += bytes(4096 - len(head))
        return bytes(head + body)
    return bytes(body)


def _coff_symbols(names_values: list[tuple[str, int, int]]) -> tuple[bytes, bytes]:
    """COFF symbol records (18 bytes; long names in the string table) and the table."""
    strtab = bytearray(4)
    syms = bytearray()
    for name, value, secnum in names_values:
        raw = name.encode()
        if len(raw) <= 8:
            field = raw.ljust(8, b"\0")
        else:
            field = struct.pack("<II", 0, len(strtab))
            strtab += raw + b"\0"
        syms += struct.pack("<8sIhHBB", field, value, secnum, 0, 2, 0)
    strtab[:4] = struct.pack("<I", len(strtab))
    return bytes(syms), bytes(strtab)


def make_pe(payload: bytes, *, end_symbol: bool = False, exports: tuple[str, ...] = EXPORTS, symbols: bool = True) -> bytes:
    """A PE32+ DLL: ``.data`` holds the blob, ``.edata`` the export directory, a COFF
    symbol table (as MinGW keeps it) names the blob's start (and end)."""
    image_base = 0x180000000
    data_rva, edata_rva = 0x1000, 0x2000 + ((len(payload) // 0x1000) * 0x1000)
    # export directory, names, strings (RVAs inside .edata)
    n = len(exports)
    names_rva = edata_rva + 40
    strings = bytearray()
    name_rvas = []
    str_base = names_rva + 4 * n + 2 * n
    for x in exports:
        name_rvas.append(str_base + len(strings))
        strings += x.encode() + b"\0"
    edata = struct.pack("<IIHHIIIIIII", 0, 0, 0, 0, str_base + len(strings), 1, 0, n, 0, names_rva, names_rva + 4 * n)
    edata += b"".join(struct.pack("<I", r) for r in name_rvas) + b"\0\0" * n + strings + b"lib.pyd\0"
    opt_size = 240
    nsec = 2
    hdr_end = 0x40 + 4 + 20 + opt_size + 40 * nsec
    raw_data = (hdr_end + 0x1FF) // 0x200 * 0x200
    data_raw = (len(payload) + 0x1FF) // 0x200 * 0x200
    raw_edata = raw_data + data_raw
    edata_raw = (len(edata) + 0x1FF) // 0x200 * 0x200
    symptr = raw_edata + edata_raw
    entries = [("?_binary_constants_bin_start@@3PAEA", 0, 1)]
    if end_symbol:
        entries.append(("?_binary_constants_bin_end@@3PAEA", len(payload), 1))
    syms, strtab = _coff_symbols(entries) if symbols else (b"", b"")
    out = bytearray(symptr) + syms + strtab
    out[0:2] = b"MZ"
    out[0x3C:0x40] = struct.pack("<I", 0x40)
    out[0x40:0x44] = b"PE\0\0"
    out[0x44:0x58] = struct.pack(
        "<HHIIIHH", 0x8664, nsec, 0, symptr if symbols else 0, len(entries) if symbols else 0, opt_size, 0x2022
    )
    opt = bytearray(opt_size)
    struct.pack_into("<H", opt, 0, 0x20B)
    struct.pack_into("<Q", opt, 24, image_base)
    struct.pack_into("<I", opt, 108, 16)
    struct.pack_into("<II", opt, 112, edata_rva, len(edata))
    out[0x58 : 0x58 + opt_size] = opt
    sh = 0x58 + opt_size
    out[sh : sh + 40] = struct.pack("<8sIIIIIIHHI", b".data", len(payload), data_rva, data_raw, raw_data, 0, 0, 0, 0, 0xC0000040)
    out[sh + 40 : sh + 80] = struct.pack(
        "<8sIIIIIIHHI", b".edata", len(edata), edata_rva, edata_raw, raw_edata, 0, 0, 0, 0, 0x40000040
    )
    out[raw_data : raw_data + len(payload)] = payload
    out[raw_edata : raw_edata + len(edata)] = edata
    return bytes(out)


def make_coff(payload: bytes) -> bytes:
    """A COFF object (``.obj``) as MSVC compiles the C++ constants file: ``.data`` with
    the array, only its start symbol defined."""
    sec_ptr = 20 + 40
    symptr = sec_ptr + len(payload)
    syms, strtab = _coff_symbols([("?_binary_constants_bin_start@@3PAEA", 0, 1), ("?_binary_constants_bin_end@@3PAEA", 0, 0)])
    out = struct.pack("<HHIIIHH", 0x8664, 1, 0, symptr, 2, 0, 0)
    out += struct.pack("<8sIIIIIIHHI", b".data", 0, 0, len(payload), sec_ptr, 0, 0, 0, 0, 0xC0500040)
    return out + payload + syms + strtab
