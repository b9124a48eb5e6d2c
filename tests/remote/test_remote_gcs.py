"""``gs://`` URLs through gcsfs, against a Google Cloud Storage emulator on 127.0.0.1
(``gcp-storage-emulator``, in memory; see tests/remote/gcs.py for what it implements and
what the handler stands in for). Not the real service: the machine the tests run on has
no network.

Oracles: the local copy of each file (the CLI prints the same; convert, reshard and
consolidate write the same bytes as they do locally), torch (what it saved, what its
own DCP reader loads), safetensors, what the emulator holds (read from its store, not
through gcsfs) and the emulator's own count of the bytes it sent.
"""

from __future__ import annotations

import importlib
import io
import os
import re
import threading
import uuid
import warnings

import pytest
from tl_testutil import assert_same_state, small_dcp_state, torch_dcp_load

import torchless
import torchless.dcp
from torchless.io import remote

from .test_remote import _cli

torch = pytest.importorskip("torch", reason="torch is the oracle of these tests")
fsspec = pytest.importorskip("fsspec", reason="the remote extra (fsspec) is not installed")
pytest.importorskip("gcsfs", reason="the remote extra (gcsfs) is not installed")
pytest.importorskip("gcp_storage_emulator", reason="gcp-storage-emulator (the test extra) is not installed")
st = pytest.importorskip("safetensors.torch", reason="safetensors writes the oracle files")

from .gcs import Emulator, plain_gcsfs  # noqa: E402 - after the skips: it needs the emulator

MiB = 1 << 20


@pytest.fixture(scope="module")
def emulator():
    with Emulator() as e:
        yield e


@pytest.fixture
def gcs(emulator, monkeypatch):
    """A fresh bucket on the emulator; yields ``(gs://bucket URL, emulator)``. gcsfs
    finds the emulator through ``STORAGE_EMULATOR_HOST``, as it would any emulator."""
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", emulator.endpoint)
    monkeypatch.setenv("NO_GCE_CHECK", "true")  # no probe of a GCE metadata server
    monkeypatch.setenv("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")  # (read when gcsfs is imported)
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
    cls = plain_gcsfs()
    registered = importlib.import_module("fsspec.registry")._registry  # what register_implementation fills
    for proto in ("gs", "gcs"):
        monkeypatch.setitem(registered, proto, cls)
    cls.clear_instance_cache()
    bucket = "tl-" + uuid.uuid4().hex[:12]
    emulator.create_bucket(bucket)
    emulator.traffic.reset()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "GCS project not set")
        yield f"gs://{bucket}", emulator
    emulator.traffic.release()
    errors, emulator.traffic.errors = emulator.traffic.errors, []
    assert not errors, errors  # the emulator's handlers raised


def _fresh() -> None:
    """Forget gcsfs's listings (the test wrote the bucket behind its back)."""
    plain_gcsfs().clear_instance_cache()
    remote.SHARED_BLOCKS.clear()


def _sd(seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {
        "big": torch.randn(3 << 18, generator=g),  # 3 MiB
        "emb.weight": torch.randn(300, 16, generator=g),
        "fc.bias": torch.arange(7, dtype=torch.int64),
        "half": torch.randn(5, 3, generator=g).to(torch.bfloat16),
    }


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """``(folder, state)``: m.pt (torch.save) and m.safetensors (safetensors) of one state."""
    d = tmp_path_factory.mktemp("gcsfiles")
    sd = _sd()
    torch.save(sd, d / "m.pt")
    st.save_file(sd, str(d / "m.safetensors"), metadata={"format": "pt"})
    return d, sd


def _same_pt(data: bytes, want) -> None:
    """A .pt records a random serialization id: compare what torch loads."""
    a = torch.load(io.BytesIO(data))
    b = want if isinstance(want, dict) else torch.load(want)
    assert sorted(a) == sorted(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k


# -- reading ---------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["m.pt", "m.safetensors"])
def test_cli_matches_local(gcs, files, capsys, name):
    """info / ls / verify / scan (text and JSON) of a gs:// object print what they print
    for the local file; diff finds nothing between them."""
    base, emu = gcs
    d, sd = files
    local, url = str(d / name), f"{base}/x/{name}"
    emu.put(url, (d / name).read_bytes())
    for cmd in (["info"], ["ls"], ["verify"], ["scan"], ["info", "--json"], ["ls", "--json"], ["scan", "--json"]):
        c1, o1, e1 = _cli(capsys, *cmd, local)
        c2, o2, e2 = _cli(capsys, *cmd, url)
        assert c1 == 0, (cmd, e1)
        o1, o2 = (re.sub(r'"seconds": [-0-9.e]+', "", o) for o in (o1.replace(local, "<p>"), o2.replace(url, "<p>")))
        assert (c1, o1) == (c2, o2), (cmd, e2)
    code, out, err = _cli(capsys, "diff", local, url)
    assert code == 0 and "0 changed" in out, err
    # and the tensors read through the API are torch's, bit for bit
    got = torchless.load(url)
    for k, t in sd.items():
        assert got[k].numpy().tobytes() == t.contiguous().view(torch.uint8).numpy().tobytes(), k


def test_info_ls_scan_fetch_metadata_only(gcs, tmp_path, capsys):
    """info / ls / scan of a .pt with an 8 MiB tensor fetch a small part of it, by the
    emulator's count of the bytes it sent (which --stats reports too); the same whatever
    the payload size."""
    base, emu = gcs
    sent = {}
    for n in (2 * MiB, 8 * MiB):
        g = torch.Generator().manual_seed(1)
        path = tmp_path / f"m{n}.pt"
        torch.save({"w": torch.randn(n // 4, generator=g), "b": torch.ones(3)}, path)
        emu.put(f"{base}/m{n}.pt", path.read_bytes())
        for cmd in ("info", "ls", "scan"):
            emu.traffic.reset()
            code, out, err = _cli(capsys, cmd, f"{base}/m{n}.pt", "--stats")
            assert code == 0, err
            sent[(cmd, n)] = emu.traffic.sent
            assert f"{emu.traffic.sent} bytes fetched" in err, err
            assert emu.traffic.sent < min(1 << 18, path.stat().st_size // 8), (cmd, emu.traffic.sent)
    for cmd in ("info", "ls", "scan"):  # blocks of 64 KiB: the same but for a partial last one
        assert abs(sent[(cmd, 2 * MiB)] - sent[(cmd, 8 * MiB)]) < 1 << 16, sent


def test_tensor_reads_its_range(gcs, tmp_path):
    base, emu = gcs
    g = torch.Generator().manual_seed(2)
    sd = {"a": torch.randn(1 << 18, generator=g), "b": torch.randn(1 << 18, generator=g), "c": torch.arange(10)}
    torch.save(sd, tmp_path / "m.pt")
    emu.put(f"{base}/m.pt", (tmp_path / "m.pt").read_bytes())
    _fresh()
    with torchless.open(f"{base}/m.pt") as art:
        emu.traffic.reset()
        assert art["b"].numpy().tobytes() == sd["b"].numpy().tobytes()
        # b's 1 MiB storage (and the block of its zip record), not a nor the file
        log = emu.traffic.log
        assert MiB <= emu.traffic.sent < MiB + (1 << 17), (emu.traffic.sent, log)
        assert all(r[3] for r in log if r[1].startswith("/download/")), log  # every download a range


def test_missing_object_is_one_line(gcs, capsys):
    base, _emu = gcs
    code, out, err = _cli(capsys, "info", f"{base}/nope.pt")
    assert code == 2 and "no such file" in err and err.count("\n") == 1, err


# -- writing ---------------------------------------------------------------------------------
@pytest.mark.parametrize("ext", ["safetensors", "pt"])
def test_convert_to_and_from_gcs(gcs, files, tmp_path, capsys, ext):
    """convert local -> gs://, gs:// -> gs:// and gs:// -> local write what the local
    convert writes (a .pt: what torch loads from it). The outputs are over 3 MiB and
    the 3 MiB tensor makes the .pt and safetensors of the doubled state over 5 MiB:
    gcsfs's resumable upload, not only its one-request upload."""
    base, emu = gcs
    d, sd = files
    big = {**sd, "big2": sd["big"] * 2}
    src = tmp_path / "src.pt"
    torch.save(big, src)
    want = tmp_path / f"want.{ext}"
    assert _cli(capsys, "convert", str(src), str(want))[0] == 0
    assert want.stat().st_size > 5 * MiB
    emu.put(f"{base}/in/src.pt", src.read_bytes())
    code, _, err = _cli(capsys, "convert", str(src), f"{base}/out/a.{ext}", "--stats")
    assert code == 0, err
    code, _, err = _cli(capsys, "convert", f"{base}/in/src.pt", f"{base}/out/b.{ext}")
    assert code == 0, err
    code, _, err = _cli(capsys, "convert", f"{base}/out/b.{ext}", str(tmp_path / f"back.{ext}"))
    assert code == 0, err
    assert emu.keys(f"{base}/out") == [f"a.{ext}", f"b.{ext}"]  # nothing else (no temporary names)
    assert any("upload_id=" in r[2] for r in emu.traffic.log)  # a resumable upload session
    outs = [emu.get(f"{base}/out/a.{ext}"), emu.get(f"{base}/out/b.{ext}"), (tmp_path / f"back.{ext}").read_bytes()]
    for data in outs:
        if ext == "pt":
            _same_pt(data, big)
        else:
            assert data == want.read_bytes()
    # and a small one (one request: a multipart upload)
    code, _, err = _cli(capsys, "convert", str(d / "m.safetensors"), f"{base}/small/m.{ext}")
    assert code == 0, err
    if ext == "pt":
        _same_pt(emu.get(f"{base}/small/m.{ext}"), sd)
    else:
        assert emu.get(f"{base}/small/m.{ext}") == (d / "m.safetensors").read_bytes()


def test_sharded_convert_publishes_index_last(gcs, files, tmp_path, capsys):
    base, emu = gcs
    d, sd = files
    out = tmp_path / "sh"
    out.mkdir()
    assert _cli(capsys, "convert", str(d / "m.pt"), str(out / "o.safetensors"), "--max-shard-size", "1MB")[0] == 0
    code, _, err = _cli(capsys, "convert", str(d / "m.pt"), f"{base}/sh/o.safetensors", "--max-shard-size", "1MB")
    assert code == 0, err
    names = sorted(os.listdir(out))
    assert len(names) >= 3 and emu.keys(f"{base}/sh") == names
    for n in names:
        assert emu.get(f"{base}/sh/{n}") == (out / n).read_bytes(), n
    assert emu.traffic.created[-1] == f"{base}/sh/o.safetensors.index.json", emu.traffic.created  # the index: last
    assert sorted(emu.traffic.created) == [f"{base}/sh/{n}" for n in names]  # each object once
    # the sharded checkpoint reads back as the local one
    for cmd in (["ls"], ["verify"], ["info", "--json"]):
        c1, o1, _ = _cli(capsys, *cmd, str(out))
        c2, o2, err = _cli(capsys, *cmd, f"{base}/sh")
        assert (c1, o1.replace(str(out), "<p>")) == (c2, o2.replace(f"{base}/sh", "<p>")), (cmd, err)


# -- DCP -------------------------------------------------------------------------------------
def _dcp():
    """torch's distributed checkpoint (the DCP tests' oracle), or a skip."""
    return pytest.importorskip("torch.distributed.checkpoint", reason="torch without distributed checkpoint")


def _fsspec_reader():
    _dcp()
    mod = pytest.importorskip("torch.distributed.checkpoint._fsspec_filesystem", reason="torch without the fsspec DCP backend")
    return mod.FsspecReader


def test_dcp_reshard_and_consolidate_on_gcs(gcs, tmp_path, capsys):
    """A DCP checkpoint written by torch (locally), uploaded: ls fetches .metadata only;
    resharded gs:// -> gs:// (1 -> 3 -> 2 ranks) and consolidated gs:// -> gs://, each
    bit-exact with the same command on the local copy; torch loads the results (its
    own FsspecReader on gs://, safetensors for the consolidated file)."""
    base, emu = gcs
    FsspecReader = _fsspec_reader()  # noqa: N806 - torch's class

    sd = small_dcp_state(5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _dcp().save(sd, checkpoint_id=str(tmp_path / "t"), no_dist=True)
    for n in sorted(os.listdir(tmp_path / "t")):
        emu.put(f"{base}/t/{n}", (tmp_path / "t" / n).read_bytes())
    meta = len(emu.get(f"{base}/t/.metadata"))
    for cmd in ("ls", "info"):
        c1, o1, _ = _cli(capsys, cmd, str(tmp_path / "t"))
        emu.traffic.reset()
        c2, o2, err = _cli(capsys, cmd, f"{base}/t", "--stats")
        assert c1 == c2 == 0, err
        assert o1.replace(str(tmp_path / "t"), "<p>") == o2.replace(f"{base}/t", "<p>")
        assert emu.traffic.sent == meta and f"{meta} bytes fetched" in err, err

    steps = [("t", "r3", ["reshard", "--ranks", "3"]), ("r3", "r2", ["reshard", "--ranks", "2"])]
    for src, dst, cmd in steps:
        assert _cli(capsys, cmd[0], str(tmp_path / src), str(tmp_path / dst), *cmd[1:])[0] == 0
        code, _, err = _cli(capsys, cmd[0], f"{base}/{src}", f"{base}/{dst}", *cmd[1:])
        assert code == 0, err
        assert emu.keys(f"{base}/{dst}") == sorted(os.listdir(tmp_path / dst))
        for n in os.listdir(tmp_path / dst):
            if n != ".metadata":
                assert emu.get(f"{base}/{dst}/{n}") == (tmp_path / dst / n).read_bytes(), n
        _fresh()
        assert_same_state(torch_dcp_load(sd, FsspecReader(f"{base}/{dst}")), sd)

    assert _cli(capsys, "convert", str(tmp_path / "r2"), str(tmp_path / "c.safetensors"))[0] == 0
    code, _, err = _cli(capsys, "convert", f"{base}/r2", f"{base}/c.safetensors")
    assert code == 0, err
    data = emu.get(f"{base}/c.safetensors")
    assert data == (tmp_path / "c.safetensors").read_bytes()
    got = st.load(data)
    for k, v in sd.items():
        if isinstance(v, torch.Tensor):
            assert got[k].dtype == v.dtype and torch.equal(got[k], v), k
    code, out, _ = _cli(capsys, "diff", f"{base}/r2", str(tmp_path / "t"))
    assert code == 0 and "0 changed" in out


def test_range_tasks_reshard_to_gcs(gcs, tmp_path, capsys):
    """A reshard in range tasks of 3 MiB (part objects under a staging prefix, joined by
    a worker, moved into place) writes what the local reshard writes, .metadata last,
    and leaves no staging object; torch loads it."""
    base, emu = gcs
    FsspecReader = _fsspec_reader()  # noqa: N806 - torch's class

    g = torch.Generator().manual_seed(6)
    sd = {"w": torch.randn(1024, 2048, generator=g), "b": torch.arange(10.0), "step": 3}
    torch.save(sd, tmp_path / "src.pt")
    torchless.dcp.reshard(tmp_path / "src.pt", tmp_path / "want", 2)
    code, out, err = _cli(capsys, "reshard", str(tmp_path / "src.pt"), f"{base}/r2", "--ranks", "2", "--max-task-bytes", "3MiB")
    assert code == 0, err
    names = sorted(os.listdir(tmp_path / "want"))
    assert emu.keys(f"{base}/r2") == names  # no staging left
    for n in names:
        if n != ".metadata":
            assert emu.get(f"{base}/r2/{n}") == (tmp_path / "want" / n).read_bytes(), n
    final = [u for u in emu.traffic.created if "/.torchless-staging-" not in u]
    assert final[-1] == f"{base}/r2/.metadata" and len(final) == len(names), final
    assert sum("/parts/" in u for u in emu.traffic.created) >= 4  # it did run in range tasks
    _fresh()
    assert_same_state(torch_dcp_load(sd, FsspecReader(f"{base}/r2")), sd)


# -- atomic writes ---------------------------------------------------------------------------
def _in_thread(fn, *a):
    box: dict = {}

    def run():
        try:
            box["result"] = fn(*a)
        except BaseException as e:  # noqa: BLE001 - handed to the test
            box["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, box


def _upload_request(req) -> bool:
    """The request that completes an object: a one-request (multipart) upload, or a
    chunk of a resumable upload session (gcsfs sends those with POST)."""
    m, p, q, _r = req
    return p.startswith("/upload/") and ("uploadType=multipart" in q or "upload_id=" in q)


@pytest.mark.parametrize("size", [1 * MiB, 6 * MiB])
@pytest.mark.parametrize("fail", [False, True])
def test_single_object_appears_whole_or_not_at_all(gcs, tmp_path, size, fail):
    """convert to gs:// is held in the emulator at the request that completes the object
    (one multipart upload under 5 MiB, the resumable session's chunk above): until then
    nothing is at the destination. Failed there (403): WriteError, no object, no
    resumable session left open; let through: the object, whole."""
    base, emu = gcs
    torch.save({"w": torch.arange(size // 4, dtype=torch.float32)}, tmp_path / "m.pt")
    torchless.convert(str(tmp_path / "m.pt"), str(tmp_path / "want.safetensors"))
    url = f"{base}/a/m.safetensors"
    emu.traffic.hold(_upload_request)
    t, box = _in_thread(torchless.convert, str(tmp_path / "m.pt"), url)
    assert emu.traffic.hit.wait(60)
    assert emu.keys(f"{base}/a") == []  # in flight: nothing there yet
    emu.traffic.release(fail=fail)
    t.join(60)
    assert not t.is_alive()
    if fail:
        assert isinstance(box.get("error"), torchless.core.errors.WriteError), box
        assert emu.keys(f"{base}/a") == []
    else:
        assert "error" not in box, box
        assert emu.get(url) == (tmp_path / "want.safetensors").read_bytes()
    assert emu.uploads() == {}  # a failed resumable session was cancelled
    if size > 5 * MiB:
        assert any(r[0] == "POST" and "uploadType=resumable" in r[2] for r in emu.traffic.log)


def test_failed_sharded_upload_leaves_no_index(gcs, files, tmp_path):
    """The second shard's upload fails in the emulator: no index (what a reader opens)
    appears, and the shard uploaded before is removed."""
    base, emu = gcs
    d, sd = files
    seen = []

    def second_upload(req):
        if _upload_request(req):
            seen.append(req)
        return len(seen) == 2

    emu.traffic.hold(second_upload)
    t, box = _in_thread(lambda: torchless.convert(str(d / "m.pt"), f"{base}/f/o.safetensors", max_shard_size="1MB"))
    assert emu.traffic.hit.wait(60)
    emu.traffic.release(fail=True)
    t.join(60)
    assert isinstance(box.get("error"), torchless.core.errors.WriteError), box
    assert emu.keys(f"{base}/f") == [], emu.traffic.log
    assert not any("index.json" in u for u in emu.traffic.created)


def test_interrupted_write_leaves_nothing(gcs):
    base, emu = gcs
    import numpy as np

    def items():
        yield "a", np.zeros(1000, np.float32)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        torchless.write_tensors(items(), f"{base}/i/o.safetensors")
    assert emu.keys(f"{base}/i") == []
    assert not any(r[1].startswith("/upload/") for r in emu.traffic.log)


def test_failed_reshard_publishes_no_metadata(gcs, tmp_path):
    """A rank file's upload fails: .metadata never appears, the rank file uploaded
    before is removed."""
    base, emu = gcs
    sd = small_dcp_state(5)
    torch.save(sd, tmp_path / "src.pt")
    seen = []

    def second_upload(req):
        if _upload_request(req):
            seen.append(req)
        return len(seen) == 2

    emu.traffic.hold(second_upload)
    t, box = _in_thread(torchless.dcp.reshard, str(tmp_path / "src.pt"), f"{base}/bad", 3)
    assert emu.traffic.hit.wait(60)
    emu.traffic.release(fail=True)
    t.join(60)
    assert isinstance(box.get("error"), torchless.core.errors.WriteError), box
    assert emu.keys(f"{base}/bad") == []
    assert not any(".metadata" in u for u in emu.traffic.created)
