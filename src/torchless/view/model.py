"""The viewer's data model: one JSON-ready dict built from torchless's own API.

``build(paths)`` opens each artifact (``weights_only=False``: nothing a file names is ever
imported or called; unknown classes are inert placeholders) and describes it:

* ``tensors``: one entry per ``Artifact.tensors()`` pair, in order: ``name``, ``dtype``,
  ``shape``, ``numel``, ``nbytes``, ``param`` (a parameter), ``storage`` (an index shared
  by the tensors viewing one storage), ``shared`` (another tensor views that storage too);
* ``graphs``: each graph as ``{"id", "title", "parent", "nodes", "edges"}``. Nodes carry
  ``name``, ``op``, ``target``, ``val`` (dtype and shape), ``group`` (the module path from
  ``nn_module_stack`` for ``.pt2``, the name scope for ONNX, the module path for a
  TorchScript module tree), ``args``/``kwargs``, ``schema``, ``stack``, ``doc`` and
  ``subgraph`` (the graph id a ``get_attr`` names); an edge is ``[src, dst, label]``
  (node indices, the value's dtype and shape);
* ``code`` (TorchScript, ``.pt2`` graph code), ``info`` (``Artifact.info()``), ``findings``
  (``torchless.scan``); and for two paths, ``diff`` (``diff_artifacts``).

Everything here is data: the page shows it with ``textContent`` only.
"""

from __future__ import annotations

import json
import os
from typing import Any

from ..core.errors import TorchlessError

__all__ = ["build", "describe", "tensor_entries", "graph_entries", "MAX_TEXT", "VERSION"]

#: the data model's version (the page refuses another)
VERSION = 1
#: longest string kept for one field (code, doc strings, stack traces)
MAX_TEXT = 200_000


def _text(v: Any, limit: int = 2000) -> str:
    s = v if isinstance(v, str) else str(v)
    return s if len(s) <= limit else s[:limit] + f"… ({len(s) - limit} more characters)"


def _jsonable(v: Any, depth: int = 0) -> Any:
    """A bounded JSON-ready copy of ``v`` (anything else becomes its ``str``)."""
    if depth > 20:
        return "…"
    if v is None or isinstance(v, (bool, int)):
        return v
    if isinstance(v, float):
        return v if v == v and v not in (float("inf"), float("-inf")) else str(v)
    if isinstance(v, str):
        return _text(v, MAX_TEXT)
    if isinstance(v, dict):
        items = list(v.items())
        out = {str(k): _jsonable(x, depth + 1) for k, x in items[:5000]}
        if len(items) > 5000:
            out["…"] = f"{len(items) - 5000} more entries"
        return out
    if isinstance(v, (list, tuple)):
        out_l = [_jsonable(x, depth + 1) for x in v[:5000]]
        if len(v) > 5000:
            out_l.append(f"… {len(v) - 5000} more")
        return out_l
    return _text(v)


def tensor_entries(items: Any) -> list[dict[str, Any]]:
    """The ``tensors`` list of the model (see the module docstring)."""
    out: list[dict[str, Any]] = []
    storage_ids: dict[int, int] = {}
    users: dict[int, int] = {}
    for name, t in items:
        st = getattr(t, "storage", None)
        sid = None
        if st is not None:
            sid = storage_ids.setdefault(id(st), len(storage_ids))
            users[sid] = users.get(sid, 0) + 1
        try:
            nbytes = int(t.nbytes)
        except (AttributeError, TypeError, ValueError, TorchlessError):
            nbytes = 0
        dt = getattr(t, "dtype", None)
        out.append(
            {
                "name": str(name),
                "dtype": getattr(dt, "name", str(dt)),
                "shape": [s if isinstance(s, int) else str(s) for s in getattr(t, "shape", ())],
                "numel": int(t.numel()) if hasattr(t, "numel") else 0,
                "nbytes": nbytes,
                "param": bool(getattr(t, "is_parameter", False)),
                "storage": sid,
                "kind": type(t).__name__,
            }
        )
    for e in out:
        e["shared"] = e["storage"] is not None and users[e["storage"]] > 1
    return out


# -- graphs ---------------------------------------------------------------------------------


def _val(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, (list, tuple)):
        return "(" + ", ".join(_val(x) for x in v) + ")"
    return _text(v, 200)


def _arg(a: Any, names: dict[int, str] | None = None) -> Any:
    from ..graph.ir import Node

    if isinstance(a, Node):
        return {"node": (names or {}).get(id(a), a.name)}
    if isinstance(a, (list, tuple)):
        return [_arg(x, names) for x in a[:200]]
    if isinstance(a, dict):
        return {str(k): _arg(x, names) for k, x in list(a.items())[:200]}
    if a is None or isinstance(a, (bool, int, str)):
        return a if not isinstance(a, str) else _text(a)
    if isinstance(a, float) and a == a and a not in (float("inf"), float("-inf")):
        return a
    return {"value": _text(a, 500)}


def _module_group(meta: dict[str, Any]) -> list[str]:
    """``nn_module_stack`` -> the module path, outermost first (``["layers", "layers.0"]``)."""
    stack = meta.get("nn_module_stack")
    if not isinstance(stack, dict):
        return []
    out: list[str] = []
    for v in stack.values():
        path = v[0] if isinstance(v, (tuple, list)) and v else ""
        if isinstance(path, str) and path and path not in out:
            out.append(path)
    return out


def _scope_group(label: str) -> list[str]:
    """ONNX node name ``/layer1/attn/MatMul`` -> ``["/layer1", "/layer1/attn"]``."""
    parts = [p for p in label.split("/") if p][:-1]
    return ["/" + "/".join(parts[: i + 1]) for i in range(len(parts))]


#: input kinds of a ``.pt2`` signature that are state, not data: folded into their users
_STATE_KINDS = {"PARAMETER": "parameter", "BUFFER": "buffer", "CONSTANT_TENSOR": "constant", "CUSTOM_OBJ": "object"}


def _display_names(g: Any) -> dict[int, str]:
    """Node -> the name to show: the file's own spelling where the graph keeps it
    (``meta["onnx_name"]``: ``l1.weight``, not the graph's ``l1_weight``), while unique."""
    out: dict[int, str] = {}
    taken = {n.name for n in g.nodes}
    for n in g.nodes:
        orig = n.meta.get("onnx_name")
        if isinstance(orig, str) and orig and orig != n.name and orig not in taken:
            taken.add(orig)
            out[id(n)] = orig
        else:
            out[id(n)] = n.name
    return out


def graph_entries(
    graph: Any,
    *,
    title: str = "",
    docs: dict[str, str] | None = None,
    start: int = 0,
    state: dict[str, tuple[str, str]] | None = None,
) -> list[dict[str, Any]]:
    """Every graph of ``graph.walk()`` (the graph, then its subgraphs) as model entries,
    with ids from ``start``; a subgraph's ``parent`` is its enclosing graph's id.

    A node that holds state rather than computing (a ``get_attr`` of a tensor, an ONNX
    initializer or ``Constant``; a ``.pt2`` placeholder that ``state`` names: placeholder
    name -> (signature kind, state-dict target)) carries ``fold`` (its kind) and ``ref``
    (its original name): the page draws it inside the boxes of the nodes using it."""
    from ..graph.ir import OpRef
    from ..graph.schema import registry

    reg = registry()
    walked = list(graph.walk())
    ids = {path: start + i for i, (path, _g) in enumerate(walked)}
    out = []
    for path, g in walked:
        index = {id(n): i for i, n in enumerate(g.nodes)}
        names = _display_names(g)
        nodes, edges = [], []
        for i, n in enumerate(g.nodes):
            meta = n.meta
            target = n.target
            e: dict[str, Any] = {"name": names[id(n)], "op": n.op, "target": _text(target, 300) if target is not None else ""}
            val = meta.get("val")
            if val is not None:
                e["val"] = _val(val)
            if "onnx_node" in meta:
                e["group"] = _scope_group(str(meta["onnx_node"]))
                if docs and docs.get(str(meta["onnx_node"])):
                    e["doc"] = _text(docs[str(meta["onnx_node"])], 5000)
            else:
                e["group"] = _module_group(meta)
            if n.args:
                e["args"] = _arg(n.args, names)
            if n.kwargs:
                e["kwargs"] = _arg(n.kwargs, names)
            if isinstance(target, OpRef):
                sch = reg.find(target.key)
                if sch is not None:
                    e["schema"] = str(sch)
            if meta.get("stack_trace"):
                e["stack"] = _text(meta["stack_trace"], 20_000)
            if n.op == "get_attr" and isinstance(target, str):
                sub = f"{path}.{target}" if path else target
                if sub in ids:
                    e["subgraph"] = ids[sub]
                else:
                    e["fold"], e["ref"] = ("initializer" if "onnx_name" in meta else "constant"), _text(target, 300)
            if n.op == "placeholder" and not path and state and n.name in state:
                e["fold"], e["ref"] = state[n.name]
            extra = {k: _val(v) for k, v in meta.items() if k in ("source_fn_stack", "torch_fn", "custom", "from_node")}
            if extra:
                e["meta"] = extra
            nodes.append(e)
            for src in n.all_input_nodes:
                j = index.get(id(src))
                if j is not None:
                    edges.append([j, i, _val(src.meta.get("val"))])
        parent = None
        if path:
            up = path.rsplit(".", 1)[0] if "." in path else ""
            parent = ids.get(up)
        out.append(
            {
                "id": ids[path],
                "title": f"{title}.{path}" if title and path else (path or title or "graph"),
                "parent": parent,
                "nodes": nodes,
                "edges": edges,
            }
        )
    return out


def _module_tree_graph(root: Any, start: int) -> dict[str, Any]:
    """A TorchScript module hierarchy as a graph: a node per module, an edge parent -> child."""
    nodes: list[dict[str, Any]] = []
    edges: list[list[Any]] = []
    index: dict[str, int] = {}
    for path, m in root.named_modules():
        i = len(nodes)
        index[path] = i
        parts = path.split(".") if path else []
        params = [k for k in m.parameter_names] if hasattr(m, "parameter_names") else []
        nodes.append(
            {
                "name": path or "<root>",
                "op": "module",
                "target": _text(getattr(m, "qualified_name", ""), 300),
                "group": [".".join(parts[: k + 1]) for k in range(len(parts) - 1)],
                "kwargs": {"parameters": params[:200], "methods": list(getattr(m, "methods", []))[:200]},
            }
        )
        if parts:
            up = ".".join(parts[:-1])
            if up in index:
                edges.append([index[up], i, ""])
    return {"id": start, "title": "modules", "parent": None, "nodes": nodes, "edges": edges}


#: interned modules of a torch.package archive whose source the Code tab shows
MAX_SOURCES = 500
#: TorchScript methods drawn as graphs (one per class and method, in module order)
MAX_METHOD_GRAPHS = 200


def _method_graphs(root: Any, start: int, notes: list[str]) -> list[dict[str, Any]]:
    """Each TorchScript class's methods as operator graphs (:mod:`.tsgraph`), titled by the
    first module path using that class (``blocks.0.forward``); modules of one class share
    their graphs."""
    from .tsgraph import method_graph

    out: list[dict[str, Any]] = []
    seen: set[tuple[str, str]] = set()
    for path, m in root.named_modules():
        cs = getattr(m, "class_source", None)
        if cs is None:
            continue
        for meth in list(getattr(m, "methods", [])):
            key = (str(getattr(m, "qualified_name", "")), meth)
            if key in seen:
                continue
            seen.add(key)
            if len(out) >= MAX_METHOD_GRAPHS:
                notes.append(f"only the first {MAX_METHOD_GRAPHS} methods are drawn as graphs")
                return out
            try:
                code = m.method_source(meth).code
            except TorchlessError:
                continue
            if len(code) > MAX_TEXT:
                notes.append(f"{path or '<root>'}.{meth}: too long to draw ({len(code)} characters)")
                continue
            kids = {k for k, _ in m.named_children()} if hasattr(m, "named_children") else set()
            g = method_graph(code, params=set(cs.parameters), buffers=set(cs.buffers), modules=kids)
            if g["note"]:
                notes.append(f"{path or '<root>'}.{meth}: {g['note']}")
            if not g["nodes"]:
                continue
            title = f"{path}.{meth}" if path else meth
            out.append({"id": start + len(out), "title": title, "parent": None, "nodes": g["nodes"], "edges": g["edges"]})
    return out


def _onnx_docs(model: Any) -> tuple[dict[str, str], str]:
    """Node label -> doc string (main graph; labels as the graph builder names nodes)."""
    from ..formats.onnx.read import text

    out: dict[str, str] = {}
    for idx, node in enumerate(model.graph.node):
        label = text(node.name) or f"{text(node.op_type)}_{idx}"
        if node.doc_string:
            out[label] = text(node.doc_string)
    return out, text(model.doc_string) if model.doc_string else ""


def _graphs_and_code(art: Any) -> tuple[list[dict[str, Any]], dict[str, str], list[str]]:
    """(graphs, code by title, notes) for the formats that have a graph or code."""
    fmt = art.format
    graphs: list[dict[str, Any]] = []
    code: dict[str, str] = {}
    notes: list[str] = []
    if fmt == "pt2":
        progs = art.programs
        for name, prog in progs.items():
            title = name if len(progs) > 1 else ""
            sig = getattr(prog, "signature", None)
            state = {
                s.arg: (_STATE_KINDS[s.kind], s.target or s.arg)
                for s in (sig.input_specs if sig is not None else ())
                if s.kind in _STATE_KINDS and s.arg
            }
            graphs += graph_entries(prog.graph, title=title, start=len(graphs), state=state)
            for path, g in prog.graph.walk():
                key = ".".join(x for x in (title, path) if x) or "forward"
                code[key] = _text(g.python_code("forward"), MAX_TEXT)
    elif fmt == "onnx":
        docs, model_doc = _onnx_docs(art.model)
        graphs += graph_entries(art.graph(), title="main", docs=docs)
        if model_doc:
            notes.append(_text(model_doc, 5000))
    elif fmt == "torchscript":
        from ..formats.torchscript.read import ScriptObject

        m = art.module
        if isinstance(m, ScriptObject):
            graphs.append(_module_tree_graph(m, 0))
            graphs += _method_graphs(m, len(graphs), notes)
        try:
            code["code"] = _text(art.code(), MAX_TEXT)
        except TorchlessError as e:
            notes.append(f"code: {e}")
    elif fmt == "package":
        # the Python source of each interned module, as text (never imported or run)
        for mod, rec in list(art.modules.get("interned", {}).items())[:MAX_SOURCES]:
            entry = art.zip.lookup(rec)
            if entry is None or entry.size > MAX_TEXT:
                notes.append(f"{rec}: source not shown ({'missing' if entry is None else f'{entry.size} bytes'})")
                continue
            code[mod] = bytes(art.zip.read(entry, max_size=MAX_TEXT)).decode("utf-8", "replace")
    elif fmt == "aoti":
        notes.append("the compute graph is compiled C++ (wrapper.so); torchless lists it but never loads or runs it")
    return graphs, code, notes


def _findings(path: str) -> dict[str, Any]:
    from .. import scan as _scan

    try:
        rep = _scan.scan(path)
    except TorchlessError as e:
        return {"error": str(e), "files": []}
    files = []
    for fr in rep.files:
        files.append(
            {
                "path": os.path.basename(fr.path) or fr.path,
                "kind": fr.kind,
                "verdict": fr.verdict,
                "findings": [_jsonable(f.to_dict()) for f in fr.findings],
            }
        )
    return {"files": files, "exit_code": rep.exit_code}


def describe(art: Any, path: str, *, scan: bool = True) -> dict[str, Any]:
    """One opened artifact as the model's ``artifacts`` entry."""
    tensors = tensor_entries(art.tensors())
    graphs, code, notes = _graphs_and_code(art)
    try:
        info = _jsonable(art.info())
    except TorchlessError as e:
        info = {"error": str(e)}
    return {
        "name": os.path.basename(os.fspath(path).rstrip("/")) or os.fspath(path),
        "format": art.format,
        "tensors": tensors,
        "graphs": graphs,
        "code": code,
        "notes": notes,
        "info": info,
        "findings": _findings(os.fspath(path)) if scan else None,
    }


class _Unopened:
    """Stands for an artifact that could not be opened (no tensors to read)."""

    format = "unreadable"

    def __init__(self, path: Any) -> None:
        self.path = path

    def tensors(self) -> Any:
        return iter(())

    def close(self) -> None:
        pass


def unopened(path: Any, error: Exception) -> dict[str, Any]:
    """The model entry of a file torchless cannot open: the error, and the scan's findings."""
    return {
        "name": os.path.basename(os.fspath(path).rstrip("/")) or os.fspath(path),
        "format": "unreadable",
        "tensors": [],
        "graphs": [],
        "code": {},
        "notes": [f"not opened: {error}"],
        "info": {"error": str(error)},
        "findings": _findings(os.fspath(path)),
    }


def build(paths: list[Any], *, scan: bool = True, format: str | None = None) -> tuple[dict[str, Any], list[Any]]:
    """The model of one artifact, or of two with their ``diff``; and the opened artifacts
    (the caller closes them: the server reads tensors from them on request)."""
    from .._api import open as open_artifact
    from ..core.errors import NotFoundError, UsageError
    from ..diff import diff_artifacts

    if not 1 <= len(paths) <= 2:
        raise UsageError(f"view takes one or two paths, got {len(paths)}")
    arts: list[Any] = []
    entries: list[dict[str, Any]] = []
    try:
        for p in paths:
            try:
                art = open_artifact(p, format=format, weights_only=False)
            except (NotFoundError, UsageError):
                raise
            except TorchlessError as e:  # unreadable, but still worth its scan: show why, and the findings
                if not scan:
                    raise
                arts.append(_Unopened(p))
                entries.append(unopened(p, e))
                continue
            arts.append(art)
            entries.append(describe(art, p, scan=scan))
        model: dict[str, Any] = {"version": VERSION, "artifacts": entries, "diff": None}
        if len(arts) == 2 and not any(isinstance(a, _Unopened) for a in arts):
            d = diff_artifacts(arts[0], arts[1])
            model["diff"] = _jsonable(d)
    except BaseException:
        for a in arts:
            a.close()
        raise
    return model, arts


def dumps(model: dict[str, Any]) -> str:
    """The model as JSON safe to place inside an HTML ``<script>`` element: ``<``, ``>``
    and ``&`` are escaped as ``\\u003c``... so no file content can close the element."""
    s = json.dumps(model, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return (
        s.replace("&", "\\u0026")
        .replace("<", "\\u003c")
        .replace(">", "\\u003e")
        .replace("\u2028", "\\u2028")
        .replace("\u2029", "\\u2029")
    )
