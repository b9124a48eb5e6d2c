"""Writing eager checkpoints in torch 2.13's zip layout (spec ``pt.md`` §1.13).

``save`` accepts nested dicts/lists/tuples of torchless tensors, NumPy arrays, torch
tensors (when torch is installed; converted zero-copy) and Python scalars. Tensors that
share a storage are written once and stay views of it; classic dtypes use
``_rebuild_tensor_v2`` with their legacy storage class, the newer ones (uint16/32/64,
float8, complex32...) ``_rebuild_tensor_v3`` with ``UntypedStorage``. The result loads
with ``torch.load(weights_only=True)`` and ``mmap=True``.
"""

from __future__ import annotations

import collections
import sys
from typing import Any, Callable

import numpy as np

from ...container.zip import TorchZipWriter, iter_chunks
from ...core.errors import UsageError
from ...core.source import PathLike
from ...core.tensor import SparseTensor, Storage, Tensor
from ...core.values import Device, Layout, QScheme, Size, StateDict
from ...pickle.writer import Global, Persistent, Pickler2, Reduce

__all__ = ["save_checkpoint", "CheckpointPickler"]

_UTILS = "torch._utils"


def _to_tensor(obj: Any, share: dict | None = None) -> Any:
    """torch tensors and NumPy arrays become torchless tensors; others pass through.

    ``share`` maps torch storages to torchless ones so views keep sharing one storage."""
    if type(obj) is Tensor:
        return obj
    if isinstance(obj, np.ndarray):
        return Tensor.from_numpy(obj)
    if isinstance(obj, np.generic):
        return obj.item()
    mod = type(obj).__module__
    if mod.startswith("torch") and hasattr(obj, "untyped_storage"):
        from ...interop.torch import from_torch

        return from_torch(obj, share=share)
    return obj


class CheckpointPickler:
    """Turns an object tree into ``data.pkl`` plus the list of storages to write."""

    def __init__(self) -> None:
        self.storage_keys: dict[int, str] = {}
        self.storages: list[tuple[str, Storage]] = []
        self._dtype_of: dict[int, Any] = {}
        self._alive: list[Any] = []
        self._torch_share: dict[int, Storage] = {}

    def _storage_pid(self, st: Storage, dtype: Any, v3: bool) -> Persistent:
        sid = id(st)
        key = self.storage_keys.get(sid)
        if key is None:
            key = str(len(self.storage_keys))
            self.storage_keys[sid] = key
            self.storages.append((key, st))
            self._dtype_of[sid] = dtype
            self._alive.append(st)
        elif self._dtype_of[sid].itemsize != dtype.itemsize:
            raise UsageError("cannot save multiple tensors that view the same data as different types")
        location = st.location if st.location and st.location != "meta" else "cpu"
        if v3:
            return Persistent(("storage", Global("torch.storage", "UntypedStorage"), key, location, st.nbytes))
        return Persistent(("storage", Global("torch", dtype.legacy_storage), key, location, st.nbytes // dtype.itemsize))

    def _tensor(self, t: Tensor) -> Reduce:
        if t.storage is None:
            r = Reduce(Global(_UTILS, "_rebuild_meta_tensor_no_storage"), (Global("torch", t.dtype.name), tuple(t.shape), tuple(t.stride()), t.requires_grad), memo_key=("t", id(t)))
        elif t.quantizer is not None:
            q = t.quantizer
            if "scale" in q:
                qp: tuple = (Global("torch", q["qscheme"]), float(q["scale"]), int(q["zero_point"]))
            else:
                qp = (Global("torch", "per_channel_affine"), q["scales"], q["zero_points"], int(q["axis"]))
            pid = self._storage_pid(t.storage, t.dtype, False)
            r = Reduce(Global(_UTILS, "_rebuild_qtensor"), (pid, t.storage_offset(), tuple(t.shape), tuple(t.stride()), qp, t.requires_grad, _empty_od()), memo_key=("t", id(t)))
        else:
            v3 = t.dtype.legacy_storage is None
            pid = self._storage_pid(t.storage, t.dtype, v3)
            md = {k: v for k, v in t.metadata.items() if v}
            args: tuple = (pid, t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.requires_grad, _empty_od())
            if v3:
                args = args + (Global("torch", t.dtype.name),)
            if md:
                args = args + (md,)
            r = Reduce(Global(_UTILS, "_rebuild_tensor_v3" if v3 else "_rebuild_tensor_v2"), args, memo_key=("t", id(t)))
        if t.is_parameter:
            inner = r
            inner.memo_key = None
            return Reduce(Global(_UTILS, "_rebuild_parameter"), (inner, t.requires_grad, _empty_od()), memo_key=("p", id(t)))
        return r

    def translate(self, obj: Any) -> Any:
        obj = _to_tensor(obj, self._torch_share)
        if type(obj) is Tensor or isinstance(obj, Tensor):
            self._alive.append(obj)
            if obj.storage is not None and obj.storage.location == "meta":
                obj = Tensor(None, obj.dtype, obj.shape, obj.stride(), 0, requires_grad=obj.requires_grad)
            return self._tensor(obj)
        if isinstance(obj, SparseTensor):
            self._alive.append(obj)
            layout = Reduce(Global("torch.serialization", "_get_layout"), (f"torch.{obj.layout}",))
            size = Reduce(Global("torch", "Size"), (tuple(obj.shape),))
            if obj.layout == "sparse_coo":
                data: tuple = (obj.tensors["indices"], obj.tensors["values"], size, obj.is_coalesced)
            else:
                data = (obj.tensors["compressed_indices"], obj.tensors["plain_indices"], obj.tensors["values"], size)
            return Reduce(Global(_UTILS, "_rebuild_sparse_tensor"), (layout, data), memo_key=("s", id(obj)))
        if isinstance(obj, (StateDict, collections.OrderedDict)):
            self._alive.append(obj)
            state = obj.attributes if isinstance(obj, StateDict) and obj.attributes else None
            return Reduce(Global("collections", "OrderedDict"), (), state=state, memo_key=("od", id(obj)), dictitems=list(obj.items()))
        if isinstance(obj, Size):
            return Reduce(Global("torch", "Size"), (tuple(obj),))
        if isinstance(obj, Device):
            return Reduce(Global("torch", "device"), (str(obj),))
        if isinstance(obj, Layout):
            return Reduce(Global("torch.serialization", "_get_layout"), (f"torch.{obj}",))
        if isinstance(obj, QScheme):
            return Global("torch", str(obj))
        if isinstance(obj, (set, frozenset)):
            if isinstance(obj, frozenset):
                raise UsageError("frozenset is not loadable by torch.load(weights_only=True)")
            return Reduce(Global("builtins", "set"), (list(obj),))
        if isinstance(obj, complex):
            return Reduce(Global("builtins", "complex"), (obj.real, obj.imag))
        if isinstance(obj, bytearray):
            return Reduce(Global("builtins", "bytearray"), (bytes(obj),))
        if hasattr(obj, "itemsize") and hasattr(obj, "legacy_storage"):  # a DType
            return Global("torch", obj.name)
        return obj


_EMPTY_OD = Reduce(Global("collections", "OrderedDict"), ())


def _empty_od() -> Reduce:
    # one shared description: without a memo_key it is pickled afresh at every use,
    # as torch writes a new empty OrderedDict for every tensor's backward hooks
    return _EMPTY_OD


def save_checkpoint(
    obj: Any,
    target: PathLike | Any,
    *,
    alignment: int = 64,
    compute_crc: bool = True,
    prefix: str | None = None,
    progress: Callable[[int], None] | None = None,
) -> None:
    """Write ``obj`` as a torch zip checkpoint.

    Args:
        obj: nested containers of tensors (torchless, NumPy, torch) and scalars.
        target: a path (written atomically) or a binary file object.
        alignment: record data alignment (torch's default 64).
        compute_crc: write CRC-32s (torch's default) or zeros.
        prefix: archive folder name; defaults to the file stem like torch.
        progress: called with the number of payload bytes written after each storage.

    Raises:
        UsageError: an object torch's weights_only loader could not read back, or two
            tensors viewing one storage with different element sizes.
    """
    cp = CheckpointPickler()
    data = Pickler2(cp.translate).dumps(obj)
    with TorchZipWriter(target, prefix, alignment=alignment, compute_crc=compute_crc) as zw:
        zw.write("data.pkl", data)
        zw.write(".format_version", b"1")
        zw.write(".storage_alignment", str(alignment).encode())
        zw.write("byteorder", sys.byteorder.encode())
        for key, st in cp.storages:
            mv = st.bytes()
            if st.byteorder != sys.byteorder and st.dtype.itemsize > 1:
                arr = np.frombuffer(mv, dtype=st.dtype.storage.newbyteorder(">" if st.byteorder == "big" else "<"))
                mv = memoryview(arr.astype(st.dtype.storage.newbyteorder("=")).view(np.uint8))
            zw.write_chunks(f"data/{key}", iter_chunks(mv), len(mv))
            if progress is not None:
                progress(len(mv))
            del mv  # release an assembled (non-mmap) buffer before the next one is built
        zw.write("version", b"3\n")
        zw.write(".data/serialization_id", zw.serialization_id())
