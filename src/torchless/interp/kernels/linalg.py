"""Matrix products (through NumPy's BLAS), pairwise distances and the real FFTs.

float16/bfloat16 products are computed in float32 and rounded once, as torch's CPU
kernels accumulate them in float32.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .. import promote
from ..registry import kernel
from ._common import bad, norm_dim, quiet, refuse, tensor
from ._nn_util import _HALF


def _mm_dtypes(op: str, *xs: np.ndarray) -> tuple[np.dtype, np.dtype]:
    dts = {x.dtype for x in xs}
    if len(dts) != 1:
        raise bad(op, "expected all operands to have the same dtype, got " + ", ".join(sorted(str(d) for d in dts)))
    dt = xs[0].dtype
    if dt == np.bool_:
        raise refuse(op, "bool matrices")
    return promote.opmath(dt), dt


def _matmul(op: str, a: np.ndarray, b: np.ndarray, nd: int) -> np.ndarray:
    a, b = tensor(a), tensor(b)
    if a.ndim != nd or b.ndim != nd:
        raise bad(op, f"expected {nd}-d tensors, got {a.ndim}-d and {b.ndim}-d")
    if a.shape[-1] != b.shape[-2] or (nd == 3 and a.shape[0] != b.shape[0]):
        raise bad(op, f"shapes {list(a.shape)} and {list(b.shape)} cannot be multiplied")
    compute, out = _mm_dtypes(op, a, b)
    with quiet():
        if nd == 3 and a.shape[0] > 1 and b.strides[0] == 0 and a.strides[0] != 0:
            # one matrix broadcast over the batch (a weight that ATen IR expands for a linear
            # layer on 3-d input): one product of all the batch's rows instead of one per item
            bsz, m, k = a.shape
            flat = np.reshape(a, (bsz * m, k))  # a copy only when the rows do not line up
            prod = np.matmul(flat.astype(compute, copy=False), b[0].astype(compute, copy=False))
            return promote.cast(prod.reshape(bsz, m, b.shape[2]), out)
        return promote.cast(np.matmul(a.astype(compute, copy=False), b.astype(compute, copy=False)), out)


@kernel("aten.mm.default")
def mm(self: np.ndarray, mat2: np.ndarray) -> np.ndarray:
    return _matmul("aten.mm", self, mat2, 2)


@kernel("aten.bmm.default")
def bmm(self: np.ndarray, mat2: np.ndarray) -> np.ndarray:
    return _matmul("aten.bmm", self, mat2, 3)


@kernel("aten.addmm.default")
def addmm(self: np.ndarray, mat1: np.ndarray, mat2: np.ndarray, *, beta: Any = 1, alpha: Any = 1) -> np.ndarray:
    a, b, c = tensor(mat1), tensor(mat2), tensor(self)
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
        raise bad("aten.addmm", f"shapes {list(a.shape)} and {list(b.shape)} cannot be multiplied")
    compute, out = _mm_dtypes("aten.addmm", a, b, c)
    with quiet():
        prod = np.matmul(a.astype(compute, copy=False), b.astype(compute, copy=False))  # fresh, C order
        if alpha != 1:
            np.multiply(prod, np.asarray(alpha).astype(compute), out=prod)
        # beta == 0 ignores self entirely (nan and inf in it do not propagate); the bias is
        # added in place, broadcast (a materialised copy of it would not be in C order)
        if beta != 0:
            res = np.broadcast_to(c, prod.shape)
            if c.dtype != compute:
                res = res.astype(compute, order="C")
            np.add(prod, res if beta == 1 else res * np.asarray(beta).astype(compute), out=prod)
    return promote.cast(prod, out)


def _batch_add(op: str, self: Any, prod: np.ndarray, compute: np.dtype, out: np.dtype, beta: Any, alpha: Any) -> np.ndarray:
    """``beta * self + alpha * prod`` in ``compute``, rounded once to ``out``; ``beta == 0``
    ignores ``self`` (its NaN and inf do not propagate), as torch does."""
    with quiet():
        if alpha != 1:
            prod = prod * np.asarray(alpha).astype(compute)
        if beta != 0:
            c = tensor(self)
            try:
                np.broadcast_shapes(c.shape, prod.shape)
            except ValueError:
                raise bad(op, f"self {list(c.shape)} cannot be broadcast to the product {list(prod.shape)}") from None
            c = c.astype(compute, copy=False)
            prod = prod + (c if beta == 1 else c * np.asarray(beta).astype(compute))
    return promote.cast(np.broadcast_to(prod, np.broadcast_shapes(prod.shape, tensor(self).shape)) if beta != 0 else prod, out)


@kernel("aten.baddbmm.default")
def baddbmm(self: np.ndarray, batch1: np.ndarray, batch2: np.ndarray, *, beta: Any = 1, alpha: Any = 1) -> np.ndarray:
    """``beta * self + alpha * (batch1 @ batch2)``, batched."""
    a, b = tensor(batch1), tensor(batch2)
    compute, out = _mm_dtypes("aten.baddbmm", a, b, tensor(self))
    prod = _matmul("aten.baddbmm", a.astype(compute, copy=False), b.astype(compute, copy=False), 3)
    return _batch_add("aten.baddbmm", self, prod, compute, out, beta, alpha)


@kernel("aten.baddbmm_.default")
def baddbmm_(self: np.ndarray, batch1: np.ndarray, batch2: np.ndarray, *, beta: Any = 1, alpha: Any = 1) -> np.ndarray:
    r = baddbmm(self, batch1, batch2, beta=beta, alpha=alpha)
    if r.shape != self.shape:
        raise bad("aten.baddbmm_", f"output with shape {list(self.shape)} doesn't match the broadcast shape {list(r.shape)}")
    self[...] = r
    return self


@kernel("aten.addbmm.default")
def addbmm(self: np.ndarray, batch1: np.ndarray, batch2: np.ndarray, *, beta: Any = 1, alpha: Any = 1) -> np.ndarray:
    """``beta * self + alpha * sum_b(batch1[b] @ batch2[b])``: as torch's CPU kernel, one
    ``addmm`` per batch item, each rounded to the result dtype."""
    a, b = tensor(batch1), tensor(batch2)
    compute, out = _mm_dtypes("aten.addbmm", a, b, tensor(self))
    prod = _matmul("aten.addbmm", a.astype(compute, copy=False), b.astype(compute, copy=False), 3)
    acc = _batch_add("aten.addbmm", self, np.zeros(prod.shape[1:], compute), compute, out, beta, 1)
    for i in range(prod.shape[0]):
        acc = _batch_add("aten.addbmm", acc, prod[i], compute, out, 1, alpha)
    return acc


@kernel("aten._int_mm.default")
def int_mm(self: np.ndarray, mat2: np.ndarray) -> np.ndarray:
    """int8 x int8 matrix product accumulated and returned in int32."""
    a, b = tensor(self), tensor(mat2)
    if a.dtype != np.int8 or b.dtype != np.int8:
        raise bad("aten._int_mm", f"expected int8 operands, got {a.dtype} and {b.dtype}")
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
        raise bad("aten._int_mm", f"shapes {list(a.shape)} and {list(b.shape)} cannot be multiplied")
    # int64 accumulation cannot overflow for any k torch accepts; int32 wraps as torch's does
    return np.matmul(a.astype(np.int64), b.astype(np.int64)).astype(np.int32)


@kernel("aten._weight_int8pack_mm.default")
def weight_int8pack_mm(self: np.ndarray, mat2: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """``(self @ mat2.T) * scales``: int8 weights ``[n, k]`` with one scale per output channel."""
    a, w, s = tensor(self), tensor(mat2), tensor(scales)
    if w.dtype != np.int8:
        raise bad("aten._weight_int8pack_mm", f"expected an int8 weight, got {w.dtype}")
    if a.dtype not in (np.float32, *_HALF) or s.dtype != a.dtype:
        raise bad("aten._weight_int8pack_mm", f"expected float input and scales of one dtype, got {a.dtype} and {s.dtype}")
    if a.ndim != 2 or w.ndim != 2 or a.shape[1] != w.shape[1] or s.shape != (w.shape[0],):
        raise bad("aten._weight_int8pack_mm", f"shapes {list(a.shape)}, {list(w.shape)}, {list(s.shape)} do not fit")
    prod = np.matmul(a.astype(np.float32), w.astype(np.float32).T) * s.astype(np.float32)
    return promote.cast(prod, a.dtype)


@kernel("aten.mv.default")
def mv(self: np.ndarray, vec: np.ndarray) -> np.ndarray:
    a, v = tensor(self), tensor(vec)
    compute, out = _mm_dtypes("aten.mv", a, v)
    return promote.cast(np.matmul(a.astype(compute), v.astype(compute)), out)


@kernel("aten.dot.default")
def dot(self: np.ndarray, tensor_: np.ndarray) -> np.ndarray:
    a, v = tensor(self), tensor(tensor_)
    compute, out = _mm_dtypes("aten.dot", a, v)
    return promote.cast(np.dot(a.astype(compute), v.astype(compute)), out)


def _pnorm(diff: np.ndarray, p: float, axis: int) -> np.ndarray:
    ad = np.abs(diff)
    if p == 0:
        return np.sum(ad != 0, axis=axis).astype(diff.dtype)
    if p == np.inf:
        return np.max(ad, axis=axis) if ad.shape[axis] else np.zeros(np.delete(ad.shape, axis), ad.dtype)
    if p == 1:
        return np.sum(ad, axis=axis)
    if p == 2:
        return np.sqrt(np.sum(ad * ad, axis=axis))
    return np.sum(ad**p, axis=axis) ** (1.0 / p)


@kernel("aten._cdist_forward.default")
def cdist(x1: np.ndarray, x2: np.ndarray, p: float, compute_mode: int | None = None) -> np.ndarray:
    a, b = tensor(x1), tensor(x2)
    if a.ndim < 2 or b.ndim < 2 or a.shape[-1] != b.shape[-1]:
        raise bad("aten._cdist_forward", f"x1 {list(a.shape)} and x2 {list(b.shape)} need >= 2 dims and the same last size")
    if p < 0:
        raise bad("aten._cdist_forward", "p value for the p-norm distance must be >= 0")
    if promote.category(a.dtype) != promote.FLOAT or a.dtype != b.dtype:
        raise refuse("aten._cdist_forward", f"only supports floating point inputs of one dtype, got {a.dtype} and {b.dtype}")
    compute = promote.opmath(a.dtype)
    with quiet():
        d = a.astype(compute)[..., :, None, :] - b.astype(compute)[..., None, :, :]
        return promote.cast(_pnorm(d, p, -1), a.dtype)


@kernel("aten._pdist_forward.default")
def pdist(self: np.ndarray, p: float = 2.0) -> np.ndarray:
    x = tensor(self)
    if x.ndim != 2:
        raise bad("aten._pdist_forward", f"expects a 2-d tensor, got {x.ndim}-d")
    if promote.category(x.dtype) != promote.FLOAT:
        raise refuse("aten._pdist_forward", f"only supports floating point inputs, got {x.dtype}")
    n = x.shape[0]
    i, j = np.triu_indices(n, 1)
    compute = promote.opmath(x.dtype)
    with quiet():
        xc = x.astype(compute)
        return promote.cast(_pnorm(xc[i] - xc[j], p, -1), x.dtype)


# torch's fft_norm_mode: 0 none, 1 by 1/sqrt(n), 2 by 1/n; the scaling goes on this transform
_FORWARD_NORM: dict[int, Any] = {0: "backward", 1: "ortho", 2: "forward"}
_INVERSE_NORM: dict[int, Any] = {0: "forward", 1: "ortho", 2: "backward"}


def _fft_dims(x: np.ndarray, dim: Sequence[int], op: str) -> list[int]:
    return [norm_dim(d, x.ndim, op) for d in dim]


@kernel("aten._fft_r2c.default")
def fft_r2c(self: np.ndarray, dim: Sequence[int], normalization: int, onesided: bool) -> np.ndarray:
    x = tensor(self)
    if promote.category(x.dtype) != promote.FLOAT or x.dtype not in (np.float32, np.float64):
        raise refuse("aten._fft_r2c", f"unsupported dtype {x.dtype}")
    dims = _fft_dims(x, dim, "aten._fft_r2c")
    out = promote.to_complex(x.dtype)
    norm = _FORWARD_NORM[int(normalization)]
    r = np.fft.rfftn(x, axes=dims, norm=norm) if onesided else np.fft.fftn(x, axes=dims, norm=norm)
    return np.asarray(r).astype(out)


@kernel("aten._fft_c2r.default")
def fft_c2r(self: np.ndarray, dim: Sequence[int], normalization: int, last_dim_size: int) -> np.ndarray:
    x = tensor(self)
    if x.dtype.kind != "c":
        raise refuse("aten._fft_c2r", f"expects a complex input, got {x.dtype}")
    dims = _fft_dims(x, dim, "aten._fft_c2r")
    s = [x.shape[d] for d in dims[:-1]] + [int(last_dim_size)]
    r = np.fft.irfftn(x, s=s, axes=dims, norm=_INVERSE_NORM[int(normalization)])
    return np.asarray(r).astype(promote.to_real(x.dtype))


@kernel("aten._fft_c2c.default")
def fft_c2c(self: np.ndarray, dim: Sequence[int], normalization: int, forward: bool) -> np.ndarray:
    x = tensor(self)
    if x.dtype.kind != "c":
        raise refuse("aten._fft_c2c", f"expects a complex input, got {x.dtype}")
    dims = _fft_dims(x, dim, "aten._fft_c2c")
    if forward:
        r = np.fft.fftn(x, axes=dims, norm=_FORWARD_NORM[int(normalization)])
    else:
        r = np.fft.ifftn(x, axes=dims, norm=_INVERSE_NORM[int(normalization)])
    return np.asarray(r).astype(x.dtype)


@kernel("aten.linalg_vector_norm.default")
def vector_norm(self: np.ndarray, ord: Any = 2, dim: Any = None, keepdim: bool = False, *, dtype: Any = None) -> np.ndarray:  # noqa: A002
    from ._common import norm_dims, np_dtype

    x = tensor(self)
    out = np_dtype(dtype) or promote.to_real(x.dtype)
    if promote.category(x.dtype) <= promote.INT:
        raise refuse("aten.linalg_vector_norm", f"expected a floating point or complex tensor, got {x.dtype}")
    dims = norm_dims(dim, x.ndim, "aten.linalg_vector_norm")
    compute = promote.opmath(promote.to_real(out))
    with quiet():
        a = np.abs(x).astype(compute)
        p = float(ord)
        if p == np.inf:
            r = np.max(a, axis=dims, keepdims=keepdim) if a.size else np.zeros(())
        elif p == -np.inf:
            r = np.min(a, axis=dims, keepdims=keepdim)
        elif p == 0:
            r = np.sum(a != 0, axis=dims, keepdims=keepdim).astype(compute)
        elif p == 1:
            r = np.sum(a, axis=dims, keepdims=keepdim)
        elif p == 2:
            r = np.sqrt(np.sum(a * a, axis=dims, keepdims=keepdim))
        else:
            r = np.sum(a**p, axis=dims, keepdims=keepdim) ** (1.0 / p)
    return promote.cast(r, out)


@kernel("aten.dist.default")
def dist(self: np.ndarray, other: np.ndarray, p: Any = 2) -> np.ndarray:
    rt = promote.result_type(self, other)
    if promote.category(rt) < promote.FLOAT:
        raise refuse("aten.dist", f"expected floating point inputs, got {rt}")
    with quiet():
        diff = promote.cast(self, promote.opmath(rt)) - promote.cast(other, promote.opmath(rt))
    return promote.cast(vector_norm(diff, p), promote.to_real(rt))
