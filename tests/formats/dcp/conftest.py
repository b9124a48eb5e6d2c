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


def run_job(*args: str) -> None:
    """Run ``torch_jobs.py`` in a subprocess; fail with its output if it fails."""
    env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME=os.environ.get("GLOO_SOCKET_IFNAME", "lo"))
    for attempt in range(2):  # a port taken between choosing and binding: retry once
        port = str(free_port())
        cmd = [sys.executable, JOBS, args[0], args[1], args[2], port, *args[3:]]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
        if res.returncode == 0:
            return
        if "address already in use" not in (res.stderr + res.stdout).lower():
            break
    raise AssertionError(f"torch job {args} failed:\n{res.stdout[-3000:]}\n{res.stderr[-6000:]}")


def _saved(tmp_path_factory: pytest.TempPathFactory, world: int) -> tuple[str, str]:
    pytest.importorskip("torch", reason="torch is the differential oracle; not installed")
    d = tmp_path_factory.mktemp(f"dcp{world}")
    ckpt, ref = str(d / "ckpt"), str(d / "ref.pt")
    run_job("save", ckpt, str(world), ref)
    return ckpt, ref


@pytest.fixture(scope="session")
def saved2(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """(DCP dir written by a 2-rank torch job, torch.save of the full values)."""
    return _saved(tmp_path_factory, 2)


@pytest.fixture(scope="session")
def saved4(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """(DCP dir written by a 4-rank torch job, torch.save of the full values)."""
    return _saved(tmp_path_factory, 4)
