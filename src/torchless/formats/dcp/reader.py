"""The reader of a DCP directory: :class:`DCPReader` (metadata, chunk locations, payload reads).

It opens the checkpoint's ``.distcp`` files (memory maps locally, ranged reads at a URL),
checks each chunk's item against the bytes in its file (:meth:`DCPReader.locate`), and
assembles tensors lazily from their chunks; the copies of chunk bytes into a block and the
direct views a consolidation writes from are :mod:`.spans`. The item parsers and the chunk
records it builds on are :mod:`.read`; choosing this reader or the Hugging Face layout's
is :mod:`.readers`.
"""

from __future__ import annotations

import mmap
import os
import struct
import sys
from collections.abc import Sequence
from functools import partial
from typing import Any

import numpy as np

from ...container.zip import (
    LOCAL_SIG,
    ZipReader,
)
from ...core import jsonsafe
from ...core.errors import (
    FormatError,
    NotFoundError,
    TorchlessError,
    TruncatedError,
    UnsupportedError,
    UsageError,
    WhereAt,
    short_repr,
)
from ...core.findings import Problem
from ...core.settings import SETTINGS
from ...core.tensor import _PACKED, Storage, Tensor
from ...io.source import ByteSource, BytesSource, SliceSource
from ...io.store import Store
from ...pickle.fastpath import FALLBACK, OnceResolver, fast_tensor, tensor_frame
from ...pickle.globals import AllowlistResolver
from ...pickle.torch_globals import DEFAULT_ALLOWLIST
from ..pt.spec import DATA_PKL
from .constants import SAVED_OFFSETS, SHARDING_KEY, store_of
from .items import BATCH_ITEMS as _BATCH_ITEMS
from .items import PREFAULT_MAX as _PREFAULT_MAX
from .items import TEMPLATES as _TEMPLATES
from .items import ItemTemplate as _Template
from .items import batch_items as _batch_items
from .items import fast_item as _fast_item
from .items import frame_facts as _frame_facts
from .items import item_directory as _directory
from .items import item_pid as _item_pid
from .metadata import read_metadata
from .read import BlockStorage, ChunkRef, is_safetensors_blob, pread_into
from .spans import copy_chunk, direct_spans, view_spans
from .spec import BytesStorageMetadata, Metadata, StorageInfo, TensorStorageMetadata, numel

__all__ = ["DCPReader"]

#: located items' map pages are dropped once this many bytes of them have gathered
_RELEASE_BATCH = 8 << 20


def _file_size(reader: Any, f: str) -> int | None:
    if reader.remote:
        try:
            return reader._file(f).size
        except TorchlessError:
            return None
    p = os.path.join(reader.path, f)
    return os.path.getsize(p) if os.path.exists(p) else None


class DCPReader:
    """The parts of a DCP checkpoint: metadata, chunk locations and payload reads.

    Args:
        path: the checkpoint directory (holding ``.metadata``).
    """

    #: parse every item of this reader with the general zip reader and pickle machine
    #: (tests set it to compare the two paths); by default, unless
    #: ``SETTINGS.dcp_items`` is off, :func:`_fast_item` is tried first
    general_only = False
    #: a checkpoint at a URL (read by ranges through :mod:`torchless.io.remote`)
    remote = False
    #: where its files live (the store its location resolved to, handed in by its opener)
    store: Store
    #: :meth:`locate_many` checks the items of a file as arrays from this many on (tests
    #: set 0 to run the batch on every call)
    batch_min = 16
    #: set by close(): reads that need a file raise UsageError from then on
    _closed = False

    def __init__(self, path: Any, *, metadata: Metadata | None = None, store: Store | None = None) -> None:
        self.path = os.fspath(path)
        self.store = store_of(self.path, store)  # as its opener resolved it (or here, made directly)
        self.remote = self.store.remote
        if not self.store.isdir(self.path):
            raise NotFoundError("not a DCP checkpoint directory", path=self.path)
        self.metadata = metadata if metadata is not None else read_metadata(self.path, store=self.store)
        md = self.metadata
        if md.storage_data is None:
            raise UnsupportedError("DCP metadata without storage_data (not written by FileSystemWriter)", path=self.path)
        self._by_key: dict[tuple[str, Any], StorageInfo] = {(k.fqn, k.offset): v for k, v in md.storage_data.items()}
        self._chunks: dict[str, list[ChunkRef]] = {}
        self._fds: dict[str, int] = {}
        self._maps: dict[str, ByteSource] = {}
        self._blobs: dict[tuple[str, int], Any] = {}
        checked: set[str] = set()
        for key, info in md.storage_data.items():  # every file named, before any is opened
            if info.relative_path not in checked:  # (its first entry names it in the error)
                self.real_path(info.relative_path, key.fqn)
                checked.add(info.relative_path)
        for fqn, item in md.state_dict_metadata.items():
            if isinstance(item, TensorStorageMetadata):
                refs = []
                for i, c in enumerate(item.chunks):
                    info = self._by_key.get((fqn, c.offsets))
                    if info is None:
                        raise FormatError(
                            "chunk has no storage entry", path=self.path, member=fqn, found=f"offsets {list(c.offsets)}"
                        )
                    if info.transform_descriptors:
                        raise UnsupportedError(
                            "DCP stream transforms (compression/encryption extensions)",
                            path=self.path,
                            member=fqn,
                            found=",".join(info.transform_descriptors),
                        )
                    refs.append(ChunkRef(fqn, c, info, i))  # (its file was checked above)
                self._chunks[fqn] = refs

    # -- what is in it ------------------------------------------------------------------
    @property
    def entries(self) -> dict[str, Any]:
        return self.metadata.state_dict_metadata

    def tensor_names(self) -> list[str]:
        return [k for k, v in self.entries.items() if isinstance(v, TensorStorageMetadata)]

    def bytes_names(self) -> list[str]:
        return [k for k, v in self.entries.items() if isinstance(v, BytesStorageMetadata)]

    def chunks(self, fqn: str) -> list[ChunkRef]:
        if fqn not in self._chunks:
            raise NotFoundError(f"no tensor named {fqn!r}", path=self.path)
        return self._chunks[fqn]

    def files(self) -> list[str]:
        return sorted({v.relative_path for v in self.metadata.storage_data.values()})

    # -- files ----------------------------------------------------------------------------
    def real_path(self, rel: str, member: str | None = None) -> str:
        """The confined real path of storage file ``rel`` (LinkEscapeError when it, or a
        symbolic link on the way, leaves the checkpoint folder)."""
        cache: dict[str, str] = self.__dict__.setdefault("_real", {})
        real = cache.get(rel)
        if real is None:
            # torch's FileSystemReader joins relative_path to the folder as it is (``..``,
            # absolute names and symbolic links included): torchless refuses everything that
            # leaves the folder, before opening anything (one rule: the store's confine)
            real = cache[rel] = self.store.confine(self.path, rel, what="DCP storage file", member=member)
        return real

    def _shown(self, rel: str) -> str:
        """The path of storage file ``rel`` as error messages name it."""
        shown = self.__dict__.setdefault("_shown_paths", {})
        p = shown.get(rel)
        if p is None:
            p = shown[rel] = os.path.join(self.path, rel)
        return p

    def _refuse_closed(self) -> UsageError:
        return UsageError("the checkpoint was closed: reopen it to read its data", path=self.path)

    def _file(self, rel: str) -> ByteSource:
        m = self._maps.get(rel)
        if m is None:
            if self._closed:
                raise self._refuse_closed()
            m = self.store.open(self.real_path(rel))
            if self.remote:  # (read by ranges)
                self._maps[rel] = m
                return m
            # only the small zip structures are read through the map: no read-around, so
            # a checkpoint of thousands of chunks does not pull megabytes into our RSS
            mp = getattr(m, "_map", None)
            if mp is not None and hasattr(mp, "madvise") and hasattr(mmap, "MADV_RANDOM"):
                mp.madvise(mmap.MADV_RANDOM)
            self._maps[rel] = m
        return m

    def _fd(self, rel: str) -> int | ByteSource:
        fd = self._fds.get(rel)
        if fd is None and self.remote:
            return self._file(rel)  # pread_into reads a remote file through its source
        if fd is None:
            if self._closed:
                raise self._refuse_closed()
            p = self.real_path(rel)
            try:
                fd = os.open(p, os.O_RDONLY | getattr(os, "O_BINARY", 0))
            except FileNotFoundError:
                raise NotFoundError("storage file listed in .metadata is missing", path=p) from None
            self._fds[rel] = fd
        return fd

    def _item_source(self, info: StorageInfo, what: str) -> ByteSource:
        src = self._file(info.relative_path)
        src.check(info.offset, info.length, what=f"{what} in {info.relative_path}")
        if self.remote:  # only the ranges the item's parser asks for are fetched
            return SliceSource(src, info.offset, info.length, name=self._item_name(info))
        return BytesSource(src.view(info.offset, info.length), name=self._item_name(info))

    def _item_name(self, info: StorageInfo) -> str:
        """The name of :meth:`_item_source`'s source (errors of the item's reader carry it)."""
        return f"{self._shown(info.relative_path)}@{info.offset}"

    def _prefault(self, refs: list[ChunkRef]) -> None:
        """Have the pages of the items of ``refs`` mapped in beside the caller
        (:meth:`~torchless.io.source.ByteSource.prefault`), when they fill one span of
        one file back to back in this order, of at most :data:`_PREFAULT_MAX` bytes (what
        is mapped is then exactly what :meth:`_release` drops once they are used)."""
        if not refs or self.remote or self._closed:
            return
        first = refs[0].info
        rel = first.relative_path
        end = first.offset
        for r in refs:
            info = r.info
            if info.offset != end or info.relative_path is not rel and info.relative_path != rel:
                return
            end += info.length
        if 0 < end - first.offset <= _PREFAULT_MAX:
            self._file(rel).prefault(first.offset, end - first.offset)

    def _release(self, info: StorageInfo) -> None:
        """Drop the map's pages of located items from this process (they stay in the page
        cache; later reads fault them back in). Keeps RSS flat over thousands of chunks.
        Items that follow each other in the file are released together, a few MiB at a
        time (one system call for hundreds of small items)."""
        self._release_range(info.relative_path, info.offset, info.offset + info.length)

    def _release_range(self, rel: str, start: int, end: int) -> None:
        """:meth:`_release` of the items filling ``[start, end)`` of file ``rel``."""
        pending: dict[str, tuple[int, int] | None] = self.__dict__.setdefault("_pending", {})  # per file, not yet released
        pend = pending.get(rel)
        if pend is not None and pend[1] == start:
            pend = (pend[0], end)
        else:
            if pend is not None:
                self._drop(rel, *pend)
            pend = (start, end)
        if pend[1] - pend[0] >= _RELEASE_BATCH:
            self._drop(rel, *pend)
            pend = None
        pending[rel] = pend

    def _drop(self, rel: str, start: int, end: int) -> None:
        m = self._maps.get(rel)
        mp = getattr(m, "_map", None)
        if mp is None or not hasattr(mmap, "MADV_DONTNEED"):
            return
        start -= start % mmap.PAGESIZE
        end = min(end, len(mp))
        if end > start:
            try:
                mp.madvise(mmap.MADV_DONTNEED, start, end - start)
            except (OSError, ValueError):
                pass

    def raw_item(self, fqn: str) -> bytes:
        """The stored bytes of a non-tensor item (a ``torch.save`` stream)."""
        info = self.bytes_info(fqn)
        src = self._file(info.relative_path)
        src.check(info.offset, info.length, what=f"item {fqn}")
        return src.read_at(info.offset, info.length)

    def _in_file(self, e: TorchlessError, info: StorageInfo) -> tuple[str | None, int]:
        """Where error ``e``, raised while an item's embedded archive was read through
        :meth:`_item_source`, lies in the .distcp file: an error of the item's own reader
        (named after the item, or unnamed) has offsets in the item, made absolute here; one
        of the file's source itself (a remote read that failed, a short range) is already
        told against the file, at its absolute offset, and stays so."""
        if e.path is None or e.path == self._item_name(info):
            return self._shown(info.relative_path), info.offset + (e.offset or 0)
        return e.path, info.offset if e.offset is None else e.offset

    def _told_in_file(self, e: TorchlessError, info: StorageInfo, fqn: str, item: str) -> TorchlessError:
        """Error ``e`` of one of an item's records (its zip structure, ``data.pkl``,
        ``byteorder``, ``version``...), read through a source named after the item (offsets
        in the item), retold in place against the .distcp file: its path, the absolute
        offset (:meth:`_in_file`), the item ``fqn`` as member and the record in the
        message (``item`` says which item: verify's wording); returns ``e``."""
        record = e.member
        e.path, e.offset = self._in_file(e, info)
        e.member = fqn
        at = f"the item of {item} at offset {info.offset}"
        e.message = f"{e.message} ({at})" if record in (None, fqn) else f"{e.message} (record {record} of {at})"
        return e

    def item_problems(self, info: StorageInfo, fqn: str, chunk: Sequence[int] | None = None) -> list[Problem]:
        """``verify``'s checks of one item's embedded ``torch.save`` archive, the CRC-32 of
        every record included (torch's DCP loader checks none of them: a flipped payload
        byte loads silently); none for an item that is no zip archive (a safetensors blob or
        tensor of the other layouts: they have no checksums, and locating the chunk checked
        what they have).

        Each problem names the item (``fqn``, and the chunk's ``chunk`` offsets for a
        tensor), the record and the .distcp file, and its ``offset`` is absolute in that
        file, also for an error that stopped the archive's check.
        """
        f = self._file(info.relative_path)
        if info.offset < 0 or info.length < 4 or f.read_at(info.offset, 4) != LOCAL_SIG:
            return []
        shown = self._shown(info.relative_path)
        item = f"{fqn!r}" if chunk is None else f"{fqn!r} chunk at {list(chunk)}"
        at = f"{shown}@{info.offset}"
        try:
            found = ZipReader(self._item_source(info, f"item {fqn}")).verify(crc=True)
        except TorchlessError as e:
            path, off = self._in_file(e, info)
            told = TorchlessError(e.message, path=path, member=e.member, offset=off, expected=e.expected, found=e.found)
            return [Problem("item", f"{told} (the item of {item} at offset {info.offset})", fqn, off)]
        finally:
            self._release(info)
        return [
            Problem(
                p.code,
                f"{p.message} (record {p.member} of the item of {item} at {at})"
                if p.member
                else f"{p.message} (the item of {item} at {at})",
                fqn,
                None if p.offset is None else info.offset + p.offset,
                p.severity,
            )
            for p in found
        ]

    def bytes_info(self, fqn: str) -> StorageInfo:
        """Where the non-tensor item ``fqn`` lies."""
        info = self._by_key.get((fqn, None))
        if info is None:
            raise NotFoundError(f"no bytes item named {fqn!r}", path=self.path)
        return info

    def value(self, fqn: str, *, weights_only: bool = True) -> Any:
        """A non-tensor item, unpickled by torchless's safe machine."""
        from ..pt.read import read_checkpoint

        info = self.bytes_info(fqn)
        data = self.raw_item(fqn)
        try:
            return read_checkpoint(BytesSource(data, name=self._item_name(info)), weights_only=weights_only).obj
        except TorchlessError as e:
            self._told_in_file(e, info, fqn, repr(fqn))
            raise

    # -- chunks -----------------------------------------------------------------------------
    def locate(self, ref: ChunkRef) -> ChunkRef:
        """Parse the chunk's embedded ``torch.save`` archive; record where its payload is."""
        if ref.data_offset >= 0:
            return ref
        from ..pt.read import read_zip_checkpoint

        tmd = self.entries[ref.fqn]
        assert isinstance(tmd, TensorStorageMetadata)
        info = ref.info
        f = self._file(info.relative_path)
        if info.offset < 0 or info.length < 0 or info.offset + info.length > f.size:
            self._item_source(info, f"chunk of {ref.fqn}")  # raises the bounds error
        where: WhereAt = {"path": self._shown(info.relative_path), "member": ref.fqn, "offset": info.offset}
        if is_safetensors_blob(
            f.read_at(info.offset, max(0, min(9, f.size - info.offset)))
        ):  # may pass the item: a 1-element chunk
            return self._locate_safetensors(ref, tmd, where)
        fast = (
            None if self.general_only or not SETTINGS.dcp_items or self.remote else _fast_item(f.view(info.offset, info.length))
        )
        if fast is not None:
            t, base, byteorder, data_end = fast
        else:
            src = self._item_source(info, f"chunk of {ref.fqn}")
            try:
                zr = ZipReader(src)
                cp = read_zip_checkpoint(zr, weights_only=True)
            except TorchlessError as e:
                self._told_in_file(e, info, ref.fqn, f"{ref.fqn!r} chunk at {list(ref.chunk.offsets)}")
                raise
            t = cp.obj
            byteorder = cp.byteorder
        self._release(ref.info)
        if not isinstance(t, Tensor) or t.storage is None:
            raise FormatError("chunk is not a tensor", expected="a torch.save'd tensor", found=type(t).__name__, **where)
        if t.dtype.name != tmd.dtype.name:
            raise FormatError("chunk dtype differs from the metadata", expected=tmd.dtype.name, found=t.dtype.name, **where)
        if tuple(t.shape) != tuple(ref.chunk.sizes):
            raise FormatError(
                "chunk shape differs from the metadata", expected=list(ref.chunk.sizes), found=list(t.shape), **where
            )
        t._check_bounds()
        if fast is None:
            entry = zr.lookup(f"data/{t.storage.key}")
            if entry is None or entry.method != 0:
                raise FormatError("chunk payload record missing or compressed", **where)
            try:
                # the checks a .pt read of the record makes (flags torch's zip reader
                # refuses, a directory holding data, sizes, bounds): the payload is read
                # in place below, never through ZipReader.read
                zr.check_read(entry)
            except TorchlessError as e:
                # told against the .distcp file, at the absolute offset (verify's wording)
                path, off = self._in_file(e, info)
                raise type(e)(
                    f"{e.message} (the item of {ref.fqn!r} chunk at {list(ref.chunk.offsets)} at offset {info.offset})",
                    path=path,
                    member=e.member,
                    offset=off,
                    expected=e.expected,
                    found=e.found,
                ) from None
            base = zr.data_offset(entry)
        ref.data_offset = ref.info.offset + base + t.storage_offset() * t.dtype.itemsize
        ref.stride = tuple(t.stride())
        ref.storage_nbytes = t.storage.nbytes - t.storage_offset() * t.dtype.itemsize
        ref.byteorder = byteorder
        ref.record_crc = None
        if ref.byteorder != sys.byteorder and t.dtype.itemsize > 1:
            raise UnsupportedError("chunk saved with a foreign byte order", **where)
        if ref.info.offset + base + t.storage.nbytes > ref.info.offset + ref.info.length:
            raise TruncatedError("chunk payload runs past its item", **where)
        return ref

    def locate_many(self, refs: Any, *, release: bool = True) -> None:
        """:meth:`locate` every chunk of ``refs``, the items of each file together in file
        order: their zip ends, directories and local headers checked as arrays
        (:func:`_batch_items`), their one-tensor pickles through
        :func:`~torchless.pickle.fastpath.fast_tensor` with each global resolved once.
        Every item the batch does not accept in full goes through :meth:`locate` (which
        raises its errors), so the outcome for each chunk is :meth:`locate`'s.
        ``release=False``: the pages of the items the batch located stay mapped (the
        caller views their bytes next, and releases them: :meth:`_view_spans`)."""
        todo = [r for r in refs if r.data_offset < 0]
        if self.general_only or not SETTINGS.dcp_items or self.remote or len(todo) < self.batch_min:
            for r in todo:
                self.locate(r)
            return
        by_file: dict[str, list[ChunkRef]] = {}
        for r in todo:
            by_file.setdefault(r.info.relative_path, []).append(r)
        for rel, rs in by_file.items():
            rs.sort(key=lambda r: r.info.offset)
            for r in self._locate_batch(rel, rs, release):
                self.locate(r)

    def _locate_batch(self, rel: str, rs: list[ChunkRef], release: bool = True) -> list[ChunkRef]:
        """Locate what the batch accepts; return the rest."""
        f = self._file(rel)
        if getattr(f, "_map", None) is None or not f.size:
            return rs
        mv = f.view(0, f.size)
        first = rs[0].info
        if first.offset < 0 or first.length < 0 or first.offset + first.length > f.size:
            return rs
        item0 = mv[first.offset : first.offset + first.length]
        try:
            if _directory(item0) is None:  # (a first item that passes makes the template)
                return rs
            t = next((t for t in _TEMPLATES if t.directory(item0) is not None), None)
            if t is None:
                return rs
        except (struct.error, UnicodeError, IndexError, ValueError, TypeError, OverflowError, TorchlessError):
            return rs  # the per-item path decides, with its errors
        buf = np.frombuffer(mv, dtype=np.uint8)
        resolver = OnceResolver(AllowlistResolver(DEFAULT_ALLOWLIST, weights_only=True))
        rest: list[ChunkRef] = []
        # a few hundred items at a time: their map pages are dropped (``_release``) before
        # the next ones are touched, so the process never holds the whole file
        for c0 in range(0, len(rs), _BATCH_ITEMS):
            rest += self._locate_chunk(mv, buf, t, rs[c0 : c0 + _BATCH_ITEMS], resolver, release)
        return rest

    def _locate_chunk(  # noqa: C901 - locate's checks, in order
        self,
        mv: memoryview,
        buf: np.ndarray,
        t: _Template,
        rs: list[ChunkRef],
        resolver: OnceResolver,
        release: bool = True,
    ) -> list[ChunkRef]:
        try:
            offs = np.fromiter((r.info.offset for r in rs), dtype=np.int64, count=len(rs))
            lens = np.fromiter((r.info.length for r in rs), dtype=np.int64, count=len(rs))
            got = _batch_items(buf, offs, lens, t)
        except (IndexError, ValueError, TypeError, OverflowError):
            return rs  # the per-item path decides, with its errors
        if got is None:
            return rs
        prefix = got["prefix"]
        rec = got["rec"]
        pkl = rec.get(f"{prefix}/{DATA_PKL}".encode("utf-8", "surrogateescape").lower())
        if pkl is None:
            return rs
        ok = got["ok"].tolist()
        byteorders = got["byteorder"]
        pkl_size = pkl[1].tolist()
        data_keys: dict[str, tuple[list[int], list[int], list[int]] | None] = {}
        entries = self.entries
        rest: list[ChunkRef] = []
        found: list[tuple[Storage, str]] = []
        i = 0
        byteorder = "little"

        def record_of(key: str) -> tuple[list[int], list[int], list[int]] | None:
            """(data offsets, sizes, directory CRC-32s) of record ``data/<key>`` in every
            item of the chunk."""
            if key not in data_keys:
                name = f"{prefix}/data/{key}".encode("utf-8", "surrogateescape").lower()
                r = rec.get(name)
                data_keys[key] = None if r is None else (r[0].tolist(), r[1].tolist(), r[2].tolist())
            return data_keys[key]

        def persistent_load(pid: Any) -> Storage:
            if found or not _item_pid(pid):
                raise ValueError("not the one storage of a DCP item")
            key = pid[2]
            dtype = pid[1].dtype
            r = record_of(key)
            if dtype is None or r is None or r[1][i] != pid[4] * dtype.itemsize:
                raise ValueError("storage record")
            st = Storage(key, r[1][i], dtype, str(pid[3]), byteorder=byteorder, origin=f"{prefix}/data/{key}")
            found.append((st, key))
            return st

        # what an item's pickle gives depends on its bytes alone (and the allowlist): a
        # pickle seen before (same dtype, shape and strides) repeats its checked facts
        facts: dict[bytes, tuple[Any, ...]] = self.__dict__.setdefault("_item_facts", {})
        # a pickle not seen before whose frame was (another shape of a dtype seen): its
        # facts from the frame's and its numel, size and stride (see _frame_facts)
        frames: dict[Any, tuple[Any, ...]] = self.__dict__.setdefault("_item_frames", {})
        item_offs = offs.tolist()
        # every item's pickle copied out at once (the rows of items refused are not used)
        pk_at = (offs + np.where(got["ok"], pkl[0], 0)).tolist()
        pks = [bytes(mv[a : a + n]) if good else b"" for a, n, good in zip(pk_at, pkl_size, ok, strict=True)]
        host = sys.byteorder
        for i, ref in enumerate(rs):
            if not ok[i]:
                rest.append(ref)
                continue
            byteorder = byteorders[i] if byteorders is not None else "little"
            o = item_offs[i]
            pk = pks[i]
            tmd = entries[ref.fqn]
            fc = facts.get(pk)
            if fc is None:
                split = tensor_frame(pk)
                fc = None if split is None else _frame_facts(frames.get(split[0]), *split[1:])
                if fc is not None and len(facts) < 1 << 16:
                    facts[pk] = fc
            if fc is None:
                found.clear()
                tn = fast_tensor(pk, resolver, persistent_load)
                if tn is FALLBACK or type(tn) is not Tensor or not found or tn.storage is not found[0][0]:
                    rest.append(ref)
                    continue
                try:
                    tn._check_bounds()
                except TorchlessError:
                    rest.append(ref)
                    continue
                st = tn.storage
                assert st is not None
                fc = (
                    found[0][1],
                    st.nbytes,
                    tn.dtype.name,
                    tuple(tn.shape),
                    tuple(tn.stride()),
                    tn.storage_offset(),
                    tn.dtype.itemsize,
                )
                if len(facts) < 1 << 16:
                    facts[pk] = fc
                if split is not None and len(frames) < 256 and fc[2] not in _PACKED:  # (their own bounds)
                    frames[split[0]] = (fc[0], fc[2], fc[5], fc[6])
            key, nbytes, dname, shape, stride, offset, isz = fc
            dr = data_keys.get(key)
            if dr is None:
                dr = record_of(key)
                if dr is None or dr[1][i] != nbytes:
                    rest.append(ref)
                    continue
            elif dr[1][i] != nbytes:
                rest.append(ref)
                continue
            sizes = ref.chunk.sizes
            if dname != tmd.properties.dtype.name or (shape != sizes and shape != tuple(sizes)):
                rest.append(ref)
                continue
            base = dr[0][i]
            if (byteorder != host and isz > 1) or base + nbytes > ref.info.length:
                rest.append(ref)
                continue
            ref.data_offset = o + base + offset * isz
            ref.stride = stride
            ref.storage_nbytes = nbytes - offset * isz
            ref.byteorder = byteorder
            ref.record_crc = None if offset else dr[2][i]
        # the chunk's items in one step (items the loop left are located, and released,
        # one by one later: dropping their pages now only means faulting them back in)
        if release:
            last = rs[-1].info
            self._release_range(rs[0].info.relative_path, rs[0].info.offset, last.offset + last.length)
        return rest

    def _locate_safetensors(self, ref: ChunkRef, tmd: TensorStorageMetadata, where: WhereAt) -> ChunkRef:
        """A chunk written by ``FileSystemWriter(serialization_format=SAFETENSORS)``: the
        rank file's tensors are one safetensors blob after its bytes items, and every
        tensor's storage entry points at the blob's start (spec ``dcp.md`` §5)."""
        from ..safetensors import read_safetensors

        key = (ref.info.relative_path, ref.info.offset)
        blob = self._blobs.get(key)
        if blob is None:
            f = self._file(ref.info.relative_path)
            src = BytesSource(f.view(ref.info.offset, f.size - ref.info.offset), name=f"{where['path']}@{ref.info.offset}")
            try:
                meta, tensors, _n = read_safetensors(src)
                info = jsonsafe.loads(meta[SHARDING_KEY], what=SHARDING_KEY, path=where["path"]) if SHARDING_KEY in meta else {}
            except TorchlessError as e:
                e.with_context(path=where["path"], member=ref.fqn)
                raise
            if not isinstance(info, dict):
                raise FormatError(f"{SHARDING_KEY} must be a JSON object", **where)
            blob = self._blobs[key] = (tensors, info)
        tensors, info = blob
        t = tensors.get(ref.fqn)
        if t is None:
            raise FormatError(
                "the rank file's safetensors blob does not hold this tensor",
                expected=ref.fqn,
                found=", ".join(list(tensors)[:5]),
                **where,
            )
        if t.dtype.name != tmd.dtype.name:
            raise FormatError("chunk dtype differs from the metadata", expected=tmd.dtype.name, found=t.dtype.name, **where)
        if tuple(t.shape) != tuple(ref.chunk.sizes):
            raise FormatError(
                "chunk shape differs from the metadata", expected=list(ref.chunk.sizes), found=list(t.shape), **where
            )
        ent = info.get(ref.fqn)
        offs = ent.get(SAVED_OFFSETS) if isinstance(ent, dict) else None
        if offs is not None and list(offs) != list(ref.chunk.offsets):
            raise FormatError(
                f"{SHARDING_KEY} places the chunk elsewhere than the metadata",
                expected=list(ref.chunk.offsets),
                found=short_repr(offs, 60),
                **where,
            )
        if ref.info.length != t.nbytes:
            raise FormatError("storage length differs from the tensor's bytes", expected=t.nbytes, found=ref.info.length, **where)
        assert t.storage is not None and t.storage.file_offset is not None
        ref.data_offset = ref.info.offset + t.storage.file_offset
        ref.stride = tuple(t.stride())
        ref.storage_nbytes = t.nbytes
        ref.byteorder = "little"
        ref.record_crc = None
        if sys.byteorder != "little" and t.dtype.itemsize > 1:
            raise UnsupportedError("little-endian safetensors chunk on a big-endian host", **where)
        return ref

    def read_block(self, fqn: str, offsets: tuple[int, ...] | None = None, sizes: tuple[int, ...] | None = None) -> np.ndarray:
        """The C-contiguous bytes of ``tensor[offsets : offsets + sizes]`` (whole tensor by
        default) as a flat uint8 array, read from every chunk that overlaps it."""
        tmd = self.entries.get(fqn)
        if not isinstance(tmd, TensorStorageMetadata):
            raise NotFoundError(f"no tensor named {fqn!r}", path=self.path)
        gshape = tmd.size
        if offsets is None and sizes is None and tmd.nbytes:
            # the common case (one rank saved the whole tensor): one read, straight from
            # the chunk's payload; the same bytes the general block copy below gives
            refs = self._chunks.get(fqn)
            if (
                refs is not None
                and len(refs) == 1
                and tuple(refs[0].chunk.sizes) == tuple(gshape)
                and not any(refs[0].chunk.offsets)
            ):
                ref = self.locate(refs[0])
                if ref.contiguous:
                    out = np.empty(tmd.nbytes, dtype=np.uint8)
                    pread_into(
                        self._fd(ref.info.relative_path),
                        out.data,
                        ref.data_offset,
                        path=self._shown(ref.info.relative_path),
                    )
                    return out
        offsets = tuple(offsets) if offsets is not None else (0,) * len(gshape)
        sizes = tuple(sizes) if sizes is not None else tuple(gshape)
        if (
            len(offsets) != len(gshape)
            or len(sizes) != len(gshape)
            or any(o < 0 or o + s > g for o, s, g in zip(offsets, sizes, gshape, strict=False))
        ):
            raise UsageError(
                "block outside the tensor",
                member=fqn,
                expected=list(gshape),
                found=f"offsets {list(offsets)} sizes {list(sizes)}",
            )
        isz = tmd.dtype.itemsize
        if numel(sizes) == 0:
            return np.zeros(0, dtype=np.uint8)
        # locate every overlapping chunk first: each is checked against the bytes really
        # in its file, so a hostile .metadata cannot make us allocate more than that
        parts = []
        covered = 0
        for ref in self.chunks(fqn):
            c = ref.chunk
            lo = [max(a, b) for a, b in zip(c.offsets, offsets, strict=False)]
            hi = [min(a + s, b + t) for a, s, b, t in zip(c.offsets, c.sizes, offsets, sizes, strict=False)]
            if any(h <= l for l, h in zip(lo, hi, strict=False)):
                continue
            self.locate(ref)
            covered += numel(tuple(h - l for l, h in zip(lo, hi, strict=False)))
            parts.append((ref, lo, hi))
        if covered != numel(sizes):
            raise FormatError(
                "the chunks do not cover the tensor exactly",
                path=self.path,
                member=fqn,
                expected=f"{numel(sizes)} elements",
                found=f"{covered}",
            )
        out = np.zeros(numel(sizes) * isz, dtype=np.uint8)  # calloc: free until written; never stale memory
        dst = out.reshape(tuple(sizes) + (isz,))
        for ref, lo, hi in parts:
            self._copy_chunk(ref, isz, lo, hi, offsets, sizes, dst, out)
        return out

    def _copy_chunk(
        self,
        ref: ChunkRef,
        isz: int,
        lo: list[int],
        hi: list[int],
        boff: tuple[int, ...],
        bsize: tuple[int, ...],
        dst: np.ndarray,
        flat: np.ndarray,
    ) -> None:
        copy_chunk(self, ref, isz, lo, hi, boff, bsize, dst, flat)

    def tensor(self, fqn: str, *, view: bool = False) -> Tensor:
        """A lazy tensor whose bytes are assembled from the chunks on each access.

        Args:
            view: a tensor saved whole in one contiguous chunk gives a read-only view of
                the file's map instead of a copy (for one pass over the tensors, as
                consolidation makes: each one's pages are dropped from the process when
                the next one is asked for).
        """
        tmd = self.entries.get(fqn)
        if not isinstance(tmd, TensorStorageMetadata):
            raise NotFoundError(f"no tensor named {fqn!r}", path=self.path)
        dt = tmd.dtype
        load = partial(self._view_block if view else self.read_block, fqn)
        st = BlockStorage(fqn, tmd.nbytes, dt, "cpu", loader=load, origin=f"{self.path}:{fqn}")
        return Tensor(st, dt, tmd.size, requires_grad=tmd.properties.requires_grad)

    def _view_block(self, fqn: str) -> Any:
        prev = self.__dict__.pop("_viewed", None)
        if prev is not None:
            self._release(prev)
        refs = self._chunks.get(fqn)
        if self.remote or refs is None or len(refs) != 1:
            return self.read_block(fqn)
        ref = refs[0]
        tmd = self.entries[fqn]
        nbytes = tmd.nbytes
        if not nbytes or ref.chunk.sizes != tmd.size or any(ref.chunk.offsets):
            return self.read_block(fqn)
        if ref.data_offset < 0:
            self.locate(ref)
        f = self._maps.get(ref.info.relative_path) or self._file(ref.info.relative_path)
        if getattr(f, "_map", None) is None or ref.data_offset + nbytes > f.size or not ref.contiguous:
            return self.read_block(fqn)
        self.__dict__["_viewed"] = ref.info
        return f.view(ref.data_offset, nbytes)

    def _direct_spans(
        self, items: list[tuple[str, TensorStorageMetadata, int, tuple[int, ...]]]
    ) -> list[tuple[str, int, int, int, tuple[int, int] | None] | None]:
        """:func:`~.spans.direct_spans` of this reader."""
        return direct_spans(self, items)

    def _view_spans(
        self,
        spans: list[tuple[str, int, int, int, tuple[int, int] | None] | None],
        sizes: list[int],
        crcs: list[int | None] | None = None,
    ) -> list[memoryview | None]:
        """:func:`~.spans.view_spans` of this reader."""
        return view_spans(self, spans, sizes, crcs)

    def close(self) -> None:
        """Close every storage file; tensors read after this raise UsageError (arrays
        taken before stay valid). Idempotent."""
        self._closed = True
        pending = self.__dict__.pop("_pending", {})
        for rel, pend in pending.items():
            if pend is not None:
                self._drop(rel, *pend)
        for fd in self._fds.values():
            if not isinstance(fd, int):
                continue
            try:
                os.close(fd)
            except OSError:
                pass
        self._fds.clear()
        for m in self._maps.values():
            m.close()
        self._maps.clear()

    # -- layout -------------------------------------------------------------------------------
    def layout(self) -> dict[str, Any]:
        """Everything ``.metadata`` says, JSON-ready."""
        md = self.metadata
        items: dict[str, Any] = {}
        for fqn, it in md.state_dict_metadata.items():
            if isinstance(it, TensorStorageMetadata):
                p = it.properties
                items[fqn] = {
                    "kind": "tensor",
                    "dtype": p.dtype.name,
                    "shape": list(it.size),
                    "nbytes": it.nbytes,
                    "requires_grad": p.requires_grad,
                    "layout": p.layout,
                    "memory_format": p.memory_format,
                    "chunks": [
                        {
                            "offsets": list(r.chunk.offsets),
                            "sizes": list(r.chunk.sizes),
                            "file": r.info.relative_path,
                            "offset": r.info.offset,
                            "length": r.info.length,
                        }
                        for r in self._chunks[fqn]
                    ],
                }
            else:
                info = self._by_key.get((fqn, None))
                items[fqn] = {
                    "kind": "bytes",
                    "file": info.relative_path if info else None,
                    "offset": info.offset if info else None,
                    "length": info.length if info else None,
                }
        sm = md.storage_meta
        return {
            "version": md.version,
            "items": items,
            "planner_data": _jsonable(md.planner_data),
            "storage_meta": None
            if sm is None
            else {
                "checkpoint_id": None if sm.checkpoint_id is None else str(sm.checkpoint_id),
                "save_id": sm.save_id,
                "load_id": sm.load_id,
                "modules": sm.modules,
            },
            "files": {f: _file_size(self, f) for f in self.files()},
        }


def _jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if x is None or isinstance(x, (str, int, float, bool)):
        return x
    return repr(x)
