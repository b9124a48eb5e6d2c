"""NumPy ``.npz`` (and single ``.npy``): read zero-copy, write with dtypes preserved.

Reading follows ``numpy.load`` exactly: the archive is read with Python's ``zipfile``
rules (:class:`~torchless.container.pyzip.PyZipReader`: end record, ``concat`` offset
shift, last entry of a name, CRC-32), a key is a member name without ``.npy`` (the member
named exactly wins), a member is an array when it starts with the ``.npy`` magic, and
headers are parsed by NumPy's own (safe, literal) header reader with ``np.load``'s header
size limit. Stored arrays are views of the memory map. Arrays of a dtype torch has no
counterpart for (strings, bytes, datetimes, structured records) are not tensors: they are
values, read as read-only NumPy arrays by :meth:`NpzArtifact.load` (as ``np.load`` gives
them) and listed by ``info``, compared by ``diff`` and named as dropped by ``convert``.
Object arrays are pickles: they are never loaded (:class:`ObjectArray` stands in for
one, as ``np.load(allow_pickle=False)`` refuses only that member; ``torchless scan``
looks inside). Members that are not arrays are returned as ``bytes`` by
:meth:`NpzArtifact.load`, as NumPy does.

Dtypes NumPy cannot name (bfloat16, float8, complex32, the ``bits`` types) are written
the way ``np.save`` writes the same ml_dtypes array: opaque ``V<itemsize>`` elements
holding the raw little-endian bytes, so ``dict(np.load(f))`` works and
``a.view(ml_dtypes.bfloat16)`` restores the values. torchless records the real dtype in
the member's zip comment (``torchless.dtype=bfloat16``), which NumPy ignores; files
from older torchless versions (``__torchless_dtypes__.json``) are still read. 0-d arrays
keep shape ``()``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np

from ..container.zip import is_zip
from ..core import jsonsafe
from ..core.dtypes import by_name, from_numpy
from ..core.errors import ChecksumError, FormatError, TorchlessError, UnsupportedError
from ..core.findings import Problem
from ..core.tensor import Storage, Tensor, as_tensor, unique_names
from ..io.atomic import AtomicFile
from ..io.source import ByteSource, BytesSource, open_source
from .base import ZIP_CRC, Artifact, Capabilities, FormatHandler, LoadPolicy, Probe
from .npz_spec import DTYPE_COMMENT, DTYPES_MEMBER, NPY_MAGIC, NPY_SUFFIX, check_name, is_npy, is_npz_head, member_key
from .registry import register

__all__ = ["NpzArtifact", "ObjectArray", "write_npz", "parse_npy"]


MAX_HEADER = 10000  # np.load's default max_header_size (allow_pickle=False)


class ObjectArray:
    """An object array of a ``.npz``/``.npy``: a pickle, never loaded (what
    ``np.load(allow_pickle=False)`` refuses for that member alone)."""

    __slots__ = ("member", "shape", "_data")

    def __init__(self, member: str, shape: tuple[int, ...], data: Callable[[], Any] | None = None) -> None:
        self.member = member
        self.shape = shape
        self._data = data

    def digest(self) -> str:
        """SHA-256 of the pickled bytes (what ``diff`` compares; nothing is unpickled)."""
        import hashlib

        if self._data is None:
            raise UnsupportedError("the object array's bytes are not available", member=self.member)
        return hashlib.sha256(self._data()).hexdigest()

    @property
    def class_name(self) -> str:
        return "numpy object array (a pickle; not loaded)"

    def __repr__(self) -> str:
        return f"ObjectArray({self.member!r}, shape={self.shape})"


def parse_npy(
    src: ByteSource, offset: int, size: int, name: str, *, max_header: int = MAX_HEADER, allow_object: bool = False
) -> tuple[np.dtype, tuple[int, ...], bool, int]:
    """``(dtype, shape, fortran_order, data_offset)`` of an ``.npy`` at ``offset``: version
    1, 2 and 3 headers under ``np.load``'s size limit, read with NumPy's rules by a strict
    bounded parser (core/npyheader: no ``tokenize``/``ast`` on hostile text)."""
    from ..core.npyheader import parse_npy_header  # here: detection imports this module

    head = src.view(offset, min(size, max_header + 12), what=f"npy header of {name}")
    try:
        h = parse_npy_header(head, max_header_size=max_header)
    except TorchlessError as e:
        if e.offset is not None:
            e.offset += offset
        e.with_context(path=src.name, member=name)
        raise
    dtype = h.dtype
    if dtype.hasobject and not allow_object:
        raise UnsupportedError(
            "object arrays are pickles; torchless does not load them",
            path=src.name,
            member=name,
            hint="use 'torchless scan' to inspect them",
        )
    return dtype, h.shape, h.fortran_order, offset + h.data_offset


class _NpyLoader:
    """An array's loader: the member's CRC-32 checked, as zipfile checks it, on first
    access, then a view of the data. :meth:`check` raises what the call would raise
    without reading the data (see :meth:`~torchless.core.tensor.Storage.check`)."""

    __slots__ = ("src", "off", "nbytes", "crc")

    def __init__(self, src: ByteSource, off: int, nbytes: int, crc: Callable[[], None] | None) -> None:
        self.src, self.off, self.nbytes, self.crc = src, off, nbytes, crc

    def __call__(self) -> memoryview:
        if self.crc is not None:
            self.crc()
        return self.src.view(self.off, self.nbytes)

    def check(self) -> int:
        if self.crc is not None:
            self.crc()
        self.src.check(self.off, self.nbytes)
        return self.nbytes


def _member_from_npy(
    src: ByteSource, off: int, size: int, name: str, override: str | None, check: Callable[[], None] | None = None
) -> Tensor | np.ndarray | ObjectArray:
    """The ``.npy`` at ``off`` (header parsed once): a lazy tensor when torch has the dtype
    (or ``override`` names it); else the read-only NumPy array ``np.load`` gives (strings,
    datetimes, records), or an :class:`ObjectArray` for a pickle."""
    dtype, shape, fortran, data_off = parse_npy(src, off, size, name, allow_object=True)
    if dtype.hasobject:

        def pickled() -> Any:
            if check is not None:
                check()
            return src.view(data_off, off + size - data_off)

        return ObjectArray(name, shape, pickled)
    count = 1
    for s in shape:
        count *= s
    nbytes = count * dtype.itemsize
    if data_off + nbytes > off + size:
        raise FormatError(
            ".npy data shorter than its header says", path=src.name, member=name, expected=nbytes, found=off + size - data_off
        )
    if override:
        dt = by_name(override)
    else:
        try:
            dt = from_numpy(dtype)
        except UnsupportedError:  # no torch dtype: a value, as np.load gives it
            if check is not None:
                check()
            arr = np.frombuffer(src.view(data_off, nbytes), dtype=dtype, count=count)
            return arr.reshape(shape, order="F" if fortran else "C")
    if dt.itemsize != dtype.itemsize:
        raise FormatError(
            "recorded dtype does not match the stored element size",
            path=src.name,
            member=name,
            expected=f"{dt.itemsize}-byte elements for {dt.name}",
            found=str(dtype),
        )
    order = "big" if dtype.byteorder == ">" else "little"
    loader = _NpyLoader(src, data_off, nbytes, check)
    st = Storage(name, nbytes, dt, "cpu", loader=loader, byteorder=order, origin=name, file_offset=data_off)
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

    def __init__(self, path: Any, policy: LoadPolicy | None = None) -> None:
        super().__init__(path, policy)
        self.source = open_source(path)
        self._tensors: dict[str, Tensor] = {}
        self._other: dict[str, Any] = {}
        #: members already read whole with their CRC-32 checked while opening (inflated
        #: arrays, other members): verify does not inflate them a second time
        self._crc_checked: set[str] = set()
        head = self.source.read_at(0, min(6, self.source.size))
        if is_npz_head(head):  # np.load's test for a zip
            self._read_zip()
        elif is_npy(head):
            self._add("array", _member_from_npy(self.source, 0, self.source.size, "array", None))
        else:
            raise FormatError(
                "not a NumPy file (np.load would try to unpickle it)",
                path=self.path,
                expected="a zip or .npy magic number",
                found=repr(head),
            )

    def _read_zip(self) -> None:
        from ..container.pyzip import PyZipReader  # here: detection imports this module

        zr = PyZipReader(self.source)
        self.zip = zr
        names = zr.names()
        # NpzFile: key = name without ".npy"; a member named exactly like the key wins
        keys: dict[str, str] = {}
        for n in names:
            keys[member_key(n)] = n
        keys.update({n: n for n in names})
        overrides: dict[str, str] = {}
        meta = zr.getinfo(DTYPES_MEMBER)
        if meta is not None:
            overrides = jsonsafe.loads(zr.read(meta, max_size=1 << 24), what=DTYPES_MEMBER, path=self.path, member=DTYPES_MEMBER)
            if not isinstance(overrides, dict) or not all(isinstance(v, str) for v in overrides.values()):
                raise FormatError(f"bad {DTYPES_MEMBER}: expected an object of dtype names", path=self.path)
        done: set[str] = set()
        for n in names:
            key = member_key(n)
            if key in done:
                continue
            done.add(key)
            member = keys[key]
            e = zr.getinfo(member)
            assert e is not None
            if e.comment.startswith(DTYPE_COMMENT):
                overrides[key] = e.comment[len(DTYPE_COMMENT) :].decode("ascii", "replace")
            span = zr.stored_span(e)
            if span is not None:
                off, size = span
                src: ByteSource = self.source
                if bytes(src.view(off, min(6, size))) != NPY_MAGIC:
                    if member != DTYPES_MEMBER:
                        self._other[key] = bytes(zr.read(e))
                        self._crc_checked.add(member)
                    continue

                def check(e: Any = e) -> None:
                    zr.check(e)  # raises ChecksumError on a bad CRC-32 (computed once)

                self._add(key, _member_from_npy(src, off, size, member, overrides.get(key), check))
            else:
                data = zr.read(e)  # CRC-32 checked
                self._crc_checked.add(member)
                if bytes(data[:6]) != NPY_MAGIC:
                    if member != DTYPES_MEMBER:
                        self._other[key] = bytes(data)
                    continue
                sub = BytesSource(data, f"{self.path}:{member}")  # the inflated buffer itself: no copy
                self._add(key, _member_from_npy(sub, 0, len(data), member, overrides.get(key)))

    def _add(self, key: str, value: Any) -> None:
        if isinstance(value, Tensor):
            self._tensors[key] = value
        else:
            self._other[key] = value

    def load(self, *, weights_only: bool | None = None) -> Any:
        """What ``dict(np.load(path))`` holds: arrays as tensors, other members as bytes
        (torchless's own dtype record excepted)."""
        self.load_policy(weights_only)
        out: dict[str, Any] = dict(self._tensors)
        out.update(self._other)
        return out

    def tensors(self) -> Iterator[tuple[str, Any]]:
        return iter(self._tensors.items())

    def info(self) -> dict[str, Any]:
        """The tensor summary, plus every member that is not a tensor, described."""
        out = super().info()
        if self._other:
            out["other_members"] = {k: _describe(v) for k, v in self._other.items()}
        return out

    def verify(self) -> list[Problem]:
        """Every member's CRC-32, as ``np.load`` checks them (arrays and other members
        alike), then tensor bounds."""
        problems: list[Problem] = []
        zr = getattr(self, "zip", None)
        if zr is not None:
            for n in zr.names():
                if n in self._crc_checked:
                    continue
                e = zr.getinfo(n)
                try:
                    zr.check(e)  # a stored member piece by piece: the tensor checks then read nothing
                except ChecksumError as err:
                    problems.append(
                        Problem(
                            "crc", err.message + (f" (expected {err.expected}, found {err.found})" if err.expected else ""), n
                        )
                    )
                except FormatError as err:
                    problems.append(Problem("data", err.message, n))
        return problems + [
            p
            for p in super().verify()
            if not any(q.member and p.member and q.member.removesuffix(NPY_SUFFIX) == p.member for q in problems)
        ]

    def close(self) -> None:
        self.source.close()


def _describe(v: Any) -> str:
    if isinstance(v, np.ndarray):
        return f"array {v.dtype.str}{list(v.shape)} (no torch dtype)"
    if isinstance(v, ObjectArray):
        return f"object array {list(v.shape)} (a pickle; not loaded)"
    return f"{len(v)} bytes (not an array)"


def npz_array(t: Tensor) -> tuple[np.ndarray, str | None]:
    """The array torchless writes for ``t`` and the dtype name to record (None when
    NumPy's own dtype says it): native NumPy dtypes as they are, any other dtype as raw
    little-endian ``V<itemsize>`` elements (what ``np.save`` writes for ml_dtypes)."""
    arr = t.numpy(raw=True) if t.dtype.kind in ("quantized", "bits") or t.dtype.name == "complex32" else t.numpy()
    if arr.dtype.kind in "biufc?" and arr.dtype.type.__module__ == "numpy":
        return np.array(arr, order="C", copy=None), None  # keeps shape () for 0-d tensors
    raw = np.frombuffer(t.tobytes(), dtype=np.uint8) if t.numel() else np.zeros(0, np.uint8)
    return raw.view(f"V{t.dtype.itemsize}").reshape(t.shape), t.dtype.name


def write_npz(
    items: Iterable[tuple[str, Any]], path: Any, *, progress: Callable[[int], None] | None = None, compress: bool = False
) -> None:
    """Write named tensors as ``.npz`` (stored, zip64), atomically.

    Every input :func:`~torchless.core.tensor.as_tensor` accepts is taken; dtypes NumPy
    cannot name are stored as ``V<itemsize>`` with the real dtype in the member comment.
    """
    import zipfile  # imported here: detecting formats must not pay for it

    method = zipfile.ZIP_DEFLATED if compress else zipfile.ZIP_STORED
    with AtomicFile(path) as af, zipfile.ZipFile(af.file, "w", method, allowZip64=True) as zf:
        for name, t in unique_names(items, path):
            check_name(name, path)
            t = as_tensor(t, name=name)
            arr, real = npz_array(t)
            info = zipfile.ZipInfo(name + NPY_SUFFIX, date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = method
            if real is not None:
                info.comment = DTYPE_COMMENT + real.encode("ascii")
            with zf.open(info, "w", force_zip64=True) as f:
                np.lib.format.write_array(f, arr, allow_pickle=False)
            if progress is not None:
                progress(arr.nbytes)


@register
class NpzHandler(FormatHandler):
    name = "npz"
    extensions = (".npz", ".npy")
    priority = 90
    description = "NumPy .npz/.npy"
    capabilities = Capabilities(write_tensors=True, write_options=("compress",), checksum=ZIP_CRC + " (a bare .npy file: none)")

    def sniff(self, probe: Probe) -> bool:
        if probe.is_dir:
            return False
        if is_npy(probe.head):
            return True
        if is_npz_head(probe.head) and probe.suffix == ".npz":
            return True  # np.load reads any zip named .npz, with zipfile's rules
        if is_zip(probe.head):
            recs = probe.zip_records() or []
            return bool(recs) and all(r.endswith(NPY_SUFFIX) or r == DTYPES_MEMBER for r in recs) and probe.suffix == ".npz"
        return False

    def _open(self, path: Any, policy: LoadPolicy, probe: Probe | None) -> NpzArtifact:
        if probe is not None:
            probe.close()
        return NpzArtifact(path, policy)

    def write_tensors(
        self,
        items: Iterable[tuple[str, Any]],
        path: Any,
        *,
        progress: Callable[[int], None] | None = None,
        compress: bool = False,
    ) -> None:
        write_npz(items, path, progress=progress, compress=compress)
