"""Reading ``.onnx`` models: the protobuf through the ``onnx`` package, tensors lazily.

The ``onnx`` package (an optional extra, ``pip install torchless[onnx]``) parses the
protobuf; it is imported on first use only, so ``import torchless`` works without it.

Where tensor bytes come from (spec ``onnx.md`` §2-3):

* ``raw_data`` of the main graph's initializers: a zero-copy view of the model file's
  memory map. The protobuf parser (which copies every ``raw_data`` into the message) is
  used for the structure; a small wire-format walk (:func:`raw_data_spans`) finds where
  each initializer's ``raw_data`` lies in the file. Where the walk and the parser
  disagree in any way (count, length), the parser's copy is used instead.
  ``raw_data`` of subgraph initializers and Constant nodes is the parser's copy, taken
  once on first use.
* typed fields (``float_data``, ``int32_data`` ...): converted on ``numpy()``, following
  the ``TensorProto`` comments (16-bit and 8-bit types widened into ``int32_data``,
  UINT32 in ``uint64_data``, complex as interleaved pairs).
* external data (``data_location = EXTERNAL``): memory-mapped, zero copy. The location is
  checked before any file is opened, following onnx's external-data defence layers
  (GHSA-538c-55jv-c5g9): only the spec's keys are read, the location must be relative,
  without ``..``, and must resolve (symlinks included) inside the model's directory;
  offset and length must be non-negative decimal integers and lie inside the file (its
  size from ``fstat``); the length must equal what ``dims`` and the data type require.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...core.dtypes import DTYPES
from ...core.errors import FormatError, InternalError, LimitError, TorchlessError, TruncatedError, UnsupportedError
from ...core.tensor import Storage, Tensor
from ...io import remote
from ...io.paths import confined_file
from ...io.source import ByteSource, open_source
from ...io.store import LOCAL, Store, resolve, store_for
from .dtypes import ONNX_TYPES, OnnxType, PackedTensor, numel_of, onnx_type, pack_bits
from .spec import raw_data_spans

__all__ = [
    "EXTERNAL_KEYS",
    "ExternalData",
    "ExternalRef",
    "OnnxModel",
    "TensorRecord",
    "import_onnx",
    "parse_model",
    "raw_data_spans",
    "read_model",
    "text",
]

#: keys of ``TensorProto.external_data`` the spec defines; others are ignored (and
#: reported by ``verify``), as onnx does (layer 1 of its defence, CWE-915).
EXTERNAL_KEYS = frozenset({"location", "offset", "length", "checksum", "basepath"})

#: protobuf refuses messages of 2 GiB or more; larger models must use external data.
PROTOBUF_LIMIT = (1 << 31) - 1

_DECIMAL = re.compile(r"[0-9]{1,20}\Z")

EXTERNAL = 1  # TensorProto.DataLocation.EXTERNAL


def text(v: Any) -> str:
    """A protobuf string field as ``str``. onnx.proto is proto2, so string fields are not
    checked for UTF-8 and the parser hands invalid ones back as ``bytes``."""
    return v if isinstance(v, str) else bytes(v).decode("utf-8", "backslashreplace")


def import_onnx() -> Any:
    """The ``onnx`` module, or an UnsupportedError with the install hint."""
    try:
        import onnx
    except ImportError:
        raise UnsupportedError(
            "reading ONNX models needs the onnx package (its protobuf definitions)",
            hint="pip install torchless[onnx]",
        ) from None
    return onnx


def parse_model(source: Any, name: str | None = None) -> Any:
    """Parse ``source`` (a path, bytes or ByteSource) into an ``onnx.ModelProto``.

    Raises:
        UnsupportedError: the onnx package is missing.
        LimitError: the file is 2 GiB or more (protobuf's message limit).
        FormatError: not a valid ModelProto.
    """
    onnx = import_onnx()
    src = open_source(source, name)
    if src.size > PROTOBUF_LIMIT:
        raise LimitError(
            "an ONNX model file cannot exceed protobuf's 2 GiB message limit",
            path=src.name,
            expected=f"<= {PROTOBUF_LIMIT} bytes",
            found=src.size,
            hint="large models keep their tensors in external data files",
        )
    model = onnx.ModelProto()
    try:
        model.ParseFromString(src.view(0, src.size, what="model"))
    except Exception as e:  # google.protobuf.message.DecodeError, RecursionError in upb
        raise FormatError(f"not a valid ONNX ModelProto: {e}", path=src.name) from None
    if not model.HasField("graph"):
        raise FormatError("the ModelProto has no graph", path=src.name, expected="field 7 (graph)", found="none")
    return model


# -- locating raw_data in the file -------------------------------------------------------------


# -- external data ------------------------------------------------------------------------


@dataclass(frozen=True)
class ExternalRef:
    """Where an external tensor's bytes are.

    Attributes:
        location: the ``location`` entry as written (relative to the model's directory).
        file: the resolved path that was checked.
        offset: byte offset in ``file``.
        length: byte count.
        checksum: the SHA-1 hex digest if the model records one.
        unknown_keys: keys outside the spec that were ignored.
    """

    location: str
    file: str
    offset: int
    length: int
    checksum: str | None = None
    unknown_keys: tuple[str, ...] = ()


class ExternalData:
    """Resolves ``external_data`` entries under one base directory and maps the files.

    Each data file is memory-mapped once and shared by the tensors in it.

    Args:
        base_dir: the model's directory; None refuses every external reference (a model
            read from bytes has no directory).
        path: the model path, for error messages.
        store: the store holding ``base_dir`` (as its opener resolved it).
    """

    def __init__(self, base_dir: str | None, path: str, store: Store = LOCAL) -> None:
        self.store = store
        self.url = self.store.remote  # a remote folder: data read by ranges
        if self.url:
            self.base_dir: str | None = str(base_dir)
            self._real_base: str | None = str(base_dir)
        else:
            self.base_dir = None if base_dir is None else os.path.abspath(base_dir)
            self._real_base = None if base_dir is None else os.path.realpath(base_dir)
        self.path = path
        self._files: dict[str, ByteSource] = {}

    def resolve(self, location: str, tensor: str) -> str:
        """The checked absolute path of ``location``.

        Raises:
            UnsupportedError: no base directory (model given as bytes).
            LinkEscapeError: an empty, absolute, ``..`` or escaping location (symlinks).
            FormatError: not a regular file.
            NotFoundError: the file does not exist.
        """
        if self.base_dir is None or self._real_base is None:
            raise UnsupportedError(
                "the model uses external data but has no directory to read it from",
                path=self.path,
                member=tensor,
                hint="open the model by path",
            )
        if self.url:
            return self.store.confine(
                self.base_dir, location, what="external data location", path=self.path, member=tensor, subdirs=True
            )
        return confined_file(self.base_dir, location, what="external data location", path=self.path, member=tensor, subdirs=True)

    def source(self, real: str) -> ByteSource:
        src = self._files.get(real)
        if src is None:
            src = self.store.open(real)
            self._files[real] = src
        return src

    def ref(self, tp: Any, tensor: str, expected_nbytes: int) -> ExternalRef:
        """Check ``tp``'s external data entries and return where its bytes are.

        Raises:
            FormatError: bad keys or values, or a length that does not match the shape.
            TruncatedError: the range runs past the end of the data file.
        """
        values: dict[str, str] = {}
        unknown: list[str] = []
        for entry in tp.external_data:
            key, value = text(entry.key), text(entry.value)
            if key in EXTERNAL_KEYS:
                if key in values:
                    raise FormatError(f"duplicate external_data key {key!r}", path=self.path, member=tensor)
                values[key] = value
            else:
                unknown.append(key[:100])
        location = values.get("location")
        if location is None:
            raise FormatError(
                "external tensor without a location",
                path=self.path,
                member=tensor,
                expected="external_data key 'location'",
                found="none",
            )
        real = self.resolve(location, tensor)
        src = self.source(real)
        offset = self._int(values, "offset", tensor, 0)
        length = self._int(values, "length", tensor, None)
        if offset > src.size:
            raise TruncatedError(
                "external data offset is past the end of its file",
                path=self.path,
                member=tensor,
                offset=offset,
                expected=f"offset <= {src.size} ({location})",
                found=offset,
            )
        if length is None:
            length = src.size - offset
        if offset + length > src.size:
            raise TruncatedError(
                "external data runs past the end of its file",
                path=self.path,
                member=tensor,
                offset=offset,
                expected=f"offset + length <= {src.size} ({location})",
                found=offset + length,
            )
        if length != expected_nbytes:
            raise FormatError(
                "external data length does not match the tensor's shape and type",
                path=self.path,
                member=tensor,
                expected=f"{expected_nbytes} bytes",
                found=f"{length} bytes",
            )
        return ExternalRef(location, real, offset, length, values.get("checksum"), tuple(unknown))

    def _int(self, values: dict[str, str], key: str, tensor: str, default: int | None) -> Any:
        v = values.get(key)
        if v is None:
            return default
        if not _DECIMAL.match(v):
            # onnx layer 2: offsets and lengths are non-negative integers (CWE-400)
            raise FormatError(
                f"external data {key} is not a non-negative decimal integer", path=self.path, member=tensor, found=repr(v[:40])
            )
        return int(v)

    def view(self, ref: ExternalRef) -> memoryview:
        return self.source(ref.file).view(ref.offset, ref.length, what=f"external data of {ref.location}")

    def close(self) -> None:
        for s in self._files.values():
            s.close()
        self._files.clear()


# -- tensors --------------------------------------------------------------------------------


@dataclass
class TensorRecord:
    """One tensor of the model and where it came from.

    Attributes:
        name: the torchless name (unique; scoped for subgraphs and functions).
        proto_name: ``TensorProto.name`` (or the Constant node's output).
        kind: ``"initializer"``, ``"constant"`` (a Constant node's value) or
            ``"sparse_initializer"`` (listed as its dense tensor).
        scope: ``""`` for the main graph, else ``"If_3/then_branch"``-style path.
        onnx: its :class:`OnnxType`.
        dims: the logical shape.
        storage: ``"raw"``, ``"typed"``, ``"external"`` or ``"attribute"``.
        external: the :class:`ExternalRef` for external tensors.
        tensor: the lazy tensor.
        proto: the TensorProto (None for scalar/list Constant attributes).
    """

    name: str
    proto_name: str
    kind: str
    scope: str
    onnx: OnnxType
    dims: tuple[int, ...]
    storage: str
    tensor: Tensor
    external: ExternalRef | None = None
    proto: Any = field(default=None, repr=False)


def _typed_count(otype: OnnxType, numel: int) -> int:
    if otype.code in (14, 15):  # complex: (real, imag) pairs
        return 2 * numel
    if otype.bits in (2, 4):  # each int32 holds one packed byte
        return otype.nbytes(numel)
    return numel


def _typed_bytes(tp: Any, otype: OnnxType, numel: int) -> bytes:
    """Little-endian storage bytes of a tensor held in a typed repeated field."""
    vals = getattr(tp, otype.field)
    code = otype.code
    if code in (1, 14):
        arr = np.asarray(vals, dtype=np.float32)
    elif code in (11, 15):
        arr = np.asarray(vals, dtype=np.float64)
    elif code == 7:
        arr = np.asarray(vals, dtype=np.int64)
    elif code in (12, 13):
        arr = np.asarray(vals, dtype=np.uint64).astype(np.uint32 if code == 12 else np.uint64)
    else:
        # int32_data: the value (INT32) or the element's bit pattern in the low bits
        words = np.asarray(vals, dtype=np.int64).astype(np.uint32)
        if code == 6:
            arr = words.view(np.int32)
        elif otype.bits == 6:  # one 6-bit code per entry; storage keeps the packed stream
            return pack_bits((words & 0x3F).astype(np.uint8), 6)
        elif otype.bits or (otype.dtype is not None and otype.dtype.itemsize == 1):
            arr = words.astype(np.uint8)
        else:
            arr = words.astype(np.uint16)
    return arr.astype(arr.dtype.newbyteorder("<")).tobytes()


class OnnxModel:
    """A parsed model and its tensors (the library object behind the artifact).

    Args:
        path: the model file, or bytes (then external data is refused).
        base_dir: where ``location`` entries are resolved (default: the model's folder).
        include_constants: also list Constant-node tensors (default True).

    Attributes:
        model: the ``onnx.ModelProto``.
        records: every :class:`TensorRecord`, main graph first.
        external: the :class:`ExternalData` resolver.
        sparse: ``(scope, name, dims)`` of sparse initializers (also listed as dense
            tensors in ``records``).
        unsupported: name -> the UnsupportedError of tensors that cannot be listed
            (STRING tensors, data types newer than onnx 1.23).
    """

    def __init__(
        self, path: Any, *, base_dir: str | None = None, include_constants: bool = True, store: Store | None = None
    ) -> None:
        store_dir: Store = LOCAL
        if isinstance(path, (bytes, bytearray, memoryview)):
            self.path = "<bytes>"
            source = open_source(path)
            default_dir = None
        else:
            if store is None:  # made directly of a location (set_weights, read_model): resolved here, once
                store, self.path = resolve(os.fspath(path))
            else:  # handed over by detection
                self.path = os.fspath(path)
            store_dir = store
            source = store.open(self.path)  # at a URL: the protobuf fetched whole, external data by ranges
            if store.remote:
                default_dir = remote.dirname(self.path)
            else:
                default_dir = os.path.dirname(os.path.abspath(self.path))
        try:
            self.model = parse_model(source)
        except TorchlessError as e:
            source.close()
            e.with_context(path=self.path)
            raise
        self.source = source
        spans = raw_data_spans(source.view(0, source.size))
        if spans is not None and len(spans) != len(self.model.graph.initializer):
            spans = None  # the walk disagrees with the parser: take the parser's copies
        self._spans = spans
        self.store = store_dir  # the model's store
        if base_dir is not None:  # a second location the caller gave: its own store
            store_dir = store_for(base_dir)
        self.external = ExternalData(base_dir if base_dir is not None else default_dir, self.path, store_dir)
        self.records: list[TensorRecord] = []
        self.sparse: list[tuple[str, str, tuple[int, ...]]] = []
        self.skipped_constants: list[tuple[str, str]] = []
        self.unsupported: dict[str, UnsupportedError] = {}
        self._names_last = ""
        self.subgraphs: list[dict[str, Any]] = []
        self._names: set[str] = set()
        self._include_constants = include_constants
        self._walk(self.model.graph, "", 0)
        for fn in self.model.functions:
            dom = text(fn.domain)
            self._walk_nodes(fn.node, f"functions/{dom + '.' if dom else ''}{text(fn.name)}", 1)

    # -- walking ------------------------------------------------------------------------
    def _unique(self, name: str) -> str:
        if name not in self._names:
            self._names.add(name)
            return name
        i = 2
        while f"{name}#{i}" in self._names:
            i += 1
        self._names.add(f"{name}#{i}")
        return f"{name}#{i}"

    def _walk(self, graph: Any, scope: str, depth: int) -> None:
        if depth > 64:
            raise LimitError("subgraphs nested too deeply", path=self.path, member=scope, expected="<= 64 levels")
        prefix = f"{scope}/" if scope else ""
        for i, tp in enumerate(graph.initializer):
            pname = text(tp.name) or f"initializer_{i}"
            span = self._spans[i] if depth == 0 and self._spans is not None else None
            self._add(tp, prefix + pname, pname, "initializer", scope, span)
        for i, sp in enumerate(graph.sparse_initializer):
            pname = text(sp.values.name) or f"sparse_initializer_{i}"
            self.sparse.append((scope, pname, tuple(int(d) for d in sp.dims)))
            self._add_sparse(sp, prefix + pname, pname, scope)
        self._walk_nodes(graph.node, scope, depth)

    def _walk_nodes(self, nodes: Any, scope: str, depth: int) -> None:
        prefix = f"{scope}/" if scope else ""
        for idx, node in enumerate(nodes):
            op = text(node.op_type)
            label = text(node.name) or f"{op}_{idx}"
            if op == "Constant" and text(node.domain) in ("", "ai.onnx") and self._include_constants:
                self._constant(node, prefix, scope, label)
            for attr in node.attribute:
                if attr.type == 5:  # GRAPH
                    sub = f"{prefix}{label}/{text(attr.name)}"
                    self._note_subgraph(sub, node, attr.g)
                    self._walk(attr.g, sub, depth + 1)
                elif attr.type == 10:  # GRAPHS
                    for j, g in enumerate(attr.graphs):
                        sub = f"{prefix}{label}/{text(attr.name)}[{j}]"
                        self._note_subgraph(sub, node, g)
                        self._walk(g, sub, depth + 1)

    def _note_subgraph(self, sub: str, node: Any, g: Any) -> None:
        self.subgraphs.append(
            {
                "path": sub,
                "op_type": text(node.op_type),
                "graph": text(g.name),
                "nodes": len(g.node),
                "initializers": len(g.initializer),
                "inputs": len(g.input),
                "outputs": len(g.output),
            }
        )

    def _constant(self, node: Any, prefix: str, scope: str, label: str) -> None:
        out = (text(node.output[0]) if node.output else "") or label
        for attr in node.attribute:
            aname = text(attr.name)
            if aname == "value" and attr.type == 4:  # TENSOR
                self._add(attr.t, prefix + out, out, "constant", scope)
            elif aname in ("value_float", "value_floats", "value_int", "value_ints"):
                name = self._unique(prefix + out)
                if aname == "value_float":
                    arr = np.asarray(attr.f, dtype=np.float32)
                elif aname == "value_floats":
                    arr = np.asarray(list(attr.floats), dtype=np.float32)
                elif aname == "value_int":
                    arr = np.asarray(attr.i, dtype=np.int64)
                else:
                    arr = np.asarray(list(attr.ints), dtype=np.int64)
                t = Tensor.from_numpy(arr)
                otype = ONNX_TYPES[1 if arr.dtype == np.float32 else 7]
                self.records.append(TensorRecord(name, out, "constant", scope, otype, tuple(arr.shape), "attribute", t))
            elif aname == "sparse_value" and attr.type == 11:  # SPARSE_TENSOR: listed dense
                self._add_sparse(attr.sparse_tensor, prefix + out, out, scope, kind="constant")
            else:  # value_string(s): no numeric tensor
                self.skipped_constants.append((prefix + out, aname))

    def _add_sparse(self, sp: Any, name: str, proto_name: str, scope: str, kind: str = "sparse_initializer") -> None:
        """A ``SparseTensorProto`` listed as its dense tensor (kind ``"sparse_initializer"``):
        ``values`` (1-D, NNZ) scattered at ``indices`` (INT64, ``[NNZ]`` linear or
        ``[NNZ, rank]`` coordinates) into zeros of shape ``dims``, as onnxruntime densifies
        it at load. Built on first use; bounds, order and size are checked then."""
        dims = tuple(int(d) for d in sp.dims)
        if any(d < 0 for d in dims):
            raise FormatError("negative sparse tensor dimension", path=self.path, member=name, found=list(dims))
        vals, idx = sp.values, sp.indices
        vdims = tuple(int(d) for d in vals.dims)
        idims = tuple(int(d) for d in idx.dims)
        if len(vdims) != 1:
            raise FormatError("sparse values must be 1-D", path=self.path, member=name, found=list(vdims))
        nnz = vdims[0]
        if idx.data_type != 7:
            raise FormatError("sparse indices must be INT64", path=self.path, member=name, expected=7, found=int(idx.data_type))
        if idims not in ((nnz,), (nnz, len(dims))) and not (nnz == 0 and idims in ((), (0,))):
            raise FormatError(
                "sparse indices have the wrong shape",
                path=self.path,
                member=name,
                expected=f"[{nnz}] or [{nnz}, {len(dims)}]",
                found=list(idims),
            )
        before = len(self.records)
        self._add(vals, f"{name}#values", proto_name, "sparse_values", scope)
        if len(self.records) == before:  # an unsupported value type: listed apart
            self.unsupported[name] = self.unsupported.pop(self._names_last)
            return
        values = self.records.pop()
        self._add(idx, f"{name}#indices", proto_name, "sparse_indices", scope)
        indices = self.records.pop()
        otype = values.onnx
        if otype.packed:
            raise FormatError("sparse values of a packed sub-byte type", path=self.path, member=name, found=otype.name)
        numel = numel_of(dims)
        nbytes = otype.nbytes(numel)
        path = self.path  # (the loaders hold what they read from, not the model: no cycle through it)
        dense = lambda: _densify(values.tensor, indices.tensor, dims, nbytes, name=name, path=path)  # noqa: E731
        name = self._unique(name)
        dtype = otype.dtype
        if dtype is None:  # _add lists value types without a dtype apart (returned above)
            raise InternalError(f"sparse values of {otype.name} were read as a tensor")
        storage = Storage(name, nbytes, dtype, "cpu", loader=dense, origin=name)
        self.records.append(
            TensorRecord(name, proto_name, kind, scope, otype, dims, "sparse", Tensor(storage, dtype, dims), None, None)
        )

    def _add(self, tp: Any, name: str, proto_name: str, kind: str, scope: str, span: tuple[int, int] | None = None) -> None:
        name = self._unique(name)
        self._names_last = name
        try:
            otype = onnx_type(tp.data_type, what=name, path=self.path)
        except UnsupportedError as e:  # STRING and unknown codes: listed apart, not fatal
            self.unsupported[name] = e
            return
        dims = tuple(int(d) for d in tp.dims)
        if any(d < 0 for d in dims):
            raise FormatError("negative tensor dimension", path=self.path, member=name, found=list(dims))
        if tp.HasField("segment"):
            raise UnsupportedError("segmented tensors (TensorProto.segment)", path=self.path, member=name)
        numel = numel_of(dims)
        nbytes = otype.nbytes(numel)
        ext = None
        if tp.data_location == EXTERNAL:
            ext = self.external.ref(tp, name, nbytes)
            # (the loaders hold what they read from, not the model: a storage that held the
            # model made every dropped model a reference cycle, freed only by a full GC pass)
            loader: Any = lambda r=ext, x=self.external: x.view(r)  # noqa: E731
            how = "external"
        elif tp.HasField("raw_data"):
            if span is not None and span[1] == nbytes:  # a view of the model file's map
                loader = lambda sp=span, src=self.source: src.view(sp[0], sp[1], what="raw_data")  # noqa: E731
                file_offset: int | None = span[0]
            else:  # the parser's copy (sizes are then checked on first use)
                loader = lambda t=tp: t.raw_data  # noqa: E731
                file_offset = None
            how = "raw"
        else:
            count = len(getattr(tp, otype.field))
            want = _typed_count(otype, numel)
            if count != want:
                raise FormatError(
                    f"{otype.field} has the wrong number of values for the tensor's shape",
                    path=self.path,
                    member=name,
                    expected=want,
                    found=count,
                )
            loader = lambda t=tp, o=otype, n=numel: _typed_bytes(t, o, n)  # noqa: E731
            how = "typed"
        st_dtype = DTYPES["uint8"] if otype.packed else otype.dtype
        if st_dtype is None:  # types without a dtype are listed as unsupported before this
            raise InternalError(f"ONNX type {otype.name} has no dtype but was read as a tensor")
        off = ext.offset if ext else (file_offset if how == "raw" else None)
        storage = Storage(name, nbytes, st_dtype, "cpu", loader=loader, origin=name, file_offset=off)
        if otype.packed:
            tensor: Tensor = PackedTensor(storage, otype, dims)
        else:
            tensor = Tensor(storage, st_dtype, dims)
        # plain tensors, as in a state dict: ONNX does not tell parameters from buffers
        self.records.append(TensorRecord(name, proto_name, kind, scope, otype, dims, how, tensor, ext, tp))

    # -- access ------------------------------------------------------------------------
    def tensors(self) -> Iterator[tuple[str, Tensor]]:
        for r in self.records:
            yield r.name, r.tensor

    def close(self) -> None:
        self.external.close()
        self.source.close()


#: the largest dense tensor a sparse initializer may expand to
MAX_SPARSE_DENSE = 1 << 32


def _densify(values: Tensor, indices: Tensor, dims: tuple[int, ...], nbytes: int, *, name: str, path: str) -> bytes:
    """The dense little-endian bytes of a sparse tensor (see ``OnnxModel._add_sparse``).

    Raises:
        LimitError: the dense tensor would pass :data:`MAX_SPARSE_DENSE` bytes.
        FormatError: an index out of bounds, or indices not strictly increasing (the ONNX
            spec requires lexicographic order; a repeated index would be ambiguous).
    """
    if nbytes > MAX_SPARSE_DENSE:
        raise LimitError(
            "sparse tensor too large to densify", path=path, member=name, expected=f"<= {MAX_SPARSE_DENSE} bytes", found=nbytes
        )
    numel = numel_of(dims)
    vals = np.asarray(values.numpy()).reshape(-1)
    idx = np.asarray(indices.numpy(), dtype=np.int64)
    if idx.ndim == 2:
        if idx.size and (np.any(idx < 0) or np.any(idx >= np.asarray(dims, dtype=np.int64))):
            raise FormatError("sparse coordinate out of bounds", path=path, member=name, expected=f"within {list(dims)}")
        lin = np.ravel_multi_index(tuple(idx.T), dims) if idx.size else np.zeros(0, dtype=np.int64)
    else:
        lin = idx.reshape(-1)
        if lin.size and (lin.min() < 0 or lin.max() >= numel):
            raise FormatError(
                "sparse index out of bounds",
                path=path,
                member=name,
                expected=f"0 <= index < {numel}",
                found=int(lin.min() if lin.min() < 0 else lin.max()),
            )
    if lin.size > 1 and np.any(np.diff(lin) <= 0):
        raise FormatError("sparse indices are not strictly increasing", path=path, member=name)
    out = np.zeros(numel, dtype=vals.dtype.newbyteorder("<"))
    out[lin] = vals
    return out.tobytes()


def read_model(path: Any, *, base_dir: str | None = None, include_constants: bool = True) -> OnnxModel:
    """Open an ONNX model; see :class:`OnnxModel`."""
    return OnnxModel(path, base_dir=base_dir, include_constants=include_constants)
