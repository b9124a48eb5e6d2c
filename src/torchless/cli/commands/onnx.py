"""ONNX-specific commands: ``torchless onnx set-weights`` and ``torchless onnx graph``."""

from __future__ import annotations

import argparse
from typing import Any

from ...core.errors import InternalError
from ..render import echo, emit_json, format_bytes, shown

__all__ = ["register", "format_set_weights"]


def format_set_weights(res: dict[str, Any]) -> str:
    """Human text for the result of :func:`torchless.formats.onnx.write.set_weights`."""
    lines = [
        f"wrote {shown(res['output'])}"
        + (f" + {shown(res['data_file'])}" if res["data_file"] else "")
        + f": {format_bytes(res['bytes'])} of tensors"
    ]
    lines.append(f"replaced {len(res['replaced'])} initializers, kept {len(res['kept'])}")
    if res["kept"]:
        names = ", ".join(map(shown, res["kept"][:8])) + (" ..." if len(res["kept"]) > 8 else "")
        lines.append(f"kept (not in the weights): {names}")
    if res["ignored"]:
        names = ", ".join(map(shown, res["ignored"][:8])) + (" ..." if len(res["ignored"]) > 8 else "")
        lines.append(f"ignored (no such initializer): {names}")
    return "\n".join(lines)


def cmd_set_weights(args: argparse.Namespace) -> int:
    from ..._cli_api import onnx_data_file_for, onnx_writes_data_file
    from ..._cli_api import set_onnx_weights as set_weights
    from ._output import check_output, output_exists

    check_output(args.output, force=args.force)
    # the data file the writer puts beside the model is an output too (the source is asked
    # whether it will be written only when one is there and the choice is the writer's)
    data = onnx_data_file_for(args.output)
    wanted = not args.force and args.external_data is not False
    if wanted and output_exists(data) and onnx_writes_data_file(args.model, args.external_data):
        check_output(data, force=False)
    res = set_weights(
        args.model,
        args.weights,
        args.output,
        external_data=args.external_data,
        size_threshold=args.size_threshold,
        allow_missing=args.allow_missing,
        strip_prefix=args.strip_prefix or "",
    )
    if args.json:
        emit_json("onnx-set-weights", res)
    else:
        echo(format_set_weights(res))
    return 0


def cmd_graph(args: argparse.Namespace) -> int:
    from ..._cli_api import OnnxArtifact
    from ._fit import open_required
    from .graph import format_graph

    with open_required(args.model, ("onnx",), "onnx graph") as art:
        if not isinstance(art, OnnxArtifact):  # the ONNX handler opened it
            raise InternalError(f"the onnx handler opened {type(art).__name__}")
        graph = art.graph()
    if args.json:
        from ..render import emit_json
        from .graph import graph_json

        emit_json("onnx-graph", {"path": args.model, "graphs": graph_json(graph)})
        return 0
    echo(format_graph(graph, table=args.table), end="")
    return 0


def register(sub: Any) -> None:
    from ._output import add_force_flag

    p = sub.add_parser("onnx", help="ONNX model tools (set-weights, graph)", description="ONNX model tools")
    osub = p.add_subparsers(dest="onnx_command", metavar="SUBCOMMAND")
    osub.required = True
    h = "replace initializers by name with weights from a .pt/.safetensors/.npz file (shapes and dtypes must match)"
    q = osub.add_parser("set-weights", help=h, description=h)
    q.add_argument("model", help="source .onnx model")
    q.add_argument("weights", help="weights file (state dict): .pt, .safetensors, .npz ...")
    q.add_argument("-o", "--output", required=True, help="new .onnx model (an existing file, the source included, needs --force)")
    g = q.add_mutually_exclusive_group()
    g.add_argument(
        "--external-data",
        dest="external_data",
        action="store_true",
        default=None,
        help="write tensors to <output>.data (default: when the source used external data or tensors exceed 1.5 GiB)",
    )
    g.add_argument(
        "--no-external-data", dest="external_data", action="store_false", help="keep every tensor inside the model file"
    )
    q.add_argument(
        "--size-threshold",
        type=int,
        default=256,
        help="with external data, tensors of at most this many bytes stay inline (default 256, as torch.onnx.export)",
    )
    q.add_argument("--allow-missing", action="store_true", help="ignore weights that name no initializer")
    q.add_argument("--strip-prefix", help="remove this prefix from weight names first (e.g. 'model.')")
    q.add_argument("--json", action="store_true")
    add_force_flag(q)
    q.set_defaults(func=cmd_set_weights)
    h = "print the model's graph in torchless's graph IR: Python-like code, or a table with --table (If/Loop/Scan bodies follow)"
    q = osub.add_parser("graph", help=h, description=h)
    q.add_argument("model", help=".onnx model")
    q.add_argument("--table", action="store_true", help="one row per node: opcode, name, target, args, kwargs, value type")
    q.add_argument("--json", action="store_true", help="machine-readable output: code and nodes per graph (schema: docs/cli.md)")
    q.set_defaults(func=cmd_graph)
