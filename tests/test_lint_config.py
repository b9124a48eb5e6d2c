"""The lint configuration says what #13 asks and CI runs it: ``scripts/lint.sh`` (run by
``.ci/run`` through ``scripts/test.sh``) runs ruff and mypy; mypy checks every module of
``src/torchless`` (function bodies included, nothing skipped or silenced per module) and is
strict on ``core``, ``container``, ``pickle`` and ``scan`` only; every ``type: ignore`` names
its error code and says why."""

from __future__ import annotations

import pathlib
import re
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - 3.10
    tomllib = pytest.importorskip("tomli", reason="reading pyproject.toml on Python 3.10 needs tomli")

STRICT = {"torchless.core.*", "torchless.container.*", "torchless.pickle.*", "torchless.scan.*"}


def _mypy() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["mypy"]


def test_ci_runs_lint_with_mypy_and_ruff():
    assert "scripts/test.sh" in (ROOT / ".ci" / "run").read_text()
    assert "scripts/lint.sh" in (ROOT / "scripts" / "test.sh").read_text()
    lint = (ROOT / "scripts" / "lint.sh").read_text()
    for tool in ("-m ruff format --check", "-m ruff check", "-m mypy"):
        assert tool in lint, tool


def test_mypy_checks_every_module_and_is_strict_on_the_four_layers():
    cfg = _mypy()
    assert cfg["files"] == ["src/torchless"]
    assert cfg.get("check_untyped_defs") is True  # "checked elsewhere": bodies of unannotated functions too
    assert "exclude" not in cfg and not cfg.get("ignore_errors")
    strict = [o for o in cfg.get("overrides", []) if o.get("disallow_untyped_defs")]
    assert len(strict) == 1 and set(strict[0]["module"]) == STRICT, strict
    for o in cfg.get("overrides", []):
        mods = o["module"] if isinstance(o["module"], list) else [o["module"]]
        torchless_mods = [m for m in mods if m.startswith("torchless")]
        if torchless_mods:
            assert not o.get("ignore_errors") and o.get("follow_imports") not in ("skip", "silent"), o


def test_every_type_ignore_names_its_code_and_a_reason():
    bad = []
    for f in sorted((ROOT / "src" / "torchless").rglob("*.py")):
        lines = f.read_text(encoding="utf-8").splitlines()
        for i, line in enumerate(lines):
            m = re.search(r"#\s*type:\s*ignore(\[[\w,\- ]+\])?(.*)", line)
            if not m:
                continue
            reason_here = re.search(r"#\s*\S", m.group(2) or "")
            reason_above = i > 0 and lines[i - 1].strip().startswith("#")
            if not m.group(1) or not (reason_here or reason_above):
                bad.append(f"{f.relative_to(ROOT)}:{i + 1}: {line.strip()}")
    assert not bad, "type: ignore without an error code or a reason (a comment on the line or the line above):\n" + "\n".join(bad)
