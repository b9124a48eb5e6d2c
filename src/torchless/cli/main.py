"""``torchless`` entry point.

Exit codes: 0 success / clean, 1 findings (``verify``/``scan`` problems, ``diff``
differences), 2 error (bad input, bad usage: one line on stderr, no traceback).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any

from ..core.errors import InternalError, TorchlessError
from ..core.lazy import import_modules

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
    "torchless.cli.commands.run",
    "torchless.cli.commands.view",
]


class _Parser(argparse.ArgumentParser):
    """argparse's parser, with the help width found without :mod:`shutil`.

    argparse makes a help formatter for every argument it adds and sizes it with
    ``shutil.get_terminal_size``; importing :mod:`shutil` (and the ``bz2`` and ``lzma``
    modules it imports) is a noticeable part of the command line's start-up. The width is
    the same: ``$COLUMNS``, else the terminal's, else 80, less 2. Sub-command parsers are
    of this class too (argparse makes them of their parent's class).
    """

    def _get_formatter(self) -> argparse.HelpFormatter:
        make: Any = self.formatter_class  # every HelpFormatter takes a width
        return make(prog=self.prog, width=_help_width())

    def error(self, message: str) -> Any:  # argparse: a usage error, then exit 2
        global _usage_error
        _usage_error = message
        super().error(message)


def _help_width() -> int:
    try:
        columns = int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        columns = 0
    if columns <= 0:
        out = sys.__stdout__
        try:
            columns = (os.get_terminal_size(out.fileno()).columns if out is not None else 0) or 80
        except (AttributeError, ValueError, OSError):
            columns = 80
    return columns - 2


class _Sink:
    """Takes every call registration makes on the parser of a command not being built."""

    def __getattr__(self, name: str) -> _Sink:
        return self

    def __setattr__(self, name: str, value: object) -> None:
        pass

    def __call__(self, *args: object, **kwargs: object) -> _Sink:
        return self


class _OneCommand:
    """Stands for the sub-commands action while the command modules register: only the
    parser of ``wanted`` (a name or an alias) is built; the others go to a :class:`_Sink`."""

    def __init__(self, sub: argparse._SubParsersAction, wanted: str) -> None:
        self._sub = sub
        self._wanted = wanted
        self.found = False

    def add_parser(self, name: str, **kwargs: Any) -> Any:
        if name == self._wanted or self._wanted in kwargs.get("aliases", ()):
            self.found = True
            return self._sub.add_parser(name, **kwargs)
        return _Sink()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sub, name)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The command line's parser.

    Args:
        command: build only this command's parser, importing the command modules up to
            the one that registers it (``torchless info`` starts without building the
            parsers of some thirty commands it does not run). None, or a name no module
            registers: every command, as ``--help`` and usage errors show them.
    """
    if command is not None and not command.startswith("-"):
        p, sub = _top_parser()
        one = _OneCommand(sub, command)
        for name in COMMAND_MODULES:
            import_modules([name])[0].register(one)
            if one.found:
                return p
    p, sub = _top_parser()
    for m in import_modules(COMMAND_MODULES):
        m.register(sub)
    return p


def _top_parser() -> tuple[argparse.ArgumentParser, argparse._SubParsersAction]:
    p = _Parser(
        prog="torchless",
        description="Read, inspect, verify, scan and convert PyTorch artifacts without torch.",
        epilog="exit codes: 0 ok, 1 findings/differences, 2 error",
    )
    from ..core.version import __version__

    p.add_argument("--version", action="version", version=f"torchless {__version__}")
    p.add_argument(
        "--storage-options",
        metavar="JSON",
        help='fsspec options for URL paths (endpoint, credentials), e.g. \'{"endpoint_url": "http://..."}\'; '
        "may also follow the command",
    )
    p.add_argument(
        "--stats",
        action="store_true",
        help="report remote bytes fetched and requests made on stderr; may also follow the command",
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    return p, sub


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code instead of exiting.

    Every failure is one line on stderr and exit code 2: a :class:`TorchlessError`
    (bad input or usage) as its message, anything else as an internal error that says
    it is a torchless bug. Ctrl-C is one line and exit code 130. Never a traceback.
    With ``--json``, a failure also prints the ``error`` document on stdout (see
    :func:`_json_error`).
    """
    global _usage_error
    _usage_error = None
    try:
        argv, global_opts = _global_options(list(sys.argv[1:] if argv is None else argv))
        # the command's own parser when the first word names one (argparse dispatches on it)
        parser = build_parser(argv[0] if argv else None)
        try:
            args = parser.parse_args(argv)
            for k, v in global_opts.items():
                if v is not None and v is not False:
                    setattr(args, k, v)
        except SystemExit as e:  # argparse: usage errors exit 2, --help/--version exit 0
            exit_code = e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
            if exit_code == 2 and _usage_error is not None and "--json" in argv[: (argv + ["--"]).index("--")]:
                _json_error({"type": "UsageError", "message": _usage_error, "path": None, "text": _usage_error})
            return exit_code
        global _writes_nothing
        _writes_nothing = getattr(args, "writes_nothing", False) is True
        from .._start import command_starts

        command_starts()  # from here a Ctrl-C unwinds (KeyboardInterrupt) so writes clean up
        if args.storage_options is not None and (code := _set_storage_options(args)) is not None:
            return code
        if not args.stats:
            return _run(args)
        from .._cli_api import REMOTE_STATS as STATS

        STATS.reset()
        try:
            return _run(args)
        finally:
            st = STATS.to_dict()
            _say(
                f"stats: {st['requests']} requests, {st['bytes_fetched']} bytes fetched, "
                f"{st['uploads']} uploads, {st['bytes_uploaded']} bytes uploaded"
            )
    except KeyboardInterrupt:
        _interrupted_cleanup()
        _say("interrupted")
        return 130


def _run(args: argparse.Namespace) -> int:
    try:
        return int(args.func(args) or 0)
    except TorchlessError as e:
        if (code := _lost_interrupt()) is not None:
            return code
        return _fail(args, str(e), e)
    except BrokenPipeError:  # `torchless ls | head`: the reader went away, not an error
        try:
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - silence the flush at exit
        except OSError:
            pass
        return 0
    except OSError as e:  # the system refused (permissions, disk full...): the input's fault or the machine's
        if (code := _lost_interrupt()) is not None:
            return code
        text = (e.strerror or type(e).__name__) + (f": {e.filename}" if e.filename else "")
        return _fail(args, text, {"type": type(e).__name__, "message": e.strerror or str(e), "path": e.filename})
    except (RecursionError, MemoryError) as e:
        text = (
            f"input too large or too deeply nested ({type(e).__name__}); torchless's limits should have caught it, please report"
        )
        return _fail(args, text, {"type": type(e).__name__, "message": text, "path": None})
    except Exception as e:  # noqa: BLE001 - the last line of defence: a bug, said once
        if (code := _lost_interrupt()) is not None:  # e.g. a KeyError from an interrupted import
            return code
        err = InternalError.wrap(e, f"running {args.command!r}")
        return _fail(args, str(err), err)


def _fail(args: argparse.Namespace, text: str, error: TorchlessError | dict[str, Any]) -> int:
    """Exit code 2 for a failed command: one line on stderr, and with ``--json`` the
    ``error`` document (schema ``error``) on stdout too."""
    _say(f"error: {text}")
    if getattr(args, "json", False) is True:
        if isinstance(error, TorchlessError):
            d = error.to_dict()
            d["type"] = d.pop("error")
        else:
            d = dict(error)
        _json_error({**d, "text": text})
    return 2


def _json_error(fields: dict[str, Any]) -> None:
    """The ``--json`` document of a failure: ``{"error": {type, message, path, member,
    offset, expected, found, hint, text}}`` (``text``: the line said on stderr)."""
    from .render import emit_json

    keys = ("type", "message", "path", "member", "offset", "expected", "found", "hint", "text")
    try:
        emit_json("error", {"error": {k: fields.get(k) for k in keys}})
        sys.stdout.flush()
    except (OSError, ValueError):  # stdout closed: the exit code still tells
        pass


def _global_options(argv: list[str]) -> tuple[list[str], dict[str, object]]:
    """Take ``--storage-options JSON`` and ``--stats`` out of ``argv`` wherever they stand
    (before a ``--``), so they may follow the command name too."""
    out: list[str] = []
    found: dict[str, object] = {"storage_options": None, "stats": False}
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--":
            out.extend(argv[i:])
            break
        if a == "--stats":
            found["stats"] = True
        elif a == "--storage-options" and i + 1 < len(argv):
            found["storage_options"] = argv[i + 1]
            i += 1
        elif a.startswith("--storage-options="):
            found["storage_options"] = a.split("=", 1)[1]
        else:
            out.append(a)
        i += 1
    return out, found


def _set_storage_options(args: argparse.Namespace) -> int | None:
    import json

    from .._cli_api import set_default_storage_options as set_default_options

    try:
        opts = json.loads(args.storage_options)
    except ValueError as e:
        text = f"--storage-options is not JSON: {e}"
        return _fail(args, text, {"type": "UsageError", "message": text, "path": None})
    if not isinstance(opts, dict):
        text = "--storage-options must be a JSON object"
        return _fail(args, text, {"type": "UsageError", "message": text, "path": None})
    set_default_options(opts)
    return None


def _lost_interrupt() -> int | None:
    """Exit code 128+signal when a signal's clean-up already ran (its KeyboardInterrupt
    lost inside an at-fork hook or a finalizer) and the error at hand is its consequence."""
    from .._cli_api import interrupted

    sig = interrupted()
    if sig is None:
        return None
    _interrupted_cleanup()
    _say("interrupted")
    return 128 + int(sig)


def _interrupted_cleanup() -> None:
    """Remove what the interrupted command still had in progress (writers abort as the
    interrupt unwinds; this catches any that did not)."""
    from .._cli_api import interrupted_cleanup

    interrupted_cleanup()


def _say(text: str) -> None:
    """One line on stderr, whatever the text holds."""
    from ..core.printable import escape_controls

    line = escape_controls(" ".join(text.splitlines()))  # a file's names quoted in a message: nothing raw
    try:
        print(f"torchless: {line}", file=sys.stderr, flush=True)
    except (OSError, ValueError):  # stderr closed: nothing left to tell
        pass


#: set by :meth:`_Parser.error`: the last usage error argparse reported
_usage_error: str | None = None

#: set by :func:`main`: the command that ran declared that it writes nothing
#: (``writes_nothing`` in its parser's defaults: ``info``, ``ls``, ``verify``...)
_writes_nothing = False


def _end_at_once(code: int) -> None:
    """End the process now, without the interpreter's teardown, when the command that
    ran writes nothing and nothing else is left to finish; else return.

    Python's shutdown clears every module and collects what they hold: with NumPy and
    torchless loaded that is about a quarter of what ``torchless info`` costs beyond
    ``import numpy`` (38 M of 157 M instructions). A read-only command has nothing in it
    to lose, so this does the part of the shutdown that can matter, in the same order
    (threading's exit hooks, every ``atexit`` callback: torchless's own clean-up of
    unfinished writes, a coverage tool's save; stdout and stderr flushed), then
    ``os._exit``. Another thread still running, a tracer or profiler, a missing private
    hook or a flush that fails leave the ordinary exit to do everything.
    """
    if not _writes_nothing or sys.gettrace() is not None or sys.getprofile() is not None:
        return
    import atexit
    import threading

    shutdown = getattr(threading, "_shutdown", None)
    run_exitfuncs = getattr(atexit, "_run_exitfuncs", None)
    if shutdown is None or run_exitfuncs is None or threading.active_count() != 1:
        return
    try:
        shutdown()
        run_exitfuncs()
        for f in (sys.stdout, sys.stderr):
            if f is not None:
                f.flush()
    except BaseException:  # noqa: BLE001 - let the ordinary exit deal with it (and say it)
        return
    os._exit(code)


def entry() -> None:
    """Console-script wrapper."""
    code = 130
    try:
        try:
            code = main()
        except KeyboardInterrupt:  # between main's handlers and the exit
            _say("interrupted")
            code = 130
        from .._start import command_ends

        command_ends()
        _end_at_once(code)
    except KeyboardInterrupt:  # a replayed or second Ctrl-C after the answer: said once already
        code = 130
    sys.exit(code)


if __name__ == "__main__":  # pragma: no cover
    entry()
