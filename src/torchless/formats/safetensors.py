"""``.safetensors``: read (zero-copy from a memory map) and write (streaming).

The format is a little-endian u64 header length, a JSON header and the tensor bytes.
torchless reads and writes it itself rather than through the ``safetensors`` package:
that package's NumPy path copies every tensor (2x the payload at peak) and cannot express
bfloat16 or float8 without ml_dtypes, while the whole format is one JSON object. The
reader enforces the format's own rules (no holes, no overlaps, no duplicate names,
sizes consistent with shapes), so a hostile header cannot point outside the data.
"""

from __future__ import annotations

import json
import struct
import sys
from collections.abc import Callable, Iterable, Iterator
from functools import partial
from typing import Any

import numpy as np

from ..core.dtypes import DTYPES, DType, from_numpy
from ..core.errors import TorchlessError, UnsupportedError
from ..core.findings import Problem
from ..core.gcpause import GCPause
from ..core.settings import SETTINGS
from ..core.sizes import parse_size  # re-exported: the one size parser
from ..core.tensor import Storage, Tensor, _contiguous_strides, require_utf8_name, unique_names
from ..io.atomic import AtomicFile
from ..io.source import ByteSource, MmapSource, open_source
from .base import Artifact, Capabilities, FormatHandler, LoadPolicy, Probe
from .hf.index import shard_set
from .registry import register
from .safetensors_spec import METADATA_KEY, ST_DTYPES, check_name, is_safetensors_head, parse_header
from .shared import alias_metadata, split_aliases

__all__ = ["SafetensorsArtifact", "read_safetensors", "write_safetensors", "write_safetensors_sharded", "parse_size", "ST_DTYPES"]

_TO_ST = {v: k for k, v in ST_DTYPES.items()}


class SafetensorsArtifact(Artifact):
    """An opened ``.safetensors`` file; ``metadata`` holds ``__metadata__``."""

    format = "safetensors"

    def __init__(self, path: Any, policy: LoadPolicy | None = None) -> None:
        super().__init__(path if not isinstance(path, (bytes, bytearray, memoryview)) else "<bytes>", policy)
        self.source = open_source(path)
        eager = not self.policy.mmap and isinstance(self.source, MmapSource)
        self.metadata, self._tensors, self.header_size = read_safetensors(self.source, eager=eager)

    def tensors(self) -> Iterator[tuple[str, Any]]:
        return iter(self._tensors.items())

    def info(self) -> dict[str, Any]:
        out = super().info()
        out["metadata"] = self.metadata
        out["header_bytes"] = self.header_size
        return out

    def verify(self) -> list[Problem]:
        return super().verify()

    def close(self) -> None:
        self.source.close()


def read_safetensors(source: Any, *, eager: bool = False) -> tuple[dict[str, str], dict[str, Tensor], int]:
    """Parse a safetensors file into ``(metadata, {name: Tensor}, header_size)``, the
    tensors in the order of their data.

    Args:
        eager: read the whole data section into memory of its own at once (one read,
            ``mmap=False``): every storage is a slice of it. Otherwise each storage is a
            view of the source asked for when read.

    Raises:
        TruncatedError, FormatError, LimitError: malformed or hostile headers.
    """
    with GCPause():  # tens of thousands of records, all kept: GC passes would free nothing
        return _read(open_source(source), eager)


def _read(src: ByteSource, eager: bool) -> tuple[dict[str, str], dict[str, Tensor], int]:
    meta, entries, n = parse_header(src)
    base = 8 + n
    data = None
    if eager:
        data = src.copy(base, src.size - base, what="tensor data").toreadonly()
    view = src.view
    new_storage = Storage.__new__
    new_tensor = Tensor.__new__
    dtypes = _DTYPES
    out: dict[str, Tensor] = {}
    # (the fields Storage() and Tensor() set, without a call each: the header's rules were
    # checked by parse_header, so every row is a contiguous tensor filling its storage)
    for name, code, dims, (b, e) in entries:
        dt = dtypes[code]
        st = new_storage(Storage)
        st.key = name
        st.nbytes = e - b
        st.dtype = dt
        st.location = "cpu"
        if data is None:
            st._data = None
            st._loader = partial(view, base + b, e - b)
        else:
            st._data = data[b:e]
            st._loader = None
        st.byteorder = "little"
        st.origin = name
        st.file_offset = base + b
        t = new_tensor(Tensor)
        t.storage = st
        t.dtype = dt
        t.shape = shape = tuple(dims)
        t._stride = _contiguous_strides(shape) if len(shape) != 1 else _ONE
        t._offset = 0
        t.requires_grad = False
        t.is_parameter = False
        t.device = "cpu"
        t._metadata = None
        t.quantizer = None
        t._attrs = None
        t.subclass = None
        out[name] = t
    return meta, out, n


_DTYPES = {code: DTYPES[name] for code, name in ST_DTYPES.items()}
_ONE = (1,)


def _tensor_chunks(t: Tensor) -> tuple[int, list[bytes | memoryview]]:
    """Contiguous little-endian bytes of ``t``: a zero-copy slice when possible."""
    st = t.storage
    if st is None:
        raise UnsupportedError("cannot write a tensor without data (meta)")
    if t.metadata or t.dtype.name == "complex32":
        raw = t.numpy() if t.metadata else t.numpy(raw=True)
        le = raw.astype(raw.dtype.newbyteorder("<")).tobytes()
        return len(le), [le]
    if t.is_contiguous() and (st.byteorder == "little" or not st.needs_swap):
        start = t.storage_offset() * t.dtype.itemsize
        mv = st.bytes()[start : start + t.nbytes]
        return len(mv), [mv]
    arr = t.numpy(raw=True)
    if arr.dtype.byteorder == ">" or (arr.dtype.byteorder == "=" and sys.byteorder == "big"):
        arr = arr.astype(arr.dtype.newbyteorder("<"))
    import numpy as np

    flat = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
    return flat.nbytes, [flat.data]


def write_safetensors(
    items: Iterable[tuple[str, Any]],
    path: Any,
    *,
    metadata: dict[str, str] | None = None,
    progress: Callable[[int], None] | None = None,
    _defer: list[Any] | None = None,
) -> None:
    """Write named tensors as ``.safetensors`` (atomically, one tensor in memory at most).

    Tensors are laid out in the order given; NumPy arrays are accepted too. Tensors that
    share a storage follow :mod:`.shared`'s rule: an exact alias is stored once and
    recorded in ``__metadata__`` as ``{alias: kept}``.

    Raises:
        UnsupportedError: a dtype safetensors cannot express (quantized, complex32...).
        UsageError: duplicate names, a name safetensors cannot read back, overlapping views.
    """
    items = list(items)
    plain = None
    if SETTINGS.safetensors_arrays and progress is None:
        with GCPause():  # (a record per array, all kept until written: GC passes would free nothing)
            plain = _plain_arrays(items, metadata)
    if plain is not None:  # a dict of plain NumPy arrays: the same file, without a Tensor each
        raw, bufs = plain
        _write_atomic(path, lambda f: _write_plain(f, raw, bufs), _defer)
        return
    entries: list[tuple[str, Tensor, DType]] = []
    kept, aliases = split_aliases(checked_names(items, path), path)
    metadata = alias_metadata(metadata, aliases)
    for name, t in kept:
        code = _TO_ST.get(t.dtype.name)
        if code is None or t.quantizer is not None:
            raise UnsupportedError(f"safetensors cannot store dtype {t.dtype.name}", member=name, hint="convert to .pt instead")
        entries.append((name, t, t.dtype))
    raw = safetensors_header([(name, dt, tuple(t.shape), t.nbytes) for name, t, dt in entries], metadata)[8:]
    _write_atomic(path, lambda f: _write_body(f, raw, entries, progress), _defer)


def _write_atomic(path: Any, write: Callable[[Any], None], defer: list[Any] | None) -> None:
    """``write(file)`` into a temporary beside ``path``, published at once; or, for a shard
    (``defer`` given), written now and kept in ``defer`` to be published with its siblings."""
    if defer is None:
        with AtomicFile(path) as f:
            write(f.file)
        return
    af = AtomicFile(path)
    try:
        write(af.file)
        af.finish()
    except BaseException:
        af.abort()
        raise
    defer.append(af)


#: NumPy dtype -> safetensors code, for the dtypes seen so far (None: not a plain one)
_PLAIN_CODES: dict[Any, str | None] = {}


def _plain_code(dt: Any) -> str | None:
    code = _PLAIN_CODES.get(dt, "")
    if code == "":
        try:
            code = _TO_ST.get(from_numpy(dt).name) if dt.isnative and from_numpy(dt).itemsize == dt.itemsize else None
        except TorchlessError:
            code = None
        _PLAIN_CODES[dt] = code
    return code


def _plain_arrays(items: list[tuple[str, Any]], metadata: dict[str, str] | None) -> tuple[bytes, list[Any]] | None:
    """``(header, data buffers)`` of ``items`` when every one is a plain NumPy array under a
    plain name (see ``SETTINGS.safetensors_arrays``): the bytes :func:`write_safetensors` writes for
    them either way. None when one is not (the general path then decides, errors included)."""
    if metadata or not items:
        return None
    names = [k for k, _ in items]
    arrays = [v for _, v in items]
    if set(map(type, arrays)) != {np.ndarray} or set(map(type, names)) != {str} or len(set(names)) != len(names):
        return None
    if METADATA_KEY in names:
        return None
    try:
        "".join(names).encode("utf-8")
    except UnicodeEncodeError:
        return None
    codes: dict[Any, str | None] = {}
    header: dict[str, Any] = {}
    bufs: list[Any] = []
    off = 0
    for name, a in items:
        dt = a.dtype
        code = codes.get(dt, "")
        if code == "":
            code = codes[dt] = _plain_code(dt)
        if code is None:
            return None
        try:  # the array's bytes as they are: a cast needs a C-contiguous buffer
            mv = memoryview(a).cast("B")
        except (TypeError, ValueError):  # not C-contiguous, or a dtype with no buffer format (ml_dtypes)
            if not a.flags.c_contiguous:
                return None
            mv = a.reshape(-1).view(np.uint8).data
        n = mv.nbytes
        header[name] = {"dtype": code, "shape": list(a.shape), "data_offsets": [off, off + n]}
        off += n
        if n:
            bufs.append(mv)
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    raw += b" " * ((-len(raw)) % 8)
    return raw, bufs


def _write_plain(f: Any, raw: bytes, bufs: list[Any]) -> None:
    f.write(struct.pack("<Q", len(raw)))
    f.write(raw)
    f.writev(bufs)


def checked_names(items: Iterable[tuple[str, Any]], path: Any) -> Iterator[tuple[str, Any]]:
    """``items`` with unique names safetensors can read back (checked before any data)."""
    for name, t in unique_names(items, path):
        check_name(name, path)
        yield name, t


def safetensors_header(entries: Iterable[tuple[str, DType, tuple[int, ...], int]], metadata: dict[str, str] | None) -> bytes:
    """The 8-byte length and JSON header of a safetensors file holding ``(name, dtype,
    shape, nbytes)`` entries laid out in that order (what :func:`write_safetensors` writes)."""
    header: dict[str, Any] = {}
    if metadata:
        header[METADATA_KEY] = {str(k): str(v) for k, v in metadata.items()}
        for k, v in header[METADATA_KEY].items():
            require_utf8_name(k, fmt="safetensors metadata")
            require_utf8_name(v, fmt="safetensors metadata")
    off = 0
    for name, dt, shape, nbytes in entries:
        check_name(name)
        code = _TO_ST.get(dt.name)
        if code is None:
            raise UnsupportedError(f"safetensors cannot store dtype {dt.name}", member=name, hint="convert to .pt instead")
        header[name] = {"dtype": code, "shape": list(shape), "data_offsets": [off, off + nbytes]}
        off += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    raw += b" " * ((-len(raw)) % 8)
    return struct.pack("<Q", len(raw)) + raw


def _write_body(f: Any, raw: bytes, entries: list[tuple[str, Tensor, DType]], progress: Callable[[int], None] | None) -> None:
    f.write(struct.pack("<Q", len(raw)))
    f.write(raw)
    for _name, t, _dt in entries:
        n, chunks = _tensor_chunks(t)
        for c in chunks:
            f.write(c)
        if progress is not None:
            progress(n)
        del chunks  # release an assembled (non-mmap) buffer before the next one


def write_safetensors_sharded(
    items: Iterable[tuple[str, Any]],
    path: Any,
    max_shard_size: Any,
    *,
    metadata: dict[str, str] | None = None,
    progress: Callable[[int], None] | None = None,
) -> list[str]:
    """Hugging Face style shards: ``<stem>-00001-of-0000N.safetensors`` beside ``path`` and
    ``<name>.index.json`` (``{"metadata": {"total_size": n}, "weight_map": {...}}``).

    Shards are filled in order and a new one starts when the next tensor would exceed
    ``max_shard_size`` (a tensor larger than that gets a shard of its own). With one
    shard, ``path`` itself is written and no index. Exact aliases are stored once
    (:mod:`.shared`), recorded in every shard's ``__metadata__``. The folder of ``path`` and
    its missing parents are created (as ``save_pretrained`` does). Returns the files written.
    """
    import os

    from ..io.atomic import make_folder_for

    limit = parse_size(max_shard_size)
    make_folder_for(path)
    groups: list[list[tuple[str, Any]]] = [[]]
    size = 0
    total = 0
    # every name checked and every alias found before any shard is written
    kept, aliases = split_aliases(checked_names(items, path), path)
    metadata = alias_metadata(metadata, aliases)
    for name, t in kept:
        if groups[-1] and size + t.nbytes > limit:
            groups.append([])
            size = 0
        groups[-1].append((name, t))
        size += t.nbytes
        total += t.nbytes
    p = os.fspath(path)
    if len(groups) == 1:
        write_safetensors(groups[0], p, metadata=metadata, progress=progress)
        return [p]
    folder, base = os.path.split(p)
    stem = base[: -len(".safetensors")] if base.endswith(".safetensors") else base
    n = len(groups)
    names = [f"{stem}-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]
    # every shard is built under a temporary name; they are renamed into place together,
    # and the index last, so an interrupted run leaves no partial set
    with shard_set(folder, base + ".index.json", total) as (pending, weight_map):
        for fname, group in zip(names, groups, strict=False):
            write_safetensors(group, os.path.join(folder, fname), metadata=metadata, progress=progress, _defer=pending)
            for name, _t in group:
                weight_map[name] = fname
    idx_path = os.path.join(folder, base + ".index.json")
    return [os.path.join(folder, f) for f in names] + [idx_path]


@register
class SafetensorsHandler(FormatHandler):
    name = "safetensors"
    extensions = (".safetensors",)
    priority = 50
    description = "safetensors (header + raw little-endian tensors)"
    capabilities = Capabilities(write_tensors=True, write_options=("metadata", "max_shard_size"))

    def sniff(self, probe: Probe) -> bool:
        return not probe.is_dir and len(probe.head) >= 10 and is_safetensors_head(probe.head)

    def _open(self, path: Any, policy: LoadPolicy, probe: Probe | None) -> SafetensorsArtifact:
        if probe is not None:
            probe.close()
        return SafetensorsArtifact(path, policy)

    def write_tensors(
        self,
        items: Iterable[tuple[str, Any]],
        path: Any,
        *,
        progress: Callable[[int], None] | None = None,
        metadata: dict[str, str] | None = None,
        max_shard_size: Any = None,
    ) -> list[str]:
        """Write tensors (sharded with ``max_shard_size``); returns the files written."""
        if max_shard_size:
            return write_safetensors_sharded(items, path, max_shard_size, metadata=metadata, progress=progress)
        write_safetensors(items, path, metadata=metadata, progress=progress)
        return [str(path)]
