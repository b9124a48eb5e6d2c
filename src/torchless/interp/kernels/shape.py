"""View and shape kernels: view ops return NumPy views (so in-place writes go through), the rest copies.

torch's ``as_strided`` addresses the tensor's storage: here the storage is the NumPy array
that owns the memory (the root of ``.base``), and a storage offset is counted from its
first element, as torch counts it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import as_strided as _np_as_strided

from .. import promote
from ..registry import kernel
from ._common import bad, norm_dim, tensor


def _reshape_view(x: np.ndarray, shape: Sequence[int]) -> np.ndarray:
    shape = tuple(int(s) for s in shape)
    try:
        return np.reshape(x, shape, copy=False)
    except TypeError:  # NumPy < 2.1: no copy= argument
        y = x.view()
        try:
            y.shape = shape
            return y
        except AttributeError:
            return np.reshape(x, shape)
    except ValueError as exc:
        if "copy" in str(exc) or "without copying" in str(exc):
            return np.reshape(x, shape)  # torch's view would refuse; the values are the same
        raise bad("aten.view", f"shape {list(shape)} is invalid for input of size {x.size}") from None


@kernel("aten.view.default", "aten._unsafe_view.default", "aten.reshape.default", "aten.view_copy.default")
def view(self: np.ndarray, size: Sequence[int]) -> np.ndarray:
    return _reshape_view(tensor(self), size)


@kernel("aten.alias.default")
def alias(self: np.ndarray) -> np.ndarray:
    return tensor(self).view()


@kernel("aten.alias_copy.default")
def alias_copy(self: np.ndarray) -> np.ndarray:
    return tensor(self).copy()


@kernel("aten.view.dtype")
def view_dtype(self: np.ndarray, dtype: Any) -> np.ndarray:
    """The same bytes read as ``dtype`` (the last dim rescaled when the element sizes differ)."""
    from ._common import np_dtype

    x = tensor(self)
    dt = np.dtype(np_dtype(dtype))
    if dt.itemsize == x.dtype.itemsize:
        return x.view(dt)
    if x.ndim == 0 or (x.shape[-1] * x.dtype.itemsize) % dt.itemsize or (x.ndim and x.strides[-1] != x.dtype.itemsize):
        raise bad("aten.view", f"cannot view a {x.dtype} tensor of shape {list(x.shape)} as {dt}")
    return x.view(dt)


def _storage(x: np.ndarray) -> tuple[np.ndarray, int]:
    """(the array owning x's memory as 1-d, x's element offset in it)."""
    root = x
    while isinstance(root.base, np.ndarray):
        root = root.base
    if not root.flags.c_contiguous and not root.flags.f_contiguous:
        return x, 0
    flat = root.reshape(-1, order="A") if root.ndim != 1 else root
    flat = flat.view(x.dtype) if flat.dtype != x.dtype and flat.dtype.itemsize == x.dtype.itemsize else flat
    if flat.dtype != x.dtype:
        return x, 0
    off = (x.__array_interface__["data"][0] - flat.__array_interface__["data"][0]) // x.dtype.itemsize
    return flat, off


@kernel("aten.as_strided.default", "aten.as_strided_copy.default")
def as_strided(self: np.ndarray, size: Sequence[int], stride: Sequence[int], storage_offset: int | None = None) -> np.ndarray:
    x = tensor(self)
    flat, off = _storage(x)
    if flat is x and x.ndim != 1 or (flat is x and not x.flags.c_contiguous):
        flat, off = np.ascontiguousarray(x).reshape(-1), 0
    start = off if storage_offset is None else int(storage_offset)
    size = [int(s) for s in size]
    stride = [int(s) for s in stride]
    if any(s < 0 for s in stride) or any(s < 0 for s in size):
        raise bad("aten.as_strided", "negative sizes or strides are not supported")
    need = start + (sum((n - 1) * s for n, s in zip(size, stride, strict=True)) + 1 if all(size) else 0)
    if need > flat.size:
        raise bad("aten.as_strided", f"size {size} stride {stride} offset {start} is out of bounds for a storage of {flat.size}")
    base = flat[start:]
    return _np_as_strided(base, size, [s * x.dtype.itemsize for s in stride], writeable=base.flags.writeable)


@kernel("aten.permute.default", "aten.permute_copy.default")
def permute(self: np.ndarray, dims: Sequence[int]) -> np.ndarray:
    x = tensor(self)
    return np.transpose(x, [norm_dim(d, x.ndim, "aten.permute") for d in dims]) if x.ndim else x.view()


@kernel("aten.t.default")
def t(self: np.ndarray) -> np.ndarray:
    x = tensor(self)
    if x.ndim > 2:
        raise bad("aten.t", f"expects a tensor with <= 2 dimensions, got {x.ndim}")
    return x.T


@kernel("aten.transpose.int")
def transpose(self: np.ndarray, dim0: int, dim1: int) -> np.ndarray:
    x = tensor(self)
    if x.ndim == 0:
        return x.view()
    return np.swapaxes(x, norm_dim(dim0, x.ndim, "aten.transpose"), norm_dim(dim1, x.ndim, "aten.transpose"))


@kernel("aten.expand.default", "aten.expand_copy.default")
def expand(self: np.ndarray, size: Sequence[int], *, implicit: bool = False) -> np.ndarray:
    x = tensor(self)
    size = [int(s) for s in size]
    if len(size) < x.ndim:
        raise bad("aten.expand", f"the number of sizes ({len(size)}) must be >= the tensor's dims ({x.ndim})")
    lead = len(size) - x.ndim
    shape, strides = [], []
    for i, s in enumerate(size):
        if i < lead:
            if s < 0:
                raise bad("aten.expand", f"size -1 is not allowed in a leading, non-existing dimension {i}")
            shape.append(s)
            strides.append(0)
            continue
        have = x.shape[i - lead]
        if s == -1:
            s = have
        if have == s:
            shape.append(s)
            strides.append(x.strides[i - lead])
        elif have == 1:
            shape.append(s)
            strides.append(0)
        else:
            raise bad("aten.expand", f"the expanded size {s} must match the existing size {have} at dimension {i}")
    return _np_as_strided(x, shape, strides, writeable=x.flags.writeable)


@kernel("aten.squeeze.dim", "aten.squeeze_copy.dim")
def squeeze_dim(self: np.ndarray, dim: int) -> np.ndarray:
    return squeeze_dims(self, [dim])


@kernel("aten.squeeze.dims", "aten.squeeze_copy.dims")
def squeeze_dims(self: np.ndarray, dim: Sequence[int]) -> np.ndarray:
    x = tensor(self)
    if x.ndim == 0:
        return x.view()
    dims = tuple(sorted({d for d in (norm_dim(d, x.ndim, "aten.squeeze") for d in dim) if x.shape[d] == 1}))
    return np.squeeze(x, axis=dims) if dims else x.view()


@kernel("aten.squeeze.default", "aten.squeeze_copy.default")
def squeeze(self: np.ndarray) -> np.ndarray:
    x = tensor(self)
    return np.squeeze(x) if x.ndim else x.view()


@kernel("aten.unsqueeze.default", "aten.unsqueeze_copy.default")
def unsqueeze(self: np.ndarray, dim: int) -> np.ndarray:
    x = tensor(self)
    return np.expand_dims(x, norm_dim(dim, x.ndim + 1, "aten.unsqueeze"))


def _index_at(ndim: int, d: int, idx: Any) -> tuple[Any, ...]:
    return (slice(None),) * d + (idx, Ellipsis)


@kernel("aten.select.int", "aten.select_copy.int")
def select(self: np.ndarray, dim: int, index: int) -> np.ndarray:
    x = tensor(self)
    if x.ndim == 0:
        raise bad("aten.select", "select() cannot be applied to a 0-dim tensor")
    d = norm_dim(dim, x.ndim, "aten.select")
    n = x.shape[d]
    if not -n <= index < n:
        raise bad("aten.select", f"index {index} out of range for tensor of size {list(x.shape)} at dimension {d}")
    return x[_index_at(x.ndim, d, index % n)]


def _slice(n: int, start: int | None, end: int | None, step: int) -> slice:
    if step <= 0:
        raise bad("aten.slice", "slice step must be positive")
    s = 0 if start is None else int(start)
    e = n if end is None else int(end)
    s = s + n if s < 0 else s
    e = e + n if e < 0 else e
    s = min(max(s, 0), n)
    e = min(max(e, s), n)
    return slice(s, e, int(step))


@kernel("aten.slice.Tensor", "aten.slice_copy.Tensor")
def slice_(self: np.ndarray, dim: int = 0, start: int | None = None, end: int | None = None, step: int = 1) -> np.ndarray:
    x = tensor(self)
    d = norm_dim(dim, x.ndim, "aten.slice")
    return x[_index_at(x.ndim, d, _slice(x.shape[d], start, end, step))]


@kernel("aten.narrow.default")
def narrow(self: np.ndarray, dim: int, start: int, length: int) -> np.ndarray:
    x = tensor(self)
    d = norm_dim(dim, x.ndim, "aten.narrow")
    s = start % x.shape[d] if start < 0 else start
    return slice_(x, d, s, s + length)


@kernel("aten.diagonal.default", "aten.diagonal_copy.default")
def diagonal(self: np.ndarray, offset: int = 0, dim1: int = 0, dim2: int = 1) -> np.ndarray:
    x = tensor(self)
    d1, d2 = norm_dim(dim1, x.ndim, "aten.diagonal"), norm_dim(dim2, x.ndim, "aten.diagonal")
    if d1 == d2:
        raise bad("aten.diagonal", "diagonal dimensions cannot be identical")
    r0, c0 = (0, offset) if offset >= 0 else (-offset, 0)
    n = max(0, min(x.shape[d1] - r0, x.shape[d2] - c0))
    if n > 0:
        idx = [slice(None)] * x.ndim
        idx[d1], idx[d2] = slice(r0, None), slice(c0, None)
        base = x[tuple(idx)]
    else:
        base = x
    keep = [i for i in range(x.ndim) if i not in (d1, d2)]
    shape = [x.shape[i] for i in keep] + [n]
    strides = [base.strides[i] for i in keep] + [base.strides[d1] + base.strides[d2]]
    return _np_as_strided(base, shape, strides, writeable=x.flags.writeable)


@kernel("aten.flip.default")
def flip(self: np.ndarray, dims: Sequence[int]) -> np.ndarray:
    x = tensor(self)
    if x.ndim == 0:
        return x.copy()
    return np.flip(x, axis=tuple(norm_dim(d, x.ndim, "aten.flip") for d in dims)).copy()


@kernel("aten.repeat.default")
def repeat(self: np.ndarray, repeats: Sequence[int]) -> np.ndarray:
    x = tensor(self)
    if len(repeats) < x.ndim:
        raise bad("aten.repeat", "number of repeat dims can not be smaller than the number of tensor dims")
    return np.asarray(np.tile(x, [int(r) for r in repeats]))


@kernel("aten.cat.default")
def cat(tensors: Sequence[np.ndarray], dim: int = 0) -> np.ndarray:
    ts = [tensor(t) for t in tensors]
    if not ts:
        raise bad("aten.cat", "expected a non-empty list of tensors")
    rt = ts[0].dtype
    for t_ in ts[1:]:
        rt = promote.promote_types(rt, t_.dtype)
    # torch skips legacy empty 1-d tensors of shape (0,)
    kept = [t_ for t_ in ts if not (t_.ndim == 1 and t_.shape[0] == 0)]
    if not kept:
        return np.zeros((0,), rt)
    nd = kept[0].ndim
    if nd == 0:
        raise bad("aten.cat", "zero-dimensional tensor cannot be concatenated")
    d = norm_dim(dim, nd, "aten.cat")
    return np.concatenate([promote.cast(t_, rt) for t_ in kept], axis=d)


@kernel("aten.stack.default")
def stack(tensors: Sequence[np.ndarray], dim: int = 0) -> np.ndarray:
    ts = [tensor(t) for t in tensors]
    if not ts:
        raise bad("aten.stack", "expects a non-empty list of tensors")
    d = norm_dim(dim, ts[0].ndim + 1, "aten.stack")
    return cat([np.expand_dims(t_, d) for t_ in ts], d)


@kernel("aten.clone.default")
def clone(self: np.ndarray, *, memory_format: Any = None) -> np.ndarray:
    # contiguous_format lays the copy out in C order, as torch does (a later view of it then
    # needs no copy); preserve_format (the default) keeps the source's layout
    if memory_format is not None and str(memory_format) == "contiguous_format":
        return np.array(tensor(self), copy=True, order="C")
    return np.array(tensor(self), copy=True)


@kernel("aten.contiguous.default")
def contiguous(self: np.ndarray, *, memory_format: Any = None) -> np.ndarray:
    x = tensor(self)
    return x if x.flags.c_contiguous else x.copy(order="C")


@kernel("aten.copy.default")
def copy(self: np.ndarray, src: np.ndarray, non_blocking: bool = False) -> np.ndarray:
    x = tensor(self)
    out = np.empty(x.shape, x.dtype)
    out[...] = promote.cast(np.broadcast_to(tensor(src), x.shape), x.dtype)
    return out


@kernel("aten.copy_.default")
def copy_(self: np.ndarray, src: np.ndarray, non_blocking: bool = False) -> np.ndarray:
    x = tensor(self)
    x[...] = promote.cast(np.broadcast_to(tensor(src), x.shape), x.dtype)
    return x


def _split_points(sizes: Sequence[int]) -> list[int]:
    pts, acc = [], 0
    for s in sizes[:-1]:
        acc += int(s)
        pts.append(acc)
    return pts


@kernel("aten.split_with_sizes.default", "aten.split_with_sizes_copy.default")
def split_with_sizes(self: np.ndarray, split_sizes: Sequence[int], dim: int = 0) -> list[np.ndarray]:
    x = tensor(self)
    d = norm_dim(dim, x.ndim, "aten.split_with_sizes")
    if sum(int(s) for s in split_sizes) != x.shape[d] or any(s < 0 for s in split_sizes):
        raise bad("aten.split_with_sizes", f"split sizes {list(split_sizes)} do not sum to {x.shape[d]} (dim {d})")
    out, start = [], 0
    for s in split_sizes:
        out.append(x[_index_at(x.ndim, d, slice(start, start + int(s)))])
        start += int(s)
    return out


@kernel("aten.split.Tensor", "aten.split_copy.Tensor")
def split(self: np.ndarray, split_size: int, dim: int = 0) -> list[np.ndarray]:
    x = tensor(self)
    d = norm_dim(dim, x.ndim, "aten.split")
    n = x.shape[d]
    if split_size <= 0:
        if n == 0 and split_size == 0:
            return [x.view()]
        raise bad("aten.split", "split_size must be positive")
    sizes = [split_size] * (n // split_size) + ([n % split_size] if n % split_size else [])
    return split_with_sizes(x, sizes or [0], d)


@kernel("aten.chunk.default")
def chunk(self: np.ndarray, chunks: int, dim: int = 0) -> list[np.ndarray]:
    x = tensor(self)
    d = norm_dim(dim, x.ndim, "aten.chunk")
    size = -(-x.shape[d] // chunks) if x.shape[d] else 0
    return split(x, size, d) if size else [x.view()]


@kernel("aten.unbind.int", "aten.unbind_copy.int")
def unbind(self: np.ndarray, dim: int = 0) -> list[np.ndarray]:
    x = tensor(self)
    d = norm_dim(dim, x.ndim, "aten.unbind")
    return [x[_index_at(x.ndim, d, i)] for i in range(x.shape[d])]


@kernel("aten.constant_pad_nd.default")
def constant_pad_nd(self: np.ndarray, pad: Sequence[int], value: Any = 0) -> np.ndarray:
    x = tensor(self)
    pad = [int(p) for p in pad]
    if len(pad) % 2 or len(pad) // 2 > x.ndim:
        raise bad("aten.constant_pad_nd", f"padding length {len(pad)} must be even and at most twice the dims ({x.ndim})")
    crop = [slice(None)] * x.ndim
    widths = [(0, 0)] * x.ndim
    for i in range(len(pad) // 2):
        d = x.ndim - 1 - i
        lo, hi = pad[2 * i], pad[2 * i + 1]
        n = x.shape[d]
        crop[d] = slice(max(0, -lo), n - max(0, -hi))
        if n - max(0, -lo) - max(0, -hi) + max(0, lo) + max(0, hi) < 0:
            raise bad("aten.constant_pad_nd", f"the padded size of dimension {d} would be negative")
        widths[d] = (max(0, lo), max(0, hi))
    y = x[tuple(crop)]
    if y.size == 0 and any(s < 0 for s in y.shape):
        y = y.reshape(tuple(max(0, s) for s in y.shape))
    fill = promote.cast(value, x.dtype)
    out = np.full(tuple(s + a + b for s, (a, b) in zip(y.shape, widths, strict=True)), fill, dtype=x.dtype)
    out[tuple(slice(a, a + s) for s, (a, _) in zip(y.shape, widths, strict=True))] = y
    return out


@kernel("aten.resize_.default")
def resize_(self: np.ndarray, size: Sequence[int], *, memory_format: Any = None) -> np.ndarray:
    x = tensor(self)
    size = tuple(int(s) for s in size)
    n = int(np.prod(size, dtype=np.int64))
    if x.flags.owndata and x.flags.c_contiguous:
        x.resize(size, refcheck=False)  # keeps the elements in storage order; new ones are 0
        return x
    flat = np.zeros(n, x.dtype)
    src = np.ascontiguousarray(x).reshape(-1)[:n]
    flat[: src.size] = src
    return flat.reshape(size)


@kernel("aten.unfold.default", "aten.unfold_copy.default")
def unfold(self: np.ndarray, dimension: int, size: int, step: int) -> np.ndarray:
    x = tensor(self)
    if x.ndim == 0:
        return x.reshape(1)
    d = norm_dim(dimension, x.ndim, "aten.unfold")
    n = x.shape[d]
    if size > n or step <= 0 or size < 0:
        raise bad("aten.unfold", f"size {size} and step {step} do not fit dimension {d} of size {n}")
    count = (n - size) // step + 1
    shape = list(x.shape)
    strides = list(x.strides)
    shape[d], strides[d] = count, x.strides[d] * step
    return _np_as_strided(x, shape + [size], strides + [x.strides[d]], writeable=x.flags.writeable)


@kernel("aten.numpy_T.default", "aten.numpy_T.a")
def numpy_t(self: np.ndarray) -> np.ndarray:
    """Every dimension reversed (``Tensor.T``), a view."""
    return tensor(self).transpose()


@kernel("aten.broadcast_tensors.default")
def broadcast_tensors(tensors: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Each tensor expanded (a view) to the common broadcast shape."""
    arrays = [tensor(t) for t in tensors]
    try:
        shape = np.broadcast_shapes(*(a.shape for a in arrays))
    except ValueError as e:
        raise bad("aten.broadcast_tensors", f"the shapes do not broadcast: {[list(a.shape) for a in arrays]}") from e
    return [np.broadcast_to(a, shape) for a in arrays]


def _real_dtype(dt: np.dtype) -> np.dtype:
    return np.dtype(np.float32) if dt == np.complex64 else np.dtype(np.float64)


@kernel("aten.view_as_real.default")
def view_as_real(self: np.ndarray) -> np.ndarray:
    """A complex tensor's ``(real, imag)`` pairs as a trailing dimension of 2: a view
    sharing the complex tensor's memory."""
    x = tensor(self)
    if x.dtype.kind != "c":
        raise bad("aten.view_as_real", f"is only supported for complex tensors, got {x.dtype}")
    # the trailing axis of size 1 is contiguous whatever x's strides: reinterpret it
    return x[..., np.newaxis].view(_real_dtype(x.dtype))


@kernel("aten.view_as_complex.default")
def view_as_complex(self: np.ndarray) -> np.ndarray:
    """Pairs of the last dimension (size 2) as complex numbers: a view when that dimension
    is contiguous, else a copy with the same values (results never depend on strides)."""
    x = tensor(self)
    if x.dtype not in (np.float32, np.float64) and promote.category(x.dtype) != promote.FLOAT:
        raise bad("aten.view_as_complex", f"is only supported for floating point tensors, got {x.dtype}")
    if x.ndim == 0 or x.shape[-1] != 2:
        raise bad("aten.view_as_complex", f"the last dimension must have size 2, got shape {list(x.shape)}")
    if x.dtype not in (np.float32, np.float64):  # half: complex32, which NumPy lacks
        x = x.astype(np.float32)
    cdt = np.complex64 if x.dtype == np.float32 else np.complex128
    if x.strides[-1] != x.itemsize:
        x = np.ascontiguousarray(x)
    return x.view(cdt)[..., 0]
