"""The ``.metadata`` fast path (``metadata.fast_metadata``: the pickle fast path with the
DCP entry hooks) against the general pickle
machine: equal results on checkpoints torch wrote, and on mutated files the fast decoder
either returns exactly what the general path returns or leaves the file to it (so every
error still comes from the general machine)."""

from __future__ import annotations

import os
import random
import subprocess
import sys

import pytest

import torchless.formats.dcp.metadata as mdmod
from torchless.core.errors import TorchlessError
from torchless.core.settings import SETTINGS
from torchless.formats.dcp.metadata import fast_metadata
from torchless.pickle.machine import Limits

GEN = r"""
import sys, warnings, torch, torch.distributed.checkpoint as dcp
g = torch.Generator().manual_seed(0)
n = int(sys.argv[2])
sd = {f"layers.{i}.w": torch.randn(1 + i % 7, 3, generator=g) for i in range(n)}
sd.update({
    "bf16": torch.randn(3, 4, generator=g).to(torch.bfloat16),
    "f16": torch.randn(9, generator=g).half(),
    "i64": torch.arange(11),
    "bool": torch.tensor([True, False, True]),
    "scalar": torch.tensor(3.5),
    "empty": torch.zeros(0, 4),
    "big": torch.zeros(70000, dtype=torch.int8),
    "four_d": torch.zeros(2, 1, 3, 2),
    "grad": torch.nn.Parameter(torch.randn(4, 2, generator=g)),
    "nested": {"a": torch.ones(2, 2, dtype=torch.float64), "step": 7, "lst": [torch.ones(1), 3]},
})
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    dcp.save(sd, checkpoint_id=sys.argv[1], no_dist=True)
"""


@pytest.fixture(scope="module")
def many_dcp(tmp_path_factory: pytest.TempPathFactory) -> str:
    """60 flat tensors (memo indices past 255: LONG_BINGET) plus assorted kinds."""
    pytest.importorskip("torch", reason="torch writes the DCP fixture; not installed")
    d = str(tmp_path_factory.mktemp("fastmeta") / "ckpt")
    subprocess.run([sys.executable, "-c", GEN, d, "60"], check=True, capture_output=True)
    return d


def _raw(path: str) -> bytes:
    with open(os.path.join(path, ".metadata"), "rb") as f:
        return f.read()


def _general(data: bytes):
    old = SETTINGS.dcp_metadata
    SETTINGS.dcp_metadata = False
    try:
        return mdmod.parse_metadata(data)
    finally:
        SETTINGS.dcp_metadata = old


def _outcome(parse, data: bytes):
    try:
        return ("ok", parse(data))
    except TorchlessError as e:
        return ("error", type(e).__name__, str(e))


@pytest.fixture
def hits(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Counts of entries the two templates decoded."""
    count = {"tsm": 0, "sd": 0}
    tsm, sd = mdmod._Entries.tsm, mdmod._Entries.sd

    def tsm_hit(self, data, pos):
        r = tsm(self, data, pos)
        count["tsm"] += r is not None
        return r

    def sd_hit(self, data, pos):
        r = sd(self, data, pos)
        count["sd"] += r is not None
        return r

    monkeypatch.setattr(mdmod._Entries, "tsm", tsm_hit)
    monkeypatch.setattr(mdmod._Entries, "sd", sd_hit)
    return count


def test_equal_to_general_on_torch_files(many_dcp, hits):
    data = _raw(many_dcp)
    fast = fast_metadata(data)
    assert fast is not None
    assert fast == _general(data)
    assert hits["tsm"] >= 60 and hits["sd"] >= 60  # the templates did the work
    # parse_metadata takes the fast path by default and gives the same
    assert mdmod.parse_metadata(data) == fast


def test_equal_to_general_multi_rank(saved2):
    ckpt, _ref = saved2
    data = _raw(ckpt)
    fast = fast_metadata(data)
    assert fast is not None and fast == _general(data)


def test_torchless_written_metadata(many_dcp):
    """torchless writes protocol 2 (GLOBAL, BINPUT, ``copyreg.__newobj__``): the one fast
    path reads that too (opcode by opcode, no entry templates), equal to the general
    machine."""
    md = _general(_raw(many_dcp))
    again = mdmod.dump_metadata(md)
    assert _general(again) == md
    assert fast_metadata(again) == md
    assert mdmod.parse_metadata(again) == md


def test_other_limits_use_the_general_machine(many_dcp):
    assert fast_metadata(_raw(many_dcp), Limits(max_memo=100)) is None


def test_mutations_never_differ(many_dcp):
    """Flip bytes all over the file: the fast decoder's result is the general path's
    whenever it gives one, and parse_metadata's outcome (value or error) is the general
    machine's every time."""
    data = _raw(many_dcp)
    rng = random.Random(7)
    # the whole header and first entries (where globals are defined), then samples of the rest
    positions = list(range(0, 1200)) + rng.sample(range(1200, len(data)), 400)
    rng.shuffle(positions)
    fast_ok = 0
    for pos in positions[:400]:
        val = rng.choice((data[pos] ^ 0xFF, data[pos] ^ 0x01, 0, 0x94, 0x68))
        if val == data[pos]:
            continue
        bad = data[:pos] + bytes([val]) + data[pos + 1 :]
        fast = fast_metadata(bad)
        general = _outcome(_general, bad)
        if fast is not None:
            fast_ok += 1
            assert general == ("ok", fast), pos
        assert _outcome(mdmod.parse_metadata, bad) == general, pos
    assert fast_ok > 0  # some mutations (values, names' bytes) keep the fast path


def test_truncations_never_differ(many_dcp):
    data = _raw(many_dcp)
    for cut in list(range(0, 200, 7)) + list(range(len(data) - 300, len(data))):
        bad = data[:cut]
        assert fast_metadata(bad) is None or _outcome(_general, bad)[0] == "ok"
        assert _outcome(mdmod.parse_metadata, bad) == _outcome(_general, bad), cut


def test_unsafe_global_is_left_to_the_general_machine(many_dcp):
    data = _raw(many_dcp)
    bad = data.replace(b"\x8c\x15TensorStorageMetadata", b"\x8c\x15TensorStorageMetadatb", 1)
    assert bad != data
    assert fast_metadata(bad) is None
    with pytest.raises(TorchlessError, match="TensorStorageMetadatb"):
        mdmod.parse_metadata(bad)


GEN_RUNS = r"""
import sys, warnings, torch, torch.distributed.checkpoint as dcp
g = torch.Generator().manual_seed(1)
sd = {}
for i in range(300):
    if i == 100:
        sd["k" * 300] = torch.ones(2)  # a key past 255 bytes (BINUNICODE) inside a run
    if i == 150:
        sd["step"] = 7  # a value that is no tensor inside a run
    if i == 200:
        sd[f"h.{i}"] = torch.ones(3, dtype=torch.float16)  # another dtype inside a run
    sd[f"layers.{i}.w"] = torch.randn(1 + i % 5, 2, generator=g)
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    dcp.save(sd, checkpoint_id=sys.argv[1], no_dist=True)
"""


def test_entry_runs_equal_to_general(tmp_path, hits, monkeypatch):
    """The hooks go on through the entries that follow a matched one (one hook call per
    run, not per entry): runs broken by a long key, a value that is no tensor and another
    dtype give what the general machine gives, through the fast path, and the memo
    indices past 255 (LONG_BINGET) inside runs resolve to the same objects."""
    pytest.importorskip("torch", reason="torch writes the DCP fixture; not installed")
    d = str(tmp_path / "ckpt")
    subprocess.run([sys.executable, "-c", GEN_RUNS, d], check=True, capture_output=True)
    calls = {"n": 0}
    on_get, on_str = mdmod._Entries.on_get, mdmod._Entries.on_str

    def count_get(self, *a):
        calls["n"] += 1
        return on_get(self, *a)

    def count_str(self, *a):
        calls["n"] += 1
        return on_str(self, *a)

    monkeypatch.setattr(mdmod._Entries, "on_get", count_get)
    monkeypatch.setattr(mdmod._Entries, "on_str", count_str)
    data = _raw(d)
    fast = fast_metadata(data)
    general = _general(data)
    assert fast is not None
    assert fast == general
    assert fast.planner_data == general.planner_data
    assert list(fast.state_dict_metadata) == list(general.state_dict_metadata)
    assert hits["tsm"] >= 290 and hits["sd"] >= 290  # (an entry across a FRAME opcode: by the opcodes)
    assert calls["n"] < 300  # runs of entries, not a hook call per entry (3 per tensor)
