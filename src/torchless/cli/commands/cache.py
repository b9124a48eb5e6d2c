"""``torchless cache``: inventory, show and prune a TorchInductor cache folder.

::

    torchless cache [DIR] [--json] [--kind K] [--show ENTRY]
    torchless cache prune [DIR] [--older-than 7d] [--max-size 1G] [--kind K] [--dry-run | --yes]

``DIR`` defaults to ``$TORCHINDUCTOR_CACHE_DIR`` or torch's default location. Prune is a
dry run unless ``--yes`` is given.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

from ...core.errors import NotFoundError, UsageError
from ..render import echo, emit_json, format_bytes, format_table, shown

__all__ = ["register", "format_inventory", "format_plan", "format_age"]


def format_age(seconds: float) -> str:
    s = max(0.0, seconds)
    for unit, n in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= n:
            return f"{s / n:.1f}{unit}"
    return f"{s:.0f}s"


def format_inventory(d: dict[str, Any]) -> str:
    """Text for :meth:`CacheInventory.to_dict`: a summary by kind, then one line per entry."""
    if not d["exists"]:
        return f"{d['root']}: no such folder (empty cache)"
    lines = [f"{d['root']}: {d['entries']} entries, {d['files']} files, {format_bytes(d['bytes'])}"]
    lines.append(
        format_table(
            [[k, str(v["entries"]), str(v["files"]), format_bytes(v["bytes"])] for k, v in d["by_kind"].items()],
            ["kind", "entries", "files", "size"],
        )
    )
    rows = []
    for it in d["items"]:
        extra = ""
        det = it.get("detail") or {}
        if "object" in det:
            extra = det["object"] + (f", source {det['source_code_bytes']} B" if "source_code_bytes" in det else "")
            if det.get("globals_not_allowlisted"):
                extra += f", {len(det['globals_not_allowlisted'])} globals not allowlisted (not executed)"
        elif "error" in det:
            extra = "unreadable: " + det["error"]
        elif det.get("isa_probe"):
            extra = "CPU ISA probe"
        elif "aot_id" in det:
            extra = "AOT ID " + det["aot_id"]
        elif "target" in det:
            extra = "-> " + det["target"]
        elif det.get("kernels"):
            extra = ", ".join(det["kernels"][:4])
        rows.append([it["kind"], format_bytes(it["size"]), format_age(it["age_s"]), it["id"], extra])
    if rows:
        lines.append("")
        lines.append(format_table(rows, ["kind", "size", "age", "entry", "what"]))
    return "\n".join(lines)


def format_plan(plan: dict[str, Any], *, applied: dict[str, Any] | None = None) -> str:
    rows = [[e["kind"], format_bytes(e["size"]), format_age(e["age_s"]), e["id"], e["reason"]] for e in plan["entries"]]
    head = "would remove" if applied is None else "removed"
    lines = []
    if rows:
        lines.append(format_table(rows, ["kind", "size", "age", "entry", "reason"]))
    if applied is None:
        lines.append(
            f"{head} {len(plan['entries'])} entries: {len(plan['files'])} files, {len(plan['dirs'])} "
            f"folders, {format_bytes(plan['bytes'])}; {format_bytes(plan['remaining_bytes'])} would remain"
        )
        for f in plan["files"]:
            lines.append(f"  {shown(f)}")
        for d in plan["dirs"]:
            lines.append(f"  {shown(d)}/")
        lines.append("dry run: nothing removed (add --yes to remove exactly these)")
    else:
        lines.append(
            f"{head} {len(applied['removed_files'])} files and {len(applied['removed_dirs'])} folders, "
            f"{format_bytes(applied['bytes'])}"
        )
        for s in applied["skipped"]:
            lines.append(f"  skipped {shown(s['path'])}: {shown(s['reason'])}")
    return "\n".join(lines)


def _check_url_folder(store: Any, url: str) -> None:
    if store.isdir(url):
        return
    # exists(): a failed check is reported with the store's reason, not as a missing folder
    if store.exists(url, "cannot check the cache folder"):
        raise UsageError(
            "not a folder: `torchless cache` takes a TorchInductor cache folder",
            path=url,
            hint="for a single file use `torchless info` or `torchless scan`",
        )
    raise NotFoundError("no such cache folder", path=url)


def cmd_cache(args: argparse.Namespace) -> int:
    from ..._cli_api import CACHE_KINDS as KINDS
    from ..._cli_api import entry_source, inventory

    target = list(args.target)
    prune = bool(target) and target[0] == "prune"
    if prune:
        target = target[1:]
    if len(target) > 1:
        raise UsageError("too many folders", found=" ".join(target), expected="torchless cache [prune] [DIR]")
    kinds = None
    if args.kind:
        kinds = [k.strip() for k in args.kind.split(",") if k.strip()]
        bad = [k for k in kinds if k not in KINDS]
        if bad:
            raise UsageError(f"unknown cache entry kind {bad[0]!r}", expected=", ".join(KINDS))
    folder = given = target[0] if target else None
    store = None
    if folder is not None:
        from ..._cli_api import locate_cache_dir

        # the folder's store and path, resolved once (file:// names a local folder; a URL
        # that cannot be listed, plain HTTP, is refused); inventory() takes both
        store, folder = locate_cache_dir(folder)
        if store.remote:
            _check_url_folder(store, folder)
        elif not os.path.isdir(folder):
            if os.path.exists(folder):
                raise UsageError(
                    "not a folder: `torchless cache` takes a TorchInductor cache folder",
                    path=given,
                    hint="for a single file use `torchless info` or `torchless scan`",
                )
            raise NotFoundError(
                "no such cache folder", path=given, hint="omit DIR to use $TORCHINDUCTOR_CACHE_DIR or torch's default location"
            )
    if prune:
        return _prune(args, folder, kinds, store)
    if args.older_than or args.max_size or args.yes:
        raise UsageError("--older-than/--max-size/--yes belong to `torchless cache prune`")
    inv = inventory(folder, store=store, parse_pickles=not args.no_pickles)
    if args.show:
        # a path relative to the current folder names a file of the cache too
        show = os.path.abspath(args.show) if not inv.store.remote and os.path.exists(args.show) else args.show
        rel, text = entry_source(inv, show)
        if args.json:
            emit_json("cache", {"root": inv.root, "file": rel, "text": text})
        else:
            echo(text, end="" if text.endswith("\n") else "\n")
        return 0
    d = inv.to_dict()
    if kinds:
        items = [it for it in d["items"] if it["kind"] in kinds]
        d.update(items=items, entries=len(items), files=sum(len(i["files"]) for i in items), bytes=sum(i["size"] for i in items))
        d["by_kind"] = {k: v for k, v in d["by_kind"].items() if k in kinds}
    if args.json:
        emit_json("cache", d)
    else:
        echo(format_inventory(d))
    return 0


def _prune(args: argparse.Namespace, folder: str | None, kinds: list[str] | None, store: Any = None) -> int:
    from ..._cli_api import apply_prune, inventory, parse_duration, plan_prune
    from ...core.sizes import parse_size

    if args.show:
        raise UsageError("--show does not apply to prune")
    if not args.older_than and not args.max_size:
        raise UsageError("prune needs --older-than and/or --max-size")
    if args.yes and args.dry_run:
        raise UsageError("--yes and --dry-run exclude each other")
    older = parse_duration(args.older_than) if args.older_than else None
    size = parse_size(args.max_size, allow_zero=True) if args.max_size else None  # 0: remove everything
    inv = inventory(folder, store=store, parse_pickles=False)
    plan = plan_prune(inv, older_than=older, max_size=size, kinds=kinds, now=time.time())
    pd = plan.to_dict()
    if not args.yes:
        if args.json:
            emit_json("cache-prune", {"dry_run": True, **pd})
        else:
            echo(format_plan(pd))
        return 0
    res = apply_prune(plan).to_dict()
    if args.json:
        emit_json("cache-prune", {"dry_run": False, **pd, "result": res})
    else:
        echo(format_plan(pd, applied=res))
    return 0


def register(sub: Any) -> None:
    h = (
        "inventory a TorchInductor cache folder (TORCHINDUCTOR_CACHE_DIR): "
        "entries by kind, size, age; `cache prune` removes old entries"
    )
    p = sub.add_parser(
        "cache",
        help=h,
        description=h,
        epilog=(
            "usage: torchless cache [DIR] [--json] [--kind K] [--show ENTRY] | "
            "torchless cache prune [DIR] --older-than 7d --max-size 1G [--yes]"
        ),
    )
    p.add_argument(
        "target",
        nargs="*",
        metavar="[prune] [DIR]",
        help="the cache folder, a path or a URL of storage that lists folders (s3://, memory://...; not plain "
        "http) (default: $TORCHINDUCTOR_CACHE_DIR, else <tmp>/torchinductor_<user>); "
        "'prune' first to prune",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--kind", help="only entries of these kinds (comma-separated: fxgraph, cpp_kernel, triton_kernel ...)")
    p.add_argument(
        "--show", metavar="ENTRY", help="print the source of an entry (kernel .py/.cpp, or an FX graph entry's generated code)"
    )
    p.add_argument("--no-pickles", action="store_true", help="do not summarize pickled entries")
    p.add_argument("--older-than", help="prune: remove entries whose newest file is older than this (7d, 12h, 90m)")
    p.add_argument("--max-size", help="prune: then remove the oldest entries until the cache is at most this big (1G, 500MiB)")
    p.add_argument("--dry-run", action="store_true", help="prune: only list what would be removed (the default)")
    p.add_argument("--yes", action="store_true", help="prune: really remove the listed files")
    p.set_defaults(func=cmd_cache)
