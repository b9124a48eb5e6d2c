"""The central directory's fast path: runs of same-sized entries parsed as NumPy rows
(:class:`DirectoryRun`, :func:`directory_run`) giving the entries the entry-by-entry loop
of :class:`~torchless.container.zip_read.ZipReader` gives (that loop is the general path;
``Settings.zip_directory`` selects this one, see :mod:`torchless.core.settings`).
"""

from __future__ import annotations

import struct
from typing import Any

from .zip_spec import CENTRAL_SIG, LOCAL_HEADER, MAX32, ZipEntry

RUN_MIN = 32

#: the fields of a central-directory entry the reader keeps, by offset
_CENTRAL_FIELDS = (
    ("flags", 8, "<u2"),
    ("method", 10, "<u2"),
    ("mtime", 12, "<u2"),
    ("crc", 16, "<u4"),
    ("csize", 20, "<u4"),
    ("usize", 24, "<u4"),
    ("dstart", 34, "<u2"),
    ("eattr", 38, "<u4"),
    ("hoff", 42, "<u4"),
)


class DirectoryRun:
    """Entries ``first .. first + count`` of a central directory read together as rows of
    one size (:func:`directory_run`): the fields checks of every entry need, as NumPy
    columns, and the names as one block of ``count`` names of ``nlen`` bytes (``names``:
    its rows; ``text``: the block decoded when every byte is ASCII, else None). Made
    from the same bytes as the entries, so a check of the columns is a check of them."""

    __slots__ = ("first", "count", "nlen", "blob", "names", "text", "method", "csize", "usize", "flags", "hoff", "eattr")

    def __init__(self, first: int, count: int, nlen: int, blob: bytes, text: str | None, cols: dict[str, Any]) -> None:
        import numpy as np

        self.first, self.count, self.nlen, self.blob, self.text = first, count, nlen, blob, text
        self.names = np.frombuffer(blob, np.uint8).reshape(count, nlen)
        self.method, self.csize, self.usize = cols["method"], cols["csize"], cols["usize"]
        self.flags, self.hoff, self.eattr = cols["flags"], cols["hoff"], cols["eattr"]

    def starts_with(self, prefix: str) -> Any:
        """Per entry, ``entry.name.startswith(prefix)``, for a run of ASCII names (all
        False when the names are not ASCII: the caller then tests them one by one)."""
        import numpy as np

        if self.text is None or not prefix.isascii() or len(prefix) > self.nlen:  # (no ASCII name starts with non-ASCII)
            return np.zeros(self.count, dtype=bool)
        return (self.names[:, : len(prefix)] == np.frombuffer(prefix.encode("ascii"), np.uint8)).all(axis=1)


def directory_run(
    cd: bytes, p: int, i: int, left: int, cd_off: int, disk: int, size: int
) -> tuple[list[ZipEntry], int, DirectoryRun] | None:
    """The entries from ``cd[p:]`` (entry number ``i``) that all have the size of the first
    one and no extra field or comment, as ZipEntry objects, with the position after
    them and their columns; None when fewer than :data:`RUN_MIN` do.

    Rows that the entry-by-entry loop would refuse, or treat specially (a zip64 size, a
    different size, bad signature, inconsistent sizes, a disk number, a record past the
    end of the file, masked headers), end the run: the loop then reads (or refuses) them
    itself. The entries made are the ones the loop makes."""
    import numpy as np

    if len(cd) - p < 46 or cd[p : p + 4] != CENTRAL_SIG:
        return None
    nlen, xlen, clen = struct.unpack_from("<HHH", cd, p + 28)
    if xlen or clen:
        return None
    step = 46 + nlen
    cnt = min(left, (len(cd) - p) // step)
    if cnt < RUN_MIN:
        return None
    head = np.frombuffer(cd, np.uint8, count=step, offset=p)
    w = RUN_MIN * 2
    while True:  # the run's length in windows growing 4x (work in proportion to the run)
        c = min(cnt, w)
        rows = np.frombuffer(cd, np.uint8, count=c * step, offset=p).reshape(c, step)
        same = (rows[:, :4] == head[:4]).all(axis=1) & (rows[:, 28:34] == head[28:34]).all(axis=1)
        if not same.all():
            cnt = int(same.argmin())
            break
        if c == cnt:
            break
        w *= 4
    if cnt < RUN_MIN:
        return None
    rows = rows[:cnt]
    ok = np.ones(cnt, dtype=bool)
    dt = np.dtype({"names": [f[0] for f in _CENTRAL_FIELDS], "formats": [f[2] for f in _CENTRAL_FIELDS],
                   "offsets": [f[1] for f in _CENTRAL_FIELDS], "itemsize": step})  # fmt: skip
    rec = np.frombuffer(cd, dt, count=cnt, offset=p)
    csize, usize, hoff = (rec[k].astype(np.int64) for k in ("csize", "usize", "hoff"))
    method, mtime, flags, dstart = rec["method"], rec["mtime"], rec["flags"], rec["dstart"]
    big = (csize == MAX32) | (usize == MAX32) | (hoff == MAX32)
    ok &= ~big
    ok &= ~(((method == 0) & (mtime == 0) & (usize != csize)) | ((usize != 0) & (csize == 0)))
    ok &= (dstart != 0xFFFF) & ((dstart == disk) | (dstart == 1))
    ok &= hoff + LOCAL_HEADER.size + csize <= size
    ok &= (flags & 0x2000) == 0
    if not ok.all():
        cnt = int(ok.argmin())
        if cnt < RUN_MIN:
            return None
        rows, rec = rows[:cnt], rec[:cnt]
        csize, usize, hoff = csize[:cnt], usize[:cnt], hoff[:cnt]
    names = rows[:, 46:]
    blob = names.tobytes()
    raws = rows_of(blob, nlen) if nlen else [b""] * cnt
    text: str | None = None
    if nlen and (names < 0x80).all():
        text = blob.decode("ascii")
        strs = [text[j : j + nlen] for j in range(0, cnt * nlen, nlen)]
    else:
        strs = [r.decode("utf-8", "surrogateescape") for r in raws]
    # ZipEntry(index, name, raw_name, header_offset, compressed_size, size, crc, method,
    # flags, central_offset, b"", external_attr) per row, without a call per entry; stored
    # records (both sizes the same) share one int object for the two
    usizes = usize.tolist()
    csizes = usizes if (csize == usize).all() else csize.tolist()
    run: list[ZipEntry] = []
    new = ZipEntry.__new__
    rows_in = zip(
        range(i, i + cnt),
        strs,
        raws,
        hoff.tolist(),
        csizes,
        usizes,
        rec["crc"].tolist(),
        rec["method"].tolist(),
        rec["flags"].tolist(),
        range(cd_off + p, cd_off + p + cnt * step, step),
        rec["eattr"].tolist(),
        strict=True,
    )
    for index, name, raw, h, c, u, crc, m, f, co, ea in rows_in:
        e = new(ZipEntry)
        e.index = index
        e.name = name
        e.raw_name = raw
        e.header_offset = h
        e.compressed_size = c
        e.size = u
        e.crc = crc
        e.method = m
        e.flags = f
        e.central_offset = co
        e.extra = b""
        e.external_attr = ea
        e._data_offset = None
        run.append(e)
    cols = {k: rec[k].astype(np.int64) for k in ("method", "flags", "eattr")}  # (copies: no view of the directory kept)
    cols.update(csize=csize, usize=usize, hoff=hoff)
    return run, p + cnt * step, DirectoryRun(i, cnt, nlen, blob, text, cols)


def rows_of(blob: bytes, n: int) -> list[bytes]:
    """``blob`` cut into rows of ``n`` bytes (``[blob[j : j + n] for j in ...]``), in one
    NumPy call when no row ends in a zero byte (NumPy's fixed-width bytes drop trailing
    zeros: those rows are sliced one by one)."""
    import numpy as np

    rows = np.frombuffer(blob, np.uint8).reshape(-1, n)
    if len(rows) and rows[:, -1].all():
        out: list[bytes] = np.frombuffer(blob, f"S{n}").tolist()
        return out
    return [blob[j : j + n] for j in range(0, len(blob), n)]
