"""``torchless extract PKG OUTDIR``: unpack an AOTInductor package (any torch zip) safely."""

from __future__ import annotations

import argparse
from typing import Any

from ..render import echo, emit_json, format_bytes, format_table

__all__ = ["register", "format_extracted"]


def format_extracted(files: list[Any], outdir: str) -> str:
    rows = [[f.path, format_bytes(f.size)] for f in files]
    total = sum(f.size for f in files)
    return format_table(rows) + f"\nextracted {len(files)} files ({format_bytes(total)}) into {outdir}"


def cmd_extract(args: argparse.Namespace) -> int:
    from ..._cli_api import extract_archive
    from ...core.sizes import parse_size

    limit = parse_size(args.max_size) if args.max_size else None
    files = extract_archive(
        args.package, args.outdir, strip_prefix=args.strip_prefix, overwrite=args.overwrite, max_total_bytes=limit
    )
    if args.json:
        emit_json("extract", {"outdir": args.outdir, "files": [f.to_dict() for f in files]})
    else:
        echo(format_extracted(files, args.outdir))
    return 0


def register(sub: Any) -> None:
    h = "unpack an AOTInductor package (or any torch zip archive) into a folder; refuses path traversal and symlinks"
    p = sub.add_parser("extract", help=h, description=h)
    p.add_argument("package", help="the .pt2 package (a zip archive)")
    p.add_argument("outdir", help="output folder (created if missing)")
    p.add_argument("--strip-prefix", action="store_true", help="drop the archive folder (e.g. 'model/') from the written paths")
    p.add_argument("--overwrite", "--force", action="store_true", help="replace files that exist (never symlinks)")
    p.add_argument("--max-size", help="refuse archives holding more than this (e.g. 10GB)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_extract)
