"""ExportedProgram archives (``torch.export.save`` / ``.pt2``): read, verify, write.

The names below are imported on first use (PEP 562), so detecting a file's format does not
pay for the schema and graph modules.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["InputSpec", "OpaqueObject", "OutputSpec", "Program", "Pt2Archive", "Signature", "read_pt2", "save_pt2"]

_WHERE = {"save_pt2": ".write"}


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module(_WHERE.get(name, ".read"), __name__), name)
    raise AttributeError(name)
