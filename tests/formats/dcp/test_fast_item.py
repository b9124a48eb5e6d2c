"""The DCP item fast path (``read._fast_item``) against the general zip reader + pickle
machine: the same chunk locations on real checkpoints, and on mutated items the fast path
either finds exactly what the general path finds or leaves the item to it."""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys

import pytest

from torchless.container.zip import TorchZipWriter
from torchless.core.errors import TorchlessError
from torchless.core.settings import SETTINGS
from torchless.formats.dcp.items import fast_item as _fast_item
from torchless.formats.dcp.reader import DCPReader
from torchless.formats.dcp.readers import open_reader

GEN = r"""
import sys, warnings, torch, torch.distributed.checkpoint as dcp
g = torch.Generator().manual_seed(0)
sd = {
    "f32": torch.randn(7, 5, generator=g),
    "bf16": torch.randn(3, 4, generator=g).to(torch.bfloat16),
    "f16": torch.randn(9, generator=g).half(),
    "i64": torch.arange(11),
    "i8": torch.arange(-4, 4, dtype=torch.int8),
    "bool": torch.tensor([True, False, True]),
    "c64": torch.randn(2, 3, dtype=torch.complex64, generator=g),
    "scalar": torch.tensor(3.5),
    "empty": torch.zeros(0, 4),
    "grad": torch.nn.Parameter(torch.randn(4, 2, generator=g)),
    "strided": torch.randn(6, 6, generator=g).t(),
    "nested": {"a": torch.ones(2, 2, dtype=torch.float64), "step": 7},
}
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    dcp.save(sd, checkpoint_id=sys.argv[1], no_dist=True)
"""


@pytest.fixture(scope="module")
def small_dcp(tmp_path_factory: pytest.TempPathFactory) -> str:
    pytest.importorskip("torch", reason="torch writes the DCP fixture; not installed")
    d = str(tmp_path_factory.mktemp("fastdcp") / "ckpt")
    subprocess.run([sys.executable, "-c", GEN, d], check=True, capture_output=True)
    return d


def _key(ref):
    return (ref.data_offset, ref.stride, ref.storage_nbytes, ref.byteorder)


def _outcome(reader: DCPReader, fqn: str):
    """What locating every chunk of ``fqn`` gives: the chunk facts, or the error."""
    try:
        out = []
        for ref in reader.chunks(fqn):
            ref.data_offset = -1
            out.append(_key(reader.locate(ref)))
        return ("ok", out)
    except TorchlessError as e:
        return ("error", type(e).__name__, str(e))


def _outcome_batch(reader: DCPReader, fqn: str):
    """:func:`_outcome` through ``locate_many`` (the array checks run even for one item)."""
    try:
        refs = reader.chunks(fqn)
        for ref in refs:
            ref.data_offset = -1
        reader.locate_many(refs)
        return ("ok", [_key(ref) for ref in refs])
    except TorchlessError as e:
        return ("error", type(e).__name__, str(e))


@pytest.fixture(autouse=True)
def _batch_always(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(DCPReader, "batch_min", 0)


@pytest.fixture
def fast_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fast paths on (TORCHLESS_GENERAL_PATHS=1 turns them off for the rest of the suite;
    these tests compare them with the general code themselves)."""
    monkeypatch.setattr(SETTINGS, "dcp_metadata", True)
    monkeypatch.setattr(SETTINGS, "dcp_items", True)
    monkeypatch.setattr(SETTINGS, "pt_pickle", True)


def _compare_all(path: str) -> int:
    fast, general = open_reader(path), open_reader(path)
    general.general_only = True
    used = 0
    try:
        for fqn in fast.tensor_names():
            assert _outcome(fast, fqn) == _outcome(general, fqn), fqn
            assert _outcome_batch(fast, fqn) == _outcome(general, fqn), fqn
            for ref in fast.chunks(fqn):
                src = fast._item_source(ref.info, "item")
                used += _fast_item(src.view(0, src.size)) is not None
    finally:
        fast.close()
        general.close()
    return used


def test_fast_item_matches_general_single_rank(small_dcp, fast_paths):
    used = _compare_all(small_dcp)
    r = open_reader(small_dcp)
    n = sum(len(r.chunks(f)) for f in r.tensor_names())
    r.close()
    assert used == n  # every item torch wrote takes the fast path


def test_fast_item_matches_general_multi_rank(saved2, fast_paths):
    ckpt, _ref = saved2
    assert _compare_all(ckpt) > 0


def test_fast_item_values_equal_general(small_dcp, fast_paths):
    fast, general = open_reader(small_dcp), open_reader(small_dcp)
    general.general_only = True
    for fqn in fast.tensor_names():
        assert bytes(fast.read_block(fqn)) == bytes(general.read_block(fqn)), fqn


def test_fast_item_mutations_never_differ(small_dcp, tmp_path, fast_paths):
    """Flip bytes all over a few items (zip structures and pickle alike): the fast
    reader's outcome equals the general reader's every time."""
    d = str(tmp_path / "ckpt")
    shutil.copytree(small_dcp, d)
    probe = open_reader(d)
    targets = [(fqn, probe.chunks(fqn)[0].info) for fqn in ("f32", "bf16", "scalar", "strided")]
    probe.close()
    rng = random.Random(12)
    fast_hits = 0
    for fqn, info in targets:
        path = os.path.join(d, info.relative_path)
        with open(path, "rb") as f:
            f.seek(info.offset)
            orig = f.read(info.length)
        positions = list(range(info.length))
        rng.shuffle(positions)
        for pos in positions[:80]:
            for val in (orig[pos] ^ 0xFF, orig[pos] ^ 0x01, 0):
                if val == orig[pos]:
                    continue
                with open(path, "r+b") as f:
                    f.seek(info.offset + pos)
                    f.write(bytes([val]))
                fast, general = open_reader(d), open_reader(d)
                general.general_only = True
                try:
                    got = _outcome(fast, fqn)
                    assert got == _outcome(general, fqn), (fqn, pos, val)
                    assert _outcome_batch(fast, fqn) == got, (fqn, pos, val)
                    src = fast._item_source(fast.chunks(fqn)[0].info, "item")
                    fast_hits += _fast_item(src.view(0, src.size)) is not None
                finally:
                    fast.close()
                    general.close()
                with open(path, "r+b") as f:
                    f.seek(info.offset + pos)
                    f.write(orig[pos : pos + 1])
    assert fast_hits > 0  # some mutations (payload, CRC, ids) keep the fast path


def test_fast_item_refuses_non_items():
    assert _fast_item(memoryview(b"")) is None
    assert _fast_item(memoryview(b"PK\x05\x06" + bytes(18))) is None
    assert _fast_item(memoryview(bytes(200))) is None


def test_locate_many_all_items_at_once(small_dcp, tmp_path, monkeypatch, fast_paths):
    """Every chunk of the checkpoint in one locate_many (one batch per file), with one item
    damaged in its pickle: the others are located as locate finds them, the damaged one
    raises what locate raises."""
    whole = open_reader(small_dcp)
    refs = [r for f in whole.tensor_names() for r in whole.chunks(f)]
    per_item = []
    locate = DCPReader.locate
    monkeypatch.setattr(DCPReader, "locate", lambda self, ref: per_item.append(ref.fqn) or locate(self, ref))
    whole.locate_many(refs)
    # the batch took every item torch wrote but the empty tensor's (an empty record has no
    # data descriptor: another zip layout than the template's, left to the per-item path)
    assert per_item == ["empty"]
    monkeypatch.setattr(DCPReader, "locate", locate)
    general = open_reader(small_dcp)
    general.general_only = True
    for r in refs:
        assert _key(r) == _key(general.locate(general.chunks(r.fqn)[r.index])), r.fqn
    whole.close()
    d = str(tmp_path / "ckpt")
    shutil.copytree(small_dcp, d)
    info = general.chunks("bf16")[0].info
    general.close()
    path = os.path.join(d, info.relative_path)
    with open(path, "r+b") as f:
        f.seek(info.offset)
        item = f.read(info.length)
        at = item.index(b"BFloat16Storage")
        f.seek(info.offset + at)
        f.write(b"Float16Storage\n")  # another storage class: the chunk dtype no longer matches
    broken, general = open_reader(d), open_reader(d)
    general.general_only = True
    try:
        want = _outcome(general, "bf16")
        assert want[0] == "error"
        refs = [r for f in broken.tensor_names() for r in broken.chunks(f)]
        with pytest.raises(TorchlessError) as e:
            broken.locate_many(refs)
        assert (type(e.value).__name__, str(e.value)) == want[1:]
        for r in refs:
            if r.fqn != "bf16" and r.data_offset >= 0:
                assert _key(r) == _key(general.locate(general.chunks(r.fqn)[r.index])), r.fqn
    finally:
        broken.close()
        general.close()


FLAT = r"""
import sys, warnings, torch, torch.distributed.checkpoint as dcp
g = torch.Generator().manual_seed(1)
sd = {f"layer.{i}.w": torch.randn(1 + i % 5, 3, generator=g) for i in range(30)}
sd.update({
    "bf16": torch.randn(3, 4, generator=g).to(torch.bfloat16),
    "i64": torch.arange(11),
    "bool": torch.tensor([True, False]),
    "scalar": torch.tensor(2.5),
    "empty": torch.zeros(0, 4),
    "grad": torch.nn.Parameter(torch.randn(4, 2, generator=g)),
    "strided": torch.randn(6, 6, generator=g).t(),
    "0": torch.ones(2),  # a one-character name (CPython shares those str objects)
    "cpu": torch.ones(3),
})
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    dcp.save(sd, checkpoint_id=sys.argv[1], no_dist=True)
"""


@pytest.fixture(scope="module")
def flat_dcp(tmp_path_factory: pytest.TempPathFactory) -> str:
    pytest.importorskip("torch", reason="torch writes the DCP fixture; not installed")
    d = str(tmp_path_factory.mktemp("flatdcp") / "ckpt")
    subprocess.run([sys.executable, "-c", FLAT, d], check=True, capture_output=True)
    return d


@pytest.mark.parametrize("which", ["small", "flat"])
def test_consolidate_bytes_equal_general(which, small_dcp, flat_dcp, tmp_path, monkeypatch, fast_paths):
    """consolidate to .pt with every fast path (metadata, batch locate, map views, the
    row writer of a flat state dict) writes the same bytes as with none of them."""
    import torchless.formats.pt.write as ptw
    from torchless.formats.dcp.consolidate import consolidate

    src = small_dcp if which == "small" else flat_dcp
    os.makedirs(tmp_path / "fast")
    os.makedirs(tmp_path / "general")
    rows = []
    plain = ptw._save_rows
    monkeypatch.setattr(ptw, "_save_rows", lambda *a, **k: rows.append(plain(*a, **k)) or rows[-1])
    many = []
    write_many = TorchZipWriter.write_small_many
    crcs_given = []
    monkeypatch.setattr(
        TorchZipWriter,
        "write_small_many",
        lambda self, n, v, c=None: many.append(len(n)) or crcs_given.append(c is not None) or write_many(self, n, v, c),
    )
    consolidate(src, str(tmp_path / "fast" / "out.pt"))
    assert rows == ([True] if which == "flat" else [])  # the flat one took the row writer
    if which == "flat":  # most storages written from the map together (not the empty, strided ones)
        assert sum(many) >= 30
        assert all(crcs_given)  # with their CRC-32s taken from the map (crc32_spans)
    monkeypatch.setattr(TorchZipWriter, "write_small_many", write_many)
    monkeypatch.setattr(SETTINGS, "dcp_metadata", False)
    monkeypatch.setattr(SETTINGS, "dcp_items", False)
    monkeypatch.setattr(SETTINGS, "pt_pickle", False)
    consolidate(src, str(tmp_path / "general" / "out.pt"))
    with open(tmp_path / "fast" / "out.pt", "rb") as a, open(tmp_path / "general" / "out.pt", "rb") as b:
        assert a.read() == b.read()


@pytest.mark.parametrize(
    "planner",
    [
        None,
        [],
        {},
        {"a": ("a",), "b": ("b",), "c": ("c",)},
        {"a": ("x",), "b": ("x",), "c": ("c",)},  # two keys onto one name: the later wins
        {"a": ("a",), "c": ("c",)},  # a key without a path stays flat
        {"a": ("m", "a"), "b": ("b",), "c": ("c",)},  # nested
        {"a": ("a",), "b": (), "c": (3,)},
        {"a": ["a"], "b": ("b", 0), "c": ("c",)},
    ],
)
def test_flat_tree_is_unflatten(planner):
    """consolidate's one-part key paths give what unflatten gives, for any planner data."""
    from torchless.formats.dcp.consolidate import _flat_tree
    from torchless.formats.dcp.read import unflatten

    order = ["a", "b", "c"]
    try:
        want = unflatten({n: n for n in order}, planner)
    except TorchlessError as e:
        with pytest.raises(type(e)):
            _flat_tree(order, planner)
        return
    got = _flat_tree(order, planner)
    assert got == want and list(got) == list(want)
