"""Shared fixtures for the torchless test suite.

Helpers that several test files import live in ``tl_testutil.py`` next to this file.
"""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# TORCHLESS_GENERAL_PATHS=1 runs the whole suite on the general code only (the pickle
# machine opcode by opcode, the central directory entry by entry, ...): torchless reads it
# once, into torchless.core.settings.SETTINGS; each fast path's own tests compare it with
# the general code on the same inputs in every run


@pytest.fixture(scope="session")
def torch():
    """torch 2.13 as the oracle; tests that need it skip where it is not installed."""
    return pytest.importorskip("torch", reason="torch is the differential oracle; not installed")


@pytest.fixture(autouse=True)
def _no_internal_errors(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch):
    """Fail any test during which torchless raised an InternalError (a bug), even when the
    test, or torchless itself (the scanner turns errors into findings), swallowed it as
    one more TorchlessError. Tests about InternalError itself are marked
    ``allows_internal_error``."""
    if request.node.get_closest_marker("allows_internal_error"):
        yield
        return
    from torchless.core.errors import InternalError

    seen: list[str] = []
    real_init = InternalError.__init__

    def init(self, message, **kw):  # noqa: ANN001
        seen.append(message)
        real_init(self, message, **kw)

    monkeypatch.setattr(InternalError, "__init__", init)
    yield
    if seen:
        pytest.fail(f"torchless raised {len(seen)} InternalError(s) (bugs, whatever caught them): {seen[:3]}")
