"""A scan report is a function of the bytes alone (issue 30, item 4).

Every budget counts work, never time: the same JSON (timings aside) on every run, under
any machine load and any ``--jobs``; a budget that runs out is UNANALYSABLE with a
finding naming it; the wall-clock watchdogs are a last resort that says "timeout".
A loaded machine is simulated by a clock that runs ten times fast (what a machine ten
times slower looks like to the scanner); the inputs come from ``determinism_samples.py``
beside this file and from ``samples/``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from typing import Any

import pytest

import torchless
from torchless.scan.analysis import analyse

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SAMPLES = os.path.join(ROOT, "samples")


def _gen() -> Any:
    spec = importlib.util.spec_from_file_location("tl_determinism_samples", os.path.join(HERE, "determinism_samples.py"))
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


gen = _gen()


def _untimed(doc: Any) -> Any:
    """The report without its timing fields."""
    if isinstance(doc, dict):
        return {k: _untimed(v) for k, v in doc.items() if k != "seconds"}
    if isinstance(doc, list):
        return [_untimed(x) for x in doc]
    return doc


def _json(report: Any) -> str:
    return json.dumps(_untimed(report.to_dict()), sort_keys=True)


@pytest.fixture
def loaded_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    """The clock runs ten times fast: every wall-clock limit comes ten times sooner."""
    real = time.monotonic
    t0 = real()
    monkeypatch.setattr(time, "monotonic", lambda: t0 + 10 * (real() - t0))


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    out = tmp_path_factory.mktemp("determinism")
    formats = out / "formats"
    gen.small_formats(str(formats))
    return {"dcp": gen.dcp_folder(str(out / "dcp")), "formats": str(formats)}


def _cli(args: list[str]) -> str:
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "src") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run(
        [sys.executable, "-m", "torchless", "scan", "--json", *args], capture_output=True, text=True, env=env, timeout=300
    )
    assert proc.returncode in (0, 1), proc.stderr[-2000:]
    return json.dumps(_untimed(json.loads(proc.stdout)), sort_keys=True)


def test_a_dcp_folder_scans_the_same_20_times_under_load_and_any_jobs(inputs, loaded_machine) -> None:  # type: ignore[no-untyped-def]
    """26 items in one rank file, torch zips of one layout and shared-argument pickles:
    the report used to count 10 to 22 pickle streams of 26. Zip members were analysed
    once per ``id()`` of their source, and a DCP item's source, freed after its walk,
    left its id to the next item of the same layout, skipped as the allocator decided;
    and a wall-clock budget decided how far the scan got."""
    first = torchless.scan(inputs["dcp"], jobs=1)
    by_name = {os.path.basename(f.path): f for f in first.files}
    assert by_name["__0_0.distcp"].streams == 26 and first.clean, [
        (f.path, f.verdict, [x.message for x in f.findings]) for f in first.files
    ]
    want = _json(first)
    for i in range(19):
        jobs = 4 if i in (9, 18) else 1  # the folder's 4 files through the process pool, twice
        assert _json(torchless.scan(inputs["dcp"], jobs=jobs)) == want, f"run {i + 2} (jobs={jobs})"
    assert _cli(["--jobs", "4", inputs["dcp"]]) == want
    assert _cli(["--jobs", "1", os.path.join(inputs["dcp"], "__0_0.distcp")]) == json.dumps(
        _untimed(torchless.scan(os.path.join(inputs["dcp"], "__0_0.distcp"), jobs=1).to_dict()), sort_keys=True
    )


def test_every_sample_format_scans_the_same_under_load_and_any_jobs(inputs, loaded_machine) -> None:  # type: ignore[no-untyped-def]
    """samples/ (.pt zip and legacy, TorchScript zip, mobile and flatbuffer, .pt2, AOTI,
    ONNX, ExecuTorch, a DCP checkpoint, old .pt2 layouts, the scan samples) and npz,
    joblib, safetensors and pickle files: three in-process runs and one through the pool."""
    paths = [SAMPLES, inputs["formats"]]
    first = torchless.scan(paths, jobs=1)
    kinds = {f.kind for f in first.files}
    for k in ("torch-zip", "legacy", "torchscript", "onnx", "distcp", "npz", "pickle"):
        assert any(k in x for x in kinds), (k, kinds)
    want = _json(first)
    assert _json(torchless.scan(paths, jobs=1)) == want
    assert _json(torchless.scan(paths, jobs=1)) == want
    assert _json(torchless.scan(paths, jobs=4)) == want


def test_a_shared_argument_is_searched_once(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The red team's 20 KB pickle: a memoized tuple DAG (64**3 leaves as a tree) passed
    to 1,000 calls took 16-27 s to scan (each call's arguments walked as a tree)."""
    for data, verdict in ((gen.shared_args(1000, payload=True), "dangerous"), (gen.shared_args(1000), "clean")):
        p = _write(tmp_path, f"{verdict}.pkl", data)
        t = time.process_time()
        first = torchless.scan(p, jobs=1)
        cpu = time.process_time() - t
        assert cpu < 2.0, cpu
        assert first.files[0].verdict == verdict, [(f.rule, f.message) for f in first.files[0].findings]
        assert {_json(torchless.scan(p, jobs=1)) for _ in range(2)} == {_json(first)}
        res = analyse(data)
        assert res.error is None and len(res.calls) == 1000 + (verdict == "dangerous")
        assert res.arg_nodes < 10_000, res.arg_nodes  # 266 million as a tree


def _write(tmp_path: Any, name: str, data: bytes) -> str:
    p = tmp_path / name
    p.write_bytes(data)
    return str(p)


def test_an_exhausted_argument_budget_is_unanalysable_and_the_same_each_run(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """64 x 64 distinct lists and an APPEND between calls: each search is stale, so the
    argument-node budget runs out before the payload; never CLEAN, never slow."""
    p = _write(tmp_path, "mutable.pkl", gen.shared_mutable_args(1000, payload=True))
    t = time.process_time()
    reports = [torchless.scan(p, jobs=1) for _ in range(3)]
    assert (time.process_time() - t) / 3 < 2.0
    assert len({_json(r) for r in reports}) == 1
    fr = reports[0].files[0]
    assert fr.verdict == "unanalysable", [(f.rule, f.message) for f in fr.findings]
    assert any(f.rule == "limit" and "argument nodes searched for nested payloads" in f.message for f in fr.findings)


def test_an_exhausted_opcode_budget_is_unanalysable_and_the_same_each_run(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from torchless.scan import budget

    monkeypatch.setattr(budget, "ops_budget", lambda size: 2_000)
    for payload, name in ((b"cos\nsystem\n(S'true'\ntR.", "evil.pkl"), (b"N.", "benign.pkl")):
        p = _write(tmp_path, name, b"\x80\x02" + b"N0" * 5_000 + payload)
        reports = [torchless.scan(p, jobs=1) for _ in range(3)]
        assert len({_json(r) for r in reports}) == 1
        fr = reports[0].files[0]
        assert fr.verdict == "unanalysable", [(f.rule, f.message) for f in fr.findings]
        assert any(f.rule == "limit" and "(opcodes run)" in f.message for f in fr.findings)


def test_the_scan_watchdog_says_timeout(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The file's wall-clock watchdog, made to fire: an explicit timeout, UNANALYSABLE."""
    p = _write(tmp_path, "ok.pkl", gen.shared_args(10))
    assert torchless.scan(p, jobs=1).files[0].verdict == "clean"
    from torchless.scan import budget

    monkeypatch.setattr(budget, "WATCHDOG_SECONDS", -1.0)  # already past when the scan starts
    reports = [torchless.scan(p, jobs=1) for _ in range(2)]
    assert _json(reports[0]) == _json(reports[1])
    fr = reports[0].files[0]
    assert fr.verdict == "unanalysable", [(f.rule, f.message) for f in fr.findings]
    assert any(f.rule == "limit" and f.message.startswith("timeout: the scan's wall-clock watchdog") for f in fr.findings)


def test_the_engine_watchdog_says_timeout(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The engine child's watchdog, made to fire on every request: each is reported as a
    timeout (it used to be an 'undecided' probe or a missing second opinion, silently)."""
    from torchless.scan import engine

    p = _write(tmp_path, "ok.pkl", gen.shared_args(10))
    w = engine.shared_worker()
    monkeypatch.setattr(w, "timeout", 1e-6)
    fr = torchless.scan(p, jobs=1).files[0]
    assert fr.verdict == "unanalysable", [(f.rule, f.message) for f in fr.findings]
    assert any(f.rule == "unanalysable" and f.message.startswith("timeout: ") for f in fr.findings)


def test_a_container_changed_after_its_search_is_searched_again() -> None:
    """The memo of searched arguments is sound: a list searched while empty, then given a
    nested pickle by APPEND, is searched again at the next call (directly, and inside a
    tuple searched before: a tuple holding a list is not immutable)."""
    nested = b"\x80\x02cos\nsystem\nX\x04\x00\x00\x00true\x85R."
    blob = b"C" + bytes([len(nested)]) + nested  # SHORT_BINBYTES
    for wrap in (b"h\x00\x85q\x01", b"h\x00\x85\x85q\x01"):  # (L,) or ((L,),)
        body = (
            b"\x80\x02]q\x00"
            + wrap
            + b"0"  # L = [] (memo 0); T wraps it (memo 1)
            + gen.OD
            + b"h\x01R0"  # OrderedDict(*T): L searched while empty
            + b"h\x00"
            + blob
            + b"a0"  # L.append(nested pickle)
            + gen.OD
            + b"h\x01R0"  # the same call again: L must be searched again
            + b"N."
        )
        res = analyse(body)
        assert res.error is None, res.error
        assert [n[1] for n in res.nested] == [nested], res.nested
