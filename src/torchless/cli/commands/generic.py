"""Commands that work on every format: info, ls, convert, diff, verify."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ..._api import convert
from ..._api import open as open_artifact
from ..progress import Progress
from ..render import echo, emit_json, format_bytes, format_info, format_table, shown

__all__ = ["register", "info_json", "formats_json", "format_diff"]


def _open(path: str, fmt: str | None) -> Any:
    # inspection never executes anything, so unknown globals become placeholders to show
    return open_artifact(path, format=fmt, weights_only=False)


def info_json(art: Any, info: dict[str, Any]) -> dict[str, Any]:
    """``info`` as documented JSON: top-level keys without spaces (``model NAME`` entries
    go under ``models_detail``), record texts trimmed, JSON-in-strings parsed (``in_spec``),
    and the object tree whole (no ``…`` cuts; see :func:`~torchless.core.tree.json_tree`)."""
    from ...core.tree import json_tree

    out: dict[str, Any] = {}
    for k, v in info.items():
        if k.startswith("model ") and isinstance(v, dict):
            out.setdefault("models_detail", {})[k[len("model ") :]] = v
        else:
            out[k.replace(" ", "_")] = v
    if isinstance(out.get("records"), dict):
        out["records"] = {k: v.strip() if isinstance(v, str) else v for k, v in out["records"].items()}
    obj = None
    if art.format == "pt":
        obj = getattr(art, "obj", None)
    elif art.format == "torchscript":
        obj = art.archive.module
    if "tree" in out and obj is not None:
        out["tree"] = json_tree(obj)
    return _parse_specs(out)


def _parse_specs(x: Any, in_spec: bool = False) -> Any:
    """Values that are JSON documents inside strings (pytree specs, and the ``context`` of
    their nodes, which torch's pytree format stores as JSON text) become JSON."""
    if isinstance(x, dict):
        out = {}
        for k, v in x.items():
            inner = in_spec or k.endswith("_spec")
            if isinstance(v, str) and ((k.endswith("_spec") and v[:1] in "[{") or (in_spec and k == "context")):
                try:
                    v = json.loads(v)
                except ValueError:
                    pass
            out[k] = _parse_specs(v, inner)
        return out
    if isinstance(x, list):
        return [_parse_specs(v, in_spec) for v in x]
    return x


def cmd_info(args: argparse.Namespace) -> int:
    with _open(args.path, args.format) as art:
        info = art.info()
        if args.json:
            emit_json("info", info_json(art, info))
            return 0
    echo(format_info(info))
    return 0


def cmd_ls(args: argparse.Namespace) -> int:
    with _open(args.path, args.format) as art:
        rows = []
        out = []
        where = getattr(art, "tensor_file", None)  # sharded artifacts (hf): the file holding each tensor
        for name, t in art.tensors():
            shape = list(t.shape)
            if args.json:
                out.append(
                    {
                        "name": name,
                        "dtype": t.dtype.name,
                        "shape": shape,
                        "nbytes": t.nbytes,
                        **({"file": where(name)} if where else {}),
                    }
                )
            else:
                rows.append(
                    [name, t.dtype.name, "[" + ", ".join(map(str, shape)) + "]", format_bytes(t.nbytes)]
                    + ([where(name)] if where else [])
                )
    if args.json:
        emit_json("ls", out)
    else:
        echo(format_table(rows))
    return 0


def _progress_wanted(args: argparse.Namespace) -> bool:
    return bool(getattr(args, "progress", False))


def cmd_convert(args: argparse.Namespace) -> int:
    from ._output import check_output
    from .dcp import cleanup_command, ranged_options

    if args.cleanup:
        return cleanup_command(args.dst, folder=False, as_json=args.json)
    ranged = ranged_options(args)
    if not ranged.get("resume"):  # a resumed job continues what an interrupted one began
        shard_index = (args.dst + ".index.json",) if args.max_shard_size and isinstance(args.dst, str) else ()
        check_output(args.dst, force=args.force, also=shard_index)
    from ..._cli_api import Transform

    on_the_way = {
        "dtype": args.dtype,
        "dtype_all": args.dtype_all,
        "include": args.include,
        "exclude": args.exclude,
        "strip_prefix": args.strip_prefix,
        "add_prefix": args.add_prefix,
    }
    tf = Transform.make(**on_the_way)
    with _open(args.src, args.format) as art:  # one detection, one parse: convert takes the open artifact
        # the bytes written: after the filters and the cast (tensors listed, none read)
        total = sum(t.nbytes for _, t in (tf.apply(art.tensors(), path=args.src) if tf.active else art.tensors()))
        prog = Progress(total, f"convert {args.dst}", force=_progress_wanted(args))
        try:
            extra: dict[str, Any] = {"max_shard_size": args.max_shard_size} if args.max_shard_size else {}
            extra.update(ranged)
            extra.update(on_the_way)
            res = convert(art, args.dst, dst_format=args.to, progress=prog, strict=args.strict, **extra)
        finally:
            prog.close()
    res = {"source": args.src, "destination": args.dst, **res}
    if args.json:
        emit_json("convert", res)
        return 0
    files = res["files"]
    where = files[-1] if len(files) > 1 else files[0]
    shards = f" ({len(files) - 1} shards + index)" if len(files) > 1 else ""
    kept = "; the whole object kept" if res.get("object_kept") else ""
    echo(f"wrote {shown(where)}{shards}: {res['tensors']} tensors, {format_bytes(res['bytes'])}{kept}")
    dropped = res.get("dropped") or []
    if dropped:
        names = ", ".join(shown(f"{d['key']} ({d['type']})" if d["key"] else d["type"]) for d in dropped[:10])
        more = f" and {len(dropped) - 10} more (--json lists all)" if len(dropped) > 10 else ""
        echo(f"dropped {len(dropped)} values that are not tensors: {names}{more}", file=sys.stderr)
        keep = "" if res["files"] and str(res["files"][-1]).endswith((".pt", ".pth")) else "; write .pt to keep the whole object"
        echo(f"  (--strict refuses such conversions{keep})", file=sys.stderr)
    return 0


def format_diff(res: dict[str, Any]) -> str:
    """Human text for the result of :func:`torchless.diff.diff_artifacts`."""
    lines = [f"+ {shown(n)}" for n in res["added"]] + [f"- {shown(n)}" for n in res["removed"]]
    for c in res["changed"]:
        extra = f" (max abs diff {c['max_abs_diff']:.6g})" if c["max_abs_diff"] is not None else ""
        lines.append(f"~ {shown(c['name'])}: {shown(c['reason'])}{extra}")
    lines += [f"? {shown(c['name'])}: not compared: {shown(c['reason'])}" for c in res["not_compared"]]
    lines += [f"+ value {shown(n)}" for n in res["values_added"]] + [f"- value {shown(n)}" for n in res["values_removed"]]
    lines += [f"~ value {shown(c['name'])}: {shown(c['a'])} -> {shown(c['b'])}" for c in res["values_changed"]]
    counts = [f"{len(res['added'])} added", f"{len(res['removed'])} removed", f"{len(res['changed'])} changed"]
    lines.append(", ".join([*counts, f"{len(res['not_compared'])} not compared", f"{res['same']} same"]))
    nv = [len(res["values_added"]), len(res["values_removed"]), len(res["values_changed"])]
    if any(nv):
        lines.append(f"other values: {nv[0]} added, {nv[1]} removed, {nv[2]} changed")
    return "\n".join(lines)


def cmd_diff(args: argparse.Namespace) -> int:
    from ...diff import diff_artifacts, diff_bytes

    with _open(args.a, args.format) as a, _open(args.b, args.format) as b:
        prog = Progress(diff_bytes(a, b), "diff", force=args.progress)  # the total first: a bar
        try:
            res = diff_artifacts(a, b, rtol=args.rtol, atol=args.atol, progress=prog, tensors_only=args.tensors_only)
        finally:
            prog.close()
    if args.json:
        emit_json("diff", {"a": args.a, "b": args.b, **res})
    else:
        echo(format_diff(res))
    return 0 if res["identical"] else 1


def cmd_verify(args: argparse.Namespace) -> int:
    from ..._cli_api import check_digests, handlers

    with _open(args.path, args.format) as art:
        problems = art.verify()
    declared = next((h.capabilities for h in handlers() if h.name == art.format), None)
    checksum = (declared.checksum if declared is not None else "") or None  # the format's declaration; none: None
    digests, more = (
        check_digests(args.path, sha256=args.sha256, manifest=args.manifest) if args.sha256 or args.manifest else ([], [])
    )
    problems = [*problems, *more]
    errors = [p for p in problems if p.severity == "error"]
    warnings = [p for p in problems if p.severity == "warning"]
    notes = [p for p in problems if p.severity not in ("error", "warning")]
    if args.json:
        emit_json(
            "verify",
            {
                "path": args.path,
                "format": art.format,
                "ok": not errors,
                "errors": len(errors),
                "warnings": len(warnings),
                "notes": len(notes),
                "problems": [p.to_dict() for p in problems],
                "checksum": checksum,
                "digests": [d.to_dict() for d in digests],
            },
        )
    else:
        for p in problems:
            where = f" [{shown(p.member)}]" if p.member else ""
            at = f" @{p.offset}" if p.offset is not None else ""
            echo(f"{p.severity}: {p.code}{where}{at}: {shown(p.message)}")
        if checksum is None and not digests:
            echo(f"note: {art.format}: this format carries no checksum; --sha256 or --manifest compare digests")
        if digests:
            good = sum(d.ok for d in digests)
            echo(f"sha256: {good} of {len(digests)} files match")
        tail = f", {len(notes)} notes" if notes else ""
        echo(f"{shown(args.path)}: {'OK' if not errors else 'FAILED'} ({len(errors)} errors, {len(warnings)} warnings{tail})")
    return 1 if errors else 0


def formats_json() -> list[dict[str, Any]]:
    """One entry per registered format: name, description, extensions, its declared
    capabilities and options (see :class:`~torchless.formats.base.Capabilities`)."""
    from ..._cli_api import handlers

    return [
        {"name": h.name, "description": h.description, "extensions": list(h.extensions), **h.capabilities.as_dict()}
        for h in sorted(handlers(), key=lambda h: h.name)
    ]


def cmd_formats(args: argparse.Namespace) -> int:
    from ..._cli_api import CAPABILITIES

    rows = formats_json()
    if args.json:
        emit_json("formats", rows)
        return 0
    header = ["format", *(c.replace("_", " ") for c in CAPABILITIES), "extensions"]
    table = [
        [r["name"], *("yes" if r[c] else "-" for c in CAPABILITIES), " ".join(r["extensions"]) or "(by content)"] for r in rows
    ]
    echo(format_table(table, header))
    return 0


def register(sub: Any) -> None:
    def add(name: str, func: Any, help: str, *, writes_nothing: bool = False) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help, description=help)
        # writes_nothing: the command only reads and prints (cli.main ends it at once)
        p.set_defaults(func=func, writes_nothing=writes_nothing)
        return p

    p = add(
        "info",
        cmd_info,
        "summarize an artifact: format, writer, tensors, parameters, bytes by dtype, object tree",
        writes_nothing=True,
    )
    p.add_argument("path")
    p.add_argument("--json", action="store_true", help="machine-readable output (schema: docs/cli.md)")
    p.add_argument("--format", help="skip detection")
    p = add(
        "formats",
        cmd_formats,
        "list the formats torchless knows and what each can do: read, list, verify, write tensors, write objects, edit",
        writes_nothing=True,
    )
    p.add_argument(
        "--json", action="store_true", help="machine-readable output, with each format's options (schema: docs/cli.md)"
    )
    p = add("ls", cmd_ls, "list tensors, one a line: name, dtype, shape, size", writes_nothing=True)
    p.add_argument("path")
    p.add_argument("--json", action="store_true", help="machine-readable output (schema: docs/cli.md)")
    p.add_argument("--format")
    p = add(
        "convert",
        cmd_convert,
        "copy an artifact into a new file (.pt, .safetensors, .npz), dtypes preserved; .pt to .pt keeps the whole object, "
        "flat formats keep the tensors and name what they drop",
    )
    p.add_argument("src")
    p.add_argument("dst")
    p.add_argument("--format", help="source format (skip detection)")
    p.add_argument(
        "--to",
        metavar="{pt,safetensors,npz,hf}",
        help="destination format: one torchless writes (default: from the destination's extension)",
    )
    p.add_argument(
        "--max-shard-size",
        help="safetensors only: split into Hugging Face style shards of at most this size (5GB, 500MiB) plus an index json",
    )
    p.add_argument(
        "--strict", action="store_true", help="refuse when the destination cannot hold a value of the source (nothing is written)"
    )
    g = p.add_argument_group(
        "tensors on the way (in this order: --include, --exclude, --strip-prefix, --add-prefix, --dtype; "
        "with any of them only the tensors travel, as a flat state dict)"
    )
    g.add_argument("--include", action="append", metavar="GLOB", help="keep the tensors whose dotted name matches (repeatable)")
    g.add_argument("--exclude", action="append", metavar="GLOB", help="then drop the tensors whose name matches (repeatable)")
    g.add_argument("--strip-prefix", metavar="PREFIX", help="remove PREFIX from the names that start with it")
    g.add_argument("--add-prefix", metavar="PREFIX", help="put PREFIX before every name")
    g.add_argument(
        "--dtype",
        metavar="DTYPE",
        help="cast the floating-point tensors to DTYPE (bfloat16, float16, float32, float64) as torch's .to(dtype) rounds",
    )
    g.add_argument("--dtype-all", action="store_true", help="with --dtype: cast integer and bool tensors too")
    p.add_argument("--progress", action="store_true", help="show progress on stderr even when it is not a terminal")
    from ._output import add_force_flag
    from .dcp import add_executor_flags

    add_force_flag(p)

    add_executor_flags(p)
    p.add_argument("--json", action="store_true", help="machine-readable result, with every dropped value (schema: docs/cli.md)")
    p = add(
        "diff",
        cmd_diff,
        "compare two artifacts: tensors added, removed, changed (max abs difference), not compared, and every other value "
        "(config, optimizer settings, code, graphs); exit 1 unless identical",
        writes_nothing=True,
    )
    p.add_argument("a")
    p.add_argument("b")
    p.add_argument("--json", action="store_true", help="machine-readable output (schema: docs/cli.md)")
    p.add_argument("--format")
    p.add_argument("--rtol", type=float, default=0.0)
    p.add_argument("--atol", type=float, default=0.0)
    p.add_argument(
        "--tensors-only",
        action="store_true",
        help="compare the tensors alone (exit 0 when they are identical, whatever else the files hold)",
    )
    p.add_argument("--progress", action="store_true", help="show progress on stderr even when it is not a terminal")
    p = add(
        "verify",
        cmd_verify,
        "check structure, every checksum the format has (zip CRC-32s, sizes) and tensor bounds, and digests when "
        "given; says when the format carries no checksum; exit 1 on errors",
        writes_nothing=True,
    )
    p.add_argument("path")
    p.add_argument("--json", action="store_true", help="machine-readable output (schema: docs/cli.md)")
    p.add_argument("--format")
    p.add_argument("--sha256", metavar="HEX", help="the file's expected SHA-256: exit 1 when it differs")
    p.add_argument(
        "--manifest",
        metavar="FILE",
        help="a sha256sum list (HEX  NAME, names relative to FILE's folder): every listed file is checked, exit 1 "
        "naming each one that differs or is missing",
    )
