"""What a task does besides its work: the tests' fault hooks and memory metering.

Fault injection for tests: ``TORCHLESS_FAULT_KILL_TASK=PATH`` makes the first task that
creates ``PATH`` (exclusively) kill its own process with SIGKILL, as a lost worker would;
``PATH:N`` waits for the N-th task of the process (an interrupted job with N-1 tasks done).
``TORCHLESS_FAULT_STALL_TASK=PATH`` makes the first task that creates ``PATH`` write its
process id there and sleep forever (no CPU, no I/O), as a deadlocked worker would.

When neither variable is set a hook costs two environment lookups. :func:`current_rss` is what a
range task reports as its peak resident size (``reshard``'s ``peak_rss``).
"""

from __future__ import annotations

import os
import signal
import time

__all__ = ["KILL_ENV", "STALL_FAULT_ENV", "task_fault", "peak_rss", "current_rss"]

KILL_ENV = "TORCHLESS_FAULT_KILL_TASK"
STALL_FAULT_ENV = "TORCHLESS_FAULT_STALL_TASK"


_tasks_seen = 0


def task_fault() -> None:
    """The test hooks (see the module doc): kill this process, once per marker file
    (``PATH:N``: at the N-th task this process runs), or stall it."""
    global _tasks_seen
    stall = os.environ.get(STALL_FAULT_ENV)
    if stall:
        try:
            fd = os.open(stall, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            pass
        else:
            os.write(fd, str(os.getpid()).encode())
            os.close(fd)
            while True:
                time.sleep(3600)
    spec = os.environ.get(KILL_ENV)
    if not spec:
        return
    _tasks_seen += 1
    marker, _, nth = spec.rpartition(":") if spec.rpartition(":")[2].isdigit() else (spec, "", "")
    if nth and _tasks_seen < int(nth):
        return
    try:
        fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return
    os.close(fd)
    os.kill(os.getpid(), signal.SIGKILL)


def peak_rss() -> int:
    """This process's peak resident set size in bytes (0 where unknown)."""
    try:
        import resource
        import sys

        r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return int(r if sys.platform == "darwin" else r * 1024)
    except (ImportError, OSError):
        return 0


def current_rss() -> int:
    """This process's resident set size now, in bytes (0 where unknown). (A worker
    process's ``ru_maxrss`` is useless here: a forked child starts with its parent's.)"""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        pass
    try:
        import psutil

        return int(psutil.Process().memory_info().rss)
    except Exception:  # noqa: BLE001 - no psutil, or no permission
        return 0
