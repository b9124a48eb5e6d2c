"""Reading many records of one archive: :class:`RecordLoader` (a storage's loader for one
record) and :class:`BatchReader` (eager reads of many small stored records with few
system calls).
"""

from __future__ import annotations

import bisect
import operator
import os
import weakref
from collections.abc import Iterable
from typing import Any, Protocol

from ..core.gcpause import GCPause
from ..io.source import ByteSource
from .zip_spec import LOCAL_HEADER, LOCAL_SIG_U32, ZipEntry

_HEADER_OFFSET = operator.attrgetter("header_offset")
_SIZE = operator.attrgetter("size")
_METHOD = operator.attrgetter("method")
_weak = weakref.ref
_deref = weakref.ReferenceType.__call__  # (a weak reference's object, or None)
_NONE_TYPE = {type(None)}


class Records(Protocol):
    """What the loaders read records through: a :class:`~torchless.container.zip_read.ZipReader`
    (named by its methods here, so that the reader can make a :class:`BatchReader`)."""

    @property
    def source(self) -> ByteSource: ...

    def data_offset(self, entry: ZipEntry) -> int: ...

    def read(self, name: Any) -> memoryview: ...

    def check_read(self, entry: ZipEntry) -> int: ...


class RecordLoader:
    """A storage's loader for a zip record (see :class:`~torchless.core.tensor.Storage`).

    Called, it returns the record's first ``nbytes`` bytes, read as :meth:`~torchless.container.zip_read.ZipReader.read`
    does or, with ``batch``, through a :class:`BatchReader`. :meth:`check` raises what the
    call would raise and returns the length the call would return, without keeping the
    bytes (:meth:`~torchless.container.zip_read.ZipReader.check_read`): ``verify`` checks every storage after the CRC-32
    pass read each record, so no payload is read twice (fetched twice, at a URL) or
    held whole.
    """

    __slots__ = ("zr", "entry", "nbytes", "batch")

    def __init__(self, zr: Records, entry: ZipEntry, nbytes: int | None = None, batch: BatchReader | None = None) -> None:
        self.zr = zr
        self.entry = entry
        self.nbytes = entry.size if nbytes is None else nbytes
        self.batch = batch

    @classmethod
    def many(cls, zr: Records, entries: list[ZipEntry], sizes: list[int], batch: BatchReader | None = None) -> list[RecordLoader]:
        """``RecordLoader(zr, entry, nbytes, batch)`` for each entry and size, without a
        call per loader (one per storage of a checkpoint of many tensors)."""
        new = cls.__new__
        out = []
        for entry, nbytes in zip(entries, sizes, strict=True):
            ld = new(cls)
            ld.zr = zr
            ld.entry = entry
            ld.nbytes = nbytes
            ld.batch = batch
            out.append(ld)
        return out

    def __call__(self) -> memoryview:
        if self.batch is not None:
            return self.batch.read(self.entry, self.nbytes)
        return self.zr.read(self.entry)[: self.nbytes]

    def check(self) -> int:
        zr, e = self.zr, self.entry
        if self.batch is not None:  # what BatchReader.read raises: the local header, the bounds
            zr.source.check(zr.data_offset(e), self.nbytes, what=f"record {e.name!r}")
            return self.nbytes
        return min(zr.check_read(e), self.nbytes)


class BatchReader:
    """Eager reads of many small stored records with few system calls.

    Records are :meth:`add`-ed up front (a checkpoint's storages); the first :meth:`read`
    of a small one reads the run of added records around it in file order (up to
    :data:`CHUNK` bytes, no gap over :data:`GAP`) with one positioned read into a new
    buffer, and hands each record of the run a view of its own slice of it, the
    requested one now and the others when they are read. Large records, and any record
    whose local header does not check out in the run, are read on their own exactly as
    :meth:`~torchless.container.zip_read.ZipReader.data_offset` + ``source.copy`` do (raising their errors).

    A record added with an *owner* (an object with a ``hold(view)`` method: a storage)
    hands the owner its slice as soon as its run is read, instead of keeping it for a
    later :meth:`read` (the owner then has its bytes without asking again); an owner
    class with a ``hold_many(owners, buf, offsets, sizes)`` static method (a storage)
    takes a whole run's slices in one call. Owners are referred to weakly: their loaders
    refer to the reader, so a strong reference back would make every storage of a load
    and the reader one cycle, freed only by a full GC pass (an owner gone before its run
    is read is skipped).
    """

    CHUNK = 32 << 20
    SMALL = 1 << 20
    GAP = 64 << 10
    SLACK = 1024  # bytes read past a record's nominal end for its local name and extra field

    def __init__(self, zr: Records) -> None:
        self.zr = zr
        self._entries: list[ZipEntry] = []
        self._owners: list[Any] = []  # per added entry: a weak reference to who takes its bytes when its run is read, or None
        self._sorted: list[ZipEntry] | None = None
        self._sorted_owners: list[Any] = []
        self._hoff: Any = None  # header offsets of _sorted (an array)
        self._ready: dict[int, memoryview] = {}  # id(entry) -> its bytes from a run read earlier
        self._consumed: set[int] = set()  # entries already handed out
        # spans being read ahead (read_ahead): (start, end, future of their bytes)
        self._ahead: list[tuple[int, int, Any]] = []
        self._ahead_starts: list[int] = []
        self._ahead_last: list[int] = []
        self._ahead_pid = 0  # the process that started the read-ahead
        # the records read ahead with their header offsets and ends (arrays), or None
        self._ahead_cols: tuple[list[ZipEntry], Any, Any] | None = None

    def add(self, entry: ZipEntry) -> None:
        if entry.method == 0 and entry.size <= self.SMALL:
            self._entries.append(entry)
            self._owners.append(None)
            self._sorted = None

    def add_many(self, entries: list[ZipEntry], owners: list[Any]) -> None:
        """:meth:`add` each entry, with the owner of the same index (see the class)."""
        if len(entries) != len(owners):
            raise ValueError("one owner per entry")
        small = self.SMALL
        try:
            refs: list[Any] = list(map(_weak, owners))
        except TypeError:  # (an owner None, no one to hand its bytes to: weakref.ref refuses it)
            refs = [None if o is None else _weak(o) for o in owners]
        if entries and not any(map(_METHOD, entries)) and max(map(_SIZE, entries)) <= small:
            self._entries += entries
            self._owners += refs
        else:
            for e, ref in zip(entries, refs, strict=True):
                if e.method == 0 and e.size <= small:
                    self._entries.append(e)
                    self._owners.append(ref)
        self._sorted = None

    def read(self, entry: ZipEntry, nbytes: int) -> memoryview:
        """``nbytes`` of the record's data, in memory of its own (a slice of a run)."""
        got = self._ready.pop(id(entry), None)
        if got is not None and len(got) >= nbytes:
            self._consumed.add(id(entry))
            return got[:nbytes]
        if self._sorted is None:
            self._sort()
        i = self._position(entry)
        if i is not None and nbytes <= entry.size:
            mv = self._read_run(i, entry)
            if mv is not None:
                return mv[:nbytes]
        zr = self.zr
        return zr.source.copy(zr.data_offset(entry), nbytes, what=f"record {entry.name!r}")

    def read_ahead(self, entries: Iterable[ZipEntry]) -> None:
        """Start reading, on a helper thread, the runs that reads of ``entries`` (the
        small stored ones: a checkpoint's storage records, all of which an eager load
        will ask for) are going to need, so that the copy runs on a second core while
        the caller goes on (parses the pickle). The runs are found as :meth:`read`
        finds them (the same CHUNK, GAP and SLACK); a read whose run lies inside one
        takes its bytes from it, any other reads as before. Nothing happens for a
        source that reads only when asked (a URL) or entries not in file order."""
        import numpy as np

        small = self.SMALL
        todo = [e for e in entries if e.method == 0 and e.size <= small]
        if len(todo) < 2:
            return
        hoff = np.fromiter(map(_HEADER_OFFSET, todo), np.int64, len(todo))
        ends = hoff + LOCAL_HEADER.size + np.fromiter(map(_SIZE, todo), np.int64, len(todo))
        if not (hoff[1:] >= ends[:-1]).all():
            # out of file order, or records that overlap (a hostile directory naming one
            # record many times would have it read ahead once per name: memory without bound)
            return
        joins = np.zeros(len(todo), dtype=bool)
        gap = hoff[1:] - ends[:-1]
        joins[1:] = (gap >= 0) & (gap <= self.GAP)
        size = self.zr.source.size
        spans: list[tuple[int, int]] = []
        lasts: list[int] = []  # the header offset of each span's last record
        i, n = 0, len(todo)
        while i < n:
            start = int(hoff[i])
            k = int(np.searchsorted(hoff, start + self.CHUNK, side="right"))
            fits = joins[i + 1 : k] & (ends[i + 1 : k] + self.SLACK - start <= self.CHUNK)
            j = i + 1 + (int(fits.argmin()) if len(fits) and not fits.all() else len(fits))
            last = todo[j - 1]
            end = min(size, last.header_offset + LOCAL_HEADER.size + last.size + len(last.raw_name) + self.SLACK)
            if end > start:
                spans.append((start, end - start))
                lasts.append(last.header_offset)
            i = j
        futs = self.zr.source.read_ahead(spans)
        if futs is not None:
            self._ahead_cols = (todo, hoff, ends)  # (for _sort, when these are the records added)
            self._ahead_starts = [s for s, _ in spans]
            self._ahead_last = lasts
            self._ahead = [(s, s + m, f) for (s, m), f in zip(spans, futs, strict=True)]
            self._ahead_pid = os.getpid()

    def _from_ahead(self, start: int, end: int) -> memoryview | None:
        """``[start, end)`` from a span read ahead that holds it, else None. (A span is
        kept while this reader lives: runs asked for out of file order take their
        pieces of it; its memory is what the views handed out hold anyway.)"""
        ahead = self._ahead
        k = bisect.bisect_right(self._ahead_starts, start) - 1
        if k < 0:
            return None
        s, e, fut = ahead[k]
        if end > e:
            return None
        if os.getpid() != self._ahead_pid and not fut.done():
            return None  # a forked child: the helper thread that would finish it is the parent's
        try:
            mv = fut.result()
        except Exception:  # noqa: BLE001 - the read on its own raises what is wrong
            return None
        view: memoryview = mv.obj[start - s : end - s].data
        return view

    def _sort(self) -> None:
        """The added records in file order, with their offsets, sizes and the gaps
        between neighbours as arrays (a run's extent is then found on columns)."""
        import numpy as np

        entries, owners = self._entries, self._owners
        cols, self._ahead_cols = self._ahead_cols, None  # (used once: the entries are kept in _sorted)
        if cols is not None and len(cols[0]) == len(entries) and all(map(operator.is_, cols[0], entries)):
            # the records read ahead, in the same order: in file order (read_ahead takes
            # no other), their offsets and ends found already
            self._sorted, self._sorted_owners = list(entries), list(owners)
            hoff, ends = cols[1], cols[2]
        else:
            offs = list(map(_HEADER_OFFSET, entries))
            if all(map(operator.le, offs, offs[1:])):  # torch writes its records in order
                self._sorted, self._sorted_owners = list(entries), list(owners)
            else:
                order = sorted(range(len(entries)), key=offs.__getitem__)
                self._sorted = list(map(entries.__getitem__, order))
                self._sorted_owners = list(map(owners.__getitem__, order))
                offs = list(map(offs.__getitem__, order))
            hoff = np.array(offs, dtype=np.int64)
            ends = hoff + LOCAL_HEADER.size + np.fromiter(map(_SIZE, self._sorted), np.int64, len(offs))
        gap = np.zeros(len(entries), dtype=np.int64)
        gap[1:] = hoff[1:] - ends[:-1]
        # (to the previous record) a record after the one before it, by at most GAP
        self._joins = (gap >= 0) & (gap <= self.GAP)
        self._hoff, self._ends = hoff, ends

    def _position(self, entry: ZipEntry) -> int | None:
        """The index of ``entry`` in file order (the last, when it was added twice)."""
        import numpy as np

        order = self._sorted
        assert order is not None
        k = int(np.searchsorted(self._hoff, entry.header_offset, side="right")) - 1
        while k >= 0 and self._hoff[k] == entry.header_offset:
            if order[k] is entry:
                return k
            k -= 1
        return None

    def _read_run(self, i: int, entry: ZipEntry) -> memoryview | None:
        import numpy as np

        order = self._sorted
        assert order is not None
        start = entry.header_offset
        # the run: the records after i that each follow the one before it closely and end,
        # with SLACK, within CHUNK of the start
        k = int(np.searchsorted(self._hoff, start + self.CHUNK, side="right"))
        fits = self._joins[i + 1 : k] & (self._ends[i + 1 : k] + self.SLACK - start <= self.CHUNK)
        j = i + 1 + (int(fits.argmin()) if len(fits) and not fits.all() else len(fits))
        if self._ahead:  # a run asked for out of file order ends where its span read ahead ends
            k = bisect.bisect_right(self._ahead_starts, start) - 1
            if k >= 0 and start < self._ahead[k][1]:
                cap = int(np.searchsorted(self._hoff, self._ahead_last[k], side="right"))
                if cap > i:
                    j = min(j, cap)
        last = order[j - 1]
        # to the last record's end, with room for its local name and extra field
        span_end = min(self.zr.source.size, last.header_offset + LOCAL_HEADER.size + last.size + len(last.raw_name) + self.SLACK)
        if span_end - start < LOCAL_HEADER.size:
            return None
        buf = self._from_ahead(start, span_end) if self._ahead else None
        if buf is None:
            buf = self.zr.source.copy(start, span_end - start, what=f"records from {entry.name!r}")
        mine: memoryview | None = None
        ready, consumed = self._ready, self._consumed
        owners = self._sorted_owners[i:j]
        run = order[i:j]
        # the local headers of the whole run at once: signature, name and extra lengths
        raw = buf.obj if isinstance(buf.obj, np.ndarray) else np.frombuffer(buf, np.uint8)
        span = len(raw) - 3
        rel = np.fromiter(map(_HEADER_OFFSET, run), np.int64, len(run)) - start
        sizes = np.fromiter(map(_SIZE, run), np.int64, len(run))
        head_ok = rel + LOCAL_HEADER.size <= len(raw)
        relc = np.where(head_ok, rel, 0)
        w16 = np.ndarray((span,), dtype="<u2", buffer=raw, strides=(1,)) if span > 0 else None
        w32 = np.ndarray((span,), dtype="<u4", buffer=raw, strides=(1,)) if span > 0 else None
        if w16 is None or w32 is None:
            return None
        d_arr = relc + LOCAL_HEADER.size + w16[relc + 26].astype(np.int64) + w16[relc + 28].astype(np.int64)
        good = head_ok & (w32[relc] == LOCAL_SIG_U32) & (d_arr + sizes <= len(raw))
        if good.all() and None not in owners:
            # every record checks out and has its owner (a checkpoint's storages): each
            # gets its slice now (GC paused: thousands of views that all live on)
            with GCPause():
                d_list, s_list = d_arr.tolist(), sizes.tolist()
                for e, d in zip(run, (d_arr + start).tolist(), strict=True):
                    e._data_offset = d
                live = list(map(_deref, owners))
                kinds = set(map(type, live)) - _NONE_TYPE
                many = getattr(next(iter(kinds)), "hold_many", None) if len(kinds) == 1 else None
                if many is not None:  # (one kind of owner, that takes many at once: storages)
                    many(live, buf, d_list, s_list)
                else:
                    for owner, d, sz in zip(live, d_list, s_list, strict=True):
                        if owner is not None:
                            owner.hold(buf[d : d + sz])
            consumed.add(id(entry))
            d0 = int(d_arr[0])  # the run starts with the record asked for
            return buf[d0 : d0 + int(sizes[0])]
        for e, d, sz, g, ref in zip(run, d_arr.tolist(), sizes.tolist(), good.tolist(), owners, strict=True):
            if not g:
                continue  # read on its own when asked for (its error then comes from data_offset)
            e._data_offset = start + d
            owner = None if ref is None else ref()
            if ref is not None and owner is None and e is not entry:
                continue  # its storage is gone: no one asks for these bytes
            if e is entry:
                mine = buf[d : d + sz]
                if owner is not None:
                    owner.hold(mine)
            elif owner is not None:
                owner.hold(buf[d : d + sz])
            elif id(e) not in consumed:
                ready[id(e)] = buf[d : d + sz]
        consumed.add(id(entry))
        return mine
