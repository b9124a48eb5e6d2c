"""The coverage oracle (issue 30, item 3): the scanner sees exactly what the real loaders run.

The real loaders (``pickle.load``, the decompressors, ``joblib.load``, ``numpy.load``,
``torch.load`` with ``weights_only`` False and True, ``torch.jit.load``,
``torch.export.load``, DCP's ``dcp.load``, ``torch.package``'s ``load_pickle`` and
``import_module``) run in child processes whose hooks record every stream an unpickler
consumed, every source compiled and every effect a payload asked for, refusing the
effect (``tests/scan/oracle/child.py``). The same files are scanned with
``coverage=True``; for every case each recorded span and source must be one the scanner
analysed, or the file must not be CLEAN, and a file whose loader reached a payload is
never CLEAN (``tests/scan/oracle/harness.py``).

Cases: the malicious and benign corpora, ``samples/``, and structure-aware mutations of
every carrier's decision fields (``tests/scan/oracle/mutate.py``), ``TORCHLESS_ORACLE_N``
per class (default 6; ``scripts/oracle_fuzz.py`` runs thousands). Classes the scanner
misses today are ``xfail(strict=True)`` naming the hole, to flip once it is fixed.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
SAMPLES = os.path.join(os.path.dirname(os.path.dirname(HERE)), "samples")
sys.path.insert(0, os.path.join(HERE, "oracle"))
import harness  # noqa: E402
import mutate  # noqa: E402

sys.path.pop(0)

N = int(os.environ.get("TORCHLESS_ORACLE_N", "6"))
SEED = int(os.environ.get("TORCHLESS_ORACLE_SEED", "30"))

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None or importlib.util.find_spec("joblib") is None,
    reason="the oracle runs the real loaders: torch and joblib are not installed",
)

#: classes the scanner misses today (another engineer's fix each); strict: flip when fixed
KNOWN_MISSES: dict[str, str] = {}

#: transformers is a test dependency (the `test` extra); its class skips where it is absent
HAS_HF = importlib.util.find_spec("transformers") is not None
_NO_HF = pytest.mark.skipif(not HAS_HF, reason="transformers is not installed (the Hugging Face remote-code class)")

#: the corpora's loaders by the manifest's name (torch: both weights_only modes)
_LOADERS = {"torch": ["torch", "torch_wo"]}


def _by_suffix(path: str) -> list[str]:
    name = os.path.basename(path)
    if os.path.isdir(path):
        return ["dcp"]
    if name.endswith((".npy", ".npz")):
        return ["numpy"]
    if name.endswith(".joblib"):
        return ["joblib"]
    if name.endswith(".pkl"):
        return ["pickle"]
    if name.endswith(".pt2"):
        return ["export"]
    if name.endswith((".ptl", ".ff")) or "script" in name or "traced" in name:
        return ["jit"]
    if name.endswith((".pt", ".pth", ".ckpt", ".zip")):
        return ["torch", "torch_wo"]
    return ["pickle"]


def _corpus_cases(malicious, benign) -> list[dict]:  # type: ignore[no-untyped-def]
    cases = []
    mal_dir, _markers, mal_man = malicious
    for e in mal_man:
        p = os.path.join(mal_dir, e["name"])
        cases.append({"id": e["name"], "cls": "corpus/malicious", "loaders": _LOADERS.get(e["loader"], [e["loader"]]), "path": p})
    ben_dir, ben_man = benign
    for e in ben_man:
        p = os.path.join(ben_dir, e["name"])
        cases.append({"id": e["name"], "cls": "corpus/benign", "loaders": _by_suffix(p), "path": p})
    for name in ("checkpoint.pt", "legacy_format.pt", "state_dict.pt", "scripted_module.pt", "mlp.pt2", "dcp_ckpt"):
        p = os.path.join(SAMPLES, name)
        cases.append({"id": name, "cls": "corpus/samples", "loaders": _by_suffix(p), "path": p})
    for name in sorted(os.listdir(os.path.join(SAMPLES, "scan"))):
        p = os.path.join(SAMPLES, "scan", name)
        cases.append({"id": name, "cls": "corpus/samples", "loaders": _by_suffix(p), "path": p})
    return cases


@pytest.fixture(scope="module")
def oracle(malicious, benign, tmp_path_factory):  # type: ignore[no-untyped-def]
    ben_dir = str(benign[0])
    seeds = {
        "torch_zip": [os.path.join(ben_dir, n) for n in ("b02_state_dict.pt", "b03_model_adam.pt", "b19_protocol4.pt")],
        "legacy": [os.path.join(ben_dir, "b20_legacy_state_dict.pt"), os.path.join(SAMPLES, "legacy_format.pt")],
        "pt2": [os.path.join(ben_dir, "b34_exported.pt2")],
        "dcp": [os.path.join(ben_dir, "b35_dcp")],
    }
    out = str(tmp_path_factory.mktemp("oracle"))
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zipfile's "Duplicate name" (the duplicate cases)
        cases = mutate.build(out, N, SEED, seeds)
    assert {c["cls"] for c in cases} == set(mutate.CLASSES) - ({"hf/remote-code"} if not HAS_HF else set())
    return harness.check(cases + _corpus_cases(malicious, benign))


_CLASSES = [*mutate.CLASSES, "corpus/malicious", "corpus/benign", "corpus/samples"]


@pytest.mark.parametrize(
    "cls",
    [
        pytest.param(
            c,
            marks=[
                *([pytest.mark.xfail(strict=True, reason=KNOWN_MISSES[c])] if c in KNOWN_MISSES else []),
                *([_NO_HF] if c.startswith("hf/") else []),
            ],
        )
        for c in _CLASSES
    ],
)
def test_scanner_covers_what_the_loaders_run(oracle, cls):
    st = oracle[cls]
    assert st["runs"] > 0
    shown = "\n".join(f"  {os.path.basename(p)} [{ld}]: {msg}" for p, ld, msg in st["failures"][:12])
    assert not st["failures"], f"{cls}: {len(st['failures'])} of {st['runs']} loader runs not covered:\n{shown}"


def test_the_oracle_sees_payloads_and_streams(oracle):
    """The hooks work: payloads are reached (and refused) in the malicious corpus and in the
    payload half of the mutations, and the loaders' streams are recorded (not an oracle
    that sees nothing and so passes everything)."""
    assert oracle["corpus/malicious"]["reached"] >= 40
    for cls in ("pickle/proto0-prefix", "torch-zip/proto0-prefix", "npy/descr", "dcp/metadata-drop-proto", "joblib/dtype"):
        assert oracle[cls]["reached"] > 0, cls
    for cls in mutate.CLASSES:
        if not cls.startswith(("package/import-module", "hf/")):
            assert oracle[cls]["spans"] > 0, cls
    assert oracle["package/import-module"]["sources"] > 0 and oracle["package/load-pickle"]["sources"] > 0
    assert oracle["corpus/benign"]["spans"] >= 40
    # and no false alarm: the legitimate artifacts reach nothing under the hooks
    assert oracle["corpus/benign"]["reached"] == 0 and oracle["corpus/samples"]["reached"] <= 2


def test_payloads_are_inert(malicious, tmp_path):
    """A payload reached under the oracle's hooks never runs: the corpus's marker files
    (``touch`` / ``open(..., 'w')`` at load time) are never created."""
    mal_dir, _markers, man = malicious
    markers = tmp_path / "markers"
    markers.mkdir()
    jobs = [(ld, os.path.join(mal_dir, e["name"])) for e in man[:20] for ld in _LOADERS.get(e["loader"], [e["loader"]])]
    os.environ["TORCHLESS_SCAN_MARKER_DIR"] = str(markers)
    try:
        rows = harness.run_loaders(jobs, procs=1)
    finally:
        del os.environ["TORCHLESS_SCAN_MARKER_DIR"]
    assert sum(bool(r["reached"]) for r in rows) >= 15
    assert not list(markers.iterdir())


def test_coverage_lists_the_exact_stream_bytes(tmp_path):
    """``scan(..., coverage=True)`` hashes each stream's bytes first opcode through STOP
    (checked against the bytes the test wrote), lists it by member and offset, and the
    default report has no coverage at all."""
    import pickle

    import torchless

    a = pickle.dumps({"a": [1, 2]}, protocol=2)
    b = pickle.dumps([3.5], protocol=5)
    p = tmp_path / "two.pkl"
    p.write_bytes(a + b)
    rep = torchless.scan(str(p), coverage=True, jobs=1)
    cov = rep.files[0].coverage
    assert [(c["offset"], c["length"], c["sha256"]) for c in cov] == [
        (0, len(a), hashlib.sha256(a).hexdigest()),
        (len(a), len(b), hashlib.sha256(b).hexdigest()),
    ]
    assert rep.to_dict()["files"][0]["coverage"] == cov
    plain = torchless.scan(str(p), jobs=1)
    assert plain.files[0].coverage is None and "coverage" not in plain.to_dict()["files"][0]
