"""Reading AOTInductor packages (``aoti_compile_and_package`` output) without running them.

A package holds generated C++ source, a compiled ``wrapper.so`` and metadata JSON per
model under ``data/aotinductor/<model>/`` (spec ``aoti.md`` §1). torchless lists those
files, parses the metadata, reads the wrapper's constant table (names, FQNs, dtypes,
shapes, strides, sizes) from ``wrapper.cpp``, and exposes the weights as lazy tensors
wherever they are stored as data:

* ``binary_blob``: ``<wrapper>_weights.blob``, each constant's storage bytes in table
  order, each padded to 64 bytes (§1.2);
* ``pickle_weights``: ``data/weights/weight_<i>``, each a complete ``torch.save`` zip
  read by :mod:`torchless.formats.pt.read` through the safe pickle machine, placed by
  ``weights_config.json`` (FQN -> [file, shape, stride, storage_offset]);
* ``embedded``: the same blob linked into ``wrapper.so`` between the symbols
  ``_binary_constants_bin_start``/``_end``, located by parsing the ELF (never loaded):
  the parser reads the headers, tables and symbols through a ByteSource over the record
  (:meth:`AotiPackage.record_source`), so in a remote archive a stored ``.so`` is read by
  ranges, never fetched whole, and each constant's ``numpy()`` fetches its own range;
* ``mmap``: ``force_mmap_weights``: the blob appended to the ``.so`` after page padding,
  followed by an 8-byte magic number that the linked-in 16-byte record repeats.

The compute graph exists only as C++ and machine code; nothing here executes it.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ...container.zip import REFUSED_FLAGS, ZipEntry, ZipReader, is_zip
from ...core import jsonsafe
from ...core.dtypes import DTYPES, DType
from ...core.errors import FormatError, LimitError, NotFoundError, TorchlessError
from ...core.tensor import Storage, Tensor
from ...io.source import ByteSource, BytesSource, RemoteSource, SliceSource, open_source
from ...pickle.machine import Limits
from ..pt.read import read_zip_checkpoint
from ..pt2.spec import RECORDS as PT2_RECORDS
from .binary import parse_binary
from .elf import ElfInfo
from .spec import (
    ALIGN_BYTES,
    AOTINDUCTOR_DIR,
    DTYPE_NAMES,
    WEIGHTS_DIR,
    file_kind,
    is_aoti_records,  # noqa: F401 - re-exported
)

__all__ = [
    "AotiModel",
    "AotiPackage",
    "ConstantInfo",
    "PackageFile",
    "blob_layout",
    "blob_size",
    "is_aoti_records",
    "parse_constant_table",
    "read_package",
    "view_nbytes",
]

_U8 = DTYPES["uint8"]
#: wrapper sources larger than this are not scanned for the constant table
MAX_WRAPPER_BYTES = 256 << 20
#: metadata / config JSON larger than this is refused
MAX_JSON_BYTES = 64 << 20


@dataclass
class PackageFile:
    """One record of the package.

    Attributes:
        name: the record name relative to the archive folder.
        size: uncompressed size in bytes.
        kind: ``wrapper_source``, ``kernel_source``, ``shared_object``, ``metadata``,
            ``weights_blob``, ``weights_config``, ``weight`` ... (see ``constants.file_kind``).
        model: the model folder it belongs to, or None for archive-level records.
    """

    name: str
    size: int
    kind: str
    model: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "size": self.size, "kind": self.kind}


@dataclass
class ConstantInfo:
    """One row of the wrapper's ``constants_info_`` table (spec §1.2).

    ``offset`` is the storage offset inside the tensor (elements), ``data_size`` the
    storage's bytes; the blob position is derived, not stored.
    """

    index: int
    name: str = ""
    original_fqn: str = ""
    dtype: str = ""
    device_type: str = ""
    offset: int = 0
    data_size: int = 0
    from_folded: bool = False
    type: str = ""
    shape: tuple[int, ...] = ()
    stride: tuple[int, ...] = ()
    layout: str = "strided"

    @property
    def fqn(self) -> str:
        return self.original_fqn or self.name

    def summary(self) -> str:
        """``float32 [16, 4] stride [4, 1], 256 B, Parameter`` (one line)."""
        extra = f" offset {self.offset}" if self.offset else ""
        folded = ", folded" if self.from_folded else ""
        layout = f", {self.layout}" if self.layout != "strided" else ""
        return (
            f"{self.dtype} {list(self.shape)} stride {list(self.stride)}{extra}, {self.data_size} B, "
            f"{self.type or '?'}{folded}{layout}"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "fqn": self.original_fqn,
            "dtype": self.dtype,
            "device": self.device_type,
            "shape": list(self.shape),
            "stride": list(self.stride),
            "storage_offset": self.offset,
            "data_size": self.data_size,
            "from_folded": self.from_folded,
            "type": self.type,
            "layout": self.layout,
        }


@dataclass
class AotiModel:
    """One ``data/aotinductor/<name>/`` folder.

    Attributes:
        name: the model folder name (``model`` by default).
        files: its records.
        metadata: the parsed ``<wrapper>_metadata.json`` (all values strings).
        constants: the wrapper's constant table.
        num_inputs / num_outputs / num_constants: from the model constructor.
        input_names / output_names: from ``inputs_info_`` / ``outputs_info_``.
        in_spec / out_spec: the pytree call spec JSON strings (``pt2.md`` §3.4).
        weights_layout: ``embedded``, ``binary_blob``, ``pickle_weights``, ``mmap``,
            ``cpp_only`` (sources and an object file, no ``.so``) or ``none``.
        weights_config: ``pickle_weights`` config (FQN -> [file, shape, stride, offset]).
        elf: per shared object or object file, the parsed ELF facts (or the error text).
        tensors: FQN -> lazy tensor for every constant whose bytes were located.
        notes: things a reader should know (weights not extractable and why ...).
    """

    name: str
    files: list[PackageFile] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)
    metadata_files: dict[str, Any] = field(default_factory=dict)
    wrapper: str | None = None
    constants: list[ConstantInfo] = field(default_factory=list)
    num_inputs: int | None = None
    num_outputs: int | None = None
    num_constants: int | None = None
    input_names: list[str] = field(default_factory=list)
    output_names: list[str] = field(default_factory=list)
    in_spec: str | None = None
    out_spec: str | None = None
    weights_layout: str = "none"
    weights_config: dict[str, Any] | None = None
    blob: tuple[str, int, int] | None = None  # (record, offset inside it, size)
    elf: dict[str, ElfInfo | str] = field(default_factory=dict)
    tensors: dict[str, Tensor] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    weight_errors: dict[str, str] = field(default_factory=dict)

    def file(self, kind: str) -> list[PackageFile]:
        return [f for f in self.files if f.kind == kind]

    def to_dict(self, *, compact: bool = False) -> dict[str, Any]:
        """JSON-ready summary; ``compact`` gives one line per constant (for ``info``)."""
        by_kind: dict[str, dict[str, int]] = {}
        for f in self.files:
            by_kind.setdefault(f.kind, {})[f.name] = f.size
        consts: Any = [c.to_dict() for c in self.constants]
        if compact:
            consts = {c.fqn: c.summary() for c in self.constants}
        return {
            "name": self.name,
            "metadata": self.metadata,
            "inputs": self.input_names if self.input_names else self.num_inputs,
            "outputs": self.output_names if self.output_names else self.num_outputs,
            "weights_layout": self.weights_layout,
            "blob": None if self.blob is None else {"record": self.blob[0], "offset": self.blob[1], "size": self.blob[2]},
            "constants": consts,
            "tensors_extracted": len(self.tensors),
            "files": by_kind,
            "binaries": {k: (v.to_dict() if isinstance(v, ElfInfo) else {"error": v}) for k, v in self.elf.items()},
            "in_spec": self.in_spec,
            "out_spec": self.out_spec,
            "notes": self.notes,
            "weight_errors": self.weight_errors,
        }


@dataclass
class AotiPackage:
    """A parsed AOTInductor package.

    Attributes:
        zip: the open :class:`ZipReader`.
        models: model folder name -> :class:`AotiModel`.
        records: small archive records (``archive_format``, ``.data/version`` ...).
        other_files: records outside ``data/aotinductor/`` (ExportedProgram JSON, weights
            of ``pickle_weights``, extra files).
    """

    zip: ZipReader
    models: dict[str, AotiModel] = field(default_factory=dict)
    records: dict[str, str] = field(default_factory=dict)
    other_files: list[PackageFile] = field(default_factory=list)
    weight_files: dict[str, Any] = field(default_factory=dict)
    #: records of a remote archive already fetched whole (a deflated shared object:
    #: parsed, then its linked weights sliced), so each is fetched once
    fetched: dict[str, memoryview] = field(default_factory=dict, repr=False)
    #: record name -> :meth:`record_source` (a binary is parsed, then its weights sliced)
    sources: dict[str, ByteSource] = field(default_factory=dict, repr=False)

    def record_source(self, e: ZipEntry) -> ByteSource:
        """Record ``e`` as a ByteSource, what the binary parsers read. A stored record (what
        torch writes) is a :class:`~torchless.io.source.SliceSource` of the archive: read
        through the file mapping, or, in a remote archive, by ranges (only what is read is
        fetched). A deflated record has no ranges: it is inflated whole (fetched once).
        Records :meth:`ZipReader.read` refuses are refused the same way."""
        got = self.sources.get(e.name)
        if got is None:
            zr = self.zip
            if e.method == 0 and not e.flags & REFUSED_FLAGS and not e.is_directory and e.compressed_size == e.size:
                off = zr.data_offset(e)
                zr.source.check(off, e.size, what=f"record {e.name!r}")
                got = SliceSource(zr.source, off, e.size, name=zr.path)
            else:
                got = BytesSource(self.read_once(e), zr.path)
            self.sources[e.name] = got
        return got

    def read_once(self, e: ZipEntry) -> memoryview:
        """Record ``e``'s bytes; a remote archive's are kept for the next reader (a local
        one's are a view of the file mapping, not to be kept past the read)."""
        got = self.fetched.get(e.name)
        if got is None:
            got = self.zip.read(e)
            if isinstance(self.zip.source, RemoteSource):
                self.fetched[e.name] = got
                self.zip.hold(e, got)  # verify's CRC-32 pass does not fetch it again
        return got

    @property
    def path(self) -> str:
        return self.zip.path

    def tensors(self) -> list[tuple[str, Tensor]]:
        """``(name, tensor)``: FQNs for one model, ``<model>/<fqn>`` when there are several."""
        many = len(self.models) > 1
        out = []
        for m in self.models.values():
            for fqn, t in m.tensors.items():
                out.append((f"{m.name}/{fqn}" if many else fqn, t))
        return out


# -- the wrapper's constant table --------------------------------------------------------------
_ROW = re.compile(r"^\s*constants_info_\[(\d+)\]\.(\w+)\s*=\s*(.*?);\s*$", re.M)
_BASE = re.compile(r"AOTInductorModelBase\(\s*(\d+)\s*,\s*(\d+)\s*,\s*(\d+)\s*,")
_IO = re.compile(r'^\s*(inputs|outputs)_info_\[(\d+)\]\.name\s*=\s*"((?:[^"\\]|\\.)*)"\s*;', re.M)
_SPEC = re.compile(r'^\s*(in|out)_spec_\s*=\s*R"\((.*?)\)"\s*;', re.M | re.S)
_STR = re.compile(r'^"((?:[^"\\]|\\.)*)"$')
_INTS = re.compile(r"^\{([^}]*)\}$")


def _unescape(s: str) -> str:
    return re.sub(r"\\(.)", lambda m: {"n": "\n", "t": "\t"}.get(m.group(1), m.group(1)), s)


def _value(field_name: str, raw: str, row: ConstantInfo) -> None:
    raw = raw.strip()
    if field_name in ("name", "original_fqn"):
        m = _STR.match(raw)
        if m is None:
            raise FormatError(f"constant {row.index} {field_name} is not a string literal", found=raw[:80])
        setattr(row, field_name, _unescape(m.group(1)))
    elif field_name == "dtype":
        row.dtype = raw.rsplit("cached_torch_dtype_", 1)[-1]
    elif field_name == "device_type":
        row.device_type = raw.rsplit("cached_torch_device_type_", 1)[-1]
    elif field_name == "layout":
        row.layout = re.sub(r"^static_cast<int32_t>\((.*)\)$", r"\1", raw).rsplit("cached_torch_layout_", 1)[-1]
    elif field_name == "type":
        row.type = raw.rsplit("ConstantType::", 1)[-1].rstrip(")")
    elif field_name in ("offset", "data_size"):
        try:
            setattr(row, field_name, int(raw.rstrip("LlUu")))
        except ValueError:
            raise FormatError(f"constant {row.index} {field_name} is not an integer", found=raw[:80]) from None
    elif field_name == "from_folded":
        row.from_folded = raw == "true"
    elif field_name in ("shape", "stride"):
        m = _INTS.match(raw)
        if m is None:
            raise FormatError(f"constant {row.index} {field_name} is not an integer list", found=raw[:80])
        try:
            vals = tuple(int(x.strip().rstrip("LlUu")) for x in m.group(1).split(",") if x.strip())
        except ValueError:
            raise FormatError(f"constant {row.index} {field_name} is not an integer list", found=raw[:80]) from None
        setattr(row, field_name, vals)


def parse_constant_table(text: str, model: AotiModel | None = None) -> list[ConstantInfo]:
    """The ``constants_info_`` rows of a generated ``wrapper.cpp`` (and, into ``model``,
    the input/output names, counts and call spec)."""
    rows: dict[int, ConstantInfo] = {}
    for m in _ROW.finditer(text):
        i = int(m.group(1))
        if i > 10_000_000:
            raise LimitError("constant index too large", found=i)
        row = rows.setdefault(i, ConstantInfo(i))
        _value(m.group(2), m.group(3), row)
    if model is not None:
        b = _BASE.search(text)
        if b:
            model.num_inputs, model.num_outputs, model.num_constants = (int(x) for x in b.groups())
        ins: dict[int, str] = {}
        outs: dict[int, str] = {}
        for m in _IO.finditer(text):
            (ins if m.group(1) == "inputs" else outs)[int(m.group(2))] = _unescape(m.group(3))
        model.input_names = [ins[k] for k in sorted(ins)]
        model.output_names = [outs[k] for k in sorted(outs)]
        for m in _SPEC.finditer(text):
            setattr(model, f"{m.group(1)}_spec", m.group(2))
    return [rows[k] for k in sorted(rows)]


def blob_layout(constants: list[ConstantInfo], *, padded: bool = True) -> list[tuple[ConstantInfo, int]]:
    """``(constant, blob offset)`` for the constants stored in the blob (not folded ones)."""
    out = []
    pos = 0
    for c in constants:
        if c.from_folded:
            continue
        out.append((c, pos))
        n = c.data_size
        pos += ((n + ALIGN_BYTES - 1) // ALIGN_BYTES * ALIGN_BYTES) if padded else n
    return out


def blob_size(constants: list[ConstantInfo], *, padded: bool = True) -> int:
    lay = blob_layout(constants, padded=padded)
    if not lay:
        return 0
    c, off = lay[-1]
    n = c.data_size
    return off + (((n + ALIGN_BYTES - 1) // ALIGN_BYTES * ALIGN_BYTES) if padded else n)


def _dtype(c: ConstantInfo) -> DType | None:
    name = DTYPE_NAMES.get(c.dtype)
    return DTYPES.get(name) if name else None


# -- reading --------------------------------------------------------------------------------
def _json(zr: ZipReader, e: ZipEntry) -> Any:
    if e.size > MAX_JSON_BYTES:
        raise LimitError(
            "JSON record too large", path=zr.path, member=e.name, expected=f"<= {MAX_JSON_BYTES} bytes", found=e.size
        )
    return jsonsafe.loads(zr.read_bytes(e), what="record", path=zr.path, member=e.name, max_bytes=MAX_JSON_BYTES)


def view_nbytes(c: ConstantInfo, itemsize: int) -> int:
    """Bytes the constant's view reaches: ``(offset + extent) * itemsize``."""
    if any(s == 0 for s in c.shape):
        return 0
    return (c.offset + sum((s - 1) * st for s, st in zip(c.shape, c.stride, strict=False)) + 1) * itemsize


def _storage_tensor(c: ConstantInfo, dtype: DType, loader: Any, origin: str, key: str) -> Tensor:
    # data_size is the storage size rounded up to 64 bytes on CPU (cpp_wrapper_cpu.py), so
    # the storage is taken to end where the view does (exact for complete tensors)
    n = min(c.data_size, view_nbytes(c, dtype.itemsize))
    st = Storage(key, n, _U8, c.device_type or "cpu", loader=loader, origin=origin)
    return Tensor(
        st,
        dtype,
        c.shape,
        c.stride,
        c.offset,
        requires_grad=False,
        is_parameter=c.type == "Parameter",
        device=c.device_type or "cpu",
    )


def _blob_tensors(model: AotiModel, view_of: Any, origin: str, base: int, size: int) -> None:
    """Make tensors for the constants table over a blob at ``[base, base+size)``."""
    need = blob_size(model.constants)
    if size < need:
        # all-CUDA blobs are not padded (spec §1.2); accept that size too
        if size >= blob_size(model.constants, padded=False) and all(
            c.device_type == "cuda" for c in model.constants if not c.from_folded
        ):
            layout = blob_layout(model.constants, padded=False)
        else:
            model.notes.append(
                f"constants blob in {origin} has {size} bytes, the constant table needs {need}; tensors not extracted"
            )
            return
    else:
        layout = blob_layout(model.constants)
    for c, off in layout:
        dt = _dtype(c)
        if dt is None or c.layout != "strided":
            model.notes.append(f"constant {c.fqn!r}: dtype {c.dtype!r} / layout {c.layout!r} is not readable as a strided tensor")
            continue
        loader = _BlobLoader(view_of, base + off, min(c.data_size, view_nbytes(c, dt.itemsize)))
        model.tensors[c.fqn] = _storage_tensor(c, dt, loader, origin, f"{model.name}/{c.name}")


def _read_model(pkg: AotiPackage, name: str, files: list[PackageFile], limits: Limits) -> AotiModel:
    zr = pkg.zip
    model = AotiModel(name, files)
    for f in files:
        if f.kind == "metadata":
            try:
                model.metadata_files[f.name] = _json(zr, zr.get(f.name))
            except TorchlessError as e:
                model.metadata_files[f.name] = {"<error>": str(e)}
    wrappers = [f for f in files if f.kind == "metadata" and f.name.endswith(".wrapper_metadata.json")]
    first_meta = wrappers[0] if wrappers else next((f for f in files if f.kind == "metadata"), None)
    if first_meta is not None and isinstance(model.metadata_files.get(first_meta.name), dict):
        model.metadata = model.metadata_files[first_meta.name]
    ws = model.file("wrapper_source")
    if ws:
        model.wrapper = ws[0].name
        entry = zr.get(ws[0].name)
        if entry.size > MAX_WRAPPER_BYTES:
            model.notes.append(f"wrapper source is {entry.size} bytes; its constant table was not read")
        else:
            text = zr.read_bytes(entry).decode("utf-8", "replace")
            model.constants = parse_constant_table(text, model)
    for f in model.file("shared_object") + model.file("object"):
        entry = zr.get(f.name)
        try:
            model.elf[f.name] = parse_binary(pkg.record_source(entry), name=zr.path, member=entry.name)
        except TorchlessError as err:
            model.elf[f.name] = str(err)
    _locate_weights(pkg, model, limits)
    return model


def _locate_weights(pkg: AotiPackage, model: AotiModel, limits: Limits) -> None:
    zr = pkg.zip
    blobs = model.file("weights_blob")
    configs = model.file("weights_config")
    stored = [c for c in model.constants if not c.from_folded]
    if configs:
        model.weights_layout = "pickle_weights"
        _pickle_weights(pkg, model, configs[0], limits)
        return
    if blobs:
        model.weights_layout = "binary_blob"
        e = zr.get(blobs[0].name)
        model.blob = (blobs[0].name, 0, e.size)
        _blob_tensors(model, _record_slicer(zr, e), e.name, 0, e.size)
        return
    sos = [k for k, v in model.elf.items() if isinstance(v, ElfInfo) and v.type != "relocatable"]
    if not sos:
        # package_cpp_only: the blob is in a ``<hash>.weights.o`` object file, if anywhere
        objs = [k for k, v in model.elf.items() if isinstance(v, ElfInfo) and v.blob is not None]
        bins = model.file("weights_bin")
        if bins and not objs:
            # package_cpp_only + force_mmap_weights: <wrapper>_serialized_weights.bin is the
            # blob followed by the 8-byte magic number (codecache.py)
            be = zr.get(bins[0].name)
            model.weights_layout = "mmap"
            if be.size < 8:
                model.notes.append(f"{bins[0].name} is shorter than its 8-byte magic number; weights not extracted")
                return
            model.blob = (bins[0].name, 0, be.size - 8)
            _blob_tensors(model, _record_slicer(zr, be), be.name, 0, be.size - 8)
            return
        if objs:
            info = model.elf[objs[0]]
            assert isinstance(info, ElfInfo) and info.blob is not None
            _from_linked_record(pkg, model, objs[0], info, cpp_only=True)
        elif model.file("object") or model.file("cmake") or model.file("weights_bin"):
            model.weights_layout = "cpp_only"
            if stored:
                model.notes.append("package holds sources only (package_cpp_only) and no constants blob was found")
        elif stored:
            model.notes.append("no shared object and no weight files: constants are not stored in this package")
        return
    so_name = model.wrapper[: -len(".cpp")] + ".so" if model.wrapper else sos[0]
    if so_name not in sos:
        so_name = sos[0]
    info = model.elf[so_name]
    assert isinstance(info, ElfInfo)
    if info.blob is None:
        model.weights_layout = "embedded"
        if stored:
            model.notes.append(
                f"constants are embedded in {so_name} but its constants-blob symbols were not found; not extracted"
            )
        return
    _from_linked_record(pkg, model, so_name, info, cpp_only=False)


class _Range:
    """``(offset, length) -> bytes`` of ``[start, start+size)`` of a source, clamped to it
    (a view of the file mapping taken at each read, or that range only of a remote
    archive). :meth:`check` raises what the call would raise and returns the length it
    would return, reading nothing (``verify``'s tensor checks, after its CRC-32 pass read
    the record)."""

    __slots__ = ("src", "start", "size", "what")

    def __init__(self, src: ByteSource, start: int, size: int, what: str) -> None:
        self.src, self.start, self.size, self.what = src, start, size, what

    def __call__(self, o: int, n: int) -> memoryview:
        return self.src.view(self.start + o, max(0, min(n, self.size - o)), what=self.what)

    def check(self, o: int, n: int) -> int:
        n = max(0, min(n, self.size - o))
        self.src.check(self.start + o, n, what=self.what)
        return n


class _BlobLoader:
    """A constant's loader: its range of the blob; :meth:`check` as the slicer's, when it
    has one (see :meth:`~torchless.core.tensor.Storage.check`)."""

    __slots__ = ("view_of", "o", "n")

    def __init__(self, view_of: Callable[[int, int], memoryview], o: int, n: int) -> None:
        self.view_of, self.o, self.n = view_of, o, n

    def __call__(self) -> memoryview:
        return self.view_of(self.o, self.n)

    def check(self) -> int:
        check = getattr(self.view_of, "check", None)
        if check is None:  # bytes in memory or a view of the file mapping: nothing is fetched
            return len(memoryview(self()).cast("B"))
        return int(check(self.o, self.n))


def _record_slicer(zr: ZipReader, e: ZipEntry) -> Callable[[int, int], memoryview]:
    """``(offset, length) -> bytes`` of record ``e``, read through the archive on each
    call: a view of the file mapping, or, in a remote archive, that range only (a stored
    record; a deflated one is inflated whole)."""
    if e.method == 0 and isinstance(zr.source, RemoteSource):
        return _Range(zr.source, zr.data_offset(e), e.size, f"record {e.name}")
    return lambda o, n: zr.read(e)[o : o + n]


def _slicer(src: ByteSource) -> Callable[[int, int], memoryview]:
    """``(offset, length) -> bytes`` of a record's :meth:`AotiPackage.record_source`: a
    view of the file mapping taken at each read (so closing the package unmaps the file),
    that range only of a remote archive, or a slice of an inflated record."""
    return _Range(src, 0, src.size, "constant")


def _from_linked_record(pkg: AotiPackage, model: AotiModel, rec: str, info: ElfInfo, *, cpp_only: bool) -> None:
    """Weights from the record linked between the blob symbols of ``rec`` (a .so or .o)."""
    assert info.blob is not None
    zr = pkg.zip
    e = zr.get(rec)
    src = pkg.record_source(e)  # read by ranges: the linked record, the tail, the constants
    off, size = info.blob
    need = blob_size(model.constants)
    stored = [c for c in model.constants if not c.from_folded]
    if size == 16 and need != 16:
        # force_mmap_weights: the linked record is (blob size + 8, magic); the blob and the
        # magic number are appended at the end of the .so (codecache.py, spec §1.2)
        total, magic = struct.unpack("<qq", src.read_at(off, 16, what="mmap weights record"))
        model.weights_layout = "mmap"
        blob_len = total - 8
        start = src.size - 8 - blob_len
        tail_magic = struct.unpack("<q", src.read_at(src.size - 8, 8, what="mmap magic"))[0] if src.size >= 8 else None
        if cpp_only:
            # package_cpp_only + mmap: blob + magic are kept in <wrapper>_serialized_weights.bin
            bins = model.file("weights_bin")
            if not bins:
                model.notes.append(f"{rec}: mmap build without its *_serialized_weights.bin; weights not extracted")
                return
            be = zr.get(bins[0].name)
            bsrc = pkg.record_source(be)  # its size and magic number; the constants by range
            if bsrc.size != total or total < 8 or struct.unpack("<q", bsrc.read_at(total - 8, 8, what="mmap magic"))[0] != magic:
                model.notes.append(
                    f"{bins[0].name} does not match the record linked in {rec} (size {total}, magic); not extracted"
                )
                return
            model.blob = (bins[0].name, 0, blob_len)
            _blob_tensors(model, _slicer(bsrc), be.name, 0, blob_len)
            return
        if tail_magic != magic or blob_len < 0 or start < info.end_of_elf:
            model.notes.append(f"{rec}: mmap weights record does not match the bytes appended to the file; not extracted")
            return
        model.blob = (rec, start, blob_len)
        _blob_tensors(model, _slicer(src), e.name, start, blob_len)
        return
    if size == 8 and need != 8:
        (declared,) = struct.unpack("<q", src.read_at(off, 8, what="external weights record"))
        model.weights_layout = "external"
        model.notes.append(f"{rec} expects an external weights blob of {declared} bytes that is not in the package")
        return
    model.weights_layout = "embedded"
    model.blob = (rec, off, size)
    if stored:
        _blob_tensors(model, _slicer(src), e.name, off, size)


def _pickle_weights(pkg: AotiPackage, model: AotiModel, cfg_file: PackageFile, limits: Limits) -> None:
    zr = pkg.zip
    cfg = _json(zr, zr.get(cfg_file.name))
    if not isinstance(cfg, dict):
        raise FormatError("weights_config.json is not an object", path=zr.path, member=cfg_file.name)
    model.weights_config = cfg
    for fqn, spec in cfg.items():
        if not (
            isinstance(spec, list)
            and len(spec) == 4
            and isinstance(spec[0], str)
            and isinstance(spec[1], list)
            and isinstance(spec[2], list)
            and type(spec[3]) is int
        ):
            raise FormatError(
                "weights_config entry is not [file, shape, stride, storage_offset]",
                path=zr.path,
                member=cfg_file.name,
                found=f"{fqn}: {str(spec)[:80]}",
            )
        try:
            t = _weight_file_tensor(pkg, spec[0], limits)
        except TorchlessError as e:
            # reported by verify(); the other weights stay readable
            model.weight_errors[str(fqn)] = str(e)
            continue
        if t is None:
            model.notes.append(f"weight {fqn!r}: {WEIGHTS_DIR}{spec[0]} holds no plain tensor")
            continue
        model.tensors[str(fqn)] = Tensor(
            t.storage,
            t.dtype,
            spec[1],
            spec[2],
            spec[3],
            requires_grad=t.requires_grad,
            is_parameter=t.is_parameter,
            device=t.device,
        )


def _weight_file_tensor(pkg: AotiPackage, fname: str, limits: Limits) -> Tensor | None:
    """The tensor saved in ``data/weights/<fname>`` (a nested torch.save zip), cached."""
    if fname in pkg.weight_files:
        return pkg.weight_files[fname]
    zr = pkg.zip
    if "/" in fname or "\\" in fname or fname in ("", ".", ".."):
        raise FormatError("weight file name is not a plain name", path=zr.path, found=repr(fname))
    rec = WEIGHTS_DIR + fname
    e = zr.lookup(rec)
    if e is None:
        raise NotFoundError("weights_config names a weight file that is not in the package", path=zr.path, member=rec)
    if e.method == 0 and isinstance(zr.source, RemoteSource):  # its ranges only: the storage is fetched when read
        inner = ZipReader(SliceSource(zr.source, zr.data_offset(e), e.size, name=f"{zr.path}:{e.name}"))
    else:
        inner = ZipReader(BytesSource(zr.read(e), f"{zr.path}:{e.name}"))
    cp = read_zip_checkpoint(inner, weights_only=True, limits=limits)
    obj = cp.obj
    t = obj if isinstance(obj, Tensor) else None
    pkg.weight_files[fname] = t
    return t


def read_package(src: Any, *, limits: Limits = Limits()) -> AotiPackage:
    """Open an AOTInductor package and read everything but the tensor payloads.

    Args:
        src: path, bytes or ByteSource of the ``.pt2`` zip.
        limits: pickle limits for ``pickle_weights`` files.

    Raises:
        FormatError: not a zip, or no ``data/aotinductor/<model>/`` records.
        UnsafeGlobalError: a weight pickle names a global outside the allowlist.
    """
    if isinstance(src, ZipReader):  # parsed already (by detection)
        zr = src
    else:
        source = open_source(src)
        if not is_zip(source.read_at(0, min(4, source.size))):
            raise FormatError(
                "not a zip archive", path=source.name, expected="PK\\x03\\x04", found=repr(source.read_at(0, min(4, source.size)))
            )
        zr = ZipReader(source, require_prefix=False)
    pkg = AotiPackage(zr)
    try:
        for rec in PT2_RECORDS:
            e = zr.lookup(rec)
            if e is not None and e.size <= 64:
                pkg.records[rec] = zr.read_bytes(e).decode("ascii", "replace")
        groups: dict[str, list[PackageFile]] = {}
        for rec, e in zip(zr.records(), zr.entries, strict=False):
            if rec.startswith(AOTINDUCTOR_DIR) and rec.count("/") >= 3:
                mname = rec[len(AOTINDUCTOR_DIR) :].split("/", 1)[0]
                groups.setdefault(mname, []).append(PackageFile(rec, e.size, file_kind(rec), mname))
            else:
                kind = (
                    "weight"
                    if rec.startswith(WEIGHTS_DIR)
                    else ("exported_program" if rec.startswith("models/") and rec.endswith(".json") else "archive")
                )
                pkg.other_files.append(PackageFile(rec, e.size, kind))
        if not groups:
            raise FormatError(
                "no AOTInductor output in this archive", path=zr.path, expected=f"records under {AOTINDUCTOR_DIR}<model>/"
            )
        for mname, files in groups.items():
            pkg.models[mname] = _read_model(pkg, mname, files, limits)
    except TorchlessError as err:
        err.with_context(path=zr.path)
        raise
    return pkg
