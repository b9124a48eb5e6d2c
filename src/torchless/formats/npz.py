"""NumPy ``.npz`` (and single ``.npy``): read zero-copy, write with dtypes preserved.

Reading parses the zip and each ``.npy`` header itself (NumPy's own header parser is a
safe literal reader, used here), so stored arrays are views of the memory map; object
arrays are refused (they are pickles: ``torchless scan`` looks at those).

Dtypes NumPy cannot name (bfloat16, float8, complex32, the ``bits`` types) are written
the way ``np.save`` writes the same ml_dtypes array: opaque ``V<itemsize>`` elements
holding the raw little-endian bytes, so ``dict(np.load(f))`` works and
``a.view(ml_dtypes.bfloat16)`` restores the values. torchless records the real dtype in
the member's zip comment (``torchless.dtype=bfloat16``), which NumPy ignores; files
from older torchless versions (``__torchless_dtypes__.json``) are still read. 0-d arrays
keep shape ``()``.
"""

from __future__ import annotations

import io
import json
import struct
import zipfile
from typing import Any, Callable, Iterable, Iterator

import numpy as np

from ..container.zip import ZipReader, is_zip
from ..core.atomic import AtomicFile
from ..core.dtypes import by_name, from_numpy
from ..core.errors import FormatError, UnsupportedError
from ..core.source import ByteSource, open_source
from ..core.tensor import Storage, Tensor, as_tensor
from .base import Artifact, Probe
from .registry import register

__all__ = ["NpzArtifact", "write_npz", "parse_npy"]

DTYPES_MEMBER = "__torchless_dtypes__.json"  # older torchless versions' side member
DTYPE_COMMENT = b"torchless.dtype="


def _member_comment(zr: ZipReader, e: Any) -> bytes:
    """The central-directory comment of entry ``e`` (empty when none or unreadable)."""
    src = zr.source
    if e.central_offset + 46 > src.size:
        return b""
    n, m, k = struct.unpack_from("<HHH", src.read_at(e.central_offset + 28, 6))
    start = e.central_offset + 46 + n + m
    if k == 0 or start + k > src.size:
        return b""
    return bytes(src.read_at(start, k))


def parse_npy(src: ByteSource, offset: int, size: int, name: str) -> tuple[np.dtype, tuple[int, ...], bool, int]:
    """``(dtype, shape, fortran_order, data_offset)`` of an ``.npy`` at ``offset``."""
    head = bytes(src.view(offset, min(size, 65536 + 12), what=f"npy header of {name}"))
    f = io.BytesIO(head)
    try:
        major, _minor = np.lib.format.read_magic(f)
        if major == 1:
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(f, max_header_size=65536)
        elif major in (2, 3):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(f, max_header_size=65536)
        else:
            raise ValueError(f"npy version {major}")
    except (ValueError, SyntaxError) as e:
        raise FormatError(f"bad .npy header: {e}", path=src.name, member=name, offset=offset) from None
    if dtype.hasobject:
        raise UnsupportedError("object arrays are pickles; torchless does not load them", path=src.name, member=name, hint="use 'torchless scan' to inspect them")
    return dtype, tuple(shape), bool(fortran), offset + f.tell()


def _tensor_from_npy(src: ByteSource, off: int, size: int, name: str, override: str | None) -> Tensor:
    dtype, shape, fortran, data_off = parse_npy(src, off, size, name)
    count = 1
    for s in shape:
        count *= s
    nbytes = count * dtype.itemsize
    if data_off + nbytes > off + size:
        raise FormatError(".npy data shorter than its header says", path=src.name, member=name, expected=nbytes)
    dt = by_name(override) if override else from_numpy(dtype)
    if dt.itemsize != dtype.itemsize:
        raise FormatError("recorded dtype does not match the stored element size", path=src.name, member=name, expected=f"{dt.itemsize}-byte elements for {dt.name}", found=str(dtype))
    order = "big" if dtype.byteorder == ">" else "little"
    st = Storage(name, nbytes, dt, "cpu", loader=lambda: src.view(data_off, nbytes), byteorder=order, origin=name, file_offset=data_off)
    if fortran and shape:
        strides = []
        acc = 1
        for s in shape:
            strides.append(acc)
            acc *= s
        return Tensor(st, dt, shape, strides)
    return Tensor(st, dt, shape)


class NpzArtifact(Artifact):
    """An opened ``.npz`` archive or ``.npy`` file."""

    format = "npz"

    def __init__(self, path: Any) -> None:
        super().__init__(path)
        self.source = open_source(path)
        self._tensors: dict[str, Tensor] = {}
        if is_zip(self.source.read_at(0, min(4, self.source.size))):
            zr = ZipReader(self.source, require_prefix=False)
            overrides: dict[str, str] = {}
            if zr.lookup(DTYPES_MEMBER, full=True) is not None:
                try:
                    overrides = json.loads(zr.read_bytes(zr.get(DTYPES_MEMBER, full=True), max_size=1 << 24))
                except json.JSONDecodeError as e:
                    raise FormatError(f"bad {DTYPES_MEMBER}: {e}", path=self.path) from None
            for e in zr.entries:
                if not e.name.endswith(".npy"):
                    continue
                name = e.name[:-4]
                comment = _member_comment(zr, e)
                if comment.startswith(DTYPE_COMMENT):
                    overrides[name] = comment[len(DTYPE_COMMENT) :].decode("ascii", "replace")
                if e.method != 0:
                    data = zr.read(e)
                    from ..core.source import BytesSource

                    sub = BytesSource(bytes(data), f"{self.path}:{e.name}")
                    self._tensors[name] = _tensor_from_npy(sub, 0, len(data), e.name, overrides.get(name))
                else:
                    self._tensors[name] = _tensor_from_npy(self.source, zr.data_offset(e), e.size, e.name, overrides.get(name))
        else:
            self._tensors["array"] = _tensor_from_npy(self.source, 0, self.source.size, "array", None)

    def tensors(self) -> Iterator[tuple[str, Any]]:
        return iter(self._tensors.items())

    def close(self) -> None:
        self.source.close()


def npz_array(t: Tensor) -> tuple[np.ndarray, str | None]:
    """The array torchless writes for ``t`` and the dtype name to record (None when
    NumPy's own dtype says it): native NumPy dtypes as they are, any other dtype as raw
    little-endian ``V<itemsize>`` elements (what ``np.save`` writes for ml_dtypes)."""
    arr = t.numpy(raw=True) if t.dtype.kind in ("quantized", "bits") or t.dtype.name == "complex32" else t.numpy()
    if arr.dtype.kind in "biufc?" and arr.dtype.type.__module__ == "numpy":
        return np.array(arr, order="C", copy=None), None  # keeps shape () for 0-d tensors
    raw = np.frombuffer(t.tobytes(), dtype=np.uint8) if t.numel() else np.zeros(0, np.uint8)
    return raw.view(f"V{t.dtype.itemsize}").reshape(t.shape), t.dtype.name


def write_npz(items: Iterable[tuple[str, Any]], path: Any, *, progress: Callable[[int], None] | None = None, compress: bool = False) -> None:
    """Write named tensors as ``.npz`` (stored, zip64), atomically.

    Every input :func:`~torchless.core.tensor.as_tensor` accepts is taken; dtypes NumPy
    cannot name are stored as ``V<itemsize>`` with the real dtype in the member comment.
    """
    method = zipfile.ZIP_DEFLATED if compress else zipfile.ZIP_STORED
    with AtomicFile(path) as af:
        with zipfile.ZipFile(af.file, "w", method, allowZip64=True) as zf:
            for name, t in items:
                t = as_tensor(t, name=name)
                arr, real = npz_array(t)
                info = zipfile.ZipInfo(name + ".npy", date_time=(1980, 1, 1, 0, 0, 0))
                info.compress_type = method
                if real is not None:
                    info.comment = DTYPE_COMMENT + real.encode("ascii")
                with zf.open(info, "w", force_zip64=True) as f:
                    np.lib.format.write_array(f, arr, allow_pickle=False)
                if progress is not None:
                    progress(arr.nbytes)


@register
class NpzHandler:
    name = "npz"
    extensions = (".npz", ".npy")
    priority = 90
    description = "NumPy .npz/.npy"

    def sniff(self, probe: Probe) -> bool:
        if probe.is_dir:
            return False
        if probe.head[:6] == b"\x93NUMPY":
            return True
        if is_zip(probe.head):
            recs = probe.zip_records()
            return bool(recs) and all(r.endswith(".npy") or r == DTYPES_MEMBER for r in recs) and probe.suffix == ".npz"
        return False

    write_options = ("compress",)

    def open(self, path: Any, *, weights_only: bool = True) -> NpzArtifact:
        art = NpzArtifact(path)
        art.weights_only = weights_only
        return art

    def write_tensors(self, items: Iterable[tuple[str, Any]], path: Any, *, progress: Callable[[int], None] | None = None, compress: bool = False) -> None:
        write_npz(items, path, progress=progress, compress=compress)


