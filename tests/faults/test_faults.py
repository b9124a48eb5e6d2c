"""Fault injection: every writer killed or failed part-way leaves its destination absent
or complete, leaves no temporaries behind (or the next run removes them), and the next
run succeeds.

Each case runs the CLI in a child process with ``TORCHLESS_FAULT_AFTER_BYTES=N:ACTION``
(the hook in ``torchless.io.atomic``): after N bytes written the child sends itself
SIGINT, SIGTERM, SIGHUP or SIGKILL, or its next write fails with ENOSPC. A real full
disk is simulated with RLIMIT_FSIZE (the write fails with EFBIG), and a read-only
destination with a folder the child cannot write (as an unprivileged user when the
tests run as root).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np
import pytest

import torchless
from torchless.io.atomic import TEMP_PREFIX

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.abspath(os.path.join(HERE, "..", "..", "src"))
SAMPLES = os.path.abspath(os.path.join(HERE, "..", "..", "samples"))


def _env(fault: str | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = SRC + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("TORCHLESS_FAULT_AFTER_BYTES", None)
    if fault:
        env["TORCHLESS_FAULT_AFTER_BYTES"] = fault
    return env


def cli(*argv: str, fault: str | None = None, preexec=None, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "torchless.cli.main", *map(str, argv)],
        env=_env(fault),
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=preexec,
        cwd=cwd,
    )


def temporaries(folder: str) -> list[str]:
    out = []
    for root, dirs, files in os.walk(folder):
        out += [os.path.join(root, n) for n in dirs + files if n.startswith(TEMP_PREFIX)]
    return out


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """A checkpoint big enough for several fault points (about 1.2 MB, 8 tensors)."""
    d = tmp_path_factory.mktemp("src")
    rng = np.random.default_rng(0)
    sd = {f"layer{i}.weight": torchless.Tensor.from_numpy(rng.standard_normal((128, 300)).astype(np.float32)) for i in range(8)}
    p = d / "model.safetensors"
    torchless.save(sd, p)
    return str(p)


def _valid_file(path: str) -> None:
    with torchless.open(path) as art:
        assert not [p for p in art.verify() if p.severity == "error"]


def _valid_sharded(dst: str) -> None:
    idx = dst + ".index.json"
    with open(idx) as f:
        index = json.load(f)
    for shard in set(index["weight_map"].values()):
        _valid_file(os.path.join(os.path.dirname(dst), shard))


def _valid_dcp(dst: str) -> None:
    with torchless.open(dst) as art:
        assert len(list(art.tensors())) == 8
        assert not [p for p in art.verify() if p.severity == "error"]


def _valid_folder(dst: str) -> None:
    assert os.path.isdir(dst) and os.listdir(dst)


# writer id -> (argv builder (src, dst), destination name, validator, what exists on success)
WRITERS = {
    "pt": (lambda s, d: ["convert", s, d], "out.pt", _valid_file),
    "safetensors": (lambda s, d: ["convert", s, d], "out.safetensors", _valid_file),
    "npz": (lambda s, d: ["convert", s, d], "out.npz", _valid_file),
    "shards": (lambda s, d: ["convert", s, d, "--max-shard-size", "400KB"], "out.safetensors", _valid_sharded),
    "reshard": (lambda s, d: ["reshard", s, d, "--ranks", "3"], "dcp_out", _valid_dcp),
}


def _published(kind: str, dst: str) -> bool:
    if kind == "shards":
        return os.path.exists(dst + ".index.json")
    return os.path.exists(dst)


def _nothing_partial(kind: str, out: str, dst: str) -> None:
    """Absent means absent: no shard without its index, no half folder."""
    names = [n for n in os.listdir(out) if not n.startswith(TEMP_PREFIX)]
    if not _published(kind, dst):
        assert names == [], names


@pytest.mark.parametrize("kind", list(WRITERS))
@pytest.mark.parametrize("action", ["SIGINT", "SIGTERM", "SIGKILL"])
def test_killed_writer_leaves_nothing_partial_and_rerun_succeeds(tmp_path, source, kind, action):
    argv, name, valid = WRITERS[kind]
    out = str(tmp_path / "out")
    os.mkdir(out)
    dst = os.path.join(out, name)
    points = (0, 300_000, 900_000) if action == "SIGKILL" else (0, 900_000)  # first byte, inside, near the end (of ~1.2 MB)
    for after in points:
        r = cli(*argv(source, dst), fault=f"{after}:{action}")
        assert "Traceback" not in r.stderr, r.stderr
        assert r.returncode == (130 if action == "SIGINT" else -getattr(signal, action)), (after, r.returncode, r.stderr)
        assert not _published(kind, dst), after
        _nothing_partial(kind, out, dst)
        if action != "SIGKILL":  # the handlers removed the temporaries before dying
            assert temporaries(out) == [], temporaries(out)
        else:
            assert temporaries(out), "SIGKILL leaves temporaries for the next run to find"
    r = cli(*argv(source, dst))
    assert r.returncode == 0, r.stderr
    valid(dst)
    assert temporaries(out) == [], "the rerun removed the stale temporaries"
    if action == "SIGKILL" and "removed" in r.stderr:
        assert "interrupted run" in r.stderr


def test_sighup_cleans_up(tmp_path, source):
    dst = str(tmp_path / "o.safetensors")
    r = cli("convert", source, dst, fault="300000:SIGHUP")
    assert r.returncode == -signal.SIGHUP
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("kind", list(WRITERS))
def test_enospc_names_the_destination(tmp_path, source, kind):
    argv, name, _valid = WRITERS[kind]
    dst = str(tmp_path / name)
    r = cli(*argv(source, dst), fault="300000:ENOSPC")
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "No space left on device" in lines[0], r.stderr
    assert TEMP_PREFIX not in r.stderr and "Traceback" not in r.stderr
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("kind", ["reshard", "shards"])
def test_enospc_in_executor_workers_names_the_destination(tmp_path, source, kind):
    # issue 36 bug 4: with --executor local:2 the range tasks' writes (pwrite into the
    # staged file) raised a bare OSError: "No space left on device" named no file
    argv, name, _valid = WRITERS[kind]
    dst = str(tmp_path / name)
    r = cli(*argv(source, dst), "--executor", "local:2", fault="100000:ENOSPC")
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "No space left on device" in lines[0], r.stderr
    shard = os.path.join(dst, "__") if kind == "reshard" else os.path.join(str(tmp_path), "out-000")
    assert f"error: {shard}" in lines[0], r.stderr  # the output file, as the user named its destination
    assert TEMP_PREFIX not in r.stderr and "Traceback" not in r.stderr
    assert os.listdir(tmp_path) == []


def _fsize_limit(n: int):
    def pre() -> None:
        import resource

        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of death
        resource.setrlimit(resource.RLIMIT_FSIZE, (n, n))

    return pre


@pytest.mark.parametrize("kind", ["pt", "shards", "reshard"])
def test_file_size_limit_is_one_clear_line(tmp_path, source, kind):
    argv, name, valid = WRITERS[kind]
    dst = str(tmp_path / name)
    r = cli(*argv(source, dst), preexec=_fsize_limit(200_000))
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "file too large" in lines[0], r.stderr
    assert str(tmp_path) in lines[0] and TEMP_PREFIX not in lines[0]
    assert os.listdir(tmp_path) == []
    assert cli(*argv(source, dst)).returncode == 0
    valid(dst)


def _unprivileged():
    """A preexec function dropping to an unprivileged user (root ignores permissions),
    None when not root, False when the interpreter cannot run unprivileged here."""
    if os.geteuid() != 0:
        return None

    def pre() -> None:
        os.setgid(65534)
        os.setuid(65534)

    try:
        subprocess.run(
            [sys.executable, "-c", "import numpy"], preexec_fn=pre, check=True, capture_output=True, timeout=60, cwd="/"
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return pre


@pytest.mark.parametrize("kind", ["pt", "shards", "reshard"])
def test_read_only_destination(source, kind):
    argv, name, _valid = WRITERS[kind]
    base = tempfile.mkdtemp(prefix="tl-ro-")
    try:
        os.chmod(base, 0o755)
        src = os.path.join(base, "model.safetensors")
        shutil.copy(source, src)
        os.chmod(src, 0o644)
        ro = os.path.join(base, "ro")
        os.mkdir(ro, 0o555)
        os.chmod(ro, 0o555)
        dst = os.path.join(ro, name)
        pre = _unprivileged()
        if pre is False:  # root, and the interpreter is not usable by another user: the hook fails creation
            r = cli(*argv(src, dst), fault="0:EROFS", cwd=base)
        else:
            r = cli(*argv(src, dst), preexec=pre, cwd=base)
        assert r.returncode == 2, r.stderr
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and "not writable" in lines[0], r.stderr
        assert ro in lines[0] and TEMP_PREFIX not in lines[0]
        assert os.listdir(ro) == []
    finally:
        os.chmod(os.path.join(base, "ro"), 0o755)
        shutil.rmtree(base)


def test_stale_temporary_of_a_live_process_is_kept(tmp_path, source):
    """Only temporaries whose process is gone are removed."""
    live = tmp_path / f"{TEMP_PREFIX}{os.getpid()}@x-file-00.tmp"
    live.write_bytes(b"x")
    from torchless.io.atomic import _host

    mine = tmp_path / f"{TEMP_PREFIX}{os.getpid()}@{_host()}-file-01.tmp"
    mine.write_bytes(b"x")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    gone = tmp_path / f"{TEMP_PREFIX}{dead.pid}@{_host()}-file-02.tmp"
    gone.write_bytes(b"x")
    legacy = tmp_path / f"{TEMP_PREFIX}a1b2c3.tmp"  # an older version's name: no process id
    legacy.write_bytes(b"x")
    r = cli("convert", source, tmp_path / "o.npz")
    assert r.returncode == 0, r.stderr
    assert live.exists() and mine.exists() and not gone.exists()
    assert "interrupted run" in r.stderr
    assert legacy.exists() and str(legacy) in r.stderr  # reported, not removed


def test_adoptable_temporaries(tmp_path):
    """The staging API's adoptable(): a temporary of this host whose process is gone, or
    this process's own, may be taken over by a resumed job; a live process's, another
    host's and names of another pattern may not."""
    from torchless.io.atomic import adoptable, temp_path

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    mine = os.path.basename(temp_path(str(tmp_path), "dir"))
    gone = mine.replace(f"{TEMP_PREFIX}{os.getpid()}@", f"{TEMP_PREFIX}{dead.pid}@", 1)
    live = mine.replace(f"{TEMP_PREFIX}{os.getpid()}@", f"{TEMP_PREFIX}{os.getppid()}@", 1)
    other_host = f"{TEMP_PREFIX}{dead.pid}@elsewhere-dir-0a1b2c.tmp"
    assert adoptable(mine) and adoptable(gone)
    assert not adoptable(live) and not adoptable(other_host)
    assert not adoptable(f"{TEMP_PREFIX}a1b2c3.tmp") and not adoptable("model.safetensors")


def test_extract_and_consolidate_killed(tmp_path, source):
    """The folder writers beyond reshard: DCP consolidation and package extraction."""
    dcp = tmp_path / "dcp"
    assert cli("reshard", source, dcp, "--ranks", "2").returncode == 0
    for action in ("SIGINT", "SIGKILL"):
        dst = tmp_path / f"c_{action}.pt"
        r = cli("convert", dcp, dst, fault=f"300000:{action}")
        assert r.returncode != 0 and not dst.exists() and "Traceback" not in r.stderr
        assert cli("convert", dcp, dst).returncode == 0
        _valid_file(str(dst))
    pkg = os.path.join(SAMPLES, "mlp_aoti.pt2")
    out = tmp_path / "extracted"
    r = cli("extract", pkg, out, fault="20000:SIGINT")
    assert r.returncode == 130 and not out.exists(), r.stderr
    assert temporaries(str(tmp_path)) == []
    r = cli("extract", pkg, out, fault="20000:SIGKILL")
    assert r.returncode == -signal.SIGKILL and not out.exists()
    r = cli("extract", pkg, out)
    assert r.returncode == 0 and out.is_dir(), r.stderr
    assert temporaries(str(tmp_path)) == []


def test_sigint_at_start_prints_no_traceback(tmp_path, source):
    """SIGINT during the first 0.3 s (imports, argument parsing, the first bytes).

    A signal that lands while the interpreter itself starts (its ``site`` import, or
    runpy finding the package before the first line of torchless runs) gets Python's own
    report, whose frames are all ``<frozen ...>``; that is outside torchless and not
    counted. Once a torchless file runs, there is never a traceback."""
    ours = 0
    for delay in (0.05, 0.1, 0.15, 0.2, 0.3, 0.4):
        p = subprocess.Popen(
            # --force: a run the signal missed has written o.pt, which the next one replaces
            [sys.executable, "-m", "torchless.cli.main", "convert", source, str(tmp_path / "o.pt"), "--force"],
            env=_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        time.sleep(delay)
        p.send_signal(signal.SIGINT)
        _out, err = p.communicate(timeout=60)
        if "Traceback" in err and "torchless" not in err:  # the interpreter's own start-up
            continue
        ours += 1
        assert "Traceback" not in err, (delay, err)
        assert p.returncode in (0, 130, -signal.SIGINT), (delay, p.returncode, err)
        assert temporaries(str(tmp_path)) == []
    assert ours, "every signal landed before torchless started; the machine is too slow for this test"


@pytest.mark.parametrize("action", ["SIGINT", "SIGKILL"])
def test_model_rewriters_killed(tmp_path, action):
    """TorchScript and ONNX re-saves (the ONNX model and its data file as a pair)."""
    ts = os.path.join(SAMPLES, "scripted_module.pt")
    onnx_model = os.path.join(SAMPLES, "mlp.onnx")
    w_ts, w_onnx = tmp_path / "ts.safetensors", tmp_path / "onnx.safetensors"
    assert cli("convert", ts, w_ts).returncode == 0 and cli("convert", onnx_model, w_onnx).returncode == 0
    out = tmp_path / "out"
    out.mkdir()
    cases = [
        ["ts", "set-weights", ts, w_ts, "-o", out / "ts.pt"],
        ["onnx", "set-weights", onnx_model, w_onnx, "-o", out / "m.onnx", "--external-data", "--size-threshold", "0"],
    ]
    for argv in cases:
        r = cli(*argv, fault=f"500:{action}")
        assert r.returncode == (130 if action == "SIGINT" else -signal.SIGKILL), r.stderr
        assert "Traceback" not in r.stderr
        assert [n for n in os.listdir(out) if not n.startswith(TEMP_PREFIX)] == []  # no model without its data
        r = cli(*argv)
        assert r.returncode == 0, r.stderr
        assert temporaries(str(out)) == []
        _valid_file(str(argv[5]))
        for n in list(os.listdir(out)):
            os.unlink(out / n)


@pytest.mark.parametrize("action", ["SIGTERM", "SIGKILL"])
def test_parallel_reshard_worker_killed(tmp_path, source, action):
    """A worker that dies fails the run (no hang), and nothing is published."""
    dst = tmp_path / "dcp"
    r = cli("reshard", source, dst, "--ranks", "4", "--jobs", "2", fault=f"100000:{action}")
    assert r.returncode == 2 and "worker process" in r.stderr and str(dst) in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    assert os.listdir(tmp_path) == []  # the coordinator removed the staging folder
    r = cli("reshard", source, dst, "--ranks", "4", "--jobs", "2")
    assert r.returncode == 0, r.stderr
    _valid_dcp(str(dst))
    assert temporaries(str(tmp_path)) == []


@pytest.mark.timeout(180)
def test_workers_of_a_coordinator_that_wrote_large_records(tmp_path, monkeypatch):
    """This process writes records of 1 MiB and more first (its CRC thread starts), then
    forks workers that write such records too: they used to inherit the thread pool
    without its thread and wait for it forever. Now every job finishes, with the bytes
    of the same job run in this process."""
    import torchless.dcp

    monkeypatch.setenv("TORCHLESS_STALL_TIMEOUT", "60")  # a stuck pool fails before the test's timeout
    rng = np.random.default_rng(1)
    sd = {f"l{i}": rng.standard_normal((1024, 768)).astype(np.float32) for i in range(3)}
    torchless.save(sd, tmp_path / "a.pt")
    torchless.save(sd, tmp_path / "a.safetensors")
    torchless.dcp.reshard(tmp_path / "a.pt", tmp_path / "ref", 2)
    runs = {
        "jobs": lambda d: torchless.dcp.reshard(tmp_path / "a.pt", d, 2, jobs=2),
        "local:2": lambda d: torchless.dcp.reshard(tmp_path / "a.safetensors", d, 2, executor="local:2"),
        "max_task_bytes": lambda d: torchless.dcp.reshard(tmp_path / "a.pt", d, 2, executor="local:2", max_task_bytes=2 << 20),
    }
    for name, run in runs.items():
        d = tmp_path / name
        run(d)
        for n in os.listdir(tmp_path / "ref"):
            if n.endswith(".distcp"):
                assert (d / n).read_bytes() == (tmp_path / "ref" / n).read_bytes(), (name, n)


def test_range_task_worker_killed(tmp_path, source):
    """``--executor local:2``: a worker killed by SIGKILL in its first task fails the job
    with one line naming the destination (no hang), and nothing is published."""
    out = tmp_path / "out"
    out.mkdir()
    dst = out / "dcp"
    r = subprocess.run(
        [sys.executable, "-m", "torchless.cli.main", "reshard", source, str(dst), "--ranks", "4", "--executor", "local:2"],
        env={**_env(), "TORCHLESS_FAULT_KILL_TASK": str(tmp_path / "killed")},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and "worker process died" in r.stderr and str(dst) in r.stderr, r.stderr
    assert r.stderr.count("\n") == 1 and (tmp_path / "killed").exists()
    assert os.listdir(out) == [] and temporaries(str(tmp_path)) == []


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is gone too (its parent has not reaped it yet)
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return True


@pytest.mark.parametrize("how", [["--jobs", "2"], ["--executor", "local:2"], ["--executor", "local:2", "--max-shard-size"]])
def test_stalled_worker_fails_the_run(tmp_path, source, how):
    """A worker stuck for good (the hook sleeps: no CPU, no I/O, as a deadlocked one) fails
    the run after TORCHLESS_STALL_TIMEOUT seconds with one line naming the destination,
    is stopped, and nothing is published."""
    marker = tmp_path / "stalled"
    env = {"TORCHLESS_FAULT_STALL_TASK": str(marker), "TORCHLESS_STALL_TIMEOUT": "2"}
    out = tmp_path / "out"
    out.mkdir()
    if how[-1] == "--max-shard-size":
        dst = out / "m.safetensors"
        argv = ["convert", source, dst, *how, "200KB"]
    else:
        dst = out / "dcp"
        argv = ["reshard", source, dst, "--ranks", "4", *how]
    t = time.monotonic()
    try:
        r = subprocess.run(
            [sys.executable, "-m", "torchless.cli.main", *map(str, argv)],
            env={**_env(), **env},
            capture_output=True,
            text=True,
            timeout=120,
        )
    except subprocess.TimeoutExpired:  # the coordinator hung (and was killed): not its stuck worker too
        if marker.exists() and marker.read_text():
            os.kill(int(marker.read_text()), signal.SIGKILL)
        raise
    assert r.returncode == 2, r.stderr
    assert "did nothing for 2 s" in r.stderr and str(dst) in r.stderr and r.stderr.count("\n") == 1, r.stderr
    assert time.monotonic() - t < 60
    pid = int(marker.read_text())
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid)  # the stuck worker was stopped, not left behind
    assert os.listdir(out) == [] and temporaries(str(tmp_path)) == []


def test_parallel_reshard_ctrl_c_to_the_group(tmp_path, source):
    """Ctrl-C reaches every process of the group: workers ignore it, the coordinator
    unwinds, stops them and removes the staging folder."""
    dst = tmp_path / "dcp"
    p = subprocess.Popen(
        [sys.executable, "-m", "torchless.cli.main", "reshard", source, str(dst), "--ranks", "8", "--jobs", "2"],
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not temporaries(str(tmp_path)):
        time.sleep(0.01)
    os.killpg(p.pid, signal.SIGINT)
    _out, err = p.communicate(timeout=60)
    if p.returncode == 0:  # finished before the signal: complete output
        _valid_dcp(str(dst))
        return
    # 130, or death by SIGINT: CPython marks a KeyboardInterrupt that lands inside an
    # eval() of a string (namedtuple does one while a module imports) as unhandled even
    # when the program handled it, and then ends itself with SIGINT after exiting 130.
    # A shell reports 130 for both.
    assert p.returncode in (130, -signal.SIGINT) and "Traceback" not in err, err
    assert not dst.exists() and temporaries(str(tmp_path)) == []


def test_lost_keyboard_interrupt_never_publishes(tmp_path, monkeypatch):
    """Python loses the KeyboardInterrupt a signal handler raises inside an at-fork hook
    or a finalizer ("Exception ignored in ..."), and the program goes on. A commit after
    that refuses and removes its temporary, and the CLI reports the run as interrupted
    (130), not as whatever error followed. This is the race a Ctrl-C during a parallel reshard
    hit in CI."""
    from torchless.cli import main as cli_main
    from torchless.io import atomic

    monkeypatch.setattr(atomic, "_fired", [])
    monkeypatch.setattr(atomic, "_previous", {})
    dst = tmp_path / "out"
    d = atomic.AtomicDir(str(dst))
    (open(os.path.join(d.tmp, "a"), "wb")).close()
    with pytest.raises(KeyboardInterrupt):  # what the handler raises...
        atomic._on_signal(signal.SIGINT, None)
    # ...and what Python swallowed: the program goes on
    assert atomic.interrupted() == signal.SIGINT
    with pytest.raises(KeyboardInterrupt):
        d.commit()
    assert not dst.exists() and not os.path.exists(d.tmp)

    f = atomic.AtomicFile(str(tmp_path / "x.bin"))
    f.file.write(b"data")
    with pytest.raises(KeyboardInterrupt):
        f.commit()
    assert not (tmp_path / "x.bin").exists() and temporaries(str(tmp_path)) == []

    def fails(_args):
        from torchless.core.errors import WriteError

        raise WriteError("cannot write: its folder does not exist", path=str(dst))

    assert cli_main._run(_parser_running(fails).parse_args([])) == 130
    monkeypatch.setattr(atomic, "_fired", [])
    assert cli_main._run(_parser_running(fails).parse_args([])) == 2


def _parser_running(func):
    import argparse

    p = argparse.ArgumentParser()
    p.set_defaults(func=func, command="test")
    return p


def _children(pid: int) -> list[int]:
    out: list[int] = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/children") as f:
            out += [int(c) for c in f.read().split()]
    return out


@pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="reads a process's children from /proc (Linux)")
@pytest.mark.parametrize("how", [["--jobs", "2"], ["--executor", "local:2"]])
def test_workers_end_when_the_coordinator_is_killed(tmp_path, source, how):
    """A coordinator killed with SIGKILL cannot stop its workers: each notices that its
    parent is gone and ends (an orphan would live on and hold the caller's pipes, so that
    whoever waits for the command's output waits forever)."""
    marker = tmp_path / "stalled"
    env = {"TORCHLESS_FAULT_STALL_TASK": str(marker), "TORCHLESS_STALL_TIMEOUT": "0"}
    dst = tmp_path / "out"
    p = subprocess.Popen(
        [sys.executable, "-m", "torchless.cli.main", "reshard", source, str(dst), "--ranks", "4", *how],
        env={**_env(), **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    workers: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while not (marker.exists() and marker.read_text()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert marker.read_text(), "no task started"
        workers = _children(p.pid)
        assert int(marker.read_text()) in workers
        p.kill()
        p.wait(timeout=10)
        # the pipes close once the last worker holding them is gone
        out, err = p.communicate(timeout=30)
        deadline = time.monotonic() + 15
        while any(_alive(w) for w in workers) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not [w for w in workers if _alive(w)]
    finally:
        for w in workers:
            if _alive(w):
                os.kill(w, signal.SIGKILL)
        if p.poll() is None:
            p.kill()


@pytest.mark.parametrize("fault", ["dies", "stalls"])
def test_scan_worker_that_dies_or_stalls_gives_no_verdict(tmp_path, fault):
    """scan --jobs 2 runs on the executor's pool: a worker that dies (killed, out of memory
    on a hostile file) or stalls fails the scan in one line, exit 2, with no verdict for
    the folder (before, a dead worker raised the pool's internal error; a stuck one hung)."""
    folder = tmp_path / "models"
    folder.mkdir()
    for i in range(6):
        torchless.save({"w": np.arange(4, dtype=np.float32) + i}, str(folder / f"m{i}.pt"))
    marker = tmp_path / "marker"
    env = (
        {"TORCHLESS_FAULT_KILL_TASK": f"{marker}:2"}
        if fault == "dies"
        else {"TORCHLESS_FAULT_STALL_TASK": str(marker), "TORCHLESS_STALL_TIMEOUT": "2"}
    )
    try:
        r = subprocess.run(
            [sys.executable, "-m", "torchless.cli.main", "scan", str(folder), "--jobs", "2"],
            env={**_env(), **env},
            capture_output=True,
            text=True,
            timeout=120,
        )
    except subprocess.TimeoutExpired:
        if fault == "stalls" and marker.exists() and marker.read_text():
            os.kill(int(marker.read_text()), signal.SIGKILL)
        raise
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "CLEAN" not in r.stdout
    want = "died" if fault == "dies" else "did nothing for 2 s"
    assert want in r.stderr and "cannot scan" in r.stderr and r.stderr.count("\n") == 1, r.stderr
