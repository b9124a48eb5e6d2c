"""Shared fixtures for the torchless test suite.

Helpers that several test files import live in ``tl_testutil.py`` next to this file.
"""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="session")
def torch():
    """torch 2.13 as the oracle; tests that need it skip where it is not installed."""
    return pytest.importorskip("torch", reason="torch is the differential oracle; not installed")
