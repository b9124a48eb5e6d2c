"""Session fixture: AOTInductor packages compiled on CPU by ``gen_packages.py``.

Compiling needs torch and a C++ compiler (``$CXX`` or ``g++``, what torch's cpp_builder
uses); without either the tests that need packages skip with the reason. The packages are
built once per session in a subprocess (its own ``TORCHINDUCTOR_CACHE_DIR``, so the
user's cache and this process's inductor state are untouched) and kept in pytest's cache
folder keyed by the generator script and torch version, so reruns skip the compile.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
GEN = HERE / "gen_packages.py"


def compiler() -> str | None:
    return shutil.which(os.environ.get("CXX", "g++"))


@pytest.fixture(scope="session")
def aoti_packages(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Folder with ``<variant>.pt2``, ``export.pt2``, ``sd.pt`` and ``status.json``."""
    torch = pytest.importorskip("torch", reason="torch compiles the packages (the oracle)")
    if compiler() is None:
        pytest.skip(f"no C++ compiler ({os.environ.get('CXX', 'g++')}) found: AOTInductor cannot compile here")
    key = hashlib.sha256(GEN.read_bytes() + torch.__version__.encode()).hexdigest()[:16]
    cache = getattr(request.config, "cache", None)
    out = Path(cache.mkdir(f"torchless-aoti-{key}")) if cache is not None else tmp_path_factory.mktemp("aoti")
    if not (out / "status.json").exists():
        inductor_dir = tmp_path_factory.mktemp("aoti-inductor-cache")
        env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(inductor_dir))
        proc = subprocess.run([sys.executable, str(GEN), str(out)], env=env, capture_output=True, text=True, timeout=1800)
        if proc.returncode != 0 or not (out / "status.json").exists():
            shutil.rmtree(out, ignore_errors=True)
            pytest.fail(f"gen_packages.py failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return out


@pytest.fixture
def package(aoti_packages: Path, request: pytest.FixtureRequest) -> Path:
    """The package of the variant named by indirect parametrization (skips if it failed)."""
    name = request.param
    status = json.loads((aoti_packages / "status.json").read_text())
    if status.get(name) != "ok":
        pytest.skip(f"torch could not build the {name!r} package here: {status.get(name)}")
    return aoti_packages / f"{name}.pt2"


@pytest.fixture(scope="session")
def state_dict(aoti_packages: Path):  # type: ignore[no-untyped-def]
    import torch

    return torch.load(aoti_packages / "sd.pt")
