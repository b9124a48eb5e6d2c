"""No control character from a file reaches the terminal (issue 30 item 7).

Every command is run as a user types it on artifacts whose tensor names, keys, metadata
and file names hold ESC sequences, a C1 CSI (``\\x9b``), carriage returns and newlines,
DEL, bidi overrides and isolates, and rich markup; the fixtures are written by the real
tools (``safetensors``, ``torch``). Nothing of :data:`UNSAFE` but the layout's own
newlines may appear in stdout or stderr, no forged line may start a row, JSON stays JSON
(it parses back to the very names), and markup prints as text.
"""

from __future__ import annotations

import io
import json
import struct

import numpy as np
import pytest

from torchless.cli.main import main
from torchless.core.printable import UNSAFE, escape_controls, escape_json_text

safetensors_numpy = pytest.importorskip("safetensors.numpy", reason="the safetensors package writes the fixtures")

NAMES = [
    "a\x1b[31mred\x1b[0m",
    "b\x9b2J",
    "c\u202egnp.exe",
    "d[red]x[/red][link=http://e]y[/link]",
    "e\rCLEAN",
    "f\nforged: CLEAN",
    "g\x7f\u2066x\u2069\u200e\u200f\u061c",
    "h\x1b]8;;http://evil\x1b\\link\x1b]8;;\x1b\\",
]
RAW = UNSAFE - {"\n"}


def _assert_safe(text: str) -> None:
    bad = sorted({f"U+{ord(c):04X}" for c in text if c in RAW})
    assert not bad, f"raw control characters reached the terminal: {bad}\n{text!r}"
    assert not any(line.startswith("forged") for line in text.splitlines()), text


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    got = capsys.readouterr()
    _assert_safe(got.out)
    _assert_safe(got.err)
    return code, got.out, got.err


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("hostile")
    a, b = d / "a.safetensors", d / "b.safetensors"
    safetensors_numpy.save_file(
        {n: np.full(2, i, np.float32) for i, n in enumerate(NAMES)}, str(a), metadata={"k\x1b]0;title\x07": "v\x9b1m\u202e"}
    )
    safetensors_numpy.save_file({n: np.full(2, i + 1, np.float32) for i, n in enumerate(NAMES[1:])}, str(b))
    return d, a, b


def test_escape_controls_spells_every_unsafe_character():
    for ch in UNSAFE:
        got = escape_controls(f"x{ch}y")
        assert not set(got) & UNSAFE and got.startswith("x\\") and got.endswith("y"), (hex(ord(ch)), got)
    assert escape_controls("a\nb\tc", keep="\n\t") == "a\nb\tc"
    assert escape_controls("a\nb") == "a\\x0ab"
    assert escape_controls("é ü 名前 😀") == "é ü 名前 😀"  # printable text is kept as it is
    text = json.dumps({n: n for n in NAMES}, ensure_ascii=False)
    safe = escape_json_text(text)
    assert not set(safe) & UNSAFE and json.loads(safe) == {n: n for n in NAMES}


def test_ls_info_verify_diff_print_no_raw_controls(capsys, files):
    _, a, b = files
    code, out, _ = run(capsys, "ls", a)
    assert code == 0 and "a\\x1b[31mred" in out and "c\\u202egnp.exe" in out and "f\\x0aforged" in out
    assert "d[red]x[/red][link=http://e]y[/link]" in out  # markup is text
    code, out, _ = run(capsys, "info", a)
    assert code == 0 and "k\\x1b]0;title\\x07" in out
    assert run(capsys, "verify", a)[0] == 0
    code, out, _ = run(capsys, "diff", a, b)
    assert code == 1 and "- a\\x1b[31mred" in out
    for cmd in (["ls", a, "--json"], ["info", a, "--json"], ["diff", a, b, "--json"], ["verify", a, "--json"]):
        code, out, _ = run(capsys, *cmd)
        json.loads(out)
    rows = json.loads(run(capsys, "ls", a, "--json")[1])
    assert [r["name"] for r in rows] == sorted(NAMES, key=lambda n: NAMES.index(n))  # the names, unchanged
    assert json.loads(run(capsys, "info", a, "--json")[1])["metadata"] == {"k\x1b]0;title\x07": "v\x9b1m\u202e"}


def test_convert_and_scan_print_no_raw_controls(capsys, files, tmp_path):
    _, a, _ = files
    dst = tmp_path / "c\x1b[2Jx\u202e.npz"  # a destination name of its own
    code, out, err = run(capsys, "convert", a, dst)
    assert code == 0 and "c\\x1b[2Jx\\u202e.npz" in out
    assert run(capsys, "ls", dst)[0] == 0
    hostile = tmp_path / "s\x1b[31m\x9b\u202e.safetensors"
    hostile.write_bytes(a.read_bytes())
    code, out, _ = run(capsys, "scan", hostile, "-j", "1")
    assert code == 0 and "s\\x1b[31m\\x9b\\u202e.safetensors: CLEAN" in out
    code, out, _ = run(capsys, "scan", hostile, "-j", "1", "--verbose")
    for flag in ("--json", "--sarif"):
        json.loads(run(capsys, "scan", hostile, "-j", "1", flag)[1])


def test_pickle_keys_and_values_print_no_raw_controls(capsys, tmp_path):
    torch = pytest.importorskip("torch", reason="torch writes the checkpoint")
    p = tmp_path / "m.pt"
    torch.save({**{n: torch.zeros(1) for n in NAMES}, "note": {"x\x1b[1m": "y\x9b\u202e\nforged: CLEAN"}}, p)
    for cmd in (["ls", p], ["info", p], ["verify", p], ["diff", p, p], ["scan", p, "-j", "1", "--verbose"]):
        run(capsys, *cmd)
    json.loads(run(capsys, "info", p, "--json")[1])


def test_error_quoting_file_content_prints_no_raw_controls(capsys, tmp_path):
    # a header whose dtype is a terminal sequence: the reader's error quotes it
    header = json.dumps(
        {"t\x1b[2J": {"dtype": "F\x1b]0;pwned\x07\u202e", "shape": [1], "data_offsets": [0, 4]}}, ensure_ascii=False
    ).encode()
    p = tmp_path / "bad.safetensors"
    p.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 4)
    for cmd in ("ls", "info", "verify"):
        code, out, err = run(capsys, cmd, p)
        assert code in (1, 2) and "\\x1b]0;pwned\\x07\\u202e" in out + err, (out, err)


def test_progress_label_markup_is_text(monkeypatch):
    pytest.importorskip("rich", reason="the bar is rich's when it is installed")
    from torchless.cli.progress import Progress

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    err = Tty()
    monkeypatch.setattr("sys.stderr", err)
    monkeypatch.setenv("TERM", "xterm")
    prog = Progress(10, "convert [red]x[/red][link=http://e]y[/link]\x1b[2J\u202e", force=True)
    prog(5)
    prog._rich.refresh()  # type: ignore[union-attr]
    text = err.getvalue()
    prog.close()
    assert "[red]x[/red][link=http://e]y[/link]" in text  # printed, not applied
    assert "\\x1b[2J\\u202e" in text and "\x1b[2J" not in text.replace("\x1b[2K", "") and "\u202e" not in text


def test_commands_print_only_through_echo():
    # one place: a command that prints with print() or sys.stdout.write bypasses the escaping
    import ast
    from pathlib import Path

    import torchless.cli

    # echo itself, the error line (escaped), the bar (its label escaped), the project's own schemas
    allowed = {"render.py", "main.py", "progress.py", "schemas/__main__.py"}
    root = Path(torchless.cli.__file__).parent
    bad = []
    for f in sorted(root.rglob("*.py")):
        if f.relative_to(root).as_posix() in allowed:
            continue
        for node in ast.walk(ast.parse(f.read_text())):
            if not isinstance(node, ast.Call):
                continue
            fn = node.func
            if isinstance(fn, ast.Name) and fn.id == "print":
                bad.append(f"{f.name}:{node.lineno} print()")
            if isinstance(fn, ast.Attribute) and fn.attr == "write" and ast.unparse(fn.value) in ("sys.stdout", "sys.stderr"):
                bad.append(f"{f.name}:{node.lineno} {ast.unparse(fn)}")
    assert not bad, "text printed past render.echo: " + ", ".join(bad)
