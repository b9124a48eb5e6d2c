"""Interrupted multi-file outputs: nothing a reader would take for a checkpoint is left,
``--resume`` keeps the files a killed run completed (verified by size and CRC-32) and
writes the rest, ``--cleanup`` removes the staging leftovers."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import torchless
import torchless.dcp as tdcp
from torchless.io.atomic import TEMP_PREFIX
from torchless.jobs import outputs as ranged
from torchless.jobs.hooks import KILL_ENV

SRC = os.path.join(os.path.dirname(__file__), "..", "..", "..", "src")


def _state() -> dict:
    rng = np.random.default_rng(0)
    return {f"layer{i}.weight": rng.standard_normal((64 + i, 48)).astype(np.float32) for i in range(8)} | {"step": 3}


@pytest.fixture
def source(tmp_path):
    torchless.save(_state(), tmp_path / "src.pt")
    tdcp.reshard(tmp_path / "src.pt", tmp_path / "r2", 2)
    return str(tmp_path / "r2")


def _cli(*argv: str, kill: str | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.path.abspath(SRC) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop(KILL_ENV, None)
    if kill:
        env[KILL_ENV] = kill
    return subprocess.run(
        [sys.executable, "-m", "torchless.cli.main", *argv], env=env, capture_output=True, text=True, timeout=120
    )


def _files(d) -> dict[str, bytes]:
    return {n: open(os.path.join(d, n), "rb").read() for n in sorted(os.listdir(d)) if n != ".metadata"}


def _staging(parent) -> list[str]:
    return [n for n in os.listdir(parent) if n.startswith(TEMP_PREFIX)]


def test_killed_run_resumes_from_its_completed_files(source, tmp_path):
    want = tmp_path / "want"
    tdcp.reshard(source, want, 4)
    dst = tmp_path / "out"
    # the coordinator runs the tasks itself (local:1) and dies at the 3rd: 2 files done
    r = _cli("reshard", source, str(dst), "--ranks", "4", "--executor", "local:1", kill=f"{tmp_path / 'k'}:3")
    assert r.returncode == -9, r.stderr
    assert not dst.exists()  # nothing a reader would take for a checkpoint
    left = _staging(tmp_path)
    assert len(left) == 1 and not os.path.exists(tmp_path / left[0] / ".metadata")
    # a completed file that was damaged since is not trusted
    victim = tmp_path / left[0] / "__1_0.distcp"
    data = bytearray(victim.read_bytes())
    data[100] ^= 0xFF
    victim.write_bytes(bytes(data))
    r = _cli("reshard", source, str(dst), "--ranks", "4", "--resume", "--json")
    assert r.returncode == 0, r.stderr
    import json

    res = json.loads(r.stdout)
    assert res["resumed"] == ["__0_0.distcp"] and res["tasks"] == 3
    assert _files(dst) == _files(want)
    assert _staging(tmp_path) == []
    got = tdcp.load(dst, materialize=True)
    for k, v in _state().items():
        assert np.array_equal(got[k], v) if isinstance(v, np.ndarray) else got[k] == v


def test_cleanup_removes_the_leftovers(source, tmp_path):
    dst = tmp_path / "out"
    r = _cli("reshard", source, str(dst), "--ranks", "4", "--max-task-bytes", "1MiB", kill=f"{tmp_path / 'k'}:2")
    assert r.returncode == -9
    assert len(_staging(tmp_path)) == 1
    r = _cli("reshard", source, str(dst), "--ranks", "4", "--cleanup")
    assert r.returncode == 0 and "removed 1" in r.stdout, r.stdout + r.stderr
    assert _staging(tmp_path) == [] and not dst.exists()
    res = tdcp.reshard(source, dst, 4, resume=True)  # nothing left to resume
    assert res["resumed"] == []


def test_shards_resume_and_cleanup(source, tmp_path):
    want, out = tmp_path / "want", tmp_path / "out"
    want.mkdir()
    out.mkdir()
    torchless.convert(source, want / "m.safetensors", max_shard_size="30KB")
    argv = ["convert", source, str(out / "m.safetensors"), "--max-shard-size", "30KB", "--executor", "local:1"]
    r = _cli(*argv, kill=f"{tmp_path / 'k'}:3")
    assert r.returncode == -9
    assert [n for n in os.listdir(out) if not n.startswith(TEMP_PREFIX)] == []  # no shard, no index
    r = _cli(*argv, "--resume", "--json")
    assert r.returncode == 0, r.stderr
    assert _files(out) == _files(want) and len(_files(want)) > 3
    r = _cli(*argv, "--force", kill=f"{tmp_path / 'k2'}:2")
    assert r.returncode == -9 and _staging(out)
    assert _cli("convert", source, str(out / "m.safetensors"), "--cleanup").returncode == 0
    assert _staging(out) == []


def test_remote_interrupted_job_resumes(source, tmp_path, monkeypatch):
    """A URL destination (memory://): an interrupted resumable job leaves only its
    staging prefix; the next --resume verifies and keeps the files it completed."""
    fsspec = pytest.importorskip("fsspec", reason="the remote extra is not installed")
    fs = fsspec.filesystem("memory")
    url = "memory://resume-test/out"
    want = tmp_path / "want"
    tdcp.reshard(source, want, 4)
    real = ranged.run_range_task
    calls = []

    def interrupted(task):
        calls.append(task.name)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(task)

    monkeypatch.setattr(ranged, "run_range_task", interrupted)
    with pytest.raises(KeyboardInterrupt):
        tdcp.reshard(source, url, 4, resume=True)
    names = fs.ls("/resume-test/out", detail=False)
    assert [n.rsplit("/", 1)[-1] for n in names] == [".torchless-staging-out"]
    monkeypatch.setattr(ranged, "run_range_task", real)
    res = tdcp.reshard(source, url, 4, resume=True)
    assert res["resumed"] == ["__0_0.distcp", "__1_0.distcp"]
    for n, data in _files(want).items():
        assert fs.cat(f"/resume-test/out/{n}") == data
    assert sorted(n.rsplit("/", 1)[-1] for n in fs.ls("/resume-test/out", detail=False)) == sorted(os.listdir(want))
    fs.rm("/resume-test", recursive=True)


@pytest.mark.parametrize("fmt", ["torch_save", "hf"])
def test_range_tasks_write_the_default_paths_bytes(source, tmp_path, fmt):
    """Range tasks small enough to split tensors (1 MiB) write the bytes of the default
    path, both storage flavours (a 1.2 MiB tensor: its torch.save item is sealed with the
    joined CRC-32 of its rows)."""
    big = tmp_path / "big.pt"
    torchless.save({"w": np.arange(640 * 512, dtype=np.float32).reshape(640, 512), "b": np.ones(3, np.float32)}, big)
    for src in (source, str(big)):
        a, b = tmp_path / f"a-{fmt}-{os.path.basename(src)}", tmp_path / f"b-{fmt}-{os.path.basename(src)}"
        tdcp.reshard(src, a, 1, format=fmt)
        res = tdcp.reshard(src, b, 1, format=fmt, executor="local:1", max_task_bytes=1 << 20)
        assert res["tasks"] >= (2 if src == str(big) else 1)
        assert _files(a) == _files(b)
