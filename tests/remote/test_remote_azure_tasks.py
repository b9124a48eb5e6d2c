"""Range-task outputs (reshard with ``--executor`` / ``--max-task-bytes`` / ``--resume`` /
``--cleanup``) at ``az://`` against Azurite, and at ``memory://``.

Oracles: the local reshard's bytes, torch (it loads the result as the saved state), the
Azure SDK's blob client (what the service holds) and Azurite's access log (which
requests the service served, and to whom: a part read by the service itself for Put
Block From URL carries the SAS it was given, a read by torchless does not).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid

import pytest
from tl_testutil import assert_same_state, torch_dcp_load

import torchless
import torchless.dcp
from torchless.io.cloud import azure

from . import test_remote_azure as _azure
from .test_remote import _cli

torch = pytest.importorskip("torch", reason="torch is the oracle of these tests")
adlfs = pytest.importorskip("adlfs", reason="adlfs (the remote extra's Azure filesystem) is not installed")
dcp = pytest.importorskip("torch.distributed.checkpoint", reason="torch without distributed checkpoint")

#: the Azurite fixtures of test_remote_azure.py: the server (one per module) and a fresh container
azurite = _azure.azurite
az = _azure.az

SRC = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "src"))
STAGING = ".torchless-staging-"


def _state() -> dict:
    g = torch.Generator().manual_seed(5)
    return {
        "w": torch.randn(1024, 1024, generator=g),  # 4 MiB: rows split over 1 MiB tasks
        "e": torch.randn(700, 512, generator=g).to(torch.bfloat16),
        "i": torch.arange(5000, dtype=torch.int64),
        "step": 11,
    }


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    """A 4-rank DCP (resharded by torchless from a torch-saved state) and its local
    reshard to 3 ranks (the oracle)."""
    d = tmp_path_factory.mktemp("tasks")
    sd = _state()
    torch.save(sd, d / "src.pt")
    torchless.dcp.reshard(d / "src.pt", d / "r4", 4)
    torchless.dcp.reshard(d / "r4", d / "want3", 3)
    return sd, d


def _upload_dir(az, local, prefix: str) -> None:
    for n in sorted(os.listdir(local)):
        az.put(f"{prefix}/{n}", (local / n).read_bytes())


def _payload(d) -> dict[str, bytes]:
    return {n: (d / n).read_bytes() for n in sorted(os.listdir(d)) if n != ".metadata"}


def _check_output(az, ckpt, prefix: str, tmp_path) -> None:
    """``prefix`` holds the local reshard's files exactly (no staging left), and torch
    loads them as the saved state."""
    sd, d = ckpt
    want = d / "want3"
    assert az.keys(prefix) == sorted(os.listdir(want))
    down = tmp_path / ("down-" + uuid.uuid4().hex[:6])
    down.mkdir()
    for n in os.listdir(want):
        (down / n).write_bytes(az.get(f"{prefix}/{n}"))
    for n, data in _payload(want).items():
        assert (down / n).read_bytes() == data, n
    assert_same_state(torch_dcp_load(sd, str(down)), sd)


def _part_reads(reqs, signed: bool) -> list[tuple[str, int]]:
    """GETs of part blobs: ``(path, bytes)``; ``signed``: those carrying a SAS (the service
    reading a part for Put Block From URL), else those without (a client's reads)."""
    return [
        (p.partition("?")[0], n)
        for m, p, st, n in reqs
        if m == "GET" and "/parts/" in p and st in (200, 206) and ("sig=" in p) == signed
    ]


# -- az:// -------------------------------------------------------------------------------------
def _needs_put_block_from_url(az) -> None:
    """Skip unless this Azurite serves Put Block From URL (3.37.0 and later; older ones
    answer 501, and joins there upload the blocks, as the other tests exercise)."""
    import datetime

    from azure.core.exceptions import HttpResponseError
    from azure.storage.blob import BlobSasPermissions, generate_blob_sas

    from . import azurite as azurite_mod

    az.put("probe/src", b"x" * 10)
    sas = generate_blob_sas(
        azurite_mod.ACCOUNT,
        az.name,
        "probe/src",
        account_key=azurite_mod.KEY,
        permission=BlobSasPermissions(read=True),
        expiry=datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(hours=1),
    )
    try:
        az.client.get_blob_client("probe/dst").stage_block_from_url(
            "AAAA", az.client.get_blob_client("probe/src").url + "?" + sas
        )
    except HttpResponseError as e:
        if e.status_code == 501:
            pytest.skip("this Azurite has no Put Block From URL (3.37.0 has it: bash scripts/setup.sh test installs it)")
        raise
    finally:
        az.client.delete_blob("probe/src")


def test_reshard_az_with_range_tasks_joins_server_side(az, ckpt, tmp_path, capsys):
    """4 ranks -> 3 ranks az:// -> az:// on two worker processes with 1 MiB tasks: the
    local reshard's bytes, loaded by torch; each rank file's parts were joined by the
    service (Put Block From URL: it read every part byte itself, with a SAS) and no part
    byte was read by torchless."""
    _needs_put_block_from_url(az)
    sd, d = ckpt
    _upload_dir(az, d / "r4", "r4")
    mark = az.srv.mark()
    code, out, err = _cli(
        capsys, "reshard", f"{az.url}/r4", f"{az.url}/r3", "--ranks", "3", "--executor", "local:2", "--max-task-bytes", "1MiB"
    )
    assert code == 0, err
    _check_output(az, ckpt, "r3", tmp_path)
    reqs = az.srv.requests()[mark:]
    parts = {p for m, p, st, _n in reqs if m == "PUT" and "/parts/" in p and "comp=" not in p}
    by_service = _part_reads(reqs, signed=True)
    assert len(parts) > 3 * 3  # several parts per rank file
    assert {p.partition("?")[0] for p in parts} == {p for p, _n in by_service}
    assert sum(n for _p, n in by_service) == sum(os.path.getsize(d / "want3" / n) for n in _payload(d / "want3"))
    assert _part_reads(reqs, signed=False) == []  # torchless read no part back
    commits = [p for m, p, st, _n in reqs if m == "PUT" and "comp=blocklist" in p]
    assert len(commits) == 3 and all("/files/" in p for p in commits)  # one block list per rank file


def test_consolidate_az_to_sharded_safetensors_joins_server_side(az, ckpt, tmp_path, capsys):
    """A 4-rank DCP at az:// consolidated to sharded safetensors at az:// in 1 MiB tasks on
    two workers: the local convert's shards and index exactly, each shard joined by the
    service (no part byte read by torchless), nothing staged left."""
    _needs_put_block_from_url(az)
    sd, d = ckpt
    _upload_dir(az, d / "r4", "r4")
    ref = tmp_path / "ref"
    ref.mkdir()
    code, out, err = _cli(capsys, "convert", str(d / "r4"), str(ref / "m.safetensors"), "--max-shard-size", "2MB")
    assert code == 0, err
    want = sorted(os.listdir(ref))
    assert len(want) > 2  # shards and their index
    mark = az.srv.mark()
    argv = ["convert", f"{az.url}/r4", f"{az.url}/sh/m.safetensors", "--max-shard-size", "2MB"]
    code, out, err = _cli(capsys, *argv, "--executor", "local:2", "--max-task-bytes", "1MiB")
    assert code == 0, err
    assert az.keys("sh") == want
    for n in want:
        assert az.get(f"sh/{n}") == (ref / n).read_bytes(), n
    reqs = az.srv.requests()[mark:]
    assert _part_reads(reqs, signed=True) and _part_reads(reqs, signed=False) == []


def test_join_without_source_authorization_uploads_the_blocks(az, ckpt, tmp_path, capsys, monkeypatch):
    """Where the service cannot be given a readable URL of the parts (a token credential),
    the join uploads the blocks itself: the same files, every part byte read back once."""
    sd, d = ckpt
    _upload_dir(az, d / "r4", "r4")
    monkeypatch.setattr(azure, "source_auth", lambda fs: None)
    mark = az.srv.mark()
    code, out, err = _cli(capsys, "reshard", f"{az.url}/r4", f"{az.url}/r3", "--ranks", "3", "--max-task-bytes", "1MiB")
    assert code == 0, err
    _check_output(az, ckpt, "r3", tmp_path)
    reqs = az.srv.requests()[mark:]
    assert _part_reads(reqs, signed=True) == []
    joined = [r for r in _part_reads(reqs, signed=False)]
    multi = [n for n in _payload(d / "want3")]
    assert sum(n for _p, n in joined) == sum(os.path.getsize(d / "want3" / n) for n in multi)


def _run(*argv: str, pre: str = "") -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))
    code = f"import sys\n{pre}\nfrom torchless.cli.main import main\nsys.exit(main(sys.argv[1:]))"
    return subprocess.Popen(
        [sys.executable, "-c", code, *argv],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its worker processes are killed with it (its process group)
    )


#: the coordinator pauses after recording its first finished part, so the test can kill it then
_PAUSE = """
import time
from torchless.jobs import staging as ranged
_real = ranged.RemoteStaging.record_part
def _record(self, r):
    _real(self, r)
    time.sleep(120)
ranged.RemoteStaging.record_part = _record
"""


def _kill_after_first_part(az, proc: subprocess.Popen, prefix: str) -> list[str]:
    """Wait until ``proc`` recorded a finished part under ``prefix``'s staging, then kill it
    and its workers (SIGKILL); the staging blobs it left."""
    deadline = time.monotonic() + 120
    while not [k for k in az.keys(prefix) if k.startswith(STAGING) and "/done/" in k]:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(60)
    return az.keys(prefix)


def test_killed_reshard_resumes_with_the_finished_parts(az, ckpt, tmp_path):
    """Killed (with its workers) once a first part is recorded as finished: no .metadata
    and no rank file at the destination; --resume finishes it bit-exact, uploading none of
    the recorded parts again."""
    sd, d = ckpt
    _upload_dir(az, d / "r4", "r4")
    argv = ["reshard", f"{az.url}/r4", f"{az.url}/r3", "--ranks", "3", "--executor", "local:2"]
    argv += ["--max-task-bytes", "1MiB", "--resume"]
    left = _kill_after_first_part(az, _run(*argv, pre=_PAUSE), "r3")
    assert left and all(k.startswith(STAGING) for k in left), left  # nothing a reader takes for a checkpoint
    with pytest.raises(torchless.core.errors.TorchlessError):
        torchless.open(f"{az.url}/r3")
    recorded = {k.rsplit("/", 1)[1] for k in left if "/done/" in k}
    assert recorded
    mark = az.srv.mark()
    proc = _run(*argv, "--json")
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert json.loads(out)["resumed_parts"] == len(recorded)
    again = {p.partition("?")[0].rsplit("/", 1)[1] for m, p, st, _n in az.srv.requests()[mark:] if m == "PUT" and "/parts/" in p}
    assert again and not (again & recorded)
    adlfs.AzureBlobFileSystem.clear_instance_cache()
    _check_output(az, ckpt, "r3", tmp_path)


def test_cleanup_removes_every_staging_blob(az, ckpt, tmp_path):
    """A killed reshard leaves staging blobs only; --cleanup removes every one of them and
    lists them; the next run writes the output from scratch."""
    sd, d = ckpt
    _upload_dir(az, d / "r4", "r4")
    argv = ["reshard", f"{az.url}/r4", f"{az.url}/r3", "--ranks", "3", "--executor", "local:2", "--max-task-bytes", "1MiB"]
    left = _kill_after_first_part(az, _run(*argv, pre=_PAUSE), "r3")
    assert left and all(k.startswith(STAGING) for k in left), left
    proc = _run(*argv, "--cleanup")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    lines = out.splitlines()
    assert lines[0].startswith(f"removed {len(left)} staging leftover(s)"), out
    assert sorted(line.strip() for line in lines[1:]) == sorted(f"{az.url}/r3/{k}" for k in left)
    assert az.keys("r3") == [] and az.keys("r4") == sorted(os.listdir(d / "r4"))
    proc = _run(*argv)
    assert proc.wait(300) == 0, proc.communicate()
    adlfs.AzureBlobFileSystem.clear_instance_cache()
    _check_output(az, ckpt, "r3", tmp_path)


#: the block list of a joined rank file is never committed: the join hangs once its blocks are staged
_HANG_JOIN = """
import time
from azure.storage.blob.aio import BlobClient
_real = BlobClient.commit_block_list
async def _commit(self, *a, **kw):
    if "/files/" in self.blob_name:
        time.sleep(120)
    return await _real(self, *a, **kw)
BlobClient.commit_block_list = _commit
"""


def _uncommitted(az, prefix: str) -> list[str]:
    committed = set(az.keys(prefix))
    p = prefix.rstrip("/") + "/"
    return sorted(
        b.name[len(p) :]
        for b in az.client.list_blobs(name_starts_with=p, include=["uncommittedblobs"])
        if b.name[len(p) :] not in committed
    )


def test_cleanup_after_a_kill_mid_join_discards_its_blocks(az, ckpt, tmp_path):
    """Killed while a rank file's blocks are staged and its block list not committed: the
    staged file is no blob (its blocks are uncommitted, invisible to a listing) and no
    .metadata is there; --cleanup removes the staging blobs and that blob's uncommitted
    blocks, and says so."""
    _needs_put_block_from_url(az)
    sd, d = ckpt
    _upload_dir(az, d / "r4", "r4")
    argv = ["reshard", f"{az.url}/r4", f"{az.url}/r3", "--ranks", "3", "--max-task-bytes", "1MiB"]
    proc = _run(*argv, pre=_HANG_JOIN)
    deadline = time.monotonic() + 120
    while not [k for k in _uncommitted(az, "r3") if "/files/" in k]:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.05)
    time.sleep(0.3)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(60)
    left = az.keys("r3")
    hanging = _uncommitted(az, "r3")
    assert left and all(k.startswith(STAGING) for k in left + hanging), (left, hanging)
    assert len(hanging) == 1 and "/files/" in hanging[0]
    proc = _run(*argv, "--cleanup")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    lines = sorted(line.strip() for line in out.splitlines()[1:])
    assert out.startswith(f"removed {len(left) + 1} staging leftover(s)"), out
    assert lines == sorted([f"{az.url}/r3/{k}" for k in left] + [f"{az.url}/r3/{hanging[0]} (uncommitted blocks)"])
    assert az.keys("r3") == [] and _uncommitted(az, "r3") == []


def test_metadata_appears_only_after_every_rank_file_is_whole(az, ckpt, tmp_path, capsys, monkeypatch):
    """The service may complete a copy after answering it (a pending copy): publication
    waits for each copy's end, so the source is never deleted under a running copy and,
    whenever .metadata exists, every rank file is there whole. Here every copy is made
    pending and completes 0.3 s later, in the background."""
    from azure.storage.blob.aio import BlobClient

    sd, d = ckpt
    _upload_dir(az, d / "r4", "r4")
    real_copy, real_props = BlobClient.start_copy_from_url, BlobClient.get_blob_properties
    pending: dict[str, asyncio.Task] = {}
    seen: list[tuple[str, list[str]]] = []  # (blob copied, rank files whole at that moment)

    def whole_now() -> list[str]:
        out = []
        for n in _payload(d / "want3"):
            try:
                size = az.client.get_blob_client(f"r3/{n}").get_blob_properties().size
            except Exception:  # noqa: BLE001 - not there (yet)
                continue
            if size == os.path.getsize(d / "want3" / n):
                out.append(n)
        return out

    async def late_copy(self, source_url, *a, **kw):
        async def later():
            await asyncio.sleep(0.3)
            await real_copy(self, source_url, *a, **kw)

        seen.append((self.blob_name, whole_now()))
        pending[self.blob_name] = asyncio.ensure_future(later())
        return {"copy_status": "pending", "copy_id": "injected"}

    class Pending:
        class copy:  # noqa: N801 - the shape of BlobProperties.copy
            status = "pending"

    async def props(self, *a, **kw):
        task = pending.get(self.blob_name)
        if task is not None and not task.done():
            return Pending()
        return await real_props(self, *a, **kw)

    monkeypatch.setattr(BlobClient, "start_copy_from_url", late_copy)
    monkeypatch.setattr(BlobClient, "get_blob_properties", props)
    code, out, err = _cli(capsys, "reshard", f"{az.url}/r4", f"{az.url}/r3", "--ranks", "3", "--max-task-bytes", "1MiB")
    assert code == 0, err
    monkeypatch.undo()
    meta = [w for b, w in seen if b == "r3/.metadata"]
    assert meta == [sorted(_payload(d / "want3"))], seen  # when .metadata was copied, every rank file was whole
    _check_output(az, ckpt, "r3", tmp_path)


# -- memory:// ---------------------------------------------------------------------------------
@pytest.fixture
def mem(memfs):
    fs, base = memfs
    return fs, f"memory://{base}"


def _mem_files(fs, url: str) -> dict[str, bytes]:
    inner = url[len("memory://") :]
    return {p.rsplit("/", 1)[1]: fs.cat_file(p) for p in fs.find(inner)} if fs.exists(inner) else {}


def test_memory_reshard_with_range_tasks_resume_and_cleanup(mem, ckpt, capsys, monkeypatch):
    """memory:// (no server-side join: parts are read back and uploaded): the local
    reshard's bytes; a run interrupted after its first part leaves staging only, and
    --resume finishes it bit-exact keeping that part; a second interrupted run's staging
    is removed by --cleanup."""
    from torchless.jobs import staging as ranged

    fs, base = mem
    sd, d = ckpt
    for n in os.listdir(d / "r4"):
        fs.pipe_file(f"{base[len('memory://') :]}/r4/{n}", (d / "r4" / n).read_bytes())
    want = {n: (d / "want3" / n).read_bytes() for n in os.listdir(d / "want3")}
    argv = ["reshard", f"{base}/r4", f"{base}/r3", "--ranks", "3", "--max-task-bytes", "1MiB"]
    code, out, err = _cli(capsys, *argv)
    assert code == 0, err
    got = _mem_files(fs, f"{base}/r3")
    assert sorted(got) == sorted(want)
    assert all(got[n] == want[n] for n in want if n != ".metadata")

    real = ranged.RemoteStaging.record_part

    def interrupt(self, r):
        real(self, r)
        raise KeyboardInterrupt

    for n in list(got):
        fs.rm_file(f"{base[len('memory://') :]}/r3/{n}")
    monkeypatch.setattr(ranged.RemoteStaging, "record_part", interrupt)
    code, out, err = _cli(capsys, *argv, "--resume")
    assert code == 130, err
    left = _mem_files(fs, f"{base}/r3")
    assert left and ".metadata" not in left and not (set(left) & set(want)), sorted(left)
    monkeypatch.setattr(ranged.RemoteStaging, "record_part", real)
    code, out, err = _cli(capsys, *argv, "--resume", "--json")
    assert code == 0, err
    assert json.loads(out)["resumed_parts"] == 1
    got = _mem_files(fs, f"{base}/r3")
    assert sorted(got) == sorted(want) and all(got[n] == want[n] for n in want if n != ".metadata")

    monkeypatch.setattr(ranged.RemoteStaging, "record_part", interrupt)
    code, out, err = _cli(
        capsys, "reshard", f"{base}/r4", f"{base}/again", "--ranks", "3", "--max-task-bytes", "1MiB", "--resume"
    )
    assert code == 130, err
    left = _mem_files(fs, f"{base}/again")
    assert left
    code, out, err = _cli(capsys, *argv[:2], f"{base}/again", *argv[3:], "--cleanup")
    assert code == 0, err
    assert out.startswith("removed "), out
    assert _mem_files(fs, f"{base}/again") == {}
