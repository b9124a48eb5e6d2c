"""Tied weights: one rule for every source and destination (formats/shared.py).

Issue 31 class 10 / issue 36 bug 1: ``convert tied.bin t.safetensors`` wrote both names
as copies (``--strict`` passed) while the same file inside a folder dropped the alias
(``--strict`` refused), and a sharded safetensors destination left the alias out of the
index while ``dropped`` was ``[]`` and ``tensors`` still counted it. Now: a safetensors
destination (one file or a set) stores an exact alias once, lists it in ``dropped``,
counts only what it wrote, records ``{alias: kept}`` in ``__metadata__`` (as
``safetensors.torch.save_model``), and ``--strict`` refuses, whatever the source; ``.pt``
and ``.bin`` keep the sharing; ``.npz`` writes a copy under each name (as ``np.savez``).
Oracles: torch, the safetensors package (``load_file``, ``load_model``), numpy.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

import torchless
from torchless.cli.main import main
from torchless.core.errors import UsageError

torch = pytest.importorskip("torch", reason="torch is the oracle")
st_torch = pytest.importorskip("safetensors.torch", reason="safetensors is the oracle")

pytestmark = pytest.mark.differential

NOTE = "alias of model.embed_tokens.weight (one storage; safetensors stores it once)"


class Tied(torch.nn.Module):
    """A language-model shape whose head is tied to its embedding (as transformers ties them)."""

    def __init__(self) -> None:
        super().__init__()
        self.model = torch.nn.Module()
        self.model.embed_tokens = torch.nn.Embedding(16, 8)
        self.model.norm = torch.nn.LayerNorm(8)
        self.lm_head = torch.nn.Linear(8, 16, bias=False)
        self.lm_head.weight = self.model.embed_tokens.weight


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """The same tied state dict as one file and as a Hugging Face folder."""
    torch.manual_seed(0)
    m = Tied()
    sd = m.state_dict()
    assert sd["lm_head.weight"].data_ptr() == sd["model.embed_tokens.weight"].data_ptr()
    root = tmp_path_factory.mktemp("tied")
    torch.save(sd, root / "tied.bin")
    (root / "set").mkdir()
    torch.save(sd, root / "set" / "pytorch_model.bin")
    return {"file": root / "tied.bin", "folder": root / "set"}, sd


def _load_set(dst):
    """Every tensor of a written safetensors file or set, by transformers' index rules:
    every name the index lists is in the shard it names, every shard tensor is listed."""
    dst = str(dst)
    if not dst.endswith(".index.json"):
        return st_torch.load_file(dst), [st_torch.safe_open(dst, "pt").metadata()]
    idx = json.load(open(dst))
    folder = os.path.dirname(dst)
    out, metas = {}, []
    for shard in sorted(set(idx["weight_map"].values())):
        part = st_torch.load_file(os.path.join(folder, shard))
        with st_torch.safe_open(os.path.join(folder, shard), "pt") as f:
            metas.append(f.metadata())
        assert {k for k, s in idx["weight_map"].items() if s == shard} == set(part)
        out.update(part)
    assert set(idx["weight_map"]) == set(out)
    assert idx["metadata"]["total_size"] == sum(t.nbytes for t in out.values())
    return out, metas


@pytest.mark.parametrize("source", ["file", "folder"])
@pytest.mark.parametrize("dest", ["t.safetensors", "model.safetensors.index.json"])
def test_safetensors_destinations_store_the_alias_once_and_say_so(sources, source, dest, tmp_path):
    srcs, sd = sources
    dst = tmp_path / dest
    kw = {"max_shard_size": "300B"} if dest.endswith(".index.json") else {}
    res = torchless.convert(srcs[source], dst, **kw)
    assert res["dropped"] == [{"key": "lm_head.weight", "type": NOTE}]
    assert res["tensors"] == len(sd) - 1
    got, metas = _load_set(dst)
    assert set(got) == set(sd) - {"lm_head.weight"}
    for k, v in got.items():
        assert torch.equal(v, sd[k]), k
    if dest.endswith(".index.json"):
        assert len(metas) >= 2  # really sharded
    assert any(m.get("lm_head.weight") == "model.embed_tokens.weight" for m in metas)  # save_model's record
    assert res["bytes"] == sum(v.nbytes for v in got.values())
    if dest == "t.safetensors":  # safetensors' own loader re-ties the alias into the module
        m2 = Tied()
        st_torch.load_model(m2, str(dst))
        for k, v in sd.items():
            assert torch.equal(m2.state_dict()[k], v), k


@pytest.mark.parametrize("source", ["file", "folder"])
@pytest.mark.parametrize("dest", ["t.safetensors", "model.safetensors.index.json"])
def test_strict_refuses_the_alias_drop_for_every_source(sources, source, dest, tmp_path):
    srcs, _sd = sources
    with pytest.raises(UsageError, match="lm_head.weight"):
        torchless.convert(srcs[source], tmp_path / dest, strict=True, max_shard_size="300B")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("source", ["file", "folder"])
def test_destinations_that_keep_every_name(sources, source, tmp_path):
    srcs, sd = sources
    # .pt and .bin shards keep the sharing; .npz a copy under each name (as np.savez)
    for dest, kw in (("t.pt", {}), ("pytorch_model.bin.index.json", {"max_shard_size": "300B"}), ("t.npz", {})):
        res = torchless.convert(srcs[source], tmp_path / dest, strict=True, **kw)
        assert res["dropped"] == [] and res["tensors"] == len(sd), dest
    pt = torch.load(tmp_path / "t.pt", weights_only=True)
    assert pt["lm_head.weight"].data_ptr() == pt["model.embed_tokens.weight"].data_ptr()
    idx = json.load(open(tmp_path / "pytorch_model.bin.index.json"))
    assert set(idx["weight_map"]) == set(sd)
    with np.load(tmp_path / "t.npz") as z:
        assert set(z.files) == set(sd)
        assert np.array_equal(z["lm_head.weight"], sd["model.embed_tokens.weight"].numpy())


def test_write_tensors_applies_the_same_rule(sources, tmp_path):
    _srcs, sd = sources
    files = torchless.write_tensors(dict(torchless.open(_srcs["file"]).tensors()), tmp_path / "w.safetensors")
    got = st_torch.load_file(files[0])
    assert set(got) == set(sd) - {"lm_head.weight"}
    with st_torch.safe_open(files[0], "pt") as f:
        assert f.metadata()["lm_head.weight"] == "model.embed_tokens.weight"


@pytest.mark.parametrize("source", ["file", "folder"])
def test_cli_reports_the_same_for_both_sources(sources, source, tmp_path, capsys):
    srcs, sd = sources
    out = tmp_path / "t.safetensors"
    assert main(["convert", str(srcs[source]), str(out), "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["dropped"] == [{"key": "lm_head.weight", "type": NOTE}] and res["tensors"] == len(sd) - 1
    assert main(["convert", str(srcs[source]), str(tmp_path / "s.safetensors"), "--strict"]) == 2
    assert "lm_head.weight" in capsys.readouterr().err
    assert not (tmp_path / "s.safetensors").exists()
    idx = tmp_path / "hf" / "model.safetensors.index.json"
    idx.parent.mkdir()
    assert main(["convert", str(srcs[source]), str(idx), "--max-shard-size", "300B", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["dropped"] == [{"key": "lm_head.weight", "type": NOTE}] and res["tensors"] == len(sd) - 1
    got, _ = _load_set(idx)
    assert set(got) == set(sd) - {"lm_head.weight"}


def test_range_tasks_apply_the_same_rule(sources, tmp_path):
    """convert with an executor (range tasks reading the source themselves) drops, reports
    and records the alias as the in-process writer does."""
    srcs, sd = sources
    dst = tmp_path / "model.safetensors.index.json"
    res = torchless.convert(srcs["file"], tmp_path / "model.safetensors", max_shard_size="300B", executor="local:1")
    assert res["dropped"] == [{"key": "lm_head.weight", "type": NOTE}] and res["tensors"] == len(sd) - 1
    got, metas = _load_set(dst)
    assert set(got) == set(sd) - {"lm_head.weight"}
    assert all(m.get("lm_head.weight") == "model.embed_tokens.weight" for m in metas)
    for k, v in got.items():
        assert torch.equal(v, sd[k]), k
