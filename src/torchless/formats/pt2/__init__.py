"""ExportedProgram archives (``torch.export.save`` / ``.pt2``): read, verify, write.

The names below are imported on first use (PEP 562), so detecting a file's format does not
pay for the schema and graph modules.
"""

from __future__ import annotations

from typing import Any

from ...core.lazy import lazy_exports

__all__ = ["InputSpec", "OpaqueObject", "OutputSpec", "Program", "Pt2Archive", "Signature", "read_pt2", "save_pt2"]

_lazy = lazy_exports(__name__, {**{n: f".read:{n}" for n in __all__}, "save_pt2": ".write:save_pt2"})


def __getattr__(name: str) -> Any:
    return _lazy(name)
