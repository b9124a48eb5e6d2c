"""DCP commands: ``reshard`` (N ranks -> M, or one file -> M ranks) and ``dcp-layout``."""

from __future__ import annotations

import argparse
from typing import Any

from ..render import echo, emit_json, format_bytes, format_table, shown

__all__ = ["register", "format_layout"]


def format_layout(layout: dict[str, Any]) -> str:
    """One line per item, then one line per chunk (offsets, sizes, file, byte range)."""
    rows = []
    for fqn, it in layout["items"].items():
        if it["kind"] == "bytes":
            rows.append([fqn, "bytes", "", f"{it['file']} @{it['offset']} +{it['length']}"])
            continue
        rows.append(
            [
                fqn,
                it["dtype"],
                "[" + ", ".join(map(str, it["shape"])) + "]",
                f"{len(it['chunks'])} chunks, {format_bytes(it['nbytes'])}",
            ]
        )
        for c in it["chunks"]:
            rows.append(["", "", f"  @{c['offsets']} {c['sizes']}", f"{c['file']} @{c['offset']} +{c['length']}"])
    files = ", ".join(
        f"{shown(k)} ({format_bytes(v)})" if v is not None else f"{shown(k)} (missing)" for k, v in layout["files"].items()
    )
    return f"DCP version {layout['version']}; files: {files}\n" + format_table(rows)


def cmd_reshard(args: argparse.Namespace) -> int:
    from ..._cli_api import reshard

    if args.plan_only:
        return _plan_only(args)
    if args.dst is None:
        from ...core.errors import UsageError

        raise UsageError("reshard needs a destination (or --plan-only)")
    if args.cleanup:
        return cleanup_command(args.dst, folder=True, as_json=args.json)
    ranged = ranged_options(args)
    if not ranged.get("resume"):  # a resumed job continues into the folder it began
        from ._output import check_output_folder

        check_output_folder(args.dst, force=args.force)
    prog = None
    if args.progress:
        from ..._api import open as open_artifact
        from ..progress import Progress

        with open_artifact(args.src) as art:
            prog = Progress(sum(t.nbytes for _, t in art.tensors()), f"reshard {args.dst}", force=True)
    try:
        res = reshard(
            args.src,
            args.dst,
            args.ranks,
            plan=args.plan,
            jobs=args.jobs,
            weights_only=not args.unsafe_values,
            format=args.storage,
            progress=prog,
            **ranged,
        )
    finally:
        if prog is not None:
            prog.close()
    if args.json:
        emit_json("reshard", {"source": args.src, "destination": args.dst, "ranks": args.ranks, **res})
        return 0
    echo(
        f"wrote {args.dst}: {len(res['files'])} rank files, {res['tensors']} tensors "
        f"in {res['chunks']} chunks, {res['bytes_items']} non-tensor items"
    )
    if res["skipped"]:
        echo(f"skipped {len(res['skipped'])} non-tensor items (safetensors holds tensors only): {', '.join(res['skipped'][:8])}")
    return 0


def ranged_options(args: argparse.Namespace) -> dict[str, Any]:
    """``executor``, ``max_task_bytes``, ``resume`` from the flags (only those given)."""
    out: dict[str, Any] = {}
    if getattr(args, "executor", None):
        out["executor"] = args.executor
    if getattr(args, "max_task_bytes", None):
        from ...core.sizes import parse_size

        out["max_task_bytes"] = parse_size(args.max_task_bytes)
    if getattr(args, "resume", False):
        out["resume"] = True
    return out


def cleanup_command(dst: str, *, folder: bool, as_json: bool) -> int:
    from ..._cli_api import cleanup_staging

    removed = cleanup_staging(dst, folder=folder)
    if as_json:
        emit_json("cleanup", {"destination": dst, "removed": removed})
    else:
        echo(f"removed {len(removed)} staging leftover(s) of interrupted jobs for {dst}")
        for r in removed:
            echo(f"  {r}")
    return 0


def add_executor_flags(p: Any) -> None:
    """``--executor``, ``--max-task-bytes``, ``--resume``, ``--cleanup`` (range tasks)."""
    p.add_argument(
        "--executor",
        help="where tasks run: local:N (N processes) or dask://HOST:PORT (a Dask distributed scheduler); "
        "runs the job as range tasks",
    )
    p.add_argument("--max-task-bytes", help="the most bytes one task writes (e.g. 256MB): bounds a worker's memory")
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue the job an interrupted run left (its completed files verified and kept); keep this run's staging "
        "if it is interrupted",
    )
    p.add_argument("--cleanup", action="store_true", help="remove the staging an interrupted run left for DST, and exit")


def _plan_only(args: argparse.Namespace) -> int:
    from ..._cli_api import reshard_plan

    res = reshard_plan(args.src, args.ranks, plan=args.plan, format=args.storage)
    if args.json:
        emit_json("reshard-plan", res)
        return 0
    tasks = res["tasks"]
    crit = res["critical_path"] or {"file": "-", "bytes": 0}
    echo(
        f"plan {res['source']} -> {args.ranks} ranks: {len(tasks)} tasks, "
        f"{format_bytes(res['total_bytes_read'])} read, {format_bytes(res['total_bytes_written'])} written; "
        f"critical path {crit['file']} ({format_bytes(crit['bytes'])}); balance {res['balance']:.3f} (largest / mean)"
    )
    rows = [
        [
            t["file"],
            str(t["items"]),
            format_bytes(t["bytes_read"]),
            format_bytes(t["bytes_written"]),
            str(t["source_files"]),
            str(t["reads"]),
        ]
        for t in tasks[:20]
    ]
    echo(format_table([["file", "items", "read", "written", "source files", "reads"], *rows]))
    if len(tasks) > 20:
        echo(f"... {len(tasks) - 20} more tasks (--json lists all)")
    return 0


def cmd_layout(args: argparse.Namespace) -> int:
    from ...dcp import layout

    lay = layout(args.path)
    if args.json:
        emit_json("dcp-layout", lay)
    else:
        echo(format_layout(lay))
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser(
        "reshard",
        help="rewrite a DCP checkpoint (or one .pt/.safetensors file) as a DCP checkpoint of M ranks",
        description="Rewrite a DCP checkpoint directory, or a single .pt/.safetensors/.npz file, as a DCP directory "
        "that torch.distributed.checkpoint.load reads in a job of M ranks. Plan: comma-separated PATTERN=SPEC rules "
        "(fnmatch on flattened keys) and a bare SPEC default; SPEC is row, col, dim:N, replicate or auto "
        "(dim 0 when it has at least M rows, else replicate).",
    )
    p.add_argument(
        "src", help="a DCP folder or one checkpoint file (paths or URLs); with --plan-only also synthetic:SIZE:RANKS[:TENSORS]"
    )
    p.add_argument("dst", nargs="?", help="the output folder (not needed with --plan-only)")
    p.add_argument("--ranks", type=int, required=True, help="world size of the output")
    p.add_argument("--plan", default="auto", help="sharding plan, e.g. '*.bias=replicate,row' (default auto)")
    p.add_argument("--jobs", type=int, default=1, help="write rank files in this many processes")
    p.add_argument(
        "--storage",
        choices=["torch_save", "hf"],
        default="torch_save",
        help="torch_save: __R_0.distcp + .metadata (default); hf: per-rank safetensors with DCP_SHARDING_INFO",
    )
    p.add_argument(
        "--unsafe-values",
        action="store_true",
        help="allow non-tensor values with globals outside the allowlist (as inert placeholders)",
    )
    p.add_argument(
        "--plan-only",
        action="store_true",
        help="print the task list (bytes read and written per task, the critical path) from the metadata alone; write nothing",
    )
    add_executor_flags(p)
    p.add_argument(
        "--force",
        action="store_true",
        help="write into an existing folder that is not empty (its other files are kept; a folder already holding "
        "a DCP checkpoint is still refused)",
    )
    p.add_argument("--progress", action="store_true", help="show progress on stderr (bytes of finished tasks)")
    p.add_argument("--json", action="store_true", help="machine-readable result (schema: docs/cli.md)")
    p.set_defaults(func=cmd_reshard)
    p = sub.add_parser("dcp-layout", help="show a DCP checkpoint's layout: keys, shapes, dtypes, chunks, files and byte ranges")
    p.add_argument("path")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_layout)
