"""Raw deflate streams of zip records inflated with bounded memory: in pieces
(:func:`inflate_chunks`, :func:`inflate_pieces`), into one buffer of the declared size
(:func:`inflate_into`), and the check that refuses a declared size no deflate stream of
the record can produce (:func:`check_inflate`).
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Iterator
from typing import Any

from ..core.errors import FormatError, LimitError

#: deflate input is fed in steps of this size
INFLATE_STEP = 1 << 16

MAX_DEFLATE_RATIO = 1032  # deflate's best case: 258 bytes from one length/distance pair
MAX_INFLATE = 1 << 32


def inflate_chunks(raw: Any, limit: int, *, chunk: int = 1 << 20) -> Iterator[bytes]:
    """Inflate a raw deflate stream in pieces of at most ``chunk`` bytes, stopping once
    ``limit`` bytes came out (input is fed 64 KiB at a time: no quadratic tail copies).

    Raises:
        zlib.error: corrupt data.
    """
    return inflate_pieces((raw[i : i + INFLATE_STEP] for i in range(0, len(raw), INFLATE_STEP)), limit, chunk=chunk)


def inflate_pieces(pieces: Iterable[Any], limit: int, *, chunk: int = 1 << 20) -> Iterator[bytes]:
    """:func:`inflate_chunks` over a raw deflate stream given in consecutive pieces (read
    as they are needed: a record streamed from its source)."""
    d = zlib.decompressobj(-15)
    total = 0
    for buf in pieces:
        while buf:
            out = d.decompress(buf, chunk)
            if out:
                total += len(out)
                yield out
                if total >= limit:
                    return
            buf = d.unconsumed_tail
        if d.eof:
            return
    out = d.flush()
    if out:
        yield out[: max(0, limit - total)]


def inflate_into(raw: Any, size: int, path: str | None = None, member: str | None = None) -> tuple[bytearray, int]:
    """Inflate a raw deflate stream into one buffer of the declared ``size`` (peak memory
    is the output, not twice it as with ``decompress``); returns ``(buffer, bytes that
    came out)``, where a count above ``size`` means the stream holds more than declared.

    Raises:
        LimitError: the process cannot allocate ``size`` bytes (a memory limit such as
            RLIMIT_AS, or a decompression bomb): never a bare ``MemoryError``.
    """
    try:
        out = bytearray(size)
    except MemoryError:
        raise LimitError(
            "not enough memory to inflate a deflated record",
            path=path,
            member=member,
            expected="a record that fits in memory",
            found=f"{size} bytes declared",
        ) from None
    n = 0
    for chunk in inflate_chunks(raw, size + 1):
        k = min(len(chunk), size - n)
        out[n : n + k] = chunk if k == len(chunk) else memoryview(chunk)[:k]  # no copy of the chunk
        n += len(chunk)
        if n > size:
            break
    return out, n


def check_inflate(csize: int, size: int, path: str, member: str) -> None:
    """Refuse a deflated record whose declared size no deflate stream of ``csize`` bytes
    can produce, or that exceeds :data:`MAX_INFLATE` (bounded memory on hostile sizes)."""
    if size > MAX_DEFLATE_RATIO * csize + 1024:
        raise FormatError(
            "declared size larger than deflate can produce from the record",
            path=path,
            member=member,
            expected=f"<= {MAX_DEFLATE_RATIO} x {csize} bytes",
            found=size,
        )
    if size > MAX_INFLATE:
        raise LimitError(
            "deflated record too large to inflate", path=path, member=member, expected=f"<= {MAX_INFLATE} bytes", found=size
        )
