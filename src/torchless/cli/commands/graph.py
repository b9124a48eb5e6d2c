"""``torchless graph PATH``: an exported program's graph as Python code or as a table."""

from __future__ import annotations

import argparse
from typing import Any

from ...core.errors import InternalError, NotFoundError
from ..render import echo

__all__ = ["register", "format_graph", "graph_json"]


def _arg_json(a: Any) -> Any:
    from ...graph.ir import Node

    if isinstance(a, Node):
        return {"node": a.name}
    if isinstance(a, (list, tuple)):
        return [_arg_json(v) for v in a]
    if isinstance(a, dict):
        return {str(k): _arg_json(v) for k, v in a.items()}
    if a is None or isinstance(a, (bool, int, str)):
        return a
    if isinstance(a, float) and a == a and a not in (float("inf"), float("-inf")):
        return a
    return {"value": str(a)}


def graph_json(graph: Any) -> list[dict[str, Any]]:
    """Each (sub)graph as ``{"path", "code", "nodes": [{"name", "op", "target", "args",
    "kwargs"}]}``; a node argument that is another node is ``{"node": name}``, a value
    JSON cannot hold is ``{"value": text}``."""
    out = []
    for path, g in graph.walk():
        nodes = [
            {"name": n.name, "op": n.op, "target": str(n.target), "args": _arg_json(n.args), "kwargs": _arg_json(n.kwargs)}
            for n in g.nodes
        ]
        out.append({"path": path, "code": g.python_code("forward"), "nodes": nodes})
    return out


def format_graph(graph: Any, *, table: bool = False, name: str = "forward") -> str:
    """The graph (then each subgraph, named by its attribute path) as code or a table."""
    parts = []
    for path, g in graph.walk():
        title = path or name
        body = g.tabular() if table else g.python_code("forward").strip("\n").rstrip()
        if path or table:
            parts.append(f"# {title}\n{body}")
        else:
            parts.append(body)
    return "\n\n".join(parts) + "\n"


def cmd_graph(args: argparse.Namespace) -> int:
    from ...formats.pt2.handler import Pt2Artifact
    from ._fit import open_required

    with open_required(args.path, ("pt2",), "graph") as art:
        if not isinstance(art, Pt2Artifact):  # the pt2 handler opened it
            raise InternalError(f"the pt2 handler opened {type(art).__name__}")
        arc = art.archive
        if args.model is None:
            progs = arc.programs
        elif args.model in arc.programs:
            progs = {args.model: arc.programs[args.model]}
        else:
            raise NotFoundError(f"no model {args.model!r}", path=args.path, expected=", ".join(arc.programs))
        if args.json:
            from ..render import emit_json

            emit_json(
                "graph",
                {
                    "path": args.path,
                    "models": [
                        {"name": name, "dialect": prog.dialect, "graphs": graph_json(prog.graph)} for name, prog in progs.items()
                    ],
                },
            )
            return 0
        out = []
        for name, prog in progs.items():
            head = f"# model {name!r} ({prog.dialect} IR)\n" if len(arc.programs) > 1 else ""
            out.append(head + format_graph(prog.graph, table=args.table))
    echo("\n".join(out), end="")
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser(
        "graph",
        help="print an exported program's graph (.pt2) as Python or a table",
        description="Print the graph of a torch.export archive in the manner of GraphModule.code "
        "(subgraphs of cond/while_loop/... follow), or as a node table with --table.",
    )
    p.add_argument("path")
    p.add_argument("--table", action="store_true", help="one row per node: opcode, name, target, args, kwargs, value type")
    p.add_argument("--model", help="which model of a multi-model archive (default: all)")
    p.add_argument("--json", action="store_true", help="machine-readable output: code and nodes per graph (schema: docs/cli.md)")
    p.set_defaults(func=cmd_graph)
