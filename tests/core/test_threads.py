"""core.threads: the helper threads (read-ahead, write-behind, CRC-32) without
concurrent.futures, with an executor's rules at fork and at exit."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading

import pytest

from torchless.io.threads import Helper, helper


def test_jobs_run_in_order_on_one_named_thread() -> None:
    h = Helper("t-order")
    seen: list[tuple[int, str]] = []
    jobs = [h.submit(lambda i=i: seen.append((i, threading.current_thread().name)) or i) for i in range(50)]
    assert [j.result() for j in jobs] == list(range(50))
    assert [i for i, _ in seen] == list(range(50))
    assert {n for _, n in seen} == {"torchless-t-order"}
    h.stop()


def test_an_exception_reaches_result_and_exception() -> None:
    h = Helper("t-err")

    def boom() -> None:
        raise OSError(28, "No space left on device")

    j = h.submit(boom)
    assert isinstance(j.exception(), OSError)
    with pytest.raises(OSError, match="No space"):
        j.result()
    assert h.submit(lambda: 7).result() == 7  # the thread goes on after a failed job
    h.stop()


def test_cancel_drops_only_work_not_started() -> None:
    h = Helper("t-cancel")
    gate = threading.Event()
    ran: list[int] = []
    first = h.submit(gate.wait)
    second = h.submit(ran.append, 2)
    assert second.cancel() and second.cancelled() and second.done()
    gate.set()
    assert first.result() is True
    assert not first.cancel() and not first.cancelled()  # it ran
    with pytest.raises(RuntimeError, match="cancelled"):
        second.result()
    assert h.submit(ran.append, 3).result() is None
    assert ran == [3]
    h.stop()


def test_stop_finishes_the_work_handed_over_then_refuses() -> None:
    h = Helper("t-stop")
    out: list[int] = []
    for i in range(20):
        h.submit(out.append, i)
    h.stop()
    assert out == list(range(20))
    with pytest.raises(RuntimeError):
        h.submit(out.append, 99)


def test_one_helper_per_name_and_process() -> None:
    assert helper("t-same") is helper("t-same")
    assert helper("t-same") is not helper("t-other")


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_gets_helpers_of_its_own() -> None:
    parent = helper("t-fork")
    assert parent.submit(lambda: 1).result() == 1  # the parent's thread is running
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: the inherited helper's thread does not exist here
        try:
            mine = helper("t-fork")
            ok = mine is not parent and mine.submit(lambda: 41 + 1).result() == 42
            os.write(w, b"1" if ok else b"0")
        finally:
            os._exit(0)
    os.close(w)
    try:
        got = os.read(r, 1)
    finally:
        os.close(r)
        os.waitpid(pid, 0)
    assert got == b"1"


def test_at_exit_work_is_finished_and_atexit_hooks_get_runtimeerror() -> None:
    """A write handed over just before the end is done before the process exits (the thread
    is not a daemon); an atexit hook, run after the interpreter stopped the helpers, gets
    RuntimeError from submit and from a new helper (the callers then work themselves)."""
    code = textwrap.dedent(
        """
        import atexit, sys, time
        from torchless.io.threads import helper
        out = open(sys.argv[1], "w")
        def late():
            try:
                helper("write").submit(print, "late")
                out.write("submitted ")
            except RuntimeError:
                out.write("refused ")
            try:
                helper("new-at-exit")
                out.write("made")
            except RuntimeError:
                out.write("refused")
            out.close()
        atexit.register(late)
        def slow():
            time.sleep(0.3)
            out.write("finished ")
            out.flush()
        helper("write").submit(slow)
        """
    )
    path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"threads-exit-{os.getpid()}.txt")
    try:
        subprocess.run([sys.executable, "-c", code, path], check=True, timeout=60)
        with open(path) as f:
            assert f.read() == "finished refused refused"
    finally:
        if os.path.exists(path):
            os.unlink(path)


def test_a_load_does_not_import_concurrent_futures(tmp_path) -> None:
    """The point of the module: the first eager load of a process pays no import of
    concurrent.futures (logging, traceback, queue) for its read-ahead thread."""
    import numpy as np

    import torchless

    p = tmp_path / "m.pt"
    torchless.save({f"w{i}": np.arange(64, dtype=np.float32) + i for i in range(40)}, str(p))
    code = (
        "import sys, torchless\n"
        "sd = torchless.load(sys.argv[1], mmap=False)\n"
        "b = [x.storage.bytes() for x in sd.values()]\n"
        "print('concurrent.futures' in sys.modules, 'logging' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code, str(p)], check=True, capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["False", "False"]
