"""One detection per call: ``torchless.open`` hands detection's probe (with the parsed zip
central directory) to the handler, so a file's directory is parsed once; and nothing
process-global keeps an archive mapped after ``close()``."""

from __future__ import annotations

import gc
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

import torchless
from torchless.container import zip as tzip
from torchless.formats.base import Probe

SAMPLES = Path(__file__).resolve().parents[2] / "samples"


@pytest.fixture
def directory_parses(monkeypatch):
    calls: list[str] = []
    real = tzip.ZipReader._read_directory

    def counting(self):
        calls.append(self.path)
        return real(self)

    monkeypatch.setattr(tzip.ZipReader, "_read_directory", counting)
    return calls


def _copy(name: str, tmp_path: Path) -> Path:
    dst = tmp_path / name
    shutil.copyfile(SAMPLES / name, dst)
    return dst


@pytest.mark.parametrize(
    ("sample", "fmt"),
    [("checkpoint.pt", "pt"), ("scripted_module.pt", "torchscript"), ("mlp.pt2", "pt2"), ("mlp_aoti.pt2", "aoti")],
)
def test_open_parses_the_central_directory_once(tmp_path, directory_parses, sample, fmt):
    p = _copy(sample, tmp_path)
    with torchless.open(p) as art:
        assert art.format == fmt
        for _n, t in art.tensors():
            t.numpy()
    assert directory_parses.count(str(p)) == 1, directory_parses


def test_a_written_checkpoint_is_parsed_once_per_open(tmp_path, directory_parses):
    p = tmp_path / "w.pt"
    torchless.save({"w": np.arange(6, dtype=np.float32)}, p)
    for _ in range(3):
        art = torchless.open(p)
        assert art["w"].numpy().tolist() == list(range(6))
        art.close()
    assert directory_parses.count(str(p)) == 3  # once per call: no hidden cache, no second parse


def test_a_probe_not_handed_over_is_closed(tmp_path, directory_parses):
    p = _copy("checkpoint.pt", tmp_path)
    probe = Probe.of(p)
    assert "data.pkl" in (probe.zip_records() or [])
    assert probe.zip_records() is probe.zip_records()  # parsed once
    probe.close()
    assert probe.take_zip() is None
    assert torchless.detect(p) == "pt"  # detect alone releases its probe
    assert len(directory_parses) == 2


def test_no_process_global_zip_cache():
    assert not hasattr(tzip.ZipReader, "cached")
    assert not hasattr(tzip, "_CACHE")


def _mappings_of(path: Path) -> list[str]:
    real = os.path.realpath(path)
    with open("/proc/self/maps") as f:
        return [line for line in f if line.rstrip("\n").removesuffix(" (deleted)").endswith(" " + real)]


def _fds_of(path: Path) -> list[str]:
    real = os.path.realpath(path)
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") == real:
                out.append(fd)
        except OSError:
            pass
    return out


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="needs /proc/self/maps (Linux)")
@pytest.mark.parametrize("sample", ["checkpoint.pt", "scripted_module.pt", "mlp.pt2", "mlp_aoti.pt2"])
def test_close_leaves_no_mapping_of_the_file(tmp_path, sample):
    p = _copy(sample, tmp_path)
    art = torchless.open(p)
    got = [t.numpy().copy() for _n, t in art.tensors()]
    assert _mappings_of(p), "the artifact maps the file while open"
    art.close()
    del art
    gc.collect()
    assert _mappings_of(p) == []
    assert _fds_of(p) == []
    assert got or sample == "mlp_aoti.pt2"
    # an open that fails also releases what detection mapped
    q = tmp_path / ("bad-" + sample)
    torchless.save({"w": np.zeros(2, np.float32)}, tmp_path / "x.pt")
    shutil.copyfile(tmp_path / "x.pt", q)
    with pytest.raises(torchless.UsageError):
        torchless.open(q, no_such_option=1)
    gc.collect()
    assert _mappings_of(q) == [] and _fds_of(q) == []


# --- the CLI: one detection per path and call -------------------------------------------


@pytest.fixture
def opens(monkeypatch):
    """Per path: detections (``Probe.of``), zip central directory parses, and memory maps
    made (a DCP checkpoint's ``.metadata`` is mapped once per parse)."""
    from torchless.io import source

    calls: dict[str, list[str]] = {"probe": [], "zip": [], "map": []}
    real_of = Probe.of.__func__
    real_dir = tzip.ZipReader._read_directory
    real_map = source.MmapSource.__init__

    def of(cls, path):
        calls["probe"].append(os.path.realpath(os.fspath(path)))
        return real_of(cls, path)

    def read_directory(self):
        calls["zip"].append(os.path.realpath(self.path))
        return real_dir(self)

    def mmap_init(self, path):
        calls["map"].append(os.path.realpath(os.fspath(path)))
        return real_map(self, path)

    monkeypatch.setattr(Probe, "of", classmethod(of))
    monkeypatch.setattr(tzip.ZipReader, "_read_directory", read_directory)
    monkeypatch.setattr(source.MmapSource, "__init__", mmap_init)
    return calls


def _cli(argv: list[str]) -> None:
    from torchless.cli.main import main

    assert main(argv) == 0, argv


@pytest.mark.parametrize(
    ("sample", "argv"),
    [
        ("checkpoint.pt", ["info", "{p}"]),
        ("checkpoint.pt", ["ls", "--json", "{p}"]),
        ("checkpoint.pt", ["verify", "{p}"]),
        ("checkpoint.pt", ["convert", "{p}", "{out}/c.safetensors"]),
        ("checkpoint.pt", ["diff", "{p}", "{p}"]),
        ("scripted_module.pt", ["code", "{p}"]),
        ("scripted_module.pt", ["ts", "tensors", "{p}"]),
        ("mlp.pt2", ["graph", "{p}"]),
        ("mlp.pt2", ["convert", "{p}", "{out}/g.safetensors"]),
        ("mlp_aoti.pt2", ["info", "{p}"]),
    ],
    ids=lambda v: v if isinstance(v, str) else "-".join(a for a in v if "{" not in a),
)
def test_cli_detects_and_parses_each_zip_once(tmp_path, opens, sample, argv):
    p = _copy(sample, tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    _cli([a.format(p=p, out=out) for a in argv])
    n = 2 if argv[0] == "diff" else 1  # diff opens its two paths (here the same file twice)
    real = os.path.realpath(p)
    assert opens["probe"].count(real) == n, opens["probe"]
    assert opens["zip"].count(real) == n, opens["zip"]


def test_cli_onnx_graph_detects_once(tmp_path, opens):
    p = _copy("mlp.onnx", tmp_path)
    _cli(["onnx", "graph", str(p)])
    assert opens["probe"].count(os.path.realpath(p)) == 1, opens["probe"]
    assert opens["map"].count(os.path.realpath(p)) == 1, opens["map"]


@pytest.mark.parametrize("argv", [["info", "{p}"], ["ls", "{p}"], ["convert", "{p}", "{out}/d.safetensors"]], ids=lambda v: v[0])
def test_cli_reads_a_dcp_directory_once(tmp_path, opens, argv):
    p = tmp_path / "dcp_ckpt"
    shutil.copytree(SAMPLES / "dcp_ckpt", p)
    out = tmp_path / "out"
    out.mkdir()
    _cli([a.format(p=p, out=out) for a in argv])
    real = os.path.realpath(p)
    assert opens["probe"].count(real) == 1, opens["probe"]
    assert opens["map"].count(os.path.join(real, ".metadata")) == 1, opens["map"]


def test_cli_wrong_kind_is_refused_after_one_detection(tmp_path, opens, capsys):
    from torchless.cli.main import main

    p = _copy("checkpoint.pt", tmp_path)
    assert main(["graph", str(p)]) == 2
    assert "needs a torch.export .pt2 archive" in capsys.readouterr().err
    assert opens["probe"].count(os.path.realpath(p)) == 1
    gc.collect()
    assert _fds_of(p) == [] and _mappings_of(p) == []  # the refused probe was closed


def test_convert_takes_an_open_artifact_and_leaves_it_open(tmp_path, opens):
    p = _copy("checkpoint.pt", tmp_path)
    with torchless.open(p, weights_only=False) as art:
        res = torchless.convert(art, tmp_path / "c.safetensors")
        assert res["tensors"] == len(list(art.tensors()))  # still open and readable
        with pytest.raises(torchless.UsageError, match="src_format"):
            torchless.convert(art, tmp_path / "d.safetensors", src_format="npz")
    assert opens["probe"].count(os.path.realpath(p)) == 1
    with torchless.open(tmp_path / "c.safetensors") as got:
        assert sorted(got.keys()) == sorted(n for n, _ in torchless.open(p, weights_only=False).tensors())
