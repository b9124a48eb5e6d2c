"""One NumPy kernel per operator: the registry the interpreter dispatches through.

Keys are :attr:`torchless.graph.ir.OpRef.key` strings: ``aten.add.Tensor``,
``aten.relu.default``, ``higher_order.cond``, ``_operator.add``, ``math.trunc``,
``torch.sym_int``. A kernel registers itself with :func:`kernel`; the modules named in
:data:`KERNEL_MODULES` are imported (by :func:`load_kernels`) the first time the
interpreter needs a kernel, so ``import torchless`` pays nothing. A new kernel module is
added to that list.

The calling convention (the same for every kernel):

* A kernel is called with the node's ``args`` and ``kwargs`` as the graph records them,
  each graph value replaced by what it computed. Defaults the graph omits are the
  schema's defaults, spelled as Python defaults of the kernel.
* A tensor is a ``numpy.ndarray`` of the torch dtype's NumPy type (``ml_dtypes`` for
  bfloat16 and the float8 types). A 0-d ``ndarray`` is a tensor; a Python ``bool``/``int``/
  ``float``/``complex`` is a Scalar or SymInt/SymFloat/SymBool. The two promote differently
  (torch's rules), so a kernel never returns a NumPy scalar (``np.float32(1)``) where the
  schema says ``Tensor``: the interpreter converts one with ``np.asarray`` and counts it a
  bug to fix in the kernel.
* ``ScalarType`` arguments arrive as :class:`torchless.core.dtypes.DType`; ``Device``,
  ``Layout`` and ``MemoryFormat`` as the value types of :mod:`torchless.core.values`.
* A view op returns a NumPy view where torch returns a view, so in-place ops on a view
  (``copy_``, ``add_`` in training IR) write through as they do in torch.
* A kernel that cannot honour an argument raises :class:`~torchless.core.errors.UnsupportedError`
  naming the op and the argument, never a wrong answer.
* A kernel of a mutating operator writes into its mutable arguments in place. For a custom
  operator (whose schema a ``.pt2`` does not hold), ``kernel(key, mutates=("x",))`` names
  them, in schema order: ``auto_functionalized`` (v1) returns their new values after the
  operator's outputs, so it needs to know which they are (ATen operators' come from their
  schemas).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..core.errors import InternalError, UnsupportedError
from ..core.lazy import import_modules

#: the kernel modules, each registering its kernels when imported.
KERNEL_MODULES: list[str] = [
    "torchless.interp.kernels.python_ops",
    "torchless.interp.kernels.symbolic",
    "torchless.interp.kernels.control_flow",
    "torchless.interp.kernels.elementwise",
    "torchless.interp.kernels.bitwise",
    "torchless.interp.kernels.tensor_ops",
    "torchless.interp.kernels.reduce",
    "torchless.interp.kernels.shape",
    "torchless.interp.kernels.index",
    "torchless.interp.kernels.create",
    "torchless.interp.kernels.linalg",
    "torchless.interp.kernels.spectral",
    "torchless.interp.kernels.nn_conv",
    "torchless.interp.kernels.nn_pool",
    "torchless.interp.kernels.nn_norm",
    "torchless.interp.kernels.nn_misc",
    "torchless.interp.kernels.nn_sample",
    "torchless.interp.kernels.nn_rnn",
    "torchless.interp.kernels.zoo_ops",
    "torchless.interp.kernels.inplace",  # last: in-place variants of the kernels above
]

#: the custom-operator plugins shipped with torchless (:mod:`torchless.interp.custom_ops`),
#: imported after the kernel modules
PLUGIN_MODULES: list[str] = [
    "torchless.interp.kernels.custom_transformers",
]

Kernel = Callable[..., Any]

_KERNELS: dict[str, Kernel] = {}
#: key -> a cheaper kernel for nodes whose tuple result is only ever read at index 0 (such as
#: max pooling's values without its indices); it returns the same tuple with None elsewhere
_FIRST_ONLY: dict[str, Kernel] = {}
#: key -> the arguments the operator mutates, as its kernel declared them (custom operators)
_MUTATES: dict[str, tuple[str, ...]] = {}
_LOADED = False


def kernel(*keys: str, mutates: Sequence[str] | None = None) -> Callable[[Kernel], Kernel]:
    """Register the decorated function as the kernel of each of ``keys``; ``mutates`` names
    the arguments the operator writes in place (in schema order), for an operator whose
    schema torchless does not have (a custom operator)."""

    def register(fn: Kernel) -> Kernel:
        for key in keys:
            if key in _KERNELS and _KERNELS[key] is not fn:
                raise InternalError(f"two kernels for {key}: {_KERNELS[key].__module__} and {fn.__module__}")
            _KERNELS[key] = fn
            if mutates is not None:
                _MUTATES[key] = tuple(mutates)
        return fn

    return register


def mutable_args(key: str) -> tuple[str, ...] | None:
    """The names of the arguments operator ``key`` mutates, in schema order: as its kernel
    declared them, else from the ATen schema; None when neither is known."""
    load_kernels()
    if key in _MUTATES:
        return _MUTATES[key]
    from ..graph.schema import registry as schemas

    s = schemas().find(key)
    return None if s is None else tuple(a.name for a in s.arguments if a.is_write)


def first_only(*keys: str) -> Callable[[Kernel], Kernel]:
    """Register the decorated function as the variant of each of ``keys`` that the
    interpreter runs when only element 0 of the node's tuple result is read."""

    def register(fn: Kernel) -> Kernel:
        for key in keys:
            _FIRST_ONLY[key] = fn
        return fn

    return register


def lookup_first_only(key: str) -> Kernel | None:
    """The variant of ``key`` for nodes read only at index 0, or None."""
    load_kernels()
    return _FIRST_ONLY.get(key)


def load_kernels() -> None:
    """Import every module of :data:`KERNEL_MODULES`, then the custom-operator plugins of
    :data:`PLUGIN_MODULES` (each registers its kernels)."""
    global _LOADED
    if not _LOADED:
        import_modules(KERNEL_MODULES)
        import_modules(PLUGIN_MODULES)
        _LOADED = True


def lookup(key: str) -> Kernel | None:
    """The kernel of ``key``, or None."""
    load_kernels()
    return _KERNELS.get(key)


def require(key: str) -> Kernel:
    """The kernel of ``key``, or an UnsupportedError naming the operator."""
    fn = lookup(key)
    if fn is None:
        raise UnsupportedError(f"the interpreter has no kernel for {key}")
    return fn


def supported() -> frozenset[str]:
    """Every key with a kernel."""
    load_kernels()
    return frozenset(_KERNELS)
