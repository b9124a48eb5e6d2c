"""torch.package archives: listed and read without running packaged code; tensors
bit-exact against PackageImporter.load_pickle (run in a child process); the scanner
reports the packaged source a load would run, and malicious packages."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile

import numpy as np
import pytest

import torchless
from torchless.cli.main import main
from torchless.core.errors import FormatError, TorchlessError, UnsafeGlobalError

pytest.importorskip("torch", reason="torch.package writes the archives")
HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="module")
def pkgs(tmp_path_factory):
    out = tmp_path_factory.mktemp("package")
    marker = str(out / "MARKER")
    r = subprocess.run(
        [sys.executable, os.path.join(HERE, "gen_package.py"), str(out), marker], capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert not os.path.exists(marker)
    return out, marker


def _torch_tensors(path: str, records: list[tuple[str, str]]) -> list[dict]:
    """What PackageImporter.load_pickle gives (a child process: packaged code runs there)."""
    code = (
        "import sys, torch, json\nfrom torch.package import PackageImporter\nout = []\n"
        f"imp = PackageImporter({path!r})\n"
        f"for pkg, res in {records!r}:\n"
        "    obj = imp.load_pickle(pkg, res)\n"
        "    sd = obj.state_dict() if hasattr(obj, 'state_dict') else {k: v "
        "for k, v in obj.items() if isinstance(v, torch.Tensor)}\n"
        "    out.append({k: [str(v.dtype).split('.')[1], list(v.shape), "
        "v.contiguous().view(torch.uint8).numpy().tobytes().hex()] for k, v in sd.items()})\n"
        "print(json.dumps(out))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout)


@pytest.mark.differential
def test_lists_and_reads_bit_exact(pkgs):
    out, marker = pkgs
    p = str(out / "benign.pt")
    assert torchless.detect(p) == "package"
    with torchless.open(p, weights_only=False) as art:
        info = art.info()
        assert info["modules"] == {"interned": ["mypkg.model"], "mocked": ["numpy"], "extern": info["modules"]["extern"]}
        assert "torch" in info["modules"]["extern"]
        assert info["pickles"] == ["model/model.pkl", "res/sd.pkl"] and info["resources"] == ["res/note.txt"]
        assert info["imports"] == {"model/model.pkl": ["mypkg.model"], "res/sd.pkl": []}
        got = dict(art.tensors())
        wants = _torch_tensors(p, [("model", "model.pkl"), ("res", "sd.pkl")])
        assert wants[0] and wants[1]
        for rec, want in zip(("model/model.pkl", "res/sd.pkl"), wants, strict=False):
            for k, (dt, shape, hexbytes) in want.items():
                t = got[f"{rec}:{k}"]
                assert t.dtype.name == dt and list(t.shape) == shape and np.asarray(t.numpy()).tobytes().hex() == hexbytes, k
        assert art.verify() == []
    assert not os.path.exists(marker)


def test_default_policy_refuses_packaged_classes(pkgs):
    out, _ = pkgs
    with pytest.raises(UnsafeGlobalError, match="mypkg.model"):
        list(torchless.open(out / "benign.pt").tensors())


def test_cli(pkgs, capsys, tmp_path):
    out, marker = pkgs
    assert main(["ls", str(out / "benign.pt")]) == 0
    assert "res/sd.pkl:w" in capsys.readouterr().out
    assert main(["info", str(out / "benign.pt"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["format"] == "package"
    assert main(["convert", str(out / "benign.pt"), str(tmp_path / "w.safetensors")]) == 0
    assert torchless.load(tmp_path / "w.safetensors")["model/model.pkl:l.weight"].shape == (2, 3)
    assert main(["verify", str(out / "benign.pt")]) == 0
    assert not os.path.exists(marker)


def test_scan_reports_packaged_source(pkgs):
    out, marker = pkgs
    # every packaged .py is parsed (never run): the benign model's source does only what model
    # code does (an info note; its pickle's unknown global keeps it from CLEAN), the payload
    # is critical, with its line and call
    for name, rec, sev in (("benign.pt", "mypkg/model.py", "info"), ("evil_source.pt", "evil/payload.py", "critical")):
        rep = torchless.scan(out / name, jobs=1)
        f = rep.files[0]
        assert f.kind == "torch-package" and f.verdict != "clean" and rep.exit_code == 1
        code = [x for x in f.findings if x.rule == "source-code" and x.member.endswith(rec)]
        assert code and {x.severity for x in code} == {sev} and code[0].loader == "torch.package.PackageImporter", code
        assert f.verdict == ("dangerous" if sev == "critical" else "suspicious"), f.findings
    evil = [x for x in torchless.scan(out / "evil_source.pt", jobs=1).files[0].findings if x.severity == "critical"]
    assert any("line 1: open(..., 'w')" in x.message and "evil.payload.Thing" in x.message for x in evil), evil
    assert not os.path.exists(marker)
    # the oracle: loading the evil package really runs its source
    subprocess.run(
        [
            sys.executable,
            "-c",
            "from torch.package import PackageImporter; "
            f"PackageImporter({str(out / 'evil_source.pt')!r}).load_pickle('m', 'obj.pkl')",
        ],
        check=True,
        timeout=120,
        capture_output=True,
    )
    assert os.path.exists(marker)
    os.remove(marker)


def test_scan_flags_malicious_pickle(pkgs):
    out, marker = pkgs
    p = str(out / "evil_pickle.pt")
    rep = torchless.scan(p, jobs=1)
    f = rep.files[0]
    assert f.verdict == "dangerous" and f.kind == "torch-package"
    hit = [x for x in f.findings if x.severity == "critical"]
    assert hit and hit[0].member.endswith("m/obj.pkl") and hit[0].loader == "torch.package.PackageImporter"
    with pytest.raises(UnsafeGlobalError):
        list(torchless.open(p).tensors())
    list(torchless.open(p, weights_only=False).tensors())  # placeholders, nothing runs
    assert not os.path.exists(marker)


def _rewrite(src, dst, drop=(), add=()):
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for i in zin.infolist():
            if not any(i.filename.endswith(d) for d in drop):
                zout.writestr(i, zin.read(i))
        for name, data in add:
            zout.writestr(name, data)
    return dst


def test_hostile(pkgs, tmp_path):
    out, _ = pkgs
    src = out / "benign.pt"
    p = _rewrite(src, tmp_path / "nostorage.pt", drop=(".data/3.storage",))
    with pytest.raises(FormatError, match="storage record"):
        list(torchless.open(p, weights_only=False).tensors())
    assert torchless.open(p, weights_only=False).verify()
    # a persistent id torch.package resolves by calling packaged code (__reduce_package__)
    evil = b"\x80\x02(X\x0e\x00\x00\x00reduce_packagecposix\nsystem\nX\x04\x00\x00\x00truetQ."
    p = _rewrite(src, tmp_path / "rp.pt", add=(("benign/x/rp.pkl", evil),))
    art = torchless.open(p, weights_only=False)
    assert "x/rp.pkl" in art.pickles
    with pytest.raises(TorchlessError):
        art.load_pickle("x/rp.pkl")
    raw = open(src, "rb").read()
    cut = tmp_path / "cut.pt"
    cut.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(TorchlessError):
        torchless.open(cut, format="package")
