"""DCP without torch: metadata round trip, reshard/consolidate of torchless-written
checkpoints, sharding plans, and hostile input (refused with TorchlessError only)."""

from __future__ import annotations

import json
import os
import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import torchless
import torchless.dcp as tdcp
from torchless.cli.main import main as cli
from torchless.core.errors import FormatError, TorchlessError, UnsafeGlobalError, UsageError
from torchless.formats.dcp.reshard import ShardSpec, flatten_state_dict, parse_plan, split_tensor


@pytest.fixture()
def arrays():
    rng = np.random.default_rng(0)
    return {
        "a.w": rng.standard_normal((10, 6)).astype(np.float32),
        "a.b": rng.integers(-5, 5, (7,)).astype(np.int64),
        "c": rng.standard_normal((3, 4, 5)).astype(np.float16),
        "s": np.array(2.5, dtype=np.float64),
        "e": np.zeros((0, 3), dtype=np.float32),
    }


@pytest.fixture()
def ckpt(tmp_path, arrays):
    src = str(tmp_path / "src.safetensors")
    torchless.save(arrays, src)
    dst = str(tmp_path / "ck")
    tdcp.reshard(src, dst, 3, plan="c=dim:2,row")
    return dst


def test_roundtrip_values(ckpt, arrays):
    got = tdcp.load(ckpt, materialize=True)
    assert set(got) == set(arrays)
    for k, v in arrays.items():
        assert got[k].dtype == v.dtype and got[k].shape == v.shape and got[k].tobytes() == v.tobytes()
    lay = tdcp.layout(ckpt)
    assert [c["sizes"] for c in lay["items"]["a.w"]["chunks"]] == [[4, 6], [4, 6], [2, 6]]
    assert [c["offsets"] for c in lay["items"]["c"]["chunks"]] == [[0, 0, 0], [0, 0, 2], [0, 0, 4]]
    assert len(lay["items"]["s"]["chunks"]) == 1


def test_metadata_roundtrip(ckpt):
    md = tdcp.read_metadata(ckpt)
    again = tdcp.parse_metadata(tdcp.dump_metadata(md))
    assert again == md


@pytest.mark.parametrize("ranks,plan", [(1, "auto"), (2, "col"), (4, "replicate"), (5, "row,a.*=dim:-1")])
def test_reshard_again(ckpt, arrays, tmp_path, ranks, plan):
    dst = str(tmp_path / f"r{ranks}")
    assert cli(["reshard", ckpt, dst, "--ranks", str(ranks), "--plan", plan]) == 0
    got = tdcp.load(dst, materialize=True)
    for k, v in arrays.items():
        assert got[k].tobytes() == v.tobytes(), k
    assert torchless.open(dst).verify() == []


def test_consolidate_formats(ckpt, arrays, tmp_path):
    for ext in ("pt", "safetensors", "npz"):
        out = str(tmp_path / f"out.{ext}")
        assert cli(["convert", ckpt, out]) == 0
        with torchless.open(out) as art:
            for k, v in arrays.items():
                assert art[k].numpy().tobytes() == v.tobytes(), (ext, k)


def test_jobs_match_serial(ckpt, tmp_path):
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    tdcp.reshard(ckpt, a, 4, jobs=1)
    tdcp.reshard(ckpt, b, 4, jobs=3)
    for n in sorted(os.listdir(a)):
        if n.endswith(".distcp"):
            assert open(os.path.join(a, n), "rb").read() == open(os.path.join(b, n), "rb").read()


def test_plan_parsing_and_split():
    p = parse_plan("*.bias=replicate,lm_head.*=col,dim:2")
    assert p.spec_for("x.bias") == ShardSpec("replicate")
    assert p.spec_for("lm_head.w") == ShardSpec("dim", 1)
    assert p.spec_for("other") == ShardSpec("dim", 2)
    with pytest.raises(UsageError):
        parse_plan("sideways")
    chunks = split_tensor((7, 3), ShardSpec("dim", 0), 4)
    assert [(c.offsets, c.sizes) for c in chunks] == [((0, 0), (2, 3)), ((2, 0), (2, 3)), ((4, 0), (2, 3)), ((6, 0), (1, 3))]
    assert split_tensor((3,), ShardSpec("auto"), 4) is None  # fewer rows than ranks: replicate
    assert split_tensor((), ShardSpec("dim", 0), 2) is None


def test_flatten_like_torch():
    t = torchless.core.tensor.Tensor.from_numpy(np.zeros(2))
    flat, paths = flatten_state_dict({"m": {"w": t, "e": {}}, "pg": [{"lr": 1}], "ls": [1, 2], "tl": [t, 3], "tu": (t,)})
    assert list(flat) == ["m.w", "pg.0.lr", "ls", "tl.0", "tl.1", "tu"]
    assert paths["pg.0.lr"] == ("pg", 0, "lr")


def test_destination_must_be_empty(ckpt, tmp_path):
    with pytest.raises(UsageError):
        tdcp.reshard(ckpt, ckpt, 2)


# -- hostile input ---------------------------------------------------------------------------------
def _proto2_global_call(module: str, name: str, arg: str) -> bytes:
    return (
        b"\x80\x02c" + module.encode() + b"\n" + name.encode() + b"\nX" + struct.pack("<I", len(arg)) + arg.encode() + b"\x85R."
    )


def test_hostile_metadata_refused_and_runs_nothing(ckpt, tmp_path):
    marker = tmp_path / "pwned"
    evil = _proto2_global_call("os", "system", f"touch {marker}")
    with open(os.path.join(ckpt, ".metadata"), "wb") as f:
        f.write(evil)
    with pytest.raises(UnsafeGlobalError) as ei:
        tdcp.open(ckpt)
    assert "os.system" in str(ei.value)
    assert cli(["info", ckpt]) == 2
    assert cli(["reshard", ckpt, str(tmp_path / "x"), "--ranks", "2"]) == 2
    assert not marker.exists()


def test_hostile_global_nested_inside_valid_metadata(ckpt, tmp_path):
    md = open(os.path.join(ckpt, ".metadata"), "rb").read()
    # replace the storage-meta class with a dangerous global of the same length scheme
    bad = md.replace(b"torch.distributed.checkpoint.metadata\nStorageMeta\n", b"builtins\neval\n", 1)
    assert bad != md
    with open(os.path.join(ckpt, ".metadata"), "wb") as f:
        f.write(bad)
    with pytest.raises(UnsafeGlobalError):
        tdcp.open(ckpt)


def test_path_escape_refused(ckpt):
    md = tdcp.read_metadata(ckpt)
    k = next(iter(md.storage_data))
    md.storage_data[k].relative_path = "../../etc/passwd"
    with open(os.path.join(ckpt, ".metadata"), "wb") as f:
        f.write(tdcp.dump_metadata(md))
    with pytest.raises(FormatError):
        tdcp.load(ckpt, materialize=True)


def test_truncated_payload(ckpt):
    p = os.path.join(ckpt, "__0_0.distcp")
    data = open(p, "rb").read()
    open(p, "wb").write(data[: len(data) // 2])
    with pytest.raises(TorchlessError):
        tdcp.load(ckpt, materialize=True)
    assert cli(["verify", ckpt]) == 1


def test_chunk_outside_tensor_refused(ckpt):
    md = tdcp.read_metadata(ckpt)
    t = md.state_dict_metadata["a.w"]
    t.chunks[0] = tdcp.ChunkStorageMetadata((9, 0), (4, 6))
    with pytest.raises(FormatError):
        tdcp.parse_metadata(tdcp.dump_metadata(md))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_metadata_bit_flips(ckpt, data):
    raw = bytearray(open(os.path.join(ckpt, ".metadata"), "rb").read())
    i = data.draw(st.integers(0, len(raw) - 1))
    raw[i] ^= data.draw(st.integers(1, 255))
    cut = data.draw(st.integers(1, len(raw)))
    try:
        tdcp.parse_metadata(bytes(raw[:cut]))
    except TorchlessError:
        pass


class _Evil:
    def __init__(self, cmd: str) -> None:
        self.cmd = cmd

    def __reduce__(self):
        return (os.system, (self.cmd,))


def test_hostile_protocol4_metadata(ckpt, tmp_path):
    import pickle

    marker = tmp_path / "pwned4"
    with open(os.path.join(ckpt, ".metadata"), "wb") as f:
        f.write(pickle.dumps({"state_dict_metadata": _Evil(f"touch {marker}")}, protocol=4))
    with pytest.raises(UnsafeGlobalError) as ei:
        tdcp.read_metadata(ckpt)
    assert "system" in str(ei.value)
    assert not marker.exists()


def test_huge_claimed_tensor_refused_without_allocating(ckpt):
    md = tdcp.read_metadata(ckpt)
    t = md.state_dict_metadata["a.w"]
    t.size = (10**9, 10**6)  # 4 PB: its chunks do not cover it
    with open(os.path.join(ckpt, ".metadata"), "wb") as f:
        f.write(tdcp.dump_metadata(md))
    with pytest.raises(FormatError):
        tdcp.load(ckpt, keys=["a.w"], materialize=True)


def test_unknown_keys(ckpt):
    with pytest.raises(torchless.NotFoundError if hasattr(torchless, "NotFoundError") else TorchlessError):
        tdcp.load(ckpt, keys=["nope"])


def test_hf_flavour_roundtrip_without_torch(ckpt, arrays, tmp_path):
    dst = str(tmp_path / "hf")
    res = tdcp.reshard(ckpt, dst, 2, plan="col", format="hf")
    assert res["files"] == ["shard-00001-model-00001-of-00001.safetensors", "shard-00002-model-00001-of-00001.safetensors"]
    head = open(os.path.join(dst, res["files"][1]), "rb").read()
    (n,) = struct.unpack("<Q", head[:8])
    meta = json.loads(head[8 : 8 + n])["__metadata__"]
    assert json.loads(meta["DCP_SHARDING_INFO"])["a.w"] == {"saved_offsets": [0, 3]}
    assert torchless.detect(dst) == "dcp"
    got = tdcp.load(dst, materialize=True)
    for k, v in arrays.items():
        assert got[k].tobytes() == v.tobytes() and got[k].shape == v.shape, k
    # and back to torch_save DCP from the HF flavour
    back = str(tmp_path / "back")
    tdcp.reshard(dst, back, 3)
    for k, v in tdcp.load(back, materialize=True).items():
        assert v.tobytes() == arrays[k].tobytes()
