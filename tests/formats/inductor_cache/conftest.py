"""Session fixture: an Inductor cache made by a real CPU ``torch.compile`` (subprocess).

Kept in pytest's cache folder keyed by the generator and torch version; every test gets
its own copy (``copytree`` keeps mtimes), so pruning tests never touch the original.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

GEN = Path(__file__).parent / "gen_cache.py"


@pytest.fixture(scope="session")
def compiled_cache(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch = pytest.importorskip("torch", reason="torch.compile produces the cache (the oracle)")
    if shutil.which(os.environ.get("CXX", "g++")) is None:
        pytest.skip("no C++ compiler: torch.compile cannot build CPU kernels here")
    key = hashlib.sha256(GEN.read_bytes() + torch.__version__.encode()).hexdigest()[:16]
    cache = getattr(request.config, "cache", None)
    out = Path(cache.mkdir(f"torchless-inductor-cache-{key}")) if cache is not None else tmp_path_factory.mktemp("ic")
    if not (out / "done.json").exists():
        shutil.rmtree(out / "cache", ignore_errors=True)
        env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(out / "cache"), TORCHINDUCTOR_FX_GRAPH_CACHE="1")
        env.pop("TRITON_CACHE_DIR", None)
        proc = subprocess.run([sys.executable, str(GEN), str(out)], env=env, capture_output=True, text=True, timeout=1800)
        if proc.returncode != 0 or not (out / "done.json").exists():
            shutil.rmtree(out, ignore_errors=True)
            pytest.fail(f"gen_cache.py failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return out / "cache"


@pytest.fixture
def cache_copy(compiled_cache: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "cache"
    shutil.copytree(compiled_cache, dst, symlinks=True)
    return dst
