"""Fixtures: DCP checkpoints written by real multi-process torch jobs (gloo, localhost)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
JOBS = os.path.join(HERE, "torch_jobs.py")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cmd(args: tuple[str, ...], port: int) -> list[str]:
    return [sys.executable, JOBS, args[0], args[1], args[2], str(port), *args[3:]]


def _env() -> dict[str, str]:
    return dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME=os.environ.get("GLOO_SOCKET_IFNAME", "lo"))


def run_jobs(*jobs: tuple[str, ...]) -> None:
    """Run several ``torch_jobs.py`` invocations at once; fail with the output of any
    that fails (a port taken between choosing and binding is retried once)."""
    pending = list(jobs)
    for attempt in range(2):
        procs = [
            (j, subprocess.Popen(_cmd(j, free_port()), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env()))
            for j in pending
        ]
        retry = []
        for j, p in procs:
            out, err = p.communicate(timeout=600)
            if p.returncode == 0:
                continue
            if attempt == 0 and "address already in use" in (out + err).lower():
                retry.append(j)
                continue
            raise AssertionError(f"torch job {j} failed:\n{out[-3000:]}\n{err[-6000:]}")
        if not retry:
            return
        pending = retry
    raise AssertionError(f"torch jobs {pending} could not get a free port")


def run_job(*args: str) -> None:
    run_jobs(tuple(args))


@pytest.fixture(scope="session")
def _saved_all(tmp_path_factory: pytest.TempPathFactory) -> dict[int, tuple[str, str]]:
    """DCP checkpoints from a 2-rank and a 4-rank torch job, run at the same time."""
    pytest.importorskip("torch", reason="torch is the differential oracle; not installed")
    out = {}
    jobs = []
    for world in (2, 4):
        d = tmp_path_factory.mktemp(f"dcp{world}")
        ckpt, ref = str(d / "ckpt"), str(d / "ref.pt")
        out[world] = (ckpt, ref)
        jobs.append(("save", ckpt, str(world), ref))
    run_jobs(*jobs)
    return out


@pytest.fixture(scope="session")
def saved2(_saved_all: dict[int, tuple[str, str]]) -> tuple[str, str]:
    """(DCP dir written by a 2-rank torch job, torch.save of the full values); the same
    job wrote the Hugging Face flavour to ``ckpt + "_hf"``."""
    return _saved_all[2]


@pytest.fixture(scope="session")
def saved4(_saved_all: dict[int, tuple[str, str]]) -> tuple[str, str]:
    """(DCP dir written by a 4-rank torch job, torch.save of the full values)."""
    return _saved_all[4]
