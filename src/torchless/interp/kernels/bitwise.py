"""The rest of the bitwise and logical families: the Python operators' overloads
(``__and__``, ``__or__``, ``__xor__`` and their in-place ``__iand__``... that ``a & b`` on
tensors records in training IR), ``bitwise_*`` ``Scalar_Tensor`` overloads, the in-place
variants, and the ``int``/``bool`` overloads on SymInts and SymBools.

The tensor kernels are those of :mod:`.elementwise` (one computation per operator family);
this module only registers the other names torch gives them.
"""

from __future__ import annotations

import operator
from typing import Any

import numpy as np

from .. import promote
from ..registry import _KERNELS, kernel
from ._common import bad, refuse
from .elementwise import inplace

_TENSOR_OF = {"__and__": "bitwise_and", "__or__": "bitwise_or", "__xor__": "bitwise_xor"}


def _alias(key: str, *names: str) -> None:
    kernel(*names)(_KERNELS[key])


for _dunder, _bw in _TENSOR_OF.items():
    for _ov in ("Tensor", "Scalar"):
        _alias(f"aten.{_bw}.{_ov}", f"aten.{_dunder}.{_ov}")
        inplace(f"aten.{_bw}.{_ov}", f"aten.__i{_dunder[2:]}.{_ov}")
    inplace(f"aten.{_bw}.Scalar")
for _dunder in ("__lshift__", "__rshift__"):
    for _ov in ("Tensor", "Scalar"):
        inplace(f"aten.{_dunder}.{_ov}", f"aten.__i{_dunder[2:]}.{_ov}")
for _shift in ("bitwise_left_shift", "bitwise_right_shift"):
    for _ov in ("Tensor", "Tensor_Scalar"):
        inplace(f"aten.{_shift}.{_ov}")
inplace("aten.logical_xor.default")


def _scalar_tensor(name: str, fn: Any) -> None:
    @kernel(f"aten.{name}.Scalar_Tensor")
    def k(self: Any, other: np.ndarray) -> np.ndarray:
        rt = promote.result_type(self, other)
        if promote.category(rt) > promote.INT:
            raise refuse(f"aten.{name}", f"not implemented for {rt}")
        return np.asarray(fn(promote.cast(self, rt), promote.cast(other, rt)))

    k.__name__ = name


_scalar_tensor("bitwise_or", np.bitwise_or)
_scalar_tensor("bitwise_xor", np.bitwise_xor)


# -- SymInt / SymBool overloads (Python ints and bools) -----------------------------------


def _python(name: str, fn: Any, overloads: tuple[str, ...]) -> None:
    want = {"int": int, "bool": bool}

    for ov in overloads:

        def k(a: Any, b: Any, _ov: str = ov) -> Any:
            for v in (a, b):
                if not isinstance(v, want[_ov]):
                    raise bad(f"aten.{name}.{_ov}", f"expected {_ov} operands, got {type(v).__name__}")
            if name in ("__lshift__", "__rshift__") and b < 0:
                raise bad(f"aten.{name}.{_ov}", "negative shift count")
            r = fn(a, b)
            return bool(r) if _ov == "bool" else int(r)

        k.__name__ = f"{name}_{ov}"
        kernel(f"aten.{name}.{ov}")(k)


_python("__and__", operator.and_, ("int", "bool"))
_python("__or__", operator.or_, ("int", "bool"))
_python("__xor__", operator.xor, ("int", "bool"))
_python("__lshift__", operator.lshift, ("int",))
_python("__rshift__", operator.rshift, ("int",))
