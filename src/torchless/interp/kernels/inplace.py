"""The in-place variants (``acos_``, ``cumsum_``, ``scatter_``, ``addmm_``...) of kernels of
every family, registered after them all (:data:`torchless.interp.registry.KERNEL_MODULES`
lists this module last): each runs the out-of-place kernel and writes the result into
``self`` through :func:`.elementwise.inplace` (torch's refusals of a result type ``self``
cannot hold, or of a broadcast that would grow it).

Not here: the in-place ops that change ``self``'s shape or strides (``squeeze_``,
``unsqueeze_``, ``t_``, ``as_strided_``: a NumPy array's shape is not writable through
a view), and ``pow_.Scalar`` (whose schema is not ``pow.Scalar``'s).
"""

from __future__ import annotations

# the modules whose kernels get in-place variants here, imported for their registrations
# (so importing this module alone works too)
from . import index, linalg, nn_misc, reduce  # noqa: F401
from .elementwise import inplace

_VARIANTS = {
    "default": "acos acosh asin asinh atan atanh cosh sinh tan exp2 expm1 log10 log1p log2 erfinv sgn hypot "
    "conj_physical cumsum cumprod addmm addbmm masked_scatter scatter_add alpha_dropout feature_alpha_dropout",
    "Tensor": "clamp_max clamp_min",
    "Scalar": "floor_divide",
    "decimals": "round",
    "src": "scatter",
    "value": "scatter",
    "reduce": "scatter",
    "value_reduce": "scatter",
    "two": "scatter_reduce",
}

for _overload, _names in _VARIANTS.items():
    for _name in _names.split():
        inplace(f"aten.{_name}.{_overload}")
