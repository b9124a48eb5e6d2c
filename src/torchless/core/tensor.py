"""The tensor model: storages and strided views over them, read lazily.

A :class:`Storage` is one ``data/<key>`` record: a run of bytes in the file, opened only
when someone asks for values. A :class:`Tensor` is torch's strided view on a storage:
``dtype``, ``shape``, ``stride()`` and ``storage_offset()`` in elements, exactly as the
checkpoint states them. ``Tensor.numpy()`` is a zero-copy view of the memory map whenever
the dtype exists in NumPy and no conj/neg bit must be applied; strides are validated
against the storage size first, so a hostile stride can never reach outside the record.

Tensors that share a storage in the file share one :class:`Storage` object here, as
they do in torch (``a.storage is b.storage``).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Literal

import numpy as np

from .buffers import is_mapped
from .dtypes import DType, by_name, from_numpy
from .errors import FormatError, UnsupportedError, UsageError
from .settings import SETTINGS

__all__ = [
    "require_utf8_name",
    "Storage",
    "Tensor",
    "SparseTensor",
    "NestedTensor",
    "as_tensor",
    "is_torch_tensor",
    "tensor",
    "unique_names",
]

_HOST_ORDER = sys.byteorder
#: sub-byte quantized dtypes: elements packed per byte (torch's int_repr gives the bytes)
_PACKED = {"quint4x2": 2, "quint2x4": 4}


class Storage:
    """One storage: ``nbytes`` bytes, read on first use.

    Args:
        key: the storage key in its file (``"0"``), for identity and error messages.
        nbytes: size in bytes.
        dtype: the storage's element dtype (``uint8`` for torch's UntypedStorage).
        location: the device string recorded by the writer (``"cpu"``, ``"cuda:0"``).
        data: the bytes, if already known (a memoryview into an mmap, bytes...).
        loader: called once to produce the bytes when ``data`` is None.
        byteorder: ``"little"`` or ``"big"``, the order the bytes are stored in.
        origin: where the bytes live, for messages (``"ckpt/data/0"``).
    """

    # (__weakref__: a batch reader refers to the storages it hands bytes to weakly)
    __slots__ = ("key", "nbytes", "dtype", "location", "_data", "_loader", "byteorder", "origin", "file_offset", "__weakref__")

    def __init__(
        self,
        key: str,
        nbytes: int,
        dtype: DType,
        location: str = "cpu",
        *,
        data: Any = None,
        loader: Callable[[], Any] | None = None,
        byteorder: str = "little",
        origin: str = "",
        file_offset: int | None = None,
    ) -> None:
        self.key = key
        self.nbytes = int(nbytes)
        self.dtype = dtype
        self.location = location
        self._data = None if data is None else memoryview(data).cast("B")
        self._loader = loader
        self.byteorder = byteorder
        self.origin = origin
        self.file_offset = file_offset

    @classmethod
    def _lazy(
        cls, key: str, nbytes: int, dtype: DType, location: str, loader: Callable[[], Any], byteorder: str, origin: str
    ) -> Storage:
        """``Storage(key, nbytes, dtype, location, loader=..., byteorder=..., origin=...)``
        for an int ``nbytes``, without the keyword handling (one per tensor when a
        checkpoint is parsed)."""
        self = cls.__new__(cls)
        self.key = key
        self.nbytes = nbytes
        self.dtype = dtype
        self.location = location
        self._data = None
        self._loader = loader
        self.byteorder = byteorder
        self.origin = origin
        self.file_offset = None
        return self

    @classmethod
    def _lazy_many(
        cls,
        keys: list[str],
        sizes: list[int],
        dtype: DType,
        location: str,
        loaders: Sequence[Callable[[], Any]],
        byteorder: str,
        origins: list[str],
    ) -> list[Storage]:
        """``_lazy(key, nbytes, dtype, location, loader, byteorder, origin)`` for each row of
        one dtype, location and byte order, without a call per storage."""
        new = cls.__new__
        out = []
        for key, nbytes, loader, origin in zip(keys, sizes, loaders, origins, strict=True):
            self = new(cls)
            self.key = key
            self.nbytes = nbytes
            self.dtype = dtype
            self.location = location
            self._data = None
            self._loader = loader
            self.byteorder = byteorder
            self.origin = origin
            self.file_offset = None
            out.append(self)
        return out

    def hold(self, data: Any) -> None:
        """Keep ``data``, bytes of this storage in memory of their own that were read
        together with others' (an eager read of many records at once), as if the loader
        had returned them; ignored when the storage holds bytes already or the size is
        not the storage's (the loader then reads them when asked)."""
        if self._data is None and len(data) == self.nbytes:
            self._data = (
                data if type(data) is memoryview and data.format == "B" and data.ndim == 1 else memoryview(data).cast("B")
            )
            # the loader is not asked again once the bytes are held: dropping it now breaks
            # the cycle storage -> loader -> batch reader -> its owners (the storages), so
            # a dropped eager load is freed at once, not at the next full GC pass (which
            # held every load's bytes until then: repeated loads in one process grew)
            self._loader = None

    @staticmethod
    def hold_many(owners: Sequence[Storage | None], buf: memoryview, offsets: list[int], sizes: list[int]) -> None:
        """``owner.hold(buf[off : off + size])`` for each owner that is not None, without a
        call per storage (an eager load hands out thousands at once). ``buf`` is a flat
        byte view, so its slices are what :meth:`hold` keeps as they are."""
        if type(buf) is not memoryview or buf.format != "B" or buf.ndim != 1:
            for o, off, n in zip(owners, offsets, sizes, strict=True):
                if o is not None:
                    o.hold(buf[off : off + n])
            return
        end = len(buf)
        for o, off, n in zip(owners, offsets, sizes, strict=True):
            if o is not None and o._data is None and o.nbytes == n and 0 <= off <= end - n:  # (a whole slice)
                o._data = buf[off : off + n]
                o._loader = None  # (see hold)

    @property
    def loaded(self) -> bool:
        """True when the bytes are held in memory (given, or copied by the loader);
        False for a storage read lazily, or through a file mapping on each access."""
        return self._data is not None

    def bytes(self) -> memoryview:
        """The storage's bytes (a zero-copy view when the source is memory-mapped).

        Bytes the loader copied into memory of their own (inflated, fetched, read eagerly)
        are kept for the next call. A view of a memory-mapped file is not kept: it is
        asked of the source on each call (a slice, no copy), so closing the artifact can
        unmap the file, and a read after ``close()`` raises UsageError instead of holding
        the mapping. The arrays a caller already has keep their own view.
        """
        data = self._data
        if data is None:
            if self._loader is None:
                raise UnsupportedError(f"storage {self.key!r} has no data (meta or skipped)")
            data = memoryview(self._loader()).cast("B")
            if len(data) != self.nbytes:
                raise FormatError(
                    f"storage {self.key!r} has the wrong size",
                    member=self.origin or None,
                    expected=f"{self.nbytes} bytes",
                    found=f"{len(data)} bytes",
                )
            if not is_mapped(data):
                self._data = data
        return data

    def check(self) -> None:
        """Raise what :meth:`bytes` would raise, without keeping the bytes where the
        loader can check itself (a zip record's loader checks the record's headers and
        bounds, and inflates a deflated one in chunks): ``verify`` checks every storage so,
        after its CRC-32 pass read the records, reading no payload twice and holding none
        whole. Other loaders are run (their bytes are kept, as :meth:`bytes` keeps them)."""
        if self._data is not None:
            return
        check = getattr(self._loader, "check", None)
        if check is None:
            self.bytes()
            return
        n = check()
        if n != self.nbytes:
            raise FormatError(
                f"storage {self.key!r} has the wrong size",
                member=self.origin or None,
                expected=f"{self.nbytes} bytes",
                found=f"{n} bytes",
            )

    @property
    def swap_unit(self) -> int:
        """Bytes per swapped unit when the storage is not in host order: torch's
        ``TypedStorage.byteswap`` swaps whole elements of the *storage* dtype, complex
        ones per half (1 for UntypedStorage: nothing to swap)."""
        isz = self.dtype.itemsize
        return max(isz // 2, 1) if self.dtype.kind == "complex" else isz

    @property
    def needs_swap(self) -> bool:
        return self.byteorder != _HOST_ORDER and self.swap_unit > 1

    def native_bytes(self) -> Any:
        """The bytes in host byte order: :meth:`bytes` itself, or a swapped copy for a
        storage stored in the other order (swapped in units of :attr:`swap_unit`,
        whatever dtype a tensor reads it with, as torch does)."""
        buf = self.bytes()
        if not self.needs_swap:
            return buf
        u = self.swap_unit
        if self.nbytes % u:
            raise FormatError(
                f"storage {self.key!r} is not a whole number of {u}-byte elements",
                member=self.origin or None,
                found=f"{self.nbytes} bytes",
            )
        other: Literal[">", "<"] = ">" if self.byteorder == "big" else "<"
        return np.frombuffer(buf, dtype=np.dtype(f"u{u}").newbyteorder(other)).byteswap().view(np.uint8).data

    def __len__(self) -> int:
        return self.nbytes

    def __repr__(self) -> str:
        return f"Storage(key={self.key!r}, nbytes={self.nbytes}, dtype={self.dtype.name}, location={self.location!r})"


def _contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides = []
    acc = 1
    for s in reversed(shape):
        strides.append(acc)
        acc *= max(s, 1)
    return tuple(reversed(strides))


class Tensor:
    """A strided tensor over a :class:`Storage`, mirroring ``torch.Tensor``'s names.

    Attributes:
        dtype: the element type (``torchless.core.dtypes.DType``).
        shape: sizes in elements (``torch.Size`` as a tuple).
        storage: the shared storage, or None for meta tensors.
        requires_grad: the flag as saved.
        is_parameter: True for ``torch.nn.Parameter``.
        device: the device recorded in the file (``"cpu"``, ``"cuda:0"``, ``"meta"``).
        metadata: torch's tensor metadata dict (``{"conj": True}``, ``{"neg": True}``).
        quantizer: for quantized tensors, ``{"qscheme": ..., "scale": ..., ...}``.
        attrs: Python attributes carried by the pickle (Parameter state, subclasses).
    """

    __slots__ = (
        "storage",
        "dtype",
        "shape",
        "_stride",
        "_offset",
        "requires_grad",
        "is_parameter",
        "device",
        "_metadata",
        "quantizer",
        "_attrs",
        "subclass",
    )

    # ``metadata`` and ``attrs`` are made when first asked for: almost every tensor of a
    # checkpoint has neither, and two empty dicts per tensor were an eighth of the memory
    # an eager load of many small tensors allocates (its page faults included)
    _metadata: dict[str, Any] | None
    _attrs: dict[str, Any] | None

    @property
    def metadata(self) -> dict[str, Any]:
        d = self._metadata
        if d is None:
            d = {}
            self._metadata = d
        return d

    @metadata.setter
    def metadata(self, value: dict[str, Any]) -> None:
        self._metadata = value

    @property
    def attrs(self) -> dict[str, Any]:
        d = self._attrs
        if d is None:
            d = {}
            self._attrs = d
        return d

    @attrs.setter
    def attrs(self, value: dict[str, Any]) -> None:
        self._attrs = value

    def __init__(
        self,
        storage: Storage | None,
        dtype: DType,
        shape: Iterable[int],
        stride: Iterable[int] | None = None,
        storage_offset: int = 0,
        *,
        requires_grad: bool = False,
        is_parameter: bool = False,
        device: str | None = None,
        metadata: dict[str, Any] | None = None,
        quantizer: dict[str, Any] | None = None,
    ) -> None:
        self.storage = storage
        self.dtype = dtype
        self.shape = tuple(int(s) for s in shape)
        self._stride = _contiguous_strides(self.shape) if stride is None else tuple(int(s) for s in stride)
        self._offset = int(storage_offset)
        self.requires_grad = bool(requires_grad)
        self.is_parameter = bool(is_parameter)
        self.device = device if device is not None else (storage.location if storage is not None else "meta")
        self._metadata = dict(metadata) if metadata else None
        self.quantizer = quantizer
        self._attrs = None
        self.subclass: str | None = None
        if len(self._stride) != len(self.shape):
            raise FormatError(
                "tensor stride and size have different lengths",
                expected=f"{len(self.shape)} strides",
                found=f"{len(self._stride)}",
            )
        if any(s < 0 for s in self.shape) or any(s < 0 for s in self._stride) or self._offset < 0:
            raise FormatError(
                "negative size, stride or storage offset", found=f"size={self.shape} stride={self._stride} offset={self._offset}"
            )

    @classmethod
    def _make(
        cls,
        storage: Storage | None,
        dtype: DType,
        shape: tuple[int, ...],
        stride: tuple[int, ...],
        offset: int,
        requires_grad: bool = False,
        metadata: dict[str, Any] | None = None,
    ) -> Tensor:
        """Fast constructor for already-validated tuples of ints (the pickle hot path)."""
        if len(stride) != len(shape) or offset < 0 or (shape and (min(shape) < 0 or min(stride) < 0)):
            return cls(storage, dtype, shape, stride, offset, requires_grad=requires_grad, metadata=metadata)
        self = cls.__new__(cls)
        self.storage = storage
        self.dtype = dtype
        self.shape = shape
        self._stride = stride
        self._offset = offset
        self.requires_grad = requires_grad
        self.is_parameter = False
        self.device = storage.location if storage is not None else "meta"
        self._metadata = metadata  # (the caller's dict, or made when asked for)
        self.quantizer = None
        self._attrs = None
        self.subclass = None
        return self

    @classmethod
    def _make_many(
        cls,
        storages: list[Storage],
        shapes: list[tuple[int, ...]],
        strides: list[tuple[int, ...]],
        offsets: list[int],
        requires_grad: list[bool],
    ) -> list[Tensor]:
        """``_make(st, st.dtype, shape, stride, offset, rg)`` for each row, for rows already
        checked to be what it takes as they are (as many strides as sizes, no negative
        size, stride or offset), without a call per tensor."""
        new = cls.__new__
        out = []
        for st, shape, stride, offset, rg in zip(storages, shapes, strides, offsets, requires_grad, strict=True):
            self = new(cls)
            self.storage = st
            self.dtype = st.dtype
            self.shape = shape
            self._stride = stride
            self._offset = offset
            self.requires_grad = rg
            self.is_parameter = False
            self.device = st.location
            self._metadata = None
            self.quantizer = None
            self._attrs = None
            self.subclass = None
            out.append(self)
        return out

    # torch.Tensor-like accessors -------------------------------------------------------
    def stride(self, dim: int | None = None) -> Any:
        return self._stride if dim is None else self._stride[dim]

    def storage_offset(self) -> int:
        return self._offset

    def size(self, dim: int | None = None) -> Any:
        return self.shape if dim is None else self.shape[dim]

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def dim(self) -> int:
        return len(self.shape)

    def numel(self) -> int:
        return math.prod(self.shape)

    def element_size(self) -> int:
        return self.dtype.itemsize

    @property
    def nbytes(self) -> int:
        """Logical size: ``numel() * element_size()``."""
        return self.numel() * self.dtype.itemsize

    @property
    def is_meta(self) -> bool:
        return self.storage is None

    @property
    def is_quantized(self) -> bool:
        return self.quantizer is not None

    def is_conj(self) -> bool:
        return bool(self.metadata.get("conj"))

    def is_neg(self) -> bool:
        return bool(self.metadata.get("neg"))

    def is_contiguous(self) -> bool:
        expected = _contiguous_strides(self.shape)
        return all(st == ex for s, st, ex in zip(self.shape, self._stride, expected, strict=False) if s != 1)

    # values ----------------------------------------------------------------------------
    def _packed_span(self) -> tuple[int, int]:
        """``(byte offset, byte count)`` of a sub-byte quantized tensor's packed bytes."""
        per = _PACKED[self.dtype.name]
        return self._offset, -(-self.numel() // per)

    def _check_bounds(self) -> None:
        assert self.storage is not None
        if self.numel() == 0:
            return
        if self.dtype.name in _PACKED:
            off, n = self._packed_span()
            if off + n > self.storage.nbytes:
                raise FormatError(
                    "packed quantized tensor reaches past the end of its storage",
                    member=self.storage.origin or None,
                    expected=f"<= {self.storage.nbytes} bytes",
                    found=f"{off + n}",
                )
            return
        last = self._offset + sum((s - 1) * st for s, st in zip(self.shape, self._stride, strict=False))
        capacity = self.storage.nbytes // self.dtype.itemsize
        if last >= capacity:
            raise FormatError(
                "tensor view reaches past the end of its storage",
                member=self.storage.origin or None,
                expected=f"last element index < {capacity}",
                found=f"{last} (size={self.shape}, stride={self._stride}, offset={self._offset})",
            )

    def numpy(self, *, raw: bool = False) -> np.ndarray:
        """The values as a NumPy array.

        A read-only zero-copy view of the storage when the dtype has a NumPy equivalent
        (bfloat16 and float8 via ml_dtypes) and no conj/neg bit is set. Otherwise a copy:
        complex32 is widened to complex64 (exact), conj/neg bits are applied. Quantized
        tensors give their integer representation (use :meth:`dequantize` for floats).

        Args:
            raw: return the stored element bytes' dtype (``DType.storage``) without
                applying conj/neg or widening complex32.

        Raises:
            UnsupportedError: meta tensors (no data).
            FormatError: the view does not fit in its storage.
        """
        st = self.storage
        if st is None:
            raise UnsupportedError(f"a {self.device} tensor has no data", hint="only shape and dtype are stored")
        if SETTINGS.tensor_numpy and not raw and self._metadata is None and st.byteorder == _HOST_ORDER:
            # the common case (a C-contiguous tensor of a NumPy dtype, stored in host order,
            # no conj/neg bit): one frombuffer of the elements' bytes, bounds checked here
            npd = self.dtype._numpy
            if isinstance(npd, np.dtype):  # (None: no NumPy dtype; a str: ml_dtypes, resolved below)
                shape = self.shape
                stride = self._stride
                if len(shape) == 1:
                    flat = stride[0] == 1 or shape[0] <= 1
                else:
                    flat = stride == _contiguous_strides(shape)
                n = math.prod(shape)
                if flat and n:
                    isz = npd.itemsize
                    off = self._offset * isz
                    if off + n * isz <= st.nbytes:
                        arr = np.frombuffer(st.bytes(), npd, n, off)
                        arr.flags.writeable = False
                        return arr.reshape(shape) if len(shape) != 1 else arr
        self._check_bounds()
        if self.dtype.name in _PACKED:
            # quint4x2 / quint2x4: the packed bytes, as torch's int_repr() returns them
            off, n = self._packed_span()
            return np.frombuffer(st.bytes(), np.uint8, count=n, offset=off) if n else np.zeros(0, np.uint8)
        npd = self.dtype.storage if (raw or self.dtype.numpy is None) else self.dtype.numpy
        # a storage in the other byte order is swapped in units of its own dtype (a copy)
        buf = st.native_bytes()
        if self.numel() == 0:
            arr = np.empty(self.shape, dtype=npd)
        else:
            # Stride over the raw bytes with a trailing axis of one element's bytes, then
            # view that axis as the dtype: as_strided cannot take ml_dtypes (float8...)
            # directly, and this works for every dtype, zero-copy.
            itemsize = npd.itemsize
            u8 = np.frombuffer(buf, dtype=np.uint8)
            arr = np.lib.stride_tricks.as_strided(
                u8[self._offset * itemsize :],
                shape=self.shape + (itemsize,),
                strides=tuple(s * itemsize for s in self._stride) + (1,),
                writeable=False,
            ).view(npd)[..., 0]
        if raw:
            return arr
        if self.dtype.name == "complex32":
            conj, neg = bool(self.metadata.get("conj")), bool(self.metadata.get("neg"))
            # torch's bits: a conj/neg bit flips the sign of the halves it negates, and
            # widening (torch's half to float conversion, as its resolving kernels) sets
            # each NaN's quiet bit, a signalling NaN's payload otherwise kept
            real = _torch_widened_halves(arr["real"], neg)
            imag = _torch_widened_halves(arr["imag"], conj != neg)
            # widen each half on its own: real + 1j * imag would turn an infinite or NaN
            # imaginary part into a NaN real part
            wide = np.empty(arr.shape, np.complex64)
            wide.real = real
            wide.imag = imag
            return wide
        if self.metadata.get("conj"):
            arr = np.conj(arr)
        if self.metadata.get("neg"):
            if arr.dtype == np.bool_:  # torch: "neg_cpu" not implemented for 'Bool'
                raise FormatError("a neg bit on a bool tensor (torch cannot resolve it either)", found="metadata neg=True")
            arr = np.negative(arr)
        return arr

    def dequantize(self) -> np.ndarray:
        """Float32 values of a quantized tensor (``(q - zero_point) * scale``)."""
        if self.quantizer is None:
            raise UsageError("dequantize() needs a quantized tensor")
        if self.dtype.name in _PACKED:
            raise UnsupportedError(
                f"dequantize() of packed {self.dtype.name} tensors", hint="numpy() gives the packed bytes, as torch's int_repr()"
            )
        q = self.numpy().astype(np.float32)
        qp = self.quantizer
        if qp["qscheme"] in ("per_tensor_affine", "per_tensor_symmetric"):
            out: np.ndarray = ((q - qp["zero_point"]) * qp["scale"]).astype(np.float32)
            return out
        axis = qp["axis"]
        shape = [1] * q.ndim
        shape[axis] = -1
        scales = np.asarray(qp["scales"].numpy(), dtype=np.float64).reshape(shape)
        zps = np.asarray(qp["zero_points"].numpy(), dtype=np.float64).reshape(shape)
        return ((q - zps) * scales).astype(np.float32)

    def tobytes(self) -> bytes:
        """The logical values, C-contiguous, in little-endian element order."""
        arr = np.ascontiguousarray(self.numpy(raw=True))  # host order (native_bytes)
        if _HOST_ORDER == "big" and self.dtype.itemsize > 1:
            unit = self.dtype.itemsize // 2 if self.dtype.kind == "complex" else self.dtype.itemsize
            arr = arr.view(np.uint8).view(f">u{unit}").astype(f"<u{unit}")
        return arr.tobytes()

    # construction ----------------------------------------------------------------------
    @classmethod
    def from_numpy(cls, array: Any, dtype: DType | str | None = None, *, requires_grad: bool = False) -> Tensor:
        """Wrap a NumPy array (zero-copy when it is C-contiguous and native-endian).

        Args:
            array: any array-like.
            dtype: the torch dtype to label the bytes with (defaults from the array's
                dtype); its itemsize must equal the array's.
        """
        arr = np.asarray(array)
        if arr.dtype.byteorder == ">" or (arr.dtype.byteorder == "<" and _HOST_ORDER == "big"):
            arr = arr.astype(arr.dtype.newbyteorder("="))
        shape = arr.shape  # np.ascontiguousarray turns 0-d arrays into 1-d ones
        arr = np.ascontiguousarray(arr)
        dt = from_numpy(arr.dtype) if dtype is None else (by_name(dtype) if isinstance(dtype, str) else dtype)
        if dt.itemsize != arr.dtype.itemsize:
            raise UsageError(
                f"cannot label {arr.dtype} data as {dt}", expected=f"itemsize {dt.itemsize}", found=arr.dtype.itemsize
            )
        flat = arr.reshape(-1).view(np.uint8) if arr.size else np.zeros(0, np.uint8)
        storage = Storage("", flat.nbytes, dt, "cpu", data=flat.data if flat.nbytes else b"", byteorder=_HOST_ORDER)
        return cls(storage, dt, shape, None, 0, requires_grad=requires_grad)

    def __repr__(self) -> str:
        extra = ", parameter" if self.is_parameter else ""
        if self.quantizer:
            extra += f", {self.quantizer['qscheme']}"
        if self.device not in ("cpu",):
            extra += f", device={self.device!r}"
        return f"Tensor(shape={list(self.shape)}, dtype={self.dtype.name}{extra})"

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        arr = self.numpy()
        return arr if dtype is None else arr.astype(dtype)


class SparseTensor:
    """A sparse tensor (COO, CSR, CSC, BSR, BSC) as its component tensors.

    Attributes:
        layout: ``"sparse_coo"``, ``"sparse_csr"``, ...
        shape: the dense shape.
        tensors: the components by name (``indices``/``values`` for COO,
            ``crow_indices``/``col_indices``/``values`` for CSR, ...).
        is_coalesced: for COO.
    """

    def __init__(self, layout: str, shape: tuple[int, ...], tensors: dict[str, Tensor], is_coalesced: bool | None = None) -> None:
        self.layout = layout
        self.shape = tuple(int(s) for s in shape)
        self.tensors = tensors
        self.is_coalesced = is_coalesced
        self.requires_grad = False
        self.is_parameter = False
        self.attrs: dict[str, Any] = {}  # Python attributes torch pickled with it

    @property
    def dtype(self) -> DType:
        return self.tensors["values"].dtype

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.tensors.values())

    def numel(self) -> int:
        return math.prod(self.shape)

    def to_dense(self) -> np.ndarray:
        """Dense NumPy values (COO sums duplicates, as torch does).

        Raises:
            FormatError: indices outside the shape (torch's invariant check refuses them).
        """
        for name in ("indices", "compressed_indices", "plain_indices"):
            t = self.tensors.get(name)
            if t is not None and t.numel() and int(np.min(t.numpy())) < 0:
                raise FormatError(f"sparse tensor has negative {name}", found=int(np.min(t.numpy())))
        try:
            return self._to_dense()
        except (IndexError, ValueError, TypeError) as e:
            raise FormatError(f"sparse tensor components do not fit its shape: {e}", found=f"shape={list(self.shape)}") from None

    def _to_dense(self) -> np.ndarray:
        vals = self.tensors["values"].numpy()
        out = np.zeros(self.shape, dtype=vals.dtype)
        if self.layout == "sparse_coo":
            idx = self.tensors["indices"].numpy()
            sparse_dims = idx.shape[0]
            np.add.at(out, tuple(idx[i] for i in range(sparse_dims)), vals)
            return out
        if self.layout in ("sparse_csr", "sparse_csc"):
            comp = self.tensors["compressed_indices"].numpy()
            plain = self.tensors["plain_indices"].numpy()
            for i in range(len(comp) - 1):
                for j in range(comp[i], comp[i + 1]):
                    if self.layout == "sparse_csr":
                        out[i, plain[j]] = vals[j]
                    else:
                        out[plain[j], i] = vals[j]
            return out
        if self.layout in ("sparse_bsr", "sparse_bsc"):
            comp = self.tensors["compressed_indices"].numpy()
            plain = self.tensors["plain_indices"].numpy()
            bh, bw = vals.shape[1], vals.shape[2]
            for i in range(len(comp) - 1):
                for j in range(comp[i], comp[i + 1]):
                    r, c = (i, plain[j]) if self.layout == "sparse_bsr" else (plain[j], i)
                    out[r * bh : (r + 1) * bh, c * bw : (c + 1) * bw] = vals[j]
            return out
        raise UnsupportedError(f"to_dense of layout {self.layout}")

    def numpy(self) -> np.ndarray:
        return self.to_dense()

    def __repr__(self) -> str:
        return f"SparseTensor(layout={self.layout}, shape={list(self.shape)}, dtype={self.dtype.name})"


class NestedTensor:
    """A strided nested tensor: components that are views of one buffer."""

    def __init__(self, buffer: Tensor, sizes: Tensor, strides: Tensor, offsets: Tensor) -> None:
        self.buffer = buffer
        self.nested_sizes = sizes
        self.nested_strides = strides
        self.offsets = offsets
        self.requires_grad = False
        self.is_parameter = False
        self.attrs: dict[str, Any] = {}  # Python attributes torch pickled with it

    @property
    def dtype(self) -> DType:
        return self.buffer.dtype

    @property
    def nbytes(self) -> int:
        return self.buffer.nbytes

    @property
    def shape(self) -> tuple[int, ...]:
        return (int(self.nested_sizes.shape[0]) if self.nested_sizes.ndim else 0,)

    def unbind(self) -> list[Tensor]:
        """The components as tensors over the shared buffer storage."""
        offs = self.offsets.numpy()
        # (n, 0) for components of 0 dimensions: their rows are empty, not missing
        sizes = self.nested_sizes.numpy().reshape(len(offs), -1) if len(offs) else np.zeros((0, 0), np.int64)
        strides = self.nested_strides.numpy().reshape(len(offs), -1) if len(offs) else np.zeros((0, 0), np.int64)
        base = self.buffer.storage_offset()
        return [
            Tensor(self.buffer.storage, self.buffer.dtype, tuple(sizes[i]), tuple(strides[i]), base + int(offs[i]))
            for i in range(len(offs))
        ]

    def numpy(self) -> list[np.ndarray]:
        return [t.numpy() for t in self.unbind()]

    def __repr__(self) -> str:
        return f"NestedTensor(n={len(self.offsets.numpy())}, dtype={self.dtype.name})"


class JaggedTensor:
    """A jagged-layout nested tensor (torch's ``NestedTensor`` of ``layout=torch.jagged``):
    the items are slices of ``values`` along dimension ``ragged_idx - 1``, item ``i``
    starting at ``offsets[i]`` and running to ``offsets[i + 1]`` (or for ``lengths[i]``
    rows where ``lengths`` is set). ``min_seqlen`` / ``max_seqlen``: torch's cached
    sequence-length bounds (None where the file has none)."""

    #: the Python attributes torch's NestedTensor sets itself (its pickled state minus
    #: user attributes): ``_size`` / ``_strides`` and the size/stride capsules torch
    #: caches are dropped by its ``__reduce_ex__`` (``_clear_non_serializable_cached_data``)
    TORCH_OWN_STATE = frozenset(
        {"_ragged_idx", "_values", "_offsets", "_lengths", "_metadata_cache", "_dynamo_propagated_dynamic_indices"}
        | {"_size", "_strides", "_sym_sizes_capsule", "_sym_sizes_capsule_len", "_sym_strides_capsule"}
        | {"_sym_strides_capsule_len"}
    )

    def __init__(
        self,
        values: Tensor,
        offsets: Tensor,
        lengths: Tensor | None = None,
        ragged_idx: int = 1,
        *,
        min_seqlen: int | None = None,
        max_seqlen: int | None = None,
        requires_grad: bool = False,
    ) -> None:
        if not isinstance(values, Tensor) or not isinstance(offsets, Tensor):
            raise FormatError("a jagged nested tensor needs values and offsets tensors", found=type(values).__name__)
        if lengths is not None and not isinstance(lengths, Tensor):
            raise FormatError("a jagged nested tensor's lengths must be a tensor or None", found=type(lengths).__name__)
        if len(offsets.shape) != 1 or not offsets.shape[0]:
            raise FormatError("a jagged nested tensor's offsets must be 1-d and not empty", found=tuple(offsets.shape))
        if type(ragged_idx) is not int or not 1 <= ragged_idx <= len(values.shape):
            raise FormatError("a jagged nested tensor's ragged dimension", expected=f"1..{len(values.shape)}", found=ragged_idx)
        if lengths is not None and tuple(lengths.shape) != (offsets.shape[0] - 1,):
            raise FormatError("a jagged nested tensor's lengths", expected=(offsets.shape[0] - 1,), found=tuple(lengths.shape))
        self.values = values
        self.offsets = offsets
        self.lengths = lengths
        self.ragged_idx = ragged_idx
        self.min_seqlen = min_seqlen
        self.max_seqlen = max_seqlen
        self.requires_grad = requires_grad
        self.is_parameter = False
        self.attrs: dict[str, Any] = {}  # Python attributes torch pickled with it

    @property
    def dtype(self) -> DType:
        return self.values.dtype

    @property
    def nbytes(self) -> int:
        return self.values.nbytes

    @property
    def shape(self) -> tuple[int | None, ...]:
        """``(batch, ...)`` with None for the ragged dimension, as torch's ``j`` size."""
        r = self.ragged_idx - 1
        vs = tuple(self.values.shape)
        return (int(self.offsets.shape[0]) - 1, *vs[:r], None, *vs[r + 1 :])

    def unbind(self) -> list[Tensor]:
        """The items as views of ``values``, as torch's ``unbind()`` gives them."""
        r = self.ragged_idx - 1
        offs = [int(v) for v in self.offsets.numpy()]
        lens = [int(v) for v in self.lengths.numpy()] if self.lengths is not None else None
        vs, st = tuple(self.values.shape), tuple(self.values.stride())
        out = []
        for i in range(len(offs) - 1):
            start = offs[i]
            n = lens[i] if lens is not None else offs[i + 1] - start
            if start < 0 or n < 0 or start + n > vs[r]:
                raise FormatError(
                    f"jagged nested tensor item {i} lies outside its values",
                    expected=f"rows within 0..{vs[r]}",
                    found=f"{start}..{start + n}",
                )
            shape = (*vs[:r], n, *vs[r + 1 :])
            out.append(
                Tensor(
                    self.values.storage,
                    self.values.dtype,
                    shape,
                    st,
                    self.values.storage_offset() + start * st[r],
                    device=self.values.device,
                )
            )
        return out

    def numpy(self) -> list[np.ndarray]:
        return [t.numpy() for t in self.unbind()]

    def __repr__(self) -> str:
        return f"JaggedTensor(shape={self.shape}, dtype={self.dtype.name})"


def _torch_widened_halves(h: np.ndarray, negate: bool) -> np.ndarray:
    """float16 values as torch makes them float32: each NaN's quiet bit set (its payload
    otherwise kept), the sign flipped where ``negate`` (a conj/neg bit resolved)."""
    bits = np.ascontiguousarray(h).view(np.uint16)
    nan = (bits & 0x7C00 == 0x7C00) & (bits & 0x03FF != 0)
    if negate or nan.any():
        bits = bits | np.where(nan, np.uint16(0x0200), np.uint16(0))
        if negate:
            bits ^= np.uint16(0x8000)
    return bits.view(np.float16).astype(np.float32)


def tensor(array: Any, dtype: DType | str | None = None) -> Tensor:
    """Shorthand for :meth:`Tensor.from_numpy`."""
    return Tensor.from_numpy(array, dtype)


def is_torch_tensor(obj: Any) -> bool:
    """True for ``torch.Tensor`` instances (Parameters and subclasses included), checked
    by class name along the MRO so torch is never imported here."""
    return any(c.__name__ == "Tensor" and c.__module__ in ("torch", "torch._tensor") for c in type(obj).__mro__)


def as_tensor(obj: Any, *, share: dict[Any, Any] | None = None, name: str | None = None) -> Tensor:
    """The one coercion every writer uses: a torchless :class:`Tensor` for ``obj``.

    Accepts torchless tensors (returned as they are), NumPy arrays and scalars (any
    byte order and layout; bfloat16/float8 from ml_dtypes), and torch tensors of every
    dtype, Parameters included (zero-copy through :func:`torchless.interop.torch.from_torch`;
    torch is only touched when the object already is a torch tensor).

    Args:
        share: passed to ``from_torch`` so torch tensors sharing a storage share one
            torchless storage.
        name: the entry's name, for the error message.

    Raises:
        UsageError: ``obj`` is not a tensor or array, or its dtype has no torch dtype.
    """
    if isinstance(obj, Tensor):
        return obj
    if isinstance(obj, (np.ndarray, np.generic)):
        try:
            return Tensor.from_numpy(obj)
        except UnsupportedError as e:
            raise UsageError(f"a NumPy array of dtype {obj.dtype} has no torch dtype", member=name, found=str(obj.dtype)) from e
    if is_torch_tensor(obj):
        from ..interop.torch import from_torch

        return from_torch(obj, share=share)
    raise UsageError(
        "not a tensor", member=name, expected="a torchless Tensor, NumPy array or torch tensor", found=type(obj).__qualname__
    )


def unique_names(items: Iterable[tuple[str, Any]], path: Any = None) -> Iterator[tuple[str, Any]]:
    """``items`` as given, refusing a name seen before: every tensor writer takes its input
    through this, so two tensors of one name (or two object paths that flatten to one
    dotted name, ``{"a.b": x, "a": {"b": y}}``) are a UsageError, never one silently lost."""
    from .errors import UsageError

    seen: set[str] = set()
    for name, t in items:
        if name in seen:
            raise UsageError(
                f"two tensors are named {name!r}",
                path=path,
                expected="unique names",
                hint="rename one (dotted names of nested containers can collide with a key that contains a dot)",
            )
        seen.add(name)
        yield name, t


def require_utf8_name(name: str, path: Any = None, *, fmt: str) -> None:
    """Refuse a tensor name that is not valid Unicode (a lone surrogate): formats that
    store names as UTF-8 (safetensors' JSON header, npz's zip member names) cannot hold
    it, and their real readers fail on the file (the message shows the name escaped)."""
    from .errors import UsageError

    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise UsageError(
            f"tensor name {ascii(name)} holds a lone surrogate, which {fmt} cannot store (its names are UTF-8)",
            path=path,
            member=name,
            expected="a name that encodes as UTF-8",
            hint="rename the tensor",
        ) from None
