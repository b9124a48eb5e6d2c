"""``torchless scan PATH...``: find what loading these files would execute.

Verdicts per file: CLEAN (0), SUSPICIOUS / UNANALYSABLE / DANGEROUS (1), ERROR (2). The
scan exits with 1 when any file has findings; else 2 when a file or folder could not be
read, or when there was nothing to scan; else 0.
"""

from __future__ import annotations

import argparse

from ..render import echo

__all__ = ["register", "cmd_scan"]


def cmd_scan(args: argparse.Namespace) -> int:
    from ..._cli_api import format_scan_json as format_json
    from ..._cli_api import format_scan_sarif as format_sarif
    from ..._cli_api import format_scan_text as format_text
    from ...scan import scan  # the scanner is imported when a scan runs, not at CLI start

    report = scan(args.paths, unknown_severity=args.unknown_severity, jobs=args.jobs, coverage=args.coverage)
    if args.sarif:
        echo(format_sarif(report))
    elif args.json:
        echo(format_json(report))
    else:
        echo(format_text(report, verbose=args.verbose))
    return report.exit_code


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "scan",
        help="security-scan files/directories for pickles that would run code",
        description="Find every pickle stream in every carrier (raw pickles, torch zips, legacy and tar "
        "checkpoints, TorchScript, .pt2, DCP, .npy/.npz, compressed joblib-style files), run each "
        "symbolically (nothing is imported) and report dangerous or unknown globals and container "
        "differentials. Bytes no carrier recognises are CLEAN only when the real unpicklers refuse them "
        "before importing anything and the name claims no model (a README, an image); named like a model, "
        "never. Exit codes: 0 every file CLEAN; 1 a file "
        "SUSPICIOUS, UNANALYSABLE or DANGEROUS; 2 a file or folder could not be read, or nothing to scan.",
    )
    p.add_argument("paths", nargs="+", metavar="PATH", help="files or directories (recursive)")
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="machine-readable report")
    fmt.add_argument("--sarif", action="store_true", help="SARIF 2.1.0 for code-scanning CI")
    p.add_argument(
        "--unknown-severity",
        default="medium",
        metavar="{critical,high,medium,low,info}",
        help=(
            "severity of globals that are neither allowlisted nor known "
            "dangerous (default: medium; 'info' does not fail the scan)"
        ),
    )
    p.add_argument("--jobs", "-j", type=int, default=None, help="worker processes (default: all cores)")
    p.add_argument(
        "--coverage",
        action="store_true",
        help="with --json: list per file every pickle stream and source analysed (member, offset, length, sha256)",
    )
    p.add_argument("--verbose", "-v", action="store_true", help="also show clean files' details and info findings")
    p.set_defaults(func=cmd_scan)
