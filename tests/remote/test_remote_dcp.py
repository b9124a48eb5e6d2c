"""DCP checkpoints in object storage: listed from ``.metadata`` alone, resharded and
consolidated from and to S3 (moto's server on 127.0.0.1), read and written by torch's own
fsspec reader and writer as the oracle."""

from __future__ import annotations

import os
import warnings

import pytest
from tl_testutil import assert_same_state, small_dcp_state, torch_dcp_load

import torchless
import torchless.dcp
from torchless.io import remote

from .test_remote import _cli, _get_s3, _keys, _put_s3

torch = pytest.importorskip("torch", reason="torch is the oracle of these tests")
dcp = pytest.importorskip("torch.distributed.checkpoint", reason="torch without distributed checkpoint")
_fsspec_dcp = pytest.importorskip(
    "torch.distributed.checkpoint._fsspec_filesystem", reason="torch without the fsspec DCP backend"
)
FsspecReader, FsspecWriter = _fsspec_dcp.FsspecReader, _fsspec_dcp.FsspecWriter


def _upload_dir(client, local: str, url: str) -> None:
    for n in sorted(os.listdir(local)):
        _put_s3(client, f"{url}/{n}", open(os.path.join(local, n), "rb").read())


@pytest.fixture
def ranks8(tmp_path):
    """An 8-rank DCP checkpoint written by torchless from a torch-saved state."""
    sd = small_dcp_state()
    torch.save(sd, tmp_path / "src.pt")
    torchless.dcp.reshard(tmp_path / "src.pt", tmp_path / "r8", 8)
    return sd, str(tmp_path / "r8")


def test_ls_of_remote_dcp_fetches_metadata_only(s3, ranks8, capsys):
    base, client = s3
    sd, local = ranks8
    _upload_dir(client, local, f"{base}/r8")
    meta_size = len(_get_s3(client, f"{base}/r8/.metadata"))  # the oracle: what the server holds
    for cmd in ("ls", "info"):
        c1, o1, _ = _cli(capsys, cmd, local)
        c2, o2, err = _cli(capsys, cmd, f"{base}/r8", "--stats")
        assert c1 == c2 == 0, err
        assert o1.replace(local, "<p>") == o2.replace(f"{base}/r8", "<p>")
        assert f"{meta_size} bytes fetched" in err, err


def test_reshard_s3_to_s3_matches_local(s3, ranks8, tmp_path, capsys):
    base, client = s3
    sd, local = ranks8
    _upload_dir(client, local, f"{base}/r8")
    assert _cli(capsys, "reshard", local, str(tmp_path / "r3"), "--ranks", "3")[0] == 0
    code, out, err = _cli(capsys, "reshard", f"{base}/r8", f"{base}/r3", "--ranks", "3", "--stats")
    assert code == 0, err
    assert _keys(client, f"{base}/r3") == sorted(os.listdir(tmp_path / "r3"))
    # what torch reads from each, through its own readers, is the saved state
    fs_reader = FsspecReader(f"{base}/r3")
    assert_same_state(torch_dcp_load(sd, fs_reader), sd)
    assert_same_state(torch_dcp_load(sd, dcp.FileSystemReader(str(tmp_path / "r3"))), sd)
    # and the payload files are the same bytes
    for n in os.listdir(tmp_path / "r3"):
        if n.endswith(".distcp"):
            assert _get_s3(client, f"{base}/r3/{n}") == (tmp_path / "r3" / n).read_bytes(), n


def test_torch_fsspec_writer_to_s3_is_resharded_there(s3, capsys):
    """torch writes a DCP into the S3 server with its FsspecWriter; torchless reshards it
    there (1 -> 4 ranks) and torch loads the result with its FsspecReader."""
    base, client = s3
    sd = small_dcp_state(1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(sd, storage_writer=FsspecWriter(f"{base}/t"), no_dist=True)
    code, out, err = _cli(capsys, "reshard", f"{base}/t", f"{base}/t4", "--ranks", "4")
    assert code == 0, err
    assert ".metadata" in _keys(client, f"{base}/t4")
    assert_same_state(torch_dcp_load(sd, FsspecReader(f"{base}/t4")), sd)
    got = torchless.load(f"{base}/t4")
    for k in ("w", "i"):
        assert got[k].numpy().tobytes() == sd[k].numpy().tobytes()


def test_consolidate_remote_dcp_is_bit_exact(s3, ranks8, tmp_path, capsys):
    base, client = s3
    sd, local = ranks8
    _upload_dir(client, local, f"{base}/r8")
    assert _cli(capsys, "convert", local, str(tmp_path / "c.safetensors"))[0] == 0
    assert _cli(capsys, "convert", f"{base}/r8", f"{base}/c.safetensors")[0] == 0
    assert _get_s3(client, f"{base}/c.safetensors") == (tmp_path / "c.safetensors").read_bytes()
    code, out, _ = _cli(capsys, "diff", f"{base}/r8", local)
    assert code == 0 and "0 changed" in out


def test_failed_reshard_upload_publishes_no_metadata(s3, ranks8, monkeypatch):
    """A payload upload fails: .metadata (what makes the folder a checkpoint) never appears."""
    base, client = s3
    sd, local = ranks8
    real = remote.upload
    seen = []

    def failing(src, url):
        seen.append(url)
        if len(seen) == 2:
            raise torchless.core.errors.WriteError("injected upload failure", path=url)
        return real(src, url)

    monkeypatch.setattr(remote, "upload", failing)
    with pytest.raises(torchless.core.errors.WriteError):
        torchless.dcp.reshard(local, f"{base}/bad", 3)
    assert _keys(client, f"{base}/bad") == []  # no .metadata, and the one payload file uploaded was removed
    assert all(not u.endswith(".metadata") for u in seen)


def test_remote_storage_name_cannot_escape(memfs):
    """A .metadata naming a storage file outside the checkpoint's folder is refused."""
    fs, base = memfs
    from torchless.formats.dcp.metadata import dump_metadata, parse_metadata

    sd = {"a": torch.arange(4.0)}
    import tempfile

    d = tempfile.mkdtemp()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(sd, checkpoint_id=d, no_dist=True)
    md = parse_metadata(open(os.path.join(d, ".metadata"), "rb").read())
    for k, v in list(md.storage_data.items()):
        md.storage_data[k] = type(v)("../x/" + v.relative_path, v.offset, v.length)
    fs.pipe(f"{base}/c/.metadata", dump_metadata(md))
    with pytest.raises(torchless.core.errors.LinkEscapeError):
        torchless.load(f"memory://{base}/c")


def test_http_dcp_ls_fetches_metadata_only(http_root, ranks8, capsys):
    """Over plain HTTP (no folder listing): ls / info of an 8-rank DCP fetch .metadata and
    nothing else, by the server's own count; a tensor then fetches its rows."""
    root, base, handler = http_root
    sd, local = ranks8
    import shutil

    shutil.copytree(local, root / "r8")
    meta = (root / "r8" / ".metadata").stat().st_size
    for cmd in ("ls", "info"):
        handler.sent = 0
        c1, o1, _ = _cli(capsys, cmd, local)
        c2, o2, err = _cli(capsys, cmd, f"{base}/r8/")
        assert c1 == c2 == 0, err
        assert o1.replace(local, "<p>") == o2.replace(f"{base}/r8/", "<p>").replace(f"{base}/r8", "<p>")
        assert handler.sent == meta
    handler.sent = 0
    got = torchless.load(f"{base}/r8/")
    assert got["w"].numpy().tobytes() == sd["w"].numpy().tobytes()
    total = sum(p.stat().st_size for p in (root / "r8").iterdir())
    assert handler.sent < total  # ranges: headers and rows, not whole files


def _mem_upload(fs, local: str, inner: str) -> None:
    for n in sorted(os.listdir(local)):
        fs.pipe_file(f"{inner}/{n}", open(os.path.join(local, n), "rb").read())


def _mem_files(fs, inner: str) -> dict[str, bytes]:
    return {p.rsplit("/", 1)[1]: fs.cat_file(p) for p in fs.find(inner) if ".torchless-staging" not in p}


def test_resume_after_publish_interrupted_among_moves(memfs, ranks8, tmp_path, monkeypatch):
    """A run interrupted after moving some rank files into place (before .metadata) is
    completed by --resume, bit-exact with a local reshard, and loads in torch."""
    fs, inner = memfs
    sd, local = ranks8
    _mem_upload(fs, local, f"{inner}/r8")
    real = remote.move
    calls: list[str] = []

    def flaky(s, t):
        if ".torchless-staging" not in t:  # the final moves into place
            calls.append(t)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(s, t)

    monkeypatch.setattr(remote, "move", flaky)
    dst = f"memory://{inner.lstrip('/')}/r3"
    with pytest.raises(KeyboardInterrupt):
        torchless.dcp.reshard(f"memory://{inner.lstrip('/')}/r8", dst, 3, max_task_bytes=1 << 20, resume=True)
    moved = _mem_files(fs, f"{inner}/r3")
    assert moved and ".metadata" not in moved  # the state the resume must accept
    monkeypatch.setattr(remote, "move", real)
    torchless.dcp.reshard(f"memory://{inner.lstrip('/')}/r8", dst, 3, max_task_bytes=1 << 20, resume=True)
    torchless.dcp.reshard(local, tmp_path / "r3", 3)
    got = _mem_files(fs, f"{inner}/r3")
    assert sorted(got) == sorted(os.listdir(tmp_path / "r3"))
    for n in got:
        if n != ".metadata":  # (.metadata names its checkpoint's location)
            assert got[n] == (tmp_path / "r3" / n).read_bytes(), n
    dl = tmp_path / "dl"
    dl.mkdir()
    for n, data in got.items():
        (dl / n).write_bytes(data)
    assert_same_state(torch_dcp_load(sd, str(dl)), torch_dcp_load(sd, str(tmp_path / "r3")))


def test_empty_rank_files_reach_a_url(memfs, tmp_path):
    """A scalar resharded to 4 ranks: ranks 1-3 are empty files, at a URL as locally."""
    fs, inner = memfs
    torch.save({"w": torch.tensor(1.0)}, tmp_path / "src.pt")
    torchless.dcp.reshard(tmp_path / "src.pt", tmp_path / "r1", 1)
    torchless.dcp.reshard(tmp_path / "r1", tmp_path / "r4", 4)
    _mem_upload(fs, str(tmp_path / "r1"), f"{inner}/r1")
    s = torchless.dcp.reshard(f"memory://{inner.lstrip('/')}/r1", f"memory://{inner.lstrip('/')}/r4", 4, max_task_bytes=1 << 20)
    got = _mem_files(fs, f"{inner}/r4")
    assert sorted(got) == sorted(os.listdir(tmp_path / "r4"))
    for n in got:
        if n != ".metadata":
            assert got[n] == (tmp_path / "r4" / n).read_bytes(), n
    assert all(n in got for n in s["files"])


def test_failed_ranged_reshard_aborts_its_multipart_uploads(s3, ranks8, monkeypatch):
    """A range-task job that fails leaves no incomplete multipart upload (S3 bills its parts)."""
    base, client = s3
    sd, local = ranks8
    _upload_dir(client, local, f"{base}/r8")
    bucket = base[5:]
    real = remote.move

    def failing(s, t):  # a killed worker's upload left incomplete, then the job fails
        key = t[len(base) + 1 :]
        client.create_multipart_upload(Bucket=bucket, Key=key)
        raise torchless.core.errors.WriteError("injected move failure", path=t)

    monkeypatch.setattr(remote, "move", failing)
    with pytest.raises(torchless.core.errors.WriteError):
        torchless.dcp.reshard(f"{base}/r8", f"{base}/r3", 3, max_task_bytes=1 << 20)
    monkeypatch.setattr(remote, "move", real)
    assert client.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []
    assert _keys(client, f"{base}/r3") == []


def test_flagged_dcp_item_at_a_url_is_refused(memfs, tmp_path):
    """A DCP item whose payload record is flagged encrypted is refused at a URL too (a
    remote checkpoint always takes the general path that locates a chunk)."""
    import sys

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from formats.dcp.test_dcp_record_flags import VICTIM, _damage, _save

    from torchless.core.errors import UnsupportedError

    fs, base = memfs
    d = str(tmp_path / "ck")
    _save(d)
    _path, at, record = _damage(d, "encrypted")
    _mem_upload(fs, d, f"{base}/ck")
    state = torchless.load(f"memory://{base}/ck")
    with pytest.raises(UnsupportedError) as ei:
        state[VICTIM].numpy()
    assert ei.value.member == record and ei.value.offset == at, str(ei.value)
