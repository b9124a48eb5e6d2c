"""Plugins for the custom operators Hugging Face transformers registers (5.x).

``transformers::grouped_mm_fallback`` (``integrations/moe.py``): the mixture-of-experts
layers' grouped matrix product when ``torch._grouped_mm`` cannot be used, which is what
``torch.export`` records for float32 experts on CPU (Mixtral, Qwen2-MoE, OLMoE...).
"""

from __future__ import annotations

import numpy as np

from ..custom_ops import custom_op
from ._common import bad, tensor
from .linalg import mm

_OP = "transformers.grouped_mm_fallback"


@custom_op(
    "transformers::grouped_mm_fallback",
    "(Tensor input, Tensor weight, Tensor offs) -> Tensor",
    origin="transformers 5.x, integrations/moe.py (mixture-of-experts layers)",
)
def grouped_mm_fallback(input: np.ndarray, weight: np.ndarray, offs: np.ndarray) -> np.ndarray:
    """Rows ``offs[i-1]:offs[i]`` of ``input`` (sorted by expert) times ``weight[i]``
    (``(experts, in, out)``); rows past the last offset and empty groups stay zero. The
    checks are the operator's fake implementation's; the slices are Python's, as in
    transformers' loop."""
    x, w, o = tensor(input), tensor(weight), tensor(offs)
    if x.ndim != 2 or w.ndim != 3 or o.ndim != 1:
        raise bad(_OP, f"expected a 2-d input, 3-d weight and 1-d offs, got {x.ndim}-d, {w.ndim}-d and {o.ndim}-d")
    if o.shape[0] != w.shape[0]:
        raise bad(_OP, f"offs length {o.shape[0]} must match the number of experts {w.shape[0]}")
    if x.shape[1] != w.shape[1]:
        raise bad(_OP, f"input_dim mismatch: input has {x.shape[1]}, weight has {w.shape[1]}")
    if o.dtype not in (np.int32, np.int64):
        raise bad(_OP, f"offs must be an int32 or int64 tensor, got {o.dtype}")
    out = np.zeros((x.shape[0], w.shape[2]), dtype=x.dtype)
    start = 0
    for i, end in enumerate(o.tolist()):
        if start == end:
            continue
        rows = x[start:end]
        out[start:end] = mm(rows, w[i])
        start = end
    return out
