"""Range tasks on a Dask cluster: a ``distributed.LocalCluster`` of 2 worker processes
reshards torch-written DCP checkpoints bit-exact against the local executor (torch loads
the result), survives a worker killed mid-run, and keeps each worker's memory within
``max_task_bytes`` plus a fixed overhead."""

from __future__ import annotations

import os
import warnings

import pytest

import torchless
import torchless.dcp as tdcp
from torchless.jobs.hooks import KILL_ENV, current_rss

torch = pytest.importorskip("torch", reason="torch is the oracle of these tests")
distributed = pytest.importorskip("distributed", reason="the dask extra (dask[distributed]) is not installed")
dcp = pytest.importorskip("torch.distributed.checkpoint", reason="torch without distributed checkpoint")

MiB = 1 << 20


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """2 worker processes, 1 thread each; the kill-once marker already exists (no kill)
    until a test removes it."""
    marker = tmp_path_factory.mktemp("dask") / "killed-once"
    marker.write_bytes(b"")
    old = os.environ.get(KILL_ENV)
    os.environ[KILL_ENV] = str(marker)  # inherited by the worker processes
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            lc = distributed.LocalCluster(n_workers=2, processes=True, threads_per_worker=1, dashboard_address=None)
            client = distributed.Client(lc)
    finally:
        if old is None:
            os.environ.pop(KILL_ENV, None)
        else:
            os.environ[KILL_ENV] = old
    yield client, marker
    client.close()
    lc.close()


def _files(d: str) -> dict[str, bytes]:
    return {n: open(os.path.join(d, n), "rb").read() for n in sorted(os.listdir(d)) if n != ".metadata"}


def _torch_load(ref: dict, path: str) -> dict:
    def blank(v):
        if isinstance(v, torch.Tensor):
            return torch.empty_like(v)
        if isinstance(v, dict):
            return {k: blank(x) for k, x in v.items()}
        if isinstance(v, list):
            return [blank(x) for x in v]
        return v

    out = blank(ref)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(out, storage_reader=dcp.FileSystemReader(path), no_dist=True)
    return out


def _same(a, b, path=""):
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape, path
        assert a.contiguous().view(-1).view(torch.uint8).equal(b.contiguous().view(-1).view(torch.uint8)), path
    elif isinstance(a, dict):
        assert set(a) == set(b), path
        for k in a:
            _same(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _same(x, y, f"{path}[{i}]")
    else:
        assert a == b, path


def test_peak_rss_per_worker_is_bounded(cluster, tmp_path):
    """A 96 MiB tensor resharded into 2 rank files of 48 MiB in 4 MiB tasks: the resident
    size each task sees (sampled while a piece is in memory) stays within a few task sizes
    of the worker's idle size; without ``max_task_bytes`` a task holds a 48 MiB block."""
    client, _ = cluster
    big = torch.arange(4096 * 6144, dtype=torch.int32).reshape(4096, 6144)  # 96 MiB
    torch.save({"big": big, "small": torch.ones(3)}, tmp_path / "big.pt")
    tdcp.reshard(tmp_path / "big.pt", tmp_path / "r1", 1)
    client.run(lambda: __import__("torchless.jobs.tasks"))  # imports count as fixed overhead
    idle = min(client.run(current_rss).values())
    bounded = tdcp.reshard(tmp_path / "r1", tmp_path / "r2", 2, executor=client, max_task_bytes=4 * MiB)
    assert bounded["tasks"] > 24  # 96 MiB in 4 MiB tasks, plus the seals
    assert 0 < bounded["peak_rss"] - idle < 3 * 4 * MiB + 16 * MiB, (idle >> 20, bounded["peak_rss"] >> 20)
    whole = tdcp.reshard(tmp_path / "r1", tmp_path / "w2", 2, executor=client)  # the oracle that the measure measures
    assert whole["peak_rss"] - idle > 40 * MiB
    got = tdcp.load(tmp_path / "r2", materialize=True)
    assert got["big"].tobytes() == big.numpy().tobytes()
    assert _files(str(tmp_path / "r2")) == _files(str(tmp_path / "w2"))


@pytest.mark.parametrize(("world", "ranks"), [(4, 3), (1, 8)])
def test_dask_reshard_matches_local_and_loads_in_torch(cluster, saved4, tmp_path, world, ranks):
    client, _ = cluster
    ckpt, ref = saved4
    src = ckpt
    if world == 1:  # a one-rank DCP checkpoint written by torch itself
        src = str(tmp_path / "one")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dcp.save(torch.load(ref, weights_only=False), storage_writer=dcp.FileSystemWriter(src), no_dist=True)
    plan = "model.cube=dim:2,optim.*=col,row"
    tdcp.reshard(src, tmp_path / "local", ranks, plan=plan)
    for mtb in (None, MiB):
        dst = tmp_path / f"dask{mtb}"
        res = tdcp.reshard(src, dst, ranks, plan=plan, executor=client, max_task_bytes=mtb)
        assert res["executor"].startswith("dask")
        assert _files(str(dst)) == _files(str(tmp_path / "local"))
        full = torch.load(ref, weights_only=False)
        _same(full, _torch_load(full, str(dst)))


def test_killed_worker_still_completes(cluster, saved4, tmp_path):
    """The first task kills its worker process (SIGKILL); Dask runs it again on a live
    worker and the output is the local executor's, byte for byte."""
    client, marker = cluster
    ckpt, ref = saved4
    tdcp.reshard(ckpt, tmp_path / "local", 3)
    marker.unlink()
    res = tdcp.reshard(ckpt, tmp_path / "dask", 3, executor=client, max_task_bytes=MiB)
    assert marker.exists()  # a task did kill its worker
    assert _files(str(tmp_path / "dask")) == _files(str(tmp_path / "local"))
    full = torch.load(ref, weights_only=False)
    _same(full, _torch_load(full, str(tmp_path / "dask")))
    assert res["tasks"] >= 3


def test_dask_consolidate_to_shards_matches_local(cluster, saved4, tmp_path):
    client, _ = cluster
    ckpt, _ref = saved4
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    r1 = torchless.convert(ckpt, a / "m.safetensors", max_shard_size="1KB")
    r2 = torchless.convert(ckpt, b / "m.safetensors", max_shard_size="1KB", executor=client, max_task_bytes=MiB)
    assert len(r1["files"]) == len(r2["files"]) > 2
    assert _files(str(a)) == _files(str(b))


def test_dask_reshard_on_s3(cluster, saved4, s3_env, tmp_path):
    """Workers read the source from the S3 server and upload their parts; the result is
    the local executor's (storage options travel with the tasks)."""
    client, _ = cluster
    ckpt, _ref = saved4
    base, opts, fetch = s3_env
    tdcp.reshard(ckpt, tmp_path / "local", 3)
    tdcp.reshard(ckpt, f"{base}/src", 4, storage_options=opts)
    from torchless.io.remote import STATS

    STATS.reset()
    res = tdcp.reshard(f"{base}/src", f"{base}/r3", 3, executor=client, max_task_bytes=MiB, storage_options=opts)
    assert res["tasks"] >= 3
    want = _files(str(tmp_path / "local"))
    for n, data in want.items():
        assert fetch(f"r3/{n}") == data, n
    # the workers' traffic is reported to this process (--stats): every payload byte was uploaded by them
    assert STATS.bytes_uploaded >= sum(len(d) for d in want.values()) and STATS.bytes_fetched > 0
    keys = fetch(None)
    assert ".metadata" in [k.rsplit("/", 1)[-1] for k in keys if k.startswith("r3/")]
    assert not [k for k in keys if ".torchless-staging" in k]


@pytest.fixture
def s3_env(request):
    """A bucket on a moto S3 server on 127.0.0.1; ``(s3://bucket, storage
    options, fetch(key) -> bytes | list of keys)``."""
    pytest.importorskip("s3fs", reason="s3fs is not installed")
    boto3 = pytest.importorskip("boto3", reason="moto[server] is not installed")
    import uuid

    server_mod = pytest.importorskip("moto.server", reason="moto[server] is not installed")
    import socket

    with socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        port = sk.getsockname()[1]
    srv = server_mod.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    srv.start()
    request.addfinalizer(srv.stop)
    endpoint = f"http://127.0.0.1:{port}"
    creds = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing", "region_name": "us-east-1"}
    bucket = "tl-" + uuid.uuid4().hex[:12]
    c = boto3.client("s3", endpoint_url=endpoint, **creds)
    c.create_bucket(Bucket=bucket)
    opts = {"endpoint_url": endpoint, "key": "testing", "secret": "testing", "client_kwargs": {"region_name": "us-east-1"}}

    def fetch(key):
        if key is None:
            return sorted(o["Key"] for o in c.list_objects_v2(Bucket=bucket).get("Contents", []))
        return c.get_object(Bucket=bucket, Key=key)["Body"].read()

    return f"s3://{bucket}", opts, fetch
