"""Issue 30, item 1: the scanner computes the value each loader branches on.

* The corpus (``corpus/gen_review3_decisions.py``): every sample runs its payload under its
  real loader (``run_regression.py``: forked children, marker files) and is not CLEAN;
  the benign controls are not DANGEROUS (and the ``clean`` ones are CLEAN).
* Structure-aware mutation tests of the decision fields, each case judged by the real
  loader's rule: the ``numpy.dtype`` BUILD state of a joblib array (NumPy's own
  ``__setstate__`` builds the dtype and says ``hasobject``), the ``descr`` of an ``.npy``
  (``numpy.load(allow_pickle=False)`` refuses exactly the files it would unpickle), and
  the ``.pt2`` payload configs (``torch.export.load`` runs in a child; the payload's
  ``os.mkdir`` leaves a trace). Whenever the loader would unpickle, the scan is never
  CLEAN; where NumPy builds no object dtype the joblib scan is never DANGEROUS.
"""

from __future__ import annotations

import importlib.util
import io
import json
import os
import random
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import torchless

from .conftest import CORPUS, ENV
from .test_regression_corpus import LOAD_TIMEOUT, flagged, scan_many

HAS_TORCH = importlib.util.find_spec("torch") is not None
HAS_JOBLIB = importlib.util.find_spec("joblib") is not None


def _gen_module() -> Any:
    spec = importlib.util.spec_from_file_location("tl_scan_gen_review3", os.path.join(CORPUS, "gen_review3_decisions.py"))
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


GEN = _gen_module()
PLAN = GEN.plan(use_torch=HAS_TORCH)
needs_joblib = pytest.mark.skipif(not HAS_JOBLIB, reason="joblib is the oracle (and writes the controls)")


# -- the corpus ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict[str, Any]]:
    if not HAS_JOBLIB:
        pytest.skip("joblib writes the controls and loads the joblib samples")
    out = tmp_path_factory.mktemp("review3")
    markers = tmp_path_factory.mktemp("review3-markers")
    env = dict(os.environ, **{ENV: str(markers)})
    cmd = [sys.executable, os.path.join(CORPUS, "gen_review3_decisions.py"), str(out)]
    if not HAS_TORCH:
        cmd.append("--no-torch")
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(out / "manifest.json") as f:
        return out, markers, json.load(f)


@pytest.fixture(scope="module")
def proofs(corpus: tuple[Path, Path, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    if not hasattr(os, "fork"):
        pytest.skip("the loader runner forks one child per sample")
    out, markers, _man = corpus
    env = dict(os.environ, **{ENV: str(markers)})
    cmd = [sys.executable, os.path.join(CORPUS, "run_regression.py"), str(out), str(markers), "--timeout", str(LOAD_TIMEOUT)]
    proc = subprocess.run(cmd + ["--jobs", "2"], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = {r["name"]: r for r in (json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{"))}
    found = os.listdir(markers)
    for name, r in res.items():
        r["marker"] = any(f.startswith(name) for f in found)
    return res


@pytest.fixture(scope="module")
def scans(corpus: tuple[Path, Path, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out, _markers, man = corpus
    items = {s["name"]: str(out / s["scan"]) for s in man["samples"]}
    items.update({"control:" + c["name"]: str(out / c["scan"]) for c in man["controls"]})
    return scan_many(items)


def test_plan_is_broad_enough() -> None:
    names = [s["name"] for s in GEN.plan(use_torch=True)]
    assert len(names) == len(set(names)) and len(names) >= 16
    for prefix in ("j", "n", "p"):  # joblib, NumPy, .pt2
        assert sum(n.startswith(prefix) for n in names) >= 4, prefix


@pytest.mark.parametrize("name", [s["name"] for s in PLAN])
def test_sample_runs_under_its_loader(name: str, proofs: dict[str, dict[str, Any]]) -> None:
    r = proofs[name]
    assert r["marker"], f"{name}: the payload did not run ({r['status']}: {r['error']})"
    assert r["status"] in ("done", "raised"), r


@pytest.mark.parametrize("name", [s["name"] for s in PLAN])
def test_scan_flags_sample(name: str, scans: dict[str, dict[str, Any]]) -> None:
    spec = next(s for s in PLAN if s["name"] == name)
    assert flagged(scans[name], spec["expect"]), f"{name} ({spec['technique']}): {scans[name]}"


@pytest.mark.parametrize("name", [s["name"] for s in PLAN if s["visible"]])
def test_visible_payload_is_dangerous(name: str, scans: dict[str, dict[str, Any]]) -> None:
    """Where the payload is in the scanned file, the scan finds it (not just UNANALYSABLE)."""
    assert "dangerous" in scans[name]["verdicts"], scans[name]


def test_controls_are_not_dangerous(corpus: tuple[Path, Path, dict[str, Any]], scans: dict[str, dict[str, Any]]) -> None:
    _out, _markers, man = corpus
    assert len(man["controls"]) >= (8 if HAS_TORCH else 6)
    bad = {}
    for c in man["controls"]:
        v = scans["control:" + c["name"]]["verdicts"]
        if "dangerous" in v or (c["clean"] and v != ["clean"]) or not set(v) <= {"clean", "suspicious", "unanalysable"}:
            bad[c["name"]] = scans["control:" + c["name"]]
    assert not bad, bad


# -- mutation tests: joblib dtype state ----------------------------------------------------

_TYPES = ("V8", "V16", "V4", "U2", "S8", "f8", "i4", "O8", "b1")
_FLAGS = (0, 1, 2, 8, 16, 63, 144, 256, 257, -1, -2, True)
_VERSIONS = (0, 1, 2, 3, 4, 5, -1, True)


def _random_state(rng: random.Random, typestr: str) -> tuple[Any, ...]:
    Dt = GEN.Dt
    sub = None
    names: Any = None
    fields: Any = None
    r = rng.random()
    if r < 0.25:
        sub = (Dt(rng.choice(("O8", "f8", "i4"))), (rng.choice((1, 2)),))
    elif r < 0.55:
        inner = rng.choice(("O8", "f8", "i4"))
        names, fields = ("a",), {"a": (Dt(inner), 0)}
        if rng.random() < 0.3:
            names, fields = ("a", "b"), {"a": (Dt("f8"), 0), "b": (Dt(rng.choice(("O8", "f8"))), 8)}
    elsize = rng.choice((8, 16, 4, 0, -1, 2))
    return (rng.choice(_VERSIONS), "|", sub, names, fields, elsize, rng.choice((1, 4, 8, -1)), rng.choice(_FLAGS))


def _dtype_cases(n: int) -> list[tuple[str, tuple[Any, ...] | None]]:
    rng = random.Random(30_1)
    cases: list[tuple[str, tuple[Any, ...] | None]] = []
    for t in _TYPES:  # the states NumPy itself writes
        cases.append((t, np.dtype(t).__reduce__()[2]))
    while len(cases) < n:
        t = rng.choice(_TYPES)
        cases.append((t, None if rng.random() < 0.05 else _random_state(rng, t)))
    return cases


def _sized(payload: bytes, multiple: int) -> bytes:
    """``payload`` (ending in STOP) padded to a multiple of ``multiple`` bytes with a pushed
    and popped string before its STOP."""
    pad = (-(len(payload) + 3)) % multiple
    return payload[:-1] + b"V" + b"x" * pad + b"\n0."


def _numpy_hasobject(typestr: str, state: tuple[Any, ...] | None) -> bool | None:
    """NumPy's answer (what joblib's ``read_array`` tests); None: NumPy raises, joblib
    stops before reading the array."""
    try:
        return bool(GEN.Dt(typestr, state).numpy().hasobject)
    except Exception:  # noqa: BLE001 - NumPy refuses the state: so does joblib.load
        return None


def _to_dt(v: Any) -> Any:
    if isinstance(v, np.dtype):
        return GEN.Dt(v.str if v.fields is None and v.subdtype is None else "V%d" % v.itemsize, v.__reduce__()[2])
    if isinstance(v, tuple):
        return tuple(_to_dt(x) for x in v)
    if isinstance(v, dict):
        return {k: _to_dt(x) for k, x in v.items()}
    return v


@needs_joblib
def test_joblib_dtype_state_mutations(tmp_path: Path) -> None:
    """300 dtype states, NumPy's ``__setstate__`` the judge: an array whose dtype NumPy
    makes an object dtype (joblib unpickles its bytes) is never CLEAN, and one it does not
    is never DANGEROUS (the scanner invents no pickle)."""
    cases = _dtype_cases(300)
    paths, truth = [], []
    for i, (t, st) in enumerate(cases):
        st = _to_dt(st) if st is not None else None
        payload = _sized(GEN.mkdir_p0(str(tmp_path / f"ran{i}")), 16)
        try:  # shape the array so that a raw read covers the payload exactly (the old scanner's view)
            itemsize = GEN.Dt(t, st).numpy().itemsize
        except Exception:  # noqa: BLE001 - NumPy refuses the state
            itemsize = 0
        count = len(payload) // itemsize if itemsize > 0 and len(payload) % itemsize == 0 else 1
        data = GEN.joblib_stream([GEN.benign_raw(), ((count,), GEN.Dt(t, st), payload)])
        p = tmp_path / f"m{i:03d}.joblib"
        p.write_bytes(data)
        paths.append(p)
        truth.append(_numpy_hasobject(t, st))
    assert sum(1 for x in truth if x) >= 60 and sum(1 for x in truth if x is False) >= 60, truth  # both sides covered
    rep = torchless.scan(paths, jobs=1)
    by = {Path(f.path).name: f.verdict for f in rep.files}
    wrong = []
    for i, (p, hasobj) in enumerate(zip(paths, truth, strict=True)):
        v = by[p.name]
        if (hasobj and v not in ("dangerous", "unanalysable")) or (hasobj is False and v == "dangerous"):
            wrong.append((cases[i], hasobj, v))
    assert not wrong, wrong[:10]


@needs_joblib
def test_joblib_dtype_oracle_is_joblib(tmp_path: Path) -> None:
    """The oracle above is joblib's own decision: a few states loaded by ``joblib.load``
    in a child (the payload makes a folder) unpickle exactly when NumPy says hasobject."""
    chosen = [c for c in _dtype_cases(60) if _numpy_hasobject(*c) is not None][:24]
    files = []
    for i, (t, st) in enumerate(chosen):
        st = _to_dt(st) if st is not None else None
        p = tmp_path / f"o{i}.joblib"
        p.write_bytes(GEN.hidden_joblib(GEN.mkdir_p0(str(tmp_path / f"ran{i}")), lambda n, t=t, st=st: GEN.Dt(t, st)))
        files.append(str(p))
    code = textwrap.dedent(
        """
        import sys, joblib
        for p in sys.argv[1:]:
            try:
                joblib.load(p)
            except Exception:
                pass
        """
    )
    subprocess.run([sys.executable, "-c", code, *files], check=True, timeout=120, capture_output=True)
    for i, (t, st) in enumerate(chosen):
        assert (tmp_path / f"ran{i}").exists() == _numpy_hasobject(t, _to_dt(st) if st is not None else None), (t, st)


# -- mutation tests: .npy descr ------------------------------------------------------------


def _descr(rng: random.Random, depth: int = 0) -> str:
    base = rng.choice(("'<f8'", "'|O'", "'|V8'", "'<i4'", "'|S3'", "'<U2'", "'O'", "'|b1'"))
    r = rng.random()
    if depth > 2 or r < 0.35:
        return base
    if r < 0.5:
        return f"('|O', ({rng.choice((1, 2))},))" if rng.random() < 0.5 else base
    fields = []
    for j in range(rng.choice((1, 2, 3))):
        name = f"'f{j}'" if rng.random() < 0.8 else f"('title{j}', 'f{j}')"
        sub = _descr(rng, depth + 1)
        if rng.random() < 0.2:
            fields.append(f"({name}, {sub}, ({rng.choice((1, 2))},))")
        else:
            fields.append(f"({name}, {sub})")
    if rng.random() < 0.1:
        fields.append("('', '|V4')")  # padding NumPy drops
    return "[" + ", ".join(fields) + "]"


def test_npy_descr_mutations(tmp_path: Path) -> None:
    """300 ``descr`` literals: ``numpy.load(allow_pickle=False)`` refuses exactly the files
    ``numpy.load(allow_pickle=True)`` unpickles; those are never CLEAN, the others never
    DANGEROUS."""
    rng = random.Random(30_2)
    paths, truth, descrs = [], [], []
    for i in range(300):
        d = _descr(rng)
        data = GEN.npy_bytes(d, GEN.mkdir_p0(str(tmp_path / f"ran{i}")))
        p = tmp_path / f"d{i:03d}.npy"
        p.write_bytes(data)
        try:
            np.load(io.BytesIO(data), allow_pickle=False)
            unpickles: bool | None = False
        except ValueError as e:
            unpickles = True if "allow_pickle=False" in str(e) else None
        except Exception:  # noqa: BLE001 - NumPy refuses the header: nothing runs
            unpickles = None
        paths.append(p)
        truth.append(unpickles)
        descrs.append(d)
    assert sum(1 for x in truth if x) >= 60 and sum(1 for x in truth if x is False) >= 60, truth
    rep = torchless.scan(paths, jobs=1)
    by = {Path(f.path).name: f.verdict for f in rep.files}
    wrong = [
        (descrs[i], truth[i], by[p.name])
        for i, p in enumerate(paths)
        if (truth[i] and by[p.name] not in ("dangerous", "unanalysable")) or (truth[i] is False and by[p.name] == "dangerous")
    ]
    assert not wrong, wrong[:10]
    assert not any((tmp_path / f"ran{i}").exists() for i in range(300))


# -- mutation tests: .pt2 payload configs ---------------------------------------------------

_USE_PICKLE = (True, False, 1, 0, "x", "", None, [], [0], {})
_PAYLOADS = ("p0", "p1", 2, 3, 4, 5, "zip")
_WHERE = ("weight_0", "blob", "WEIGHT_0", "tensor_0", "opaque_obj_0", "custom_obj_0", "sample_inputs")


def _pt2_payload(kind: Any, mark: str) -> bytes:
    if kind == "p0":
        return GEN.mkdir_p0(mark)
    body = GEN.G("os", "mkdir") + b"q\x00(X" + len(mark.encode()).to_bytes(4, "little") + mark.encode() + b"tR"
    if kind == "p1":
        return body + b"."
    if kind == "zip":  # a torch.save archive whose data.pkl is the payload
        return GEN.zip_with([("archive/data.pkl", b"\x80\x02" + body + b"."), ("archive/version", b"3\n")])
    return bytes([0x80, kind]) + body + b"."


@pytest.mark.skipif(not HAS_TORCH, reason="torch.export.load is the oracle")
def test_pt2_config_mutations(tmp_path: Path) -> None:
    """90 archives whose configs say ``use_pickle`` (any JSON value) for weights,
    constants, custom and opaque objects at various record names, each payload a pickle of
    any protocol (or a torch.save zip): ``torch.export.load`` runs in a child and the
    payload's ``os.mkdir`` leaves a trace; every archive where it ran is not CLEAN."""
    rng = random.Random(30_3)
    base = GEN.export_clean()
    paths = []
    for i in range(90):
        where, up, kind = rng.choice(_WHERE), rng.choice(_USE_PICKLE), rng.choice(_PAYLOADS)
        payload = _pt2_payload(kind, str(tmp_path / f"ran{i}"))
        if where in ("weight_0", "blob", "WEIGHT_0"):
            data = GEN.pickled_weight(base, payload, path=where, use_pickle=up)
            if where == "WEIGHT_0":  # the record keeps its name: miniz looks names up case-insensitively
                data = GEN.pt2_with(data, lambda rel, d: None if rel == "data/weights/WEIGHT_0" else d)
                data = GEN.pt2_with(data, lambda rel, d, payload=payload: payload if rel == "data/weights/weight_0" else d)
        elif where == "sample_inputs":
            data = GEN.pt2_with(base, lambda rel, d, payload=payload: payload if rel.startswith("data/sample_inputs/") else d)
        else:
            data = GEN.pickled_constant(base, payload, path=where, use_pickle=up)
        p = tmp_path / f"e{i:03d}_{where}_{kind}_{type(up).__name__}.pt2"
        p.write_bytes(data)
        paths.append(p)
    code = textwrap.dedent(
        """
        import logging, sys, warnings
        warnings.simplefilter("ignore")
        logging.disable(logging.CRITICAL)
        import torch
        for p in sys.argv[1:]:
            try:
                torch.export.load(p)
            except Exception:
                pass
        """
    )
    subprocess.run([sys.executable, "-c", code, *map(str, paths)], check=True, timeout=300, capture_output=True)
    ran = [(tmp_path / f"ran{i}").exists() for i in range(len(paths))]
    assert sum(ran) >= 20, sum(ran)  # the loader unpickles a good share of them
    rep = torchless.scan(paths, jobs=1)
    by = {Path(f.path).name: f.verdict for f in rep.files}
    missed = [p.name for p, r in zip(paths, ran, strict=True) if r and by[p.name] not in ("dangerous", "unanalysable")]
    assert not missed, missed
