"""``torchless`` entry point.

Exit codes: 0 success / clean, 1 findings (``verify``/``scan`` problems, ``diff``
differences), 2 error (bad input, bad usage: one line on stderr, no traceback).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import Sequence

from ..core.errors import TorchlessError

__all__ = ["main", "entry", "COMMAND_MODULES"]

#: modules defining commands; each has ``register(subparsers)`` adding parsers whose
#: ``func(args) -> int`` runs the command.
COMMAND_MODULES = [
    "torchless.cli.commands.generic",
    "torchless.cli.commands.onnx",
    "torchless.cli.commands.dcp",
    "torchless.cli.commands.scan",
    "torchless.cli.commands.torchscript",
    "torchless.cli.commands.graph",
    "torchless.cli.commands.aoti",
    "torchless.cli.commands.cache",
]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="torchless",
        description="Read, inspect, verify, scan and convert PyTorch artifacts without torch.",
        epilog="exit codes: 0 ok, 1 findings/differences, 2 error",
    )
    from .. import __version__

    p.add_argument("--version", action="version", version=f"torchless {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for m in COMMAND_MODULES:
        importlib.import_module(m).register(sub)
    return p




def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code instead of exiting."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse: usage errors exit 2, --help/--version exit 0
        return int(e.code or 0)
    try:
        return int(args.func(args) or 0)
    except TorchlessError as e:
        print(f"torchless: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `torchless ls | head`: the reader went away, not an error
        try:
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - silence the flush at exit
        except OSError:
            pass
        return 0
    except (OSError, ValueError, KeyError, RecursionError, MemoryError) as e:
        # anything escaping the library's error tree is still one line, not a traceback
        print(f"torchless: error: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("torchless: interrupted", file=sys.stderr)
        return 130


def entry() -> None:
    """Console-script wrapper."""
    sys.exit(main())


if __name__ == "__main__":  # pragma: no cover
    entry()
