"""The other formats at URLs: TorchScript (.pt, .ptl), ExportedProgram .pt2, AOTInductor
packages, ONNX with external data, Hugging Face sharded checkpoints and DCP in the
Hugging Face layout, on ``memory://``, an HTTP range server and moto's S3 server.

Every command prints what it prints for the local copy (the local result is the
reference; torch, onnx and safetensors wrote the artifacts and are the oracles of the
tensor bytes), and info / ls / scan fetch a bounded number of bytes (``--stats``'s
counters; the HTTP server's own count agrees with them). What cannot work remotely (the
inductor cache, a folder listing over plain HTTP) is one UsageError line.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

import torchless
import torchless.dcp
from torchless.io import remote

from .test_remote import _cli, _stats

torch = pytest.importorskip("torch", reason="torch writes the artifacts (the oracle)")

BACKENDS = ("memory", "http", "s3")


class _Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.big = torch.nn.Linear(1024, 1024)  # 4 MiB of weights: what info/ls/scan must not fetch
        self.head = torch.nn.Linear(1024, 8)

    def forward(self, x):  # noqa: ANN001, ANN201
        return self.head(self.big(x).relu())


def _onnx_model(folder: Path, location: str) -> Path:
    """A MatMul model whose 4 MiB initializer lies in external data file ``location``."""
    onnx = pytest.importorskip("onnx", reason="onnx writes the model (the oracle)")
    from onnx import TensorProto, helper, numpy_helper

    w = np.random.default_rng(0).standard_normal((1024, 1024)).astype(np.float32)
    b = np.arange(1024, dtype=np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y0"]), helper.make_node("Add", ["y0", "b"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1024])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1024])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = folder / "model.onnx"
    onnx.save_model(
        model, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location=location, size_threshold=0
    )
    return path


@pytest.fixture(scope="module")
def arts(tmp_path_factory) -> dict[str, Path]:
    """The artifacts, written once: name -> local file or folder."""
    d = tmp_path_factory.mktemp("arts")
    out: dict[str, Path] = {}
    torch.manual_seed(0)
    m = _Model().eval()
    for sub in (
        "ts",
        "lite",
        "ep",
        "aoti",
        "aoti_so",
        "aoti_pw",
        "legacy",
        "package",
    ):  # one folder each: a copy takes the folder
        (d / sub).mkdir()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.jit.script(m).save(str(d / "ts" / "ts.pt"))
        torch.jit.script(m)._save_for_lite_interpreter(str(d / "lite" / "ts.ptl"))
        torch.export.save(torch.export.export(m, (torch.randn(2, 1024),)), str(d / "ep" / "ep.pt2"))
    out.update({"torchscript": d / "ts" / "ts.pt", "lite": d / "lite" / "ts.ptl", "pt2": d / "ep" / "ep.pt2"})
    # a legacy (pre-zip) .pt: five pickles, then the storages
    torch.save(m.state_dict(), str(d / "legacy" / "legacy.pt"), _use_new_zipfile_serialization=False)
    out["legacy"] = d / "legacy" / "legacy.pt"
    from torch.package import PackageExporter

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with PackageExporter(str(d / "package" / "pkg.pt")) as exp:
            exp.save_pickle("model", "state.pkl", m.state_dict())
    out["package"] = d / "package" / "pkg.pt"
    # AOTInductor: synthetic packages (compiling one needs a C++ compiler and minutes)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from formats.aoti.synth import make_package, sample_consts

    consts = sample_consts()
    consts["big"] = np.arange(1 << 20, dtype=np.float32)
    out["aoti"] = make_package(d / "aoti" / "aoti.pt2", consts, layout="binary_blob")
    out["aoti_so"] = make_package(d / "aoti_so" / "aoti_so.pt2", consts, layout="embedded")
    out["aoti_pw"] = make_package(d / "aoti_pw" / "aoti_pw.pt2", consts, layout="pickle_weights")
    # ONNX with its external data in a subfolder (a location with '/')
    (d / "onnx" / "data").mkdir(parents=True)
    out["onnx"] = _onnx_model(d / "onnx", "data/weights.bin")
    # a Hugging Face sharded checkpoint: safetensors' writer, transformers' names
    st = pytest.importorskip("safetensors.torch", reason="safetensors writes the shards (the oracle)")
    hf = d / "hf"
    hf.mkdir()
    sd = {
        "big.weight": m.big.weight.detach().clone(),
        "big.bias": m.big.bias.detach().clone(),
        "head.weight": m.head.weight.detach().clone(),
    }
    st.save_file({"big.weight": sd["big.weight"]}, str(hf / "model-00001-of-00002.safetensors"), metadata={"format": "pt"})
    st.save_file(
        {k: sd[k] for k in ("big.bias", "head.weight")}, str(hf / "model-00002-of-00002.safetensors"), metadata={"format": "pt"}
    )
    wm = {
        "big.weight": "model-00001-of-00002.safetensors",
        "big.bias": "model-00002-of-00002.safetensors",
        "head.weight": "model-00002-of-00002.safetensors",
    }
    (hf / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": sum(v.nbytes for v in sd.values())}, "weight_map": wm})
    )
    out["hf"] = hf / "model.safetensors.index.json"
    # DCP in the Hugging Face layout: torch's HuggingFaceStorageWriter, one file per rank
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import HuggingFaceStorageWriter

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(sd, storage_writer=HuggingFaceStorageWriter(str(d / "hfdcp"), save_distributed=True))
    out["hfdcp"] = d / "hfdcp"
    with warnings.catch_warnings():  # DCP in torch's own layout: .metadata + .distcp files
        warnings.simplefilter("ignore")
        dcp.save(sd, checkpoint_id=str(d / "dcp"))
    out["dcp"] = d / "dcp"
    # the plain files: torch.save's zip, safetensors, a compressed npz (deflated members)
    for sub in ("pt", "st", "npz"):
        (d / sub).mkdir()
    torch.save(m.state_dict(), str(d / "pt" / "m.pt"))
    st.save_file(sd, str(d / "st" / "m.safetensors"))
    np.savez_compressed(str(d / "npz" / "m.npz"), **{k: v.numpy() for k, v in sd.items()})
    out.update({"pt": d / "pt" / "m.pt", "safetensors": d / "st" / "m.safetensors", "npz": d / "npz" / "m.npz"})
    return out


def _size(p: Path) -> int:
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file()) if p.is_dir() else p.stat().st_size


@pytest.fixture
def place(request, tmp_path):
    """``place(local, backend) -> (url, base)``: a copy of file or folder ``local`` (its
    folder's files beside it: ONNX external data, an index's shards) at a URL."""

    def put(local: Path, backend: str) -> tuple[str, str, object]:
        folder = local if local.is_dir() else local.parent
        files = [f for f in folder.rglob("*") if f.is_file()]
        tail = local.name + ("/" if local.is_dir() else "")
        if backend == "memory":
            fs, base = request.getfixturevalue("memfs")
            for f in files:
                fs.pipe(f"{base}/{folder.name}/{f.relative_to(folder).as_posix()}", f.read_bytes())
            return f"memory://{base}/{folder.name}/" + (tail if not local.is_dir() else ""), f"memory://{base}", None
        if backend == "http":
            root, url, handler = request.getfixturevalue("http_root")
            shutil.copytree(folder, root / folder.name)
            return f"{url}/{folder.name}/" + (tail if not local.is_dir() else ""), url, handler
        base, client = request.getfixturevalue("s3")
        bucket = base[5:]
        for f in files:
            client.put_object(Bucket=bucket, Key=f"{folder.name}/{f.relative_to(folder).as_posix()}", Body=f.read_bytes())
        return f"{base}/{folder.name}/" + (tail if not local.is_dir() else ""), base, None

    return put


def _same(capsys, local: str, url: str, *cmd: str) -> tuple[int, int, str]:
    """Run ``cmd`` on both; assert the same exit code and output; the bytes the remote run
    fetched."""
    c1, o1, e1 = _cli(capsys, *cmd, local)
    c2, o2, e2 = _cli(capsys, *cmd, url)
    fetched = remote.STATS.bytes_fetched

    def shown(text: str, p: str) -> str:  # the path as given, then its folder (files named in it)
        folder = p if p.endswith("/") or os.path.isdir(p) else p.rsplit("/", 1)[0]
        for s in (p, p.rstrip("/"), folder.rstrip("/")):
            text = text.replace(s, "<p>")
        return text

    assert c1 == c2, (cmd, e1, e2)
    assert shown(o1, local) == shown(o2, url), (cmd, e2)
    assert "Traceback" not in e2
    return c2, fetched, e2


# name -> the commands that fetch a bounded part (< 1/4 of the bytes and < 1 MiB)
ALL = ("info", "ls", "scan")
FILES = {
    "torchscript": ALL,
    "lite": ALL,
    "pt2": ALL,
    # binary_blob layout: info / ls read the wrapper source and metadata, not the blob;
    # scan analyses every member that is not a tensor storage, the blob included
    "aoti": ("info", "ls"),
    "aoti_pw": ("info", "ls"),  # pickle_weights: each weight file's zip directory and pickle
    # embedded: the constants lie inside the shared object, whose header, section table
    # and symbol tables info / ls read by ranges; scan analyses it whole, as native code
    "aoti_so": ("info", "ls"),
    "package": ("info", "ls"),  # torch.package: scan analyses its storage records too
    # one stream: its five pickles first (parsed from a prefix that grows only while a
    # pickle runs past it), then the storages; scan analyses its first 4 MiB window
    "legacy": ("info", "ls"),
    "onnx": ALL,  # the protobuf, not the external data
    "hf": ALL,  # the index and the shards' headers
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", sorted(FILES))
def test_cli_matches_local_and_fetch_is_bounded(arts, place, capsys, backend, name):
    local = arts[name]
    url, _base, handler = place(local, backend)
    total = _size(local.parent)
    for cmd in (["info"], ["ls"], ["scan"], ["info", "--json"], ["ls", "--json"]):
        if handler is not None:
            handler.sent = 0
        code, fetched, err = _same(capsys, str(local), url, *cmd)
        assert code in (0, 1), err
        if handler is not None:  # --stats's counter is what the server sent
            assert fetched == handler.sent, cmd
        if cmd[0] in FILES[name]:
            assert 0 < fetched < min(total // 4, 1 << 20), (cmd, fetched, total)
        else:  # whatever is read, every byte is fetched once (but for two 64 KiB blocks)
            assert fetched <= total + (1 << 17), (cmd, fetched, total)
    code, fetched, err = _same(capsys, str(local), url, "verify")
    assert code == 0, err
    assert fetched >= (4 << 20), (fetched, total)  # every byte is checked (the 4 MiB of weights included)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "name", ["torchscript", "lite", "pt2", "legacy", "package", "aoti", "aoti_so", "aoti_pw", "onnx", "hf", "hfdcp"]
)
def test_convert_from_url_is_bit_exact(arts, place, tmp_path, capsys, backend, name):
    local = arts[name]
    if backend == "http" and name == "hfdcp":
        pytest.skip("a folder cannot be listed over plain HTTP: test_hf_dcp_over_http_is_refused")
    url, _base, _h = place(local, backend)
    want, got = tmp_path / "local.safetensors", tmp_path / "remote.safetensors"
    c1, _, e1 = _cli(capsys, "convert", str(local), str(want))
    c2, _, e2 = _cli(capsys, "convert", url, str(got))
    assert c1 == c2 == 0, (e1, e2)
    assert got.read_bytes() == want.read_bytes()


@pytest.mark.parametrize("backend", ["memory", "s3"])
def test_hf_dcp_layout_matches_local(arts, place, capsys, backend):
    """DCP in the Hugging Face layout (torch's HuggingFaceStorageWriter): the folder is
    listed, then each file's safetensors header is read by ranges."""
    local = arts["hfdcp"]
    url, _base, _h = place(local, backend)
    for cmd in (["info"], ["ls"], ["info", "--json"]):
        code, fetched, err = _same(capsys, str(local), url, *cmd)
        assert code == 0, err
        assert 0 < fetched <= 1 << 16, (cmd, fetched)  # headers only (one 64 KiB block), not the 4 MiB payload
    assert _same(capsys, str(local), url, "verify")[0] == 0
    got = torchless.dcp.load(url, materialize=True)
    torch.manual_seed(0)  # the oracle: the model the checkpoint was written from
    m = _Model()
    for k, t in (("big.weight", m.big.weight), ("big.bias", m.big.bias), ("head.weight", m.head.weight)):
        assert np.asarray(got[k]).tobytes() == t.detach().numpy().tobytes(), k


def test_hf_dcp_over_http_is_refused(arts, place, capsys):
    """Plain HTTP cannot list a folder: a DCP checkpoint in the Hugging Face layout (no
    ``.metadata`` to fetch by name) is one clear error, not a traceback."""
    url, _base, _h = place(arts["hfdcp"], "http")
    code, out, err = _cli(capsys, "info", url)
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert "does not list folders" in err


@pytest.mark.parametrize("backend", BACKENDS)
def test_onnx_external_data_by_range(arts, place, backend):
    """A tensor's numpy() fetches its range of the external data file; the bytes are what
    onnx loads (the oracle)."""
    onnx = pytest.importorskip("onnx")
    from onnx import numpy_helper

    local = arts["onnx"]
    url, _base, handler = place(local, backend)
    ref = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(local)).graph.initializer}
    remote.SHARED_BLOCKS.clear()
    with torchless.open(url) as art:
        remote.STATS.reset()
        b = art["b"].numpy()
        assert remote.STATS.bytes_fetched < 1 << 17  # b's 4 KiB (in a 64 KiB block), not w
        assert b.tobytes() == ref["b"].tobytes()
        assert art["w"].numpy().tobytes() == ref["w"].tobytes()


def _edited_onnx(src: Path, dst: Path, location: str) -> Path:
    onnx = pytest.importorskip("onnx")
    m = onnx.load(str(src), load_external_data=False)
    for t in m.graph.initializer:
        for e in t.external_data:
            if e.key == "location":
                e.value = location
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_bytes(m.SerializeToString())
    return dst


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "location", ["../outside.bin", "%2e%2e/outside.bin", "/abs/outside.bin", "data/w.bin?x=1", "data/w.bin#f"]
)
def test_onnx_external_location_escape_refused(arts, place, tmp_path, capsys, backend, location):
    """The link-escape rules hold at URLs: a location that could leave the model's folder
    (``..``, absolute, a percent escape a server would decode, a query or a fragment) is
    refused before anything is fetched from it, though the file it names exists."""
    src = arts["onnx"]
    d = tmp_path / "evil"
    (d / "m" / "data").mkdir(parents=True)
    shutil.copy(src.parent / "data" / "weights.bin", d / "outside.bin")
    shutil.copy(src.parent / "data" / "weights.bin", d / "m" / "data" / "w.bin")
    _edited_onnx(src, d / "m" / "model.onnx", location)
    url, _base, _h = place(d / "m" / "model.onnx", backend)
    if backend == "memory":  # the outside file beside the model's folder
        remote.filesystem(url)[0].pipe(remote.filesystem(remote.dirname(remote.dirname(url)))[1] + "/outside.bin", b"x")
    for cmd in ("info", "ls", "verify"):
        code, out, err = _cli(capsys, cmd, url)
        assert code != 0 and "refused external data location" in err and "Traceback" not in err, (cmd, err)


def _inductor_cache(root: Path) -> int:
    """A TorchInductor cache folder (the layouts of tests/formats/inductor_cache) with a
    4 MiB compiled kernel that inventorying must not fetch; its total size."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from formats.inductor_cache.test_inventory import key, synthetic_cache

    synthetic_cache(root)
    k = key("c", "big-kernel")
    (root / k[1:3]).mkdir(exist_ok=True)
    (root / k[1:3] / f"{k}.cpp").write_text('#include "/tmp/torchinductor_x/pi/cpi.h"\nextern "C" void kernel() {}\n')
    (root / k[1:3] / f"{k}.so").write_bytes(b"\x7fELF" + bytes(range(256)) * (1 << 14))
    fk = key("f", "graph")
    fx = root / "fxgraph" / fk[1:3] / fk
    fx.mkdir(parents=True)
    (fx / key("", "content")).write_bytes(pickle.dumps({"source_code": "def call(args):\n    return args\n"}, protocol=4))
    return _size(root)


def _inventory_json(text: str) -> dict:
    """``cache --json`` without what differs between copies: the root and the file times."""
    d = json.loads(text)
    d.pop("root")
    for it in d["items"]:
        it.pop("mtime"), it.pop("age_s")
    return d


@pytest.mark.parametrize("backend", ["memory", "s3"])
def test_inductor_cache_at_url_matches_local(place, backend, capsys, tmp_path):
    local = tmp_path / "c"
    total = _inductor_cache(local)
    url, _base, _h = place(local, backend)
    c1, o1, e1 = _cli(capsys, "cache", str(local), "--json")
    c2, o2, e2 = _cli(capsys, "cache", url, "--json")
    fetched = remote.STATS.bytes_fetched
    assert c1 == c2 == 0, (e1, e2)
    want = _inventory_json(o1)
    assert want["files"] == len([f for f in local.rglob("*") if f.is_file()]) and want["bytes"] == total
    assert _inventory_json(o2) == want
    assert json.loads(o2)["root"] == url.rstrip("/")
    # the heads of the sources and the pickles, never the 4 MiB shared object
    assert 0 < fetched < (1 << 20) < total, (fetched, total)
    for kind in ("fxgraph", "aotautograd", "output_code", "triton_kernel"):
        ident = next(i["id"] for i in want["items"] if i["kind"] == kind)
        c1, o1, e1 = _cli(capsys, "cache", str(local), "--show", ident)
        c2, o2, e2 = _cli(capsys, "cache", url, "--show", ident)
        assert c1 == c2 == 0 and o1 == o2 and o1.strip(), (kind, e1, e2)
    c1, o1, e1 = _cli(capsys, "cache", str(local), "--show", "nope")
    c2, o2, e2 = _cli(capsys, "cache", url, "--show", "nope")
    assert c1 == c2 == 2
    # scan walks the folder as it walks the local one (the verdicts are the same)
    code, _fetched, err = _same(capsys, str(local) + "/", url, "scan")
    code, fetched, err = _same(capsys, str(local) + "/", url, "scan", "--jobs", "1")  # counted in this process
    assert 0 < fetched < (1 << 20), fetched  # the 4 MiB shared object's head only
    assert code == 1 and "SUSPICIOUS" in _cli(capsys, "scan", str(local))[1], err  # the .so beside a foreign .cpp
    # info / ls take a checkpoint, not a cache folder: the same one-line error as locally
    for cmd in ("info", "ls"):
        c1, _o1, e1 = _cli(capsys, cmd, str(local))
        c2, _o2, e2 = _cli(capsys, cmd, url.rstrip("/"))
        assert c1 == c2 == 2 and e1.replace(str(local), "<p>") == e2.replace(url.rstrip("/"), "<p>"), (e1, e2)
    # pruning at a URL: test_remote_cache_prune.py
    from torchless.formats.inductor_cache.inventory import inventory

    assert inventory(url + "/absent").exists is False


def test_inductor_cache_over_http_is_refused(place, capsys, tmp_path):
    _inductor_cache(tmp_path / "c")
    url, _base, handler = place(tmp_path / "c", "http")
    for argv in (["cache", url], ["cache", url, "--json"], ["cache", url, "--show", "x"]):
        code, out, err = _cli(capsys, *argv)
        assert code == 2 and "does not list folders" in err and err.count("\n") == 1, err
    assert handler.sent == 0


def test_file_url_cache_is_local(tmp_path, capsys):
    (tmp_path / "c").mkdir()
    code, out, err = _cli(capsys, "cache", "file://" + str(tmp_path / "c"), "--json")
    assert code == 0, err
    assert json.loads(out)["root"] == str(tmp_path / "c")


@pytest.mark.parametrize("executor", [None, "local:1"])  # local:1: the range tasks, run in this process
def test_hf_dcp_reshard_and_consolidate_on_s3(arts, place, tmp_path, capsys, executor):
    """DCP in the Hugging Face layout on S3, resharded (1 -> 3 ranks) and consolidated
    there: the rank files are the local reshard's bytes, torch's FsspecReader loads the
    result, and the consolidated file is the local one's bytes."""
    import torch.distributed.checkpoint as dcp

    FsspecReader = pytest.importorskip(  # noqa: N806 - torch's class
        "torch.distributed.checkpoint._fsspec_filesystem", reason="torch without the fsspec DCP backend"
    ).FsspecReader
    local = arts["hfdcp"]
    url, base, _h = place(local, "s3")
    import boto3

    s3 = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"])
    bucket = base[5:]
    assert _cli(capsys, "reshard", str(local), str(tmp_path / "r3"), "--ranks", "3")[0] == 0
    extra = ["--executor", executor, "--max-task-bytes", "1MiB"] if executor else []
    code, out, err = _cli(capsys, "reshard", url, f"{base}/r3", "--ranks", "3", *extra)
    assert code == 0, err
    keys = sorted(o["Key"][3:] for o in s3.list_objects_v2(Bucket=bucket, Prefix="r3/")["Contents"])
    assert keys == sorted(os.listdir(tmp_path / "r3"))
    for n in keys:
        if n.endswith(".distcp"):
            assert s3.get_object(Bucket=bucket, Key=f"r3/{n}")["Body"].read() == (tmp_path / "r3" / n).read_bytes(), n
    torch.manual_seed(0)
    m = _Model()
    want = {"big.weight": m.big.weight.detach(), "big.bias": m.big.bias.detach(), "head.weight": m.head.weight.detach()}
    got = {k: torch.zeros_like(v) for k, v in want.items()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(got, storage_reader=FsspecReader(f"{base}/r3"), no_dist=True)
    assert all(torch.equal(got[k], want[k]) for k in want)
    assert _cli(capsys, "convert", str(local), str(tmp_path / "c.safetensors"))[0] == 0
    assert _cli(capsys, "convert", url, f"{base}/c.safetensors")[0] == 0
    assert s3.get_object(Bucket=bucket, Key="c.safetensors")["Body"].read() == (tmp_path / "c.safetensors").read_bytes()


@pytest.mark.parametrize("backend", ["memory", "http"])
def test_renamed_onnx_model_at_url_is_recognised_by_content(place, backend, capsys, tmp_path):
    """scan reads only the top-level tags of a remote file to decide whether it parses as
    a model (tests/remote/test_remote.py bounds what that costs), and still finds a model
    whatever its name: a renamed one with an escaping location is SUSPICIOUS at a URL too."""
    onnx = pytest.importorskip("onnx", reason="onnx writes the model (the oracle)")
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        [numpy_helper.from_array(np.ones((4, 4), np.float32), "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    t = model.graph.initializer[0]
    t.ClearField("raw_data")
    t.data_location = TensorProto.EXTERNAL
    e = t.external_data.add()
    e.key, e.value = "location", "../../etc/passwd"
    (tmp_path / "m").mkdir()
    local = tmp_path / "m" / "weights.bin"
    local.write_bytes(model.SerializeToString())
    assert onnx.load_model_from_string(local.read_bytes()).graph.initializer[0].name == "w"
    url, _base, _h = place(local, backend)
    code, _fetched, err = _same(capsys, str(local), url, "scan")
    assert code == 1, err
    assert "link-escape" in _cli(capsys, "scan", url)[1]


@pytest.mark.parametrize(
    "name",
    [
        "pt",
        "safetensors",
        "npz",
        "torchscript",
        "lite",
        "pt2",
        "legacy",
        "package",
        "aoti",
        "aoti_so",
        "aoti_pw",
        "onnx",
        "hf",
        "dcp",
    ],
)
def test_stats_agree_with_the_server(arts, place, tmp_path, capsys, name):
    """--stats of every command that reads a URL says what the HTTP server counted: the
    requests (ranged GETs; HEAD requests are not counted by either) and the bytes sent.
    verify fetches each byte about once (not once for the checksums and again for the
    tensors)."""
    local = arts[name]
    url, _base, handler = place(local, "http")
    total = _size(local.parent)
    out = tmp_path / "out.safetensors"
    for cmd in (
        ["info", url],
        ["ls", url],
        ["scan", url],
        ["verify", url],
        ["diff", str(local), url],
        ["diff", url, url],
        ["convert", url, str(out)],
    ):
        if cmd[0] == "scan" and local.is_dir():
            continue  # scan walks a folder, which plain HTTP cannot list (info / ls fetch .metadata by name)
        handler.sent = handler.requests = 0
        code, _out, err = _cli(capsys, *cmd, "--stats")
        assert code in (0, 1), (cmd, err)
        assert _stats(err) == (handler.requests, handler.sent), cmd
        if cmd[0] == "verify":
            assert handler.sent <= total + (1 << 20), (handler.sent, total)
