"""Scanning a real TorchInductor cache (torchless.scan.cache).

A cache written by a CPU ``torch.compile`` scans CLEAN (its pickles name only inductor's
cache records; its generated Python and C++ hold only what inductor emits). A payload
line added to the cached output code runs on the next cache hit (marker file, child
process) and is flagged, as are payloads in the pickled ``source_code``, in the C++
sources, and a ``.so`` with no source beside it.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

import torchless
from torchless.scan.cache import cache_kind, check_python

GEN = Path(__file__).parent / "gen_cache.py"

PAYLOADS = [
    "import subprocess",
    "__import__('os').system('true')",
    "os.system('true')",
    "exec('1')",
    "eval('1')",
    "open('/tmp/x', 'w')",
    "torch.load('/tmp/x')",
    "torch.ops.load_library('/tmp/x.so')",
    "getattr(torch, 'os')",
    "math.__loader__",
    "from ctypes import CDLL",
    "tempfile.mkstemp()",
    "import importlib",
    "builtins_ = globals()['__builtins__']",
    # kernel sources the output code hands to async_compile (imported / compiled)
    "k = async_compile.triton('k', 'import triton\\nimport subprocess\\nsubprocess.run([1])\\n' * 2, device_str='cuda')",
    "k = async_compile.triton('k', 'import triton\\nimport triton.language as tl\\nimport subprocess\\n', device_str='cuda')",
    'k = async_compile.cpp(\'#include <stdlib.h>\\nextern "C" void k() { system("true"); }\\n\')',
]


def _py(cache: Path) -> Path:
    pys = [p for p in cache.rglob("*.py") if cache_kind(str(p)) == "py"]
    assert len(pys) == 1, pys
    return pys[0]


def test_real_cache_is_clean(compiled_cache: Path) -> None:
    rep = torchless.scan(compiled_cache, jobs=1)
    bad = [(r.path, [(f.rule, f.message) for f in r.findings if f.severity != "info"]) for r in rep.files if r.verdict != "clean"]
    assert not bad
    assert rep.exit_code == 0
    kinds = {r.kind for r in rep.files}
    assert {"inductor-cache-fxgraph", "inductor-cache-py", "inductor-cache-so", "inductor-cache-cpp"} <= kinds
    # the pickles name inductor's records, which the cache allowlist accepts with reasons
    fx = next(r for r in rep.files if r.kind == "inductor-cache-fxgraph")
    assert fx.globals.get("torch._inductor.output_code.CompiledFxGraph") == "safe"
    # scan(coverage=True) lists the generated Python as a source analysed, by its exact bytes
    py = _py(compiled_cache)
    cov = torchless.scan(py, jobs=1, coverage=True).files[0].coverage or []
    assert hashlib.sha256(py.read_bytes()).hexdigest() in {c["sha256"] for c in cov if c["what"] == "source"}


@pytest.mark.parametrize("payload", PAYLOADS)
def test_payload_lines_are_flagged(compiled_cache: Path, payload: str) -> None:
    text = _py(compiled_cache).read_text()
    assert check_python(text) == []
    problems = check_python(text + "\n" + payload + "\n")
    assert problems and any(sev in ("critical", "high") for sev, _m, _l in problems), payload


def test_payload_runs_on_cache_hit_and_is_flagged(cache_copy: Path, tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    py = _py(cache_copy)
    with open(py, "a") as f:
        f.write(f"\n__import__('os').close(__import__('os').open({str(marker)!r}, 0o101))\n")
    out = tmp_path / "out"
    out.mkdir()
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(cache_copy), TORCHINDUCTOR_FX_GRAPH_CACHE="1")
    proc = subprocess.run([sys.executable, str(GEN), str(out)], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    done = json.loads((out / "done.json").read_text())
    assert done["inductor"].get("fxgraph_cache_hit") == 1, done
    assert marker.exists(), "the cached output code did not run"
    fr = torchless.scan(py, jobs=1).files[0]
    assert fr.verdict == "dangerous"
    assert {f.rule for f in fr.findings if f.severity == "critical"} == {"cache-code"}
    assert all(f.loader == "torch.compile (inductor cache)" for f in fr.findings)


def test_source_code_in_the_pickle_is_analysed(cache_copy: Path) -> None:
    pytest.importorskip("torch")
    fx = next(p for p in cache_copy.rglob("*") if p.is_file() and cache_kind(str(p)) == "fxgraph")
    graph = pickle.loads(fx.read_bytes())  # our own benign cache entry (imports torch)
    graph.source_code += "\nimport subprocess\nsubprocess.run(['true'])\n"
    fx.write_bytes(pickle.dumps(graph, protocol=4))
    fr = torchless.scan(fx, jobs=1).files[0]
    assert fr.verdict == "dangerous"
    assert any(f.rule == "cache-code" and "subprocess" in f.message for f in fr.findings)


def test_cpp_sources_and_shared_objects(cache_copy: Path) -> None:
    cpps = sorted(p for p in cache_copy.rglob("*.cpp") if cache_kind(str(p)) == "cpp")
    with open(cpps[0], "a") as f:
        f.write('\n#include <unistd.h>\nstatic int x = system("true");\n')
    so = cpps[1].with_suffix(".so")
    cpps[1].unlink()
    rep = torchless.scan(cache_copy, jobs=1)
    by = {r.path: r for r in rep.files}
    cpp_rep = by[str(cpps[0])]
    assert cpp_rep.verdict == "dangerous" and any("system" in f.message for f in cpp_rep.findings)
    so_rep = by[str(so)]
    assert so_rep.verdict == "suspicious" and any(f.rule == "native-code" and f.severity == "high" for f in so_rep.findings)


_PGO_CHILD = """
import os, sys, torch
import torch._dynamo.config as dc
torch.compiler.config.job_id = "torchless-test"
dc.automatic_dynamic_local_pgo = True
f = torch.compile(lambda x: x * 2, backend="eager")
for n in (2, 3, 4):
    f(torch.randn(n))
from torch._dynamo import pgo
pgo.put_code_state()
"""


def test_dynamo_pgo_state_is_clean(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(tmp_path))
    proc = subprocess.run([sys.executable, "-c", _PGO_CHILD], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    states = [p for p in (tmp_path / "dynamo").glob("code_state_*.pkl")]
    assert states
    fr = torchless.scan(states[0], jobs=1).files[0]
    assert fr.kind == "inductor-cache-pgo" and fr.verdict == "clean", [(f.rule, f.message) for f in fr.findings]
    assert fr.globals.get("torch._dynamo.pgo.CodeState") == "safe"
