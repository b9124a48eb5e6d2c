"""The corpus: every malicious sample really runs, every one is flagged; benign files are clean."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time

import pytest

from torchless.cli.main import main as cli_main
from torchless.scan import scan

from .conftest import CORPUS, ENV

HAS_TORCH = importlib.util.find_spec("torch") is not None


def test_corpus_size(malicious, benign):  # type: ignore[no-untyped-def]
    _out, _m, man = malicious
    assert len(man) >= 60
    loaders = {m["loader"] for m in man}
    assert {"pickle", "torch", "jit", "export", "dcp", "numpy", "gzip"} <= loaders
    assert len(benign[1]) >= 40


@pytest.mark.skipif(not hasattr(os, "fork"), reason="the loader runner forks one child per sample")
def test_every_malicious_sample_really_executes(malicious):  # type: ignore[no-untyped-def]
    out, markers, man = malicious
    for f in os.listdir(markers):
        os.remove(os.path.join(markers, f))
    args = [f"{m['loader']}={out / m['name']}" for m in man]
    env = dict(os.environ, **{ENV: str(markers)})
    proc = subprocess.run(
        [sys.executable, os.path.join(CORPUS, "run_loader.py"), "60", *args], env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    statuses = {json.loads(line)["path"]: json.loads(line)["status"] for line in proc.stdout.splitlines() if line.startswith("{")}
    assert len(statuses) == len(man)
    deadline = time.monotonic() + 10  # os.popen / spawn payloads finish asynchronously
    missing = [m["name"] for m in man]
    while missing and time.monotonic() < deadline:
        missing = [n for n in missing if not os.path.exists(markers / n)]
        if missing:
            time.sleep(0.1)
    assert not missing, {n: statuses.get(str(out / n)) for n in missing}


def test_scan_flags_every_malicious_sample(malicious):  # type: ignore[no-untyped-def]
    out, _markers, man = malicious
    missed = {}
    for m in man:
        rep = scan(out / m["name"], jobs=1)
        verdicts = {f.verdict for f in rep.files}
        if "dangerous" not in verdicts or rep.exit_code != 1:
            missed[m["name"]] = (verdicts, [(f.rule, f.severity) for f in rep.findings])
    assert not missed, missed  # detection 100 %


def test_benign_corpus_is_clean(benign):  # type: ignore[no-untyped-def]
    out, man = benign
    flagged = {}
    for m in man:
        rep = scan(out / m["name"], jobs=1)
        if not rep.clean or rep.exit_code != 0:
            flagged[m["name"]] = [(f.rule, f.severity, f.message[:120]) for f in rep.findings if f.severity != "info"]
    assert not flagged, flagged  # false positives 0


def test_benign_allowlist_advice(benign):  # type: ignore[no-untyped-def]
    out, _man = benign
    rep = scan(out / "b05_argparse_config.pt")
    (fr,) = rep.files
    notes = {n.global_name: n.verdict for n in fr.weights_only}
    assert notes == {"argparse.Namespace": "safe"}
    rep = scan(out / "b07_numpy_array.pt")
    notes = {n.global_name: n.verdict for n in rep.files[0].weights_only}
    assert "numpy.dtype" in notes and set(notes.values()) == {"safe"}
    rep = scan(out / "b02_state_dict.pt")
    assert rep.files[0].weights_only == [] and rep.files[0].weights_only_blockers == []


@pytest.mark.skipif(not HAS_TORCH, reason="needs the torch-built carriers")
def test_kinds_of_carriers(malicious, benign):  # type: ignore[no-untyped-def]
    out, _m, _man = malicious
    kinds = {
        m: scan(out / m, jobs=1).files[0].kind
        for m in (
            "t01_zip_os_system.pt",
            "l01_legacy_pickle1.pt",
            "tar01_pickle_member.tar",
            "ts01_setstate_from_file.pt",
            "p01_sample_inputs.pt2",
            "n01_object.npy",
            "c01_gzip.joblib",
        )
    }
    assert kinds == {
        "t01_zip_os_system.pt": "torch-zip",
        "l01_legacy_pickle1.pt": "legacy",
        "tar01_pickle_member.tar": "tar",
        "ts01_setstate_from_file.pt": "torchscript",
        "p01_sample_inputs.pt2": "pt2",
        "n01_object.npy": "npy",
        "c01_gzip.joblib": "gzip-compressed",
    }
    # DCP: the .distcp item with the payload is found through the metadata's byte ranges
    rep = scan(out / "d02_bytes_item", jobs=1)
    bad = [f for f in rep.findings if f.rule == "dangerous-global"]
    assert bad and all(f.path.endswith(".distcp") for f in bad) and bad[0].member.startswith("[")


def test_cli_on_whole_corpus(malicious, benign, capsys):  # type: ignore[no-untyped-def]
    out, _m, man = malicious
    assert cli_main(["scan", str(out), "--json", "--jobs", "2"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["exit_code"] == 1 and doc["summary"]["files"] >= len(man)
    assert cli_main(["scan", str(benign[0]), "--jobs", "2"]) == 0
    text = capsys.readouterr().out
    assert "CLEAN" in text and "DANGEROUS" not in text
