"""A grammar- and mutation-based pickle generator for differential tests.

:func:`stream` builds one stream from a seeded ``random.Random``: mostly well-typed
expressions (so that runs get deep: globals, calls, builds, items on symbolic
objects, memo reuse), every opcode of protocols 0-5 with every text form of the
protocol-0 arguments, frames (aligned, misaligned, empty, nested, past the end), PROTO
in the middle, EXT codes (registered with :func:`register_extensions`), several STOPs
and trailing data, then (sometimes) byte-level mutations.

Used by tests/scan/test_pickle_differential.py and scripts/fuzz_pickle.py.
"""

from __future__ import annotations

import copyreg
import random
import struct

# extension codes the fuzzers register (their names are inert: nothing is imported)
EXTENSIONS = {
    1: ("fuzzmod", "one"),
    255: ("__builtin__", "eval"),
    256: ("fuzzmod.sub", "two.three"),
    65535: ("copy_reg", "_reconstructor"),
    70000: ("fuzzmod", "big"),
}


def register_extensions() -> None:
    """Register :data:`EXTENSIONS` in copyreg (idempotent)."""
    for code, (m, n) in EXTENSIONS.items():
        if copyreg._inverted_registry.get(code) != (m, n):  # type: ignore[attr-defined]
            try:
                copyreg.add_extension(m, n, code)
            except ValueError:
                pass


GLOBAL_NAMES = [
    ("os", "system"),
    ("__builtin__", "eval"),
    ("__builtin__", "xrange"),
    ("builtins", "getattr"),
    ("copy_reg", "_reconstructor"),
    ("UserDict", "UserDict"),
    ("UserDict", "IterableUserDict"),
    ("itertools", "izip"),
    ("exceptions", "ValueError"),
    ("collections", "OrderedDict"),
    ("torch._utils", "_rebuild_tensor_v2"),
    ("fuzzmod", "a.b"),
    ("fuzzmod", "<locals>"),
    ("Tkinter", "Tk"),
    ("urllib2", "urlopen"),
    ("cPickle", "loads"),
    ("whichdb", "whichdb"),
    ("string", "maketrans"),
    ("_socket", "fromfd"),
    ("dbm", "open"),
    ("test.test_support", "x"),
    ("posix", "system"),
    ("", "x"),
    ("m", ""),
    ("ünï", "cödé"),
    ("fuzz mod", "sp ace"),
]
INT_FORMS = [
    b"0",
    b"1",
    b"00",
    b"01",
    b"+1",
    b" 1",
    b"-0",
    b"+0",
    b"010",
    b"0x1f",
    b"0X1F",
    b"0b1",
    b"1_000",
    b"08",
    b"0x",
    b"99999999999999999999",
    b"-9223372036854775808",
    b"9223372036854775808",
    b"0777777777777777777777777",
    b"\x00",
    b"\x00\x00",
    b"1\x00zz",
    b"abc",
    b"",
    b" ",
    b"1 ",
    b"\t-5",
    b"2",
    b"-1",
    b"0o17",
    b"00000",
    b"1e3",
    b"0_1",
]
LONG_FORMS = [
    b"0L",
    b"1L",
    b"123",
    b"-5L",
    b"L",
    b"1_0L",
    b"0x10L",
    b"010L",
    b"00L",
    b" 7L",
    b"7 L",
    b"9" * 30 + b"L",
    b"1\x00L",
    b"",
    b"LL",
]
FLOAT_FORMS = [
    b"1.5",
    b"-0",
    b"0",
    b"inf",
    b"-inf",
    b"nan",
    b"NaN",
    b"infinity",
    b"Infinity",
    b"infinit",
    b"1e999",
    b"-1e999",
    b"1e-999",
    b" 1",
    b"1_0",
    b"1.",
    b".5",
    b".",
    b"1e",
    b"1e+",
    b"1E+05",
    b"0x10",
    b"1\x00junk",
    b"",
    b"1.5 ",
    b"+.5e-3",
    b"--1",
    b"1.5L",
]
STRING_FORMS = [
    b"'abc'",
    b'"abc"',
    b"'a\\x41'",
    b"'\\q'",
    b"'unterminated",
    b"'a\"",
    b"''",
    b"'\\x4'",
    b"'\xc3\xa9'",
    b"'\\n\\t'",
    b"'",
    b"abc",
    b"'a'b'",
    b"'\\\\'",
    b'"\'"',
    b"'\\101'",
    b"'\\u0041'",
]
UNICODE_FORMS = [b"abc", b"\\u0041", b"\\u12", b"\\U0001f600", b"\\U00110000", b"\xff\xfe", b"", b"a\\nb", b"\\x41", b"\xc3\xa9"]
MEMO_FORMS = [b"0", b"1", b" 1", b"1_0", b"-1", b"01", b"1\x00", b"", b"2", b"0x1", b"3 ", b"99999999999999999999999"]
PERSID_FORMS = [b"0", b"storage", b"", b"\xff", b"a b"]


def _u(s: str | bytes) -> bytes:
    return s.encode("utf-8", "surrogatepass") if isinstance(s, str) else s


class _Gen:
    def __init__(self, rng: random.Random) -> None:
        self.r = rng
        self.ops: list[bytes] = []  # one chunk per opcode (frames are inserted between)
        self.memo: list[int] = []
        self.proto = 0
        self.budget = rng.randint(3, 60)

    def emit(self, *chunks: bytes) -> None:
        self.ops.extend(chunks)

    # -- leaves ----------------------------------------------------------------------
    def text_arg(self, forms: list[bytes]) -> bytes:
        r = self.r
        if r.random() < 0.85:
            return r.choice(forms)
        return bytes(r.randrange(256) for _ in range(r.randint(0, 4))).replace(b"\n", b"")

    def string_value(self) -> None:
        r = self.r
        s = _u(
            r.choice(
                ["os", "system", "builtins", "eval", "", "a.b", "copy_reg", "__builtin__", "x" * r.randint(0, 300), "é", "\ud800"]
            )
        )
        k = r.randrange(6)
        if k == 0 and len(s) < 256:
            self.emit(b"\x8c" + bytes([len(s)]) + s)
        elif k == 1:
            self.emit(b"X" + struct.pack("<I", len(s)) + s)
        elif k == 2:
            self.emit(b"\x8d" + struct.pack("<Q", len(s)) + s)
        elif k == 3:
            self.emit(b"V" + s.replace(b"\\", b"\\u005c").replace(b"\n", b"\\u000a") + b"\n")
        elif k == 4 and len(s) < 256:
            self.emit(b"U" + bytes([len(s)]) + s)
        else:
            self.emit(b"T" + struct.pack("<i", len(s)) + s)

    def scalar(self) -> None:
        r = self.r
        k = r.randrange(30)
        if k == 0:
            self.emit(b"I" + self.text_arg(INT_FORMS) + b"\n")
        elif k == 1:
            self.emit(b"L" + self.text_arg(LONG_FORMS) + b"\n")
        elif k == 2:
            self.emit(b"F" + self.text_arg(FLOAT_FORMS) + b"\n")
        elif k == 3:
            self.emit(b"S" + self.text_arg(STRING_FORMS) + b"\n")
        elif k == 4:
            self.emit(b"V" + self.text_arg(UNICODE_FORMS) + b"\n")
        elif k == 5:
            self.emit(b"J" + struct.pack("<i", r.randint(-(2**31), 2**31 - 1)))
        elif k == 6:
            self.emit(b"K" + bytes([r.randrange(256)]))
        elif k == 7:
            self.emit(b"M" + struct.pack("<H", r.randrange(65536)))
        elif k == 8:
            self.emit(b"G" + struct.pack(">d", r.choice([0.0, -0.0, 1.5, float("inf"), float("nan"), 1e308])))
        elif k == 9:
            b = bytes(r.randrange(256) for _ in range(r.randint(0, 9)))
            self.emit(b"\x8a" + bytes([len(b)]) + b)
        elif k == 10:
            b = bytes(r.randrange(256) for _ in range(r.randint(0, 9)))
            self.emit(b"\x8b" + struct.pack("<i", len(b) if r.random() < 0.9 else -1) + b)
        elif k == 11:
            self.emit(b"N")
        elif k == 12:
            self.emit(r.choice([b"\x88", b"\x89"]))
        elif k == 13:
            b = bytes(r.randrange(256) for _ in range(r.randint(0, 5)))
            self.emit(b"C" + bytes([len(b)]) + b)
        elif k == 14:
            b = bytes(r.randrange(256) for _ in range(r.randint(0, 5)))
            self.emit(b"B" + struct.pack("<I", len(b)) + b)
        elif k == 15:
            b = bytes(r.randrange(256) for _ in range(r.randint(0, 5)))
            self.emit(b"\x8e" + struct.pack("<Q", len(b)) + b)
        elif k == 16:
            b = bytes(r.randrange(256) for _ in range(r.randint(0, 5)))
            self.emit(b"\x96" + struct.pack("<Q", len(b)) + b)
        elif k == 17:
            b = bytes(r.randrange(256) for _ in range(r.randint(0, 5)))
            self.emit(b"U" + bytes([len(b)]) + b)
        elif k == 18:
            self.emit(r.choice([b")", b"]", b"}", b"\x8f"]))
        elif k == 19:
            self.emit(b"P" + self.text_arg(PERSID_FORMS) + b"\n")
        elif k == 20 and self.memo:
            self.get()
        else:
            self.string_value()

    def get(self) -> None:
        r = self.r
        i = r.choice(self.memo) if self.memo and r.random() < 0.9 else r.randrange(300)
        k = r.randrange(3)
        if k == 0 and i < 256:
            self.emit(b"h" + bytes([i]))
        elif k == 1:
            self.emit(b"j" + struct.pack("<I", i))
        else:
            self.emit(b"g" + (str(i).encode() if r.random() < 0.8 else self.text_arg(MEMO_FORMS)) + b"\n")

    def put(self) -> None:
        r = self.r
        k = r.randrange(4)
        i = len(self.memo) if r.random() < 0.7 else r.randrange(300)
        if k == 0:
            self.emit(b"\x94")
            i = len(set(self.memo))
        elif k == 1 and i < 256:
            self.emit(b"q" + bytes([i]))
        elif k == 2:
            self.emit(b"r" + struct.pack("<I", i if r.random() < 0.98 else 0xFFFFFFFF))
        else:
            self.emit(b"p" + (str(i).encode() if r.random() < 0.8 else self.text_arg(MEMO_FORMS)) + b"\n")
        self.memo.append(i)

    def global_(self) -> None:
        r = self.r
        m, n = r.choice(GLOBAL_NAMES)
        k = r.randrange(5)
        if k == 0:
            self.emit(b"c" + _u(m) + b"\n" + _u(n) + b"\n")
        elif k == 1:
            for s in (m, n):
                b = _u(s)
                self.emit(b"\x8c" + bytes([len(b)]) + b)
                if r.random() < 0.3:
                    self.put()
            self.emit(b"\x93")
        elif k == 2:
            code = r.choice(list(EXTENSIONS) + [0, 2, 300, -5])
            if 0 <= code < 256 and r.random() < 0.6:
                self.emit(b"\x82" + bytes([code]))
            elif 0 <= code < 65536 and r.random() < 0.6:
                self.emit(b"\x83" + struct.pack("<H", code))
            else:
                self.emit(b"\x84" + struct.pack("<i", code))
        elif k == 3:
            self.emit(b"c" + (b"\xff" if r.random() < 0.5 else _u(m)) + b"\n" + _u(n) + b"\n")
        else:
            self.emit(b"c" + _u(m) + b"\n" + _u(n) + b"\n")

    # -- expressions -----------------------------------------------------------------
    def value(self, depth: int = 0) -> None:
        """Emit opcodes that (usually) push exactly one value."""
        r = self.r
        self.budget -= 1
        if depth > 5 or self.budget <= 0:
            return self.scalar() if r.random() < 0.7 else self.global_()
        if r.random() < 0.05:
            self.emit(b"\x80" + bytes([r.choice([0, 1, 2, 3, 4, 5, 2, 4, 6, 255])]))
        if self.memo and r.random() < 0.15:  # memo reuse
            return self.get()
        k = r.randrange(26)
        if k >= 24:
            k = 14  # items on containers and call results
        if k < 5:
            self.scalar()
        elif k < 8:
            self.global_()
        elif k == 8:  # REDUCE
            self.callable_(depth)
            self.args_tuple(depth)
            self.emit(b"R")
        elif k == 9:  # NEWOBJ / NEWOBJ_EX
            self.callable_(depth)
            self.args_tuple(depth)
            if r.random() < 0.5:
                self.emit(b"}" if r.random() < 0.3 else b"(" + b"\x8c\x01k" + b"K\x01" + b"d")
                self.emit(b"\x92")
            else:
                self.emit(b"\x81")
        elif k == 10:  # INST
            m, n = r.choice(GLOBAL_NAMES)
            if r.random() < 0.9:
                self.emit(b"(")
            for _ in range(r.randint(0, 2)):
                self.value(depth + 1)
            self.emit(b"i" + (m.encode("utf-8") if r.random() < 0.9 else b"") + b"\n" + n.encode("utf-8") + b"\n")
        elif k == 11:  # OBJ
            self.emit(b"(")
            self.callable_(depth)
            for _ in range(r.randint(0, 2)):
                self.value(depth + 1)
            self.emit(b"o")
        elif k == 12:  # containers with MARK
            self.emit(b"(")
            kind = r.choice([b"t", b"l", b"d", b"\x91"])
            count = r.randint(0, 4)
            if kind == b"d":
                count *= 2
            for _ in range(count):
                self.value(depth + 1)
            self.emit(kind)
        elif k == 13:
            n = r.randint(1, 3)
            for _ in range(n):
                self.value(depth + 1)
            self.emit(bytes([0x84 + n]))
        elif k == 14:  # APPEND(S) / SETITEM(S) / ADDITEMS on lists, dicts, sets or a call result
            tgt = r.randrange(4)
            if tgt == 0:
                self.emit(r.choice([b"]", b"}", b"\x8f", b"N"]))
            else:
                self.callable_(depth)
                self.args_tuple(depth)
                self.emit(b"R")
            op = r.choice([b"a", b"e", b"s", b"u", b"\x90"])
            if op == b"a":
                self.value(depth + 1)
            elif op == b"s":
                self.value(depth + 1)
                self.value(depth + 1)
            else:
                self.emit(b"(")
                for _ in range(r.randint(0, 3) * (2 if op == b"u" else 1)):
                    self.value(depth + 1)
            self.emit(op)
        elif k == 15:  # BUILD
            self.value(depth + 1)
            self.value(depth + 1)
            self.emit(b"b")
        elif k == 16:
            self.value(depth + 1)
            self.put()
        elif k == 17 and self.memo:
            self.get()
        elif k == 18:  # DUP/POP, POP_MARK
            self.value(depth + 1)
            self.emit(r.choice([b"20", b"(N1", b"(0"]))
        elif k == 19:
            self.value(depth + 1)
            self.emit(b"Q")
        elif k == 20:
            self.emit(b"\x96\x02\x00\x00\x00\x00\x00\x00\x00ab" if r.random() < 0.5 else b"C\x02ab")
            self.emit(b"\x98")
        elif k == 21 and r.random() < 0.2:
            self.emit(r.choice([b"\x97", b"\x98", bytes([r.choice([0x00, 0x99, 0xFF, 0x20, 0x41])])]))
        else:
            self.scalar()

    def callable_(self, depth: int) -> None:
        r = self.r
        if r.random() < 0.7 or depth > 4:
            self.global_()
        elif r.random() < 0.5 and self.memo:
            self.get()
        else:
            self.callable_(depth + 1)
            self.args_tuple(depth + 1)
            self.emit(b"R")

    def args_tuple(self, depth: int) -> None:
        r = self.r
        n = r.randint(0, 3)
        if r.random() < 0.1:
            self.value(depth + 1)  # not a tuple
            return
        if n == 0:
            self.emit(b")")
        elif r.random() < 0.5:
            self.emit(b"(")
            for _ in range(n):
                self.value(depth + 1)
            self.emit(b"t")
        else:
            for _ in range(n):
                self.value(depth + 1)
            self.emit(bytes([0x84 + n]))


def _framed(ops: list[bytes], r: random.Random) -> bytes:
    """Join opcode chunks, inserting FRAMEs: aligned mostly, sometimes misaligned, empty,
    nested, or longer than the rest."""
    out = bytearray()
    i = 0
    n = len(ops)
    style = r.random()
    while i < n:
        if style < 0.5 or r.random() < 0.5:
            out += ops[i]
            i += 1
            continue
        j = min(n, i + r.randint(0, 8))
        body = b"".join(ops[i:j])
        k = len(body)
        x = r.random()
        if x < 0.6:
            pass
        elif x < 0.75:
            k = max(0, k + r.choice([-3, -2, -1, 1, 2, 3]))
        elif x < 0.85:
            k = 0
            body = b""
            j = i
        elif x < 0.92:  # nested: an inner frame over a prefix of the body
            inner = b"".join(ops[i : i + 1])
            inner_k = len(inner) + r.choice([0, 0, 1, -1, 5])
            body = b"\x95" + struct.pack("<Q", max(0, inner_k)) + body
            k = len(body) + r.choice([0, 0, -2, 3])
        else:
            k = len(body) + r.randint(1, 1000)
        out += b"\x95" + struct.pack("<Q", max(0, k)) + body
        i = j
    return bytes(out)


def _mutate(b: bytearray, r: random.Random) -> None:
    for _ in range(r.randint(1, 3)):
        if not b:
            return
        k = r.randrange(5)
        p = r.randrange(len(b))
        if k == 0:
            b[p] = r.randrange(256)
        elif k == 1:
            del b[p : p + r.randint(1, 3)]
        elif k == 2:
            b[p:p] = bytes([r.choice(b"(.0123IJKLNRSVXabcdeghijlopqrstu}])\x80\x81\x85\x8c\x93\x94\x95\n")])
        elif k == 3:
            q = r.randrange(len(b))
            b[p:p] = b[q : q + r.randint(1, 8)]
        else:
            del b[p:]


def stream(r: random.Random) -> bytes:
    """One generated stream (bytes)."""
    parts: list[bytes] = []
    for _piece in range(1 if r.random() < 0.8 else r.randint(2, 3)):
        g = _Gen(r)
        proto = r.choice([None, 0, 1, 2, 3, 4, 5, 5, 4, 2])
        if proto is not None:
            g.emit(b"\x80" + bytes([proto]))
        g.value()
        while r.random() < 0.3 and g.budget > 0:
            g.value()
            g.emit(b"0")
        g.emit(b".")
        parts.append(_framed(g.ops, r) if r.random() < 0.4 else b"".join(g.ops))
    data = bytearray(b"".join(parts))
    if r.random() < 0.1:
        data += bytes(r.randrange(256) for _ in range(r.randint(1, 8)))
    if r.random() < 0.2:
        _mutate(data, r)
    return bytes(data)
