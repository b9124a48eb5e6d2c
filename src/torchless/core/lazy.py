"""Deferred imports: format handlers must be cheap to import.

Detection imports every format handler to ask whether it recognizes a file, and the CLI
answers in a fraction of the time ``import torch`` takes; so a handler keeps its heavy
reader module behind a :class:`LazyModule`, imported on first attribute access.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

__all__ = ["LazyModule"]


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
