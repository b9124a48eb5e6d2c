"""TorchScript code and bytecode as torch reads them (torchless.scan.torchscript).

Evasions of a pattern search (spacing, comments, continuations, brackets, aliases,
``ops.aten``, ``getattr`` with concatenated strings, a ``.ptl`` without ``code/``) are each
proven to run under ``torch.jit.load`` / the lite interpreter (a marker file, in a child
process) and to be flagged; benign archives scan clean.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

import torchless
from torchless.core.errors import FormatError, LimitError
from torchless.scan.torchscript import analyse_bytecode, analyse_code, risk_of, tokenize
from torchless.scan.torchscript_ops import BUILTIN_CLASSES, RISKY_OPS, RISKY_PYTHON

ROOT = Path(__file__).resolve().parents[2]
PLACEHOLDER = "/TLMARK"  # short: torch inlines it in the call (longer strings become a local)
EXPR = f'torch.from_file("{PLACEHOLDER}", True, 1)'

#: variant name -> (statement inserted before the call's line, replacement of EXPR) in the
#: archive's code ({m}: the marker path)
VARIANTS = {
    "spaces": ("", 'torch . from_file ("{m}", True, 1)'),
    "tab": ("", 'torch.\tfrom_file("{m}", True, 1)'),
    "comment": ("", 'torch.from_file(  # torch.zeros(\n      "{m}", True, 1)'),
    "continuation": ("", 'torch.\\\n      from_file("{m}", True, 1)'),
    "brackets": ("", '(torch\n      .from_file)("{m}", True, 1)'),
    "ops_aten": ("", 'ops.aten.from_file("{m}", True, 1)'),
    "alias_fn": ("f = torch.from_file", 'f("{m}", True, 1)'),
    "alias_module": ("t = torch", 't.from_file("{m}", True, 1)'),
    "alias_ops": ("o = ops.aten", 'o.from_file("{m}", True, 1)'),
    "getattr": ("", 'getattr(torch, "from_" "file")("{m}", True, 1)'),
    "getattr_ops": ("", "getattr(ops.aten, 'from_file')(\"{m}\", True, 1)"),
    "save": ('torch.save(torch.zeros(1), "{m}")', "torch.zeros(1)"),
    "paren_root": ("", '(torch).from_file("{m}", True, 1)'),
    "paren_save": ('(torch).save(torch.zeros(1), "{m}")', "torch.zeros(1)"),
    "getattr_then_attr": ("", 'getattr(ops, "aten").from_file("{m}", True, 1)'),
}


def _apply(code: str, prelude: str, expr: str) -> str:
    """The code with EXPR replaced and the prelude inserted before its line."""
    at = code.index(EXPR)
    line = code.rfind("\n", 0, at) + 1
    indent = code[line : len(code) - len(code[line:].lstrip(" "))]
    head = code[:line] + (indent + prelude + "\n" if prelude else "")
    return head + code[line:at] + expr + code[at + len(EXPR) :]


# -- the lexer ------------------------------------------------------------------------


def _kinds(text: str) -> list[tuple[str, str]]:
    return [(k, t) for k, t, _p in tokenize(text)]


def test_lexer_follows_torch_rules() -> None:
    toks = _kinds("a = \"x\" 'y'  # comment\nb.\\\nc( 1,\n 2) # type: int\n")
    assert ("string", "xy") in toks  # adjacent literals joined
    assert ("name", "comment") not in toks  # comments dropped
    assert toks.count(("newline", "\n")) == 2  # no newline inside brackets or after a continuation
    assert ("op", "# type:") in toks  # type comments are tokens
    assert [t for k, t in toks if k == "name"] == ["a", "b", "c", "int"]
    assert _kinds('"""a\n\\"""b"""')[0] == ("string", 'a\n"""b')
    assert _kinds("x = 1.5e3j + 0x1f")[2:] == [("number", "1.5e3j"), ("op", "+"), ("number", "0x1f")]


@pytest.mark.parametrize("bad", ['x = "abc\n"', "x = 'abc", "x = $", "x = \\ y"])
def test_lexer_rejects_what_torch_rejects(bad: str) -> None:
    with pytest.raises(FormatError):
        list(tokenize(bad))


def test_token_budget() -> None:
    with pytest.raises(LimitError):
        list(tokenize("a " * 100, max_tokens=10))


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_every_variant_is_a_risky_reference(name: str) -> None:
    code = f"def __setstate__(self, s: int) -> None:\n    _1 = torch.numel({EXPR})\n    return None\n"
    rep = analyse_code(_apply(code, *(x.format(m="/x") for x in VARIANTS[name])))
    assert rep.setstate
    assert rep.risky, name
    assert {t for _r, t, _c, _w in rep.risky} & {"torch.from_file", "aten::from_file", "torch.save"}


def test_imports_and_clean_code() -> None:
    rep = analyse_code("import torch.ops.aten as A\nfrom torch import from_file as ff\ny = A.save(x, 'p')\nz = ff('q')\n")
    assert {t for _r, t, _c, _w in rep.risky} >= {"aten::save", "torch.from_file"}
    clean = analyse_code(
        "def forward(self, x: Tensor) -> Tensor:\n  _0 = torch.add(x, 1)\n  return torch.relu(ops.aten.linear(_0, self.w))\n"
    )
    assert clean.risky == [] and clean.references >= 3


def test_expression_forms() -> None:
    def targets(code: str) -> set[str]:
        return {t for _r, t, _c, _w in analyse_code(code).risky}

    assert targets("return (((torch))).save(x, 'p')\n") == {"torch.save"}
    assert targets("y = getattr(getattr(torch, 'ops'), 'aten').save(x, 'p')\n") == {"aten::save"}
    assert targets("y = getattr(torch, 'from_file', None)\n") == {"torch.from_file"}
    assert targets("y = x[0].from_file('p')\n") == {"?.from_file"}
    assert targets("y = f(torch).relu(x)\nz = (a, torch).count\n") == set()


def test_risk_table() -> None:
    assert RISKY_OPS["aten::from_file"][0] == "file" and "aten::save" in RISKY_OPS
    assert "torch.ops.load_library" in RISKY_PYTHON and "torch.jit.load" in RISKY_PYTHON
    assert risk_of(("torch", "classes", "evil", "Cls"))[0] == "torch.classes.evil.Cls"
    assert risk_of(("__torch__", "torch", "classes", "quantized", "LinearPackedParamsBase")) is None
    assert risk_of(("ops", "c10d", "allreduce_"))[1] == "network"
    assert risk_of(("torch", "relu")) is None


def test_bytecode_tables() -> None:
    value = (
        8,
        ("__torch__.M.__setstate__", (("instructions", (("OP", 0, 0),)), ("operators", (("aten::from_file", "", 3),))), None),
        ("__torch__.M.forward", (("operators", (("aten::relu", "", 1),)),), None),
    )
    rep = analyse_bytecode(value)
    assert rep.setstate == ["__torch__.M.__setstate__"]
    assert rep.operators == {"aten::from_file", "aten::relu"}
    assert [r[0] for r in rep.risky] == ["aten::from_file"]


def test_linear_time() -> None:
    # 1 MB of references, strings and aliases: the old search was quadratic in this
    text = (
        'x = torch.from_file("a")\n' * 20_000
        + "y = getattr(torch, "
        + '"a" ' * 50_000
        + ")\n"
        + "".join(f"a{i} = a{i + 1}\n" for i in range(20_000))
    )
    t = time.perf_counter()
    rep = analyse_code(text)
    assert time.perf_counter() - t < 10
    assert len(rep.risky) == 20_000


def test_generated_table_matches_torch(torch) -> None:  # type: ignore[no-untyped-def]
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_torchscript_ops.py")], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    generated: dict = {}
    exec(compile(out.stdout, "generated", "exec"), generated)  # our own generator's literal output
    # file/process/library entries must match torch exactly; builds with more backends
    # may register more collectives (judged by namespace) and more TorchBind classes
    local = {k: v for k, v in generated["RISKY_OPS"].items() if v[0] != "network"}
    assert local == {k: v for k, v in RISKY_OPS.items() if v[0] != "network"}
    assert generated["RISKY_PYTHON"] == RISKY_PYTHON
    assert generated["BUILTIN_CLASSES"] >= BUILTIN_CLASSES


# -- real archives under the real loaders ------------------------------------------------

_CHILD = r"""
import json, os, sys, warnings
warnings.filterwarnings("ignore")
import torch
from torch.jit.mobile import _load_for_lite_interpreter
out = {}
for loader, path, marker in json.loads(sys.argv[1]):
    try:
        (torch.jit.load if loader == "jit" else _load_for_lite_interpreter)(path)
        status = "loaded"
    except Exception as e:
        status = "raised " + type(e).__name__
    out[path] = [status, os.path.exists(marker)]
print(json.dumps(out))
"""


def _rewrite(src: Path, dst: Path, fn) -> Path:  # type: ignore[no-untyped-def]
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for info in zin.infolist():
            data = fn(info.filename, zin.read(info.filename))
            if data is not None:
                zout.writestr(zipfile.ZipInfo(info.filename), data)
    return dst


@pytest.fixture(scope="module")
def archives(tmp_path_factory, torch):  # type: ignore[no-untyped-def]
    """Evil base archives (.pt, .ptl) and the benign ones, written by torch."""
    d = tmp_path_factory.mktemp("ts")

    class Evil(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.x = 1

        def forward(self, a: torch.Tensor) -> torch.Tensor:
            return a

        @torch.jit.export
        def __getstate__(self) -> tuple[int, bool]:
            return (self.x, self.training)

        @torch.jit.export
        def __setstate__(self, s: tuple[int, bool]) -> None:
            self.training = s[1]
            self.x = s[0] + torch.from_file("/TLMARK", True, 1).numel()

    class Pure(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(3, 2)
            self.k = 2

        def forward(self, a: torch.Tensor) -> torch.Tensor:
            return torch.relu(self.lin(a)) * self.k

        @torch.jit.export
        def __getstate__(self) -> tuple[int, bool]:
            return (self.k, self.training)

        @torch.jit.export
        def __setstate__(self, s: tuple[int, bool]) -> None:
            self.training = s[1]
            self.k = s[0] + 1

    import warnings

    warnings.filterwarnings("ignore", category=DeprecationWarning)
    torch.jit.save(torch.jit.script(Evil()), str(d / "evil.pt"))
    torch.jit.script(Evil())._save_for_lite_interpreter(str(d / "evil.ptl"))
    torch.jit.save_jit_module_to_flatbuffer(torch.jit.script(Evil()), str(d / "evil.ff"))
    torch.jit.save_jit_module_to_flatbuffer(torch.jit.script(Pure()), str(d / "pure_setstate.ff"))
    benign = {}
    torch.jit.save(torch.jit.script(Pure()), str(d / "pure_setstate.pt"))
    torch.jit.script(Pure())._save_for_lite_interpreter(str(d / "pure_setstate.ptl"))
    lin = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU())
    torch.jit.save(torch.jit.trace(lin, torch.randn(1, 3)), str(d / "traced.pt"))
    torch.jit.script(lin)._save_for_lite_interpreter(str(d / "scripted.ptl"))
    for n in ("pure_setstate.pt", "pure_setstate.ptl", "pure_setstate.ff", "traced.pt", "scripted.ptl"):
        benign[n] = d / n
    return d, benign


def test_evasions_run_under_their_loader_and_are_flagged(archives) -> None:  # type: ignore[no-untyped-def]
    d, _benign = archives
    jobs = []
    for name, (prelude, expr) in VARIANTS.items():
        marker = d / f"marker_{name}"

        def edit(fname: str, data: bytes, prelude: str = prelude.format(m=marker), expr: str = expr.format(m=marker)) -> bytes:
            if "/code/" in fname and fname.endswith(".py") and EXPR.encode() in data:
                return _apply(data.decode(), prelude, expr).encode()
            return data

        path = _rewrite(d / "evil.pt", d / f"{name}.pt", edit)
        with zipfile.ZipFile(path) as z:
            assert not any(PLACEHOLDER.encode() in z.read(n) for n in z.namelist() if n.endswith(".py")), name
        jobs.append(("jit", str(path), str(marker)))
    # a .ptl without code/: the lite interpreter runs bytecode.pkl alone (the constant is
    # replaced by a relative path of the same length; the child runs in ``d``)
    marker = d / "BCMRK"

    def bytecode_only(fname: str, data: bytes) -> bytes | None:
        if "/code/" in fname:
            return None
        return data.replace(PLACEHOLDER.encode(), b"./BCMRK")

    jobs.append(("lite", str(_rewrite(d / "evil.ptl", d / "bytecode_only.ptl", bytecode_only)), str(marker)))
    # a flatbuffer module (PTMF): torch.jit.load and the lite interpreter read it by content
    fb = d / "evil_flatbuffer.bin"
    fb.write_bytes((d / "evil.ff").read_bytes().replace(PLACEHOLDER.encode(), b"./FBMRK"))
    jobs.append(("jit", str(fb), str(d / "FBMRK")))
    proc = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(jobs)], capture_output=True, text=True, timeout=300, cwd=d)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ran = json.loads(proc.stdout.strip().splitlines()[-1])
    for _loader, path, _m in jobs:
        status, made = ran[path]
        assert made, f"{path}: {status}, payload did not run"
        fr = torchless.scan(path, jobs=1).files[0]
        assert fr.verdict == "dangerous", (path, [(f.rule, f.message) for f in fr.findings])
        rules = {f.rule for f in fr.findings if f.severity == "critical"}
        assert rules == {"torchscript-code"}, (path, rules)
    assert torchless.scan(fb, jobs=1).files[0].kind == "torchscript-flatbuffer"
    bc = torchless.scan(d / "bytecode_only.ptl", jobs=1).files[0]
    assert any("bytecode operator table calls aten::from_file" in f.message for f in bc.findings)


def test_benign_archives_scan_clean(archives) -> None:  # type: ignore[no-untyped-def]
    _d, benign = archives
    for name, path in benign.items():
        fr = torchless.scan(path, jobs=1).files[0]
        assert fr.verdict == "clean", (name, [(f.rule, f.severity, f.message) for f in fr.findings])
        if name.startswith("pure_setstate"):
            assert any(f.rule == "torchscript-code" and f.severity == "info" for f in fr.findings)


def test_broken_flatbuffer_is_unanalysable(archives, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    d, _benign = archives
    data = bytearray((d / "pure_setstate.ff").read_bytes())
    for cut in (12, 64, len(data) // 2):
        p = tmp_path / f"cut{cut}.ff"
        p.write_bytes(bytes(data[:cut]))
        fr = torchless.scan(p, jobs=1).files[0]
        assert fr.verdict in ("unanalysable", "dangerous"), (cut, [(f.rule, f.message) for f in fr.findings])
    data[0:4] = (len(data) + 100).to_bytes(4, "little")  # root offset past the end
    p = tmp_path / "badroot.ff"
    p.write_bytes(bytes(data))
    assert torchless.scan(p, jobs=1).files[0].verdict == "unanalysable"


def test_unlexable_code_is_unanalysable(archives) -> None:  # type: ignore[no-untyped-def]
    d, benign = archives

    def breaks(fname: str, data: bytes) -> bytes:
        return data + b"\nx = 'unterminated\n" if "/code/" in fname and fname.endswith(".py") else data

    fr = torchless.scan(_rewrite(benign["pure_setstate.pt"], d / "broken.pt", breaks), jobs=1).files[0]
    assert fr.verdict == "unanalysable"
    assert any(f.rule == "unanalysable" and f.loader == "torch.jit.load" for f in fr.findings)
