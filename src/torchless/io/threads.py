"""One helper thread per purpose and process (the zip writer's CRC-32s, read-ahead, write-behind).

A forked child does not inherit a parent's threads but does inherit the helper objects,
which believe their thread idle: work handed to one would wait forever (range tasks hung
this way in ``local:N`` workers whose parent had written a record of 1 MiB or more).
:func:`helper` therefore makes each process its own.

A helper is a thread and a queue, not a ``concurrent.futures.ThreadPoolExecutor``:
importing ``concurrent.futures`` (it brings ``logging``, ``traceback`` and ``queue``) cost
5 ms of the first eager load of a process, a twentieth of loading 20,000 tensors. What
callers use of an executor is kept, with its rules at exit: the thread is not a daemon
(work handed over is finished before the interpreter exits: a write behind is never cut
off), it is stopped once the main thread is done (``threading._register_atexit``, as the
executor does), and from then on — an ``atexit`` hook — :meth:`Helper.submit` raises
RuntimeError, as the executor's does, and the callers do the work themselves.
"""

from __future__ import annotations

import os
import threading
from _queue import SimpleQueue
from collections.abc import Callable
from typing import Any

__all__ = ["Helper", "Job", "helper"]

_POOLS: dict[str, tuple[int, Helper]] = {}
#: set once the interpreter began to shut down (the main thread is done): no new work
_shutting_down = False
_STOP: Any = None  # the queue item that ends a helper's thread


class Job:
    """The outcome of one :meth:`Helper.submit` (what callers use of a ``Future``)."""

    __slots__ = ("_fn", "_args", "_done", "_value", "_error", "_cancelled", "_lock")

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...], lock: threading.Lock) -> None:
        self._fn: Callable[..., Any] | None = fn
        self._args = args
        self._done = threading.Event()
        self._value: Any = None
        self._error: BaseException | None = None
        self._cancelled = False
        self._lock = lock  # the helper's: taking the work and cancelling it exclude each other

    def _run(self) -> None:
        with self._lock:
            fn, args = self._fn, self._args
            self._fn, self._args = None, ()
        if fn is None:  # cancelled before it ran (done already)
            return
        try:
            self._value = fn(*args)
        except BaseException as e:  # noqa: BLE001 - handed to whoever asks for the result
            self._error = e
        self._done.set()

    def cancel(self) -> bool:
        """Drop the work if it has not started (True then); False once it runs or ran."""
        with self._lock:
            if self._fn is None:  # taken by the thread (or cancelled before)
                return self._cancelled
            self._fn, self._args = None, ()
            self._cancelled = True
        self._done.set()
        return True

    def cancelled(self) -> bool:
        return self._cancelled

    def done(self) -> bool:
        return self._done.is_set()

    def result(self) -> Any:
        """The work's return value, once it ran (its exception raised here)."""
        self._done.wait()
        if self._cancelled:
            raise RuntimeError("the job was cancelled")
        if self._error is not None:
            raise self._error
        return self._value

    def exception(self) -> BaseException | None:
        """Wait for the work; the exception it raised, or None."""
        self._done.wait()
        return self._error


class Helper:
    """One thread running the jobs handed to it one at a time, in the order submitted."""

    def __init__(self, name: str) -> None:
        self._queue: SimpleQueue[Any] = SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name=f"torchless-{name}", daemon=False)
        self._stopped = False
        self._lock = threading.Lock()

    def _loop(self) -> None:
        get = self._queue.get
        while True:
            job = get()
            if job is _STOP:
                return
            job._run()
            del job  # (drop the last job's arguments now, not at the next one)

    def submit(self, fn: Callable[..., Any], *args: Any) -> Job:
        """Run ``fn(*args)`` on the thread after the jobs before it.

        Raises:
            RuntimeError: the interpreter is shutting down (an ``atexit`` hook): no new
                thread work; the caller does it itself.
        """
        with self._lock:
            if self._stopped or _shutting_down:
                raise RuntimeError("cannot hand work to a helper thread after interpreter shutdown")
            if self._thread.ident is None:  # (started on the first job)
                self._thread.start()
            job = Job(fn, args, self._lock)
            self._queue.put(job)
        return job

    def stop(self) -> None:
        """Finish the jobs handed over, then end the thread (no new work after this)."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
            started = self._thread.ident is not None
            if started:
                self._queue.put(_STOP)
        if started and self._thread is not threading.current_thread():
            self._thread.join()


def _at_shutdown() -> None:
    """Once the main thread is done: stop every helper of this process after its work."""
    global _shutting_down
    _shutting_down = True
    pid = os.getpid()
    for owner, h in list(_POOLS.values()):
        if owner == pid:
            h.stop()


_registered = 0  # the process that registered _at_shutdown


def helper(name: str) -> Helper:
    """The helper thread named ``torchless-<name>`` of this process (jobs run one at a
    time, in the order they were submitted).

    Raises:
        RuntimeError: the interpreter is shutting down (no new threads).
    """
    global _registered
    got = _POOLS.get(name)
    pid = os.getpid()
    if got is None or got[0] != pid:
        if _shutting_down:
            raise RuntimeError("cannot start a helper thread after interpreter shutdown")
        if _registered != pid:
            # before the interpreter joins its non-daemon threads, as the executor does
            # (RuntimeError in an atexit hook: no new threads there)
            threading._register_atexit(_at_shutdown)  # type: ignore[attr-defined]  # stdlib's hook for thread pools
            _registered = pid
        got = _POOLS[name] = (pid, Helper(name))
    return got[1]
