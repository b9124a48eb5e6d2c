"""Reusable test suites for code that extends torchless.

:mod:`torchless.testing.handlers` is the format handler conformance suite: every
registered handler, torchless's own and a third party's, must pass it. Nothing here
imports torch at import time; the oracles import it (or ``onnx``, ``safetensors``...)
when they run, and a missing one skips the check (:class:`ConformanceSkip`).

Example:
    >>> from torchless.testing import CHECKS, conformance          # doctest: +SKIP
    >>> entry = conformance("safetensors")                          # doctest: +SKIP
"""

from __future__ import annotations

from .handlers import (
    CHECKS,
    Conformance,
    ConformanceSkip,
    Expected,
    Sample,
    capabilities,
    conformance,
    conformance_entries,
    missing_entries,
    register_conformance,
    run_check,
)

__all__ = [
    "CHECKS",
    "Conformance",
    "ConformanceSkip",
    "Expected",
    "Sample",
    "capabilities",
    "conformance",
    "conformance_entries",
    "missing_entries",
    "register_conformance",
    "run_check",
]
