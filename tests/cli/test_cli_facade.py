"""The command line calls the public API or its one facade, :mod:`torchless._cli_api`
(issue 35: the commands imported about 20 ``formats/`` internals although a command is
parse -> one library call -> render)."""

from __future__ import annotations

import ast
import importlib
import os
import subprocess
import sys

import torchless._cli_api as facade

SRC = os.path.join(os.path.dirname(__file__), "..", "..", "src")
CLI = os.path.join(SRC, "torchless", "cli")

#: what a command may import of torchless: the public API, the facade, the CLI itself and
#: the values of core/ (errors, dtypes, tensors, sizes, printable text)
ALLOWED = ("torchless", "torchless._api", "torchless._cli_api", "torchless._start", "torchless.dcp", "torchless.diff")
ALLOWED_TREES = ("torchless.core", "torchless.cli", "torchless.view", "torchless.scan")
#: ``torchless.scan`` is the public callable module; its insides go through the facade
SCAN_INSIDES = "torchless.scan."
#: kept on purpose, each with its reason
EXCEPTIONS: set[tuple[str, str]] = set()


def _imports(rel: str, tree: ast.AST) -> list[tuple[str, list[str]]]:
    pkg = ("torchless/" + rel).rsplit("/", 1)[0].replace("/", ".")
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, []) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out.append((mod, [a.name for a in node.names]))
    return out


def _allowed(rel: str, mod: str, names: list[str]) -> bool:
    if not mod.startswith("torchless"):
        return True
    if (rel, mod) in EXCEPTIONS:
        return True
    if mod in ALLOWED:
        return mod != "torchless" or all(n not in ("formats", "interp", "graph", "jobs", "io", "pickle") for n in names)
    if mod.startswith(SCAN_INSIDES):
        return False
    return any(mod == t or mod.startswith(t + ".") for t in ALLOWED_TREES)


def test_the_cli_imports_only_the_public_api_and_the_facade():
    bad, seen = [], 0
    for folder, _dirs, files in os.walk(CLI):
        for f in files:
            if not f.endswith(".py"):
                continue
            path = os.path.join(folder, f)
            rel = os.path.relpath(path, os.path.join(SRC, "torchless")).replace(os.sep, "/")
            with open(path, encoding="utf-8") as fh:
                tree = ast.parse(fh.read())
            for mod, names in _imports(rel, tree):
                seen += mod.startswith("torchless")
                if not _allowed(rel, mod, names):
                    bad.append(f"{rel}: {mod} ({', '.join(names)})")
    assert seen > 30, "the import walk found almost nothing: it is broken"
    assert not bad, "the CLI imports library internals (call them through torchless._cli_api):\n" + "\n".join(sorted(bad))


def test_the_walk_catches_a_formats_import():
    tree = ast.parse("def f():\n    from ...formats.dcp.plan import plan\n    from ..._cli_api import reshard\n")
    got = _imports("cli/commands/dcp.py", tree)
    assert got == [("torchless.formats.dcp.plan", ["plan"]), ("torchless._cli_api", ["reshard"])]
    assert not _allowed("cli/commands/dcp.py", *got[0]) and _allowed("cli/commands/dcp.py", *got[1])
    assert not _allowed("cli/commands/scan.py", "torchless.scan.report", ["format_json"])


def test_every_facade_name_is_the_library_object_and_typed():
    """Each name of the facade is the object it names (imported on first use), and the type
    checker sees the same list (the ``TYPE_CHECKING`` imports)."""
    for name, where in facade.EXPORTS.items():
        mod, _, attr = where.partition(":")
        assert getattr(facade, name) is getattr(importlib.import_module(mod), attr), name
    with open(facade.__file__, encoding="utf-8") as fh:
        tree = ast.parse(fh.read())
    typed = {
        a.asname or a.name
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING"
        for stmt in node.body
        if isinstance(stmt, ast.ImportFrom)
        for a in stmt.names
    }
    assert typed == set(facade.EXPORTS)


def test_the_facade_imports_nothing_until_a_name_is_used():
    code = (
        "import sys, torchless\nbefore = set(sys.modules)\nimport torchless._cli_api\n"
        "print(sorted(m for m in set(sys.modules) - before if m != 'torchless._cli_api'))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, "PYTHONPATH": SRC})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"
