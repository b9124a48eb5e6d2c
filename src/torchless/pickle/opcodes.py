"""Pickle opcodes (protocols 0 to 5), by byte value.

The names follow ``pickletools``; :data:`OPCODE_NAMES` is checked against it in the tests
so a typo cannot hide an opcode.
"""

from __future__ import annotations

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
for _name in ("BININT", "BININT1", "BININT2", "BINFLOAT", "BINSTRING", "SHORT_BINSTRING", "BINUNICODE",
              "BINPERSID", "BINGET", "LONG_BINGET", "BINPUT", "LONG_BINPUT", "EMPTY_DICT", "EMPTY_LIST",
              "EMPTY_TUPLE", "APPENDS", "SETITEMS", "POP_MARK", "OBJ"):
    PROTOCOL_OF[_name] = 1
for _name in ("PROTO", "NEWOBJ", "EXT1", "EXT2", "EXT4", "TUPLE1", "TUPLE2", "TUPLE3", "NEWTRUE",
              "NEWFALSE", "LONG1", "LONG4"):
    PROTOCOL_OF[_name] = 2
for _name in ("BINBYTES", "SHORT_BINBYTES"):
    PROTOCOL_OF[_name] = 3
for _name in ("SHORT_BINUNICODE", "BINUNICODE8", "BINBYTES8", "EMPTY_SET", "ADDITEMS", "FROZENSET",
              "NEWOBJ_EX", "STACK_GLOBAL", "MEMOIZE", "FRAME"):
    PROTOCOL_OF[_name] = 4
for _name in ("BYTEARRAY8", "NEXT_BUFFER", "READONLY_BUFFER"):
    PROTOCOL_OF[_name] = 5
