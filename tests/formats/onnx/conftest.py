from __future__ import annotations

import os
import shutil

import pytest

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")
NAMES = ("mlp_ext", "cnn", "cond", "legacy", "half")


@pytest.fixture(scope="session")
def onnx():
    return pytest.importorskip("onnx", reason="the onnx package parses ONNX models (optional extra)")


@pytest.fixture(scope="session")
def ort():
    return pytest.importorskip("onnxruntime", reason="onnxruntime is the oracle that runs rewritten models")


@pytest.fixture
def fixtures_copy(tmp_path):
    """A writable copy of the committed fixtures (models and external data)."""
    dst = tmp_path / "fx"
    shutil.copytree(FIXTURES, dst, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    return dst


def fixture_path(name: str) -> str:
    return os.path.join(FIXTURES, f"{name}.onnx")
