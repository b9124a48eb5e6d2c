"""Reshard plans from metadata alone: a synthetic terabyte checkpoint of 1,024 ranks planned
onto 768, and a real checkpoint's plan checked against what reshard then writes."""

from __future__ import annotations

import json
import os

import torchless.dcp
from torchless.cli.main import main
from torchless.formats.dcp.metadata import read_metadata
from torchless.formats.dcp.plan import parse_size, plan, synthetic
from torchless.formats.dcp.spec import TensorStorageMetadata, numel

SAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "..", "samples")


def test_terabyte_1024_to_768_is_balanced():
    md = synthetic(10**12, 1024, tensors=64)
    tensors = [v for v in md.state_dict_metadata.values() if isinstance(v, TensorStorageMetadata)]
    total = sum(numel(v.size) * v.dtype.itemsize for v in tensors)
    assert 0.99e12 < total <= 1e12
    assert {len(v.chunks) for v in tensors} == {1024}
    res = plan(md, 768)
    tasks = res["tasks"]
    assert len(tasks) == 768
    written = [t["bytes_written"] for t in tasks]
    mean = sum(written) / len(written)
    assert max(written) <= 1.1 * mean and min(written) >= 0.9 * mean  # balanced within 10 %
    # every tensor byte is written once, and read once (row splits: no chunk read twice)
    assert res["total_bytes_written"] - total in (0, 1024)  # + the one non-tensor value
    assert res["total_bytes_read"] == res["total_bytes_written"]
    # 1024 source pieces onto 768: each output piece overlaps 2 or 3 source chunks
    assert all(2 * t["items"] - 2 <= t["reads"] <= 3 * t["items"] for t in tasks)
    crit = res["critical_path"]
    assert crit["bytes"] == max(t["bytes_read"] + t["bytes_written"] for t in tasks)


def test_plan_matches_what_reshard_writes(tmp_path):
    src = os.path.join(SAMPLES, "dcp_ckpt")
    res = plan(src, 3)
    torchless.dcp.reshard(src, tmp_path / "out", 3)
    md = read_metadata(tmp_path / "out")
    per_file: dict[str, int] = {}
    by_key = {(k.fqn, k.offset): v for k, v in md.storage_data.items()}
    for fqn, it in md.state_dict_metadata.items():
        if isinstance(it, TensorStorageMetadata):
            for c in it.chunks:
                f = by_key[(fqn, c.offsets)].relative_path
                per_file[f] = per_file.get(f, 0) + numel(c.sizes) * it.dtype.itemsize
    src_md = read_metadata(src)
    values = {k for k, v in src_md.state_dict_metadata.items() if not isinstance(v, TensorStorageMetadata)}
    for t in res["tasks"]:
        value_bytes = sum(
            by_key[(k, None)].length for k in values if by_key.get((k, None)) and by_key[(k, None)].relative_path == t["file"]
        )
        assert t["bytes_written"] - value_bytes == per_file.get(t["file"], 0), t


def test_cli_plan_only_json(capsys, tmp_path):
    assert main(["reshard", "synthetic:2GB:8:4", "--ranks", "6", "--plan-only", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ranks"] == 6 and len(out["tasks"]) == 6 and out["balance"] < 1.1
    assert not os.listdir(tmp_path)
    assert main(["reshard", "synthetic:lots:8", "--ranks", "6", "--plan-only"]) == 2
    assert main(["reshard", os.path.join(SAMPLES, "dcp_ckpt"), "--ranks", "2"]) == 2  # no destination


def test_parse_size():
    assert parse_size("1TB") == 10**12 and parse_size("512MiB") == 2**29 and parse_size("1000") == 1000


def test_one_size_parser_for_plan_and_convert(capsys):
    """``dcp plan`` (a synthetic checkpoint's size) reads sizes as ``convert --max-shard-size``
    does: ``1G`` was refused by the plan's own parser (issue 35); both are now one parser."""
    from torchless.core.sizes import parse_size as one
    from torchless.formats.safetensors import parse_size as shard_size

    assert parse_size is one and shard_size is one
    assert main(["reshard", "synthetic:2G:8:4", "--ranks", "6", "--plan-only", "--json"]) == 0
    a = json.loads(capsys.readouterr().out)
    assert main(["reshard", "synthetic:2GB:8:4", "--ranks", "6", "--plan-only", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["tasks"] == a["tasks"]  # 1G is 10**9, as for --max-shard-size
    for text, want in (("1G", 10**9), ("1 gib", 2**30), ("1e3", 1000), ("5GB", 5 * 10**9), ("1.5K", 1500)):
        assert parse_size(text) == want
