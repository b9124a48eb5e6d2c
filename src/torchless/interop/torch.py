"""Zero-copy conversion between torchless tensors and torch tensors.

The only module of torchless that imports torch, and only when one of its functions is
called. torch is an optional dependency (``pip install torchless[torch]``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..core.dtypes import by_name
from ..core.errors import UnsupportedError
from ..core.tensor import JaggedTensor, NestedTensor, SparseTensor, Storage, Tensor
from ..core.values import Device, Size

__all__ = ["from_torch", "from_torch_value", "to_torch", "torch_available"]


def torch_available() -> bool:
    """True when torch can be imported (without importing it)."""
    import importlib.util

    return importlib.util.find_spec("torch") is not None


def _torch() -> Any:
    try:
        import torch
    except ImportError:  # pragma: no cover - depends on the environment
        raise UnsupportedError("torch is not installed", hint="pip install 'torchless[torch]'") from None
    return torch


def from_torch(t: Any, *, share: dict[int, Any] | None = None) -> Tensor:
    """A torchless Tensor viewing a CPU torch tensor's storage (no copy).

    Tensors that share a torch storage share one torchless Storage when the same
    ``share`` dict is passed to every call.

    Quantized tensors keep their integer storage and quantizer (per-tensor and
    per-channel schemes); Python attributes set on the tensor (``t.__dict__``) are kept
    in ``attrs``.

    Raises:
        UnsupportedError: sparse or nested tensors (torchless reads them from files but
            does not convert them from torch objects).
    """
    torch = _torch()
    if t.is_sparse or t.layout != torch.strided or getattr(t, "is_nested", False):
        raise UnsupportedError(f"from_torch of layout {t.layout}")
    dtype = by_name(str(t.dtype))
    attrs = dict(getattr(t, "__dict__", None) or {})
    quantizer = _quantizer(torch, t, share) if t.is_quantized else None
    if t.device.type == "meta":
        out = Tensor(
            None, dtype, tuple(t.shape), tuple(t.stride()), 0, requires_grad=t.requires_grad, device="meta", quantizer=quantizer
        )
        out.is_parameter = isinstance(t, torch.nn.Parameter)
        out.attrs.update(attrs)
        return out
    if t.device.type != "cpu":
        t = t.cpu()
    us = t.untyped_storage()
    # one storage per torch storage object (torch.save's key: the StorageImpl, ``_cdata``;
    # empty ones too, which all have data pointer 0); each entry holds the torch storage
    # too, so that its key is not reused by another while the cache lives
    key = us._cdata
    cache = share if share is not None else {}
    hit = cache.get(key)
    if hit is not None:
        st = hit[0]
    else:
        raw = torch.empty(0, dtype=torch.uint8).set_(us).numpy() if us.nbytes() else np.zeros(0, np.uint8)
        st = Storage("", us.nbytes(), dtype, "cpu", data=raw.data if raw.nbytes else b"")
        cache[key] = (st, us)
    md = {}
    if t.is_conj():
        md["conj"] = True
    if t.is_neg():
        md["neg"] = True
    out = Tensor(
        st,
        dtype,
        tuple(t.shape),
        tuple(t.stride()),
        t.storage_offset(),
        requires_grad=t.requires_grad,
        metadata=md,
        quantizer=quantizer,
    )
    out.is_parameter = isinstance(t, torch.nn.Parameter)
    out.attrs.update(attrs)
    return out


def _quantizer(torch: Any, t: Any, share: Any) -> dict[str, Any]:
    scheme = str(t.qscheme())[len("torch.") :]
    if scheme in ("per_tensor_affine", "per_tensor_symmetric"):
        return {"qscheme": scheme, "scale": float(t.q_scale()), "zero_point": int(t.q_zero_point())}
    return {
        "qscheme": scheme,
        "scales": from_torch(t.q_per_channel_scales().contiguous(), share=share),
        "zero_points": from_torch(t.q_per_channel_zero_points().contiguous(), share=share),
        "axis": int(t.q_per_channel_axis()),
    }


def to_torch(t: Tensor) -> Any:
    """A torch tensor sharing the torchless tensor's bytes where possible.

    Zero-copy for strided tensors whose storage is in memory or memory-mapped (the
    result is read-only memory: torch warns if you write to it). conj/neg bits are set
    on the result as torch would after ``torch.load``.
    """
    torch = _torch()
    tdtype = getattr(torch, t.dtype.name)
    if t.storage is None:
        return torch.empty_strided(t.shape, t.stride(), dtype=tdtype, device="meta")
    raw = np.frombuffer(t.storage.native_bytes(), dtype=np.uint8)  # a swapped copy for the other byte order
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # read-only buffer warning
        base = torch.frombuffer(raw, dtype=torch.uint8) if raw.size else torch.empty(0, dtype=torch.uint8)
    typed = base.view(tdtype) if t.storage.nbytes else torch.empty(0, dtype=tdtype)
    out = typed.as_strided(t.shape, t.stride(), t.storage_offset())
    if t.metadata.get("conj"):
        out = out.conj()
    if t.metadata.get("neg"):
        out = out._neg_view()
    if t.requires_grad and out.is_floating_point():
        out.requires_grad_(True)
    if t.is_parameter:
        out = torch.nn.Parameter(out, requires_grad=t.requires_grad)
    return out


def _from_torch_jagged(x: Any, share: dict[int, Any] | None) -> JaggedTensor:
    """A torch jagged-layout nested tensor as its components (what it pickles)."""
    if isinstance(x, _torch().nn.Parameter):
        raise UnsupportedError("a Parameter over a jagged nested tensor")
    cache = x._metadata_cache or {}
    if not set(cache) <= {"min_seqlen", "max_seqlen"}:
        raise UnsupportedError("a jagged nested tensor metadata cache entry", found=sorted(cache))
    lengths = x._lengths
    jt = JaggedTensor(
        from_torch(x._values.detach(), share=share),
        from_torch(x._offsets, share=share),
        None if lengths is None else from_torch(lengths, share=share),
        int(x._ragged_idx),
        # torch caches a length n as the shape of zeros(n, 0)
        min_seqlen=int(cache["min_seqlen"].shape[0]) if "min_seqlen" in cache else None,
        max_seqlen=int(cache["max_seqlen"].shape[0]) if "max_seqlen" in cache else None,
        requires_grad=bool(x.requires_grad),
    )
    jt.attrs = {k: v for k, v in vars(x).items() if k not in JaggedTensor.TORCH_OWN_STATE}
    return jt


def from_torch_value(x: Any, *, share: dict[int, Any] | None = None) -> Any:
    """Any torch object a checkpoint holds as its torchless counterpart: strided tensors
    through :func:`from_torch`, sparse (COO, CSR, CSC, BSR, BSC) and nested tensors as
    their components, dtypes, ``torch.Size`` and devices as torchless values; anything
    else is returned unchanged."""
    torch = _torch()
    if isinstance(x, torch.Tensor):
        if getattr(x, "is_nested", False):
            if x.layout == torch.jagged:
                return _from_torch_jagged(x, share)
            param = isinstance(x, torch.nn.Parameter)
            flag, attrs = bool(x.requires_grad), dict(getattr(x, "__dict__", None) or {})
            if param:  # torch pickles a Parameter's data (detached) inside _rebuild_parameter
                x = x.detach()
            sizes, strides = x._nested_tensor_size(), x._nested_tensor_strides()
            tl_sizes = from_torch(sizes, share=share)
            # (one tensor object for both when torch gives one: components of 0 dimensions)
            tl_strides = tl_sizes if strides is sizes else from_torch(strides, share=share)
            nt = NestedTensor(
                from_torch(x.values(), share=share),
                tl_sizes,
                tl_strides,
                from_torch(x._nested_tensor_storage_offsets(), share=share),
            )
            nt.is_parameter, nt.requires_grad, nt.attrs = param, flag, attrs
            return nt
        layout = str(x.layout)[len("torch.") :]
        if layout == "sparse_coo":
            return SparseTensor(
                layout,
                tuple(x.shape),
                {"indices": from_torch(x._indices(), share=share), "values": from_torch(x._values(), share=share)},
                x.is_coalesced(),
            )
        if layout in ("sparse_csr", "sparse_bsr"):
            comp, plain = x.crow_indices(), x.col_indices()
        elif layout in ("sparse_csc", "sparse_bsc"):
            comp, plain = x.ccol_indices(), x.row_indices()
        else:
            return from_torch(x, share=share)
        return SparseTensor(
            layout,
            tuple(x.shape),
            {
                "compressed_indices": from_torch(comp, share=share),
                "plain_indices": from_torch(plain, share=share),
                "values": from_torch(x.values(), share=share),
            },
        )
    if isinstance(x, torch.dtype):
        return by_name(str(x))
    if isinstance(x, torch.Size):
        return Size(tuple(x))
    if isinstance(x, torch.device):
        return Device(str(x))
    return x
