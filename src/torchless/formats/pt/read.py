"""Reading eager checkpoints: the zip format, the legacy stream format, the legacy tar.

Pure parsing over a :class:`~torchless.io.source.ByteSource`; tensors come back as
lazy :class:`~torchless.core.tensor.Tensor` views whose bytes are read (zero-copy, from
the memory map) only when ``numpy()`` is called. Spec: ``pt.md`` §1.10 (zip), §2 (legacy
stream), §3 (legacy tar).
"""

from __future__ import annotations

import operator
import struct
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ...container.zip import DirectoryRun, RecordLoader, ZipEntry, ZipReader, is_zip
from ...core.dtypes import DTYPES, DType
from ...core.errors import FormatError, LimitError, TorchlessError, TruncatedError, UnsupportedError, short_repr
from ...core.gcpause import GCPause
from ...core.settings import SETTINGS
from ...core.tensor import Storage
from ...core.values import StorageType
from ...io.source import ByteSource, MmapSource, open_source
from ...pickle.globals import Allowlist, AllowlistResolver, Rebuilder
from ...pickle.machine import Limits, Unpickler
from ...pickle.torch_globals import DEFAULT_ALLOWLIST
from ..torchscript.spec import CONSTANTS_PKL
from . import spec
from .spec import LEGACY_MAGIC, LEGACY_PROTOCOL, is_tar_header

if TYPE_CHECKING:
    import tarfile

__all__ = [
    "CHECKPOINT_ALLOWLIST",
    "LEGACY_MAGIC",
    "is_tar_header",
    "Checkpoint",
    "detect_layout",
    "read_checkpoint",
    "read_zip_checkpoint",
    "read_legacy_stream",
    "read_legacy_tar",
    "make_resolver",
]

_UINT8 = DTYPES["uint8"]
_SIZE = operator.attrgetter("size")
_METHOD = operator.attrgetter("method")
_NAME = operator.attrgetter("name")


@dataclass
class Checkpoint:
    """A parsed eager checkpoint.

    Attributes:
        obj: the object tree (tensors are lazy).
        layout: ``"zip"``, ``"legacy"`` or ``"tar"``.
        storages: storage key -> Storage, in first-use order.
        records: for zip files, the metadata records (``version``, ``byteorder``,
            ``.format_version``, ``.storage_alignment``, ``.data/serialization_id``).
        byteorder: the byte order of the storages.
        protocol: pickle protocol of the object pickle.
        prefix: the zip archive folder.
        globals_seen: every global the pickle named, with whether it was allowed.
    """

    obj: Any
    layout: str
    storages: dict[str, Storage] = field(default_factory=dict)
    records: dict[str, str] = field(default_factory=dict)
    byteorder: str = "little"
    protocol: int = 0
    prefix: str = ""
    globals_seen: list[tuple[str, bool]] = field(default_factory=list)
    zip: ZipReader | None = None


def make_resolver(
    weights_only: bool, allowlist: Allowlist | None = None, extra: dict[str, Any] | None = None
) -> AllowlistResolver:
    """The resolver ``torchless.load`` uses: the default allowlist, refusing or placeholding."""
    return AllowlistResolver(allowlist or CHECKPOINT_ALLOWLIST, weights_only=weights_only, extra=dict(extra or {}))


def detect_layout(source: ByteSource) -> str:
    """``"zip"``, ``"tar"``, ``"legacy"`` or ``"unknown"`` from the first bytes.

    torch tries ``tarfile`` before the legacy stream (for files), so any first block
    ``tarfile`` reads as a header makes the file a tar, with or without ``ustar`` magic.
    """
    head = source.read_at(0, min(source.size, 512))
    if is_zip(head):
        return "zip"
    if is_tar_header(head):
        return "tar"
    if head[:2] in spec.PICKLE_PROTOCOL_HEADS or head[:1] == b"\x8a":
        return "legacy"
    if head[:8] == spec.PREVIEW_MAGIC:
        return "preview"
    if starts_with_legacy_magic(source.read_at(0, min(source.size, _MAGIC_WINDOW))):
        return "legacy"  # a protocol 0 or 1 stream (no PROTO opcode)
    return "unknown"


#: bytes of a file's start parsed for the legacy magic number when it has no PROTO head
_MAGIC_WINDOW = 4096


def starts_with_legacy_magic(head: bytes) -> bool:
    """Whether ``head`` starts with a pickle whose value is torch's legacy magic number,
    in whatever protocol and opcodes (protocols 0 and 1 write it as ``L...L\\n``): the
    first pickle parsed as the unpickler parses it (nothing resolved; a pickle running
    past ``head`` is not one)."""
    try:
        value = Unpickler(head, resolver=make_resolver(True), limits=Limits(), member="magic number").load()
    except TorchlessError:
        return False
    return type(value) is int and value == LEGACY_MAGIC


def _pid_parts(pid: Any) -> tuple[StorageType, str, str, int, Any]:
    if not isinstance(pid, tuple) or not pid:
        raise FormatError("persistent id must be a non-empty tuple", found=short_repr(pid, 80))
    typename = pid[0]
    if isinstance(typename, bytes):
        typename = typename.decode("ascii", "replace")
    if typename != "storage":
        raise FormatError("only storage persistent ids are allowed", expected="'storage'", found=short_repr(typename, 40))
    if len(pid) < 5:
        raise FormatError("storage persistent id too short", expected="5 items", found=len(pid))
    stype, key, location, numel = pid[1], pid[2], pid[3], pid[4]
    if not isinstance(stype, StorageType):
        raise FormatError("persistent id does not name a storage class", found=short_repr(stype, 60))
    if type(numel) is not int or numel < 0:
        raise FormatError("storage size must be a non-negative int", found=short_repr(numel, 40))
    view = pid[5] if len(pid) > 5 else None
    return stype, str(key), str(location), numel, view


def _storage_dtype(stype: StorageType) -> DType:
    return stype.dtype if stype.dtype is not None else _UINT8


def read_zip_checkpoint(
    zr: ZipReader,
    *,
    weights_only: bool = True,
    resolver: AllowlistResolver | None = None,
    limits: Limits = Limits(),
    pickle_name: str = spec.DATA_PKL,
    data_dir: str = spec.DATA_DIR,
    encoding: str = "utf-8",
    mmap: bool = True,
    record_suffix: str = "",
) -> Checkpoint:
    """Parse a torch zip checkpoint (``torch.save`` since 1.6).

    With ``mmap=True`` (default) tensor bytes are zero-copy views of the memory map,
    read when first used; with False each storage is read into memory of its own (an
    eager load): the small stored records in runs, read ahead on a helper thread while
    the pickle is parsed (every storage, as ``torch.load(mmap=False)`` reads them), the
    others when first used, from the file as it was opened.

    Raises:
        FormatError / UnsafeGlobalError / LimitError: see :class:`Unpickler`.
        NotFoundError: the archive has no ``data.pkl``.
    """
    if not zr.prefix:
        raise FormatError(
            "file in archive is not in a subdirectory",
            path=zr.path,
            found=repr(zr.entries[0].name if zr.entries else ""),
            expected="entries named '<prefix>/...'",
        )
    records: dict[str, str] = {}
    for name in spec.METADATA_RECORDS:
        e = zr.lookup(name)
        if e is not None and e.size <= 64:
            records[name] = zr.read_bytes(e).decode("ascii", "replace")
    byteorder = records.get(spec.BYTEORDER, "little")
    if byteorder not in ("little", "big"):
        raise FormatError(
            "unknown byte order record",
            path=zr.path,
            member=spec.BYTEORDER,
            expected="'little' or 'big'",
            found=short_repr(byteorder),
        )
    storages: dict[str, Storage] = {}
    resolver = resolver or make_resolver(weights_only)
    data_index = zr.data_index(data_dir)
    # torch caches a loaded storage per persistent-id key *object* (so '0' and 0 are two
    # storages of one record) and never caches an empty or meta storage (data pointer 0)
    loaded: dict[Any, Storage] = {}
    batch = zr.batch_reader()
    if SETTINGS.pt_read_ahead and not mmap and not record_suffix and isinstance(data_index, dict):
        # an eager load reads every storage record: copying them starts now, on a
        # helper thread, while the pickle is parsed on this one (not when names collide:
        # each record is then found by torch's lookup, when asked for)
        batch.read_ahead(data_index.values())

    def persistent_load(pid: Any) -> Storage:
        if (
            type(pid) is tuple
            and len(pid) == 5
            and pid[0] == "storage"
            and type(pid[1]) is StorageType
            and type(pid[2]) is str
            and type(pid[4]) is int
            and pid[4] >= 0
        ):
            stype, key, location, numel = pid[1], pid[2], pid[3], pid[4]  # the common shape
            pkey: Any = key
        else:
            stype, key, location, numel, _view = _pid_parts(pid)
            pkey = pid[2]
            try:
                hash(pkey)
            except TypeError:
                raise FormatError("storage key is not hashable", path=zr.path, found=type(pkey).__name__) from None
        st = loaded.get(pkey)
        if st is not None:
            # torch returns the first typed storage of a key for every later pid of that
            # key, whatever storage class the later pid names
            return st
        dtype = stype.dtype if stype.dtype is not None else _UINT8
        nbytes = numel * dtype.itemsize
        entry = data_index.get(f"{key}{record_suffix}" if record_suffix else key)  # torch.package: .data/<key>.storage
        if entry is None:  # torch's record lookup ignores case (miniz)
            entry = zr.lookup(f"{data_dir}/{key}{record_suffix}")
        if entry is None:
            raise FormatError(
                "checkpoint references a storage record that does not exist",
                path=zr.path,
                member=f"{zr.prefix}/{data_dir}/{key}{record_suffix}",
            )
        if entry.size != nbytes and entry.size < nbytes:
            raise TruncatedError(
                "storage record smaller than its declared size",
                path=zr.path,
                member=entry.name,
                expected=f"{nbytes} bytes",
                found=f"{entry.size} bytes",
            )
        if entry.size != nbytes:  # larger: torch.load refuses this too ("record size ... does not match")
            raise FormatError(
                "storage record larger than its declared size",
                path=zr.path,
                member=entry.name,
                expected=f"{nbytes} bytes",
                found=f"{entry.size} bytes",
            )
        # byte order only applies to typed storages: torch swaps with the *storage*
        # dtype's element size, which is 1 for UntypedStorage (v3 dtypes, spec §1.11)
        order = byteorder if stype.dtype is not None else sys.byteorder

        if mmap or entry.method != 0:
            loader = RecordLoader(zr, entry, nbytes)
        else:
            batch.add(entry)  # small records are read in file-order runs, one read for many
            loader = RecordLoader(zr, entry, nbytes, batch)

        if type(location) is not str:
            location = str(location)
        st = Storage._lazy(key, nbytes, dtype, location, loader, order, entry.name)
        if nbytes and not location.startswith("meta"):
            loaded[pkey] = st
        if key not in storages:
            storages[key] = st
        return st

    def _storages_at_once(kinds: list[Any], combo: list[int], keys: list[str], numels: list[int]) -> list[Storage] | None:
        # the rows of persistent_load_many when every one of them is a new storage (keys
        # distinct, none loaded or listed before), of a known kind, whose record exists
        # with the declared size: the checks on whole columns, then one loop making the
        # storages; None (nothing done) when any row is not, for the row-by-row loop
        distinct = set(keys)
        # (every str key of ``loaded`` is a key of ``storages``: each place that caches a
        # storage under a key lists it under that key too, so keys new to ``storages``
        # are new to ``loaded``; the keys here are str, sliced from the pickle)
        if len(distinct) != len(keys) or not storages.keys().isdisjoint(distinct):
            return None
        used = set(combo)
        if any(kinds[c] is None for c in used) or min(numels) < 0:
            return None
        found = list(map(data_index.get, keys))
        entries: list[ZipEntry] = list(filter(None, found))  # (no `None in`: it would call ZipEntry.__eq__)
        if len(entries) != len(found) or (not mmap and any(map(_METHOD, entries))):
            return None  # (a record looked up otherwise, or deflated: the loop decides per row)
        itemsizes = [k[1] if k is not None else 0 for k in kinds]
        sizes = list(map(operator.mul, numels, map(itemsizes.__getitem__, combo)))
        if list(map(_SIZE, entries)) != sizes:
            return None
        out: list[Storage]
        loaders = RecordLoader.many(zr, entries, sizes, None if mmap else batch)
        if len(used) == 1:  # one kind of storage (a dtype, location, order): no unpacking per row
            dtype, _isz, location, order, _cached = kinds[combo[0]]
            out = Storage._lazy_many(keys, sizes, dtype, location, loaders, order, list(map(_NAME, entries)))
        else:
            out = []
            lazy = Storage._lazy
            for c, key, nbytes, entry, loader in zip(combo, keys, sizes, entries, loaders, strict=True):
                dtype, _isz, location, order, _cached = kinds[c]
                out.append(lazy(key, nbytes, dtype, location, loader, order, entry.name))
        if not mmap:
            batch.add_many(entries, out)
        storages.update(zip(keys, out, strict=True))
        if min(sizes) > 0 and all(kinds[c][4] for c in used):
            loaded.update(zip(keys, out, strict=True))
        else:  # torch caches no empty or meta storage
            loaded.update((k, st) for k, st, c in zip(keys, out, combo, strict=True) if st.nbytes and kinds[c][4])
        return out

    def persistent_load_many(parts: list[Any], combo: list[int], keys: list[str], numels: list[int]) -> list[Storage]:
        # persistent_load of ('storage', stype, key, location, numel) per row on its common
        # path (a typed storage class, a str key, a record of the declared size under the
        # data folder, a str location): the same storages, cache and order; stops before
        # the first row off that path, which the machine hands to persistent_load
        kinds: list[Any] = []
        for part in parts:
            if part is None:
                kinds.append(None)
                continue
            head, stype, location = part
            if type(head) is not str or head != "storage" or type(stype) is not StorageType or type(location) is not str:
                kinds.append(None)
                continue
            dtype = stype.dtype if stype.dtype is not None else _UINT8
            order = byteorder if stype.dtype is not None else sys.byteorder
            kinds.append((dtype, dtype.itemsize, location, order, not location.startswith("meta")))
        out = _storages_at_once(kinds, combo, keys, numels) if not record_suffix else None
        if out is not None:
            return out
        out = []
        lazy = Storage._lazy
        held: list[Any] = []  # eager: (entry, storage) pairs for the batch reader, which hands each its bytes
        for c, key, numel in zip(combo, keys, numels, strict=True):
            st = loaded.get(key)
            if st is not None:
                out.append(st)
                continue
            kind = kinds[c]
            if kind is None or numel < 0:
                break
            dtype, isz, location, order, cached = kind
            nbytes = numel * isz
            entry = data_index.get(f"{key}{record_suffix}" if record_suffix else key)
            if entry is None or entry.size != nbytes:
                break
            if mmap or entry.method != 0:
                st = lazy(key, nbytes, dtype, location, RecordLoader(zr, entry, nbytes), order, entry.name)
            else:
                st = lazy(key, nbytes, dtype, location, RecordLoader(zr, entry, nbytes, batch), order, entry.name)
                held += (entry, st)
            if nbytes and cached:
                loaded[key] = st
            if key not in storages:
                storages[key] = st
            out.append(st)
        if held:
            batch.add_many(held[0::2], held[1::2])
        return out

    pkl = zr.get(pickle_name)
    data = zr.read(pkl, max_size=limits.max_input)
    up = Unpickler(
        data,
        resolver=resolver,
        persistent_load=persistent_load,
        persistent_load_many=persistent_load_many,
        limits=limits,
        path=zr.path,
        member=pkl.name,
        encoding=encoding,
    )
    obj = up.load()
    return Checkpoint(obj, "zip", storages, records, byteorder, up.info.protocol, zr.prefix, list(resolver.seen), zr)


def read_legacy_stream(
    source: ByteSource,
    *,
    weights_only: bool = True,
    resolver: AllowlistResolver | None = None,
    limits: Limits = Limits(),
    start: int = 0,
    encoding: str = "utf-8",
) -> Checkpoint:
    """Parse the legacy stream format (``_use_new_zipfile_serialization=False``).

    Five pickles (magic, protocol version, sys info, the object, the sorted storage keys)
    followed by each storage as int64 element count + little-endian data.
    """
    if not getattr(source, "ranged", False):
        # the five pickles are parsed in place, the file is not copied
        return _read_legacy(source, source.searchable(), weights_only, resolver, limits, start, encoding)
    # a remote object: the pickles come first, then the storages (gigabytes, maybe), so
    # they are parsed from a prefix that grows only while a pickle runs past its end, and
    # never past the window the machine's input limit gives that pickle (it refuses a
    # pickle over the limit there, as it does locally)
    n = min(source.size, _LEGACY_PREFIX)
    seen = len(resolver.seen) if resolver is not None else 0
    while True:
        try:
            return _read_legacy(source, source.read_at(0, n), weights_only, resolver, limits, start, encoding)
        except _PrefixTooShort as short:
            n = min(source.size, n * 8, limits.window(short.start))
            if resolver is not None:
                del resolver.seen[seen:]  # the next attempt sees the same globals again


class _PrefixTooShort(Exception):
    """A pickle of a legacy stream runs past the end of the prefix read so far."""

    def __init__(self, start: int) -> None:
        super().__init__(start)
        self.start = start  # where that pickle starts


#: the first prefix of a remote legacy stream parsed for its pickles (one read-ahead block;
#: grown 8x at a time)
_LEGACY_PREFIX = 1 << 16


def _read_legacy(
    source: ByteSource,
    data: Any,
    weights_only: bool,
    resolver: AllowlistResolver | None,
    limits: Limits,
    start: int,
    encoding: str,
) -> Checkpoint:
    path = source.name
    pos = start
    simple = make_resolver(True)

    def next_pickle(what: str, res: Any, pl: Callable[[Any], Any] | None = None) -> Any:
        nonlocal pos
        up = Unpickler(
            data, resolver=res, persistent_load=pl, limits=limits, path=path, member=what, start=pos, encoding=encoding
        )
        try:
            value = up.load()
        except TruncatedError:
            if len(data) < source.size:  # only a prefix of the file: read more, parse again
                raise _PrefixTooShort(pos) from None
            raise
        pos = up.end
        return value, up.info.protocol

    magic, _ = next_pickle("magic number", simple)
    if magic != LEGACY_MAGIC:
        raise FormatError(
            "invalid magic number; not a torch checkpoint",
            path=path,
            offset=start,
            expected=hex(LEGACY_MAGIC),
            found=short_repr(magic, 40),
        )
    proto_v, _ = next_pickle("protocol version", simple)
    if proto_v != LEGACY_PROTOCOL:
        raise FormatError("invalid legacy protocol version", path=path, expected=LEGACY_PROTOCOL, found=short_repr(proto_v, 20))
    sys_info, _ = next_pickle("sys_info", simple)
    little = True
    if isinstance(sys_info, dict):
        little = bool(sys_info.get("little_endian", True))
    storages: dict[str, Storage] = {}
    declared: dict[str, tuple[int, DType]] = {}
    views: dict[str, tuple[str, int, int]] = {}
    resolver = resolver or make_resolver(weights_only)
    payload: dict[str, tuple[int, int]] = {}

    def persistent_load(pid: Any) -> Any:
        if isinstance(pid, tuple) and pid and pid[0] == "module":
            # a whole nn.Module: ('module', class, source file, source); torch compares the
            # source text and returns the class (here the resolver's placeholder for it)
            return pid[1] if len(pid) > 1 else None
        stype, key, location, numel, view = _pid_parts(pid)
        dtype = _storage_dtype(stype)
        if key not in storages:
            declared[key] = (numel, dtype)

            def loader(key: str = key) -> memoryview:
                off, n = payload[key]
                return source.view(off, n, what=f"storage {key}")

            st = storages[key] = Storage(
                key, numel * dtype.itemsize, dtype, location, loader=loader, byteorder="little", origin=f"storage {key}"
            )
        elif storages[key].nbytes == 0:
            # torch: a key seen before whose storage is empty (data pointer 0) gives a new
            # empty storage of *this* pid's dtype each time (empty storages of several
            # dtypes share a key when one is a view of another: torch skips its dtype
            # check for data pointer 0)
            st = Storage(key, 0, dtype, storages[key].location, data=b"", byteorder="little", origin=f"storage {key}")
        else:
            st = storages[key]
        if view is not None:
            vkey, voff, vsize = view
            vkey = str(vkey)
            if vkey not in storages:
                root = st

                def vloader(root: Storage = root, voff: int = int(voff), vsize: int = int(vsize)) -> memoryview:
                    isz = root.dtype.itemsize
                    return root.bytes()[voff * isz : (voff + vsize) * isz]

                storages[vkey] = Storage(
                    vkey, int(vsize) * dtype.itemsize, dtype, location, loader=vloader, origin=f"view {vkey} of storage {key}"
                )
                views[vkey] = (key, int(voff), int(vsize))
            return storages[vkey]
        return st

    obj, protocol = next_pickle("object", resolver, persistent_load)
    keys, _ = next_pickle("storage keys", simple)
    if not isinstance(keys, list):
        raise FormatError("legacy storage key list is not a list", path=path, offset=pos)
    off = pos
    for key in keys:
        key = str(key)
        source.check(off, 8, what=f"size of storage {key}")
        (count,) = struct.unpack("<q", source.read_at(off, 8))
        off += 8
        if key not in declared:
            raise FormatError("storage key list names a storage the object does not use", path=path, offset=off - 8, found=key)
        numel, dtype = declared[key]
        if count != numel:
            raise FormatError(
                "stored element count differs from the declared one",
                path=path,
                offset=off - 8,
                member=f"storage {key}",
                expected=numel,
                found=count,
            )
        nbytes = numel * dtype.itemsize
        source.check(off, nbytes, what=f"storage {key}")
        payload[key] = (off, nbytes)
        storages[key].file_offset = off
        off += nbytes
    missing = [k for k in declared if k not in payload]
    if missing:
        raise TruncatedError("storages declared but not stored", path=path, found=", ".join(missing[:5]))
    cp = Checkpoint(obj, "legacy", storages, {"little_endian": str(little)}, "little", protocol, "", list(resolver.seen))
    return cp


class TarFallback(Exception):
    """``tarfile`` failed inside torch's legacy tar loader: torch catches the
    ``TarError`` and reads the file as a legacy pickle stream instead."""


_STORAGES, _TENSORS, _PICKLE = spec.LEGACY_TAR_MEMBERS
MAX_TAR_MEMBERS = 100_000
MAX_SPARSE_MEMBER = 1 << 30


def read_legacy_tar(
    source: ByteSource, *, weights_only: bool = False, resolver: AllowlistResolver | None = None, limits: Limits = Limits()
) -> Checkpoint:
    """Parse the pre-0.1.10 tar layout (members ``storages``, ``tensors``, ``pickle``).

    The archive is read by ``tarfile`` itself, as torch reads it: the *last* member of
    each name (``getmember``), headers without ``ustar`` magic, PAX and GNU long names,
    sparse members reassembled. Members that are links or not regular files are refused
    (torch would extract them, following a symbolic link anywhere on the machine).

    torch refuses this format with ``weights_only=True``; torchless reads it with either
    setting because nothing in it is executed. With ``weights_only=True`` only allowlisted
    globals are accepted, as everywhere else.

    Raises:
        TarFallback: ``tarfile`` itself failed (torch then reads a legacy stream).
    """
    import tarfile

    try:
        return _read_legacy_tar(source, weights_only=weights_only, resolver=resolver, limits=limits)
    except (TorchlessError, TarFallback):
        raise
    except tarfile.TarError as e:
        raise TarFallback(str(e)) from None
    except (TypeError, ValueError, KeyError, IndexError, struct.error, OverflowError, EOFError, OSError) as e:
        # the tar's own records (tuples, counts, views) have the wrong shape
        raise FormatError(f"malformed legacy tar checkpoint: {type(e).__name__}: {e}", path=source.name) from None


def _tar_members(source: ByteSource) -> tuple[tarfile.TarFile, dict[str, tarfile.TarInfo]]:
    """Every member by name, the last of each name winning (``TarFile.getmember``)."""
    tf = spec.open_legacy_tar(source)
    members: dict[str, tarfile.TarInfo] = {}
    n = 0
    while True:
        m = tf.next()
        if m is None:
            return tf, members
        n += 1
        if n > MAX_TAR_MEMBERS:
            raise LimitError("too many tar members", path=source.name, expected=f"<= {MAX_TAR_MEMBERS}")
        members[m.name] = m


def _read_legacy_tar(source: ByteSource, *, weights_only: bool, resolver: AllowlistResolver | None, limits: Limits) -> Checkpoint:
    from ...core.tensor import Tensor
    from ...core.values import TensorType

    path = source.name
    tf, members = _tar_members(source)
    for need in spec.LEGACY_TAR_MEMBERS:
        if need not in members:
            raise FormatError("legacy tar checkpoint lacks a member", path=path, member=need)
        if not members[need].isfile():
            raise UnsupportedError(
                "legacy tar member is a link or not a regular file (torch would follow it out of the archive)",
                path=path,
                member=need,
                found=members[need].type,
            )
    resolver = resolver or make_resolver(weights_only)
    simple = make_resolver(True)
    objects: dict[str, Any] = {}

    def span(name: str) -> tuple[bytes, int]:
        m = members[name]
        if m.issparse():
            if m.size > MAX_SPARSE_MEMBER:
                raise LimitError(
                    "sparse tar member too large", path=path, member=name, expected=f"<= {MAX_SPARSE_MEMBER}", found=m.size
                )
            f = tf.extractfile(m)
            assert f is not None
            data = f.read()
            if len(data) != m.size:
                raise TarFallback("unexpected end of data")
            return data, -1
        if m.offset_data + m.size > source.size:
            raise TarFallback("unexpected end of data")  # tarfile's ReadError: torch goes on as a stream
        return bytes(source.view(m.offset_data, m.size, what=f"tar member {name}")), m.offset_data

    def run(data: bytes, pos: int, res: Any, member: str, pl: Any = None) -> tuple[Any, int]:
        up = Unpickler(data, resolver=res, persistent_load=pl, limits=limits, path=path, member=member, start=pos)
        v = up.load()
        return v, up.end

    data, base = span(_STORAGES)
    n, pos = run(data, 0, simple, _STORAGES)
    if type(n) is not int or n < 0:
        raise FormatError("storage count is not an int", path=path, member=_STORAGES)
    for _ in range(n):
        (key, location, stype), pos = run(data, pos, resolver, _STORAGES)
        if not isinstance(stype, StorageType):
            raise FormatError("storage entry does not name a storage class", path=path, member=_STORAGES)
        if pos + 8 > len(data):
            raise TruncatedError("storage size missing", path=path, member=_STORAGES, offset=pos)
        (count,) = struct.unpack_from("<q", data, pos)
        pos += 8
        dtype = _storage_dtype(stype)
        nbytes = count * dtype.itemsize
        if count < 0 or pos + nbytes > len(data):
            raise TruncatedError("storage data runs past the member", path=path, member=_STORAGES, offset=pos)
        objects[str(key)] = Storage(
            str(key),
            nbytes,
            dtype,
            str(location),
            data=source.view(base + pos, nbytes) if base >= 0 else memoryview(data)[pos : pos + nbytes],
            origin=f"storages#{key}",
        )
        pos += nbytes
    views, pos = run(data, pos, simple, _STORAGES)
    for target, root, offset, numel in views or []:
        rs = objects[str(root)]
        isz = rs.dtype.itemsize
        objects[str(target)] = Storage(
            str(target), numel * isz, rs.dtype, rs.location, data=rs.bytes()[offset * isz : (offset + numel) * isz]
        )
    data, _ = span(_TENSORS)
    n, pos = run(data, 0, simple, _TENSORS)
    for _ in range(int(n)):
        (key, skey, ttype), pos = run(data, pos, resolver, _TENSORS)
        if pos + 8 > len(data):
            raise TruncatedError("tensor header missing", path=path, member=_TENSORS, offset=pos)
        (ndim,) = struct.unpack_from("<i", data, pos)
        pos += 8
        if ndim < 0 or ndim > 64 or pos + 8 * (2 * ndim + 1) > len(data):
            raise FormatError("bad tensor header", path=path, member=_TENSORS, offset=pos)
        sizes = struct.unpack_from(f"<{ndim}q", data, pos)
        pos += 8 * ndim
        strides = struct.unpack_from(f"<{ndim}q", data, pos)
        pos += 8 * ndim
        (soff,) = struct.unpack_from("<q", data, pos)
        pos += 8
        st = objects.get(str(skey))
        if st is None:
            raise FormatError("tensor refers to an unknown storage", path=path, member=_TENSORS, found=skey)
        dtype = ttype.dtype if isinstance(ttype, TensorType) and ttype.dtype else st.dtype
        objects[str(key)] = Tensor(st, dtype, sizes, strides, soff)

    def persistent_load(saved_id: Any) -> Any:
        if isinstance(saved_id, tuple):
            return saved_id[0] if saved_id else None
        try:
            return objects[str(int(saved_id))]
        except (KeyError, ValueError):
            raise FormatError(
                "pickle refers to an unknown tensor or storage", path=path, member=_PICKLE, found=short_repr(saved_id, 40)
            ) from None

    data, _ = span(_PICKLE)
    obj, _ = run(data, 0, resolver, _PICKLE, persistent_load)
    storages = {k: v for k, v in objects.items() if isinstance(v, Storage)}
    return Checkpoint(obj, "tar", storages, {}, "little", 2, "", list(resolver.seen))


def _check_all_records(zr: ZipReader) -> None:
    """torch.load lists every record (``getAllRecords``) and refuses an archive with a
    member outside the prefix folder or a name that is not UTF-8; so does torchless."""
    folder = zr.prefix + "/"
    size = zr.source.size
    entries = zr.entries
    for a, b, run in zr.segments():
        if run is not None and SETTINGS.pt_record_checks and _run_checks_out(run, folder, size):
            continue  # every row passes every test below (checked on the columns)
        _check_records(zr, entries[a:b], folder, size)
    _check_version_records(zr)


def _run_checks_out(run: DirectoryRun, folder: str, size: int) -> bool:
    """True when no entry of ``run`` fails a test of :func:`_check_records` (each test of
    its loop, on the run's columns); False sends the run through the loop, which raises
    the first failure."""
    if not run.starts_with(folder).all():  # (the names are ASCII, so valid UTF-8, when this holds)
        return False
    method, csize, usize = run.method, run.csize, run.usize
    bad = ((method == 0) & (usize != csize)) | ((usize != 0) & (csize == 0))
    bad |= run.hoff + 30 + csize > size
    bad |= (run.flags & 0x2000) != 0
    slash = run.names[:, -1] == 0x2F  # (nlen >= 1: the names start with the folder)
    bad |= (slash | ((run.eattr & 0x10) != 0)) & (csize != 0)
    return not bool(bad.any())


def _check_records(zr: ZipReader, entries: list[ZipEntry], folder: str, size: int) -> None:
    for e in entries:
        try:
            if not e.name.isascii():  # an ASCII name (decoded without escapes) is valid UTF-8
                e.raw_name.decode("utf-8")
        except UnicodeDecodeError:
            raise FormatError(
                "archive member name is not UTF-8", path=zr.path, offset=e.central_offset, found=short_repr(e.raw_name, 60)
            ) from None
        if not e.name.startswith(folder):
            raise FormatError(
                "file in archive is not in the archive folder",
                path=zr.path,
                member=e.name,
                expected=f"names starting with {folder!r}",
                found=short_repr(e.name, 60),
            )
        # miniz's checks of every central entry when it opens the archive
        if (e.method == 0 and e.size != e.compressed_size) or (e.size and not e.compressed_size):
            raise FormatError(
                "central directory sizes are inconsistent",
                path=zr.path,
                member=e.name,
                offset=e.central_offset,
                expected=e.size,
                found=e.compressed_size,
            )
        if e.header_offset + 30 + e.compressed_size > size:
            raise TruncatedError("record runs past the end of the file", path=zr.path, member=e.name, offset=e.header_offset)
        if e.flags & 0x2000:
            raise UnsupportedError("zip records with masked (encrypted) local headers", path=zr.path, member=e.name)
        if e.is_directory and e.compressed_size:
            raise UnsupportedError(
                "a record marked as a directory that holds data (torch reads uninitialized memory for it)",
                path=zr.path,
                member=e.name,
            )


def _check_version_records(zr: ZipReader) -> None:
    # the container version record is required and must be a number torch reads (1..10)
    ver = zr.lookup(spec.DATA_VERSION) or zr.lookup(spec.VERSION)
    if ver is None:
        raise FormatError("archive has no version record", path=zr.path, expected=f"{spec.VERSION!r} or {spec.DATA_VERSION!r}")
    text = zr.read_bytes(ver, max_size=64).strip() if ver.size <= 64 else b""
    if not text.isdigit() or not 1 <= int(text) <= 10:
        raise FormatError(
            "cannot parse the archive version record",
            path=zr.path,
            member=ver.name,
            expected="an integer 1..10",
            found=short_repr(text, 20),
        )
    al = zr.lookup(spec.STORAGE_ALIGNMENT)
    if al is not None and not (al.size <= 20 and zr.read_bytes(al).strip().isdigit()):
        raise FormatError("cannot parse the storage alignment record", path=zr.path, member=al.name)


def read_checkpoint(
    source: Any,
    *,
    weights_only: bool = True,
    resolver: AllowlistResolver | None = None,
    limits: Limits = Limits(),
    encoding: str = "utf-8",
    mmap: bool = True,
    zip_reader: ZipReader | None = None,
) -> Checkpoint:
    """Parse any eager checkpoint layout (detected from the bytes).

    Args:
        source: a path, bytes, or a :class:`~torchless.io.source.ByteSource`.
        zip_reader: the archive of ``source`` already parsed (by detection), read
            instead of parsing its central directory again.

    Raises:
        FormatError: unknown layout, or TorchScript archives (use the TorchScript reader).
    """
    source = open_source(source)
    layout = detect_layout(source)
    try:
        with GCPause():  # the promotion of what the read built happens once, at the end
            return _read_checkpoint(source, layout, weights_only, resolver, limits, encoding, mmap, zip_reader)
    except TorchlessError as e:
        e.with_context(path=source.name)
        raise


def _read_checkpoint(
    source: ByteSource,
    layout: str,
    weights_only: bool,
    resolver: AllowlistResolver | None,
    limits: Limits,
    encoding: str,
    mmap: bool,
    zip_reader: ZipReader | None,
) -> Checkpoint:
    if layout == "zip":
        zr = zip_reader if zip_reader is not None else ZipReader(source, require_prefix=not isinstance(source, MmapSource))
        if zr.lookup(CONSTANTS_PKL) is not None:
            raise FormatError(
                "this is a TorchScript archive, not an eager checkpoint",
                path=source.name,
                hint="open it with torchless.open (format 'torchscript')",
            )
        _check_all_records(zr)
        return read_zip_checkpoint(zr, weights_only=weights_only, resolver=resolver, limits=limits, encoding=encoding, mmap=mmap)
    if layout == "tar" and isinstance(source, MmapSource):
        # torch.load tries tarfile first on files (not on in-memory buffers) and reads
        # a legacy stream when tarfile raises
        try:
            return read_legacy_tar(source, weights_only=weights_only, resolver=resolver, limits=limits)
        except TarFallback:
            layout = "legacy"
    if layout == "legacy" or (layout == "tar" and not isinstance(source, MmapSource)):
        return read_legacy_stream(source, weights_only=weights_only, resolver=resolver, limits=limits, encoding=encoding)
    if layout == "preview":
        raise UnsupportedError("file is an unsupported archive format from the preview release", path=source.name)
    raise FormatError(
        "not a torch checkpoint",
        path=source.name,
        expected="a zip, legacy pickle stream or tar",
        found=repr(source.read_at(0, min(8, source.size))),
    )


# torch.storage._load_from_bytes: a legacy-format stream inside bytes (how TypedStorage
# reduces itself in plain pickles). Parsed by torchless like any legacy file.
def _load_from_bytes(args: tuple) -> Any:
    from ...io.source import BytesSource

    (blob,) = args
    if not isinstance(blob, (bytes, bytearray)):
        raise FormatError("_load_from_bytes needs bytes")
    cp = read_legacy_stream(BytesSource(bytes(blob), "<embedded storage>"), weights_only=True)
    return cp.obj


def _checkpoint_table() -> Allowlist:
    a = Allowlist("checkpoint")
    a.add(
        "torch.storage._load_from_bytes",
        Rebuilder("torch.storage._load_from_bytes", _load_from_bytes),
        "a legacy-format storage inside bytes, parsed by torchless",
    )
    return a


#: what checkpoints are read with: :data:`~torchless.pickle.torch_globals.DEFAULT_ALLOWLIST`
#: plus the rebuilders that need this module's reader (a legacy stream inside bytes). Built
#: here, explicitly: importing this module changes no other module's table.
CHECKPOINT_ALLOWLIST = DEFAULT_ALLOWLIST.merged(_checkpoint_table(), name=DEFAULT_ALLOWLIST.name)
