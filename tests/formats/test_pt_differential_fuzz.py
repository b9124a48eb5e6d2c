"""The differential fuzzer in the suite: random checkpoints against torch.load (issue 11).

Seeded and bounded: a fixed range of seeds (every one must pass), stopping early only
if the time budget runs out after the minimum count. Longer runs: ``scripts/fuzz_pt.py``
(counts in docs/pt.md). The generator, re-encodings and comparisons are in
``tests/pt_fuzz.py``.
"""

from __future__ import annotations

import time

import pytest

pytestmark = pytest.mark.differential
torch = pytest.importorskip("torch", reason="torch is the differential oracle")

import pt_fuzz  # noqa: E402

SEEDS = range(11_000, 11_250)
MIN_CASES = 120
BUDGET_S = 45.0


def test_differential_fuzz_against_torch():
    stats = pt_fuzz.Stats()
    start = time.monotonic()
    for seed in SEEDS:
        try:
            pt_fuzz.run_case(seed, stats)
        except Exception as e:  # name the seed: `python tests/pt_fuzz.py SEED` replays it
            raise AssertionError(f"seed {seed}: {type(e).__name__}: {e}") from e
        if stats.cases >= MIN_CASES and time.monotonic() - start > BUDGET_S:
            break
    assert stats.cases >= MIN_CASES
    assert set(stats.by_layout) == set(pt_fuzz.LAYOUTS) and set(stats.by_protocol) == {2, 3, 4, 5}
    assert stats.writes == 2 * stats.cases
    assert {"bfloat16", "complex32", "float8_e4m3fn", "uint64", "bool"} <= stats.dtypes


def test_fuzzer_finds_a_wrong_byte():
    """The comparison is not vacuous: a flipped value byte in torchless's result fails it."""
    import io

    import numpy as np

    import torchless

    t = torch.arange(4, dtype=torch.float32)
    buf = io.BytesIO()
    torch.save({"t": t}, buf)
    tl = torchless.open(buf.getvalue(), format="pt").load()
    raw = bytearray(tl["t"].storage.bytes())
    raw[0] ^= 1
    tl["t"].storage._data = memoryview(bytes(raw))
    with pytest.raises(AssertionError):
        pt_fuzz.compare(tl, {"t": t})
    tl2 = torchless.open(buf.getvalue(), format="pt").load()
    pt_fuzz.compare(tl2, {"t": t})
    np.testing.assert_array_equal(tl2["t"].numpy(), t.numpy())
