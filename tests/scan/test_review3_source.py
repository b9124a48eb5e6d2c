"""Issue 30, item 2: executable source is a carrier (torch.package modules, Hugging Face
remote code). Every sample of ``corpus/gen_review3_source.py`` is proven to run its payload
under its real loader (``corpus/run_review3_source.py``: ``PackageImporter``,
``transformers`` ``from_pretrained(..., trust_remote_code=True)`` / ``pipeline`` offline, in
forked children) and must scan DANGEROUS; the benign controls (a real PackageExporter export
of an nn.Module, a transformers-style remote-code model) must not.

Also unit tests of the source analyser (``torchless.scan.source``) and of the remote-code
resolution (``torchless.scan.remote_code``).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import torchless

from .conftest import CORPUS, ENV

HAS_TORCH = importlib.util.find_spec("torch") is not None
HAS_HF = importlib.util.find_spec("transformers") is not None


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict[str, Any]]:
    out = tmp_path_factory.mktemp("review3")
    markers = tmp_path_factory.mktemp("review3-markers")
    env = {k: v for k, v in os.environ.items() if k != ENV}  # the generator must not fire payloads
    cmd = [sys.executable, os.path.join(CORPUS, "gen_review3_source.py"), str(out)] + ([] if HAS_TORCH else ["--no-torch"])
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(out / "manifest.json") as f:
        return out, markers, json.load(f)


@pytest.fixture(scope="module")
def proofs(corpus: tuple[Path, Path, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    if not hasattr(os, "fork"):
        pytest.skip("the loader runner forks one child per sample")
    out, markers, _man = corpus
    proc = subprocess.run(
        [sys.executable, os.path.join(CORPUS, "run_review3_source.py"), str(out), str(markers), "--jobs", "2"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = {r["name"]: r for r in (json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{"))}
    found = os.listdir(markers)
    for name, r in res.items():
        r["marker"] = name in found
    return res


def _verdicts(path: Path) -> dict[str, str]:
    rep = torchless.scan(path, jobs=1)
    return {f.path: f.verdict for f in rep.files}


def test_corpus_covers_the_classes(corpus: tuple[Path, Path, dict[str, Any]]) -> None:
    _out, _m, man = corpus
    names = [s["name"] for s in man["samples"]]
    assert len(names) == len(set(names))
    if HAS_TORCH:
        assert len(names) >= 12, names
        assert {s["loader"] for s in man["samples"]} >= {
            "package-pickle",
            "package-text",
            "package-binary",
            "package-module",
            "hf-config",
            "hf-model",
            "hf-tokenizer",
            "hf-hub-config",
            "hf-pipeline",
        }


def test_every_sample_runs_under_its_loader(corpus: tuple[Path, Path, dict[str, Any]], proofs: dict[str, dict[str, Any]]) -> None:
    _out, _m, man = corpus
    missed = {}
    for s in man["samples"]:
        r = proofs[s["name"]]
        if r["status"] == "skipped":
            assert s["loader"].startswith("hf-") and not HAS_HF
            continue
        if not r["marker"]:
            missed[s["name"]] = r
    assert not missed, f"payloads that did not run under their loader: {missed}"
    if not HAS_HF:
        pytest.skip("transformers is not installed: the Hugging Face samples were not proven (pip install transformers)")


def test_every_sample_scans_dangerous(corpus: tuple[Path, Path, dict[str, Any]]) -> None:
    out, _m, man = corpus
    bad = {}
    for s in man["samples"]:
        v = _verdicts(out / s["scan"])
        if "dangerous" not in v.values():
            bad[s["name"]] = v
    assert not bad, bad


def test_controls_are_not_dangerous(corpus: tuple[Path, Path, dict[str, Any]], proofs: dict[str, dict[str, Any]]) -> None:
    out, markers, man = corpus
    for c in man["controls"]:
        if proofs[c["name"]]["status"] != "skipped":
            assert proofs[c["name"]]["status"] == "done", proofs[c["name"]]  # the benign artifacts load
        rep = torchless.scan(out / c["scan"], jobs=1)
        assert all(f.verdict != "dangerous" for f in rep.files), [(f.path, f.findings) for f in rep.files]
        notes = [f for f in rep.findings if f.rule == "source-code"]
        assert notes and all(f.severity == "info" for f in notes), notes  # analysed, nothing outside model code
        if c["name"] == "control_hf":
            assert rep.exit_code == 0 and {f.verdict for f in rep.files} == {"clean"}
    assert not [m for m in os.listdir(markers) if m.startswith("control")]


def test_package_findings_name_file_line_and_loader_path(corpus: tuple[Path, Path, dict[str, Any]]) -> None:
    out, _m, man = corpus
    if not HAS_TORCH:
        pytest.skip("the packages are written by torch's PackageExporter")
    rep = torchless.scan(out / "pkg_nested_init_chain.pt", jobs=1)
    crit = [f for f in rep.findings if f.severity == "critical"]
    assert crit and crit[0].member.endswith("a/__init__.py") and "line 1" in crit[0].message
    assert "parent package of a.b.c" in crit[0].message and crit[0].loader == "torch.package.PackageImporter"
    rep = torchless.scan(out / "pkg_import_module_unreferenced.pt", jobs=1)
    crit = [f for f in rep.findings if f.severity == "critical"]
    assert crit and "import_module('models.net')" in crit[0].message and "os.system" in crit[0].message


# -- the analyser -----------------------------------------------------------------------


def analyse(src: str) -> Any:
    from torchless.scan.source import analyse  # imported here: the corpus tests also run against older trees

    return analyse(src)


def _sev(src: str) -> set[str]:
    return {p.severity for p in analyse(src).problems}


def test_analyser_allows_model_code() -> None:
    src = (
        "import math\nfrom typing import Optional\nimport torch\nfrom torch import nn\n"
        "from transformers import PreTrainedModel\nfrom .configuration_x import XConfig\n"
        "class M(PreTrainedModel):\n    def forward(self, input, mask: Optional[torch.Tensor] = None):\n"
        "        h = getattr(self, f'layer_{0}')(input)\n        return torch.relu(h) / math.sqrt(4)\n"
    )
    rep = analyse(src)
    assert rep.problems == [] and rep.relative == [(1, "configuration_x")]


@pytest.mark.parametrize(
    "src, sev",
    [
        ("import subprocess\n", "critical"),
        ("import os\nos.system('x')\n", "critical"),
        ("from os import system as s\ns('x')\n", "critical"),
        ("import os as o\nf = o.popen\n", "critical"),
        ("getattr(__import__('o' + 's'), 'sys' + 'tem')('x')\n", "critical"),
        ("import os\ngetattr(os, ''.join(['sys', 'tem']))('x')\n", "critical"),
        ("import os\nn = input\ngetattr(os, n)('x')\n", "critical"),
        ("import torch\ntorch.serialization.os.system('x')\n", "critical"),
        ("exec('1')\n", "critical"),
        ("def f(exec, open, getattr):\n    pass\nexec('1')\n", "critical"),  # a parameter elsewhere hides nothing
        ("import os\ndef f(getattr):\n    pass\ngetattr(os, name)('x')\n", "critical"),
        ("import os\nos.__getattribute__('system')('x')\n", "critical"),
        ("import os\nvars(os)['sys' + 'tem']('x')\n", "critical"),
        ("import os, functools\nfunctools.reduce(getattr, ['system'], os)('x')\n", "high"),
        ("import os, operator\noperator.attrgetter('system')(os)('x')\n", "high"),
        ("globals()['__builtins__']\n", "critical"),
        ("import sys\nsys.modules['x'] = None\n", "critical"),
        ("x = (1).__class__.__subclasses__()\n", "critical"),
        ("open('/tmp/x', 'w').write('a')\n", "critical"),
        ("def save(p):\n    open(p, 'w').write('a')\n", "medium"),
        ("import torch\ntorch.load('x', weights_only=False)\n", "critical"),
        ("import numpy\nnumpy.load('x', allow_pickle=True)\n", "critical"),
        ("import requests\n", "critical"),
        ("import somethingelse\n", "medium"),
        ("def f(:\n", "unanalysable"),
        ("x = " + "(" * 300 + ")" * 300 + "\n", "unanalysable"),  # Python's parser refuses it too
    ],
)
def test_analyser_flags(src: str, sev: str) -> None:
    got = _sev(src)
    assert sev in got, (src, analyse(src).problems)
    if sev != "critical":
        assert "critical" not in got, (src, analyse(src).problems)


def test_payload_in_a_function_is_still_critical() -> None:
    rep = analyse("import subprocess\nclass M:\n    def __init__(self):\n        subprocess.run(['x'])\n")
    ps = [p for p in rep.problems if p.line == 4]
    assert ps and ps[0].severity == "critical" and not ps[0].at_import


# -- remote-code resolution ---------------------------------------------------------------


def _write(d: Path, files: dict[str, str]) -> None:
    for k, v in files.items():
        (d / k).parent.mkdir(parents=True, exist_ok=True)
        (d / k).write_text(v)


def test_missing_or_escaping_module_is_never_clean(tmp_path: Path) -> None:
    m = tmp_path / "m"
    _write(m, {"config.json": json.dumps({"auto_map": {"AutoModel": "modeling_gone.X"}})})
    fr = torchless.scan(m / "config.json", jobs=1).files[0]
    assert fr.verdict == "unanalysable" and any(f.rule == "unanalysable" for f in fr.findings)
    _write(tmp_path, {"outside.py": "import os\nos.system('x')\n"})
    os.symlink(tmp_path / "outside.py", m / "modeling_gone.py")
    rep = torchless.scan(m, jobs=1)
    cfg = next(f for f in rep.files if f.path.endswith("config.json"))
    assert cfg.verdict != "clean" and any(f.rule == "link-escape" for f in cfg.findings), cfg.findings
    # another repository the scanned folder does not hold
    _write(m, {"config.json": json.dumps({"auto_map": {"AutoConfig": "org/other--configuration_o.C"}})})
    fr = torchless.scan(m / "config.json", jobs=1).files[0]
    assert fr.verdict == "unanalysable"
    assert {f.loader for f in fr.counted()} == {"transformers from_pretrained(trust_remote_code=True)"}


def test_unreferenced_py_is_reported_at_most_medium(tmp_path: Path) -> None:
    _write(tmp_path, {"config.json": json.dumps({"model_type": "bert"}), "convert.py": "import os\nos.system('x')\n"})
    fr = next(f for f in torchless.scan(tmp_path, jobs=1).files if f.path.endswith("convert.py"))
    assert fr.verdict == "suspicious" and {f.severity for f in fr.findings if f.rule == "source-code"} == {"medium"}
    # named by auto_map: the same source is critical, in its own report and the config's
    _write(tmp_path, {"config.json": json.dumps({"auto_map": {"AutoConfig": "convert.C"}})})
    assert set(_verdicts(tmp_path).values()) == {"dangerous"}


def test_analyser_never_raises_on_hostile_text() -> None:
    from hypothesis import given, settings
    from hypothesis import strategies as st

    pieces = st.sampled_from(
        [
            "import os\n",
            "os.system(x)\n",
            "def f(",
            "):\n",
            "    ",
            "(",
            ")",
            "getattr(",
            "'a' + 'b'",
            "\\",
            "\n",
            "lambda: ",
            "[",
            "]",
            "__import__",
            "x.y.z",
            "#",
            '"""',
        ]
    )

    @settings(max_examples=100, deadline=None, database=None)
    @given(st.one_of(st.text(max_size=200), st.lists(pieces, max_size=60).map("".join)))
    def check(src: str) -> None:
        rep = analyse(src)
        assert all(p.severity in ("critical", "high", "medium", "low", "info", "unanalysable", "limit") for p in rep.problems)

    check()
