"""DCP variants torch 2.13 writes besides the default: the safetensors serialization of
``FileSystemWriter`` and per-rank ``__R.metadata`` (``use_collectives=False``); here the
single-process files and their hostile edits (the multi-rank jobs are in test_torch_jobs)."""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytest

import torchless
import torchless.dcp as tdcp
from torchless.core.errors import FormatError

torch = pytest.importorskip("torch", reason="torch writes the checkpoints")


def _state():
    return {
        "a": torch.arange(12, dtype=torch.float32).reshape(3, 4),
        "b": torch.ones(5, dtype=torch.bfloat16),
        "one": torch.tensor([3], dtype=torch.int16),
        "step": 7,
    }


def _save(d, **kw):
    import torch.distributed.checkpoint as dcp

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(_state(), **kw)
    return d


@pytest.fixture
def st_ckpt(tmp_path):
    from torch.distributed.checkpoint import FileSystemWriter
    from torch.distributed.checkpoint.filesystem import SerializationFormat

    d = str(tmp_path / "st")
    return _save(d, storage_writer=FileSystemWriter(d, serialization_format=SerializationFormat.SAFETENSORS))


@pytest.fixture
def ranked(tmp_path):
    d = str(tmp_path / "ranked")
    return _save(d, checkpoint_id=d, use_collectives=False)


def _check(got):
    ref = _state()
    assert got["step"] == 7
    for k in ("a", "b", "one"):
        assert got[k].tobytes() == ref[k].contiguous().view(torch.uint8).numpy().tobytes(), k


def test_safetensors_serialization_reads(st_ckpt):
    assert torchless.detect(st_ckpt) == "dcp"
    _check(tdcp.load(st_ckpt, materialize=True))
    assert torchless.open(st_ckpt).verify() == []


def test_per_rank_metadata_reads(ranked):
    assert sorted(os.listdir(ranked)) == ["__0.metadata", "__0_0.distcp"]
    assert torchless.detect(ranked) == "dcp"
    _check(tdcp.load(ranked, materialize=True))


def _edit(d, name, fn):
    md = tdcp.read_metadata(d, name)
    fn(md)
    with open(os.path.join(d, name), "wb") as f:
        f.write(tdcp.dump_metadata(md))


def test_safetensors_blob_length_lie(st_ckpt):
    def lie(md):
        for k, v in md.storage_data.items():
            if k.fqn == "a":
                v.length += 4

    _edit(st_ckpt, ".metadata", lie)
    with pytest.raises(FormatError, match="storage length"):
        tdcp.load(st_ckpt, keys=["a"], materialize=True)


def test_safetensors_blob_shape_lie(st_ckpt):
    def lie(md):
        t = md.state_dict_metadata["a"]
        t.chunks[0] = type(t.chunks[0])((0, 0), (4, 3))
        t.size = (4, 3)
        for k in list(md.storage_data):
            if k.fqn == "a":
                md.storage_data[type(k)("a", (0, 0), k.index)] = md.storage_data.pop(k)

    _edit(st_ckpt, ".metadata", lie)
    with pytest.raises(FormatError, match="shape"):
        tdcp.load(st_ckpt, keys=["a"], materialize=True)


def test_safetensors_blob_corrupt_header(st_ckpt):
    p = os.path.join(st_ckpt, "__0_0.distcp")
    md = tdcp.read_metadata(st_ckpt)
    off = next(v.offset for k, v in md.storage_data.items() if k.fqn == "a")
    raw = bytearray(open(p, "rb").read())
    raw[off + 8 + 2] ^= 0x20  # inside the JSON header
    open(p, "wb").write(bytes(raw))
    with pytest.raises(torchless.TorchlessError):
        tdcp.load(st_ckpt, keys=["a"], materialize=True)


def test_per_rank_disagreement_refused(ranked):
    import shutil

    shutil.copy(os.path.join(ranked, "__0.metadata"), os.path.join(ranked, "__1.metadata"))
    _check(tdcp.load(ranked, materialize=True))  # an identical rank adds nothing

    def other_size(md):
        md.state_dict_metadata["a"].size = (6, 4)

    _edit(ranked, "__1.metadata", other_size)
    with pytest.raises(FormatError, match="disagree"):
        tdcp.load(ranked)


def test_per_rank_second_rank_chunks_united(ranked):
    """Rank 1 saved the rows 3..5 of a 6-row tensor in its own file: both chunks are read."""
    import shutil

    shutil.copy(os.path.join(ranked, "__0_0.distcp"), os.path.join(ranked, "__1_0.distcp"))
    shutil.copy(os.path.join(ranked, "__0.metadata"), os.path.join(ranked, "__1.metadata"))

    def grow(md):
        md.state_dict_metadata["a"].size = (6, 4)

    _edit(ranked, "__0.metadata", grow)

    def second(md):
        t = md.state_dict_metadata["a"]
        t.size = (6, 4)
        t.chunks[0] = type(t.chunks[0])((3, 0), (3, 4))
        for k in list(md.storage_data):
            v = md.storage_data.pop(k)
            v.relative_path = "__1_0.distcp"
            md.storage_data[type(k)(k.fqn, (3, 0) if k.fqn == "a" else k.offset, k.index)] = v

    _edit(ranked, "__1.metadata", second)
    got = tdcp.load(ranked, materialize=True)
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    assert np.array_equal(got["a"], np.concatenate([a, a]))
    info = torchless.open(ranked).info()
    assert info["ranks"] == 2 and info["chunks"] == 4
