"""Deferred imports: the one mechanism torchless uses to import a module on first use.

Detection imports every format handler to ask whether it recognizes a file, and the CLI
answers in a fraction of the time ``import torch`` takes; so heavy modules are imported
when they are first needed, in one of three ways, all of them here:

* :class:`LazyModule`: a module imported on first attribute access (a handler keeps its
  reader behind one);
* :func:`lazy_exports`: a package's PEP 562 ``__getattr__`` naming where each public name
  lives (``torchless.scan``, ``torchless.formats.pt2.Pt2Archive``);
* :func:`import_modules`: a registry's list of modules that register themselves when
  imported (format handlers, CLI commands).

``tests/test_architecture.py`` reads the module names given to these as imports, so a
deferred import obeys the layer order like any other.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterable, Mapping
from types import ModuleType
from typing import Any

__all__ = ["LazyModule", "import_modules", "lazy_exports"]


class LazyModule:
    """A module imported when one of its attributes is first used.

    Example:
        >>> _read = LazyModule("torchless.formats.pt2.read")   # nothing imported yet
        >>> _read.Pt2Archive                                   # doctest: +SKIP
    """

    __slots__ = ("_name", "_module")

    def __init__(self, name: str) -> None:
        self._name = name
        self._module: ModuleType | None = None

    def __getattr__(self, attr: str) -> Any:
        mod = self._module
        if mod is None:
            mod = self._module = importlib.import_module(self._name)
        return getattr(mod, attr)

    def __repr__(self) -> str:
        return f"<lazy module {self._name}>"


def lazy_exports(package: str, exports: Mapping[str, str]) -> Callable[[str], Any]:
    """The body of a package's PEP 562 ``__getattr__``: each public name imported on first use.

    Args:
        package: the package's ``__name__``.
        exports: public name -> ``"module:attribute"`` (that attribute of the module) or
            ``"module"`` (the module itself); a module name starting with ``.`` is relative
            to ``package``.

    Returns:
        ``getattr(name)``: the value, also stored in the package so the next access is a
        plain attribute; ``AttributeError`` for any other name.

    Example:
        >>> _lazy = lazy_exports(__name__, {"read_pt2": ".read:read_pt2"})  # doctest: +SKIP
        >>> def __getattr__(name):                                           # doctest: +SKIP
        ...     return _lazy(name)
    """

    def getattr_(name: str) -> Any:
        where = exports.get(name)
        if where is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        mod_name, _, attr = where.partition(":")
        mod = importlib.import_module(mod_name, package)
        value = getattr(mod, attr) if attr else mod
        setattr(sys.modules[package], name, value)
        return value

    return getattr_


def import_modules(names: Iterable[str]) -> list[ModuleType]:
    """Import each module in ``names`` (in order) and return them: a registry's plug-ins,
    which register themselves when imported."""
    return [importlib.import_module(n) for n in names]
