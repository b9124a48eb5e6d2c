"""``memory://`` lives in one process: range tasks on worker processes (``--executor
local:N`` with N > 1, a Dask cluster) are refused up front with one UsageError line,
and ``local:1`` (the tasks in this process) works."""

from __future__ import annotations

import numpy as np
import pytest

import torchless
import torchless.dcp
from torchless.core.errors import UsageError

from .test_remote import _cli


@pytest.fixture
def state():
    rng = np.random.default_rng(0)
    return {"w": rng.standard_normal((64, 32)).astype(np.float32), "b": np.arange(32, dtype=np.float32)}


def test_memory_url_with_worker_processes_is_refused(memfs, state, tmp_path, capsys):
    _fs, base = memfs
    src = f"memory://{base}/m.pt"
    torchless.save(state, src)
    local = tmp_path / "m.pt"
    torchless.save(state, str(local))
    cases = [
        ["reshard", src, f"memory://{base}/dcp", "--ranks", "2", "--executor", "local:2"],  # both in memory
        ["reshard", str(local), f"memory://{base}/dcp", "--ranks", "2", "--executor", "local:2"],  # to memory
        ["reshard", src, str(tmp_path / "dcp"), "--ranks", "2", "--executor", "local:2"],  # from memory
        ["reshard", src, str(tmp_path / "dcp"), "--ranks", "2", "--executor", "dask://127.0.0.1:9"],  # not dialled
        ["convert", src, f"memory://{base}/o.safetensors", "--max-shard-size", "4KB", "--executor", "local:2"],
    ]
    for argv in cases:
        code, _out, err = _cli(capsys, *argv)
        assert code == 2, (argv, err)
        assert "memory:// is per-process and cannot be shared with worker processes" in err, err
        assert err.count("\n") == 1 and "Traceback" not in err and "FileNotFoundError" not in err, err
    assert not (tmp_path / "dcp").exists()
    with pytest.raises(UsageError, match="per-process"):
        torchless.dcp.reshard(src, f"memory://{base}/dcp", 2, executor="local:3")
    # the tasks in this process: the same job works, bit-exact
    code, _out, err = _cli(capsys, "reshard", src, f"memory://{base}/dcp", "--ranks", "2", "--executor", "local:1")
    assert code == 0, err
    got = torchless.load(f"memory://{base}/dcp")
    assert sorted(got) == sorted(state)
    for k, v in state.items():
        assert np.array_equal(got[k].numpy(), v), k
