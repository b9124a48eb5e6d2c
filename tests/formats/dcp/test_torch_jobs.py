"""Differential tests against checkpoints from real multi-process torch DCP jobs."""

from __future__ import annotations

import glob
import json
import os

import numpy as np
import pytest

import torchless
import torchless.dcp as tdcp
from torchless.cli.main import main as cli

from .conftest import run_job

torch = pytest.importorskip("torch", reason="torch is the differential oracle; not installed")


def tbytes(t) -> bytes:
    return t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def assert_same(ref, got, path="") -> None:
    """``got`` (torchless: NumPy arrays or Tensors) equals the torch object ``ref`` bit for bit."""
    if isinstance(ref, torch.Tensor):
        arr = got.numpy(raw=True) if hasattr(got, "numpy") and not isinstance(got, np.ndarray) else got
        assert list(arr.shape) == list(ref.shape), path
        assert arr.dtype.itemsize == ref.element_size(), path
        assert np.ascontiguousarray(arr).tobytes() == tbytes(ref), path
    elif isinstance(ref, dict):
        assert set(ref) == set(got), (path, sorted(ref), sorted(got))
        for k in ref:
            assert_same(ref[k], got[k], f"{path}.{k}")
    elif isinstance(ref, list) and any(isinstance(x, (torch.Tensor, dict, list)) for x in ref):
        assert len(ref) == len(got), path
        for i, (a, b) in enumerate(zip(ref, got, strict=False)):
            assert_same(a, b, f"{path}[{i}]")
    else:
        assert ref == got and type(ref) is type(got), (path, ref, got)


def assert_same_torch(ref, got, path="") -> None:
    """Two torch objects are bit-identical (dtypes included)."""
    if isinstance(ref, torch.Tensor):
        assert isinstance(got, torch.Tensor) and got.dtype == ref.dtype and got.shape == ref.shape, path
        assert tbytes(got) == tbytes(ref), path
    elif isinstance(ref, dict):
        assert set(ref) == set(got), (path, sorted(ref), sorted(got))
        for k in ref:
            assert_same_torch(ref[k], got[k], f"{path}.{k}")
    elif isinstance(ref, (list, tuple)) and any(isinstance(x, (torch.Tensor, dict, list)) for x in ref):
        assert len(ref) == len(got), path
        for i, (a, b) in enumerate(zip(ref, got, strict=False)):
            assert_same_torch(a, b, f"{path}[{i}]")
    else:
        assert ref == got, (path, ref, got)


def torch_metadata(path: str):
    from torch.distributed.checkpoint import FileSystemReader

    return FileSystemReader(path).read_metadata()


@pytest.mark.parametrize("which", ["saved2", "saved4"])
def test_read_bit_exact(which, request):
    ckpt, ref = request.getfixturevalue(which)
    assert torchless.detect(ckpt) == "dcp"
    got = tdcp.load(ckpt, materialize=True)
    assert_same(torch.load(ref, weights_only=False), got)


@pytest.mark.parametrize("which", ["saved2", "saved4"])
def test_layout_matches_torch_metadata(which, request):
    ckpt, _ = request.getfixturevalue(which)
    tm = torch_metadata(ckpt)
    lay = tdcp.layout(ckpt)
    assert list(lay["items"]) == list(tm.state_dict_metadata)
    for fqn, md in tm.state_dict_metadata.items():
        it = lay["items"][fqn]
        if hasattr(md, "chunks"):
            assert it["shape"] == list(md.size) and it["dtype"] == str(md.properties.dtype).split(".")[1]
            assert [(c["offsets"], c["sizes"]) for c in it["chunks"]] == [(list(c.offsets), list(c.sizes)) for c in md.chunks]
            for c in it["chunks"]:
                info = next(v for k, v in tm.storage_data.items() if k.fqn == fqn and list(k.offset) == c["offsets"])
                assert (c["file"], c["offset"], c["length"]) == (info.relative_path, info.offset, info.length)
        else:
            assert it["kind"] == "bytes"
    assert lay["planner_data"] == json.loads(json.dumps(tm.planner_data))
    assert lay["version"] == tm.version
    assert lay["storage_meta"]["save_id"] == tm.storage_meta.save_id


def test_select_keys_reads_only_those(saved4):
    ckpt, ref = saved4
    got = tdcp.load(ckpt, keys=["model.col", "step"], materialize=True)
    full = torch.load(ref, weights_only=False)
    assert set(got) == {"model", "step"} and set(got["model"]) == {"col"}
    assert_same(full["model"]["col"], got["model"]["col"])
    with tdcp.open(ckpt) as art:
        blk = art.reader.read_block("model.cube", (1, 0, 1), (2, 3, 3))
        want = full["model"]["cube"][1:3, :, 1:4]
        assert blk.tobytes() == tbytes(want)


def test_consolidate_pt_matches_dcp_to_torch_save(saved4, tmp_path):
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    ckpt, ref = saved4
    ours, theirs = str(tmp_path / "ours.pt"), str(tmp_path / "theirs.pt")
    assert cli(["convert", ckpt, ours]) == 0
    dcp_to_torch_save(ckpt, theirs)
    assert_same_torch(torch.load(theirs, weights_only=True), torch.load(ours, weights_only=True))
    assert_same_torch(torch.load(ref, weights_only=False), torch.load(ours, weights_only=True))


def test_consolidate_safetensors_sharded(saved2, tmp_path):
    from safetensors import safe_open

    ckpt, ref = saved2
    out = str(tmp_path / "model.safetensors")
    assert cli(["convert", ckpt, out, "--max-shard-size", "600B"]) == 0
    index = json.load(open(out + ".index.json"))
    shards = sorted(glob.glob(str(tmp_path / "model-*-of-*.safetensors")))
    assert len(shards) > 1 and set(index["weight_map"].values()) == {os.path.basename(s) for s in shards}
    full = torch.load(ref, weights_only=False)
    flat = {k: v for k, v in _flatten(full).items() if isinstance(v, torch.Tensor)}
    assert set(index["weight_map"]) == set(flat)
    for name, fname in index["weight_map"].items():
        with safe_open(str(tmp_path / fname), framework="pt") as f:
            t = f.get_tensor(name)
        assert t.dtype == flat[name].dtype and tbytes(t) == tbytes(flat[name]), name


def _flatten(obj, prefix=""):
    out = {}
    items = obj.items() if isinstance(obj, dict) else enumerate(obj)
    for k, v in items:
        key = f"{prefix}{k}"
        if isinstance(v, dict) or (isinstance(v, list) and any(isinstance(x, (dict, list, torch.Tensor)) for x in v)):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def _check_load_job(prefix: str, world: int, ref: str, keys=None) -> None:
    full = _flatten(torch.load(ref, weights_only=False))
    if keys is not None:
        full = {k: v for k, v in full.items() if k in keys}
    for r in range(world):
        got = torch.load(f"{prefix}{r}.pt", weights_only=False)
        assert set(got) == set(full)
        for key, (where, val) in got.items():
            want = full[key]
            if where is not None:
                dim, off = where
                want = want.narrow(dim, off, val.shape[dim])
            assert_same_torch(want, val, key)


def test_resharded_4_to_3_loads_in_torch(saved4, tmp_path):
    ckpt, ref = saved4
    dst = str(tmp_path / "r3")
    assert cli(["reshard", ckpt, dst, "--ranks", "3", "--plan", "model.cube=dim:2,optim.*=col,row", "--jobs", "2"]) == 0
    assert sorted(os.listdir(dst)) == [".metadata", "__0_0.distcp", "__1_0.distcp", "__2_0.distcp"]
    # torch reads our .metadata with plain pickle
    tm = torch_metadata(dst)
    assert len(tm.state_dict_metadata["model.row"].chunks) == 3
    assert_same(torch.load(ref, weights_only=False), tdcp.load(dst, materialize=True))
    run_job("load", dst, "3", ref, str(tmp_path / "out_"))
    _check_load_job(str(tmp_path / "out_"), 3, ref)


def test_single_file_to_dcp_loads_in_torch(saved2, tmp_path):
    _, ref = saved2
    dst = str(tmp_path / "from_pt")
    res = tdcp.reshard(ref, dst, 2, plan="col,model.row=row,*.rep=replicate")
    assert res["files"] == ["__0_0.distcp", "__1_0.distcp"]
    run_job("load", dst, "2", ref, str(tmp_path / "out_"))
    _check_load_job(str(tmp_path / "out_"), 2, ref)


def test_hf_flavour_written_by_torch_reads_bit_exact(saved2):
    ckpt, ref = saved2
    hf = ckpt + "_hf"
    assert torchless.detect(hf) == "dcp"
    full = _flatten(torch.load(ref, weights_only=False))
    got = tdcp.load(hf, materialize=True)
    assert got and set(got) <= set(full)
    for k, v in got.items():
        assert_same(full[k], v, k)
    # shards sit where DCP_SHARDING_INFO says
    lay = tdcp.layout(hf)
    assert len(lay["items"]["model.col"]["chunks"]) == 2


def test_hf_flavour_written_by_torchless_loads_in_torch(saved4, tmp_path):
    ckpt, ref = saved4
    dst = str(tmp_path / "hf2")
    res = tdcp.reshard(ckpt, dst, 2, plan="col,model.row=row", format="hf")
    assert "step" in res["skipped"]
    # torchless reads back its own output; the HF shards carry DCP_SHARDING_INFO
    flat = _flatten(torch.load(ref, weights_only=False))
    for k, v in tdcp.load(dst, materialize=True).items():
        assert_same(flat[k], v, k)
    from .torch_jobs import HF_DTYPES

    keys = {k for k in flat if k.startswith("model.") or (k.startswith("plain.") and k.split(".")[1] in HF_DTYPES)}
    run_job("load", dst, "2", ref, str(tmp_path / "out_"), "hf")
    _check_load_job(str(tmp_path / "out_"), 2, ref, keys)


def test_per_rank_metadata_merged_bit_exact(saved2, saved4):
    for ckpt, ref in (saved2, saved4):
        ranked = ckpt + "_ranked"
        names = sorted(n for n in os.listdir(ranked) if n.endswith(".metadata"))
        assert ".metadata" not in names and len(names) >= 2, names  # torch wrote __R.metadata only
        assert torchless.detect(ranked) == "dcp"
        assert_same(torch.load(ref, weights_only=False), tdcp.load(ranked, materialize=True))
        assert torchless.open(ranked).verify() == []


def test_safetensors_serialization_distcp_bit_exact(saved2, saved4):
    from torchless.formats.dcp.read import is_safetensors_blob

    for ckpt, ref in (saved2, saved4):
        st = ckpt + "_st"
        files = sorted(n for n in os.listdir(st) if n.endswith(".distcp"))
        md = tdcp.read_metadata(st)
        tensor_items = [v for k, v in md.storage_data.items() if k.offset is not None]
        assert tensor_items and all(
            is_safetensors_blob(open(os.path.join(st, i.relative_path), "rb").read()[i.offset : i.offset + 9])
            for i in tensor_items
        )
        full = _flatten(torch.load(ref, weights_only=False))
        got = _flatten(tdcp.load(st, materialize=True))
        assert got and set(got) <= set(full)
        for k, v in got.items():
            assert_same(full[k], v, k)
        assert torchless.open(st).verify() == [], files
        rep = torchless.scan(st, jobs=1)
        assert rep.exit_code == 0, [(f.path, [x.message for x in f.findings]) for f in rep.files]
