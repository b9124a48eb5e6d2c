"""Fixtures for the scanner tests: the generated corpora and the corpus helper module."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

CORPUS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")
ENV = "TORCHLESS_SCAN_MARKER_DIR"


def _load(name: str):  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location(f"tl_scan_{name}", os.path.join(CORPUS, f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


@pytest.fixture(scope="session")
def gen():  # type: ignore[no-untyped-def]
    """The malicious-corpus generator module (its pickle assembler and zip builder)."""
    return _load("gen_malicious")


def _has_torch() -> bool:
    return importlib.util.find_spec("torch") is not None


@pytest.fixture(scope="session")
def malicious(tmp_path_factory):  # type: ignore[no-untyped-def]
    """(corpus dir, marker dir, manifest) of the malicious corpus, generated once."""
    out = tmp_path_factory.mktemp("malicious")
    markers = tmp_path_factory.mktemp("markers")
    env = dict(os.environ, **{ENV: str(markers)})
    cmd = [sys.executable, os.path.join(CORPUS, "gen_malicious.py"), str(out)]
    if not _has_torch():
        cmd.append("--no-torch")
    subprocess.run(cmd, check=True, env=env, capture_output=True, timeout=300)
    with open(out / "manifest.json") as f:
        man = json.load(f)
    return out, markers, man


@pytest.fixture(scope="session")
def benign(tmp_path_factory):  # type: ignore[no-untyped-def]
    """(corpus dir, manifest) of the benign corpus (needs torch)."""
    if not _has_torch():
        pytest.skip("the benign corpus is written by torch; not installed")
    out = tmp_path_factory.mktemp("benign")
    subprocess.run([sys.executable, os.path.join(CORPUS, "gen_benign.py"), str(out)], check=True, capture_output=True, timeout=300)
    with open(out / "manifest.json") as f:
        man = json.load(f)
    return out, man
