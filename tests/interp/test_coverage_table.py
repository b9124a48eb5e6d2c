"""docs/interpreter.md's coverage table is what scripts/interp_coverage.py writes (no torch needed)."""

from __future__ import annotations

import importlib.util
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _script():
    spec = importlib.util.spec_from_file_location("interp_coverage", os.path.join(ROOT, "scripts", "interp_coverage.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_committed_table_is_current() -> None:
    mod = _script()
    with open(mod.DOC, encoding="utf-8") as f:
        doc = f.read()
    assert mod.MARKER in doc
    assert mod.splice(doc, mod.render()) == doc, "the coverage table is stale: run python scripts/interp_coverage.py"


def test_table_lists_every_core_op_once() -> None:
    mod = _script()
    table = mod.render()
    ops = mod.core_ops()
    assert len(ops) == len(set(ops)) > 150
    for op in ops:
        assert table.count(f"| `{op}` |") == 1, op
