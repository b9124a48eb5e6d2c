"""The layers of ``src/torchless`` point one way (``docs/architecture.md``).

The import graph is read statically (``ast``): every ``import`` and ``from ... import``
anywhere in a module (function-local lazy imports included, relative imports resolved),
plus the deferred imports of :mod:`torchless.core.lazy` (``LazyModule("torchless.x")``,
``lazy_exports(__name__, {"name": ".module:name"})``, lists of module names given to
``import_modules``). Two rules:

* **Layer order.** A module may import its own layer and the layers below it, never a
  layer above. ``interop`` (the torch adapter) imports only ``core`` and is imported only
  inside functions, never at module level, so ``import torchless`` never loads it.
* **No cycles**: none among module-level imports (the ones that run at import time), and
  none either when the imports inside functions are counted too (a lazy import is no
  licence for two modules to need each other). The one exception is the side layer:
  ``core.tensor.as_tensor`` reaches ``interop.torch`` lazily for torch tensors, and
  ``interop`` is built on ``core``; and plug-ins: a registry imports, by name, the modules
  that import it to register themselves (``formats.registry.HANDLER_MODULES``).

The checker is tested on synthetic graphs below, so a broken checker cannot pass silently.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import pathlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pytest

SRC = pathlib.Path(__file__).resolve().parents[1] / "src"
PACKAGE = "torchless"

#: lowest first; a module may import its own layer and those before it.
LAYERS = ("core", "io", "container", "pickle", "graph", "interp", "jobs", "formats", "scan", "api", "view", "cli", "testing")

#: top-level modules of the ``api`` layer (the public facade); ``torchless`` itself is one.
API_MODULES = ("_api", "_cli_api", "_start", "dcp", "diff")

#: the torch adapter: imports ``core`` only; imported by anyone, but only inside a function.
SIDE_LAYER = "interop"

#: the calls of core/lazy.py: the module names given to them (directly, or as a module-level
#: list such as HANDLER_MODULES) are deferred imports.
LAZY_CALLS = {"LazyModule", "lazy_exports", "import_modules"}


#: lazy back edges kept on purpose, each with its reason; any other lazy cycle fails. (A
#: module-level cycle is never allowed.) Remove an entry when its cycle goes.
KNOWN_LAZY_BACK_EDGES: dict[tuple[str, str], str] = {}


#: deferred imports of a higher layer kept on purpose, each with its reason; any other
#: upward import fails. Remove an entry when its import goes.
KNOWN_UPWARD = {
    ("torchless", "torchless.view"): (
        "the facade's torchless.view(path) is the view layer's callable module, imported on first use "
        "(lazy_exports); the view layer is built on the api below it"
    ),
}


@dataclass(frozen=True)
class Edge:
    src: str
    dst: str
    line: int
    toplevel: bool  # runs when ``src`` is imported (not inside a function)
    plugin: bool = False  # a registry importing the modules that register into it


def layer_of(module: str) -> str | None:
    """The layer of a dotted module name under ``torchless``; None for one no layer claims."""
    parts = module.split(".")
    if parts[0] != PACKAGE:
        return None
    if len(parts) == 1 or parts[1] in API_MODULES:
        return "api"
    if parts[1] == "__main__":
        return "cli"
    if parts[1] in LAYERS or parts[1] == SIDE_LAYER:
        return parts[1]
    return None


def modules(root: pathlib.Path) -> dict[str, pathlib.Path]:
    """Dotted name -> file, for every module of the package under ``root``."""
    out = {}
    for p in sorted((root / PACKAGE).rglob("*.py")):
        parts = list(p.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


def _targets(stmt: ast.Assign | ast.AnnAssign) -> list[ast.Name]:
    ts = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
    return [t for t in ts if isinstance(t, ast.Name)] if stmt.value is not None else []


class _Visitor(ast.NodeVisitor):
    def __init__(self, name: str, is_pkg: bool, known: set[str]) -> None:
        self.name, self.is_pkg, self.known = name, is_pkg, known
        self.depth = 0  # > 0 inside a function (imports there run later, on call)
        self.found: list[tuple[str, int, bool, bool]] = []
        self.plugin = False
        self.constants: dict[str, ast.expr] = {}

    def _add(self, target: str, line: int) -> None:
        if target == PACKAGE or target.startswith(PACKAGE + "."):
            # ``from a.b import c``: c is a module when one is known by that name
            while target not in self.known and "." in target:
                target = target.rsplit(".", 1)[0]
            self.found.append((target, line, self.depth == 0, self.plugin))

    def _func(self, node: ast.AST) -> None:
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _func

    def visit_If(self, node: ast.If) -> None:
        t = node.test
        if (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING"):
            self._func(node)  # annotations only: never runs, counts for the layers, not for cycles
        else:
            self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        for a in node.names:
            self._add(a.name, node.lineno)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            base = self.name.split(".")
            if not self.is_pkg:
                base = base[:-1]
            base = base[: len(base) - (node.level - 1)]
            mod = ".".join(base + ([node.module] if node.module else []))
        else:
            mod = node.module or ""
        for a in node.names:
            sub = f"{mod}.{a.name}"
            self._add(sub if sub in self.known else mod, node.lineno)

    def visit_Module(self, node: ast.Module) -> None:
        # module-level constants, for lists of module names handed to import_modules
        self.constants = {
            t.id: stmt.value for stmt in node.body if isinstance(stmt, (ast.Assign, ast.AnnAssign)) for t in _targets(stmt)
        }
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        f = node.func
        fname = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
        if fname is not None and fname.lstrip("_") in LAZY_CALLS:  # the names given to the lazy mechanism are imports
            # (also under a private alias: ``from .core.lazy import lazy_exports as _lazy_exports``)
            for arg in [*node.args, *(k.value for k in node.keywords)]:
                if isinstance(arg, ast.Name) and arg.id in self.constants:
                    arg = self.constants[arg.id]
                self.plugin = fname.lstrip("_") == "import_modules"
                for s in ast.walk(arg):
                    if isinstance(s, ast.Constant) and isinstance(s.value, str):
                        self._lazy(s.value, getattr(s, "lineno", node.lineno))
                self.plugin = False
        self.generic_visit(node)

    def _lazy(self, value: str, line: int) -> None:
        # a deferred import runs later: it counts for the layer rule, and for cycles only
        # when imports inside functions are counted
        value = value.partition(":")[0]
        if value.startswith("."):
            base = self.name.split(".") if self.is_pkg else self.name.split(".")[:-1]
            level = len(value) - len(value.lstrip("."))
            base = base[: len(base) - (level - 1)]
            value = ".".join(base + [value.lstrip(".")])
        if value in self.known:
            depth, self.depth = self.depth, self.depth + 1
            self._add(value, line)
            self.depth = depth


def import_graph(root: pathlib.Path = SRC) -> list[Edge]:
    """Every import between modules of the package (static, ``ast``)."""
    mods = modules(root)
    known = set(mods)
    edges = []
    for name, path in mods.items():
        v = _Visitor(name, path.name == "__init__.py", known)
        v.visit(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)))
        edges += [Edge(name, dst, line, top, plugin) for dst, line, top, plugin in v.found if dst != name]
    return edges


def layer_violations(edges: list[Edge], known: Mapping[tuple[str, str], str] = {}) -> list[str]:
    """One line per import against the layer order (but a deferred one listed in ``known``)."""
    bad: list[str] = []
    rank = {name: i for i, name in enumerate(LAYERS)}
    for e in edges:
        a, b = layer_of(e.src), layer_of(e.dst)
        where = f"{e.src}:{e.line} imports {e.dst}"
        if a is None or b is None:
            bad.append(
                f"{where}: {e.src if a is None else e.dst} belongs to no layer (add it to docs/architecture.md and this test)"
            )
        elif b == SIDE_LAYER:
            if e.toplevel and a != SIDE_LAYER:
                bad.append(f"{where}: {SIDE_LAYER} is imported only inside functions")
        elif a == SIDE_LAYER:
            if b != "core":
                bad.append(f"{where}: {SIDE_LAYER} imports only core")
        elif rank[b] > rank[a] and not ((e.src, e.dst) in known and not e.toplevel):
            bad.append(f"{where}: layer {a} must not import the higher layer {b}")
    return list(dict.fromkeys(bad))


def import_cycles(edges: list[Edge], *, lazy: bool = False, known: Mapping[tuple[str, str], str] = {}) -> list[list[str]]:
    """The import cycles, each as a path ``[a, b, ..., a]``: among module-level imports, or
    with ``lazy`` among all imports except those of the side layer and a registry's imports
    of its plug-ins (a format handler imports the registry to register itself; the registry
    imports the handlers, by name, when first asked; that inversion is the design).

    One cycle per strongly connected component (Tarjan), shown as a shortest cycle
    through its first module."""
    graph: dict[str, set[str]] = {}
    for e in edges:
        if e.toplevel or (lazy and layer_of(e.dst) != SIDE_LAYER and not e.plugin and (e.src, e.dst) not in known):
            graph.setdefault(e.src, set()).add(e.dst)
            graph.setdefault(e.dst, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    comps: list[list[str]] = []

    def strong(v: str) -> None:  # iterative enough for a package's depth
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or v in graph[v]:
                comps.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    cycles = []
    for comp in comps:
        members, start = set(comp), comp[0]
        prev: dict[str, str] = {}
        queue, seen, path = [start], {start}, None
        while queue and path is None:  # breadth first: a shortest way back to start
            nxt = []
            for v in queue:
                for w in sorted(graph[v] & members):
                    if w == start:
                        path = [start]
                        x = v
                        while x != start:
                            path.append(x)
                            x = prev[x]
                        path = [start, *reversed(path[1:]), start]
                        break
                    if w not in seen:
                        seen.add(w)
                        prev[w] = v
                        nxt.append(w)
                if path is not None:
                    break
            queue = nxt
        cycles.append(path or comp)
    return cycles


# --- the tree itself -------------------------------------------------------------------


def test_graph_is_read():
    edges = import_graph()
    pairs = {(e.src, e.dst) for e in edges}
    # a relative, a function-local and a LazyModule import, each seen
    assert ("torchless._api", "torchless.formats.registry") in pairs
    assert any(e.dst == "torchless.interop.torch" and not e.toplevel for e in edges)
    assert ("torchless.formats.pt2.handler", "torchless.formats.pt2.read") in pairs
    assert all(layer_of(m) is not None for m in modules(SRC)), [m for m in modules(SRC) if layer_of(m) is None]


def test_imports_follow_the_layers():
    edges = import_graph()
    bad = layer_violations(edges, KNOWN_UPWARD)
    assert not bad, "imports against the layer order (docs/architecture.md):\n" + "\n".join(bad)


def test_no_import_cycles():
    cycles = import_cycles(import_graph())
    assert not cycles, "module-level import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_no_import_cycles_through_lazy_imports():
    edges = import_graph()
    cycles = import_cycles(edges, lazy=True, known=KNOWN_LAZY_BACK_EDGES)
    assert not cycles, "import cycles (imports inside functions counted):\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_layers_documented():
    doc = (SRC.parent / "docs" / "architecture.md").read_text(encoding="utf-8")
    for name in (*LAYERS, SIDE_LAYER, *API_MODULES):
        assert f"`{name}" in doc, f"docs/architecture.md does not name the layer or module {name!r}"


DOC = SRC.parent / "docs" / "architecture.md"


def _module_map() -> Any:
    spec = importlib.util.spec_from_file_location("module_map", SRC.parent / "scripts" / "module_map.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_module_map_matches_the_tree():
    """docs/architecture.md's module map lists every package and module of the tree, each
    with its docstring's first sentence, and nothing that is not there."""
    mm = _module_map()
    held = mm.section(DOC.read_text(encoding="utf-8"))
    assert held is not None, "docs/architecture.md: the module-map markers are missing"
    names = {line.split("`")[1] for line in held.splitlines() if line.startswith("- `")}
    tree = {name for name, _ in mm.entries()}
    assert not tree - names, f"modules missing from the map (run scripts/module_map.py): {sorted(tree - names)}"
    assert not names - tree, f"the map names modules that are gone (run scripts/module_map.py): {sorted(names - tree)}"
    assert held == mm.render(), "the map's lines differ from the modules' docstrings: run scripts/module_map.py"


def test_module_map_checker_sees_a_new_module(tmp_path):
    mm = _module_map()
    (tmp_path / "a").mkdir()
    (tmp_path / "__init__.py").write_text('"""Top."""\n')
    (tmp_path / "a" / "__init__.py").write_text('"""Package a. More."""\n')
    (tmp_path / "a" / "b.py").write_text('"""Module b: does b.\n\nDetails."""\n')
    assert mm.entries(tmp_path) == [("torchless/", "Top."), ("a/", "Package a."), ("a/b.py", "Module b: does b.")]
    assert "- `a/b.py`: Module b: does b." in mm.render(tmp_path)


def test_every_top_level_package_has_a_layer_and_a_row():
    """Each top-level package or module of src/torchless belongs to a layer of the table here
    and has its row in the document's layer table, and every row names a layer here."""
    doc = DOC.read_text(encoding="utf-8")
    rows = re.findall(r"^\| `(\w+)`", doc, flags=re.M)
    assert set(rows) == {*LAYERS, SIDE_LAYER}, f"layer table rows {rows} vs LAYERS {LAYERS}"
    for p in sorted((SRC / PACKAGE).iterdir()):
        if p.name.startswith("__") or p.name == "py.typed" or (p.is_dir() and not (p / "__init__.py").exists()):
            continue
        mod = f"{PACKAGE}.{p.stem}"
        assert layer_of(mod) in (*LAYERS, SIDE_LAYER), f"{mod} is in no layer"


def test_the_tree_sketch_names_only_what_exists():
    """Every path the ``src/torchless/`` sketch at the top of the document names exists (a
    sketch naming a module that moved is how the map drifted before)."""
    doc = DOC.read_text(encoding="utf-8")
    block = doc.split("```text\nsrc/torchless/\n", 1)[1].split("```", 1)[0]
    stack: list[tuple[int, str]] = []
    missing = []
    for line in block.splitlines():
        m = re.match(r"^( +)([\w./]+(?:\.py|/))(?:\s|$)", line)
        if not m or len(m.group(1)) > 8:
            continue
        depth = len(m.group(1))
        while stack and stack[-1][0] >= depth:
            stack.pop()
        rel = "".join(s for _, s in stack) + m.group(2)
        if not (SRC / PACKAGE / rel).exists():
            missing.append(rel)
        if m.group(2).endswith("/"):
            stack.append((depth, m.group(2)))
    assert not missing, f"docs/architecture.md's tree sketch names paths that do not exist: {missing}"


# --- the checker, on graphs that must fail ----------------------------------------------


def _tree(tmp_path: pathlib.Path, files: dict[str, str]) -> pathlib.Path:
    for rel, text in files.items():
        p = tmp_path / PACKAGE / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return tmp_path


BAD_TREE = {
    "__init__.py": "from ._api import load\n",
    "_api.py": "from .formats.registry import detect\n",
    "core/__init__.py": "",
    "core/tree.py": "def f():\n    from ..pickle.globals import GlobalRef\n",  # lazy, upward
    "core/tensor.py": "import torchless.interop.torch\n",  # the side layer at module level
    "pickle/__init__.py": "",
    "pickle/globals.py": "from ..core import tree\n",
    "interop/__init__.py": "",
    "interop/torch.py": "from ..formats import registry\n",  # interop reaching above core
    "formats/__init__.py": "",
    "formats/registry.py": "from .base import X\n\n\ndef f():\n    from .. import _api\n",  # cycle + upward
    "formats/base.py": "from .registry import Y\nfrom ..core.lazy import LazyModule\n_r = LazyModule('torchless.scan.x')\n",
    "scan/__init__.py": "",
    "scan/x.py": "",
    "pickle/lazy.py": "from ..core.lazy import lazy_exports\n_l = lazy_exports(__package__, {'f': '..formats.base:f'})\n",
    "container/mods.py": (
        "from ..core.lazy import import_modules\n\nMODULES = [\n    'torchless.scan.x',\n]\n\n\n"
        "def load():\n    import_modules(MODULES)\n    print('torchless.scan.x')\n"
    ),
    "weird/__init__.py": "",
    "weird/m.py": "from ..core import tree\n",
}


def test_checker_finds_upward_imports(tmp_path):
    root = _tree(tmp_path, BAD_TREE)
    bad = "\n".join(layer_violations(import_graph(root)))
    assert "torchless.core.tree:2 imports torchless.pickle.globals: layer core must not import the higher layer pickle" in bad
    assert "torchless.formats.registry:5 imports torchless._api: layer formats must not import the higher layer api" in bad
    assert "torchless.formats.base:3 imports torchless.scan.x" in bad  # a LazyModule name counts
    assert "torchless.pickle.lazy:2 imports torchless.formats.base" in bad  # a lazy_exports entry
    assert "torchless.container.mods:4 imports torchless.scan.x" in bad  # a list of module names
    assert "torchless.container.mods:9" not in bad  # any other string is only a string
    assert "torchless.core.tensor:1 imports torchless.interop.torch: interop is imported only inside functions" in bad
    assert "torchless.interop.torch:1 imports torchless.formats.registry: interop imports only core" in bad
    assert "torchless.weird.m" in bad and "belongs to no layer" in bad
    assert "torchless._api" not in bad.replace("imports torchless._api", "")  # api -> formats is allowed


def test_checker_finds_cycles(tmp_path):
    root = _tree(tmp_path, BAD_TREE)
    cycles = import_cycles(import_graph(root))
    assert cycles == [["torchless.formats.base", "torchless.formats.registry", "torchless.formats.base"]]


def test_checker_finds_cycles_through_lazy_imports(tmp_path):
    root = _tree(
        tmp_path,
        {
            "__init__.py": "",
            "graph/__init__.py": "",
            "graph/ir.py": "from .printer import show\n",
            "graph/printer.py": (
                "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from .ir import Node\n\n\n"
                "def show():\n    from .ir import Graph\n"
            ),
        },
    )
    edges = import_graph(root)
    assert {(e.src, e.dst, e.toplevel) for e in edges} >= {
        ("torchless.graph.ir", "torchless.graph.printer", True),
        ("torchless.graph.printer", "torchless.graph.ir", False),
    }
    assert ("torchless.graph.printer", "torchless.graph.ir", True) not in {(e.src, e.dst, e.toplevel) for e in edges}
    assert import_cycles(edges) == []  # nothing runs in a loop at import time
    assert import_cycles(edges, lazy=True) == [["torchless.graph.ir", "torchless.graph.printer", "torchless.graph.ir"]]
    assert layer_violations(edges) == []


def test_checker_exempts_plugin_loading_from_lazy_cycles(tmp_path):
    root = _tree(
        tmp_path,
        {
            "__init__.py": "",
            "core/__init__.py": "",
            "core/lazy.py": "",
            "formats/__init__.py": "",
            "formats/registry.py": (
                "from ..core.lazy import import_modules\n\nMODS = ['torchless.formats.npz']\n\n\n"
                "def load():\n    import_modules(MODS)\n\n\ndef other():\n    from . import npz\n"
            ),
            "formats/npz.py": "from .registry import register\n",
        },
    )
    edges = import_graph(root)
    plugin = [e for e in edges if e.plugin]
    assert [(e.src, e.dst, e.line) for e in plugin] == [("torchless.formats.registry", "torchless.formats.npz", 3)]
    # the plain lazy import in other() is still a cycle
    assert import_cycles(edges, lazy=True) == [["torchless.formats.npz", "torchless.formats.registry", "torchless.formats.npz"]]


def test_checker_exempts_the_side_layer_from_lazy_cycles(tmp_path):
    root = _tree(
        tmp_path,
        {
            "__init__.py": "",
            "core/__init__.py": "",
            "core/tensor.py": "def as_tensor(x):\n    from ..interop.torch import from_torch\n",
            "interop/__init__.py": "",
            "interop/torch.py": "from ..core.tensor import Tensor\n",
        },
    )
    edges = import_graph(root)
    assert import_cycles(edges, lazy=True) == [] and layer_violations(edges) == []


def test_checker_reports_a_three_module_cycle_path(tmp_path):
    root = _tree(
        tmp_path,
        {
            "__init__.py": "",
            "formats/__init__.py": "",
            "formats/dcp/__init__.py": "",
            "formats/dcp/read.py": "from . import consolidate\n",
            "formats/dcp/consolidate.py": "from .hf import x\n",
            "formats/dcp/hf.py": "from .read import DCPReader\n",
        },
    )
    (cycle,) = import_cycles(import_graph(root))
    assert cycle == [
        "torchless.formats.dcp.consolidate",
        "torchless.formats.dcp.hf",
        "torchless.formats.dcp.read",
        "torchless.formats.dcp.consolidate",
    ]


@pytest.mark.parametrize(
    ("module", "layer"),
    [
        ("torchless", "api"),
        ("torchless._api", "api"),
        ("torchless.diff", "api"),
        ("torchless.__main__", "cli"),
        ("torchless.scan.carriers.zips", "scan"),
        ("torchless.interop.torch", "interop"),
        ("torchless.nothing", None),
        ("numpy", None),
    ],
)
def test_layer_of(module, layer):
    assert layer_of(module) == layer


def test_importing_a_module_changes_no_allowlist():
    """Allowlists are built whole where they are defined: importing any module (the .pt
    reader once added ``_load_from_bytes`` to the default table at import time) leaves the
    shared tables as they were, so a verdict never depends on what was imported first."""
    import subprocess
    import sys

    names = sorted(m for m in modules(SRC) if not m.endswith("__main__"))
    code = (
        "import importlib, sys\n"
        "from torchless.pickle.torch_globals import DEFAULT_ALLOWLIST as D, TORCH_ALLOWLIST as T\n"
        "before = (sorted(D), sorted(T))\n"
        "for m in sys.argv[1:]:\n"
        "    importlib.import_module(m)\n"
        "    assert (sorted(D), sorted(T)) == before, m\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code, *names], capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(SRC)}
    )
    assert r.returncode == 0, r.stderr[-2000:]


def test_lone_file_modules_import_no_torchless_module():
    """``scan/engine.py`` is loaded alone (``spec_from_file_location``) by its worker process:
    an import of another torchless module there would fail only in the child."""
    lone = {"torchless.scan.engine", "torchless._start"}
    bad = [f"{e.src}:{e.line} imports {e.dst}" for e in import_graph() if e.src in lone]
    assert not bad, bad


def test_known_lazy_back_edges_are_still_lazy_and_still_needed():
    """An exemption whose edge became a module-level import, or closes no cycle any more, is stale."""
    edges = import_graph()
    graph: dict[str, set[str]] = {}
    for e in edges:
        if layer_of(e.dst) != SIDE_LAYER and not e.plugin:
            graph.setdefault(e.src, set()).add(e.dst)
    for src, dst in KNOWN_LAZY_BACK_EDGES:
        found = [e for e in edges if (e.src, e.dst) == (src, dst)]
        assert found and not any(e.toplevel for e in found), f"{src} -> {dst}: gone, or no longer lazy"
        seen, todo = set(), [dst]
        while todo:  # does dst lead back to src?
            v = todo.pop()
            if v not in seen:
                seen.add(v)
                todo += graph.get(v, ())
        assert src in seen, f"{src} -> {dst} closes no cycle any more: drop it from KNOWN_LAZY_BACK_EDGES"


def test_one_lazy_import_mechanism():
    """Deferred imports of torchless modules go through core/lazy.py: no other module calls
    importlib.import_module or __import__, and a package's PEP 562 ``__getattr__`` only
    delegates to ``lazy_exports``. (torchless.testing imports third-party oracles by name.)"""
    bad = []
    for name, path in modules(SRC).items():
        if name in ("torchless.core.lazy", "torchless.testing._builtin"):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                f = node.func
                fname = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
                if fname in ("import_module", "__import__"):
                    bad.append(f"{name}:{node.lineno} calls {fname}")
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name == "__getattr__":
                body = ast.unparse(node.body[-1]) if len(node.body) == 1 else ""
                if not body.startswith("return _lazy("):
                    bad.append(f"{name}:{node.lineno} has its own module __getattr__ (use core.lazy.lazy_exports)")
    assert not bad, "\n".join(bad)


def test_known_upward_imports_are_still_lazy_and_still_there():
    """An upward exemption whose import went, or became a module-level import, is stale."""
    edges = import_graph()
    for src, dst in KNOWN_UPWARD:
        found = [e for e in edges if (e.src, e.dst) == (src, dst)]
        assert found and not any(e.toplevel for e in found), f"{src} -> {dst}: gone, or no longer deferred"
    fake = [Edge("torchless", "torchless.view", 1, True)]  # the same import at module level is refused
    assert layer_violations(fake, KNOWN_UPWARD)
