"""The default allowlist: every global real checkpoints need, rebuilt by torchless.

Each entry states why it is harmless. None of them imports anything or calls a function
named by the file: the rebuilders below construct torchless objects (tensors over lazy
storages, tuples, strings, NumPy arrays from bytes) from the pickle's own arguments.

Two tables are exported:

* :data:`TORCH_ALLOWLIST` - what ``torch.load(weights_only=True)`` allows in torch 2.13
  (spec ``weights_only.md`` §2.1), so a scanner can tell what torch would refuse.
* :data:`DEFAULT_ALLOWLIST` - that plus the safe data types torchless rebuilds itself
  (NumPy arrays and scalars, ``argparse.Namespace``, ``slice``, ``pathlib`` paths,
  ``datetime``, Python-2 builtins ...). This is what ``torchless.load`` uses.
"""

from __future__ import annotations

import collections
import copy
import datetime
from typing import TYPE_CHECKING, Any

import numpy as np

from ..core.dtypes import DTYPES, STORAGE_NAMES
from ..core.errors import FormatError, InternalError, LimitError, UnsupportedError, short_repr
from ..core.tensor import JaggedTensor, NestedTensor, SparseTensor, Storage, Tensor
from ..core.values import (
    Device,
    Layout,
    MemoryFormat,
    Namespace,
    QScheme,
    Size,
    StateDict,
    StorageType,
    TensorType,
    TorchVersion,
)
from .globals import Allowlist, GlobalRef, PickledObject, Rebuilder, register_builder

if TYPE_CHECKING:
    import decimal

__all__ = ["DEFAULT_ALLOWLIST", "TORCH_ALLOWLIST", "PARAMETER", "TENSOR_CLASS", "rebuilder"]


def rebuilder(name: str, call: Any = None, *, new: Any = None) -> Rebuilder:
    return Rebuilder(name, call if call is not None else (lambda args: _no_call(name)), new)


def _no_call(name: str) -> Any:
    raise FormatError(f"{name} cannot be called")


def _storage_arg(st: Any, fn: str) -> Storage:
    if type(st) is not Storage and not isinstance(st, Storage):
        raise FormatError(f"{fn}: first argument must be a storage", found=type(st).__name__)
    return st


def _ints(x: Any, what: str) -> tuple[int, ...]:
    if type(x) is not tuple and not isinstance(x, (tuple, list)):
        raise FormatError(f"{what} must be a tuple of ints", found=short_repr(x, 80))
    out: tuple[Any, ...] = x if type(x) is tuple else tuple(x)
    for i in out:
        if type(i) is not int:
            raise FormatError(f"{what} must be a tuple of ints", found=short_repr(out, 80))
    return out


def _meta(md: Any) -> dict[str, Any]:
    if md is None:
        return {}
    if not isinstance(md, dict):
        raise FormatError("tensor metadata must be a dict", found=type(md).__name__)
    return dict(md)


# -- tensors ---------------------------------------------------------------------------
def _rebuild_tensor(args: tuple[Any, ...]) -> Tensor:
    storage, offset, size, stride = args[:4]
    st = _storage_arg(storage, "_rebuild_tensor")
    return Tensor(st, st.dtype, _ints(size, "size"), _ints(stride, "stride"), int(offset))


def _rebuild_tensor_v2(args: tuple[Any, ...]) -> Tensor:
    if len(args) not in (6, 7):
        raise FormatError("_rebuild_tensor_v2 takes 6 or 7 arguments", found=len(args))
    storage, offset, size, stride, requires_grad = args[:5]
    st = _storage_arg(storage, "_rebuild_tensor_v2")
    md = _meta(args[6]) if len(args) == 7 else None
    if type(offset) is not int:
        raise FormatError("storage offset must be an int", found=short_repr(offset, 40))
    return Tensor._make(st, st.dtype, _ints(size, "size"), _ints(stride, "stride"), offset, bool(requires_grad), md)


def _rebuild_tensor_v3(args: tuple[Any, ...]) -> Tensor:
    if len(args) not in (7, 8):
        raise FormatError("_rebuild_tensor_v3 takes 7 or 8 arguments", found=len(args))
    storage, offset, size, stride, requires_grad, _hooks, dtype = args[:7]
    st = _storage_arg(storage, "_rebuild_tensor_v3")
    if not hasattr(dtype, "itemsize") or not hasattr(dtype, "kind"):
        raise FormatError("_rebuild_tensor_v3: dtype argument is not a dtype", found=short_repr(dtype, 60))
    md = _meta(args[7] if len(args) == 8 else None)
    return Tensor(
        st, dtype, _ints(size, "size"), _ints(stride, "stride"), int(offset), requires_grad=bool(requires_grad), metadata=md
    )


def _rebuild_qtensor(args: tuple[Any, ...]) -> Tensor:
    storage, offset, size, stride, qparams, requires_grad = args[:6]
    st = _storage_arg(storage, "_rebuild_qtensor")
    if not isinstance(qparams, tuple) or not qparams or not isinstance(qparams[0], QScheme):
        raise FormatError("_rebuild_qtensor: bad quantizer params", found=short_repr(qparams, 80))
    scheme = str(qparams[0])
    if scheme in ("per_tensor_affine", "per_tensor_symmetric"):
        q = {"qscheme": scheme, "scale": float(qparams[1]), "zero_point": int(qparams[2])}
    elif scheme in ("per_channel_affine", "per_channel_symmetric", "per_channel_affine_float_qparams"):
        zero_points = qparams[2]
        if scheme != "per_channel_symmetric" and isinstance(zero_points, Tensor):
            # torch writes per_channel_affine for both affine schemes; the quantizer it
            # rebuilds is chosen by the zero points' dtype (floating: float qparams)
            floating = zero_points.dtype.is_floating_point
            scheme = "per_channel_affine_float_qparams" if floating else "per_channel_affine"
        q = {"qscheme": scheme, "scales": qparams[1], "zero_points": zero_points, "axis": int(qparams[3])}
    else:
        raise UnsupportedError(f"quantization scheme {scheme}")
    return Tensor(
        st, st.dtype, _ints(size, "size"), _ints(stride, "stride"), int(offset), requires_grad=bool(requires_grad), quantizer=q
    )


def _rebuild_sparse_tensor(args: tuple[Any, ...]) -> SparseTensor:
    layout, data = args
    layout = str(layout)
    if layout == "sparse_coo":
        if len(data) == 3:
            indices, values, size = data
            coalesced = None
        else:
            indices, values, size, coalesced = data
        return SparseTensor(layout, _ints(size, "size"), {"indices": indices, "values": values}, coalesced)
    if layout in ("sparse_csr", "sparse_csc", "sparse_bsr", "sparse_bsc"):
        comp, plain, values, size = data
        return SparseTensor(layout, _ints(size, "size"), {"compressed_indices": comp, "plain_indices": plain, "values": values})
    raise UnsupportedError(f"sparse layout {layout}")


def _rebuild_meta_tensor_no_storage(args: tuple[Any, ...]) -> Tensor:
    dtype, size, stride, requires_grad = args[:4]
    return Tensor(None, dtype, _ints(size, "size"), _ints(stride, "stride"), 0, requires_grad=bool(requires_grad), device="meta")


def _rebuild_wrapper_subclass(args: tuple[Any, ...]) -> Tensor:
    cls, dtype, size, stride, offset, _layout, device, requires_grad = args[:8]
    t = Tensor(
        None,
        dtype,
        _ints(size, "size"),
        _ints(stride, "stride"),
        int(offset),
        requires_grad=bool(requires_grad),
        device=str(device),
    )
    t.subclass = cls.qualname if isinstance(cls, GlobalRef) else repr(cls)
    return t


def _rebuild_device_tensor_from_cpu_tensor(args: tuple[Any, ...]) -> Tensor:
    data, _dtype, device, requires_grad = args[:4]
    if not isinstance(data, Tensor):
        raise FormatError("_rebuild_device_tensor_from_cpu_tensor needs a tensor")
    data.device = str(device)
    data.requires_grad = bool(requires_grad)
    return data


def _rebuild_device_tensor_from_numpy(args: tuple[Any, ...]) -> Tensor:
    data, dtype, device, requires_grad = args[:4]
    if not isinstance(data, np.ndarray):
        raise FormatError("_rebuild_device_tensor_from_numpy needs a NumPy array")
    t = Tensor.from_numpy(data, dtype if dtype is not None and getattr(dtype, "itemsize", None) == data.dtype.itemsize else None)
    t.device = str(device)
    t.requires_grad = bool(requires_grad)
    return t


def _rebuild_nested_tensor(args: tuple[Any, ...]) -> NestedTensor:
    return NestedTensor(*args[:4])


#: the keys of torch's ``_rebuild_njt`` argument (NestedTensor.__reduce_ex__)
_NJT_KEYS = frozenset({"values", "offsets", "lengths", "_ragged_idx", "_metadata_cache", "requires_grad"})


def _seqlen(v: Any, name: str) -> int | None:
    """torch stores a cached sequence length ``n`` as the shape of ``zeros(n, 0)``."""
    if v is None:
        return None
    if not isinstance(v, Tensor) or len(v.shape) != 2 or v.shape[1] != 0:
        raise FormatError(f"jagged nested tensor {name}: expected an (n, 0) tensor", found=short_repr(v, 60))
    return int(v.shape[0])


def _rebuild_njt(args: tuple[Any, ...]) -> JaggedTensor:
    (kw,) = args
    # torch's constructor takes other keyword arguments and ignores them: so does this
    if not isinstance(kw, dict) or not {"values", "offsets"} <= set(kw):
        raise FormatError("_rebuild_njt arguments", expected=sorted(_NJT_KEYS), found=short_repr(kw, 80))
    cache = kw.get("_metadata_cache") or {}
    if not isinstance(cache, dict) or not set(cache) <= {"min_seqlen", "max_seqlen"}:
        raise FormatError("jagged nested tensor metadata cache", found=short_repr(cache, 80))
    values = kw["values"]
    if isinstance(values, Tensor) and values.attrs:  # the constructor's own dynamo marks
        values = copy.copy(values)
        values.attrs = {k: v for k, v in values.attrs.items() if k != "_dynamo_propagated_dynamic_indices"}
    return JaggedTensor(
        values,
        kw["offsets"],
        kw.get("lengths"),
        kw.get("_ragged_idx", 1),
        min_seqlen=_seqlen(cache.get("min_seqlen"), "min_seqlen"),
        max_seqlen=_seqlen(cache.get("max_seqlen"), "max_seqlen"),
        requires_grad=bool(kw.get("requires_grad", False)),
    )


class DimRange:
    """torch._dynamo's ``_DimRange`` (a dimension marked dynamic, its bounds): inert data
    in the cached lengths of a jagged nested tensor."""

    def __init__(self) -> None:
        self.state: Any = None

    def __torchless_build__(self, state: Any) -> None:
        self.state = state


def _as_parameter(data: Any, requires_grad: Any) -> Any:
    """A new Parameter object over ``data``'s storage, as ``Parameter(data)`` makes one:
    ``data`` itself (which may be another entry of the checkpoint) is left as it is."""
    p: Tensor | SparseTensor | NestedTensor
    if isinstance(data, Tensor):
        p = Tensor(
            data.storage,
            data.dtype,
            data.shape,
            data.stride(),
            data.storage_offset(),
            device=data.device,
            metadata=data.metadata,
            quantizer=data.quantizer,
        )
        p.subclass = data.subclass
    elif isinstance(data, (SparseTensor, NestedTensor)):
        p = copy.copy(data)
    else:
        return data
    p.is_parameter = True
    p.requires_grad = bool(requires_grad)
    return p


def _rebuild_parameter(args: tuple[Any, ...]) -> Any:
    return _as_parameter(args[0], args[1])


def _apply_state(obj: Any, state: Any) -> None:
    if state is None:
        return
    parts = state if isinstance(state, tuple) else (state,)
    for part in parts:
        if isinstance(part, dict):
            target = getattr(obj, "attrs", None)
            if isinstance(target, dict):
                target.update({str(k): v for k, v in part.items()})


def _rebuild_parameter_with_state(args: tuple[Any, ...]) -> Any:
    data = _rebuild_parameter(args[:2])
    _apply_state(data, args[3] if len(args) > 3 else None)
    return data


def _parameter_new(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    data = args[0] if args else kwargs.get("data")
    requires_grad = args[1] if len(args) > 1 else kwargs.get("requires_grad", True)
    if data is None:
        return Tensor(None, DTYPES["float32"], (0,), device="meta")
    return _rebuild_parameter((data, requires_grad))


PARAMETER = Rebuilder("torch.nn.parameter.Parameter", lambda a: _parameter_new(a, {}), _parameter_new)
TENSOR_CLASS = Rebuilder("torch.Tensor", lambda a: _no_call("torch.Tensor"))
#: the module of torch's jagged nested tensor (its class and ``_rebuild_njt``), read and written
NJT_MODULE = "torch.nested._internal.nested_tensor"
NJT_CLASS = Rebuilder(f"{NJT_MODULE}.NestedTensor", lambda a: _no_call(f"{NJT_MODULE}.NestedTensor"))


def _rebuild_from_type_v2(args: tuple[Any, ...]) -> Any:
    func, new_type, fargs, state = args
    if not isinstance(func, Rebuilder):
        raise FormatError("_rebuild_from_type_v2: rebuild function is not an allowed global", found=short_repr(func))
    obj = func.call(tuple(fargs))
    if isinstance(obj, JaggedTensor):  # the constructor sets these itself on load
        state = {k: v for k, v in state.items() if k not in JaggedTensor.TORCH_OWN_STATE} if isinstance(state, dict) else state
    if new_type is PARAMETER:
        obj = _as_parameter(obj, getattr(obj, "requires_grad", True))
    elif new_type is not TENSOR_CLASS and new_type is not NJT_CLASS and hasattr(obj, "subclass"):
        obj.subclass = new_type.qualname if isinstance(new_type, GlobalRef) else getattr(new_type, "name", repr(new_type))
    _apply_state(obj, state)
    return obj


def _size(args: tuple[Any, ...]) -> Size:
    (dims,) = args
    return Size(_ints(dims, "torch.Size"))


def _device(args: tuple[Any, ...]) -> Device:
    if len(args) == 1 and isinstance(args[0], str):
        return Device(args[0])
    if len(args) == 2 and isinstance(args[0], str) and (args[1] is None or type(args[1]) is int):
        return Device.make(args[0], args[1])
    raise FormatError("torch.device arguments", found=short_repr(args, 80))


def _get_layout(args: tuple[Any, ...]) -> Layout:
    (name,) = args
    name = str(name)
    return Layout(name[6:] if name.startswith("torch.") else name)


# -- Python builtins -------------------------------------------------------------------
_TEXT_CODECS = {"latin1", "latin-1", "iso-8859-1", "iso8859-1", "l1", "utf-8", "utf8", "ascii", "us-ascii"}


def _codecs_encode(args: tuple[Any, ...]) -> bytes:
    text = args[0]
    enc = args[1] if len(args) > 1 else "utf-8"
    if not isinstance(text, str) or not isinstance(enc, str) or enc.lower() not in _TEXT_CODECS:
        # bytes->bytes codecs (zlib, base64, bz2...) could decompress without bound
        raise FormatError("_codecs.encode with an encoding other than a text codec", found=short_repr(enc, 40))
    return text.encode(enc)


_MAX_KEY_DEPTH = 100
_MAX_KEY_NODES = 1_000_000
_MATERIALIZED = (list, tuple, set, frozenset, dict, str, bytes, bytearray)


def _check_keys(keys: Any) -> None:
    """Refuse set items / dict keys whose hashing would recurse deeply in C (a deep
    tuple crashes the interpreter) or take exponential time (shared sub-tuples)."""
    budget = _MAX_KEY_NODES
    todo = [(k, 1) for k in keys if type(k) is tuple or type(k) is frozenset]
    while todo:
        obj, depth = todo.pop()
        if depth > _MAX_KEY_DEPTH:
            raise LimitError("set item or dict key nested too deeply", expected=f"<= {_MAX_KEY_DEPTH} levels")
        budget -= len(obj) + 1
        if budget < 0:
            raise LimitError("set item or dict key too large to hash", expected=f"<= {_MAX_KEY_NODES} nodes")
        for c in obj:
            if type(c) is tuple or type(c) is frozenset:
                todo.append((c, depth + 1))


def _materialized(x: Any, what: str) -> Any:
    # a range (or any lazy iterable) would expand to unbounded memory: only containers
    # the pickle itself spelled out are accepted
    if not isinstance(x, _MATERIALIZED):
        raise FormatError(f"{what} argument must be a container from the pickle", found=type(x).__name__)
    return x


def _pair_keys(items: Any) -> list[Any]:
    return [it[0] for it in items if type(it) in (tuple, list) and len(it) == 2]


def _ordered_dict(args: tuple[Any, ...]) -> StateDict:
    d = StateDict()
    if args:
        items = args[0].items() if isinstance(args[0], dict) else _materialized(args[0], "OrderedDict")
        if not isinstance(args[0], dict):
            _check_keys(_pair_keys(items))
        for k, v in items:
            d[k] = v
    return d


def _counter(args: tuple[Any, ...]) -> collections.Counter[Any]:
    c: collections.Counter[Any] = collections.Counter()
    if args and isinstance(args[0], dict):
        dict.update(c, args[0])
    return c


_SAFE_FACTORIES: dict[str, Any] = {
    "builtins.list": list,
    "builtins.dict": dict,
    "builtins.int": int,
    "builtins.float": float,
    "builtins.str": str,
    "builtins.set": set,
    "builtins.tuple": tuple,
    "builtins.bool": bool,
    "collections.OrderedDict": collections.OrderedDict,
}


def _defaultdict(args: tuple[Any, ...]) -> collections.defaultdict[Any, Any]:
    factory = args[0] if args else None
    real = _SAFE_FACTORIES.get(factory.name) if isinstance(factory, Rebuilder) else None
    dd: collections.defaultdict[Any, Any] = collections.defaultdict(real)
    if len(args) > 1 and isinstance(args[1], dict):
        dict.update(dd, args[1])
    return dd


def _deque(args: tuple[Any, ...]) -> collections.deque[Any]:
    items = args[0] if args else ()
    maxlen = args[1] if len(args) > 1 else None
    return collections.deque(list(_materialized(items, "deque")), maxlen)


def _set(args: tuple[Any, ...]) -> set[Any]:
    if not args:
        return set()
    _check_keys(_materialized(args[0], "set"))
    return set(args[0])


def _frozenset(args: tuple[Any, ...]) -> frozenset[Any]:
    if not args:
        return frozenset()
    _check_keys(_materialized(args[0], "frozenset"))
    return frozenset(args[0])


def _complex(args: tuple[Any, ...]) -> complex:
    if not all(isinstance(a, (int, float)) for a in args):
        raise FormatError("complex() needs numbers")
    return complex(*args)


def _bytearray(args: tuple[Any, ...]) -> bytearray:
    if not args:
        return bytearray()
    if isinstance(args[0], str):
        return bytearray(_codecs_encode((args[0], args[1] if len(args) > 1 else "utf-8")))
    if isinstance(args[0], (bytes, bytearray, list)):
        return bytearray(args[0])
    raise FormatError("bytearray() argument", found=type(args[0]).__name__)


def _bytes(args: tuple[Any, ...]) -> bytes:
    if not args:
        return b""
    if isinstance(args[0], str):
        return _codecs_encode((args[0], args[1] if len(args) > 1 else "utf-8"))
    if isinstance(args[0], (bytes, bytearray, list)):
        return bytes(args[0])
    raise FormatError("bytes() argument", found=type(args[0]).__name__)


def _plain(kind: type) -> Any:
    def make(args: tuple[Any, ...]) -> Any:
        if not args:
            return kind()
        a = args[0]
        if kind in (int, float, bool, str) and not isinstance(a, (int, float, str, bytes, bool)):
            raise FormatError(f"{kind.__name__}() argument", found=type(a).__name__)
        if kind is int and isinstance(a, str) and len(args) == 2:
            return int(a, int(args[1]))
        if kind in (list, tuple, dict):
            _materialized(a, kind.__name__)
            if kind is dict and not isinstance(a, dict):
                _check_keys(_pair_keys(a))
        return kind(a)

    return make


def _decimal(args: tuple[Any, ...]) -> decimal.Decimal:
    import decimal

    if not args or not isinstance(args[0], (str, int, float)):
        raise FormatError("decimal.Decimal needs its text", found=short_repr(args, 40))
    try:
        return decimal.Decimal(str(args[0]))
    except (decimal.InvalidOperation, ArithmeticError):
        raise FormatError("decimal.Decimal of text that is no number", found=short_repr(args[0], 40)) from None


def _slice(args: tuple[Any, ...]) -> slice:
    return slice(*args)


def _range(args: tuple[Any, ...]) -> range:
    if not all(type(a) is int for a in args):
        raise FormatError("range() needs ints")
    return range(*args)


def _namespace_new(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Namespace:
    return Namespace(**{str(k): v for k, v in kwargs.items()})


def _reconstructor(args: tuple[Any, ...]) -> Any:
    cls, _base, state = (args + (None, None, None))[:3]
    if isinstance(cls, Rebuilder):
        return cls.new((), {}) if state is None else cls.new((state,), {})
    if isinstance(cls, GlobalRef):
        obj = PickledObject(cls, (), via="copyreg._reconstructor")
        return obj
    raise FormatError("copyreg._reconstructor: class is not a global", found=short_repr(cls, 60))


def _newobj(args: tuple[Any, ...]) -> Any:
    cls, rest = args[0], tuple(args[1:])
    if isinstance(cls, Rebuilder):
        return cls.new(rest, {})
    if isinstance(cls, GlobalRef):
        return PickledObject(cls, rest, via="copyreg.__newobj__")
    raise FormatError("copyreg.__newobj__: class is not a global")


def _newobj_ex(args: tuple[Any, ...]) -> Any:
    cls, a, kw = args
    if isinstance(cls, Rebuilder):
        return cls.new(tuple(a), dict(kw))
    if isinstance(cls, GlobalRef):
        return PickledObject(cls, tuple(a), dict(kw), via="copyreg.__newobj_ex__")
    raise FormatError("copyreg.__newobj_ex__: class is not a global")


def _pure_path(kind: str) -> Any:
    # pathlib is imported for the first path a pickle holds, not for every command
    def make(args: tuple[Any, ...]) -> Any:
        if not all(isinstance(a, str) for a in args):
            raise FormatError("path parts must be strings")
        import pathlib

        return getattr(pathlib, kind)(*args)

    return make


def _datetime_kind(kind: type) -> Any:
    def make(args: tuple[Any, ...]) -> Any:
        for a in args:
            if not isinstance(a, (int, float, bytes, str, datetime.tzinfo, type(None))):
                raise FormatError(f"{kind.__name__} argument", found=type(a).__name__)
        return kind(*args)

    return make


# -- NumPy (rebuilt from bytes, numpy's own unpickling is never used) ------------------
def _np_reconstruct(args: tuple[Any, ...]) -> np.ndarray:
    # ``numpy.core.multiarray._reconstruct(ndarray, (0,), b'b')``: an empty array that
    # BUILD fills in place (so the memo and every earlier reference see the result)
    return np.empty((0,), np.uint8)


def _ndarray_build(arr: np.ndarray, state: Any) -> None:
    """BUILD on a reconstructed array: the state is checked here, then NumPy's own
    ``ndarray.__setstate__`` applies it, so layout rules match NumPy's unpickling exactly
    (Fortran-ordered object lists are in C order, non-native byte order becomes native)."""
    if not isinstance(state, tuple) or len(state) not in (4, 5):
        raise FormatError("ndarray state must be a 4- or 5-tuple", found=short_repr(state, 80))
    shape, dtype, fortran, raw = state[-4:]
    shape = _ints(tuple(shape) if isinstance(shape, (tuple, list)) else shape, "ndarray shape")
    if not isinstance(dtype, np.dtype):
        raise FormatError("ndarray dtype is not a dtype", found=short_repr(dtype, 60))
    if any(s < 0 for s in shape):
        raise FormatError("ndarray shape has a negative size", found=short_repr(shape, 60))
    count = 1
    for s in shape:
        count *= s
    if dtype.hasobject:
        if not isinstance(raw, list) or len(raw) != count:
            raise FormatError(
                "object array data must be a list of its elements",
                expected=count,
                found=len(raw) if isinstance(raw, list) else type(raw).__name__,
            )
    else:
        if isinstance(raw, str):
            raw = raw.encode("latin1")
        if not isinstance(raw, (bytes, bytearray, memoryview)):
            raise FormatError("ndarray data must be bytes", found=type(raw).__name__)
        if len(raw) != count * dtype.itemsize:
            raise FormatError("ndarray data size does not match its shape", expected=count * dtype.itemsize, found=len(raw))
        raw = bytes(raw)
    # numpy's stub asks for numpy.bool; its C code parses an int and refuses numpy.bool
    arr.__setstate__((1, shape, dtype, bool(fortran), raw))  # type: ignore[arg-type]


_DATETIME_UNITS = {"Y", "M", "W", "D", "h", "m", "s", "ms", "us", "μs", "ns", "ps", "fs", "as", "generic"}
_NPY_ALIGNED_STRUCT = 0x80


def _np_dtype(args: tuple[Any, ...]) -> np.dtype[Any]:
    spec = args[0] if args else None
    if not isinstance(spec, str):
        raise FormatError("numpy.dtype needs a type string", found=short_repr(spec, 40))
    return np.dtype(spec)


def _np_dtype_build(dt: np.dtype, state: Any) -> np.dtype[Any]:
    """BUILD on a dtype: ``(version, byteorder, subarray, names, fields, elsize,
    alignment, flags[, metadata])`` as ``numpy.dtype.__reduce__`` writes it."""
    if not isinstance(state, tuple) or len(state) < 8:
        raise FormatError("numpy dtype state must be a tuple of 8 or 9 items", found=short_repr(state, 80))
    _version, bo, sub, names, fields, elsize, _align, flags = state[:8]
    meta = state[8] if len(state) > 8 else None
    if names is not None:
        if not isinstance(names, tuple) or not isinstance(fields, dict):
            raise FormatError("structured dtype state needs names and fields", found=short_repr(state, 80))
        formats, offsets, titles = [], [], []
        for n in names:
            f = fields.get(n)
            if not isinstance(f, tuple) or len(f) not in (2, 3) or not isinstance(f[0], np.dtype) or type(f[1]) is not int:
                raise FormatError("structured dtype field", found=short_repr(f, 80))
            formats.append(f[0])
            offsets.append(f[1])
            titles.append(f[2] if len(f) == 3 else None)
        spec: dict[str, Any] = {"names": list(names), "formats": formats, "offsets": offsets}
        if type(elsize) is int and elsize >= 0:
            spec["itemsize"] = elsize
        if any(t is not None for t in titles):
            spec["titles"] = titles
        # numpy's stubs type a fields spec as their private TypedDict, not as a dict
        structured: np.dtype[Any] = np.dtype(spec, align=bool(type(flags) is int and flags & _NPY_ALIGNED_STRUCT))  # type: ignore[call-overload]
        return structured
    if sub is not None:
        if not isinstance(sub, tuple) or len(sub) != 2 or not isinstance(sub[0], np.dtype):
            raise FormatError("subarray dtype state", found=short_repr(sub, 80))
        return np.dtype((sub[0], _ints(sub[1] if isinstance(sub[1], tuple) else (sub[1],), "subarray shape")))
    out = dt
    if dt.kind in "Mm" and isinstance(meta, tuple) and len(meta) == 2 and isinstance(meta[1], tuple) and len(meta[1]) == 4:
        unit, num = meta[1][0], meta[1][1]
        unit = unit.decode("ascii", "replace") if isinstance(unit, bytes) else unit
        if unit not in _DATETIME_UNITS or type(num) is not int or num < 1:
            raise FormatError("datetime dtype unit", found=short_repr(meta, 60))
        out = np.dtype(f"{dt.char}8" if unit == "generic" else f"{dt.char}8[{num if num != 1 else ''}{unit}]")
    elif dt.kind in "SUV" and dt.itemsize == 0 and type(elsize) is int and elsize > 0:
        out = np.dtype(f"{dt.char}{elsize // 4 if dt.kind == 'U' else elsize}")
    if bo in ("<", ">", "=") and out.byteorder != "|":
        out = out.newbyteorder(bo)
    return out


def _np_scalar(args: tuple[Any, ...]) -> Any:
    dtype = args[0]
    if not isinstance(dtype, np.dtype):
        raise FormatError("numpy scalar needs a dtype")
    if dtype.hasobject:
        return args[1] if len(args) > 1 else None
    raw = args[1] if len(args) > 1 else b""
    if isinstance(raw, str):
        raw = raw.encode("latin1")
    if len(raw) != dtype.itemsize:
        raise FormatError("numpy scalar size does not match its dtype", expected=dtype.itemsize, found=len(raw))
    return np.frombuffer(raw, dtype=dtype, count=1)[0]


def _np_frombuffer(args: tuple[Any, ...]) -> np.ndarray:
    buf, dtype, shape, order = args
    if not isinstance(dtype, np.dtype) or dtype.hasobject:
        raise FormatError("numpy _frombuffer needs a plain dtype")
    shape = _ints(tuple(shape), "shape")
    count = 1
    for s in shape:
        count *= s
    data = memoryview(buf).cast("B")
    if len(data) != count * dtype.itemsize:
        raise FormatError("numpy buffer size does not match its shape")
    return np.frombuffer(data, dtype=dtype, count=count).reshape(shape, order=order if order in ("C", "F") else "C")


# -- tables ------------------------------------------------------------------------------
def _torch_table() -> Allowlist:
    al = Allowlist("torch-weights-only")
    al.add("collections.OrderedDict", Rebuilder("collections.OrderedDict", _ordered_dict), "builds an empty or pre-filled dict")
    al.add("collections.Counter", Rebuilder("collections.Counter", _counter), "a dict of counts")
    al.add("torch.nn.parameter.Parameter", PARAMETER, "marks a tensor as a parameter")
    al.add(
        "torch.serialization._get_layout", Rebuilder("torch.serialization._get_layout", _get_layout), "looks up a layout by name"
    )
    al.add("torch.Size", Rebuilder("torch.Size", _size), "a tuple of ints")
    al.add("torch.Tensor", TENSOR_CLASS, "the plain tensor class, as a type marker")
    al.add(f"{NJT_MODULE}.NestedTensor", NJT_CLASS, "the jagged nested tensor class, as a type marker")
    al.add(
        f"{NJT_MODULE}._rebuild_njt",
        Rebuilder(f"{NJT_MODULE}._rebuild_njt", _rebuild_njt),
        "a jagged nested tensor from its tensors",
    )
    al.add(
        "torch._dynamo.decorators._DimRange",
        Rebuilder("torch._dynamo.decorators._DimRange", lambda a: DimRange()),
        "inert bounds of a dynamic dimension (BUILD stores them)",
    )
    al.add("torch.device", Rebuilder("torch.device", _device), "a device name")
    al.add("_codecs.encode", Rebuilder("_codecs.encode", _codecs_encode), "text to bytes, text codecs only")
    al.add("builtins.bytearray", Rebuilder("builtins.bytearray", _bytearray), "bytes from data")
    al.add("builtins.set", Rebuilder("builtins.set", _set), "a set from a list")
    al.add("builtins.complex", Rebuilder("builtins.complex", _complex), "a complex from two floats")
    al.add(
        "torch._tensor._rebuild_from_type_v2",
        Rebuilder("torch._tensor._rebuild_from_type_v2", _rebuild_from_type_v2),
        "applies another allowed rebuilder, records the subclass name",
    )
    rebuilds = {
        "_rebuild_tensor": _rebuild_tensor,
        "_rebuild_tensor_v2": _rebuild_tensor_v2,
        "_rebuild_tensor_v3": _rebuild_tensor_v3,
        "_rebuild_parameter": _rebuild_parameter,
        "_rebuild_parameter_with_state": _rebuild_parameter_with_state,
        "_rebuild_qtensor": _rebuild_qtensor,
        "_rebuild_sparse_tensor": _rebuild_sparse_tensor,
        "_rebuild_meta_tensor_no_storage": _rebuild_meta_tensor_no_storage,
        "_rebuild_nested_tensor": _rebuild_nested_tensor,
        "_rebuild_wrapper_subclass": _rebuild_wrapper_subclass,
        "_rebuild_device_tensor_from_numpy": _rebuild_device_tensor_from_numpy,
        "_rebuild_device_tensor_from_cpu_tensor": _rebuild_device_tensor_from_cpu_tensor,
    }
    for n, f in rebuilds.items():
        al.add(f"torch._utils.{n}", Rebuilder(f"torch._utils.{n}", f), "builds a lazy tensor view over a storage from the file")
    for d in DTYPES.values():
        al.add(f"torch.{d.name}", d, "a dtype value")
    for sname, d in STORAGE_NAMES.items():
        al.add(f"torch.{sname}", StorageType(sname, d), "a storage class marker carrying its dtype")
        if d.kind != "quantized":
            al.add(f"torch.cuda.{sname}", StorageType(sname, d), "a legacy CUDA storage class marker")
    al.add("torch.storage.UntypedStorage", StorageType("UntypedStorage", None), "the byte storage class marker")
    al.add("torch.storage.TypedStorage", StorageType("TypedStorage", None), "the typed storage class marker")
    legacy = {
        "Double": "float64",
        "Float": "float32",
        "Half": "float16",
        "BFloat16": "bfloat16",
        "Long": "int64",
        "Int": "int32",
        "Short": "int16",
        "Char": "int8",
        "Byte": "uint8",
        "Bool": "bool",
    }
    for pfx, dn in legacy.items():
        for mod in ("torch", "torch.cuda"):
            al.add(f"{mod}.{pfx}Tensor", TensorType(f"{pfx}Tensor", DTYPES[dn]), "a legacy tensor class marker")
        if pfx != "Bool":
            for mod in ("torch.sparse", "torch.cuda.sparse"):
                al.add(f"{mod}.{pfx}Tensor", TensorType(f"{pfx}Tensor", DTYPES[dn], True), "a legacy sparse tensor class marker")
    for q in (
        "per_tensor_affine",
        "per_tensor_symmetric",
        "per_channel_affine",
        "per_channel_symmetric",
        "per_channel_affine_float_qparams",
    ):
        al.add(f"torch.{q}", QScheme(q), "a quantization scheme name")
    return al


def _default_table(torch_table: Allowlist) -> Allowlist:
    al = torch_table.merged(name="torchless-default")
    py = [
        ("collections.defaultdict", _defaultdict, "a dict; the factory kept only when it is a builtin container"),
        ("collections.deque", _deque, "a deque from a list"),
        ("builtins.frozenset", _frozenset, "a frozenset from a list"),
        ("builtins.bytes", _bytes, "bytes from data"),
        ("builtins.slice", _slice, "a slice of three values"),
        ("builtins.range", _range, "a range of three ints"),
        ("builtins.list", _plain(list), "a list from data"),
        ("builtins.tuple", _plain(tuple), "a tuple from data"),
        ("builtins.dict", _plain(dict), "a dict from data"),
        ("builtins.int", _plain(int), "an int from a number or string"),
        ("builtins.float", _plain(float), "a float from a number or string"),
        ("builtins.str", _plain(str), "a str from data"),
        ("builtins.bool", _plain(bool), "a bool"),
        ("torch.torch_version.TorchVersion", lambda a: TorchVersion(a[0] if a else ""), "a version string"),
        (
            "copyreg._reconstructor",
            _reconstructor,
            "protocol-0/1 object creation: dispatches to another allowed global or a placeholder",
        ),
        ("copyreg.__newobj__", _newobj, "protocol-2 object creation: dispatches to another allowed global or a placeholder"),
        (
            "copyreg.__newobj_ex__",
            _newobj_ex,
            "protocol-4 object creation: dispatches to another allowed global or a placeholder",
        ),
        ("pathlib.PosixPath", _pure_path("PurePosixPath"), "a path as text (pure path, no file access)"),
        ("pathlib.PurePosixPath", _pure_path("PurePosixPath"), "a path as text"),
        ("pathlib.WindowsPath", _pure_path("PureWindowsPath"), "a path as text (pure path, no file access)"),
        ("pathlib.PureWindowsPath", _pure_path("PureWindowsPath"), "a path as text"),
        ("pathlib.Path", _pure_path("PurePath"), "a path as text (pure path, no file access)"),
        ("datetime.datetime", _datetime_kind(datetime.datetime), "a timestamp from its bytes"),
        ("datetime.date", _datetime_kind(datetime.date), "a date from its bytes"),
        ("datetime.time", _datetime_kind(datetime.time), "a time from its bytes"),
        ("datetime.timedelta", _datetime_kind(datetime.timedelta), "a duration"),
        ("decimal.Decimal", _decimal, "a decimal from its text"),
        ("numpy.core.multiarray._reconstruct", _np_reconstruct, "NumPy array shell; BUILD fills it from bytes"),
        ("numpy._core.multiarray._reconstruct", _np_reconstruct, "NumPy array shell; BUILD fills it from bytes"),
        ("numpy.core.multiarray.scalar", _np_scalar, "a NumPy scalar from its bytes"),
        ("numpy._core.multiarray.scalar", _np_scalar, "a NumPy scalar from its bytes"),
        ("numpy.core.numeric._frombuffer", _np_frombuffer, "a NumPy array from a buffer (protocol 5)"),
        ("numpy._core.numeric._frombuffer", _np_frombuffer, "a NumPy array from a buffer (protocol 5)"),
    ]
    for name, fn, reason in py:
        al.add(name, Rebuilder(name, fn), reason)
    al.add("argparse.Namespace", Rebuilder("argparse.Namespace", lambda a: Namespace(), _namespace_new), "a bag of attributes")
    al.add(
        "types.SimpleNamespace", Rebuilder("types.SimpleNamespace", lambda a: Namespace(), _namespace_new), "a bag of attributes"
    )
    al.add(
        "builtins.object",
        Rebuilder("builtins.object", lambda a: _no_call("builtins.object")),
        "base-class marker of copyreg._reconstructor; never called",
    )
    al.add("numpy.ndarray", Rebuilder("numpy.ndarray", lambda a: _no_call("numpy.ndarray")), "the array class, as a type marker")
    al.add("numpy.dtype", Rebuilder("numpy.dtype", _np_dtype), "a NumPy dtype from its type string; BUILD may set its byte order")
    for mf in ("contiguous_format", "channels_last", "channels_last_3d", "preserve_format"):
        al.add(f"torch.{mf}", MemoryFormat(mf), "a memory format name")
    for lay in ("strided", "sparse_coo", "sparse_csr", "sparse_csc", "sparse_bsr", "sparse_bsc", "_mkldnn", "jagged"):
        al.add(f"torch.{lay}", Layout(lay), "a layout name")
    al.add(
        "torch._utils._rebuild_xla_tensor",
        Rebuilder("torch._utils._rebuild_xla_tensor", _rebuild_device_tensor_from_numpy),
        "old XLA files: a tensor from a NumPy array",
    )
    v2 = al.get("torch._tensor._rebuild_from_type_v2")
    if v2 is None:
        raise InternalError("torch._tensor._rebuild_from_type_v2 is registered above")
    al.add("torch.tensor._rebuild_from_type_v2", v2.target, "old module name of the same rebuilder")
    return al


#: torch 2.13's weights_only allowlist as torchless rebuilders.
TORCH_ALLOWLIST = _torch_table()
#: the allowlist ``torchless.load`` uses (torch's plus safe data types).
DEFAULT_ALLOWLIST = _default_table(TORCH_ALLOWLIST)


def _tensor_build(t: Any, state: Any) -> Any:
    # old files: BUILD on a tensor carries Python attributes (never a set_ call)
    _apply_state(t, state)
    return t


for _t in {type(np.dtype(c)) for c in "?bBhHiIlLqQefdgFDGSUVOMm"} | {np.dtype}:
    register_builder(_t, _np_dtype_build)
register_builder(Tensor, _tensor_build)
register_builder(np.ndarray, _ndarray_build)
