"""verify checks the CRC-32 of every record of every DCP item (each item is a small
``torch.save`` archive): a flipped payload byte, which torch's DCP loader does not notice,
is reported, for tensor chunks and bytes items alike."""

from __future__ import annotations

import os
import warnings

import pytest

import torchless
from torchless.cli.main import main as cli
from torchless.formats.dcp.read import DCPReader

torch = pytest.importorskip("torch", reason="torch writes the checkpoints (the oracle)")
dcp = pytest.importorskip("torch.distributed.checkpoint", reason="torch.distributed.checkpoint is missing")


@pytest.fixture()
def saved(tmp_path):
    g = torch.Generator().manual_seed(0)
    sd = {"w": torch.randn(64, 8, generator=g), "b": torch.randn(8, generator=g), "extra": {"step": 7, "name": "run"}}
    d = str(tmp_path / "ck")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(sd, checkpoint_id=d, no_dist=True)
    return d


def _flip(path: str, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x10]))


def test_clean_checkpoint_verifies(saved):
    assert torchless.open(saved).verify() == []
    assert cli(["verify", saved]) == 0


def test_flipped_tensor_payload_byte_is_a_crc_error(saved):
    r = DCPReader(saved)
    ref = r.chunks("w")[0]
    r.locate(ref)
    path = os.path.join(saved, ref.info.relative_path)
    r.close()
    _flip(path, ref.data_offset + 100)
    probs = torchless.open(saved).verify()
    assert [(p.code, p.member) for p in probs] == [("crc", "w")], probs
    assert "stored" in probs[0].message and ref.info.relative_path in probs[0].message
    assert cli(["verify", saved]) == 1


def test_flipped_bytes_item_is_reported(saved):
    r = DCPReader(saved)
    names = r.bytes_names()
    assert names, "torch wrote no bytes item"
    info = r.bytes_info(names[0])
    path = os.path.join(saved, info.relative_path)
    r.close()
    _flip(path, info.offset + 40)  # inside the item's first record (its pickle)
    probs = torchless.open(saved).verify()
    assert probs and all(p.member == names[0] for p in probs), probs
    assert cli(["verify", saved]) == 1
