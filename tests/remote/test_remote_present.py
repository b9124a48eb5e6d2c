"""Callers that act on whether an object is at a URL ask ``remote.present()``: a store that
cannot answer (here a connection reset, injected into the filesystem's ``info`` for one
path) fails the command in one line naming the reason, instead of reading as "missing".

``exists()`` guessed False on any failure, so: ``reshard`` wrote over a DCP checkpoint at
its destination; DCP detection said the folder was no checkpoint; the inductor-cache
inventory (``torchless cache``) reported an empty, missing cache with exit 0; a scan of a
cache ``.so`` said its C++ source was missing; ``cache`` said "no such cache folder".
Each test fails on the old code. The memory filesystem is the store; its own listing and
bytes are the oracle for what is left."""

from __future__ import annotations

from pathlib import Path

import pytest

import torchless
import torchless.dcp
from torchless.core.errors import TorchlessError, UsageError
from torchless.io import remote

from .test_remote import _cli
from .test_remote_formats import _inductor_cache

torch = pytest.importorskip("torch", reason="torch writes the checkpoints")

RESET = "injected: connection reset by peer"


def _flaky_info(monkeypatch, url: str, times: int = 1 << 30) -> list[str]:
    """Make ``info`` of ``url`` fail ``times`` times with a connection reset (what a
    network failure looks like to fsspec; ``isdir`` calls ``info`` too); returns the list
    of failed calls."""
    fs, inner = remote.filesystem(url)
    want = inner.rstrip("/")
    real, failed = fs.info, []

    def info(path, **kw):
        if fs._strip_protocol(path).rstrip("/") == want and len(failed) < times:
            failed.append(path)
            raise ConnectionResetError(RESET)
        return real(path, **kw)

    monkeypatch.setattr(fs, "info", info)
    return failed


def _mem_dir(fs, local: Path, inner: str) -> None:
    for f in sorted(local.rglob("*")):
        if f.is_file():
            fs.pipe_file(f"{inner}/{f.relative_to(local).as_posix()}", f.read_bytes())


def _mem_files(fs, inner: str) -> dict[str, bytes]:
    return {p[len(inner) + 1 :]: fs.cat_file(p) for p in fs.find(inner)}


@pytest.fixture
def ckpts(tmp_path):
    """Two torchless-written DCP checkpoints of different states (2 and 3 ranks)."""
    torch.save({"w": torch.arange(12.0).reshape(4, 3)}, tmp_path / "a.pt")
    torch.save({"w": -torch.arange(12.0).reshape(4, 3), "b": torch.ones(3)}, tmp_path / "b.pt")
    torchless.dcp.reshard(tmp_path / "a.pt", tmp_path / "a", 2)
    torchless.dcp.reshard(tmp_path / "b.pt", tmp_path / "b", 3)
    return tmp_path / "a", tmp_path / "b"


def test_reshard_destination_check_that_fails_writes_nothing(memfs, ckpts, monkeypatch, capsys):
    """A destination holding a checkpoint whose check fails three times (the existence
    and folder checks of the destination, the publish's check of what the folder holds)
    is not written over: the old code wrote the new checkpoint over it."""
    fs, base = memfs
    a, b = ckpts
    _mem_dir(fs, a, f"{base}/dst")
    before = _mem_files(fs, f"{base}/dst")
    dst = f"memory://{base}/dst"
    failed = _flaky_info(monkeypatch, dst, times=3)
    with pytest.raises(TorchlessError) as ei:
        torchless.dcp.reshard(str(b), dst, 2)
    assert _mem_files(fs, f"{base}/dst") == before  # no rank file written over
    assert isinstance(ei.value, UsageError) and RESET in str(ei.value) and ei.value.path == dst, str(ei.value)
    assert failed

    failed.clear()
    code, _out, err = _cli(capsys, "reshard", "--ranks", "2", str(b), dst)
    assert code == 2 and len(err.strip().splitlines()) == 1 and RESET in err and dst in err, err
    assert _mem_files(fs, f"{base}/dst") == before
    failed += ["(spent)"] * 3
    # with the store answering, the destination is refused for what it holds: by the CLI
    # as a folder that is not empty, and, with --force, as a DCP checkpoint
    code, _out, err = _cli(capsys, "reshard", "--ranks", "2", str(b), dst)
    assert code == 2 and "not empty" in err and "--force" in err, err
    assert _mem_files(fs, f"{base}/dst") == before
    code, _out, err = _cli(capsys, "reshard", "--ranks", "2", str(b), dst, "--force")
    assert code == 2 and "already holds a DCP checkpoint" in err, err
    assert _mem_files(fs, f"{base}/dst") == before


def test_dcp_detection_that_cannot_check_the_metadata_says_why(memfs, ckpts, monkeypatch, capsys):
    fs, base = memfs
    a, _b = ckpts
    _mem_dir(fs, a, f"{base}/ck")
    url = f"memory://{base}/ck"
    assert sorted(torchless.load(url)) == ["w"]  # the store answering: a checkpoint
    failed = _flaky_info(monkeypatch, f"{url}/.metadata")
    with pytest.raises(UsageError) as ei:
        torchless.open(url)
    assert failed and RESET in str(ei.value) and ".metadata" in str(ei.value.path), str(ei.value)
    for cmd in ("info", "verify", "ls"):
        code, _out, err = _cli(capsys, cmd, url)
        assert code == 2 and len(err.strip().splitlines()) == 1 and RESET in err, (cmd, err)


def test_cache_inventory_that_cannot_check_its_folder_says_why(memfs, tmp_path, monkeypatch, capsys):
    fs, base = memfs
    _inductor_cache(tmp_path / "c")
    _mem_dir(fs, tmp_path / "c", f"{base}/c")
    url = f"memory://{base}/c"
    from torchless.formats.inductor_cache.inventory import inventory

    assert inventory(url).exists  # the store answering
    _flaky_info(monkeypatch, url)
    with pytest.raises(UsageError) as ei:
        inventory(url)
    assert RESET in str(ei.value), str(ei.value)
    code, _out, err = _cli(capsys, "cache", url)
    assert code == 2 and len(err.strip().splitlines()) == 1 and RESET in err, err


def test_scan_of_a_cache_object_whose_source_check_fails_is_not_told_it_is_missing(memfs, tmp_path, monkeypatch):
    fs, base = memfs
    _inductor_cache(tmp_path / "c")
    _mem_dir(fs, tmp_path / "c", f"{base}/c")
    # the kernel's .so in the cache layout (the scan names its .cpp as its source)
    for so in sorted(p for p in fs.find(f"{base}/c") if p.endswith(".so")):
        url = f"memory://{so.lstrip('/')}"
        clean = torchless.scan(url)
        if any(f.rule == "native-code" for f in clean.findings):
            break
    else:
        raise AssertionError("no cache kernel .so")
    assert not any("missing" in f.message for f in clean.findings), clean.findings
    failed = _flaky_info(monkeypatch, url[:-3] + ".cpp")
    rep = torchless.scan(url)
    assert failed
    assert not any("missing" in f.message for f in rep.findings), rep.findings
    hit = [f for f in rep.findings if RESET in f.message]
    assert hit and all((f.rule, f.severity) == ("unanalysable", "high") for f in hit), rep.findings


def test_remote_path_exists_raises_when_the_store_cannot_tell(memfs, monkeypatch):
    fs, base = memfs
    fs.pipe_file(f"{base}/x.bin", b"x")
    p = remote.RemotePath(f"memory://{base}/x.bin")
    assert p.exists() and p.is_file() and not remote.RemotePath(f"memory://{base}/y.bin").exists()
    _flaky_info(monkeypatch, p)
    with pytest.raises(UsageError, match=RESET):
        p.exists()


def test_hf_index_at_a_url_that_cannot_be_checked_says_why(memfs, monkeypatch):
    fs, base = memfs
    url = f"memory://{base}/model.safetensors.index.json"
    fs.pipe_file(url.split("://", 1)[1], b'{"weight_map": {}}')
    _flaky_info(monkeypatch, url)
    from torchless.formats.hf.read import HFArtifact

    with pytest.raises(UsageError, match=RESET):
        HFArtifact(url)


def test_isdir_is_false_only_when_the_store_says_so(memfs, monkeypatch):
    """``isdir()`` answered False on any failure (fsspec's own ``isdir`` swallows every
    ``OSError``), so a folder the store could not show was "not a folder"; now False is
    the store's answer (missing, an object) and a failure raises naming the URL and the
    reason. The memory filesystem's own ``info`` is the oracle for the true answers."""
    fs, base = memfs
    fs.pipe_file(f"{base}/d/x.bin", b"x")
    d, f = f"memory://{base}/d", f"memory://{base}/d/x.bin"
    for url in (d, f, f"memory://{base}/none", f"{f}/under"):
        try:
            want = fs.info(url.split("://", 1)[1])["type"] == "directory"
        except FileNotFoundError:
            want = False
        assert remote.isdir(url) is want, url
    assert remote.isdir(d) and not remote.isdir(f)
    _flaky_info(monkeypatch, d)
    with pytest.raises(UsageError, match=RESET) as ei:
        remote.isdir(d)
    assert ei.value.path == d
    with pytest.raises(UsageError, match=RESET):
        remote.RemotePath(d).is_dir()


def test_isdir_failure_that_is_no_os_error_raises_too(memfs, monkeypatch):
    """A store's own error type (adlfs raises azure's HttpResponseError, not an OSError)."""
    fs, base = memfs
    fs.pipe_file(f"{base}/d/x.bin", b"x")
    url = f"memory://{base}/d"

    class ServerError(Exception):
        pass

    real = fs.info

    def info(path, **kw):
        if fs._strip_protocol(path).rstrip("/") == f"{base}/d":
            raise ServerError("503 Service Unavailable\n<xml>...</xml>")
        return real(path, **kw)

    monkeypatch.setattr(fs, "info", info)
    with pytest.raises(UsageError, match="ServerError: 503 Service Unavailable") as ei:
        remote.isdir(url)
    assert ei.value.path == url and "<xml>" not in str(ei.value)


def test_dcp_reader_whose_folder_check_fails_is_not_told_it_is_no_checkpoint(memfs, ckpts, monkeypatch, capsys):
    fs, base = memfs
    a, _b = ckpts
    _mem_dir(fs, a, f"{base}/ck")
    url = f"memory://{base}/ck"
    from torchless.formats.dcp.reader import DCPReader

    DCPReader(url).close()  # the store answering: a checkpoint folder
    failed = _flaky_info(monkeypatch, url)
    with pytest.raises(UsageError) as ei:
        DCPReader(url)
    assert failed and RESET in str(ei.value) and ei.value.path == url, str(ei.value)
    assert "not a DCP checkpoint" not in str(ei.value)
    for cmd in ("info", "verify"):
        code, _out, err = _cli(capsys, cmd, url)
        assert code == 2 and len(err.strip().splitlines()) == 1 and RESET in err, (cmd, err)
