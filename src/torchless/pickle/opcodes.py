"""Pickle opcodes (protocols 0 to 5), by byte value.

The names follow ``pickletools``; :data:`OPCODE_NAMES` is checked against it in the tests
so a typo cannot hide an opcode.
"""

from __future__ import annotations

import re as _re

__all__ = ["OPCODE_NAMES", "PROTOCOL_OF"]

#: byte value -> opcode name.
OPCODE_NAMES: dict[int, str] = {
    ord("("): "MARK",
    ord("."): "STOP",
    ord("0"): "POP",
    ord("1"): "POP_MARK",
    ord("2"): "DUP",
    ord("F"): "FLOAT",
    ord("I"): "INT",
    ord("J"): "BININT",
    ord("K"): "BININT1",
    ord("L"): "LONG",
    ord("M"): "BININT2",
    ord("N"): "NONE",
    ord("P"): "PERSID",
    ord("Q"): "BINPERSID",
    ord("R"): "REDUCE",
    ord("S"): "STRING",
    ord("T"): "BINSTRING",
    ord("U"): "SHORT_BINSTRING",
    ord("V"): "UNICODE",
    ord("X"): "BINUNICODE",
    ord("a"): "APPEND",
    ord("b"): "BUILD",
    ord("c"): "GLOBAL",
    ord("d"): "DICT",
    ord("}"): "EMPTY_DICT",
    ord("e"): "APPENDS",
    ord("g"): "GET",
    ord("h"): "BINGET",
    ord("i"): "INST",
    ord("j"): "LONG_BINGET",
    ord("l"): "LIST",
    ord("]"): "EMPTY_LIST",
    ord("o"): "OBJ",
    ord("p"): "PUT",
    ord("q"): "BINPUT",
    ord("r"): "LONG_BINPUT",
    ord("s"): "SETITEM",
    ord("t"): "TUPLE",
    ord(")"): "EMPTY_TUPLE",
    ord("u"): "SETITEMS",
    ord("G"): "BINFLOAT",
    0x80: "PROTO",
    0x81: "NEWOBJ",
    0x82: "EXT1",
    0x83: "EXT2",
    0x84: "EXT4",
    0x85: "TUPLE1",
    0x86: "TUPLE2",
    0x87: "TUPLE3",
    0x88: "NEWTRUE",
    0x89: "NEWFALSE",
    0x8A: "LONG1",
    0x8B: "LONG4",
    ord("B"): "BINBYTES",
    ord("C"): "SHORT_BINBYTES",
    0x8C: "SHORT_BINUNICODE",
    0x8D: "BINUNICODE8",
    0x8E: "BINBYTES8",
    0x8F: "EMPTY_SET",
    0x90: "ADDITEMS",
    0x91: "FROZENSET",
    0x92: "NEWOBJ_EX",
    0x93: "STACK_GLOBAL",
    0x94: "MEMOIZE",
    0x95: "FRAME",
    0x96: "BYTEARRAY8",
    0x97: "NEXT_BUFFER",
    0x98: "READONLY_BUFFER",
}

#: opcode name -> the protocol that introduced it.
PROTOCOL_OF: dict[str, int] = {}
for _name in OPCODE_NAMES.values():
    PROTOCOL_OF[_name] = 0
for _name in (
    "BININT",
    "BININT1",
    "BININT2",
    "BINFLOAT",
    "BINSTRING",
    "SHORT_BINSTRING",
    "BINUNICODE",
    "BINPERSID",
    "BINGET",
    "LONG_BINGET",
    "BINPUT",
    "LONG_BINPUT",
    "EMPTY_DICT",
    "EMPTY_LIST",
    "EMPTY_TUPLE",
    "APPENDS",
    "SETITEMS",
    "POP_MARK",
    "OBJ",
):
    PROTOCOL_OF[_name] = 1
for _name in ("PROTO", "NEWOBJ", "EXT1", "EXT2", "EXT4", "TUPLE1", "TUPLE2", "TUPLE3", "NEWTRUE", "NEWFALSE", "LONG1", "LONG4"):
    PROTOCOL_OF[_name] = 2
for _name in ("BINBYTES", "SHORT_BINBYTES"):
    PROTOCOL_OF[_name] = 3
for _name in (
    "SHORT_BINUNICODE",
    "BINUNICODE8",
    "BINBYTES8",
    "EMPTY_SET",
    "ADDITEMS",
    "FROZENSET",
    "NEWOBJ_EX",
    "STACK_GLOBAL",
    "MEMOIZE",
    "FRAME",
):
    PROTOCOL_OF[_name] = 4
for _name in ("BYTEARRAY8", "NEXT_BUFFER", "READONLY_BUFFER"):
    PROTOCOL_OF[_name] = 5


# -- protocol-0 text arguments, parsed as CPython's C unpickler parses them ---------------
# The C unpickler reads a line (newline included), copies it into a NUL-terminated
# buffer and hands that to C string functions, so a NUL byte ends the argument wherever
# it is. These functions take the line *with* its newline.

_WS = b" \t\n\v\f\r"
_HEX = b"0123456789abcdefABCDEF"
_FLOAT_NUM = _re.compile(rb"[+-]?(?:(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)")
_FLOAT_SPECIAL = _re.compile(rb"[+-]?(?:inf(?:inity)?|nan)", _re.IGNORECASE)


def _cstr(line: bytes) -> bytes:
    i = line.find(b"\0")
    return line if i < 0 else line[:i]


def _strtol0(s: bytes) -> tuple[int, int, bool]:
    """glibc ``strtol(s, &end, 0)`` for a 64-bit long: (value, end index, overflowed)."""
    n = len(s)
    i = 0
    while i < n and s[i] in _WS:
        i += 1
    neg = False
    if i < n and s[i] in b"+-":
        neg = s[i] == 0x2D
        i += 1
    base = 10
    if i < n and s[i] == 0x30:
        if i + 2 < n and s[i + 1] in b"xX" and s[i + 2] in _HEX:
            base = 16
            i += 2
        else:
            base = 8
    j = i
    digits = b"0123456789abcdef"[:base] if base != 16 else _HEX
    while j < n and s[j] in digits:
        j += 1
    if j == i:
        return 0, 0, False  # no conversion: end is the start of the string
    v = int(s[i:j], base)
    v = -v if neg else v
    if v > (1 << 63) - 1 or v < -(1 << 63):
        return (1 << 63) - 1 if v > 0 else -(1 << 63), j, True
    return v, j, False


def parse_int_line(line: bytes) -> int | bool:
    """The INT opcode's argument (``I...\\n``) as ``_pickle`` parses it.

    ``strtol`` with base 0 first (octal ``010`` is 8, leading blanks and a NUL end are
    accepted; a three-byte line of value 0 or 1 such as ``00``, ``01``, ``+1``, `` 0``
    is a bool), then Python's own integer syntax (underscores, big values) when
    ``strtol`` stops early or overflows. Raises ValueError like the C unpickler.
    """
    if len(line) < 2:
        raise ValueError("pickle data was truncated")
    s = _cstr(line)
    x, end, overflow = _strtol0(s)
    stop = s[end] if end < len(s) else 0
    if overflow or (stop != 0x0A and stop != 0):
        return int(s, 0)
    if len(line) == 3 and x in (0, 1):
        return bool(x)
    return x


def parse_long_line(line: bytes) -> int:
    """The LONG opcode's argument: an optional trailing ``L`` dropped, then Python's
    integer syntax with base 0 up to the first NUL."""
    if len(line) < 2:
        raise ValueError("pickle data was truncated")
    if line[-2:-1] == b"L":
        line = line[:-2]
    return int(_cstr(line), 0)


def parse_float_line(line: bytes) -> float:
    """The FLOAT opcode's argument as ``PyOS_string_to_double`` reads it: no leading
    blanks or underscores, ``inf``/``infinity``/``nan`` in any case, the number must be
    followed by the newline or a NUL, and an overflow is an error."""
    if len(line) < 2:
        raise ValueError("pickle data was truncated")
    m = _FLOAT_NUM.match(line)
    special = False
    if m is None:
        m = _FLOAT_SPECIAL.match(line)
        special = True
    if m is None:
        raise ValueError("could not convert string to float")
    rest = line[m.end() : m.end() + 1]
    if rest not in (b"\n", b"\0"):
        raise ValueError("could not convert string to float")
    v = float(m.group())
    if not special and v in (float("inf"), float("-inf")):
        raise OverflowError("value too large to convert to float")
    return v


def parse_memo_line(line: bytes) -> int:
    """A GET/PUT argument: Python's base-10 integer syntax up to the first NUL."""
    if len(line) < 2:
        raise ValueError("pickle data was truncated")
    return int(_cstr(line), 10)
