"""Issue 10 regression corpus: every sample runs under its real loader, and the scan flags it.

The corpus (``corpus/gen_regression.py``) is generated once per session. Each sample is
proven to run its payload under its real loader (``corpus/run_regression.py``: forked
children with a timeout, a marker file must appear, and samples marked ``clean_load``
must load without an exception), then scanned in a forked child with a time and memory
limit (a scan that hangs is a miss, not a hung suite).

The existing malicious corpus (all flagged) and the benign corpus (zero false
positives) are checked by ``test_corpus.py`` (``test_scan_flags_every_malicious_sample``,
``test_benign_corpus_is_clean``); this module adds the controls the regression samples
were derived from (unmodified torch, DCP, NumPy, TorchScript and Inductor-cache
artifacts), which must scan CLEAN.

``KNOWN_MISSES``: samples the scanner does not flag yet (strict xfail: a fixed scanner
makes the test fail until the name is removed from the set).
"""

from __future__ import annotations

import importlib.util
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from .conftest import CORPUS, ENV

HAS_TORCH = importlib.util.find_spec("torch") is not None
SCAN_TIMEOUT = 20.0  # generous: the machine running the suite may be shared
LOAD_TIMEOUT = 90.0


def _gen_module() -> Any:
    spec = importlib.util.spec_from_file_location("tl_scan_gen_regression", os.path.join(CORPUS, "gen_regression.py"))
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules[spec.name] = mod  # type: ignore[union-attr]  (dataclasses look the module up)
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


GEN = _gen_module()
HAS_CC = HAS_TORCH and GEN.has_cc()
PLAN = GEN.plan(use_torch=HAS_TORCH, use_cc=HAS_CC)

#: samples main's scanner does not flag as required (root cause in the comment). The
#: lead empties this set as the fixes land; each entry is a strict xfail.
KNOWN_MISSES: set[str] = set()


# -- session fixtures -----------------------------------------------------------------


@pytest.fixture(scope="session")
def regression(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict[str, Any]]:
    """(corpus dir, marker dir, manifest) of the regression corpus."""
    out = tmp_path_factory.mktemp("regression")
    markers = tmp_path_factory.mktemp("regression-markers")
    env = dict(os.environ, **{ENV: str(markers)})
    cmd = [sys.executable, os.path.join(CORPUS, "gen_regression.py"), str(out)]
    if not HAS_TORCH:
        cmd.append("--no-torch")
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(out / "manifest.json") as f:
        man = json.load(f)
    return out, markers, man


@pytest.fixture(scope="session")
def proofs(regression: tuple[Path, Path, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Every sample loaded by its real loader: name -> {status, error, marker}."""
    if not hasattr(os, "fork"):
        pytest.skip("the loader runner forks one child per sample")
    out, markers, _man = regression
    env = dict(os.environ, **{ENV: str(markers)})
    proc = subprocess.run(
        [
            sys.executable,
            os.path.join(CORPUS, "run_regression.py"),
            str(out),
            str(markers),
            "--timeout",
            str(LOAD_TIMEOUT),
            "--jobs",
            "2",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = {r["name"]: r for r in (json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{"))}
    deadline = time.monotonic() + 10  # os.popen-style payloads may finish after the loader
    while True:
        found = os.listdir(markers)
        for name, r in res.items():
            r["marker"] = any(f.startswith(name) for f in found)
        if all(r["marker"] for r in res.values()) or time.monotonic() > deadline:
            return res
        time.sleep(0.1)


def _scan_child(path: str, wfd: int) -> None:
    code = 0
    try:
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
        from torchless.scan import scan

        rep = scan(path, jobs=1)
        doc = {
            "verdicts": sorted({f.verdict for f in rep.files}),
            "exit": rep.exit_code,
            "findings": sorted({f"{f.rule}/{f.severity}" for f in rep.findings if f.severity != "info"}),
        }
    except BaseException as e:  # a crash is a result too (and a miss)
        doc = {"verdicts": ["crash"], "exit": -1, "findings": [f"{type(e).__name__}: {str(e)[:200]}"]}
        code = 1
    os.write(wfd, json.dumps(doc).encode())
    os.close(wfd)
    os._exit(code)


def scan_many(paths: dict[str, str], timeout: float = SCAN_TIMEOUT, jobs: int = 2) -> dict[str, dict[str, Any]]:
    """Scan each path in a forked child (time and memory limited), ``jobs`` at a time."""
    pending = list(paths.items())
    running: dict[int, tuple[str, int, float, bytearray]] = {}
    out: dict[str, dict[str, Any]] = {}
    while pending or running:
        while pending and len(running) < jobs:
            name, p = pending.pop(0)
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:
                os.close(r)
                _scan_child(p, w)
            os.close(w)
            os.set_blocking(r, False)
            running[pid] = (name, r, time.monotonic(), bytearray())
        time.sleep(0.005)
        for pid, (name, r, t0, buf) in list(running.items()):
            try:
                while chunk := os.read(r, 65536):
                    buf += chunk
            except BlockingIOError:
                pass
            done, _st = os.waitpid(pid, os.WNOHANG)
            if not done and time.monotonic() - t0 > timeout:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
                out[name] = {"verdicts": ["timeout"], "exit": -1, "findings": [f"scan ran past {timeout:.0f} s"]}
            elif done:
                try:
                    while chunk := os.read(r, 65536):
                        buf += chunk
                except BlockingIOError:
                    pass
                out[name] = (
                    json.loads(bytes(buf)) if buf else {"verdicts": ["crash"], "exit": -1, "findings": ["scan child died"]}
                )
            else:
                continue
            os.close(r)
            del running[pid]
    return out


@pytest.fixture(scope="session")
def scans(regression: tuple[Path, Path, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out, _markers, man = regression
    items = {s["name"]: str(out / s["scan"]) for s in man["samples"]}
    items.update({"control:" + c["name"]: str(out / c["scan"]) for c in man["controls"]})
    return scan_many(items)


def flagged(res: dict[str, Any], expect: str) -> bool:
    """``dangerous``: some file DANGEROUS or UNANALYSABLE; ``flagged``: some file not CLEAN
    (a timeout or crash of the scan is never a flag)."""
    v = set(res["verdicts"])
    if v & {"timeout", "crash"}:
        return False
    if expect == "dangerous":
        return bool(v & {"dangerous", "unanalysable"})
    return bool(v - {"clean"})


# -- tests ------------------------------------------------------------------------------


def test_plan_covers_every_root_cause() -> None:
    by_rc: dict[int, int] = {}
    for s in PLAN:
        by_rc[s.rc] = by_rc.get(s.rc, 0) + 1
    names = [s.name for s in PLAN]
    assert len(names) == len(set(names))
    assert {s.name for s in GEN.plan(use_torch=True)} >= KNOWN_MISSES
    if not HAS_CC:
        pytest.skip("torch-built and compiler-built samples are left out without torch and gcc/g++")
    assert len(PLAN) >= 60, len(PLAN)
    thin = {rc: by_rc.get(rc, 0) for rc in GEN.ROOT_CAUSES if by_rc.get(rc, 0) < 4}
    assert not thin, f"root causes with fewer than 4 samples: {thin}"


def test_manifest_matches_plan(regression: tuple[Path, Path, dict[str, Any]]) -> None:
    _out, _markers, man = regression
    assert [s["name"] for s in man["samples"]] == [s.name for s in PLAN]
    for s in man["samples"]:
        assert s["rc"] in GEN.ROOT_CAUSES and s["expect"] in ("dangerous", "flagged"), s


@pytest.mark.parametrize("name", [s.name for s in PLAN])
def test_sample_runs_under_its_loader(name: str, proofs: dict[str, dict[str, Any]]) -> None:
    spec = next(s for s in PLAN if s.name == name)
    r = proofs[name]
    assert r["marker"], f"{name}: the payload did not run under {spec.loader} ({r['status']}: {r['error']})"
    if spec.clean_load:
        assert r["status"] == "done", f"{name}: {spec.loader} raised after the payload ran ({r['error']}): a victim would notice"
    assert r["status"] in ("done", "raised"), r


def _scan_params() -> list[Any]:
    return [
        pytest.param(s.name, marks=pytest.mark.xfail(strict=True, reason="known miss on main (issue 10)"))
        if s.name in KNOWN_MISSES
        else s.name
        for s in PLAN
    ]


@pytest.mark.parametrize("name", _scan_params())
def test_scan_flags_sample(name: str, scans: dict[str, dict[str, Any]]) -> None:
    spec = next(s for s in PLAN if s.name == name)
    res = scans[name]
    assert flagged(res, spec.expect), f"{name} (root cause {spec.rc}, expected {spec.expect}): {res}"


def test_controls_scan_clean(regression: tuple[Path, Path, dict[str, Any]], scans: dict[str, dict[str, Any]]) -> None:
    _out, _markers, man = regression
    if HAS_TORCH:
        assert len(man["controls"]) >= 8
    bad = {
        c["name"]: scans["control:" + c["name"]]
        for c in man["controls"]
        if scans["control:" + c["name"]]["verdicts"] != ["clean"]
    }
    assert not bad, bad  # false positives on the unmodified artifacts
