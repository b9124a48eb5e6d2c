"""Remote writes are atomic, against moto's S3 server (its requests seen, and held, by
``s3_traffic``):

* range tasks' parts of more than S3's 5 MiB minimum are joined by one multipart upload
  of server-side copies (UploadPartCopy), bit-exact with the local reshard, and torch
  loads the result;
* a reshard or a sharded convert interrupted (SIGINT, SIGKILL) while a part is in
  flight leaves nothing a reader takes for a checkpoint; ``--resume`` finishes it
  bit-exact, uploading only the parts the interrupted run had not finished;
  ``--cleanup`` removes every staging object and aborts the incomplete multipart uploads,
  and lists what it removed;
* a single object is one PUT, or a multipart upload completed only at the end: while it
  is in flight no object is there, and a failed part leaves neither an object nor an
  incomplete upload.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import warnings

import pytest

import torchless
import torchless.dcp

from .test_remote import _cli, _get_s3, _keys

torch = pytest.importorskip("torch", reason="torch is the oracle of these tests")
dcp = pytest.importorskip("torch.distributed.checkpoint", reason="torch without distributed checkpoint")
FsspecReader = pytest.importorskip(
    "torch.distributed.checkpoint._fsspec_filesystem", reason="torch without the fsspec DCP backend"
).FsspecReader

SRC = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "src"))
MiB = 1 << 20


def _state() -> dict:
    g = torch.Generator().manual_seed(0)
    return {
        "w": torch.randn(3072, 2048, generator=g),  # 24 MiB: split by rows over tasks of 6 MiB
        "e": torch.randn(1500, 1024, generator=g),
        "b": torch.arange(10, dtype=torch.float32),
        "step": 3,
    }


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    """A torch-saved state (the reshard source) and the local reshard / convert of it
    (the oracles)."""
    d = tmp_path_factory.mktemp("atomic")
    sd = _state()
    torch.save(sd, d / "src.pt")
    torchless.dcp.reshard(d / "src.pt", d / "want2", 2)
    torchless.dcp.reshard(d / "src.pt", d / "want2hf", 2, format="hf")
    (d / "sh").mkdir()
    torchless.convert(str(d / "want2"), str(d / "sh" / "m.safetensors"), max_shard_size="8MB")
    return sd, d


def _payload(d) -> dict[str, bytes]:
    return {n: (d / n).read_bytes() for n in sorted(os.listdir(d)) if n != ".metadata"}


def _fresh() -> None:
    """Forget this process's s3fs listings: another process wrote the bucket since."""
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()


def _torch_load(sd: dict, url: str) -> dict:
    _fresh()
    out = {k: (torch.empty_like(v) if isinstance(v, torch.Tensor) else v) for k, v in sd.items()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(out, storage_reader=FsspecReader(url), no_dist=True)
    return out


def _uploads(client, url: str) -> list:
    bucket = url[5:].partition("/")[0]
    return client.list_multipart_uploads(Bucket=bucket).get("Uploads", [])


def _part_puts(log) -> list[str]:
    """Keys of the part objects uploaded (one PUT each)."""
    return [p for m, p, q, c in log if m == "PUT" and "/.torchless-staging-" in p and "/parts/" in p and not q and not c]


def _is_part_put(req) -> bool:
    m, p, q, c = req
    return m == "PUT" and "/parts/" in p and not q and not c


@pytest.mark.parametrize("fmt", ["torch_save", "hf"])
def test_parts_over_5mib_are_joined_by_server_side_copies(s3_traffic, s3, src, capsys, fmt):
    base, client = s3
    sd, d = src
    want = d / ("want2" if fmt == "torch_save" else "want2hf")
    url = f"{base}/r2"
    code, out, err = _cli(capsys, "reshard", str(d / "src.pt"), url, "--ranks", "2", "--storage", fmt, "--max-task-bytes", "6MiB")
    assert code == 0, err
    for n, data in _payload(want).items():
        assert _get_s3(client, f"{url}/{n}") == data, n  # bit-exact with the local reshard
    assert _keys(client, url) == sorted(os.listdir(want))  # no staging left
    assert _uploads(client, url) == []
    log = s3_traffic.log
    for n in _payload(want):
        parts = sorted(int(p.rsplit(".", 1)[1]) for p in _part_puts(log) if p.rsplit("/", 1)[1].startswith(n + "."))
        assert len(parts) >= 3, parts
        joined = [r for r in log if r[1].endswith(f"/files/{n}")]
        # one multipart upload: created, parts copied server-side from the part objects, completed
        assert [r for r in joined if r[0] == "POST" and r[2] == "uploads"], joined
        copies = [r for r in joined if r[0] == "PUT" and "partNumber=" in r[2] and r[3]]
        assert len(copies) >= 2 and all("/parts/" in r[3] for r in copies), joined
        assert len([r for r in joined if r[0] == "POST" and r[2].startswith("uploadId=")]) == 1
    if fmt == "torch_save":
        got = _torch_load(sd, url)
        for k, v in sd.items():
            assert torch.equal(got[k], v) if isinstance(v, torch.Tensor) else got[k] == v, k


@pytest.fixture(autouse=True)
def _own_tmpdir(tmp_path, monkeypatch):
    """The subprocesses stage in this test's own folder (what a killed one leaves there
    is not reported by another test's run)."""
    (tmp_path / "tmp").mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))


def _run(*argv: str, pre: str = "") -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))
    code = f"import sys\n{pre}\nfrom torchless.cli.main import main\nsys.exit(main(sys.argv[1:]))"
    return subprocess.Popen(
        [sys.executable, "-c", code, *argv], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _interrupt(traffic, proc: subprocess.Popen, sig: int, pred) -> tuple[int, str, str]:
    """Hold the first request matching ``pred``; once ``proc`` sent it, signal ``proc``,
    then let the request go on; ``proc``'s exit code, stdout and stderr."""
    traffic.hold(pred)
    try:
        assert traffic.hit.wait(120), proc.communicate(timeout=60)
        proc.send_signal(sig)
        if sig == signal.SIGKILL:
            proc.wait(60)
        else:
            time.sleep(0.3)  # the signal is handled (held back, as an upload is in flight)
    finally:
        traffic.release()
    out, err = proc.communicate(timeout=120)
    return proc.returncode, out, err


def _no_checkpoint(client, url: str) -> None:
    """Nothing at ``url`` that a reader would take for a checkpoint."""
    _fresh()
    keys = _keys(client, url)
    assert keys and all(k.startswith(".torchless-staging-") for k in keys), keys
    with pytest.raises(torchless.core.errors.TorchlessError):
        torchless.open(url)
    with pytest.raises(Exception):  # noqa: B017 - torch's reader finds no .metadata
        FsspecReader(url).read_metadata()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL], ids=["SIGINT", "SIGTERM", "SIGKILL"])
def test_interrupted_reshard_resumes_with_the_finished_parts(s3_traffic, s3, src, sig):
    base, client = s3
    sd, d = src
    url = f"{base}/r2"
    argv = ["reshard", str(d / "src.pt"), url, "--ranks", "2", "--max-task-bytes", "6MiB", "--resume"]
    seen = []

    def third_part(req):
        if _is_part_put(req):
            seen.append(req)
        return len(seen) == 3

    code, out, err = _interrupt(s3_traffic, _run(*argv), sig, third_part)
    if sig == signal.SIGINT:
        assert code == 130 and err == "torchless: interrupted\n", err  # one line, no traceback
    else:
        assert code == -sig
    _no_checkpoint(client, url)
    first = set(_part_puts(s3_traffic.log))
    assert len(first) == 3
    s3_traffic.reset(on=True)
    proc = _run(*argv, "--json")
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    res = json.loads(out)
    second = _part_puts(s3_traffic.log)
    # the parts the interrupted run finished are kept, not uploaded again
    # (the held third part: a SIGINT lets its upload finish, but the task is interrupted
    # before it returns, so the part is not recorded as finished and is written again)
    assert res["resumed_parts"] == 2, res
    assert len(second) == len(set(second)) and len(first & set(second)) == 1
    for n, data in _payload(d / "want2").items():
        assert _get_s3(client, f"{url}/{n}") == data, n
    assert _keys(client, url) == sorted(os.listdir(d / "want2"))
    assert _uploads(client, url) == []
    got = _torch_load(sd, url)
    assert torch.equal(got["w"], sd["w"]) and got["step"] == 3


def test_ctrl_c_with_worker_processes_resumes(s3_traffic, s3, src):
    """``--executor local:2``: the workers ignore the Ctrl-C, the coordinator stops them;
    the parts recorded as finished are exactly those the resumed run does not upload."""
    base, client = s3
    sd, d = src
    url = f"{base}/r2"
    argv = ["reshard", str(d / "src.pt"), url, "--ranks", "2", "--max-task-bytes", "6MiB", "--resume", "--executor", "local:2"]
    code, _out, err = _interrupt(s3_traffic, _run(*argv), signal.SIGINT, _is_part_put)
    assert code == 130 and err == "torchless: interrupted\n", err
    _no_checkpoint(client, url)
    recorded = {k.rsplit("/", 1)[1] for k in _keys(client, url) if "/done/" in k}
    s3_traffic.reset(on=True)
    proc = _run(*argv, "--json")
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    again = {p.rsplit("/", 1)[1] for p in _part_puts(s3_traffic.log)}
    assert json.loads(out)["resumed_parts"] == len(recorded) and not (recorded & again)
    for n, data in _payload(d / "want2").items():
        assert _get_s3(client, f"{url}/{n}") == data, n
    assert _keys(client, url) == sorted(os.listdir(d / "want2")) and _uploads(client, url) == []


def test_ctrl_c_without_resume_removes_its_staging(s3_traffic, s3, src):
    base, client = s3
    sd, d = src
    url = f"{base}/r2"
    argv = ["reshard", str(d / "src.pt"), url, "--ranks", "2", "--max-task-bytes", "6MiB"]
    code, _out, err = _interrupt(s3_traffic, _run(*argv), signal.SIGINT, _is_part_put)
    assert code == 130 and err == "torchless: interrupted\n", err
    assert _keys(client, url) == [] and _uploads(client, url) == []


def test_cleanup_after_a_kill_mid_join(s3_traffic, s3, src):
    """Killed while a file's parts are being joined: an incomplete multipart upload is
    left with the staging objects; --cleanup removes both and says what it removed."""
    base, client = s3
    sd, d = src
    url = f"{base}/r2"
    argv = ["reshard", str(d / "src.pt"), url, "--ranks", "2", "--max-task-bytes", "6MiB"]

    def part_copy(req):
        return req[0] == "PUT" and "partNumber=" in req[2] and bool(req[3])

    code, _out, _err = _interrupt(s3_traffic, _run(*argv), signal.SIGKILL, part_copy)
    assert code == -signal.SIGKILL
    _no_checkpoint(client, url)
    assert len(_uploads(client, url)) == 1
    staged = [f"{url}/{k}" for k in _keys(client, url)]
    proc = _run(*argv, "--cleanup")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    lines = out.splitlines()
    assert lines[0].startswith(f"removed {len(staged) + 1} staging leftover(s)"), out
    assert sorted(line.strip() for line in lines[1:] if "multipart" not in line) == sorted(staged)
    assert [line for line in lines[1:] if "(incomplete multipart upload)" in line]
    assert _keys(client, url) == [] and _uploads(client, url) == []


def test_interrupted_sharded_convert_resumes(s3_traffic, s3, src):
    base, client = s3
    sd, d = src
    url = f"{base}/sh/m.safetensors"
    argv = ["convert", str(d / "want2"), url, "--max-shard-size", "8MB", "--max-task-bytes", "6MiB", "--resume"]
    code, out, err = _interrupt(s3_traffic, _run(*argv), signal.SIGINT, _is_part_put)
    assert code == 130 and err == "torchless: interrupted\n", err
    keys = _keys(client, f"{base}/sh")
    assert keys and all(k.startswith(".torchless-staging-") for k in keys), keys  # no shard, no index
    proc = _run(*argv)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    want = _payload(d / "sh")
    assert len(want) > 2 and _keys(client, f"{base}/sh") == sorted(want)
    for n, data in want.items():
        assert _get_s3(client, f"{base}/sh/{n}") == data, n
    assert _uploads(client, url) == []


# -- single objects ---------------------------------------------------------------------------
def test_single_object_put_once(s3_traffic, s3, src, capsys):
    """A file under s3fs's multipart threshold is one PUT of the whole object."""
    base, client = s3
    sd, d = src
    url = f"{base}/one/m.safetensors"
    code, _out, err = _cli(capsys, "convert", str(d / "want2"), url)
    assert code == 0, err
    puts = [r for r in s3_traffic.log if r[0] in ("PUT", "POST") and r[1].endswith("/one/m.safetensors")]
    assert [(r[0], r[2]) for r in puts] == [("PUT", "")]
    assert _keys(client, f"{base}/one") == ["m.safetensors"]


@pytest.fixture
def small_chunks(monkeypatch):
    """s3fs uploads files of twice its chunk size or more as multipart uploads; 5 MiB
    chunks (S3's minimum) make a 30 MiB file one."""
    s3fs_core = pytest.importorskip("s3fs.core")
    monkeypatch.setattr(s3fs_core, "calculate_chunksize", lambda size, chunksize=None, **kw: 5 * MiB)
    return "import s3fs.core\ns3fs.core.calculate_chunksize = lambda size, chunksize=None, **kw: 5 << 20"


def test_single_object_multipart_appears_only_when_complete(s3_traffic, s3, src, capsys, small_chunks):
    base, client = s3
    sd, d = src
    url = f"{base}/mp/m.safetensors"
    seen_while_held = []

    def second_part(req):
        if req[0] == "PUT" and "partNumber=2" in req[2] and req[1].endswith("/mp/m.safetensors"):
            seen_while_held.append(_keys(client, f"{base}/mp"))  # what a reader finds meanwhile
            return True
        return False

    import threading

    s3_traffic.hold(second_part)
    threading.Timer(0.5, s3_traffic.release).start()
    code, _out, err = _cli(capsys, "convert", str(d / "want2"), url)
    assert code == 0, err
    assert seen_while_held == [[]]
    # the CLI's check that the output does not exist yet (a HEAD: --force) comes before the upload
    log = [r for r in s3_traffic.log if r[1].endswith("/mp/m.safetensors") and r[0] != "HEAD"]
    assert log[0][:3] == ("POST", log[0][1], "uploads") and log[-1][0] == "POST" and log[-1][2].startswith("uploadId=")
    assert len([r for r in log if "partNumber=" in r[2]]) >= 3
    local = d / "one.safetensors"
    torchless.convert(str(d / "want2"), str(local))
    assert _get_s3(client, url) == local.read_bytes()
    assert _uploads(client, url) == []


def test_single_object_failed_part_leaves_nothing(s3_traffic, s3, src, capsys, small_chunks):
    base, client = s3
    sd, d = src
    url = f"{base}/bad/m.safetensors"
    s3_traffic.hold(lambda r: r[0] == "PUT" and "partNumber=2" in r[2])
    s3_traffic.release(fail=True)  # answered with AccessDenied once it arrives
    code, _out, err = _cli(capsys, "convert", str(d / "want2"), url)
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert "cannot upload" in err and url in err, err
    assert _keys(client, f"{base}/bad") == []
    assert _uploads(client, url) == []


def test_single_object_killed_mid_upload_then_cleanup(s3_traffic, s3, src, small_chunks):
    base, client = s3
    sd, d = src
    url = f"{base}/k/m.safetensors"
    argv = ["convert", str(d / "want2"), url]
    code, _out, _err = _interrupt(
        s3_traffic, _run(*argv, pre=small_chunks), signal.SIGKILL, lambda r: r[0] == "PUT" and "partNumber=2" in r[2]
    )
    assert code == -signal.SIGKILL
    assert _keys(client, f"{base}/k") == []  # no object: the upload was never completed
    assert len(_uploads(client, url)) == 1
    proc = _run(*argv, "--cleanup")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert out.splitlines()[0].startswith("removed 1 staging leftover(s)"), out
    assert f"{url} (incomplete multipart upload)" in out
    assert _uploads(client, url) == [] and _keys(client, f"{base}/k") == []


def test_cleanup_of_a_shard_set_aborts_its_shards_uploads(s3):
    """``cleanup(url, folder=False)`` (``convert --cleanup`` of a shard set) aborts the
    incomplete uploads a killed process left for the file, its shards and its index, and
    reports those only (the shard names are the format's: hf/ranged)."""
    base, client = s3
    bucket = base[5:]
    mine = ["k/m.safetensors", "k/m-00001-of-00002.safetensors", "k/m.safetensors.index.json"]
    others = ["k/m-extra.safetensors", "k/mm-00001-of-00002.safetensors", "k/m-00001-of-00002.bin"]
    for key in mine + others:
        client.create_multipart_upload(Bucket=bucket, Key=key)
    removed = torchless.dcp.cleanup(f"{base}/k/m.safetensors", folder=False)
    assert sorted(removed) == sorted(f"{base}/{k} (incomplete multipart upload)" for k in mine), removed
    assert not [u for u in _uploads(client, f"{base}/k") if u["Key"] in mine]
