"""AOTInductor content of a .pt2, as torch's package loader uses it (torchless.scan.aoti).

An ordinary ExportedProgram archive with a ``data/aotinductor/model/`` folder added is
loaded by ``torch.export.load``: its compile flags JSON becomes a shell command (proven
with a marker file in a child process), its ``.so`` is dlopen()ed. Each is a critical
``native-code`` finding naming what would run; ``torchless.load`` returns the program.
"""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from formats.aoti.synth import make_package, sample_consts

import torchless
from torchless.scan.aoti import aoti_models, compile_command

FLAGS = {
    "compile_only": True,
    "cflags": ["O2"],
    "definitions": ["X=1"],
    "include_dirs": ["inc"],
    "ldflags": [],
    "libraries": ["m"],
    "libraries_dirs": ["lib"],
    "passthrough_args": ["-fPIC"],
}


def test_compile_command_rendering() -> None:
    cmd = compile_command(dict(FLAGS, compiler="g++"), ["a.cpp"], "a.o")
    assert cmd == "g++ a.cpp -D X=1 -O2 -Iinc -fPIC -lm -Llib -c -o a.o"
    assert compile_command([1], ["a.cpp"], "a.o").startswith("<flags JSON is not an object")
    assert aoti_models(["data/aotinductor/model/x.so", "data/aotinductor/m2/y.cpp", "data/weights/w"]) == ["model", "m2"]


def test_shared_object_is_native_code(tmp_path: Path) -> None:
    p = make_package(tmp_path / "pkg.pt2", sample_consts(), layout="embedded")
    fr = torchless.scan(p, jobs=1).files[0]
    assert fr.verdict == "dangerous"
    nat = [f for f in fr.findings if f.rule == "native-code"]
    assert len(nat) == 1 and nat[0].severity == "critical" and nat[0].loader == "torch.export.load"
    assert nat[0].member.endswith(".wrapper.so") and "dlopen" in nat[0].message
    assert type(torchless.load(p)).__name__ == "AotiPackage"  # no ExportedProgram: the package itself


def test_extraction_escape_and_gpu_binaries(tmp_path: Path) -> None:
    extra = {
        "data/aotinductor/model/../../../../../../tmp/escaped.so": b"\x7fELF",
        "data/aotinductor/model/k.cubin": b"\0" * 8,
        "data/constants/c.so": b"\x7fELF",
        "other/data/aotinductor/model2/x.so": b"\x7fELF",
    }
    p = make_package(tmp_path / "pkg.pt2", sample_consts(), layout="binary_blob", extra=extra)
    fr = torchless.scan(p, jobs=1).files[0]
    crit = {(f.rule, f.member.rsplit("/", 1)[-1]) for f in fr.findings if f.severity == "critical"}
    assert ("path-traversal", "escaped.so") in crit
    assert ("native-code", "k.cubin") in crit
    assert ("native-code", "escaped.so") in crit
    assert ("native-code", "c.so") in crit  # data/constants is extracted into the model folder
    assert ("native-code", "x.so") in crit  # whatever prefix the C++ loader derives


@pytest.fixture(scope="module")
def exported(tmp_path_factory, torch):  # type: ignore[no-untyped-def]
    d = tmp_path_factory.mktemp("aoti")

    class M(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(2, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.lin(x)

    ep = torch.export.export(M(), (torch.randn(1, 2),))
    torch.export.save(ep, str(d / "ep.pt2"))
    return d


def _with_aoti(src: Path, dst: Path, marker: Path) -> Path:
    """``src`` plus an AOTInductor folder whose compile flags run ``touch marker``."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        names = zin.namelist()
        for n in names:
            zout.writestr(zipfile.ZipInfo(n), zin.read(n))
        stem = names[0].split("/", 1)[0] + "/data/aotinductor/model/cevil.wrapper"
        zout.writestr(stem + ".cpp", "int x;\n")
        zout.writestr(stem + "_compile_flags.json", json.dumps(dict(FLAGS, compiler=f"touch {marker}; true")))
        zout.writestr(stem + "_linker_flags.json", json.dumps(dict(FLAGS, compiler="true", compile_only=False)))
        zout.writestr(stem + "_metadata.json", json.dumps({"AOTI_DEVICE_KEY": "cpu"}))
    return dst


def test_flags_json_runs_under_torch_export_load(exported) -> None:  # type: ignore[no-untyped-def]
    d = exported
    marker = d / "marker_flags"
    p = _with_aoti(d / "ep.pt2", d / "evil.pt2", marker)
    child = (
        "import sys, warnings, logging; logging.disable(logging.CRITICAL); import torch\ntry:\n    "
        "torch.export.load(sys.argv[1])\nexcept Exception as e:\n    print(type(e).__name__)\n"
    )
    proc = subprocess.run([sys.executable, "-c", child, str(p)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert marker.exists(), "torch.export.load did not run the compile command"
    fr = torchless.scan(p, jobs=1).files[0]
    assert fr.verdict == "dangerous"
    flags = [f for f in fr.findings if f.rule == "native-code" and f.member.endswith("_compile_flags.json")]
    assert flags and flags[0].severity == "critical" and f"touch {marker}; true" in flags[0].message
    assert any(f.member.endswith("_linker_flags.json") for f in fr.findings if f.rule == "native-code")
    # torch.export.load returns the ExportedProgram of such an archive: so does torchless
    prog = torchless.load(p)
    assert type(prog).__name__ == "Program" and prog.name == "model"


def test_exported_program_alone_is_clean(exported) -> None:  # type: ignore[no-untyped-def]
    fr = torchless.scan(exported / "ep.pt2", jobs=1).files[0]
    assert fr.verdict == "clean", [(f.rule, f.message) for f in fr.findings]
