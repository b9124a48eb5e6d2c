"""The module map of docs/architecture.md: one line per package and module of src/torchless.

Each line is the first sentence of the module's docstring (one place: the module says what
it is, the map collects it). ``python scripts/module_map.py`` rewrites the section between
the markers; ``tests/test_architecture.py`` fails when the section differs from the tree.
"""

from __future__ import annotations

import ast
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "torchless"
DOC = ROOT / "docs" / "architecture.md"
BEGIN = "<!-- module-map: begin (scripts/module_map.py writes this list) -->"
END = "<!-- module-map: end -->"


def summary(path: pathlib.Path) -> str:
    """The first sentence of the first paragraph of the module's docstring ('' if none)."""
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    para = " ".join(doc.strip().split("\n\n")[0].split())
    m = re.match(r"(.+?[.!?])(\s|$)", para)
    return m.group(1) if m else para


def entries(src: pathlib.Path = SRC) -> list[tuple[str, str]]:
    """(name, summary) for every package (``name/``, its ``__init__`` docstring) and every
    other module of the tree, in path order."""
    out = []
    for p in sorted(src.rglob("*.py")):
        rel = p.relative_to(src).as_posix()
        if p.name == "__init__.py":
            rel = rel[: -len("__init__.py")] or "torchless/"
        out.append((rel, summary(p)))
    return out


def render(src: pathlib.Path = SRC) -> str:
    lines = [BEGIN]
    for name, text in entries(src):
        lines.append(f"- `{name}`: {text}" if text else f"- `{name}`")
    lines.append(END)
    return "\n".join(lines)


def section(doc: str) -> str | None:
    """The map as the document holds it (None when the markers are missing)."""
    i, j = doc.find(BEGIN), doc.find(END)
    if i < 0 or j < i:
        return None
    return doc[i : j + len(END)]


def main() -> int:
    doc = DOC.read_text(encoding="utf-8")
    old = section(doc)
    new = render()
    if old is None:
        sys.exit(f"{DOC}: the module-map markers are missing")
    DOC.write_text(doc.replace(old, new), encoding="utf-8")
    print(f"{DOC.relative_to(ROOT)}: {len(entries())} entries")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
