"""The torchless version (one place: the package, the CLI's ``--version`` and SARIF reports
read it from here, so lower layers need not import the top-level package)."""

from __future__ import annotations

__all__ = ["__version__"]

__version__ = "0.1.0"
