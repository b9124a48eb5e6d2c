"""What ``torchless info`` loads to answer (issue 12's start-up row), not how long it takes.

The start-up cost over ``import numpy`` is mostly imports. These tests run the command in a
fresh interpreter, list the modules it held at exit, and check that what ``info`` of a
float32 ``.pt`` or safetensors file does not need stays unloaded; and that each deferral
answers as the eager code did, with what it avoids as the oracle (pathlib for detection's
paths, shutil for the help width, the full parser for each command).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import torchless
from torchless.cli import main as cli
from torchless.formats.base import Probe

SAMPLES = Path(__file__).resolve().parents[2] / "samples"

#: never needed to summarize a float32 checkpoint: each was imported by `info` before the
#: start-up work (ml_dtypes by the dtype table, pathlib by detection, shutil by argparse's
#: help width, signal by the writers' clean-up, decimal by the allowlist, bz2/lzma by the
#: joblib handler, the other commands' modules by the parser), or belongs to another feature
NOT_FOR_INFO = [
    "ml_dtypes",
    "pathlib",
    "shutil",
    "signal",
    "decimal",
    "bz2",
    "lzma",
    "torch",
    "onnx",
    "fsspec",
    "rich",
    "torchless.interp",
    "torchless.graph",
    "torchless.scan",
    "torchless.view",
    "torchless.formats.pt.write",
    "torchless.cli.commands.scan",
    "torchless.cli.commands.view",
    "torchless.cli.commands.run",
    "torchless.cli.commands.graph",
]


#: runs the command line as ``python -m torchless`` does, then writes the names of every
#: module the process holds (``-X importtime`` would miss those imported through
#: ``importlib.import_module``: the registries' handlers and commands)
_RUNNER = """
import atexit, os, runpy, sys
def _dump():
    with open(os.environ["TL_MODULES_OUT"], "w") as f:
        f.write("\\n".join(sorted(sys.modules)))
atexit.register(_dump)
sys.argv[0] = "torchless"
runpy.run_module("torchless", run_name="__main__")
"""


def _imported(*argv: str, tmp: Path) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    """Run ``torchless ARGV`` in a fresh interpreter on this checkout; the modules it loaded."""
    env = dict(os.environ)
    src = str(Path(torchless.__file__).resolve().parents[1])
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    out = tmp / "modules.txt"
    env["TL_MODULES_OUT"] = str(out)
    r = subprocess.run(
        [sys.executable, "-c", _RUNNER, *argv],
        capture_output=True,
        text=True,
        env=env,
        stdin=subprocess.DEVNULL,
        timeout=120,
    )
    return r, set(out.read_text().split("\n"))


def _loaded(mods: set[str], name: str) -> bool:
    return any(m == name or m.startswith(name + ".") for m in mods)


def _write(path: Path, dtype: str) -> Path:
    import ml_dtypes

    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    torchless.write_tensors({"w": a.astype(ml_dtypes.bfloat16) if dtype == "bfloat16" else a}, path)
    return path


@pytest.mark.parametrize("kind", ["pt", "safetensors"])
def test_info_of_float32_file_loads_only_what_it_needs(tmp_path, kind):
    path = SAMPLES / "checkpoint.pt" if kind == "pt" else _write(tmp_path / "w.safetensors", "float32")
    r, mods = _imported("info", str(path), tmp=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert f"format: {kind}" in r.stdout and "float32" in r.stdout
    assert "numpy" in mods and "torchless.cli.commands.generic" in mods  # the probe sees imports
    assert [m for m in NOT_FOR_INFO if _loaded(mods, m)] == []


def test_ml_dtypes_loads_when_bfloat16_values_are_read(tmp_path):
    """Listing a bfloat16 tensor needs its name and size only; comparing values needs the
    NumPy type, and the same probe sees the deferred import happen."""
    a, b = _write(tmp_path / "a.safetensors", "bfloat16"), _write(tmp_path / "b.safetensors", "bfloat16")
    r, mods = _imported("info", str(a), tmp=tmp_path)
    assert r.returncode == 0 and "bfloat16" in r.stdout
    assert "ml_dtypes" not in mods
    r, mods = _imported("diff", str(a), str(b), tmp=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "ml_dtypes" in mods


def test_dtype_table_resolves_ml_dtypes_on_first_use():
    code = (
        "import sys, numpy as np\n"
        "from torchless.core import dtypes\n"
        "assert 'ml_dtypes' not in sys.modules\n"
        "import ml_dtypes\n"
        # by NumPy dtype first (no name asked before), then by name
        "assert dtypes.from_numpy(np.dtype(ml_dtypes.bfloat16)).name == 'bfloat16'\n"
        "assert dtypes.from_numpy(np.dtype(ml_dtypes.float8_e4m3fn)).name == 'float8_e4m3fn'\n"
        "d = dtypes.by_name('float8_e5m2')\n"
        "assert d.numpy == np.dtype(ml_dtypes.float8_e5m2) == d.storage\n"
        "assert dtypes.DTYPES['bfloat16'].numpy == np.dtype(ml_dtypes.bfloat16)\n"
        "assert hash(d) == hash(dtypes.by_name('float8_e5m2')) and repr(d) == 'torch.float8_e5m2'\n"
        "e = dtypes.by_name('float8_e8m0fnu')\n"
        "t = getattr(ml_dtypes, 'float8_e8m0fnu', None)\n"
        "assert e.numpy == (None if t is None else np.dtype(t))\n"
        "assert e.storage == (np.dtype(np.uint8) if t is None else np.dtype(t))\n"
    )
    env = dict(os.environ)
    env["PYTHONPATH"] = str(Path(torchless.__file__).resolve().parents[1]) + os.pathsep + env.get("PYTHONPATH", "")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr


def _commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))  # noqa: SLF001
    return dict(sub.choices)


def test_one_command_parser_is_the_full_parsers_command(monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    full = cli.build_parser()
    commands = _commands(full)
    assert len(commands) > 10
    for name, want in commands.items():
        p = cli.build_parser(name)
        assert list(_commands(p)) == [name]
        got = _commands(p)[name]
        assert got.format_help() == want.format_help(), name
        assert got.format_usage() == want.format_usage(), name
        for action in want._actions:  # noqa: SLF001 - nested sub-commands (onnx, ts, cache)
            if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
                nested = next(a for a in got._actions if isinstance(a, argparse._SubParsersAction))  # noqa: SLF001
                for sub_name, sub_parser in action.choices.items():
                    assert nested.choices[sub_name].format_help() == sub_parser.format_help(), (name, sub_name)
    # anything that is not a command's name: every command (help, usage errors)
    for word in (None, "--help", "-h", "--version", "nosuch"):
        assert list(_commands(cli.build_parser(word))) == list(commands)


@pytest.mark.parametrize("columns", [None, "40", "120", "0", "-3", "wide"])
def test_help_width_is_shutils(monkeypatch, columns):
    if columns is None:
        monkeypatch.delenv("COLUMNS", raising=False)
    else:
        monkeypatch.setenv("COLUMNS", columns)
    assert cli._help_width() == shutil.get_terminal_size().columns - 2  # noqa: SLF001


def test_help_and_usage_errors_unchanged_in_a_fresh_process(tmp_path):
    """The top-level help lists every command; a usage error inside a command is the command's."""
    r, _ = _imported("--help", tmp=tmp_path)
    assert r.returncode == 0
    for name in _commands(cli.build_parser()):
        assert name in r.stdout
    r, mods = _imported("info", tmp=tmp_path)
    assert r.returncode == 2 and "usage: torchless info" in r.stderr and "required: path" in r.stderr
    assert not _loaded(mods, "torchless.cli.commands.scan")


@pytest.mark.parametrize(
    "spelling",
    ["{d}/f.PT", "{d}//f.pt", "{d}/./f.pt", "{d}/sub/", "{d}/sub/.", "{d}/sub", "{d}/f", "{d}/.hidden", "{d}/f.tar.gz", "{d}/f."],
)
def test_probe_paths_as_pathlib_spells_them(tmp_path, spelling):
    (tmp_path / "sub").mkdir()
    for n in ("f.PT", "f.pt", "f", ".hidden", "f.tar.gz", "f."):
        (tmp_path / n).write_bytes(b"x" * 10)
    text = spelling.format(d=tmp_path)
    want = Path(text)
    p = Probe.of(text)
    assert (p.is_dir, p.suffix, p.name) == (want.is_dir(), want.suffix.lower(), want.name)
    assert p.path == want and str(p.path) == str(want)
    assert p.head == (b"" if want.is_dir() else b"x" * 10)


def test_probe_of_missing_path_says_pathlibs_spelling(tmp_path):
    with pytest.raises(torchless.NotFoundError) as e:
        Probe.of(f"{tmp_path}//nope.pt")
    assert e.value.path == str(Path(f"{tmp_path}//nope.pt"))


#: runs the command line as ``python -m torchless`` does, holding an object that only the
#: interpreter's teardown frees (its finalizer says so on stderr) and an atexit callback
_TEARDOWN = """
import atexit, os, runpy, sys, threading
class _Noisy:
    def __del__(self):
        os.write(2, b"<teardown>")
_held = _Noisy()
atexit.register(lambda: os.write(2, b"<atexit>"))
if os.environ.get("TL_OTHER_THREAD"):
    threading.Thread(target=threading.Event().wait, daemon=True).start()
sys.argv[0] = "torchless"
runpy.run_module("torchless", run_name="__main__")
"""


def _run_cli(*argv: str, other_thread: bool = False) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(Path(torchless.__file__).resolve().parents[1]) + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("TL_OTHER_THREAD", None)
    if other_thread:
        env["TL_OTHER_THREAD"] = "1"
    return subprocess.run(
        [sys.executable, "-c", _TEARDOWN, *argv], capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL, timeout=120
    )


def test_read_only_command_ends_without_teardown_and_says_everything(capsys):
    """``info`` writes nothing: the process ends after the answer without the interpreter's
    teardown (the held object's finalizer never runs), yet the atexit callbacks run and the
    output is the whole answer, byte for byte what the command prints in process."""
    path = str(SAMPLES / "checkpoint.pt")
    assert cli.main(["info", path]) == 0
    expected = capsys.readouterr().out
    r = _run_cli("info", path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout == expected and expected.count("\n") > 10
    assert "<atexit>" in r.stderr and "<teardown>" not in r.stderr
    r = _run_cli("info", str(SAMPLES / "no-such-file.pt"))  # an error ends as quickly, with its line and code
    assert r.returncode == 2 and "no such file" in r.stderr
    assert "<atexit>" in r.stderr and "<teardown>" not in r.stderr


def test_writing_command_and_other_threads_keep_the_ordinary_exit(tmp_path):
    """A command that writes, or a process with another thread still running, exits as
    Python does (the teardown's finalizer runs)."""
    dst = tmp_path / "out.safetensors"
    r = _run_cli("convert", str(SAMPLES / "checkpoint.pt"), str(dst))
    assert r.returncode == 0, r.stderr[-2000:]
    assert dst.exists() and "<atexit>" in r.stderr and "<teardown>" in r.stderr
    r = _run_cli("info", str(SAMPLES / "checkpoint.pt"), other_thread=True)
    assert r.returncode == 0 and "format: pt" in r.stdout
    assert "<atexit>" in r.stderr and "<teardown>" in r.stderr
