"""CPU autocast, for the ops of an enabled ``wrap_with_autocast`` region.

Inside ``torch.autocast("cpu", dtype)`` torch casts the floating-point (not float64)
tensor arguments of some operators before running them (``aten/src/ATen/autocast_mode.cpp``,
the ``AutocastCPU`` registrations): to the autocast dtype for the "lower precision" ops
(matmuls, convolutions, ``linear``, ``scaled_dot_product_attention``...), to float32 for
the "fp32" ops (losses, some pools and pads, linear algebra, FFTs), and to the widest
floating type among the arguments for the "promote" ops (``cat``, ``stack``,
``index_copy``). Every other operator runs on its inputs as they are. :func:`cast_args`
applies the rule to one call; the interpreter consults :data:`STATE` for every node while
a region is active.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any

import numpy as np

__all__ = ["STATE", "LOWER_PRECISION", "FP32", "PROMOTE", "cast_args", "policy_of"]

#: the autocast NumPy dtype while an enabled CPU region runs, else None
STATE: ContextVar[Any] = ContextVar("torchless_autocast", default=None)


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


LOWER_PRECISION = _words(
    """
    conv1d conv2d conv3d bmm mm linalg_vecdot baddbmm addmm addbmm linear _convolution matmul conv_tbc
    mkldnn_rnn_layer conv_transpose1d conv_transpose2d conv_transpose3d prelu
    scaled_dot_product_attention _native_multi_head_attention
    """
)
FP32 = _words(
    """
    avg_pool3d binary_cross_entropy grid_sampler polar prod quantile nanquantile stft cdist trace
    view_as_complex cholesky cholesky_inverse cholesky_solve inverse lu_solve orgqr ormqr pinverse
    max_pool3d max_unpool2d max_unpool3d adaptive_avg_pool3d reflection_pad1d reflection_pad2d
    replication_pad1d replication_pad2d replication_pad3d mse_loss cosine_embedding_loss nll_loss
    nll_loss2d hinge_embedding_loss poisson_nll_loss smooth_l1_loss cross_entropy_loss l1_loss
    huber_loss margin_ranking_loss soft_margin_loss triplet_margin_loss multi_margin_loss ctc_loss
    kl_div multilabel_margin_loss binary_cross_entropy_with_logits fft_fft fft_ifft fft_fft2 fft_ifft2
    fft_fftn fft_ifftn fft_rfft fft_irfft fft_rfft2 fft_irfft2 fft_rfftn fft_irfftn fft_hfft fft_ihfft
    linalg_cond linalg_matrix_rank linalg_solve linalg_cholesky linalg_svdvals linalg_eigvals
    linalg_eigvalsh linalg_inv linalg_householder_product linalg_tensorinv linalg_tensorsolve
    fake_quantize_per_tensor_affine geqrf _lu_with_info qr svd triangular_solve fractional_max_pool2d
    fractional_max_pool3d adaptive_max_pool3d multilabel_margin_loss_forward linalg_qr
    linalg_cholesky_ex linalg_svd linalg_eig linalg_eigh linalg_lstsq linalg_inv_ex
    """
)
PROMOTE = frozenset(("stack", "cat", "index_copy"))


def policy_of(op_name: str) -> str | None:
    """``"lower"``, ``"fp32"``, ``"promote"`` or None for an operator's short name (``linear``)."""
    if op_name in LOWER_PRECISION:
        return "lower"
    if op_name in FP32:
        return "fp32"
    if op_name in PROMOTE:
        return "promote"
    return None


def _floating(a: Any) -> bool:
    if not isinstance(a, np.ndarray):
        return False
    return a.dtype.kind == "f" or a.dtype.name in ("bfloat16",) or a.dtype.name.startswith("float8")


def _cast(v: Any, dt: Any) -> Any:
    if isinstance(v, np.ndarray):
        return v.astype(dt) if _floating(v) and v.dtype != np.float64 and v.dtype != dt else v
    if isinstance(v, (list, tuple)):
        return type(v)(_cast(x, dt) for x in v)
    return v


def _has_float32(vals: Any) -> bool:
    for v in vals:
        if isinstance(v, (list, tuple)):
            if _has_float32(v):
                return True
        elif isinstance(v, np.ndarray) and v.dtype == np.float32:
            return True
    return False


def cast_args(op_name: str, args: tuple[Any, ...], kwargs: dict[str, Any], dtype: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``args``/``kwargs`` as autocast hands them to ``op_name`` in a region of ``dtype``."""
    policy = policy_of(op_name)
    if policy is None:
        return args, kwargs
    if policy == "lower":
        dt = dtype
    elif policy == "fp32":
        dt = np.dtype(np.float32)
    else:
        dt = np.dtype(np.float32) if _has_float32((*args, *kwargs.values())) else dtype
    return tuple(_cast(a, dt) for a in args), {k: _cast(v, dt) for k, v in kwargs.items()}
