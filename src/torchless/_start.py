"""Quiet interrupts while the command line starts.

Importing torchless and NumPy takes a few hundred milliseconds; a Ctrl-C in that time
would print a Python traceback. When torchless runs as the ``torchless`` command (not as
a library), :func:`quiet_interrupts` is called before those imports: SIGINT then ends the
process with status 130 and one line. :func:`torchless.cli.main.main` restores Python's
own handler once the command starts, so interrupted writes unwind and clean up.
"""

from __future__ import annotations

# _signal, not signal: the interpreter has already imported this builtin, while ``signal``
# would first build its enums (several milliseconds on a loaded machine), and a Ctrl-C in
# that time still gets Python's traceback. ``signal`` is a thin wrapper over the same calls.
import _signal
import os
import sys

__all__ = ["command_ends", "quiet_interrupts", "running_as_cli"]


def running_as_cli() -> bool:
    """True when this process is the ``torchless`` command (console script or ``-m``)."""
    orig = getattr(sys, "orig_argv", None) or []
    if "torchless.cli.main" in orig or "torchless.cli" in orig:
        return True
    argv0 = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    return argv0 in ("torchless", "torchless.exe", "torchless-script.py")


def _interrupted(signum: int, frame: object) -> None:
    try:
        os.write(2, b"torchless: interrupted\n")
    finally:
        os._exit(128 + signum)


def quiet_interrupts() -> None:
    """Make SIGINT end the process quietly (status 130) until the command starts."""
    try:
        _signal.signal(_signal.SIGINT, _interrupted)
    except (ValueError, OSError):  # not the main thread
        pass


def _lost_interrupt_hook(unraisable: sys.UnraisableHookArgs) -> None:
    """A KeyboardInterrupt raised where Python cannot propagate it (a weakref callback of
    the import system, an at-fork hook, a finalizer) is printed as "Exception ignored" with
    a traceback and dropped. The command line delivers it again instead, at the next point
    where it can unwind."""
    if issubclass(unraisable.exc_type, KeyboardInterrupt):
        import _thread

        _thread.interrupt_main()
        return
    _previous_unraisablehook(unraisable)


_previous_unraisablehook = sys.unraisablehook


def command_starts() -> None:
    """Give SIGINT back to Python (KeyboardInterrupt) for the command itself."""
    global _previous_unraisablehook
    if sys.unraisablehook is not _lost_interrupt_hook:
        _previous_unraisablehook = sys.unraisablehook
        sys.unraisablehook = _lost_interrupt_hook
    try:
        if _signal.getsignal(_signal.SIGINT) is _interrupted:
            _signal.signal(_signal.SIGINT, _signal.default_int_handler)
    except (ValueError, OSError):
        pass


def _exit_quietly(signum: int, frame: object) -> None:
    os._exit(130 if signum == _signal.SIGINT else 128 + signum)


def command_ends() -> None:
    """The command has answered: a Ctrl-C while the interpreter shuts down (joining
    worker threads and processes) ends it with status 130 and no second message, never
    with a traceback or a death by signal."""
    try:
        _signal.signal(_signal.SIGINT, _exit_quietly)
    except (ValueError, OSError):
        pass
