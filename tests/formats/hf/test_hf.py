"""Hugging Face sharded checkpoints: folders and index files read as one artifact.

Oracles: ``torch.save`` / ``torch.load`` for ``.bin`` shards and the ``safetensors``
package for safetensors shards, laid out exactly as ``transformers``' ``save_pretrained``
names them (``pytorch_model-00001-of-00002.bin`` + ``pytorch_model.bin.index.json``,
``model-00001-of-00002.safetensors`` + ``model.safetensors.index.json``).
"""

from __future__ import annotations

import json
import os
import zipfile

import numpy as np
import pytest

import torchless
from torchless.cli.main import main
from torchless.core.errors import FormatError, LimitError, LinkEscapeError, NotFoundError, UnsafeGlobalError, UsageError

torch = pytest.importorskip("torch", reason="torch is the oracle")
st_torch = pytest.importorskip("safetensors.torch", reason="safetensors is the oracle")

BIN1, BIN2 = "pytorch_model-00001-of-00002.bin", "pytorch_model-00002-of-00002.bin"
ST1, ST2 = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"


def _state() -> dict:
    g = torch.Generator().manual_seed(0)
    emb = torch.randn(16, 8, generator=g)
    return {
        "model.embed_tokens.weight": emb,
        "model.layers.0.mlp.weight": torch.randn(8, 8, generator=g).to(torch.bfloat16),
        "model.layers.0.mlp.bias": torch.arange(8, dtype=torch.int64),
        "model.norm.weight": torch.ones(8, dtype=torch.float16),
        "lm_head.weight": emb,  # tied, as transformers ties embeddings and the head
    }


def _index(folder, name, wm, total) -> None:
    with open(os.path.join(folder, name), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": wm}, f, indent=2)


@pytest.fixture
def bin_set(tmp_path):
    """Two torch.save shards + pytorch_model.bin.index.json; the tied pair in shard 1."""
    sd = _state()
    d = tmp_path / "bin"
    d.mkdir()
    s1 = {k: sd[k] for k in ("model.embed_tokens.weight", "lm_head.weight")}
    s2 = {k: v for k, v in sd.items() if k not in s1}
    torch.save(s1, d / BIN1)
    torch.save(s2, d / BIN2)
    wm = {**{k: BIN1 for k in s1}, **{k: BIN2 for k in s2}}
    total = 16 * 8 * 4 + 8 * 8 * 2 + 8 * 8 + 8 * 2  # storages counted once (huggingface_hub)
    _index(d, "pytorch_model.bin.index.json", wm, total)
    return d, sd


@pytest.fixture
def st_set(tmp_path):
    """Two safetensors shards (safetensors' own writer) + model.safetensors.index.json."""
    sd = {k: v.clone() for k, v in _state().items() if k != "lm_head.weight"}
    d = tmp_path / "st"
    d.mkdir()
    s1 = {"model.embed_tokens.weight": sd["model.embed_tokens.weight"]}
    s2 = {k: v for k, v in sd.items() if k not in s1}
    st_torch.save_file(s1, str(d / ST1), metadata={"format": "pt"})
    st_torch.save_file(s2, str(d / ST2), metadata={"format": "pt"})
    wm = {**{k: ST1 for k in s1}, **{k: ST2 for k in s2}}
    _index(d, "model.safetensors.index.json", wm, sum(v.nbytes for v in sd.values()))
    return d, sd


def _same(tl, tt, name=""):
    assert tl.dtype.name == str(tt.dtype).split(".")[1], name
    assert tuple(tl.shape) == tuple(tt.shape), name
    assert np.asarray(tl.numpy()).tobytes() == tt.contiguous().view(torch.uint8).numpy().tobytes() if tt.numel() else True, name


# -- detection and reading ---------------------------------------------------------


def test_detect_folder_and_index(bin_set, st_set):
    for d, _sd in (bin_set, st_set):
        assert torchless.detect(d) == "hf"
        idx = next(n for n in os.listdir(d) if n.endswith(".index.json"))
        assert torchless.detect(d / idx) == "hf"


def test_dcp_flavour_stays_dcp(tmp_path):
    d = tmp_path / "dcp_hf"
    d.mkdir()
    st_torch.save_file(
        {"w": torch.ones(2, 3)},
        str(d / "shard-00001-model-00001-of-00001.safetensors"),
        metadata={"DCP_SHARDING_INFO": json.dumps({"w": {"saved_offsets": [0, 0]}}), "DCP_VERSION": "1.0"},
    )
    assert torchless.detect(d) == "dcp"


@pytest.mark.differential
def test_bin_set_reads_bit_exact(bin_set):
    d, sd = bin_set
    with torchless.open(d) as art:
        got = dict(art.tensors())
        assert list(got) == [
            "model.embed_tokens.weight",
            "lm_head.weight",
            "model.layers.0.mlp.weight",
            "model.layers.0.mlp.bias",
            "model.norm.weight",
        ]
        ref = {}
        for shard in (BIN1, BIN2):
            ref.update(torch.load(d / shard, weights_only=True, mmap=True))
        for k, v in ref.items():
            _same(got[k], v, k)
        assert art.tensor_file("lm_head.weight") == BIN1 and art.tensor_file("model.norm.weight") == BIN2
        assert got["lm_head.weight"].storage is got["model.embed_tokens.weight"].storage  # tied stays tied
        info = art.info()
        assert info["serialization"] == "bin" and info["index"] == "pytorch_model.bin.index.json"
        assert [s["file"] for s in info["shards"]] == [BIN1, BIN2] and [s["tensors"] for s in info["shards"]] == [2, 3]
        assert art.verify() == []


@pytest.mark.differential
def test_st_set_reads_bit_exact_without_index_too(st_set):
    d, sd = st_set
    with torchless.open(d / "model.safetensors.index.json") as art:
        for k, v in sd.items():
            _same(art[k], v, k)
        assert art.verify() == []
    os.remove(d / "model.safetensors.index.json")  # shards alone: found by their names
    with torchless.open(d) as art:
        assert art.index is None and art.shard_files == [ST1, ST2]
        assert set(art.keys()) == set(sd)


def test_cli_info_and_ls_name_the_shard(bin_set, capsys):
    d, _sd = bin_set
    assert main(["ls", str(d), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["name"]: r["file"] for r in rows}["model.norm.weight"] == BIN2
    assert main(["ls", str(d)]) == 0
    assert BIN1 in capsys.readouterr().out
    assert main(["info", str(d / "pytorch_model.bin.index.json"), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["format"] == "hf" and info["tensors"] == 5 and info["files"] == 2


# -- convert -----------------------------------------------------------------------


@pytest.mark.differential
def test_bin_to_sharded_safetensors_and_back(bin_set, tmp_path):
    d, sd = bin_set
    out = tmp_path / "out"
    out.mkdir()
    res = torchless.convert(d, out / "model.safetensors", max_shard_size="600B")
    # the tied head is written once (safetensors cannot share), and reported
    assert res["dropped"] == [
        {"key": "lm_head.weight", "type": "alias of model.embed_tokens.weight (one storage; safetensors stores it once)"}
    ]
    idx = json.load(open(out / "model.safetensors.index.json"))
    shards = sorted(set(idx["weight_map"].values()))
    assert shards == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    assert idx["metadata"]["total_size"] == sum(v.nbytes for k, v in sd.items() if k != "lm_head.weight")
    loaded = {}
    for s in shards:
        part = st_torch.load_file(str(out / s))
        assert all(idx["weight_map"][k] == s for k in part)
        loaded.update(part)
    assert set(loaded) == set(sd) - {"lm_head.weight"}
    for k, v in loaded.items():
        assert torch.equal(v, sd[k]) and v.dtype == sd[k].dtype, k
    assert torchless.open(out).verify() == []
    # back to .bin shards: each loads in torch with weights_only=True
    back = tmp_path / "back"
    back.mkdir()
    res = torchless.convert(out, back / "pytorch_model.bin.index.json", max_shard_size="300B")
    bidx = json.load(open(back / "pytorch_model.bin.index.json"))
    got = {}
    for s in sorted(set(bidx["weight_map"].values())):
        got.update(torch.load(back / s, weights_only=True))
    assert set(got) == set(loaded) and all(torch.equal(got[k], loaded[k]) for k in got)
    assert len(set(bidx["weight_map"].values())) == len(res["files"]) - 1 >= 2


@pytest.mark.differential
def test_bin_resharding_keeps_tied_weights_in_one_shard(bin_set, tmp_path):
    d, sd = bin_set
    out = tmp_path / "rebin"
    out.mkdir()
    torchless.convert(d, out / "pytorch_model.bin.index.json", max_shard_size="100B")
    wm = json.load(open(out / "pytorch_model.bin.index.json"))["weight_map"]
    assert wm["lm_head.weight"] == wm["model.embed_tokens.weight"]
    both = torch.load(out / wm["lm_head.weight"], weights_only=True)
    assert both["lm_head.weight"].data_ptr() == both["model.embed_tokens.weight"].data_ptr()  # still shared
    # the 512- and 128-byte tensors are over the limit: shards of their own; the 64-byte
    # bias and the 16-byte norm fill one shard together
    assert len(set(wm.values())) == 3 and wm["model.layers.0.mlp.bias"] == wm["model.norm.weight"]


def test_strict_refuses_alias_drop_and_overlapping_views_refused(bin_set, tmp_path):
    d, _sd = bin_set
    with pytest.raises(UsageError, match="lm_head.weight"):
        torchless.convert(d, tmp_path / "model.safetensors", strict=True)
    assert not (tmp_path / "model.safetensors").exists()
    base = torch.arange(10, dtype=torch.float32)
    p = tmp_path / "partial"
    p.mkdir()
    # disjoint views of one storage: each written as its own tensor (save_pretrained clones them)
    torch.save({"a": base[:5], "b": base[5:]}, p / "pytorch_model.bin")
    res = torchless.convert(p, tmp_path / "x.safetensors", strict=True)
    assert res["dropped"] == [] and res["tensors"] == 2
    got = st_torch.load_file(str(tmp_path / "x.safetensors"))
    assert torch.equal(got["a"], base[:5]) and torch.equal(got["b"], base[5:])
    # overlapping views that are not the same view: refused naming both, nothing written
    q = tmp_path / "overlap"
    q.mkdir()
    torch.save({"a": base[:6], "b": base[4:]}, q / "pytorch_model.bin")
    with pytest.raises(UsageError, match="'a' and 'b' overlap"):
        torchless.convert(q, tmp_path / "y.safetensors")
    assert not (tmp_path / "y.safetensors").exists()


def test_diff_two_sets(bin_set, st_set, capsys):
    (b, _), (s, _) = bin_set, st_set
    assert main(["diff", str(b), str(s)]) == 1
    out = capsys.readouterr().out
    assert "- lm_head.weight" in out and "4 same" in out  # st_set holds clones: values equal
    assert main(["diff", str(s), str(s / "model.safetensors.index.json")]) == 0


# -- index validation and hostile input --------------------------------------------


def _rewrite(d, name, fn):
    p = d / name
    data = json.load(open(p))
    fn(data)
    with open(p, "w") as f:
        json.dump(data, f)


def test_verify_reports_index_lies(st_set):
    d, _sd = st_set
    _rewrite(
        d,
        "model.safetensors.index.json",
        lambda x: (
            x["weight_map"].update({"ghost": ST1}),
            x["weight_map"].pop("model.norm.weight"),
            x["metadata"].update(total_size=7),
        ),
    )
    st_torch.save_file({"extra": torch.ones(1)}, str(d / "model-00003-of-00002.safetensors"))
    codes = {p.code for p in torchless.open(d).verify()}
    assert {"missing", "unlisted", "total-size", "stray-shard"} <= codes


def test_tensor_in_two_shards(st_set):
    d, _sd = st_set
    st_torch.save_file(
        {"model.embed_tokens.weight": torch.zeros(16, 8), "model.norm.weight": torch.ones(8, dtype=torch.float16)}, str(d / ST2)
    )
    art = torchless.open(d)
    assert art.tensor_file("model.embed_tokens.weight") == ST1  # the index decides
    assert "duplicate" in {p.code for p in art.verify()}


@pytest.mark.parametrize("shard", ["../outside.safetensors", "/etc/passwd", "sub/../../x.safetensors", ""])
def test_index_naming_a_path_outside_is_refused(st_set, shard):
    d, _sd = st_set
    _rewrite(d, "model.safetensors.index.json", lambda x: x["weight_map"].update({"evil": shard}))
    with pytest.raises((LinkEscapeError, FormatError)):
        list(torchless.open(d).tensors())


def test_symlinked_shard_leaving_the_folder_is_refused(st_set, tmp_path):
    d, _sd = st_set
    outside = tmp_path / "outside.safetensors"
    os.replace(d / ST2, outside)
    os.symlink(outside, d / ST2)
    with pytest.raises(LinkEscapeError):
        list(torchless.open(d).tensors())


@pytest.mark.parametrize(
    "body, exc",
    [
        (b"[1, 2]", FormatError),
        (b'{"weight_map": {"a": 3}}', FormatError),
        (b'{"weight_map": []}', FormatError),
        (b'{"weight_map": {}}', FormatError),
        (b'{"weight_map": {"a": "x.npz"}}', FormatError),
        (b'{"weight_map": {"a": "missing.safetensors"}}', NotFoundError),
        (b'{"weight_map": {"a": "m.safetensors", "b": "p.bin"}}', FormatError),
        (b'{"metadata": 5, "weight_map": {"a": "m.safetensors"}}', FormatError),
        (b"{" * 100000, LimitError),
        (b'{"weight_map": {"a": "m.safetensors"', FormatError),
    ],
)
def test_malformed_indexes(tmp_path, body, exc):
    p = tmp_path / "model.safetensors.index.json"
    p.write_bytes(body)
    with pytest.raises(exc):
        list(torchless.open(p).tensors())


def test_huge_index_refused(tmp_path, monkeypatch):
    from torchless.formats.hf import read

    monkeypatch.setattr(read, "MAX_INDEX_BYTES", 64)
    p = tmp_path / "model.safetensors.index.json"
    p.write_text(json.dumps({"weight_map": {f"t{i}": "m.safetensors" for i in range(20)}}))
    with pytest.raises(LimitError):
        torchless.open(p)


def _evil_bin(path, prefix) -> None:
    payload = b"\x80\x02cposix\nsystem\nq\x00X\x04\x00\x00\x00trueq\x01\x85q\x02Rq\x03."
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{prefix}/data.pkl", payload)
        z.writestr(f"{prefix}/version", "3\n")


def test_malicious_shard_refused_and_scanned(bin_set):
    d, _sd = bin_set
    _evil_bin(d / BIN2, BIN2[:-4])
    with pytest.raises(UnsafeGlobalError):
        list(torchless.open(d).tensors())
    for target in (d, d / "pytorch_model.bin.index.json"):  # the folder, or the index alone
        rep = torchless.scan(target, jobs=1)
        bad = [f for f in rep.files if f.verdict == "dangerous"]
        assert [os.path.basename(f.path) for f in bad] == [BIN2], target
        assert any(x.global_name == "posix.system" for x in bad[0].findings)
        assert {os.path.basename(f.path) for f in rep.files} >= {BIN1, BIN2}
        assert rep.exit_code == 1


def test_scan_of_index_naming_outside_shard_is_an_error(st_set):
    d, _sd = st_set
    _rewrite(d, "model.safetensors.index.json", lambda x: x["weight_map"].update({"evil": "../../etc/passwd"}))
    rep = torchless.scan(d / "model.safetensors.index.json", jobs=1)
    assert rep.exit_code == 2


def test_unrelated_files_with_one_name_are_no_set(tmp_path, capsys):
    # issue 36 bug 2: a folder of two unrelated .safetensors files holding a tensor of the
    # same name was read as one hf model (one file at "tensors: 0"), and convert kept one
    # of the two silently; now info, ls and convert refuse it in one line, writing nothing
    d = tmp_path / "mixed"
    d.mkdir()
    st_torch.save_file({"w": torch.zeros(2, 2), "a": torch.ones(3)}, str(d / "first.safetensors"))
    st_torch.save_file({"w": torch.ones(2, 2)}, str(d / "second.safetensors"))
    dst = tmp_path / "out.safetensors"
    for argv in (["info", d], ["ls", d], ["info", d, "--json"], ["convert", d, dst]):
        assert main([str(a) for a in argv]) == 2, argv
        got = capsys.readouterr()
        err = got.err.strip()
        assert len(err.splitlines()) == 1, got
        assert "'w'" in err and "first.safetensors" in err and "second.safetensors" in err, err
        if "--json" in argv:  # --json on an error: the error as a JSON document on stdout
            assert json.loads(got.out)["error"]["type"] == "FormatError", got
        else:
            assert not got.out, got
    assert not os.path.exists(dst) and sorted(os.listdir(tmp_path)) == ["mixed"]
    assert main(["verify", str(d)]) == 1  # verify lists the duplicate as before
    assert "duplicate" in capsys.readouterr().out


def test_info_lists_shards_in_file_order(st_set, capsys):
    # issue 36 bug 6: the shards were listed in the order of their first tensor in the
    # weight_map; transformers loads sorted(set(weight_map.values())): file order
    d, sd = st_set
    idx = d / "model.safetensors.index.json"
    data = json.loads(idx.read_text())
    data["weight_map"] = dict(sorted(data["weight_map"].items(), key=lambda kv: kv[1] != ST2))  # shard 2's tensors first
    assert next(iter(data["weight_map"].values())) == ST2
    idx.write_text(json.dumps(data))
    assert main(["info", str(d), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert [s["file"] for s in info["shards"]] == [ST1, ST2]
    assert main(["info", str(d)]) == 0
    out = capsys.readouterr().out
    assert out.index(ST1) < out.index(ST2)


def test_missing_shard_message_says_it_once(st_set, capsys):
    # issue 36 bug 6: "shard not found (found '<that shard>')" named the shard twice, the
    # second time as what was found
    d, _sd = st_set
    os.unlink(d / ST2)
    assert main(["info", str(d)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"member '{ST2}': shard not found" in err and "found '" not in err, err
