"""DCP items read fast: the one-tensor ``torch.save`` zips a ``.distcp`` file holds back to
back, parsed with the least work (the general path is :class:`~torchless.container.zip.ZipReader`
and :func:`~torchless.formats.pt.read.read_zip_checkpoint`, which
:class:`~torchless.formats.dcp.read.DCPReader` runs on anything this refuses).

:func:`fast_item` reads one item's end record, central directory (:func:`_directory_full`:
the record layouts are :mod:`torchless.container.zip`'s public ones) and ``data.pkl``;
:class:`ItemTemplate` holds the byte pattern of an item shape seen once, so that the items of
a file are checked as NumPy rows together (:func:`batch_items`). Each accepts only the
exact shape torch writes and returns None on anything else (tests compare the two paths
on generated and mutated items). ``SETTINGS.dcp_items`` selects this path.
"""

from __future__ import annotations

import re
import struct
from typing import Any

import numpy as np

from ...container.zip import (
    CENTRAL_HEADER,
    CENTRAL_SIG,
    EOCD64_RECORD,
    EOCD64_SIG,
    EOCD_RECORD,
    EOCD_SIG,
    LOC64_RECORD,
    LOC64_SIG,
    LOCAL_HEADER,
    LOCAL_SIG,
    MAX32,
)
from ...core.errors import (
    TorchlessError,
)
from ...core.tensor import Storage, Tensor
from ...core.values import StorageType
from ...pickle.fastpath import FALLBACK, fast_load
from ...pickle.globals import AllowlistResolver
from ...pickle.torch_globals import DEFAULT_ALLOWLIST
from ..pt.spec import BYTEORDER, DATA_PKL, METADATA_RECORDS

__all__ = [
    "fast_item",
    "item_directory",
    "ItemTemplate",
    "TEMPLATES",
    "batch_items",
    "item_pid",
    "frame_facts",
    "BATCH_ITEMS",
    "PREFAULT_MAX",
]

_ITEM_RECORDS = METADATA_RECORDS


def fast_item(mv: memoryview) -> tuple[Tensor, int, str, int] | None:
    """The chunk tensor of one DCP item, parsed with the least work, or None.

    An item is a small ``torch.save`` zip of one tensor. This reads its end record and
    central directory and the local headers of the records it uses, and runs its
    ``data.pkl`` through :func:`~torchless.pickle.fastpath.fast_load`. It accepts only
    the exact shape torch writes (no zip64, no comment, stored records, no duplicate or
    directory names, every record inside the item, one storage), and on anything else
    returns None so that the general :class:`ZipReader` and
    :func:`~torchless.formats.pt.read.read_zip_checkpoint` run and raise their errors: it
    accepts nothing that path refuses and finds the same tensor, byte order and payload
    offset (tests compare the two on generated and mutated items).

    Returns:
        ``(tensor, payload offset in the item, byte order, end of the payload record)``.
    """
    try:
        return _fast_item_or_none(mv)
    except (struct.error, UnicodeError, IndexError, ValueError, TypeError, TorchlessError):
        return None


def _directory_full(mv: memoryview) -> tuple[dict[bytes, tuple[str, int, int]], str, int, int] | None:  # noqa: C901
    """The central directory of an item, checked: ``(by lower-case name, first name,
    cd_off, cd_end)``; None for anything but the shape torch writes."""
    n = len(mv)
    eo = n - EOCD_RECORD.size
    if eo < CENTRAL_HEADER.size:
        return None
    sig, disk, cd_disk, n_disk, n_total, cd_size, cd_off, clen = EOCD_RECORD.unpack_from(mv, eo)
    if (
        sig != EOCD_SIG
        or disk
        or cd_disk
        or clen
        or n_disk != n_total
        or not 0 < n_total <= 32
        or n_total * CENTRAL_HEADER.size > cd_size
    ):
        return None
    cd_end = eo
    if eo >= LOC64_RECORD.size and mv[eo - LOC64_RECORD.size : eo - LOC64_RECORD.size + 4] == LOC64_SIG:
        # torch's writer always adds a zip64 end record and its locator; accept them only
        # where they sit in that layout and repeat the 32-bit end record's values
        _lsig, _ldisk, e64_off, ltotal = LOC64_RECORD.unpack_from(mv, eo - LOC64_RECORD.size)
        if ltotal != 1 or e64_off != eo - LOC64_RECORD.size - EOCD64_RECORD.size or e64_off < 0:
            return None
        rec = EOCD64_RECORD.unpack_from(mv, e64_off)
        if (
            rec[0] != EOCD64_SIG
            or rec[1] < EOCD64_RECORD.size - 12
            or rec[4:10] != (disk, cd_disk, n_disk, n_total, cd_size, cd_off)
        ):
            return None
        cd_end = e64_off
    if cd_off + cd_size != cd_end:
        return None
    cd = bytes(mv[cd_off:cd_end])
    by_lower: dict[bytes, tuple[str, int, int]] = {}
    first = ""
    p = 0
    for i in range(n_total):
        (csig, _made, _need, flags, method, _mt, _md, _crc, csize, usize, nlen, xlen, elen, dstart, _ia, eattr, hoff) = (
            CENTRAL_HEADER.unpack_from(cd, p)
        )
        q = p + CENTRAL_HEADER.size
        if (
            csig != CENTRAL_SIG
            or method != 0
            or csize != usize
            or flags & 0x2061
            or dstart != 0
            or eattr & 0x10
            or MAX32 in (csize, hoff)
        ):
            return None
        if q + nlen + xlen + elen > cd_size or hoff + LOCAL_HEADER.size + csize > n:
            return None
        raw = cd[q : q + nlen]
        if not raw or raw.endswith(b"/"):
            return None
        name = raw.decode("utf-8", "strict")
        low = raw.lower()
        if low in by_lower:
            return None
        by_lower[low] = (name, hoff, csize)
        if i == 0:
            first = name
        p = q + nlen + xlen + elen
    return by_lower, first, cd_off, cd_end


class ItemTemplate:
    """The end of a DCP item (central directory and end records) as torch writes it for
    one set of record names: every byte is fixed but each entry's CRC, sizes and offset
    and the end records' directory offsets. Items of one checkpoint share it, so after
    one item passed :func:`_directory_full`, the next ones are checked with one pattern
    match (the fixed bytes) and one unpack (the variable fields)."""

    __slots__ = ("length", "pattern", "fields", "names", "first", "tail", "var", "columns")

    def __init__(self, tail: bytes, cd_size: int, by_lower: dict[bytes, tuple[str, int, int]], first: str) -> None:
        self.length = len(tail)
        var: list[tuple[int, int]] = []
        p = 0
        order = []
        while p < cd_size:
            nlen, xlen, elen = struct.unpack_from("<HHH", tail, p + 28)
            var += [(p + 16, 4), (p + 20, 4), (p + 24, 4), (p + 42, 4)]
            order.append(tail[p + CENTRAL_HEADER.size : p + CENTRAL_HEADER.size + nlen])
            p += CENTRAL_HEADER.size + nlen + xlen + elen
        var += [
            (cd_size + 48, 8),
            (cd_size + EOCD64_RECORD.size + 8, 8),
            (cd_size + EOCD64_RECORD.size + LOC64_RECORD.size + 16, 4),
        ]
        pat = b""
        fmt = "<"
        at = 0
        for off, k in var:
            pat += re.escape(tail[at:off]) + b".{%d}" % k
            fmt += "x" * (off - at) + ("I" if k == 4 else "Q")
            at = off + k
        pat += re.escape(tail[at:])
        self.tail = tail
        self.var = var
        self.pattern = re.compile(pat, re.DOTALL)
        self.fields = struct.Struct(fmt)
        # the same fields as one NumPy record of the end's bytes (rows of many items at once)
        self.columns = np.dtype(
            {
                "names": [f"f{j}" for j in range(len(var))],
                "formats": ["<u4" if k == 4 else "<u8" for _off, k in var],
                "offsets": [off for off, _k in var],
                "itemsize": len(tail),
            }
        )
        self.names = [(raw.lower(), by_lower[raw.lower()][0]) for raw in order]
        self.first = first

    def directory(self, mv: memoryview) -> tuple[dict[bytes, tuple[str, int, int]], str] | None:
        n = len(mv)
        start = n - self.length
        if start < 0 or self.pattern.fullmatch(mv, start) is None:
            return None
        v = self.fields.unpack_from(mv, start)
        if v[-3] != start or v[-1] != start or v[-2] != n - EOCD_RECORD.size - LOC64_RECORD.size - EOCD64_RECORD.size:
            return None
        by_lower: dict[bytes, tuple[str, int, int]] = {}
        i = 1
        for low, name in self.names:
            csize, usize, hoff = v[i], v[i + 1], v[i + 2]
            if csize != usize or csize == MAX32 or hoff == MAX32 or hoff + LOCAL_HEADER.size + csize > n:
                return None
            by_lower[low] = (name, hoff, csize)
            i += 4
        return by_lower, self.first


#: (archive prefix, record name) -> the lower-case full name looked up
_REC_KEYS: dict[tuple[str, str], bytes] = {}

#: templates of the item ends seen (a few: one per record-name set)
TEMPLATES: list[ItemTemplate] = []


def item_directory(mv: memoryview) -> tuple[dict[bytes, tuple[str, int, int]], str] | None:
    for t in TEMPLATES:
        got = t.directory(mv)
        if got is not None:
            return got
    full = _directory_full(mv)
    if full is None:
        return None
    by_lower, first, cd_off, cd_end = full
    if cd_end != len(mv) - EOCD_RECORD.size - LOC64_RECORD.size - EOCD64_RECORD.size or len(TEMPLATES) >= 8:
        return by_lower, first  # only torch's layout (with the zip64 end records) is templated
    t = ItemTemplate(bytes(mv[cd_off:]), cd_end - cd_off, by_lower, first)
    if t.directory(mv) == (by_lower, first):  # the template must say what the full parse said
        TEMPLATES.append(t)
    return by_lower, first


def item_pid(pid: Any) -> bool:
    """A persistent id of the one storage a DCP item may name: ``("storage", <storage
    type>, key, location, numel >= 0)`` (both item readers check it here)."""
    return (
        type(pid) is tuple
        and len(pid) == 5
        and pid[0] == "storage"
        and type(pid[1]) is StorageType
        and type(pid[2]) is str
        and type(pid[4]) is int
        and pid[4] >= 0
    )


def _fast_item_or_none(mv: memoryview) -> tuple[Tensor, int, str, int] | None:
    n = len(mv)
    got = item_directory(mv)
    if got is None:
        return None
    by_lower, first = got
    if "/" not in first:
        return None
    prefix = first.split("/", 1)[0]

    def record(rel: str) -> tuple[str, int, int] | None:
        key = _REC_KEYS.get((prefix, rel))
        if key is None:
            key = f"{prefix}/{rel}".encode("utf-8", "surrogateescape").lower()
            if len(_REC_KEYS) < 4096:
                _REC_KEYS[(prefix, rel)] = key
        return by_lower.get(key)

    def data_at(rec: tuple[str, int, int]) -> int:
        _name, hoff, size = rec
        lsig, _n, _f, _m, _t, _d, _c, _cs, _us, lnlen, lxlen = LOCAL_HEADER.unpack_from(mv, hoff)
        if lsig != LOCAL_SIG:
            raise ValueError("local header")
        off = hoff + LOCAL_HEADER.size + lnlen + lxlen
        if off + size > n:
            raise ValueError("record past the item")
        return off

    byteorder = "little"
    for rel in _ITEM_RECORDS:
        rec = record(rel)
        if rec is not None and rec[2] <= 64:
            off = data_at(rec)
            if rel == BYTEORDER:
                byteorder = bytes(mv[off : off + rec[2]]).decode("ascii", "replace")
    if byteorder not in ("little", "big"):
        return None
    pkl = record(DATA_PKL)
    if pkl is None:
        return None
    off = data_at(pkl)
    found: list[tuple[Storage, int, int]] = []

    def persistent_load(pid: Any) -> Storage:
        if found or not item_pid(pid):
            raise ValueError("not the one storage of a DCP item")
        stype, key, location, numel = pid[1], pid[2], pid[3], pid[4]
        dtype = stype.dtype
        rec = record(f"data/{key}")
        if dtype is None or rec is None or rec[2] != numel * dtype.itemsize:
            raise ValueError("storage record")
        st = Storage(key, rec[2], dtype, str(location), byteorder=byteorder, origin=rec[0])
        found.append((st, data_at(rec), rec[2]))
        return st

    t, _seen = fast_load(bytes(mv[off : off + pkl[2]]), AllowlistResolver(DEFAULT_ALLOWLIST, weights_only=True), persistent_load)
    if t is FALLBACK or type(t) is not Tensor or not found or t.storage is not found[0][0]:
        return None
    st, base, size = found[0]
    return t, base, byteorder, base + size


#: rows of item ends gathered at once by :func:`batch_items` (bounds its memory)
_BATCH_ROWS = 4096
#: the largest span :meth:`DCPReader._prefault` maps ahead
PREFAULT_MAX = 64 << 20
#: items :meth:`DCPReader.locate_many` checks together
BATCH_ITEMS = 512


def _gather(buf: np.ndarray, pos: np.ndarray, k: int | np.ndarray) -> np.ndarray:
    """Rows of ``k`` bytes of ``buf`` at ``pos`` (clipped to the buffer: rows of items
    already refused may read anything); ``k`` an array: the bytes at those offsets from
    each position. ``pos`` of any shape: the rows along a last axis added."""
    cols = np.arange(k) if isinstance(k, int) else k
    return buf[np.minimum(pos[..., None] + cols, len(buf) - 1)]


#: the bytes of a local header :func:`batch_items` reads: its signature, name and extra lengths
_HEAD_COLS = np.array([0, 1, 2, 3, 26, 27, 28, 29])


def _le(cols: np.ndarray) -> np.ndarray:
    """Little-endian unsigned ints from the byte columns ``cols`` (rows x 2, 4 or 8)."""
    k = cols.shape[1]
    return np.ascontiguousarray(cols).view({2: "<u2", 4: "<u4", 8: "<u8"}[k]).ravel().astype(np.int64)


def batch_items(buf: np.ndarray, offs: np.ndarray, lens: np.ndarray, t: ItemTemplate) -> dict[str, Any] | None:
    """The zip structure of many DCP items of one file checked at once against the end
    template ``t``: every check :func:`_fast_item_or_none` makes on an item's end records,
    central directory and local headers (and the local headers of every record, which it
    checks only for the ones it reads: stricter, never looser), as array operations.

    Returns ``{"ok": bool per item, "rec": {lower-case name: (data offset, size, CRC-32
    the directory gives) arrays},
    "prefix": ..., "byteorder": str per item or None}``; None when the template's names
    are not torch's shape."""
    if "/" not in t.first:
        return None
    n_items = len(offs)
    L = t.length
    ok = (offs >= 0) & (lens >= L) & (offs + lens <= len(buf))
    tail = np.frombuffer(t.tail, dtype=np.uint8)
    fixed = np.ones(L, dtype=bool)
    for off, k in t.var:
        fixed[off : off + k] = False
    fixed_idx = np.nonzero(fixed)[0]
    fields = np.zeros((n_items, len(t.var)), dtype=np.int64)
    idx = np.nonzero(ok)[0]
    raw = buf.data  # the same bytes as a memoryview (slices of it are cheap)
    columns = t.columns
    for b0 in range(0, len(idx), _BATCH_ROWS):
        rows = idx[b0 : b0 + _BATCH_ROWS]
        starts = offs[rows] + lens[rows] - L
        # the rows copied out by slices (one join), not gathered by an index per byte
        joined = b"".join([raw[s : s + L] for s in starts.tolist()])
        m = np.frombuffer(joined, dtype=np.uint8).reshape(len(rows), L)
        good = (m[:, fixed_idx] == tail[fixed_idx]).all(axis=1)
        ok[rows] &= good
        rec_rows = np.frombuffer(joined, dtype=columns)  # every variable field, little-endian
        fields[rows] = np.stack([rec_rows[f"f{j}"] for j in range(len(t.var))], axis=1)
    start = lens - L
    ok &= (fields[:, -3] == start) & (fields[:, -1] == start)
    ok &= fields[:, -2] == lens - EOCD_RECORD.size - LOC64_RECORD.size - EOCD64_RECORD.size
    safe = np.where(ok, offs, 0)
    # an item starts with a local header (so it is no safetensors blob)
    sig = int.from_bytes(LOCAL_SIG, "little")
    ok &= _le(_gather(buf, safe, 4)) == sig
    # every record's directory fields and local header at once (items x records)
    n_rec = len(t.names)
    per = fields[:, : 4 * n_rec].reshape(n_items, n_rec, 4)
    crc, csize, usize, hoff = per[:, :, 0], per[:, :, 1], per[:, :, 2], per[:, :, 3]
    lens2 = lens[:, None]
    ok &= ((csize == usize) & (csize != MAX32) & (hoff != MAX32) & (hoff + LOCAL_HEADER.size + csize <= lens2)).all(axis=1)
    head = _gather(buf, np.where(ok[:, None], offs[:, None] + hoff, 0), _HEAD_COLS).astype(np.int64)
    signed = head[:, :, 0] | head[:, :, 1] << 8 | head[:, :, 2] << 16 | head[:, :, 3] << 24
    data = hoff + LOCAL_HEADER.size + (head[:, :, 4] | head[:, :, 5] << 8) + (head[:, :, 6] | head[:, :, 7] << 8)
    ok &= ((signed == sig) & (data + csize <= lens2)).all(axis=1)
    rec: dict[bytes, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
    for i, (low, _name) in enumerate(t.names):
        rec[low] = (data[:, i], csize[:, i], crc[:, i])
    prefix = t.first.split("/", 1)[0]
    bo = rec.get(f"{prefix}/{BYTEORDER}".encode("utf-8", "surrogateescape").lower())
    byteorder: list[str] | None = None
    if bo is not None:
        # only "little" (or "big") of torch's writer: anything else is left to the per-item path
        data, size, _crc = bo
        pos = np.where(ok, offs + data, 0)
        word = _gather(buf, pos, 6)
        little = (size == 6) & (word == np.frombuffer(b"little", np.uint8)).all(axis=1)
        big = (size == 3) & (word[:, :3] == np.frombuffer(b"big", np.uint8)).all(axis=1)
        ok &= little | big
        byteorder = np.where(big, "big", "little").tolist()
    return {"ok": ok, "rec": rec, "prefix": prefix, "byteorder": byteorder}


def frame_facts(
    frame: tuple[Any, ...] | None, numel: int, size: tuple[int, ...], stride: tuple[int, ...]
) -> tuple[Any, ...] | None:
    """The facts :meth:`DCPReader._locate_chunk` keeps for an item's one-tensor pickle
    ``(storage key, storage bytes, dtype name, size, stride, offset, itemsize)`` from the
    facts ``frame`` of another pickle of its frame (``(storage key, dtype name, offset,
    itemsize)``, None when none was seen) and its own numel, size and stride: what
    building its tensor gives (the storage's bytes are its numel's, the tensor must lie
    inside them). None (the pickle then goes through
    :func:`~torchless.pickle.fastpath.fast_tensor`, which decides) for a frame not seen,
    a negative numel, size or stride, ranks that differ, or a tensor past its storage."""
    if frame is None or numel < 0 or len(size) != len(stride) or (size and (min(size) < 0 or min(stride) < 0)):
        return None
    key, dname, offset, isz = frame
    if 0 not in size and offset + sum((s - 1) * st for s, st in zip(size, stride, strict=True)) >= numel:
        return None  # past its storage (Tensor._check_bounds)
    return key, numel * isz, dname, size, stride, offset, isz
