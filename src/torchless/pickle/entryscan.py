"""Torch state-dict entries found and tokenised together, as NumPy columns.

The pickle machine's one-pass entry run (:data:`torchless.pickle.machine._ENTRY`) matches
one entry at a time with a regular expression. For thousands of entries in a row this
module does the same tokenising for every candidate start in a window at once: every
``X`` (BINUNICODE) byte is taken as the start of an entry, and all candidates step
through the entry's grammar together (one array operation per token for all of them),
each one marked invalid as soon as a byte is not what the grammar allows there. The
caller then follows the chain of valid candidates from where it stands (each one
starting exactly where the previous one ended), so a candidate that starts inside
another entry's key can never be taken.

The grammar is exactly the pattern's (see ``_ENTRY``): the same opcodes, int widths,
tuple forms (with TUPLE1-3 counts checked), optional memo stores after tuples and a
decimal storage key of the declared length. Nothing here has effects: the caller
checks the memo reads and stores and runs the effects in the loop's order.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["Scanned", "scan", "window_text"]

_MAX_TUPLE = 64  # ints in a MARK ... TUPLE tuple (the pattern's bound)


class Scanned:
    """The valid candidates of a window, as columns (one row per entry, in file order).

    ``start``/``end``: the entry's bytes; ``kend``: end of its key string; ``gets``: the
    five memo reads (function, 'storage', storage class, location, OrderedDict);
    ``puts``: the memo stores in opcode order (name, key, pid, size, stride, od, args,
    tensor), -1 where an empty tuple was not stored; ``skey``: the storage key's bytes;
    ``numel``, ``offset``; ``size``/``stride``: per entry the tuple of ints (Python
    lists); ``rg``: requires_grad; ``at_q``/``at_od``/``at_t``: offsets of BINPERSID and
    the two REDUCEs (for errors); ``plain``: as many strides as sizes, none of them and
    not the offset negative (what ``Tensor._make`` takes as it is)."""

    start: Any
    end: Any
    kend: Any
    gets: Any
    puts: Any
    skey0: Any
    skey1: Any
    numel: Any
    offset: Any
    size: list[tuple[int, ...]]
    stride: list[tuple[int, ...]]
    rg: Any
    at_q: Any
    at_od: Any
    at_t: Any
    plain: Any
    lo: int
    buf: bytearray
    text: str | None


#: per opcode byte, the width of the int argument of BININT1 (K), BININT2 (M), BININT (J); 0 for the others
_INT_WIDTH = np.zeros(256, dtype=np.int64)
_INT_WIDTH[0x4B], _INT_WIDTH[0x4D], _INT_WIDTH[0x4A] = 1, 2, 4

_PAD = 2048  # zero bytes after the window: no token of an entry reaches further past it


def scan(data: Any, lo: int, hi: int) -> Scanned | None:
    """Every entry that starts at an ``X`` in ``data[lo:hi]`` and ends by ``hi``.

    Positions are relative to ``lo`` inside; the window is copied with zero padding so
    that reads past its end see zeros (which no entry ends with) instead of bounds checks."""
    size = hi - lo
    buf = bytearray(size + _PAD)  # one copy of the window (a slice and a join were two)
    buf[:size] = memoryview(data)[lo:hi]
    w8 = np.frombuffer(buf, np.uint8)
    span = len(buf) - 3
    # unaligned little-endian views of every byte offset (no copies)
    w32 = np.ndarray((span,), dtype="<u4", buffer=buf, strides=(1,))
    i32 = np.ndarray((span,), dtype="<i4", buffer=buf, strides=(1,))
    start = np.flatnonzero(w8[:size] == 0x58)
    if not len(start):
        return None

    def byte(p: Any) -> Any:
        return w8[p]

    ok = start + 5 <= size
    nonneg = np.ones(len(start), dtype=bool)
    k = w32[start + 1].astype(np.int64)
    pos = start + 5 + k
    ok &= pos <= size
    pos = np.minimum(pos, size)
    kend = pos + lo

    def ref(p: Any, short: int, long: int) -> tuple[Any, Any]:
        nonlocal ok
        op = w8[p]
        isshort = op == short
        word = w32[p + 1].astype(np.int64)  # (the 1-byte form's index is the word's low byte)
        if not isshort.any():  # (every row the 4-byte form, or out: no choice per row)
            ok &= op == long
            return word, p + 5
        ok &= isshort | (op == long)
        return np.where(isshort, word & 0xFF, word), p + np.where(isshort, 2, 5)

    def fixed(p: Any, c: int) -> Any:
        nonlocal ok
        ok &= w8[p] == c
        return p + 1

    def integer(p: Any) -> tuple[Any, Any, Any]:
        """(value, next position, is an int token) of K/M/J at p."""
        op = w8[p]
        word = i32[p + 1].astype(np.int64)  # (K's value is its low byte, M's its low two)
        width = _INT_WIDTH[op]
        val = np.where(width == 1, word & 0xFF, np.where(width == 2, word & 0xFFFF, word))
        return val, p + 1 + width, width > 0

    def tup(p: Any) -> tuple[list[Any], Any, Any, Any]:
        """(list of value columns with their presence masks, count, next position, store)."""
        nonlocal ok, nonneg
        op = byte(p)
        empty = op == 0x29
        mark = op == 0x28
        q = np.where(empty, p + 1, np.where(mark, p + 1, p))
        count = np.zeros(len(p), dtype=np.int64)
        active = ~empty
        cols = []
        for _j in range(_MAX_TUPLE):
            val, nxt, isint = integer(q)
            take = active & isint & (mark | (count < 3))
            if not take.any():
                break
            cols.append((val, take))
            nonneg &= ~take | (val >= 0)
            count += take
            q = np.where(take, nxt, q)
            active = take
        end = byte(q)
        good = empty | (mark & (end == 0x74)) | (~mark & ~empty & (count >= 1) & (end == 0x84 + count))
        ok &= good
        q = np.where(empty, q, q + 1)
        op = byte(q)
        has_put = (op == 0x71) | (op == 0x72)  # (after an empty tuple too, as the pattern allows)
        saved = ok.copy()
        idx, after = ref(q, 0x71, 0x72)  # an optional store: rows without one stay as they were
        ok = np.where(has_put, ok, saved)
        return cols, count, np.where(has_put, after, q), np.where(has_put, idx, -1)

    p_name, pos = ref(pos, 0x71, 0x72)
    g_fn, pos = ref(pos, 0x68, 0x6A)
    pos = fixed(pos, 0x28)
    pos = fixed(pos, 0x28)
    # most candidates (the storage keys' X, X bytes inside ints) are out by here: the
    # rest of the grammar steps only through the others
    keep = np.flatnonzero(ok)
    start, kend, pos, p_name, g_fn = start[keep], kend[keep], pos[keep], p_name[keep], g_fn[keep]
    ok, nonneg = ok[keep], nonneg[keep]
    g_st, pos = ref(pos, 0x68, 0x6A)
    g_cls, pos = ref(pos, 0x68, 0x6A)
    pos = fixed(pos, 0x58)
    kl = w8[pos].astype(np.int64)
    ok &= (kl >= 1) & (kl <= 19) & (byte(pos + 1) == 0) & (byte(pos + 2) == 0) & (byte(pos + 3) == 0)
    skey0 = pos + 4
    # the key's digits, up to the longest key of a row still in (the rows out already
    # stay out; a shorter key's columns past its end are not tested)
    width = int(kl[ok].max()) if ok.any() else 0
    c = w8[skey0[:, None] + np.arange(width)]
    ok &= ((np.arange(width) >= kl[:, None]) | ((c >= 0x30) & (c <= 0x39))).all(axis=1)
    skey1 = skey0 + kl
    pos = skey1
    p_key, pos = ref(pos, 0x71, 0x72)
    g_loc, pos = ref(pos, 0x68, 0x6A)
    numel, pos, isint = integer(pos)
    ok &= isint
    pos = fixed(pos, 0x74)
    p_pid, pos = ref(pos, 0x71, 0x72)
    at_q = pos
    pos = fixed(pos, 0x51)
    offset, pos, isint = integer(pos)
    ok &= isint
    size_cols, size_n, pos, p_size = tup(pos)
    stride_cols, stride_n, pos, p_stride = tup(pos)
    rgb = w8[pos]
    ok &= (rgb == 0x88) | (rgb == 0x89)
    pos = pos + 1
    g_od, pos = ref(pos, 0x68, 0x6A)
    pos = fixed(pos, 0x29)
    at_od = pos
    pos = fixed(pos, 0x52)
    p_od, pos = ref(pos, 0x71, 0x72)
    pos = fixed(pos, 0x74)
    p_args, pos = ref(pos, 0x71, 0x72)
    at_t = pos
    pos = fixed(pos, 0x52)
    p_t, pos = ref(pos, 0x71, 0x72)
    ok &= pos <= size
    if not ok.any():
        return None
    s = Scanned()
    sel: Any
    if ok.all():  # (every candidate left is an entry: no selection to copy)
        sel = slice(None)
        nsel = len(ok)
    else:
        sel = np.flatnonzero(ok)
        g_fn, g_st, g_cls, g_loc, g_od = g_fn[sel], g_st[sel], g_cls[sel], g_loc[sel], g_od[sel]
        p_name, p_key, p_pid, p_size, p_stride = p_name[sel], p_key[sel], p_pid[sel], p_size[sel], p_stride[sel]
        p_od, p_args, p_t = p_od[sel], p_args[sel], p_t[sel]
        nsel = len(sel)
    s.start = start[sel] + lo
    s.end = pos[sel] + lo
    s.kend = kend[sel]
    s.gets = np.stack([g_fn, g_st, g_cls, g_loc, g_od], axis=1)
    s.puts = np.stack([p_name, p_key, p_pid, p_size, p_stride, p_od, p_args, p_t], axis=1)
    s.skey0, s.skey1 = skey0[sel] + lo, skey1[sel] + lo
    s.numel, s.offset = numel[sel], offset[sel]
    s.size = _tuples(size_cols, size_n, sel, nsel)
    s.stride = _tuples(stride_cols, stride_n, sel, nsel)
    s.rg = rgb[sel] == 0x88
    s.at_q, s.at_od, s.at_t = at_q[sel] + lo, at_od[sel] + lo, at_t[sel] + lo
    s.plain = (nonneg & (size_n == stride_n) & (offset >= 0))[sel]
    s.lo, s.buf, s.text = lo, buf, None
    return s


def window_text(s: Scanned) -> str:
    """The scanned window's bytes as Latin-1 text (one character per byte, positions
    ``lo`` less than the data's): slices of it are the ASCII strings of the window."""
    if s.text is None:
        s.text = s.buf.decode("latin-1")
    return s.text


def _tuples(cols: list[tuple[Any, Any]], count: Any, sel: Any, nsel: int) -> list[tuple[int, ...]]:
    """Per selected row (``nsel`` of them), the tuple of its ``count`` leading values."""
    count = count[sel]
    vals = [c[sel].tolist() for c, _m in cols]
    if not vals:
        return [()] * nsel
    width = int(count.max()) if len(count) else 0
    if width and int(count.min()) == width:
        return list(zip(*vals[:width], strict=True))
    out: list[tuple[int, ...]] = []
    for i, c in enumerate(count.tolist()):
        out.append(tuple(v[i] for v in vals[:c]))
    return out
