"""URLs everywhere: read by ranges, written atomically, results bit-exact against local paths.

Servers run on 127.0.0.1 only (see conftest.py). Oracles: torch (what it saved, what it
loads), safetensors, boto3 (what the S3 server holds) and the HTTP server's own byte count.
"""

from __future__ import annotations

import io
import os
import pickletools
import re
import struct
import subprocess
import sys
import zipfile

import numpy as np
import pytest

import torchless
from torchless.cli.main import main
from torchless.io import remote

torch = pytest.importorskip("torch", reason="torch is the oracle of these tests")


def _cli(capsys, *argv: str) -> tuple[int, str, str]:
    """Run the CLI as a new process would (no cached blocks, no counted traffic) and
    return its exit code, stdout and stderr. Every remote test module uses this one."""
    remote.SHARED_BLOCKS.clear()  # every command starts cold, as a new process does
    remote.STATS.reset()
    capsys.readouterr()
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _stats(err: str) -> tuple[int, int]:
    """``(requests, bytes fetched)`` from the line ``--stats`` printed on stderr."""
    m = re.search(r"stats: (\d+) requests, (\d+) bytes fetched", err)
    assert m is not None, err
    return int(m.group(1)), int(m.group(2))


def _sd(n: int = 1000, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {
        "emb.weight": torch.randn(n, 16, generator=g),
        "fc.bias": torch.arange(7, dtype=torch.int64),
        "half": torch.randn(5, 3, generator=g).to(torch.bfloat16),
    }


def _put_s3(client, url: str, data: bytes) -> None:
    bucket, _, key = url[5:].partition("/")
    client.put_object(Bucket=bucket, Key=key, Body=data)


def _get_s3(client, url: str) -> bytes:
    bucket, _, key = url[5:].partition("/")
    return client.get_object(Bucket=bucket, Key=key)["Body"].read()


def _keys(client, url: str) -> list[str]:
    bucket, _, prefix = url[5:].partition("/")
    resp = client.list_objects_v2(Bucket=bucket, Prefix=prefix)
    return sorted(o["Key"][len(prefix) :].lstrip("/") for o in resp.get("Contents", []))


def _saved(sd: dict) -> bytes:
    buf = io.BytesIO()
    torch.save(sd, buf)
    return buf.getvalue()


# -- reading ---------------------------------------------------------------------------------
def test_memory_open_load_matches_torch(memfs):
    fs, base = memfs
    sd = _sd()
    fs.pipe(f"{base}/m.pt", _saved(sd))
    url = f"memory://{base}/m.pt"
    assert torchless.detect(url) == "pt"
    got = torchless.load(url)
    assert sorted(got) == sorted(sd)
    for k, t in sd.items():
        assert bytes(got[k].numpy().tobytes()) == bytes(t.contiguous().view(torch.uint8).numpy().tobytes())


def test_s3_cli_matches_local(s3, tmp_path, capsys):
    """info / ls / verify / scan / diff of an S3 object print what they print for the local file."""
    base, client = s3
    data = _saved(_sd())
    local = tmp_path / "m.pt"
    local.write_bytes(data)
    url = f"{base}/m.pt"
    _put_s3(client, url, data)
    for cmd in (["info"], ["ls"], ["verify"], ["scan"], ["info", "--json"], ["ls", "--json"]):
        c1, o1, _ = _cli(capsys, *cmd, str(local))
        c2, o2, _ = _cli(capsys, *cmd, url)
        assert (c1, o1.replace(str(local), "<p>")) == (c2, o2.replace(url, "<p>")), cmd
        assert c1 == 0
    code, out, _ = _cli(capsys, "diff", str(local), url)
    assert code == 0 and "0 changed" in out


def test_http_info_fetches_metadata_only(http_root, capsys):
    """info and ls over HTTP read the same bytes (by the server's count) whatever the payload
    size: the end of central directory, the central directory and data.pkl, never storages."""
    root, base, handler = http_root
    sent = {}
    for n in (1 << 16, 1 << 19):  # 4 MiB and 32 MiB of float32 payload
        sd = {"big": torch.zeros(n, 16), "small": torch.ones(3)}
        torch.save(sd, root / f"m{n}.pt")
        size = os.path.getsize(root / f"m{n}.pt")
        for cmd in ("info", "ls"):
            handler.sent = 0
            code, out, err = _cli(capsys, cmd, f"{base}/m{n}.pt", "--stats")
            assert code == 0, err
            sent[(cmd, n)] = handler.sent
            assert f"{handler.sent} bytes fetched" in err  # --stats counts what the server sent
        assert sent[("info", n)] < 1 << 20 and sent[("info", n)] < size / 4
    # the same blocks but for the partial last one (the file size modulo the 64 KiB block)
    assert abs(sent[("info", 1 << 16)] - sent[("info", 1 << 19)]) < 1 << 16
    assert abs(sent[("ls", 1 << 16)] - sent[("ls", 1 << 19)]) < 1 << 16


def test_http_tensor_reads_its_range(http_root):
    root, base, handler = http_root
    sd = {"a": torch.randn(1 << 18), "b": torch.randn(1 << 18), "c": torch.arange(10)}
    torch.save(sd, root / "m.pt")
    remote.SHARED_BLOCKS.clear()
    with torchless.open(f"{base}/m.pt") as art:
        handler.sent = 0
        b = art["b"].numpy()
        assert b.tobytes() == sd["b"].numpy().tobytes()
        assert (1 << 20) <= handler.sent < (1 << 20) + (1 << 17)  # b's 1 MiB storage, not a nor the file


def test_scan_fetch_is_bounded(http_root, capsys):
    """scan reads pickles and headers: the same byte count for a 4 MiB and a 32 MiB payload."""
    root, base, handler = http_root
    sent = []
    for n in (1 << 16, 1 << 19):
        torch.save({"big": torch.zeros(n, 16)}, root / f"s{n}.pt")
        handler.sent = 0
        code, out, err = _cli(capsys, "scan", f"{base}/s{n}.pt")
        assert code == 0, err
        sent.append(handler.sent)
    # the probe of the bytes as a plain pickle stream stops inside the first 64 KiB block,
    # which detection fetched already: less than 1 MB in all, whatever the payload
    assert abs(sent[0] - sent[1]) < 1 << 16 and sent[1] < 10**6


def _member_data(path, name: str) -> tuple[int, int]:
    """``(offset of the member's data, its size)``, by the stdlib's zipfile (the oracle)."""
    with zipfile.ZipFile(path) as z:
        info = next(i for i in z.infolist() if i.filename.endswith(name))
    with open(path, "rb") as f:
        f.seek(info.header_offset)
        head = f.read(30)
    nlen, xlen = struct.unpack_from("<HH", head, 26)
    return info.header_offset + 30 + nlen + xlen, info.file_size


def test_http_verify_fetches_each_byte_once(http_root, capsys, monkeypatch):
    """verify of a .pt at a URL checks the CRC-32s and the tensors from one read: the
    server sends about the file's size (not twice it), in requests no larger than the
    CRC pass's pieces (a member is streamed, never fetched whole), and a flipped payload
    byte or a wrong stored CRC is reported as for the local file."""
    from torchless.io import source

    monkeypatch.setattr(source, "PIECE", 2 << 20)  # pieces of 2 MiB: the 5 MiB tensors are streamed
    root, base, handler = http_root
    g = torch.Generator().manual_seed(3)
    sd = {f"w{i}": torch.randn(5 << 18, generator=g) for i in range(3)}  # 5 MiB each
    sd["small"] = torch.arange(7)
    good = root / "good.pt"
    torch.save(sd, good)
    size = os.path.getsize(good)
    handler.sent = handler.requests = handler.largest = 0
    code, out, err = _cli(capsys, "verify", f"{base}/good.pt", "--stats")
    assert code == 0, err
    assert size <= handler.sent < size + (1 << 20), (handler.sent, size)  # 64 KiB blocks around the headers
    assert handler.largest <= 2 << 20, handler.largest
    assert _stats(err) == (handler.requests, handler.sent)  # --stats says what the server counted

    data = good.read_bytes()
    off, n = _member_data(good, "data/1")
    flipped = bytearray(data)
    flipped[off + n // 2] ^= 0x40
    (root / "flipped.pt").write_bytes(bytes(flipped))
    crc_at = data.rindex(b"PK\x01\x02")  # the last central entry: rewrite its stored CRC
    bad_crc = bytearray(data)
    bad_crc[crc_at + 16 : crc_at + 20] = bytes(b ^ 0xFF for b in data[crc_at + 16 : crc_at + 20])
    (root / "badcrc.pt").write_bytes(bytes(bad_crc))
    for name in ("flipped.pt", "badcrc.pt"):
        c1, o1, _ = _cli(capsys, "verify", str(root / name))
        c2, o2, _ = _cli(capsys, "verify", f"{base}/{name}")
        assert (c2, o2.replace(f"{base}/{name}", "<p>")) == (c1, o1.replace(str(root / name), "<p>")), name
        assert c1 == 1 and "crc" in o1.lower(), o1


def test_scan_jobs_counts_the_workers_traffic(http_root, s3, capsys):
    """scan --jobs 2 runs the files on worker processes; --stats adds what each worker
    fetched: the server's count, and what --jobs 1 reports. On S3 a folder is listed
    (the listing is not a ranged read, so neither count has it)."""
    root, base, handler = http_root
    bucket, client = s3
    g = torch.Generator().manual_seed(5)
    urls = []
    for i in range(6):
        data = _saved({"w": torch.randn(300 + 100 * i, generator=g), "step": torch.tensor(i)})
        (root / f"f{i}.pt").write_bytes(data)
        _put_s3(client, f"{bucket}/dir/f{i}.pt", data)
        urls.append(f"{base}/f{i}.pt")
    seen = {}
    for jobs in ("1", "2"):
        handler.sent = handler.requests = 0
        code, out, err = _cli(capsys, "scan", "--jobs", jobs, *urls, "--stats")
        assert code == 0, err
        seen[jobs] = _stats(err)
        assert seen[jobs] == (handler.requests, handler.sent), jobs
        code, out, err = _cli(capsys, "scan", "--jobs", jobs, f"{bucket}/dir/", "--stats")
        assert code == 0 and out.count("f") >= 6, err
        seen["s3", jobs] = _stats(err)
    assert seen["1"] == seen["2"] and seen["1"][1] > 0
    assert seen["s3", "1"] == seen["s3", "2"] and seen["s3", "1"][1] > 0


def test_missing_object_is_one_line(s3, capsys):
    base, _ = s3
    code, out, err = _cli(capsys, "info", f"{base}/nope.pt")
    assert code == 2 and "no such file" in err and err.count("\n") == 1


# -- writing ---------------------------------------------------------------------------------
@pytest.mark.parametrize("ext", ["safetensors", "pt", "npz"])
def test_convert_to_s3_is_bit_exact(s3, tmp_path, capsys, ext):
    base, client = s3
    src = tmp_path / "m.pt"
    torch.save(_sd(), src)
    local_out = tmp_path / f"o.{ext}"
    assert _cli(capsys, "convert", str(src), str(local_out))[0] == 0
    # local -> S3 and S3 -> S3
    assert _cli(capsys, "convert", str(src), f"{base}/o.{ext}")[0] == 0
    _put_s3(client, f"{base}/in.pt", src.read_bytes())
    assert _cli(capsys, "convert", f"{base}/in.pt", f"{base}/o2.{ext}")[0] == 0
    for key in (f"o.{ext}", f"o2.{ext}"):
        got = _get_s3(client, f"{base}/{key}")
        if ext == "pt":  # a .pt records a random serialization id: compare what torch loads
            a, b = torch.load(io.BytesIO(got)), torch.load(local_out)
            assert sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a)
        else:
            assert got == local_out.read_bytes()


def test_sharded_convert_publishes_index_last(s3, tmp_path, capsys):
    base, client = s3
    src = tmp_path / "m.pt"
    torch.save(_sd(4000), src)
    assert _cli(capsys, "convert", str(src), str(tmp_path / "o.safetensors"), "--max-shard-size", "100000")[0] == 0
    code, _out, err = _cli(capsys, "convert", str(src), f"{base}/sh/o.safetensors", "--max-shard-size", "100000", "--stats")
    assert code == 0, err
    local = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("o"))
    assert _keys(client, f"{base}/sh") == local
    for name in local:
        assert _get_s3(client, f"{base}/sh/{name}") == (tmp_path / name).read_bytes()
    # --stats counts the objects the bucket now holds (boto3's listing is the oracle)
    listed = client.list_objects_v2(Bucket=base[5:], Prefix="sh/")["Contents"]
    assert f"{len(listed)} uploads, {sum(o['Size'] for o in listed)} bytes uploaded" in err, err


def _fail_upload(monkeypatch, nth: int) -> None:
    """Make the ``nth`` call of ``remote.upload`` (a shard's upload) fail with a WriteError."""
    real = remote.upload
    calls: list[str] = []

    def failing(local, url):
        calls.append(url)
        if len(calls) == nth:
            raise torchless.core.errors.WriteError("injected upload failure", path=url)
        return real(local, url)

    monkeypatch.setattr(remote, "upload", failing)


def test_failed_sharded_upload_leaves_no_index(s3, tmp_path, monkeypatch):
    """The second shard's upload fails: the index (what a reader opens) never appears,
    and the first shard, already uploaded, is removed."""
    base, client = s3
    sd = {k: v.numpy() for k, v in _sd(4000).items() if v.dtype != torch.bfloat16}
    _fail_upload(monkeypatch, 2)
    with pytest.raises(torchless.core.errors.WriteError):
        torchless.write_tensors(sd.items(), f"{base}/f/o.safetensors", max_shard_size=100000)
    assert _keys(client, f"{base}/f") == []  # no index, and the shard uploaded first was removed


def test_failed_sharded_upload_keeps_what_it_replaced(s3, monkeypatch):
    """A sharded write over an earlier set whose second upload fails: the first shard had
    already replaced its namesake, so it stays (removing it would leave the earlier index
    naming a missing shard); only objects the failed run created are removed."""
    base, client = s3
    sd = {k: v.numpy() for k, v in _sd(4000).items() if v.dtype != torch.bfloat16}
    torchless.write_tensors(sd.items(), f"{base}/r/o.safetensors", max_shard_size=100000)
    before = _keys(client, f"{base}/r")
    assert len(before) >= 3  # shards and the index
    _fail_upload(monkeypatch, 2)
    with pytest.raises(torchless.core.errors.WriteError):
        torchless.write_tensors(sd.items(), f"{base}/r/o.safetensors", max_shard_size=100000)
    assert _keys(client, f"{base}/r") == before  # every shard the index names is still there


def test_failed_existence_check_fails_the_publish_and_removes_nothing(s3, monkeypatch):
    """A sharded write over an earlier set where the store's answer to whether the first
    shard is already there fails (a connection reset, once): the publish fails at that
    shard, naming it and the reason, and removes nothing. Counted as new, that shard
    would have been removed when a later upload of the same publish failed, leaving the
    earlier index naming a missing shard."""
    base, client = s3
    sd = {k: v.numpy() for k, v in _sd(4000).items() if v.dtype != torch.bfloat16}
    torchless.write_tensors(sd.items(), f"{base}/e/o.safetensors", max_shard_size=100000)
    before = _keys(client, f"{base}/e")
    shards = [k for k in before if not k.endswith(".json")]
    assert len(shards) >= 2, before
    first = f"{base}/e/{shards[0]}"
    fs, inner = remote.filesystem(first)
    real, failed = fs.info, []

    def info(path, **kw):
        if path.rstrip("/") == inner and not failed:
            failed.append(path)
            raise ConnectionResetError("injected: connection reset by peer")
        return real(path, **kw)

    monkeypatch.setattr(fs, "info", info)
    _fail_upload(monkeypatch, 2)
    with pytest.raises(torchless.core.errors.WriteError) as ei:
        torchless.write_tensors(sd.items(), f"{base}/e/o.safetensors", max_shard_size=100000)
    assert failed
    assert _keys(client, f"{base}/e") == before  # every shard the earlier index names is still there
    assert ei.value.path == first and "ConnectionResetError" in str(ei.value), str(ei.value)


def test_interrupted_single_write_leaves_nothing(s3):
    base, client = s3

    def items():
        yield "a", np.zeros(1000, np.float32)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        torchless.write_tensors(items(), f"{base}/i/o.safetensors")
    assert _keys(client, f"{base}/i") == []


def test_memory_round_trip_and_storage_options(memfs):
    fs, base = memfs
    arrs = {"x": np.arange(12, dtype=np.float32).reshape(3, 4)}
    with remote.storage_options({}):
        torchless.save(arrs, f"memory://{base}/a.safetensors")
    from safetensors.numpy import load

    assert load(fs.cat(f"{base}/a.safetensors"))["x"].tobytes() == arrs["x"].tobytes()
    with pytest.raises(torchless.core.errors.UsageError), remote.storage_options("nope"):  # type: ignore[arg-type]
        pass


def test_storage_options_flag_reaches_s3fs(s3, tmp_path, capsys, monkeypatch):
    """Without AWS_ENDPOINT_URL the endpoint comes from --storage-options."""
    base, client = s3
    endpoint = os.environ["AWS_ENDPOINT_URL"]
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()
    _put_s3(client, f"{base}/m.pt", _saved(_sd()))
    opts = '{"endpoint_url": "%s"}' % endpoint
    try:
        code, out, err = _cli(capsys, "ls", f"{base}/m.pt", "--storage-options", opts)
        assert code == 0, err
        assert "emb.weight" in out
        assert _cli(capsys, "ls", f"{base}/m.pt", "--storage-options", "[1]")[0] == 2
    finally:
        remote.set_default_options({})


# -- the extra is optional, local paths never pay for it --------------------------------------
def _run_py(code: str, tmp_path) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    src = os.path.join(os.path.dirname(torchless.__file__), os.pardir)
    env["PYTHONPATH"] = os.path.abspath(src) + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)


def test_local_paths_do_not_import_fsspec(tmp_path):
    torch.save({"a": torch.ones(2)}, tmp_path / "l.pt")
    r = _run_py(
        "import sys, torchless\n"
        "assert 'fsspec' not in sys.modules, 'import torchless'\n"
        "from torchless.cli.main import main\n"
        "assert main(['info', 'l.pt']) == 0\n"
        "assert main(['scan', 'l.pt']) == 0\n"
        "assert 'fsspec' not in sys.modules, 'info'\n",
        tmp_path,
    )
    assert r.returncode == 0, r.stderr


def test_url_without_the_extra_names_the_install(tmp_path):
    r = _run_py(
        "import sys\nsys.modules['fsspec'] = None\n"
        "from torchless.cli.main import main\nraise SystemExit(main(['info', 's3://bucket/m.pt']))\n",
        tmp_path,
    )
    assert r.returncode == 2
    assert "pip install 'torchless[remote]'" in r.stderr and "Traceback" not in r.stderr


def test_sharded_safetensors_on_s3_read_back(s3, tmp_path, capsys):
    """A sharded checkpoint (index + shards) on S3 lists, verifies and scans as the local one."""
    base, client = s3
    src = tmp_path / "m.pt"
    torch.save(_sd(4000), src)
    (tmp_path / "hf").mkdir()
    assert _cli(capsys, "convert", str(src), str(tmp_path / "hf" / "o.safetensors"), "--max-shard-size", "100000")[0] == 0
    assert _cli(capsys, "convert", str(src), f"{base}/hf/o.safetensors", "--max-shard-size", "100000")[0] == 0
    local, url = str(tmp_path / "hf"), f"{base}/hf"
    for cmd in (["ls"], ["verify"], ["scan"], ["info", "--json"]):
        for lp, rp in ((local, url), (f"{local}/o.safetensors.index.json", f"{url}/o.safetensors.index.json")):
            c1, o1, _ = _cli(capsys, *cmd, lp)
            c2, o2, err = _cli(capsys, *cmd, rp)
            assert (c1, o1.replace(local, "<p>")) == (c2, o2.replace(url, "<p>")), (cmd, err)
    got = torchless.load(url)
    for k, t in _sd(4000).items():
        assert got[k].numpy().tobytes() == t.contiguous().view(torch.uint8).numpy().tobytes()


def test_storage_options_keyword(s3, tmp_path, monkeypatch):
    """storage_options= on the API reaches the files opened later too (an index's shards)."""
    base, client = s3
    opts = {"endpoint_url": os.environ["AWS_ENDPOINT_URL"]}
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()
    sd = _sd(4000)
    _put_s3(client, f"{base}/m.pt", _saved(sd))
    remote._BY_LOCATION.clear()
    try:
        assert torchless.detect(f"{base}/m.pt", storage_options=opts) == "pt"
        torchless.convert(f"{base}/m.pt", f"{base}/kw/o.safetensors", max_shard_size=100000, storage_options=opts)
        remote.SHARED_BLOCKS.clear()
        got = torchless.load(f"{base}/kw/o.safetensors.index.json", storage_options=opts)
        for k, t in sd.items():
            assert got[k].numpy().tobytes() == t.contiguous().view(torch.uint8).numpy().tobytes()
        with pytest.raises(torchless.core.errors.UsageError):
            torchless.detect(f"{base}/m.pt", storage_options="x")
    finally:
        remote._BY_LOCATION.clear()


def test_http_legacy_pt_reads_its_pickles_not_its_storages(http_root, capsys):
    """A legacy (pre-zip) .pt at a URL: info / ls parse its five pickles from a prefix that
    grows only while a pickle runs past it (here the object pickle of 3,000 tensors is
    larger than the first 64 KiB block), never the 8 MiB storage; a tensor's numpy()
    fetches its storage; a truncated file fails as the local copy does."""
    root, base, handler = http_root
    sd = {f"layer{i}.w": torch.full((2,), float(i)) for i in range(3000)}
    sd["big"] = torch.arange(1 << 21, dtype=torch.float32)
    p = root / "legacy.pt"
    torch.save(sd, str(p), _use_new_zipfile_serialization=False)
    size = os.path.getsize(p)
    for cmd in ("info", "ls"):
        c1, o1, _ = _cli(capsys, cmd, str(p))
        remote.SHARED_BLOCKS.clear()
        handler.sent = 0
        c2, o2, e2 = _cli(capsys, cmd, f"{base}/legacy.pt", "--stats")
        assert (c1, o1.replace(str(p), "<p>")) == (c2, o2.replace(f"{base}/legacy.pt", "<p>")), cmd
        assert c1 == 0
        assert 64 << 10 < handler.sent < min(size // 4, 2 << 20), (cmd, handler.sent, size)
    remote.SHARED_BLOCKS.clear()
    with torchless.open(f"{base}/legacy.pt") as art:
        handler.sent = 0
        assert art["big"].numpy().tobytes() == sd["big"].numpy().tobytes()
        assert (8 << 20) <= handler.sent < (8 << 20) + (1 << 17)  # its storage, not the file
        assert art["layer2999.w"].numpy().tolist() == [2999.0, 2999.0]
    cut = root / "cut.pt"
    cut.write_bytes(p.read_bytes()[:100_000])  # inside the object pickle
    c1, o1, e1 = _cli(capsys, "info", str(cut))
    remote.SHARED_BLOCKS.clear()
    c2, o2, e2 = _cli(capsys, "info", f"{base}/cut.pt")
    assert c1 == c2 == 2 and e1.replace(str(cut), "<p>") == e2.replace(f"{base}/cut.pt", "<p>"), (e1, e2)


def test_legacy_pt_input_limit_counts_each_pickle_not_the_storages(http_root):
    """``Limits.max_input`` bounds each of a legacy .pt's five pickles, not the file: a
    file whose storages are far over the limit (as a legacy checkpoint over 4 GiB is over
    the default one) loads with torch's tensors, from a path and over HTTP ranges; a file
    whose object pickle is over the limit is refused alike both ways, naming the file,
    the pickle and its offset."""
    from torchless.core.errors import LimitError
    from torchless.pickle.machine import Limits

    root, base, handler = http_root
    limit = 16 << 10
    g = torch.Generator().manual_seed(4)
    sd = {"w": torch.randn(256, 256, generator=g), "i": torch.arange(3000, dtype=torch.int64), "h": torch.ones(7).half()}
    p = root / "storages.pt"
    torch.save(sd, str(p), _use_new_zipfile_serialization=False)
    assert os.path.getsize(p) > 16 * limit  # the storages: the pickles are a few hundred bytes
    want = torch.load(str(p), weights_only=True)
    for where in (str(p), f"{base}/storages.pt"):
        remote.SHARED_BLOCKS.clear()
        got = torchless.load(where, limits=Limits(max_input=limit))
        assert sorted(got) == sorted(want), where
        for k, t in want.items():
            assert got[k].dtype.name == str(t.dtype).removeprefix("torch."), (where, k)
            assert tuple(got[k].shape) == tuple(t.shape), (where, k)
            assert got[k].numpy().tobytes() == t.numpy().tobytes(), (where, k)

    big = {f"layer{i}.weight": torch.full((1,), float(i)) for i in range(2000)}  # a 100 KiB object pickle
    q = root / "pickle.pt"
    torch.save(big, str(q), _use_new_zipfile_serialization=False)
    assert len(torch.load(str(q), weights_only=True)) == 2000
    errors = []
    for where in (str(q), f"{base}/pickle.pt"):
        remote.SHARED_BLOCKS.clear()
        with pytest.raises(LimitError) as ei:
            torchless.load(where, limits=Limits(max_input=limit))
        e = ei.value
        assert e.path == where and e.member == "object" and e.offset is not None and e.offset > 0, (where, str(e))
        errors.append(str(e).replace(where, "<p>"))
    assert errors[0] == errors[1], errors
    assert "pickle is larger than the configured limit" in errors[0]


def test_remote_legacy_pt_agrees_with_local_on_limits_globals_and_truncation(memfs):
    """The growing prefix of a remote legacy .pt changes nothing but what is fetched: the
    input limit applies to each pickle as locally, the globals seen are those of one parse,
    and a file cut inside its storages fails as locally after fetching its pickles and
    the storage table's ends, not the file 1.3 times over."""
    from torchless.core.errors import LimitError, TorchlessError, TruncatedError
    from torchless.formats.pt.read import make_resolver, read_legacy_stream
    from torchless.io.source import BytesSource, RemoteSource
    from torchless.pickle.machine import Limits

    fs, base = memfs
    sd = {f"layer{i}.w": torch.full((2,), float(i)) for i in range(3000)}
    sd["big"] = torch.zeros(1 << 22)
    b = io.BytesIO()
    torch.save(sd, b, _use_new_zipfile_serialization=False)
    data = b.getvalue()
    fs.pipe(f"{base}/l.pt", data)
    fs.pipe(f"{base}/cut.pt", data[:-100])
    url = f"memory://{base}"

    def both(src_name: str, payload: bytes, **kw):
        out = []
        for src in (BytesSource(payload, "x"), RemoteSource(f"{url}/{src_name}")):
            r = make_resolver(True)
            try:
                cp = read_legacy_stream(src, weights_only=True, resolver=r, **kw)
                out.append(("ok", len(r.seen), len(cp.globals_seen)))
            except TorchlessError as e:
                out.append((type(e).__name__, e.message))
        return out

    local, remote_ = both("l.pt", data)
    assert local == remote_ and local[0] == "ok"
    # the limit bounds each pickle, not the file: the storages do not count, the object
    # pickle does (its size as CPython's pickletools walks it)
    stream = io.BytesIO(data)
    spans = []
    for _ in range(4):
        at = stream.tell()
        for _op in pickletools.genops(stream):
            pass
        spans.append(stream.tell() - at)
    assert spans[3] > 1 << 16 and max(spans) == spans[3], spans
    local, remote_ = both("l.pt", data, limits=Limits(max_input=spans[3]))
    assert local == remote_ and local[0] == "ok"
    local, remote_ = both("l.pt", data, limits=Limits(max_input=spans[3] - 1))
    assert local == remote_ and local[0] == LimitError.__name__
    remote.SHARED_BLOCKS.clear()
    remote.STATS.reset()
    local, remote_ = both("cut.pt", data[:-100])
    assert local == remote_ and local[0] == TruncatedError.__name__
    assert remote.STATS.bytes_fetched < len(data) // 4, remote.STATS.bytes_fetched
