"""az:// and abfs:// against Azurite (Microsoft's Azure Storage emulator) on 127.0.0.1,
through adlfs, as the S3 tests run against moto's server.

Oracles: the local copy's output, torch (what it saved, what it loads), the Azure SDK's
own blob client (what the service holds) and Azurite's access log (the bytes it served).
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import uuid
import warnings

import pytest
from tl_testutil import assert_same_state, small_dcp_state, torch_dcp_load

import torchless
import torchless.dcp
from torchless.core.errors import TorchlessError
from torchless.io import remote

from . import azurite as azurite_mod
from .test_remote import _cli, _fail_upload, _saved, _sd

torch = pytest.importorskip("torch", reason="torch is the oracle of these tests")
adlfs = pytest.importorskip("adlfs", reason="adlfs (the remote extra's Azure filesystem) is not installed")
blob_sdk = pytest.importorskip("azure.storage.blob", reason="azure-storage-blob (adlfs's dependency) is not installed")
dcp = pytest.importorskip("torch.distributed.checkpoint", reason="torch without distributed checkpoint")

_ENV = (
    "AZURE_STORAGE_CONNECTION_STRING",
    "AZURE_STORAGE_ACCOUNT_NAME",
    "AZURE_STORAGE_ACCOUNT_KEY",
    "AZURE_STORAGE_SAS_TOKEN",
    "AZURE_STORAGE_CLIENT_ID",
    "AZURE_STORAGE_CLIENT_SECRET",
    "AZURE_STORAGE_TENANT_ID",
    "AZURE_STORAGE_ANON",
)


@pytest.fixture(scope="module")
def azurite(tmp_path_factory):
    exe = azurite_mod.find()
    if exe is None:
        pytest.skip(azurite_mod.setup_hint())
    srv = azurite_mod.Azurite(exe, tmp_path_factory.mktemp("azurite"))
    try:
        yield srv
    finally:
        srv.stop()


class Container:
    """A fresh container: its ``az://`` URL and the Azure SDK's client for it (the oracle)."""

    def __init__(self, srv: azurite_mod.Azurite) -> None:
        self.srv = srv
        self.name = "tl-" + uuid.uuid4().hex[:12]
        self.url = f"az://{self.name}"
        service = blob_sdk.BlobServiceClient.from_connection_string(srv.connection_string)
        self.client = service.create_container(self.name)

    def put(self, key: str, data: bytes) -> None:
        self.client.upload_blob(key, data, overwrite=True)

    def get(self, key: str) -> bytes:
        return self.client.download_blob(key).readall()

    def keys(self, prefix: str = "") -> list[str]:
        p = prefix.rstrip("/") + "/" if prefix else ""
        return sorted(b.name[len(p) :] for b in self.client.list_blobs(name_starts_with=p))


@pytest.fixture
def az(azurite, monkeypatch):
    """A fresh container; credentials and endpoint from ``AZURE_STORAGE_CONNECTION_STRING``."""
    for k in _ENV:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", azurite.connection_string)
    adlfs.AzureBlobFileSystem.clear_instance_cache()
    remote._BY_LOCATION.clear()
    yield Container(azurite)
    adlfs.AzureBlobFileSystem.clear_instance_cache()


def _same_output(capsys, cmd: list[str], local: str, url: str) -> str:
    c1, o1, e1 = _cli(capsys, *cmd, local)
    c2, o2, e2 = _cli(capsys, *cmd, url)
    assert c1 == 0, e1
    assert (c1, o1.replace(local, "<p>")) == (c2, o2.replace(url, "<p>")), (cmd, e2)
    return o2


def _files(tmp_path) -> dict[str, bytes]:
    """A torch-written .pt and a safetensors file written by the safetensors package."""
    from safetensors.torch import save as st_save

    sd = _sd(3000)
    return {"m.pt": _saved(sd), "m.safetensors": st_save({k: v.contiguous() for k, v in sd.items()})}


# -- reading ---------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["m.pt", "m.safetensors"])
def test_cli_matches_local(az, tmp_path, capsys, name):
    """info / ls / scan / verify of a blob print what they print for the local file, at
    az:// and abfs:// alike; diff finds nothing changed."""
    data = _files(tmp_path)[name]
    local = tmp_path / name
    local.write_bytes(data)
    az.put(name, data)
    for scheme in ("az", "abfs"):
        url = f"{scheme}://{az.name}/{name}"
        for cmd in (["info"], ["ls"], ["scan"], ["verify"], ["info", "--json"], ["ls", "--json"]):
            _same_output(capsys, cmd, str(local), url)
        code, out, err = _cli(capsys, "diff", str(local), url)
        assert code == 0 and "0 changed" in out, err
    code, out, err = _cli(capsys, "diff", f"{az.url}/{name}", f"abfs://{az.name}/{name}")
    assert code == 0 and "0 changed" in out, err


@pytest.mark.parametrize("name", ["m.pt", "m.safetensors"])
@pytest.mark.parametrize("ext", ["safetensors", "pt"])
def test_convert_to_and_from_az_is_bit_exact(az, tmp_path, capsys, name, ext):
    """convert local -> az://, az:// -> az:// and az:// -> local give what local -> local gives."""
    data = _files(tmp_path)[name]
    src = tmp_path / name
    src.write_bytes(data)
    az.put(f"in/{name}", data)
    ref = tmp_path / f"ref.{ext}"
    assert _cli(capsys, "convert", str(src), str(ref))[0] == 0
    back = tmp_path / f"back.{ext}"
    for cmd in (
        ("convert", str(src), f"{az.url}/up.{ext}"),
        ("convert", f"{az.url}/in/{name}", f"{az.url}/across.{ext}"),
        ("convert", f"{az.url}/in/{name}", str(back)),
    ):
        code, out, err = _cli(capsys, *cmd)
        assert code == 0, (cmd, err)
    outputs = [az.get(f"up.{ext}"), az.get(f"across.{ext}"), back.read_bytes()]
    if ext == "pt":  # a .pt records a random serialization id: compare what torch loads
        want = torch.load(ref)
        for got in outputs:
            got_sd = torch.load(io.BytesIO(got))
            assert sorted(got_sd) == sorted(want)
            for k in want:
                assert got_sd[k].dtype == want[k].dtype and torch.equal(got_sd[k], want[k]), k
    else:
        assert all(got == ref.read_bytes() for got in outputs)


def test_info_fetches_far_less_than_the_file(az, capsys):
    """info / ls / scan of a .pt with a 16 MiB tensor fetch its metadata, by Azurite's own
    count of the bytes it served, which --stats reports exactly; a tensor fetches its range."""
    sd = {"big": torch.randn(1 << 18, 16), "small": torch.arange(5.0)}
    data = _saved(sd)
    az.put("big.pt", data)
    url = f"{az.url}/big.pt"
    for cmd in ("info", "ls", "scan"):
        mark = az.srv.mark()
        code, out, err = _cli(capsys, cmd, url, "--stats")
        assert code == 0, err
        served, gets = az.srv.served_since(mark)
        assert f"{served} bytes fetched" in err, (cmd, served, err)
        assert served < 256 * 1024 and served * 64 < len(data), (cmd, served, len(data))
        assert gets <= 3, (cmd, gets)
    remote.SHARED_BLOCKS.clear()
    with torchless.open(url) as art:
        mark = az.srv.mark()
        assert art["small"].numpy().tobytes() == sd["small"].numpy().tobytes()
        small_cost = az.srv.served_since(mark)[0]
        mark = az.srv.mark()
        assert art["big"].numpy().tobytes() == sd["big"].numpy().tobytes()
        big_cost = az.srv.served_since(mark)[0]
    assert small_cost <= 1 << 16
    assert big_cost == sd["big"].numel() * 4  # its storage, exactly


# -- DCP -------------------------------------------------------------------------------------
def test_dcp_reshard_and_consolidate_az_to_az(az, tmp_path, capsys):
    """A DCP checkpoint torch wrote locally, uploaded: ls fetches .metadata only; resharded
    az:// -> az:// (the same files as the local reshard) and consolidated, torch loads both
    results as the saved state."""
    sd = small_dcp_state(3)
    local = tmp_path / "t"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(sd, storage_writer=dcp.FileSystemWriter(str(local)), no_dist=True)
    for n in sorted(os.listdir(local)):
        az.put(f"t/{n}", (local / n).read_bytes())
    mark = az.srv.mark()
    _same_output(capsys, ["ls"], str(local), f"{az.url}/t")
    assert az.srv.served_since(mark)[0] == (local / ".metadata").stat().st_size

    assert _cli(capsys, "reshard", str(local), str(tmp_path / "r3"), "--ranks", "3")[0] == 0
    code, out, err = _cli(capsys, "reshard", f"{az.url}/t", f"{az.url}/r3", "--ranks", "3")
    assert code == 0, err
    names = sorted(os.listdir(tmp_path / "r3"))
    assert az.keys("r3") == names
    down = tmp_path / "down"
    down.mkdir()
    for n in names:
        (down / n).write_bytes(az.get(f"r3/{n}"))
        if n.endswith(".distcp"):
            assert (down / n).read_bytes() == (tmp_path / "r3" / n).read_bytes(), n
    assert_same_state(torch_dcp_load(sd, str(down)), sd)

    code, out, err = _cli(capsys, "convert", f"{az.url}/r3", f"{az.url}/flat.pt")
    assert code == 0, err
    flat = torch.load(io.BytesIO(az.get("flat.pt")))
    assert_same_state(flat, sd)
    code, out, err = _cli(capsys, "diff", f"{az.url}/r3", str(local))
    assert code == 0 and "0 changed" in out, err


# -- writing ---------------------------------------------------------------------------------
def test_killed_convert_leaves_no_blob(az, tmp_path):
    """A convert killed (SIGKILL) half way through writing its output leaves no blob at the
    target: outputs are staged locally and uploaded whole."""
    src = tmp_path / "m.pt"
    torch.save(_sd(20000), src)
    env = dict(os.environ, TORCHLESS_FAULT_AFTER_BYTES="100000:SIGKILL")
    srcdir = os.path.abspath(os.path.join(os.path.dirname(torchless.__file__), os.pardir))
    env["PYTHONPATH"] = srcdir + os.pathsep + env.get("PYTHONPATH", "")
    mark = az.srv.mark()
    r = subprocess.run(
        [sys.executable, "-m", "torchless", "convert", str(src), f"{az.url}/out/m.safetensors"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == -9, r.stderr
    assert az.keys() == []
    assert not [q for q in az.srv.requests()[mark:] if q[0] == "PUT"]  # nothing was sent at all


def test_failed_upload_keeps_the_previous_blob(az, tmp_path, monkeypatch):
    """An upload sent in staged blocks that fails before its block list is committed leaves
    the previous blob whole (old or new, never part); a rerun then publishes the new one."""
    from azure.storage.blob._generated.aio.operations import BlockBlobOperations
    from azure.storage.blob.aio import BlobServiceClient as AioClient

    def small_blocks(connection_string):  # blocks of 64 KiB above 128 KiB: many staged blocks
        return AioClient.from_connection_string(connection_string, max_single_put_size=1 << 17, max_block_size=1 << 16)

    monkeypatch.setattr(adlfs.spec, "_create_aio_blob_service_client_from_connection_string", small_blocks)
    adlfs.AzureBlobFileSystem.clear_instance_cache()
    az.put("m.safetensors", _files(tmp_path)["m.safetensors"])
    before = az.get("m.safetensors")

    real_commit = BlockBlobOperations.commit_block_list

    async def failing_commit(self, *a, **kw):  # the request that would make the blob
        raise OSError("injected failure before the block list is committed")

    monkeypatch.setattr(BlockBlobOperations, "commit_block_list", failing_commit)
    src = tmp_path / "new.pt"
    torch.save(_sd(20000), src)
    mark = az.srv.mark()
    with pytest.raises(TorchlessError):
        torchless.convert(str(src), f"{az.url}/m.safetensors")
    staged = [q for q in az.srv.requests()[mark:] if q[0] == "PUT" and "comp=block&" in q[1]]
    assert len(staged) > 2  # the blocks went out ...
    assert az.get("m.safetensors") == before  # ... and the blob is the previous one
    assert az.keys() == ["m.safetensors"]

    monkeypatch.setattr(BlockBlobOperations, "commit_block_list", real_commit)
    torchless.convert(str(src), f"{az.url}/m.safetensors")
    torchless.convert(str(src), str(tmp_path / "ref.safetensors"))
    assert az.get("m.safetensors") == (tmp_path / "ref.safetensors").read_bytes()


def test_failed_sharded_upload_publishes_no_index(az, tmp_path, monkeypatch):
    sd = {k: v.numpy() for k, v in _sd(4000).items() if v.dtype != torch.bfloat16}
    _fail_upload(monkeypatch, 2)
    with pytest.raises(torchless.core.errors.WriteError):
        torchless.write_tensors(sd.items(), f"{az.url}/f/o.safetensors", max_shard_size=100000)
    assert not any(k.endswith(".json") for k in az.keys("f"))


# -- credentials and errors ------------------------------------------------------------------
def test_storage_options_connection_string(az, tmp_path, capsys, monkeypatch):
    """Without the environment variable, the connection string comes from --storage-options
    (the CLI) or storage_options= (the API, remembered for the container's later opens)."""
    data = _files(tmp_path)["m.safetensors"]
    az.put("m.safetensors", data)
    monkeypatch.delenv("AZURE_STORAGE_CONNECTION_STRING")
    adlfs.AzureBlobFileSystem.clear_instance_cache()
    opts = {"connection_string": az.srv.connection_string}
    try:
        code, out, err = _cli(capsys, "ls", f"{az.url}/m.safetensors", "--storage-options", json.dumps(opts))
        assert code == 0 and "emb.weight" in out, err
        remote.set_default_options({})
        torchless.convert(f"{az.url}/m.safetensors", f"{az.url}/kw/o.safetensors", max_shard_size=100000, storage_options=opts)
        remote.SHARED_BLOCKS.clear()
        got = torchless.load(f"{az.url}/kw/o.safetensors.index.json")
        from safetensors.torch import load as st_load

        for k, v in st_load(data).items():
            assert got[k].numpy().tobytes() == v.contiguous().view(torch.uint8).numpy().tobytes(), k
    finally:
        remote.set_default_options({})
        remote._BY_LOCATION.clear()


def test_errors_are_one_line(az, tmp_path, capsys, monkeypatch):
    """A missing blob, a missing container, a wrong account key: one line each, exit 2,
    reading, listing, scanning and writing; a refused key is said as the service said it,
    not as a missing file."""
    src = tmp_path / "m.pt"
    src.write_bytes(_files(tmp_path)["m.pt"])
    az.put("m.pt", src.read_bytes())
    az.put("d/m.pt", src.read_bytes())
    cases = [
        (("info", f"{az.url}/nope.pt"), "no such file"),
        (("convert", str(src), f"az://no-such-container-{uuid.uuid4().hex[:8]}/o.safetensors"), "cannot upload"),
    ]
    for argv, words in cases:
        code, out, err = _cli(capsys, *argv)
        assert code == 2 and words in err and err.count("\n") == 1, (argv, err)
    bad = az.srv.connection_string.replace(azurite_mod.KEY, "A" * 86 + "==")
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", bad)
    adlfs.AzureBlobFileSystem.clear_instance_cache()
    for argv in (
        ("info", f"{az.url}/m.pt"),
        ("ls", f"{az.url}/d"),
        ("scan", f"{az.url}/d"),
        ("convert", str(src), f"{az.url}/o.safetensors"),
    ):
        code, out, err = _cli(capsys, *argv)
        assert code == 2 and err.count("\n") == 1, (argv, err)
        assert "failed to authenticate" in err and "no such" not in err, (argv, err)
        assert "RequestId" not in err, (argv, err)  # the first line of the service's message only
    assert az.keys() == ["d/m.pt", "m.pt"]
