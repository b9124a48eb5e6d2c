"""Kernels for third-party custom operators: the plugin registry.

A ``.pt2`` records a custom operator (``torch.library.custom_op("mylib::scale", ...)``)
by name only (``torch.ops.mylib.scale.default``); its schema and its Python body stay in
the library that defined it. The interpreter runs such a node only when a plugin gave it a
NumPy kernel here, together with the schema it implements, in torch's own spelling:

    >>> import numpy as np
    >>> from torchless.interp.custom_ops import custom_op
    >>> @custom_op("mylib::scale", "(Tensor x, float factor=2.0) -> Tensor")
    ... def scale(x, factor=2.0):
    ...     return x * np.asarray(factor, x.dtype)

The schema decides how the node's ``args``/``kwargs`` bind to the kernel's parameters
(by name: positional and keyword calls both reach the kernel as keywords) and which
arguments the operator mutates (``Tensor(a!) x``: what ``auto_functionalized`` returns
after the outputs). A node whose arguments do not fit the schema is refused with the schema
in the message. A custom operator without a plugin is refused by name before anything runs,
like every operator without a kernel (:func:`torchless.interp.interpreter.check_kernels`).

The plugins torchless ships are the modules of :data:`PLUGIN_MODULES` (defined in
:mod:`.registry`, imported after the kernel modules); :func:`plugins` lists what is registered (docs/interpreter.md,
"Custom operators").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..core.errors import FormatError, UnsupportedError, UsageError
from ..graph.schema import OpSchema, parse_schema
from . import registry
from .registry import PLUGIN_MODULES

__all__ = ["PLUGIN_MODULES", "CustomOp", "custom_op", "plugins"]

#: namespaces whose operators are torch's own: their kernels are not plugins
_RESERVED = frozenset({"aten", "prims", "higher_order", "_operator", "math", "torch", "builtins"})


@dataclass(frozen=True)
class CustomOp:
    """One registered plugin: the operator's schema, its kernel and where the operator
    comes from (for the docs and error messages)."""

    schema: OpSchema
    fn: Callable[..., Any]
    origin: str

    @property
    def key(self) -> str:
        return self.schema.key


_PLUGINS: dict[str, CustomOp] = {}


def _full_schema(name: str, schema: str) -> OpSchema:
    if not isinstance(name, str) or "::" not in name:
        raise UsageError(f"a custom operator is named 'namespace::name', got {name!r}")
    ns = name.split("::", 1)[0]
    if ns in _RESERVED:
        raise UsageError(f"{name}: namespace {ns!r} is torch's own; a plugin registers a third-party operator")
    text = schema.strip()
    parsed = parse_schema(f"{name}{text}" if text.startswith("(") else text)
    if parsed.qualified_name != name:
        raise UsageError(f"the schema names {parsed.qualified_name}, the plugin {name}")
    return parsed


def custom_op(name: str, schema: str, *, origin: str = "") -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register the decorated NumPy function as the kernel of custom operator ``name``.

    Args:
        name: ``namespace::name`` or ``namespace::name.overload``, as given to
            ``torch.library.custom_op`` (the graph's key is ``namespace.name.default``).
        schema: the operator's schema, ``(Tensor input, Tensor weight) -> Tensor`` (as
            ``custom_op``'s ``schema=`` or ``torch.library.infer_schema`` spell it), or a
            full ``namespace::name(...) -> ...`` schema.
        origin: where the operator is defined (``transformers 5.x, integrations/moe.py``).

    The kernel receives every argument by its schema name (defaults the graph omits are
    the kernel's Python defaults), tensors as NumPy arrays, as every kernel does
    (:mod:`torchless.interp.registry`); it returns a NumPy array per ``Tensor`` result (a
    tuple for several) and writes its ``Tensor(a!)`` arguments in place.

    Raises:
        UsageError: a malformed name, a torch namespace, a schema naming another operator,
            or a second plugin for the same operator.
        FormatError: the schema does not parse.
    """
    parsed = _full_schema(name, schema)

    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        key = parsed.key
        if key in _PLUGINS:
            raise UsageError(f"two plugins for {parsed.qualified_name}: {_PLUGINS[key].fn.__module__} and {fn.__module__}")
        nret = len(parsed.returns)

        def run(*args: Any, **kwargs: Any) -> Any:
            try:
                bound = parsed.bind(args, kwargs)
            except FormatError as e:
                raise UnsupportedError(f"{key}: the node's arguments do not fit the plugin's schema {parsed}: {e}") from None
            out = fn(**bound)
            if nret == 0 and (out is None or out == ()):
                return None  # as torch's operator returns for ``-> ()``
            if nret == 1 and not parsed.returns_tuple:
                return np.asarray(out) if isinstance(out, np.generic) else out
            if not isinstance(out, (tuple, list)) or len(out) != nret:
                raise UnsupportedError(f"{key}: the plugin returned {type(out).__name__}, its schema {nret} results")
            return tuple(out)

        run.__name__ = getattr(fn, "__name__", key)
        run.__qualname__ = getattr(fn, "__qualname__", key)
        run.__module__ = fn.__module__
        run.__doc__ = fn.__doc__
        registry.kernel(key, mutates=tuple(a.name for a in parsed.arguments if a.is_write))(run)
        _PLUGINS[key] = CustomOp(parsed, fn, origin)
        return fn

    return register


def plugins() -> dict[str, CustomOp]:
    """Graph key (``transformers.grouped_mm_fallback.default``) -> its plugin, for every
    custom operator with a kernel (the shipped plugins loaded first)."""
    registry.load_kernels()
    return dict(_PLUGINS)
