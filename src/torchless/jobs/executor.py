"""Where independent write tasks run: this process, a local process pool, or a Dask cluster.

A task is a small picklable object handed to a module-level function; it reads its
inputs straight from storage and writes its output range itself, and returns only small
metadata (bytes written, a CRC-32, peak memory). No payload byte passes through the
coordinator, the Dask scheduler or the client.

* ``local:N`` (or ``None``, or an int): ``N`` worker processes on this machine (``N`` <= 1:
  in this process), as ``--jobs N`` does.
* ``dask://HOST:PORT`` (or ``tcp://...``): an existing Dask distributed cluster; or a
  ``distributed.Client`` given in Python. Tasks are submitted with ``retries``, so a task
  whose worker died runs again elsewhere: every task is idempotent (a retry rewrites the
  same bytes at the same place).

Progress comes from task completions. ``dask[distributed]`` is the optional extra
``torchless[dask]``; it is imported only when a Dask executor is asked for.

Local workers are forked (fast, and they see this process's environment, storage options
and imports without re-running ``__main__``). What a fork copies from a threaded parent is
reset in the child (torchless's CRC thread, its remote block caches and counters,
fsspec's loop lock: see :func:`torchless.io.remote._after_fork`). A worker that dies
fails the job with a WriteError; so does a pool in which no worker shows any activity
(CPU time, bytes read or written) and no task finishes for ``TORCHLESS_STALL_TIMEOUT``
seconds (default 600; 0: wait forever), a worker stuck on a lock or on storage that
never answers: the job fails instead of hanging. Each task's remote traffic is returned
with its result and added to this process's counters (``--stats``).

The tasks' test fault hooks and memory metering are :mod:`torchless.jobs.hooks`.
"""

from __future__ import annotations

import functools
import os
import signal
import time
from collections.abc import Callable, Sequence
from typing import Any, cast

from ..core.errors import UsageError, WriteError
from ..io.stall import STALL_ENV, stall_timeout  # a pool with no worker activity

__all__ = [
    "Executor",
    "LocalExecutor",
    "DaskExecutor",
    "parse_executor",
    "stop_pool",
    "pool_map",
    "counted",
    "add_traffic",
    "ignore_sigint",
    "stall_timeout",
]

DASK_HINT = "install the dask extra: pip install 'torchless[dask]'"


class Executor:
    """Runs ``fn(task)`` for every task and returns the results in task order."""

    name = "executor"
    workers = 1

    def map(self, fn: Callable[[Any], Any], tasks: Sequence[Any], *, progress: Callable[[Any], None] | None = None) -> list[Any]:
        raise NotImplementedError

    def close(self) -> None:
        pass


class LocalExecutor(Executor):
    """``jobs`` processes on this machine (``jobs`` <= 1: this process)."""

    def __init__(self, jobs: int = 1, *, where: str = "") -> None:
        self.workers = max(1, int(jobs))
        self.name = f"local:{self.workers}"
        self.where = where  # the destination errors name

    def map(self, fn: Callable[[Any], Any], tasks: Sequence[Any], *, progress: Callable[[Any], None] | None = None) -> list[Any]:
        if self.workers <= 1 or len(tasks) <= 1:
            out = []
            for t in tasks:
                r = fn(t)
                out.append(r)
                if progress is not None:
                    progress(r)
            return out
        return pool_map(fn, tasks, self.workers, progress, where=self.where)


def _who() -> str:
    import socket

    return f"{socket.gethostname()}:{os.getpid()}"


def counted(fn: Callable[[Any], Any], task: Any) -> tuple[Any, dict[str, int], str]:
    """Run ``fn(task)`` on a worker: its result, the remote traffic it made, and where it ran."""
    from ..io import remote

    before = remote.STATS.to_dict()
    r = fn(task)
    after = remote.STATS.to_dict()
    return r, {k: after[k] - before[k] for k in after}, _who()


def add_traffic(traffic: dict[str, int], who: str) -> None:
    """Count a worker's remote traffic in this process's ``STATS`` (unless the worker is
    this process, whose counters already hold it)."""
    if who == _who():
        return
    from ..io import remote

    with remote.STATS.lock:
        remote.STATS.requests += int(traffic.get("requests", 0))
        remote.STATS.bytes_fetched += int(traffic.get("bytes_fetched", 0))
        remote.STATS.uploads += int(traffic.get("uploads", 0))
        remote.STATS.bytes_uploaded += int(traffic.get("bytes_uploaded", 0))


def _activity(pids: list[int]) -> tuple[float, int] | None:
    """What the processes have done so far: CPU seconds, and bytes read and written (any
    channel: files, sockets, pipes), or None where that cannot be known."""
    cpu = 0.0
    io = 0
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                fields = f.read().rpartition(b")")[2].split()
            cpu += (int(fields[11]) + int(fields[12])) / tick  # utime, stime
        except (OSError, ValueError, IndexError):
            try:
                import psutil

                ct = psutil.Process(pid).cpu_times()
                cpu += ct.user + ct.system
            except Exception:  # noqa: BLE001 - no psutil, or the process is gone
                return None
        try:
            with open(f"/proc/{pid}/io", "rb") as f:
                io += sum(int(line.split()[1]) for line in f if line.startswith((b"rchar", b"wchar")))
        except (OSError, ValueError, IndexError):
            pass  # CPU time alone
    return cpu, io


def _busy(before: tuple[float, int] | None, now: tuple[float, int] | None, quiet: float) -> bool:
    """Did the workers work since ``before``, ``quiet`` seconds ago? Any byte read or
    written counts; CPU time must be more than the trickle of an idle event loop's timers
    (1 % of the time, and over 50 ms), which a stuck worker may still show."""
    if before is None or now is None:
        return True  # unknown: never called stuck
    return now[1] != before[1] or now[0] - before[0] > 0.05 + 0.01 * quiet


def pool_map(
    fn: Callable[[Any], Any],
    tasks: Sequence[Any],
    jobs: int,
    progress: Callable[[Any], None] | None,
    *,
    where: str = "",
    what: str = "a worker process",
    action: str = "write",
) -> list[Any]:
    """``fn`` over ``tasks`` in a process pool of ``jobs`` forked workers that ignore
    SIGINT (the coordinator alone unwinds). A worker that dies, or a pool stalled for
    :func:`stall_timeout` seconds, fails the run (a WriteError naming ``where``) instead
    of leaving it waiting; so does Ctrl-C or a task's error, the workers stopped at once."""
    import multiprocessing as mp
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
    from concurrent.futures.process import BrokenProcessPool

    from ..io.atomic import holding_signals

    stall = stall_timeout()
    ctx = mp.get_context("fork") if "fork" in mp.get_all_start_methods() else mp.get_context("spawn")
    out: list[Any] = [None] * len(tasks)
    pool = ProcessPoolExecutor(min(jobs, len(tasks)), mp_context=ctx, initializer=ignore_sigint, initargs=(os.getpid(),))
    try:
        with holding_signals():  # the forks happen in submit(): no Ctrl-C lost inside at-fork hooks
            futures = {pool.submit(counted, fn, t): i for i, t in enumerate(tasks)}
        pending = set(futures)
        seen = _activity(_pids(pool))  # at the start of the quiet time
        quiet_since = time.monotonic()
        while pending:
            done, pending = wait(pending, timeout=min(1.0, stall / 4) if stall else None, return_when=FIRST_COMPLETED)
            for fut in sorted(done, key=futures.__getitem__):
                r, traffic, who = fut.result()
                add_traffic(traffic, who)
                out[futures[fut]] = r
                if progress is not None:
                    progress(r)
            if not stall or not pending:
                continue
            now_seen = _activity(_pids(pool))
            if done or _busy(seen, now_seen, time.monotonic() - quiet_since):
                seen, quiet_since = now_seen, time.monotonic()
            elif time.monotonic() - quiet_since >= stall:
                raise WriteError(
                    f"cannot {action}: the worker processes did nothing for {stall:g} s with {len(pending)} task(s) "
                    "unfinished (a worker is stuck: deadlocked, or waiting on storage that does not answer)",
                    path=where or None,
                    hint=f"{STALL_ENV}=SECONDS sets how long an idle pool is waited for (0: no limit)",
                )
    except BrokenProcessPool:
        stop_pool(pool)
        raise WriteError(f"cannot {action}: {what} died (killed, or out of memory)", path=where or None) from None
    except BaseException:  # an error in a task, a stall, Ctrl-C, SIGTERM: do not wait for the others
        stop_pool(pool)
        raise
    pool.shutdown(wait=True)
    return out


def _pids(pool: Any) -> list[int]:
    return sorted(p.pid for p in list(getattr(pool, "_processes", {}).values()) if p.pid)  # no public API before 3.14


def stop_pool(pool: Any) -> None:
    """Stop a process pool's workers now, without waiting for their tasks (they remove
    their own temporaries on SIGTERM; one that does not end is killed)."""
    procs = list(getattr(pool, "_processes", {}).values())  # no public API before Python 3.14
    pool.shutdown(wait=False, cancel_futures=True)
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        p.join(timeout=10)
        if p.is_alive():
            p.kill()
            p.join(timeout=10)


def ignore_sigint(parent: int | None = None) -> None:
    """A pool worker's initializer: Ctrl-C is the coordinator's to handle. With the
    coordinator's pid ``parent``, the worker also ends when the coordinator is gone (see
    :func:`watch_parent`)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if parent is not None:
        watch_parent(parent)


#: how often a worker checks that its coordinator is alive, and how long it waits after
#: its own SIGTERM before it exits regardless
PARENT_POLL_S = 0.5
PARENT_GRACE_S = 10.0


def watch_parent(parent: int) -> None:
    """End this worker process once ``parent`` is no longer its parent (the coordinator
    was killed, SIGKILL included: it never stopped its workers). An orphaned worker would
    otherwise live on idle, holding the pipes of whoever ran the job, which then waits
    forever. The worker sends itself SIGTERM (its temporary outputs are removed, as on any
    SIGTERM) and exits outright if that has not ended it within :data:`PARENT_GRACE_S`."""
    import threading

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_S)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(PARENT_GRACE_S)
        os._exit(1)

    threading.Thread(target=watch, name="torchless-parent-watch", daemon=True).start()


class DaskExecutor(Executor):
    """Tasks on a Dask distributed cluster (a ``distributed.Client``).

    Args:
        client: the client; closed by :meth:`close` only when this executor opened it.
        retries: how often a failed task (a lost worker included) is run again.
    """

    def __init__(self, client: Any, *, retries: int = 3, own: bool = False) -> None:
        self.client = client
        self.retries = retries
        self.own = own
        try:
            self.workers = max(1, len(client.scheduler_info().get("workers", {})))
        except Exception:  # noqa: BLE001 - a scheduler that does not answer now: counted when tasks run
            self.workers = 1
        self.name = f"dask:{getattr(client, 'scheduler', None) and client.scheduler.address}"

    def map(self, fn: Callable[[Any], Any], tasks: Sequence[Any], *, progress: Callable[[Any], None] | None = None) -> list[Any]:
        if not tasks:
            return []
        import distributed

        as_completed: Any = cast(Any, distributed).as_completed  # untyped: called through Any

        # pure=False: two equal tasks are still two runs; each future keyed by its index
        futures = self.client.map(functools.partial(counted, fn), list(tasks), pure=False, retries=self.retries)
        index = {f.key: i for i, f in enumerate(futures)}
        out: list[Any] = [None] * len(tasks)
        try:
            for fut in as_completed(futures):
                try:
                    r, traffic, who = fut.result()
                except Exception as e:  # noqa: BLE001
                    raise _dask_error(e) from None
                add_traffic(traffic, who)
                out[index[fut.key]] = r
                if progress is not None:
                    progress(r)
        except BaseException:
            self.client.cancel(futures)
            raise
        return out

    def close(self) -> None:
        if self.own:
            try:
                self.client.close()
            except Exception:  # noqa: BLE001 - closing a client whose scheduler is gone
                pass


def _dask_error(e: BaseException) -> BaseException:
    from ..core.errors import TorchlessError

    if isinstance(e, TorchlessError):
        return e
    name = type(e).__name__
    if name == "KilledWorker":
        return WriteError(f"cannot write: a task failed on every retry, each time its Dask worker died ({e})")
    return WriteError(f"cannot write: a Dask task failed: {name}: {e}")


def parse_executor(spec: Any, *, jobs: int = 1, where: str = "", paths: Sequence[Any] = ()) -> Executor:
    """An :class:`Executor` from ``"local:N"``, ``"dask://HOST:PORT"``, a
    ``distributed.Client``, an :class:`Executor`, or None (``jobs`` local processes).

    ``paths`` are the job's sources and destination: a ``memory://`` one is refused
    unless the tasks run in this process (fsspec's memory filesystem lives in one
    process; what a worker process wrote there would never reach this one).

    Raises:
        UsageError: an unknown spelling, a Dask address without ``dask[distributed]``, or
            worker processes for a ``memory://`` path.
    """
    mem = next((str(p) for p in paths if isinstance(p, str) and p.startswith("memory://")), None)
    if mem is not None:
        local = spec is None or isinstance(spec, (int, LocalExecutor))
        local = local or (isinstance(spec, str) and spec.strip().partition(":")[0] == "local")
        ex = _parse_executor(spec, jobs, where) if local else None  # a Dask address is not dialled
        if ex is None or ex.workers > 1:
            raise UsageError(
                "memory:// is per-process and cannot be shared with worker processes",
                path=mem,
                hint="use --executor local:1 (executor='local:1'), or a real store (s3://, a local folder ...)",
            )
        return ex
    return _parse_executor(spec, jobs, where)


def _parse_executor(spec: Any, jobs: int, where: str) -> Executor:
    if spec is None:
        return LocalExecutor(jobs, where=where)
    if isinstance(spec, Executor):
        return spec
    if isinstance(spec, int):
        return LocalExecutor(spec, where=where)
    if isinstance(spec, str):
        s = spec.strip()
        if s == "local" or s.startswith("local:"):
            n = s.partition(":")[2] or "1"
            if not n.isdigit() or int(n) < 1:
                raise UsageError("cannot read this executor", found=spec, expected="local:N with N >= 1")
            return LocalExecutor(int(n), where=where)
        for scheme in ("dask://", "tcp://", "tls://"):
            if s.startswith(scheme):
                addr = "tcp://" + s[len(scheme) :] if scheme == "dask://" else s
                try:
                    import distributed

                    Client: Any = cast(Any, distributed).Client  # noqa: N806 - the class (untyped: through Any)
                except ImportError:
                    raise UsageError("a Dask executor needs dask[distributed]", hint=DASK_HINT) from None
                try:
                    client = Client(addr, timeout=30)
                except OSError as e:
                    raise UsageError(f"cannot reach the Dask scheduler: {e}", found=spec) from None
                return DaskExecutor(client, own=True)
        raise UsageError("cannot read this executor", found=spec, expected="local:N or dask://HOST:PORT")
    if type(spec).__name__ == "Client" and hasattr(spec, "map") and hasattr(spec, "scheduler_info"):
        return DaskExecutor(spec)
    raise UsageError("cannot use this executor", found=type(spec).__name__, expected="'local:N', 'dask://HOST:PORT' or a Client")
