"""TorchScript commands: ``torchless code`` and ``torchless ts set-weights|extra|bytecode|tensors``."""

from __future__ import annotations

import argparse
from typing import Any

from ...core.errors import UsageError
from ..render import echo, emit_json, format_bytes, format_table, shown

__all__ = ["register", "format_set_weights", "format_bytecode"]


def _open(path: str, command: str = "ts") -> Any:
    from ..._cli_api import LoadPolicy
    from ._fit import open_required

    return open_required(path, ("torchscript",), command, policy=LoadPolicy(weights_only=False))


def cmd_code(args: argparse.Namespace) -> int:
    with _open(args.path, "code") as art:
        text = art.code(method=args.method, module=args.module)
    if not text.strip():
        raise UsageError(
            "the archive holds no TorchScript code", path=args.path, hint="`torchless ts tensors` lists what it holds"
        )
    if args.json:
        emit_json("code", {"path": args.path, "method": args.method, "module": args.module, "code": text})
    else:
        echo(text, end="")
    return 0


def format_set_weights(res: dict[str, Any]) -> str:
    lines = [f"wrote {shown(res['output'])}: replaced {len(res['replaced'])} tensors in {res['storages']} storage records"]
    if res.get("ignored"):
        names = ", ".join(map(shown, res["ignored"][:8])) + (" ..." if len(res["ignored"]) > 8 else "")
        lines.append(f"ignored (no such tensor): {names}")
    if res["extra_files"]:
        lines.append("extra files: " + ", ".join(map(shown, res["extra_files"])))
    return "\n".join(lines)


def _read_extra(specs: list[str]) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    for s in specs or []:
        name, sep, file = s.partition("=")
        if not sep or not name or not file:
            raise UsageError(f"--extra wants NAME=FILE, got {s!r}")
        with open(file, "rb") as f:
            out[name] = f.read()
    return out


def cmd_set_weights(args: argparse.Namespace) -> int:
    from ..._cli_api import set_torchscript_weights as set_weights
    from ._output import check_output

    check_output(args.output, force=args.force)
    extra = _read_extra(args.extra)
    with _open(args.model) as art:
        res = set_weights(
            art,
            args.weights,
            args.output,
            strip_prefix=args.strip_prefix or "",
            allow_missing=args.allow_missing,
            extra_files=extra,
            remove_extra=args.remove_extra or (),
            strict=args.strict,
        )
    res["output"] = args.output
    if args.json:
        emit_json("ts-set-weights", res)
    else:
        echo(format_set_weights(res))
    return 0


def cmd_extra(args: argparse.Namespace) -> int:
    with _open(args.path) as art:
        a = art.archive
        if args.name:
            import sys

            data = a.extra_file(args.name)
            sys.stdout.buffer.write(data)
            sys.stdout.flush()
            return 0
        rows = [[k, format_bytes(e.size)] for k, e in a.extra.items()]
    if args.json:
        emit_json("ts-extra", {"path": args.path, "extra_files": [{"name": k, "size": e.size} for k, e in a.extra.items()]})
    else:
        echo(format_table(rows) or "(no extra files)")
    return 0


def format_bytecode(bc: Any, method: str | None = None) -> str:
    lines = [f"bytecode version {bc.version}" + ("" if bc.supported_by_torch else " (outside what torch 2.13 loads)")]
    for m in bc.methods:
        if method and not (m.qualified_name == method or m.qualified_name.endswith("." + method)):
            continue
        sig = ", ".join(f"{a.name}: {a.type}" for a in (m.arguments or []))
        ret = ", ".join(a.type for a in (m.returns or []))
        lines.append(f"\n{m.qualified_name}({sig}) -> {ret}   registers={m.register_size}")
        lines.append("  operators: " + (", ".join(o.full_name for o in m.operators) or "-"))
        lines.append("  constants: " + (", ".join(repr(c) for c in m.constants) or "-"))
        if m.types:
            lines.append("  types: " + ", ".join(m.types))
        for i, ins in enumerate(m.instructions):
            note = ""
            if ins.op == "OP" and 0 <= ins.x < len(m.operators):
                note = f"   # {m.operators[ins.x].full_name}"
            elif ins.op == "LOADC" and 0 <= ins.x < len(m.constants):
                note = f"   # {m.constants[ins.x]!r}"
            lines.append(f"  {i:4d}  {ins.op:<16} {ins.x:>4} {ins.n:>4}{note}")
    return "\n".join(lines)


def cmd_bytecode(args: argparse.Namespace) -> int:
    with _open(args.path) as art:
        bc = art.archive.bytecode()
        if args.json:
            from ...core.tree import json_tree

            methods = []
            for m in bc.methods:
                if not args.method or m.qualified_name.endswith(args.method):
                    methods.append({**m.to_dict(), "constants": json_tree(list(m.constants))})  # whole, not outlined
            emit_json("ts-bytecode", {"path": args.path, "version": bc.version, "methods": methods})
        else:
            echo(format_bytecode(bc, args.method))
    return 0


def cmd_tensors(args: argparse.Namespace) -> int:
    with _open(args.path) as art:
        it = art.all_tensors() if args.all else art.tensors()
        listed = [(n, t) for n, t in it]
        rows = [[n, t.dtype.name, "[" + ", ".join(map(str, t.shape)) + "]", format_bytes(t.nbytes)] for n, t in listed]
    if args.json:
        emit_json("ls", [{"name": n, "dtype": t.dtype.name, "shape": list(t.shape), "nbytes": t.nbytes} for n, t in listed])
    else:
        echo(format_table(rows))
    return 0


def register(sub: Any) -> None:
    from ._output import add_force_flag

    h = "print the TorchScript source of an archive (all code files, or one method as torch's .code)"
    p = sub.add_parser("code", help=h, description=h)
    p.add_argument("path")
    p.add_argument(
        "--method", help="a method of the root module (or of --module), e.g. forward; or a qualified name __torch__.M.forward"
    )
    p.add_argument("--module", help="dotted submodule path, e.g. encoder.layers.0")
    p.add_argument("--json", action="store_true", help="machine-readable output (schema: docs/cli.md)")
    p.set_defaults(func=cmd_code)

    p = sub.add_parser(
        "ts", help="TorchScript archive tools (set-weights, extra, bytecode, tensors)", description="TorchScript archive tools"
    )
    tsub = p.add_subparsers(dest="ts_command", metavar="SUBCOMMAND")
    tsub.required = True
    h = "re-save an archive with new tensor values (same shapes/dtypes) and extra files; code and structure kept"
    q = tsub.add_parser("set-weights", help=h, description=h)
    q.add_argument("model", help="source TorchScript archive (.pt/.ptl)")
    q.add_argument("weights", nargs="?", help="weights file: .safetensors, .pt state dict, .npz ... (names as in `torchless ls`)")
    q.add_argument("-o", "--output", required=True, help="new archive (an existing file, the source included, needs --force)")
    q.add_argument(
        "--extra", action="append", metavar="NAME=FILE", help="add or replace extra file NAME with FILE's bytes (repeatable)"
    )
    q.add_argument("--remove-extra", action="append", metavar="NAME", help="drop extra file NAME (repeatable)")
    q.add_argument("--strict", action="store_true", help="every state_dict entry must get a value")
    q.add_argument("--allow-missing", action="store_true", help="ignore weights that name no tensor of the model")
    q.add_argument("--strip-prefix", help="remove this prefix from weight names first")
    q.add_argument("--json", action="store_true")
    add_force_flag(q)
    q.set_defaults(func=cmd_set_weights)
    h = "list extra files, or write one to stdout"
    q = tsub.add_parser("extra", help=h, description=h)
    q.add_argument("path")
    q.add_argument("name", nargs="?")
    q.add_argument("--json", action="store_true")
    q.set_defaults(func=cmd_extra)
    h = "show lite-interpreter bytecode (.ptl): instructions, operators, constants, types per method"
    q = tsub.add_parser("bytecode", help=h, description=h)
    q.add_argument("path")
    q.add_argument("--method")
    q.add_argument("--json", action="store_true")
    q.set_defaults(func=cmd_bytecode)
    h = "list tensors: the state_dict, or with --all every tensor (attributes, containers, constants, packed weights)"
    q = tsub.add_parser("tensors", help=h, description=h)
    q.add_argument("path")
    q.add_argument("--all", action="store_true")
    q.add_argument("--json", action="store_true")
    q.set_defaults(func=cmd_tensors)
