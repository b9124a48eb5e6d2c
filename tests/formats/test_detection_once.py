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
