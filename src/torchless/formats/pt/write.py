"""Writing eager checkpoints in torch 2.13's zip layout (spec ``pt.md`` §1.13).

``save`` accepts what ``torchless.load`` returns and what ``torch.save`` takes: nested
containers of tensors (torchless, NumPy arrays and torch tensors, all through
:func:`~torchless.core.tensor.as_tensor`) and Python values. Tensors that share a storage
are written once and stay views of it; the same tensor object saved twice is one object
again after loading. Classic dtypes use ``_rebuild_tensor_v2`` with their legacy storage
class, the newer ones (uint16/32/64, float8, complex32...) ``_rebuild_tensor_v3`` with
``UntypedStorage``, as torch writes them.

The result loads with ``torch.load(weights_only=True)`` and ``mmap=True`` as long as the
object holds only what torch's weights-only loader accepts (tensors, Parameters, dicts,
OrderedDicts with ``_metadata``, ``Counter``, lists, tuples, sets, complex, bytearray,
torch dtypes/devices/sizes...). The other safe values torchless reads (``slice``,
``range``, ``frozenset``, ``deque``, ``defaultdict``, ``argparse.Namespace``, pure paths,
``datetime`` values, ``Decimal``, NumPy arrays of non-tensor dtypes, NumPy dtypes and
scalars of non-numeric kinds) are written the way Python pickles them, which
``torch.load(weights_only=False)`` reads. NumPy arrays whose dtype is a torch dtype are
written as tensors and NumPy numbers as Python numbers (the values torch's weights-only
loader can read).
"""

from __future__ import annotations

import collections
import datetime
import decimal
import pathlib
import struct
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from ...container.zip import TorchZipWriter, iter_chunks
from ...core.dtypes import DType, from_numpy
from ...core.errors import InternalError, UnsupportedError, UsageError
from ...core.gcpause import GCPause
from ...core.settings import SETTINGS
from ...core.tensor import (
    JaggedTensor,
    NestedTensor,
    SparseTensor,
    Storage,
    Tensor,
    _contiguous_strides,
    as_tensor,
    is_torch_tensor,
)
from ...core.values import Device, Layout, MemoryFormat, Namespace, QScheme, Size, StateDict, TorchVersion
from ...io.source import PathLike
from ...pickle.torch_globals import NJT_MODULE
from ...pickle.writer import Global, Persistent, Pickler2, Reduce, TensorCall
from . import spec

__all__ = ["save_checkpoint", "CheckpointPickler"]

_UTILS = "torch._utils"
_UINT8_NAME = "uint8"
_BUILTIN_FACTORIES = {
    list: "list",
    dict: "dict",
    set: "set",
    int: "int",
    float: "float",
    str: "str",
    tuple: "tuple",
    bool: "bool",
}


def _numpy_reduce(obj: Any) -> Reduce:
    """A NumPy array, dtype or scalar as NumPy's own ``__reduce__`` describes it (the
    protocol-2 form ``torch.save`` writes by default: arrays come back in native byte
    order, as NumPy unpickles them)."""
    func, args, *rest = obj.__reduce__()
    return Reduce(Global(func.__module__, func.__name__), tuple(args), state=rest[0] if rest else None)


def _is_tensor_array(obj: Any) -> bool:
    try:
        from_numpy(obj.dtype)
    except UnsupportedError:
        return False
    return True


class CheckpointPickler:
    """Turns an object tree into ``data.pkl`` plus the list of storages to write."""

    def __init__(self) -> None:
        self.storage_keys: dict[int, str] = {}
        self.storages: list[tuple[str, Storage]] = []
        self._dtype_of: dict[int, str] = {}
        self._alive: list[Any] = []
        self._torch_share: dict[int, Any] = {}  # torch storage key -> (Storage, torch storage)
        self._converted: dict[int, Tensor] = {}  # id(torch tensor or array) -> its Tensor

    def _storage_pid(self, st: Storage, dtype: DType, v3: bool) -> Persistent:
        return Persistent(self._storage_ref(st, dtype, v3))

    def _storage_ref(self, st: Storage, dtype: DType, v3: bool) -> tuple:
        """The persistent id of ``st`` (registering it for writing on first use)."""
        sid = id(st)
        key = self.storage_keys.get(sid)
        # torch.save's rule: a storage is saved with one dtype (the tensor's for typed
        # storages, uint8 for UntypedStorage); another tensor viewing it with a different
        # one is refused. Empty storages are exempt (data pointer 0 in torch).
        as_dtype = _UINT8_NAME if v3 else dtype.name
        if key is None:
            key = str(len(self.storage_keys))
            self.storage_keys[sid] = key
            self.storages.append((key, st))
            self._dtype_of[sid] = as_dtype
            self._alive.append(st)
        elif st.nbytes and self._dtype_of[sid] != as_dtype:
            raise UsageError(
                "cannot save multiple tensors that view the same data as different types",
                expected=self._dtype_of[sid],
                found=as_dtype,
                hint="save a copy of one of them (torch.save refuses this object too)",
            )
        location = st.location if st.location and st.location != "meta" else "cpu"
        legacy = dtype.legacy_storage
        if v3 or legacy is None:  # v3: the dtype has no typed storage class
            return ("storage", Global("torch.storage", "UntypedStorage"), key, location, st.nbytes)
        return ("storage", Global("torch", legacy), key, location, st.nbytes // dtype.itemsize)

    def _plain_tensor(self, t: Tensor, requires_grad: bool | None = None) -> tuple[Global, tuple]:
        """The rebuild function and arguments of ``t`` without Parameter or attributes
        (``requires_grad``: the flag written instead of ``t``'s)."""
        rg = t.requires_grad if requires_grad is None else requires_grad
        if t.storage is None:
            return Global(_UTILS, "_rebuild_meta_tensor_no_storage"), (
                Global("torch", t.dtype.name),
                tuple(t.shape),
                tuple(t.stride()),
                rg,
            )
        if t.quantizer is not None:
            q = t.quantizer
            # torch writes per_channel_affine for float qparams too (its loader picks the
            # quantizer from the zero points' dtype)
            scheme = Global("torch", _QSCHEME_WRITTEN.get(q["qscheme"], q["qscheme"]))
            if "scale" in q:
                qp: tuple = (scheme, float(q["scale"]), int(q["zero_point"]))
            else:
                qp = (scheme, q["scales"], q["zero_points"], int(q["axis"]))
            pid = self._storage_pid(t.storage, t.dtype, False)
            return Global(_UTILS, "_rebuild_qtensor"), (
                pid,
                t.storage_offset(),
                tuple(t.shape),
                tuple(t.stride()),
                qp,
                rg,
                _empty_od(),
            )
        v3 = t.dtype.legacy_storage is None
        pid = self._storage_pid(t.storage, t.dtype, v3)
        md = {k: v for k, v in t.metadata.items() if v}
        args: tuple = (pid, t.storage_offset(), tuple(t.shape), tuple(t.stride()), rg, _empty_od())
        if v3:
            args = args + (Global("torch", t.dtype.name),)
        if md:
            args = args + (md,)
        return Global(_UTILS, "_rebuild_tensor_v3" if v3 else "_rebuild_tensor_v2"), args

    def _tensor(self, t: Tensor) -> Reduce | TensorCall:
        key = ("t", id(t))
        st = t.storage
        if (
            st is not None
            and not t.is_parameter
            and not t.attrs
            and t.quantizer is None
            and type(t.requires_grad) is bool
            and type(st.location) is str
            and st.location != "meta"
            and t.dtype.legacy_storage is not None
            and not any(t.metadata.values())
        ):
            # the common plain tensor: written straight from its parts (the same bytes)
            size, stride, offset = tuple(t.shape), tuple(t.stride()), t.storage_offset()
            if type(offset) is int and _ints_only(size) and _ints_only(stride):
                return TensorCall(
                    _V2, self._storage_ref(st, t.dtype, False), offset, size, stride, t.requires_grad, _EMPTY_OD, key
                )
        if t.storage is not None and t.storage.location == "meta":
            t = Tensor(None, t.dtype, t.shape, t.stride(), 0, requires_grad=t.requires_grad, is_parameter=t.is_parameter)
        attrs = dict(t.attrs)
        # torch: Parameter.__reduce_ex__ pickles its data (``self.data``: detached, so
        # requires_grad False) as a plain tensor, a new object each time, inside
        # _rebuild_parameter[_with_state], which gives the Parameter its flag
        func, args = self._plain_tensor(t, False if t.is_parameter else None)
        if t.is_parameter:
            data = Reduce(func, args)
            if attrs:
                return Reduce(
                    Global(_UTILS, "_rebuild_parameter_with_state"), (data, t.requires_grad, _empty_od(), attrs), memo_key=key
                )
            return Reduce(Global(_UTILS, "_rebuild_parameter"), (data, t.requires_grad, _empty_od()), memo_key=key)
        if attrs:
            return Reduce(
                Global("torch._tensor", "_rebuild_from_type_v2"), (func, Global("torch", "Tensor"), args, attrs), memo_key=key
            )
        return Reduce(func, args, memo_key=key)

    def _coerce(self, obj: Any) -> Any:
        """torch tensors and tensor-dtype NumPy arrays -> one torchless Tensor per object
        (sparse and nested torch tensors -> their torchless counterparts)."""
        done = self._converted.get(id(obj))
        if done is not None:
            return done
        if is_torch_tensor(obj) and (
            obj.layout is not None and str(obj.layout) != "torch.strided" or getattr(obj, "is_nested", False)
        ):
            from ...interop.torch import from_torch_value

            t = from_torch_value(obj, share=self._torch_share)
        else:
            t = as_tensor(obj, share=self._torch_share)
        self._converted[id(obj)] = t
        self._alive.append(obj)
        return t

    def translate(self, obj: Any) -> Any:  # noqa: C901 - one case per value type
        if type(obj) is Tensor:  # the common case first
            self._alive.append(obj)
            return self._tensor(obj)
        if isinstance(obj, np.ndarray):
            if not _is_tensor_array(obj):
                return _numpy_reduce(obj)
            obj = self._coerce(obj)
        elif is_torch_tensor(obj):
            obj = self._coerce(obj)
        elif type(obj).__module__ == "torch" and type(obj).__name__ in ("dtype", "Size", "device"):
            from ...interop.torch import from_torch_value

            obj = from_torch_value(obj)
        if isinstance(obj, Tensor):
            self._alive.append(obj)
            return self._tensor(obj)
        if isinstance(obj, SparseTensor):
            self._alive.append(obj)
            layout = Reduce(Global("torch.serialization", "_get_layout"), (f"torch.{obj.layout}",))
            size = Reduce(Global("torch", "Size"), (tuple(obj.shape),))
            if obj.layout == "sparse_coo":
                data: tuple = (obj.tensors["indices"], obj.tensors["values"], size, obj.is_coalesced)
            else:
                data = (obj.tensors["compressed_indices"], obj.tensors["plain_indices"], obj.tensors["values"], size)
            return _wrapped(Global(_UTILS, "_rebuild_sparse_tensor"), (layout, data), obj, ("s", id(obj)))
        if isinstance(obj, NestedTensor):
            self._alive.append(obj)
            parts = (obj.buffer, obj.nested_sizes, obj.nested_strides, obj.offsets)
            return _wrapped(Global(_UTILS, "_rebuild_nested_tensor"), parts, obj, ("n", id(obj)))
        if isinstance(obj, JaggedTensor):
            self._alive.append(obj)
            return _jagged(obj)
        if isinstance(obj, collections.Counter):
            self._alive.append(obj)
            return Reduce(Global("collections", "Counter"), (dict(obj),), memo_key=("c", id(obj)))
        if isinstance(obj, collections.defaultdict):
            self._alive.append(obj)
            f = obj.default_factory
            if f is not None and f not in _BUILTIN_FACTORIES:
                raise UsageError("a defaultdict whose factory is not a builtin container cannot be saved", found=repr(f)[:60])
            args = (Global("builtins", _BUILTIN_FACTORIES[f]),) if f is not None else ()
            return Reduce(Global("collections", "defaultdict"), args, memo_key=("dd", id(obj)), dictitems=list(obj.items()))
        if isinstance(obj, (StateDict, collections.OrderedDict)):
            self._alive.append(obj)
            # attributes (a state dict's _metadata) go in BUILD, as OrderedDict.__reduce__ has them
            state = (obj.attributes if isinstance(obj, StateDict) else dict(vars(obj))) or None
            return Reduce(
                Global("collections", "OrderedDict"), (), state=state, memo_key=("od", id(obj)), dictitems=list(obj.items())
            )
        if isinstance(obj, collections.deque):
            return Reduce(Global("collections", "deque"), (list(obj), obj.maxlen))
        if isinstance(obj, Size):
            return Reduce(Global("torch", "Size"), (tuple(obj),))
        if isinstance(obj, Device):
            return Reduce(Global("torch", "device"), (str(obj),))
        if isinstance(obj, Layout):
            return Reduce(Global("torch.serialization", "_get_layout"), (f"torch.{obj}",))
        if isinstance(obj, (QScheme, MemoryFormat)):
            return Global("torch", str(obj))
        if isinstance(obj, TorchVersion):
            return Reduce(Global("torch.torch_version", "TorchVersion"), (str(obj),))
        if isinstance(obj, set):
            return Reduce(Global("builtins", "set"), (list(obj),))
        if isinstance(obj, frozenset):
            return Reduce(Global("builtins", "frozenset"), (list(obj),))
        if isinstance(obj, slice):
            return Reduce(Global("builtins", "slice"), (obj.start, obj.stop, obj.step))
        if isinstance(obj, range):
            return Reduce(Global("builtins", "range"), (obj.start, obj.stop, obj.step))
        if isinstance(obj, complex):
            return Reduce(Global("builtins", "complex"), (obj.real, obj.imag))
        if isinstance(obj, bytearray):  # as Python pickles it at protocol 2: bytearray() when empty
            return Reduce(Global("builtins", "bytearray"), (bytes(obj),) if obj else ())
        if isinstance(obj, Namespace):
            return Reduce(Global("copyreg", "__newobj__"), (Global("argparse", "Namespace"),), state=dict(vars(obj)))
        if isinstance(obj, pathlib.PurePath):
            kind = type(obj)
            name = (
                kind.__name__
                if kind.__module__ == "pathlib"
                else ("PureWindowsPath" if isinstance(obj, pathlib.PureWindowsPath) else "PurePosixPath")
            )
            return Reduce(Global("pathlib", name), tuple(obj.parts))
        if isinstance(obj, (datetime.datetime, datetime.date, datetime.time, datetime.timedelta)):
            if getattr(obj, "tzinfo", None) is not None:
                raise UsageError("datetime values with a time zone cannot be saved", found=repr(obj)[:60])
            red = obj.__reduce__()
            if isinstance(red, str):  # a name: only singletons reduce so, never these types
                raise InternalError(f"{type(obj).__name__}.__reduce__ returned a name")
            cls, args = red[:2]
            return Reduce(Global("datetime", cls.__name__), tuple(args))
        if isinstance(obj, decimal.Decimal):
            return Reduce(Global("decimal", "Decimal"), (str(obj),))
        if isinstance(obj, np.dtype):
            return _numpy_reduce(obj)
        if isinstance(obj, np.generic):
            if obj.dtype.kind in "biufc":
                return obj.item()
            return _numpy_reduce(obj)
        if isinstance(obj, type) and obj.__module__.split(".")[0] == "numpy":
            return Global(obj.__module__, obj.__name__)
        if isinstance(obj, DType):
            return Global("torch", obj.name)
        if isinstance(obj, str):  # other str subclasses: their text
            return str(obj)
        return obj


def _wrapped(func: Global, args: tuple, obj: Any, memo_key: Any) -> Reduce:
    """A sparse or nested tensor's rebuild call as torch wraps it: in
    ``_rebuild_parameter[_with_state]`` for a Parameter (with its flag), in
    ``_rebuild_from_type_v2`` when it has Python attributes."""
    attrs = dict(getattr(obj, "attrs", None) or {})
    if obj.is_parameter:
        data = Reduce(func, args)
        if attrs:
            return Reduce(
                Global(_UTILS, "_rebuild_parameter_with_state"), (data, obj.requires_grad, _empty_od(), attrs), memo_key=memo_key
            )
        return Reduce(Global(_UTILS, "_rebuild_parameter"), (data, obj.requires_grad, _empty_od()), memo_key=memo_key)
    if attrs:
        return Reduce(
            Global("torch._tensor", "_rebuild_from_type_v2"), (func, Global("torch", "Tensor"), args, attrs), memo_key=memo_key
        )
    return Reduce(func, args, memo_key=memo_key)


def _seqlen_tensor(n: int) -> Tensor:
    """torch caches a sequence length ``n`` as ``zeros(n, 0)`` (no bytes)."""
    return Tensor.from_numpy(np.zeros((n, 0), np.float32))


def _jagged(obj: JaggedTensor) -> Reduce:
    """A jagged nested tensor as torch's ``NestedTensor.__reduce_ex__`` writes it:
    ``_rebuild_from_type_v2(_rebuild_njt, NestedTensor, (constructor kwargs,), state)``
    (the state holds the user attributes: its constructor sets the rest on load)."""
    if obj.is_parameter:
        raise UsageError("a Parameter over a jagged nested tensor cannot be saved (torch cannot make one)")
    cache = {}
    if obj.min_seqlen is not None:
        cache["min_seqlen"] = _seqlen_tensor(int(obj.min_seqlen))
    if obj.max_seqlen is not None:
        cache["max_seqlen"] = _seqlen_tensor(int(obj.max_seqlen))
    kwargs = {
        "values": obj.values,
        "offsets": obj.offsets,
        "lengths": obj.lengths,
        "_ragged_idx": int(obj.ragged_idx),
        "_metadata_cache": cache,
        "requires_grad": bool(obj.requires_grad),
    }
    return Reduce(
        Global("torch._tensor", "_rebuild_from_type_v2"),
        (Global(NJT_MODULE, "_rebuild_njt"), Global(NJT_MODULE, "NestedTensor"), (kwargs,), dict(obj.attrs)),
        memo_key=("j", id(obj)),
    )


_EMPTY_OD = Reduce(Global("collections", "OrderedDict"), ())
_QSCHEME_WRITTEN = {"per_channel_affine_float_qparams": "per_channel_affine"}
_V2 = Global(_UTILS, "_rebuild_tensor_v2")
_SMALL = 1 << 16  # storages below this go through TorchZipWriter.write_small
_INT = {int}


def _ints_only(t: tuple) -> bool:
    return not t or set(map(type, t)) == _INT


def _empty_od() -> Reduce:
    # one shared description: without a memo_key it is pickled afresh at every use,
    # as torch writes a new empty OrderedDict for every tensor's backward hooks
    return _EMPTY_OD


_pack_I = struct.Struct("<I").pack
_pack_H = struct.Struct("<H").pack
_BINPUT = [b"q" + bytes((i,)) for i in range(256)]
_BINGET = [b"h" + bytes((i,)) for i in range(256)]
_BININT1 = [b"K" + bytes((i,)) for i in range(256)]
_pack_i = struct.Struct("<i").pack
#: LONG_BINPUT: ``pack(0x72, index)``
_PUT_LONG = struct.Struct("<BI")
#: TUPLE, BINPUT, BINPERSID for memo indices below 256; the same with LONG_BINPUT:
#: ``pack(0x74, 0x72, index, 0x51)``
_T_PUT_Q = [b"t" + _BINPUT[i] + b"Q" for i in range(256)]
_T_PUT_Q_LONG = struct.Struct("<BBIB")
#: LONG_BINPUT, TUPLE, LONG_BINPUT, REDUCE, LONG_BINPUT (a tensor entry's last opcodes)
_PUT_T_PUT_R_PUT = struct.Struct("<BIBBIBBI")


def _fast_pickle(obj: Any, cp: CheckpointPickler) -> bytes | None:  # noqa: C901 - one emitter by design
    """``data.pkl`` of a dict of str -> plain torchless tensors: the same bytes
    :class:`~torchless.pickle.writer.Pickler2` writes for it through
    :meth:`CheckpointPickler.translate` (same opcodes, same memo numbering, including its
    identity-based memo of strings and tuples), with ``cp`` left as the general path
    leaves it. None (``cp`` untouched) for anything else: other containers or values,
    parameters, attributes, conj/neg bits, quantized, meta or v3-dtype tensors, a tensor
    or storage seen twice."""
    if type(obj) is not dict:
        return None
    items = list(obj.items())
    tensor_ids = set()
    storage_ids = set()
    for k, t in items:
        if type(k) is not str or type(t) is not Tensor:
            return None
        st = t.storage
        if (
            st is None
            or st.location == "meta"
            or t.quantizer is not None
            or t.is_parameter
            or t.attrs
            or t.dtype.legacy_storage is None
            or any(t.metadata.values())
            or id(t) in tensor_ids
            or id(st) in storage_ids
            or id(st) in cp.storage_keys
            or type(t.requires_grad) is not bool
            or (type(st.location) is not str and st.location is not None)
        ):
            return None
        tensor_ids.add(id(t))
        storage_ids.add(id(st))
    rows = [
        (k, t.dtype.legacy_storage, t.storage.location, t.storage.nbytes // t.dtype.itemsize, t.storage_offset(),
         tuple(t.shape), tuple(t.stride()), t.requires_grad, t.storage, t.dtype.name)
        for k, t in items
    ]  # fmt: skip
    data = _emit_rows(obj, rows, cp)
    if data is not None:
        cp._alive.extend(t for _k, t in items)
    return data


def _int_bytes(v: int) -> bytes:
    """The opcode Pickler2 writes for the int ``v``."""
    if 0 <= v < 256:
        return _BININT1[v]
    if 0 <= v < 65536:
        return b"M" + _pack_H(v)
    if -(2**31) <= v < 2**31:
        return b"J" + _pack_i(v)
    raw = v.to_bytes((v.bit_length() + 8) // 8, "little", signed=True)
    while len(raw) > 1 and ((raw[-1] == 0 and raw[-2] < 0x80) or (raw[-1] == 0xFF and raw[-2] >= 0x80)):
        raw = raw[:-1]
    return b"\x8a" + bytes((len(raw),)) + raw if len(raw) < 256 else b"\x8b" + _pack_i(len(raw)) + raw


#: the literal the emitter memoizes (one object, so its memo entry is found by identity)
_STORAGE = "storage"


def _emit_rows(  # noqa: C901 - one emitter by design
    obj: dict[str, Any], rows: list[tuple[Any, ...]], cp: CheckpointPickler, *, fresh_tuples: bool = False
) -> bytes | None:
    """The bytes of :func:`_fast_pickle` for ``obj`` from its rows, one per entry in order:
    ``(key, legacy storage class, location, numel, storage offset, size, stride,
    requires_grad, storage, dtype name)``, each value the very object the tensor gives
    (the memo is by identity). The caller has checked what :func:`_fast_pickle` checks.

    ``fresh_tuples``: every size and stride is written as a tuple of its own, as two
    tensors' tuples never are one object (rows that share tuple objects then give the
    bytes of rows with copies); and ``cp`` gets only its list of storages (what
    :func:`_write_archive` reads), not the ledger by identity that the general pickler
    keeps.

    One loop with the pickler's steps written out (no call per opcode): the memo index
    of each object, the opcodes and their order are those of :class:`Pickler2`."""
    out = bytearray(b"\x80\x02}q\x00")  # the outer dict is memo entry 0
    count = 1
    memo_id: dict[int, int] = {id(obj): 0}  # str/tuple objects by identity, as Pickler2 keeps them
    memo_get = memo_id.get
    keep: list[Any] = [obj]  # objects whose ids are in memo_id stay alive, as in Pickler2
    keep_add = keep.append
    glob_of: dict[str, bytes] = {}  # legacy storage class -> the BINGET that fetches it
    binput, binget, binint1 = _BINPUT, _BINGET, _BININT1
    int_bytes, pack_i32, put_long, pack_h = _int_bytes, _pack_I, _PUT_LONG.pack, _pack_H
    pack_x = put_long  # (an opcode and a 4-byte length: BINUNICODE's head, ``pack_x(0x58, n)``)
    last_loc: Any = None  # the location of the row before and the opcode that fetches it
    last_fetch = b""
    t_put_q, put_t_put_r_put = _T_PUT_Q_LONG.pack, _PUT_T_PUT_R_PUT.pack
    storages: list[tuple[str, Storage, str]] = []
    add_storage = storages.append
    n_keys = len(cp.storage_keys)
    fetch_rebuild = b""  # BINGET of _rebuild_tensor_v2, once memoized
    fetch_storage = b""  # BINGET of 'storage'
    tail = b""  # the fetch of OrderedDict and its empty call
    rebuild_head = b""  # fetch_rebuild, the two MARKs, fetch_storage
    for b0 in range(0, len(rows), 1000):
        chunk = rows[b0 : b0 + 1000]
        if len(chunk) > 1:
            out += b"("
        for k, legacy, location, numel, offset, shape, stride, rg, st, dtype_name in chunk:
            # the key
            idx = memo_get(id(k))
            if idx is not None:
                out += binget[idx] if idx < 256 else b"j" + pack_i32(idx)
            else:
                raw = k.encode("utf-8", "surrogatepass")
                out += pack_x(0x58, len(raw))
                out += raw
                memo_id[id(k)] = count
                keep_add(k)
                out += binput[count] if count < 256 else put_long(0x72, count)
                count += 1
            # _rebuild_tensor_v2, the argument tuple, the persistent id tuple, 'storage'
            if not fetch_rebuild:
                out += b"ctorch._utils\n_rebuild_tensor_v2\n"
                fetch_rebuild = binget[count] if count < 256 else b"j" + pack_i32(count)
                out += binput[count] if count < 256 else put_long(0x72, count)
                count += 1
                out += b"(("
                idx = memo_get(id(_STORAGE))
                if idx is None:
                    out += b"X\x07\x00\x00\x00storage"
                    memo_id[id(_STORAGE)] = count
                    keep_add(_STORAGE)
                    idx = count
                    out += binput[count] if count < 256 else put_long(0x72, count)
                    count += 1
                else:
                    out += binget[idx] if idx < 256 else b"j" + pack_i32(idx)
                fetch_storage = binget[idx] if idx < 256 else b"j" + pack_i32(idx)
                rebuild_head = fetch_rebuild + b"((" + fetch_storage  # the next rows' start
            else:
                out += rebuild_head
            # the storage class
            g = glob_of.get(legacy)
            if g is not None:
                out += g
            else:
                out += b"ctorch\n" + legacy.encode() + b"\n"
                glob_of[legacy] = binget[count] if count < 256 else b"j" + pack_i32(count)
                out += binput[count] if count < 256 else put_long(0x72, count)
                count += 1
            # the storage key (a one-character str is CPython's shared object: a key of the
            # dict may be that very object, so the memo is asked as for any str)
            skey = str(n_keys + len(storages))
            add_storage((skey, st, dtype_name))
            idx = memo_get(id(skey))
            if idx is not None:
                out += binget[idx] if idx < 256 else b"j" + pack_i32(idx)
            else:
                out += pack_x(0x58, len(skey))
                out += skey.encode()
                memo_id[id(skey)] = count
                keep_add(skey)
                out += binput[count] if count < 256 else put_long(0x72, count)
                count += 1
            # the location (its fetch kept while the rows name the one object: a memo
            # entry's index never changes)
            loc = location if location and location != "meta" else "cpu"
            if loc is last_loc:
                out += last_fetch
            else:
                idx = memo_get(id(loc))
                if idx is not None:
                    out += binget[idx] if idx < 256 else b"j" + pack_i32(idx)
                else:
                    raw = loc.encode("utf-8", "surrogatepass")
                    out += pack_x(0x58, len(raw))
                    out += raw
                    memo_id[id(loc)] = idx = count
                    keep_add(loc)
                    out += binput[count] if count < 256 else put_long(0x72, count)
                    count += 1
                last_loc, last_fetch = loc, binget[idx] if idx < 256 else b"j" + pack_i32(idx)
            out += binint1[numel] if 0 <= numel < 256 else b"M" + pack_h(numel) if 0 <= numel < 65536 else int_bytes(numel)
            # the persistent id tuple (a new object, no memo hit possible), BINPERSID
            out += _T_PUT_Q[count] if count < 256 else t_put_q(0x74, 0x72, count, 0x51)
            count += 1
            out += binint1[offset] if 0 <= offset < 256 else int_bytes(offset)
            for tup in (shape, stride):
                if not tup:
                    out += b")"
                    continue
                if not fresh_tuples:
                    idx = memo_get(id(tup))
                    if idx is not None:
                        out += binget[idx] if idx < 256 else b"j" + pack_i32(idx)
                        continue
                    memo_id[id(tup)] = count
                    keep_add(tup)
                n = len(tup)
                if n > 3:
                    out += b"("
                for v in tup:
                    if type(v) is not int:
                        return None
                    out += binint1[v] if 0 <= v < 256 else b"M" + pack_h(v) if 0 <= v < 65536 else int_bytes(v)
                out += b"\x85" if n == 1 else b"\x86" if n == 2 else b"\x87" if n == 3 else b"t"
                out += binput[count] if count < 256 else put_long(0x72, count)
                count += 1
            out += b"\x88" if rg else b"\x89"
            if not tail:
                out += b"ccollections\nOrderedDict\n"
                tail = (binget[count] if count < 256 else b"j" + pack_i32(count)) + b")R"
                out += binput[count] if count < 256 else put_long(0x72, count)
                count += 1
                out += b")R"
            else:
                out += tail
            # the OrderedDict, the argument tuple, the tensor
            if count >= 256:
                out += put_t_put_r_put(0x72, count, 0x74, 0x72, count + 1, 0x52, 0x72, count + 2)
            else:
                out += binput[count]
                out += b"t"
                out += binput[count + 1] if count + 1 < 256 else put_long(0x72, count + 1)
                out += b"R"
                out += binput[count + 2] if count + 2 < 256 else put_long(0x72, count + 2)
            count += 3
        out += b"u" if len(chunk) > 1 else b"s"
    out += b"."
    if fresh_tuples:
        cp.storages += [(key, st) for key, st, _dt in storages]
        return bytes(out)
    # what CheckpointPickler._storage_pid and translate record, in the same order
    for key, st, dtype_name in storages:
        cp.storage_keys[id(st)] = key
        cp.storages.append((key, st))
        cp._dtype_of[id(st)] = dtype_name
        cp._alive.append(st)
    cp._alive.extend(keep)
    return bytes(out)


def _write_blocks(
    zw: TorchZipWriter,
    storages: list[tuple[str, Any]],
    blocks: Callable[[list[Any]], Any],
    progress: Any,
) -> None:
    """Write the storages a batch at a time: the small ones ``blocks`` gives bytes for
    together (the same records as one :meth:`TorchZipWriter.write_small` each), the
    others one at a time as :func:`_write_archive` does. ``blocks`` returns a view per
    storage, or a pair ``(views, crcs)`` with the CRC-32 of each view (None where it has
    none; the writer computes those)."""
    for b0 in range(0, len(storages), _BLOCK_BATCH):
        batch = storages[b0 : b0 + _BLOCK_BATCH]
        got = blocks([st for _, st in batch])
        views, crcs = got if type(got) is tuple else (got, None)
        if len(views) != len(batch) or (crcs is not None and len(crcs) != len(batch)):
            raise ValueError("blocks gave a view per storage")
        names: list[str] = []
        run: list[memoryview] = []
        run_crcs: list[int] | None = [] if crcs is not None else None
        for j, ((key, st), v) in enumerate(zip(batch, views, strict=True)):
            if v is not None and len(v) == st.nbytes and len(v) < _SMALL and not st.needs_swap:
                names.append(f"{spec.DATA_DIR}/{key}")
                run.append(v)
                if run_crcs is not None:
                    c = crcs[j]
                    if c is None:
                        run_crcs = None  # the writer computes the run's
                    else:
                        run_crcs.append(c)
                continue
            if run:
                zw.write_small_many(names, run, run_crcs)
                names, run = [], []
                run_crcs = [] if crcs is not None else None
            _write_storage(zw, key, st, None)
        if run:
            zw.write_small_many(names, run, run_crcs)
        if progress is not None:
            for _, st in batch:
                progress(st.nbytes)
        del views, run


def _write_storage(zw: TorchZipWriter, key: str, st: Any, storage_crc: int | None) -> int:
    mv = memoryview(st.native_bytes())  # written in host order, as the byteorder record says
    if storage_crc is not None:
        zw.write_chunks(f"{spec.DATA_DIR}/{key}", iter_chunks(mv), len(mv), crc=storage_crc)
    elif mv.nbytes < _SMALL:
        zw.write_small(f"{spec.DATA_DIR}/{key}", mv)
    else:
        zw.write_chunks(f"{spec.DATA_DIR}/{key}", iter_chunks(mv), len(mv))
    return len(mv)  # an assembled (non-mmap) buffer is released on return


#: storages written together by _write_blocks
_BLOCK_BATCH = 512


def save_checkpoint(
    obj: Any,
    target: PathLike | Any,
    *,
    alignment: int = 64,
    compute_crc: bool = True,
    prefix: str | None = None,
    progress: Callable[[int], None] | None = None,
    storage_crc: int | None = None,
) -> None:
    """Write ``obj`` as a torch zip checkpoint.

    Args:
        obj: nested containers of tensors (torchless, NumPy, torch) and scalars.
        target: a path (written atomically) or a binary file object.
        alignment: record data alignment (torch's default 64).
        compute_crc: write CRC-32s (torch's default) or zeros.
        prefix: archive folder name; defaults to the file stem like torch.
        progress: called with the number of payload bytes written after each storage.
        storage_crc: the CRC-32 of the one storage's bytes, when known (a tensor written
            in byte ranges by several tasks: the record's bytes are then not read for it).

    Raises:
        UsageError: an object torch's weights_only loader could not read back, or two
            tensors viewing one storage with different element sizes.
    """
    # the objects made per tensor (rows, memo entries, records) all live until the end:
    # generational GC passes over them (and over the caller's tensors) free nothing
    with GCPause():
        if SETTINGS.pt_pickle and alignment == 64 and compute_crc and prefix is None and storage_crc is None:
            rows = _array_rows(obj)  # a dict of plain NumPy arrays: no Tensor made for each
            if rows is not None and save_plain_tensors(obj, rows, target, progress=progress, blocks=_small_views):
                return
        cp = CheckpointPickler()
        data = _fast_pickle(obj, cp) if SETTINGS.pt_pickle else None
        if data is None:
            data = Pickler2(cp.translate).dumps(obj)
        _write_archive(
            data,
            cp,
            target,
            alignment=alignment,
            compute_crc=compute_crc,
            prefix=prefix,
            progress=progress,
            storage_crc=storage_crc,
            blocks=_small_views if SETTINGS.pt_pickle else None,
        )


def _array_rows(obj: Any) -> list[tuple[str, Storage, tuple[int, ...], bool]] | None:
    """:func:`save_plain_tensors`' rows for a dict of str -> plain NumPy arrays
    (C-contiguous, host order, a dtype with a typed storage class): each array's bytes as
    they are, in a storage of its own, as :func:`~torchless.core.tensor.as_tensor` gives
    them to the general pickler. None for anything else."""
    if type(obj) is not dict or not obj or set(map(type, obj.values())) != {np.ndarray}:
        return None
    dtypes: dict[Any, DType | None] = {}
    rows = []
    new = Storage.__new__
    for key, a in obj.items():
        npd = a.dtype
        dt = dtypes.get(npd, _UNSEEN)
        if dt is _UNSEEN:
            dt = dtypes[npd] = _plain_dtype(npd)
        if dt is None or type(key) is not str:
            return None
        try:  # the array's bytes as they are: a cast needs a C-contiguous buffer
            mv = memoryview(a).cast("B")
        except (TypeError, ValueError):  # not C-contiguous, or a dtype with no buffer format (ml_dtypes)
            if not a.flags.c_contiguous:
                return None
            mv = a.reshape(-1).view(np.uint8).data
        st = new(Storage)  # (Storage("", a.nbytes, dt, "cpu", data=..., byteorder=host) without the call)
        st.key = ""
        st.nbytes = a.nbytes
        st.dtype = dt
        st.location = "cpu"
        st._data = mv
        st._loader = None
        st.byteorder = sys.byteorder
        st.origin = ""
        st.file_offset = None
        rows.append((key, st, a.shape, False))
    return rows


_UNSEEN: Any = object()


def _plain_dtype(npd: np.dtype) -> DType | None:
    """The dtype of a plain array of NumPy dtype ``npd`` (host order, a typed storage
    class), or None."""
    try:
        dt = from_numpy(npd)
    except UnsupportedError:
        return None
    return dt if npd.isnative and dt.itemsize == npd.itemsize and dt.legacy_storage is not None else None


def _small_views(storages: list[Any]) -> list[memoryview | None]:
    """The bytes of each small storage written in host order as it is (what
    :func:`_write_storage` writes), None for the others: the ``blocks`` of
    :func:`_write_blocks` for storages already in memory or mapped."""
    return [None if st.nbytes >= _SMALL or st.needs_swap else memoryview(st.native_bytes()).cast("B") for st in storages]


def save_plain_tensors(
    obj: dict[str, Any],
    rows: list[tuple[Any, ...]],
    target: PathLike | Any,
    *,
    progress: Callable[[int], None] | None = None,
    blocks: Callable[[list[Any]], Any] | None = None,
) -> bool:
    """:func:`save_checkpoint` of a dict of plain tensors given as rows instead of
    :class:`~torchless.core.tensor.Tensor` objects (DCP consolidation: no tensor objects
    to build and walk): one row per entry of ``obj``, in order, ``(key, storage)`` with
    ``storage`` a :class:`~torchless.core.tensor.Storage` of the tensor's dtype holding
    exactly the tensor (offset 0, contiguous), and the tensor's ``size`` (a tuple) and
    ``requires_grad``: ``(key, storage, size, requires_grad)``.
    The bytes are those :func:`save_checkpoint` writes for the same tensors. False (nothing
    written) when the rows are not all such tensors of a dtype with a typed storage.
    ``blocks``: given some of the rows' storages, their bytes (what ``native_bytes()``
    gives) in one call, None for one it does not give (then read as any storage); or
    the pair ``(views, crcs)`` with their CRC-32s as well (see :func:`_write_blocks`)."""
    if not SETTINGS.pt_pickle:
        return False
    full = []
    seen: set[int] = set()
    for key, st, size, rg in rows:
        dt = st.dtype
        legacy = dt.legacy_storage
        if (
            type(key) is not str
            or legacy is None
            or type(rg) is not bool
            or type(st.location) is not str
            or st.location == "meta"
            or id(st) in seen
        ):
            return False
        seen.add(id(st))
        full.append((key, legacy, st.location, st.nbytes // dt.itemsize, 0, size, _contiguous_strides(size), rg, st, dt.name))
    return _save_rows(obj, full, target, progress=progress, blocks=blocks)


def _save_rows(
    obj: dict[str, Any],
    full: list[tuple[Any, ...]],
    target: PathLike | Any,
    *,
    progress: Callable[[int], None] | None = None,
    blocks: Callable[[list[Any]], Any] | None = None,
) -> bool:
    """:func:`save_plain_tensors` from the emitter's rows (see :func:`_emit_rows`), which
    the caller has checked as it checks its rows: a str key, a typed storage class, a str
    location other than ``meta``, a bool ``requires_grad``, each storage once, holding
    exactly its tensor, a size and a stride tuple (written as tuples of their own, as a
    tensor's are: rows may share them)."""
    if not SETTINGS.pt_pickle:
        return False
    cp = CheckpointPickler()
    data = _emit_rows(obj, full, cp, fresh_tuples=True)
    if data is None:
        return False
    _write_archive(data, cp, target, progress=progress, blocks=blocks)
    return True


def _write_archive(
    data: bytes,
    cp: CheckpointPickler,
    target: PathLike | Any,
    *,
    alignment: int = 64,
    compute_crc: bool = True,
    prefix: str | None = None,
    progress: Callable[[int], None] | None = None,
    storage_crc: int | None = None,
    blocks: Callable[[list[Any]], Any] | None = None,
) -> None:
    with TorchZipWriter(target, prefix, alignment=alignment, compute_crc=compute_crc) as zw:
        zw.write(spec.DATA_PKL, data)
        zw.write(spec.FORMAT_VERSION, b"1")
        zw.write(spec.STORAGE_ALIGNMENT, str(alignment).encode())
        zw.write(spec.BYTEORDER, sys.byteorder.encode())
        if blocks is not None and storage_crc is None:
            _write_blocks(zw, cp.storages, blocks, progress)
        else:
            for key, st in cp.storages:
                n = _write_storage(zw, key, st, storage_crc)
                if progress is not None:
                    progress(n)
        zw.write(spec.VERSION, b"3\n")
        zw.write(spec.SERIALIZATION_ID, zw.serialization_id())
