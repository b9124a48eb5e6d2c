"""Jobs whose tasks run in forked worker processes (``--executor local:2``, ``--jobs 2``,
``executor="local:2"``) from and to S3 (moto's server on 127.0.0.1).

The coordinator here has written records of 1 MiB and more itself first, as a Python
program or an earlier test in the same process does: its CRC thread pool was then copied
into every forked worker without its thread, and each worker writing such a record
waited for it forever (the job hung). Each test has a timeout, so a regression fails
instead of hanging; the output is compared byte for byte with the same job run locally
in this process, and torch's own fsspec reader loads it. ``--stats`` counts what the
workers fetched and uploaded: the bytes fetched cover every tensor byte the workers had
to read, the bytes uploaded every byte of the objects the server holds afterwards.
"""

from __future__ import annotations

import os
import re

import pytest
from tl_testutil import assert_same_state, small_dcp_state, torch_dcp_load

import torchless
import torchless.dcp
from torchless.io import remote

from .test_remote import _cli, _get_s3, _keys
from .test_remote_dcp import FsspecReader, _upload_dir, torch

STATS = re.compile(r"stats: (\d+) requests, (\d+) bytes fetched, (\d+) uploads, (\d+) bytes uploaded")


@pytest.fixture
def ranks4(tmp_path):
    """A 4-rank DCP checkpoint written by torchless in this process, whose chunks of
    ``big`` (2.4 MB each) go through the CRC thread; the state torch saved."""
    sd = small_dcp_state()
    sd["big"] = torch.randn(4096, 600, generator=torch.Generator().manual_seed(3))
    torch.save(sd, tmp_path / "src.pt")
    torchless.dcp.reshard(tmp_path / "src.pt", tmp_path / "r4", 4)
    return sd, str(tmp_path / "r4")


def _payload(sd: dict) -> int:
    return sum(v.numel() * v.element_size() for v in sd.values() if isinstance(v, torch.Tensor))


def _stored(client, url: str) -> int:
    bucket, _, prefix = url[5:].partition("/")
    return sum(o["Size"] for o in client.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", []))


@pytest.mark.timeout(240)
@pytest.mark.parametrize("how", ["--executor", "--jobs", "executor="])
def test_s3_reshard_in_worker_processes_matches_local(s3, ranks4, tmp_path, capsys, monkeypatch, how):
    base, client = s3
    sd, local = ranks4
    monkeypatch.setenv("TORCHLESS_STALL_TIMEOUT", "60")  # a stuck pool fails within the test's timeout
    _upload_dir(client, local, f"{base}/r4")
    assert _cli(capsys, "reshard", local, str(tmp_path / "r3"), "--ranks", "3")[0] == 0
    if how == "executor=":
        remote.SHARED_BLOCKS.clear()
        remote.STATS.reset()
        res = torchless.dcp.reshard(f"{base}/r4", f"{base}/r3", 3, executor="local:2")
        assert res["executor"] == "local:2"
        fetched, uploaded = remote.STATS.bytes_fetched, remote.STATS.bytes_uploaded
    else:
        extra = ["--executor", "local:2"] if how == "--executor" else ["--jobs", "2"]
        code, _out, err = _cli(capsys, "reshard", f"{base}/r4", f"{base}/r3", "--ranks", "3", "--stats", *extra)
        assert code == 0, err
        m = STATS.search(err)
        assert m, err
        _req, fetched, _up, uploaded = map(int, m.groups())
    assert fetched >= _payload(sd)  # the workers read every tensor from S3
    assert uploaded >= _stored(client, f"{base}/r3")
    assert _keys(client, f"{base}/r3") == sorted(os.listdir(tmp_path / "r3"))
    for n in os.listdir(tmp_path / "r3"):
        if n.endswith(".distcp"):
            assert _get_s3(client, f"{base}/r3/{n}") == (tmp_path / "r3" / n).read_bytes(), n
    assert_same_state(torch_dcp_load(sd, FsspecReader(f"{base}/r3")), sd)


@pytest.mark.timeout(240)
def test_s3_consolidate_in_worker_processes_matches_local(s3, ranks4, tmp_path, capsys, monkeypatch):
    """Consolidation to sharded safetensors (no ``torch.save`` record is written: it did
    not hang before) from and to S3 in worker processes."""
    base, client = s3
    sd, local = ranks4
    monkeypatch.setenv("TORCHLESS_STALL_TIMEOUT", "60")
    _upload_dir(client, local, f"{base}/r4")
    args = ["--max-shard-size", "4MB"]
    (tmp_path / "c").mkdir()
    assert _cli(capsys, "convert", local, str(tmp_path / "c" / "m.safetensors"), *args)[0] == 0
    code, _out, err = _cli(capsys, "convert", f"{base}/r4", f"{base}/c/m.safetensors", *args, "--executor", "local:2", "--stats")
    assert code == 0, err
    m = STATS.search(err)
    assert m, err
    assert int(m.group(2)) >= _payload(sd), err
    assert int(m.group(4)) >= _stored(client, f"{base}/c"), err
    names = sorted(os.listdir(tmp_path / "c"))
    assert len(names) > 2 and _keys(client, f"{base}/c") == names
    for n in names:
        assert _get_s3(client, f"{base}/c/{n}") == (tmp_path / "c" / n).read_bytes(), n
    got = torchless.load(f"{base}/c/m.safetensors.index.json")
    for k in ("w", "big"):
        assert got[k].numpy().tobytes() == sd[k].numpy().tobytes(), k
