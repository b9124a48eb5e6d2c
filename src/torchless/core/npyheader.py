"""The ``.npy`` header, parsed strictly and without ``tokenize``/``ast``.

NumPy reads the header dict with ``ast.literal_eval`` and, for version 1.0/2.0 headers
that fail, again after a ``tokenize`` pass that drops Python 2 ``L`` suffixes. On
hostile input those raise ``TokenError``, ``RecursionError`` or ``MemoryError``. This
module reads the same literal grammar NumPy's own writer produces (dicts, lists, tuples,
strings, ints with an optional ``L`` in versions 1.0/2.0, ``True``/``False``/``None``)
with a bounded recursive-descent parser, then applies NumPy's checks (exactly the keys
``descr``, ``fortran_order``, ``shape``; a tuple of ints; a bool) and
``numpy.lib.format.descr_to_dtype``. Anything else is a ``FormatError``.
"""

from __future__ import annotations

import ast
import re
import struct
import warnings
from typing import Any

import numpy as np

from .errors import FormatError, LimitError

__all__ = ["NpyHeader", "parse_npy_header", "parse_header_literal", "MAGIC", "VERSIONS", "MAX_HEADER_SIZE"]

MAGIC = b"\x93NUMPY"
#: format version -> (header length field, header text encoding)
VERSIONS = {(1, 0): ("<H", "latin1"), (2, 0): ("<I", "latin1"), (3, 0): ("<I", "utf8")}
#: NumPy's default ``max_header_size`` is 10000; torchless accepts the larger headers of
#: wide structured dtypes up to this size
MAX_HEADER_SIZE = 65536
MAX_DEPTH = 32

_TOKEN = re.compile(
    r"""[ \t\f\r\n]*(?:
      (?P<str>[bBuU]?(?:'(?:[^'\\\n]|\\.)*'|"(?:[^"\\\n]|\\.)*"))
    | (?P<int>[0-9]+[lL]?)
    | (?P<name>[A-Za-z_][A-Za-z_0-9]*)
    | (?P<punct>[][{}(),:+-])
    )""",
    re.X,
)


class NpyHeader:
    """A parsed header: ``version``, ``dtype``, ``shape``, ``fortran_order``, ``data_offset``."""

    __slots__ = ("version", "dtype", "shape", "fortran_order", "data_offset")

    def __init__(
        self, version: tuple[int, int], dtype: np.dtype, shape: tuple[int, ...], fortran_order: bool, data_offset: int
    ) -> None:
        self.version = version
        self.dtype = dtype
        self.shape = shape
        self.fortran_order = fortran_order
        self.data_offset = data_offset


def parse_header_literal(text: str, *, allow_long: bool = False, max_depth: int = MAX_DEPTH) -> Any:
    """The Python literal in ``text`` (the subset NumPy writes); FormatError otherwise."""
    toks: list[tuple[str, str]] = []
    pos = 0
    n = len(text)
    while pos < n:
        m = _TOKEN.match(text, pos)
        if m is None or m.end() == pos:
            if text[pos:].strip(" \t\f\r\n") == "":  # Python's whitespace, not Unicode's
                break
            raise FormatError("unexpected character in .npy header", offset=pos, found=repr(text[pos : pos + 10]))
        kind = m.lastgroup or ""
        toks.append((kind, m.group(kind)))
        pos = m.end()
    i = 0

    def peek() -> tuple[str, str]:
        return toks[i] if i < len(toks) else ("end", "")

    def take(value: str) -> None:
        nonlocal i
        if peek()[1] != value:
            raise FormatError(
                ".npy header is not a Python literal", expected=repr(value), found=repr(peek()[1]) if i < len(toks) else "the end"
            )
        i += 1

    def value(depth: int) -> Any:
        nonlocal i
        if depth > max_depth:
            raise LimitError(".npy header nested too deeply", expected=f"<= {max_depth} levels")
        kind, tok = peek()
        if kind == "end":
            raise FormatError(".npy header ends inside a value")
        i += 1
        if kind == "str":
            parts = [tok]
            while peek()[0] == "str":  # implicit concatenation, as Python reads it
                parts.append(peek()[1])
                i += 1
            try:
                with warnings.catch_warnings():  # invalid escapes warn, as in NumPy's reader
                    warnings.simplefilter("ignore")
                    out = ast.literal_eval(" ".join(parts))  # flat string tokens only: bounded
            except (SyntaxError, ValueError) as e:
                raise FormatError(f"bad string in .npy header: {e}") from None
            if not isinstance(out, str):
                raise FormatError(".npy header holds bytes where text is expected", found=repr(tok[:20]))
            return out
        if kind == "int":
            if tok[-1] in "lL":
                if not allow_long:
                    raise FormatError("Python 2 long literal in a version 3 .npy header", found=tok)
                tok = tok[:-1]
            if len(tok) > 1 and tok[0] == "0" and tok.strip("0"):
                raise FormatError("int with a leading zero in .npy header", found=tok)
            if len(tok) > 40:
                raise LimitError("int too long in .npy header", found=f"{len(tok)} digits")
            return int(tok)
        if kind == "name":
            if tok in ("True", "False", "None"):
                return {"True": True, "False": False, "None": None}[tok]
            raise FormatError("name in .npy header", found=tok)
        if tok in "+-":
            v = value(depth + 1)
            if type(v) is not int:
                raise FormatError("sign before something that is not a number in .npy header")
            return -v if tok == "-" else v
        if tok == "{":
            d: dict[Any, Any] = {}
            while peek()[1] != "}":
                k = value(depth + 1)
                if not isinstance(k, (str, int, bool, type(None))):
                    raise FormatError("unhashable key in .npy header dict", found=type(k).__name__)
                take(":")
                d[k] = value(depth + 1)
                if peek()[1] != "}":
                    take(",")
            i += 1
            return d
        if tok in "[(":
            close = "]" if tok == "[" else ")"
            items = []
            comma = False
            while peek()[1] != close:
                items.append(value(depth + 1))
                if peek()[1] != close:
                    take(",")
                    comma = True
            i += 1
            if close == "]":
                return items
            if len(items) == 1 and not comma:
                return items[0]  # a parenthesized value, not a tuple
            return tuple(items)
        raise FormatError(".npy header is not a Python literal", found=repr(tok))

    out = value(0)
    if i != len(toks):
        raise FormatError("trailing text after the .npy header dict", found=repr(toks[i][1]))
    return out


def parse_npy_header(head: bytes | memoryview, *, max_header_size: int = MAX_HEADER_SIZE) -> NpyHeader:
    """Parse the magic, version, header length and header dict at the start of ``head``.

    ``head`` needs to hold at least the whole header (``MAX_HEADER_SIZE`` + 12 bytes is
    always enough). Errors carry the offset in ``head``; callers add path and member.

    Raises:
        FormatError / TruncatedError-free: bad magic, version, header or dtype.
        LimitError: a header larger than ``max_header_size`` or nested too deeply.
    """
    head = bytes(head[: max_header_size + 12])
    if len(head) < 10 or not head.startswith(MAGIC):
        raise FormatError("not a .npy file", offset=0, expected="\\x93NUMPY magic", found=repr(head[:6]))
    version = (head[6], head[7])
    if version not in VERSIONS:
        raise FormatError("unknown .npy format version", offset=6, expected="1.0, 2.0 or 3.0", found=f"{version[0]}.{version[1]}")
    fmt, encoding = VERSIONS[version]
    start = 8 + struct.calcsize(fmt)
    if len(head) < start:
        raise FormatError(".npy header length is cut off", offset=8)
    (hlen,) = struct.unpack_from(fmt, head, 8)
    if hlen > max_header_size:
        raise LimitError(".npy header too large", offset=8, expected=f"<= {max_header_size} bytes", found=f"{hlen} bytes")
    if start + hlen > len(head):
        raise FormatError(
            ".npy header runs past the end of the data",
            offset=8,
            expected=f"{hlen} bytes",
            found=f"{max(0, len(head) - start)} bytes",
        )
    raw = head[start : start + hlen]
    try:
        text = raw.decode(encoding)
    except UnicodeDecodeError as e:
        raise FormatError(".npy header is not UTF-8", offset=start + e.start) from None
    try:
        d = parse_header_literal(text, allow_long=version != (3, 0))
    except FormatError as e:
        e.offset = start if e.offset is None else start + e.offset
        raise
    if not isinstance(d, dict):
        raise FormatError(".npy header is not a dict", offset=start, found=type(d).__name__)
    keys = sorted(map(str, d))
    if keys != ["descr", "fortran_order", "shape"]:
        raise FormatError(
            ".npy header has the wrong keys", offset=start, expected="descr, fortran_order, shape", found=", ".join(keys)[:80]
        )
    shape = d["shape"]
    if type(shape) is not tuple or not all(type(s) is int for s in shape):
        raise FormatError(".npy shape is not a tuple of ints", offset=start, found=type(shape).__name__)
    if any(s < 0 for s in shape):
        raise FormatError(".npy shape has a negative size", offset=start, found=str(shape)[:80])
    if len(shape) > 64:
        raise LimitError(".npy shape has too many dimensions", offset=start, expected="<= 64", found=len(shape))
    fortran = d["fortran_order"]
    if type(fortran) is not bool:
        raise FormatError(".npy fortran_order is not a bool", offset=start, found=type(fortran).__name__)
    try:
        dtype = np.lib.format.descr_to_dtype(d["descr"])
    except MemoryError:
        raise
    except Exception as e:  # noqa: BLE001 - NumPy's parser refusing the input's descr (ValueError, TypeError, SyntaxError...)
        raise FormatError(f".npy descr is not a dtype: {type(e).__name__}: {str(e)[:120]}", offset=start) from None
    return NpyHeader(version, dtype, shape, fortran, start + hlen)
