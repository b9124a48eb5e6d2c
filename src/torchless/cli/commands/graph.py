"""``torchless graph PATH``: an exported program's graph as Python code or as a table."""

from __future__ import annotations

import argparse
from typing import Any

from ...core.errors import InternalError, NotFoundError
from ..render import echo, shown

__all__ = ["register", "format_graph", "graph_json"]


def _arg_json(a: Any) -> Any:
    from ..._cli_api import Node

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
    from ..._cli_api import Pt2Artifact
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


def format_set_weights(res: dict[str, Any]) -> str:
    """Human text for the result of :func:`torchless.formats.pt2.write.set_weights`."""
    lines = [f"wrote {shown(res['output'])}: replaced {len(res['replaced'])} tensors of program {shown(res['program'])!r}"]
    for what in ("kept", "ignored"):
        if res[what]:
            names = ", ".join(map(shown, res[what][:8])) + (" ..." if len(res[what]) > 8 else "")
            why = "not in the weights" if what == "kept" else "no such tensor"
            lines.append(f"{what} ({why}): {names}")
    return "\n".join(lines)


def cmd_set_weights(args: argparse.Namespace) -> int:
    from ..._cli_api import Pt2Artifact
    from ..._cli_api import set_pt2_weights as set_weights
    from ..render import emit_json
    from ._fit import open_required
    from ._output import check_output

    check_output(args.output, force=args.force)
    with open_required(args.model, ("pt2",), "pt2 set-weights") as art:
        if not isinstance(art, Pt2Artifact):  # the pt2 handler opened it
            raise InternalError(f"the pt2 handler opened {type(art).__name__}")
        res = set_weights(
            art.archive,
            args.weights,
            args.output,
            program=args.program,
            strip_prefix=args.strip_prefix or "",
            allow_missing=args.allow_missing,
        )
    res = {"output": args.output, **res}
    if args.json:
        emit_json("pt2-set-weights", res)
    else:
        echo(format_set_weights(res))
    return 0


def register(sub: Any) -> None:
    from ._output import add_force_flag

    p = sub.add_parser("pt2", help="torch.export archive tools (set-weights)", description="torch.export archive tools")
    psub = p.add_subparsers(dest="pt2_command", metavar="SUBCOMMAND")
    psub.required = True
    h = "re-save a .pt2 archive with new parameter/buffer/constant values (same shapes/dtypes); graph and the rest kept"
    q = psub.add_parser("set-weights", help=h, description=h)
    q.add_argument("model", help="source .pt2 archive")
    q.add_argument("weights", help="weights file (state dict): .pt, .safetensors, .npz ... (names as in `torchless ls`)")
    q.add_argument(
        "-o", "--output", required=True, help="new .pt2 archive (an existing file, the source included, needs --force)"
    )
    q.add_argument("--program", help="which model of a multi-model archive (default: the only one, or 'model')")
    q.add_argument("--allow-missing", action="store_true", help="ignore weights that name no tensor of the program")
    q.add_argument("--strip-prefix", help="remove this prefix from weight names first (e.g. 'model.')")
    q.add_argument("--json", action="store_true", help="machine-readable result (schema: docs/cli.md)")
    add_force_flag(q)
    q.set_defaults(func=cmd_set_weights)
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
