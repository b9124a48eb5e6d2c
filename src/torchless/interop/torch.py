"""Zero-copy conversion between torchless tensors and torch tensors.

The only module of torchless that imports torch, and only when one of its functions is
called. torch is an optional dependency (``pip install torchless[torch]``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..core.dtypes import by_name
from ..core.errors import UnsupportedError
from ..core.tensor import Storage, Tensor

__all__ = ["from_torch", "to_torch", "torch_available"]


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


def from_torch(t: Any, *, share: "dict[int, Storage] | None" = None) -> Tensor:
    """A torchless Tensor viewing a CPU torch tensor's storage (no copy).

    Tensors that share a torch storage share one torchless Storage when the same
    ``share`` dict is passed to every call.

    Raises:
        UnsupportedError: non-CPU, sparse or quantized tensors (convert them in torch first).
    """
    torch = _torch()
    if t.is_sparse or t.layout != torch.strided:
        raise UnsupportedError(f"from_torch of layout {t.layout}")
    if t.is_quantized:
        raise UnsupportedError("from_torch of quantized tensors")
    dtype = by_name(str(t.dtype))
    if t.device.type == "meta":
        out = Tensor(None, dtype, tuple(t.shape), tuple(t.stride()), 0, requires_grad=t.requires_grad, device="meta")
        out.is_parameter = isinstance(t, torch.nn.Parameter)
        return out
    if t.device.type != "cpu":
        t = t.cpu()
    us = t.untyped_storage()
    key = us.data_ptr()
    cache = share if share is not None else {}
    st = cache.get(key)
    if st is None:
        raw = torch.empty(0, dtype=torch.uint8).set_(us).numpy() if us.nbytes() else np.zeros(0, np.uint8)
        st = Storage("", us.nbytes(), dtype, "cpu", data=raw.data if raw.nbytes else b"")
        cache[key] = st
    md = {}
    if t.is_conj():
        md["conj"] = True
    if t.is_neg():
        md["neg"] = True
    out = Tensor(st, dtype, tuple(t.shape), tuple(t.stride()), t.storage_offset(), requires_grad=t.requires_grad, metadata=md)
    out.is_parameter = isinstance(t, torch.nn.Parameter)
    return out


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
    raw = np.frombuffer(t.storage.bytes(), dtype=np.uint8)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # read-only buffer warning
        base = torch.frombuffer(raw, dtype=torch.uint8) if raw.size else torch.empty(0, dtype=torch.uint8)
    if t.storage.byteorder != __import__("sys").byteorder and t.dtype.itemsize > 1:
        base = torch.from_numpy(np.frombuffer(t.storage.bytes(), dtype=t.dtype.storage.newbyteorder(">")).astype(t.dtype.storage.newbyteorder("=")).view(np.uint8).copy())
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
