"""The differential fuzzer in the suite: random checkpoints against torch.load (issues 11, 31).

Seeded and bounded: 250 seeds from a base that changes every day (UTC), every one must
pass, stopping early only if the time budget runs out after the minimum count. A failure
names its seed and base; ``TORCHLESS_PT_FUZZ_SEED=<base>`` runs the same seeds again, and
``python tests/pt_fuzz.py SEED`` replays one case. Longer runs: ``scripts/fuzz_pt.py``
(counts in docs/pt.md). The generator, re-encodings and comparisons are in
``tests/pt_fuzz.py``.
"""

from __future__ import annotations

import datetime
import os
import time

import pytest

pytestmark = pytest.mark.differential
torch = pytest.importorskip("torch", reason="torch is the differential oracle")

import pt_fuzz  # noqa: E402

#: the environment variable that fixes the base seed (replaying a failing day's run)
SEED_ENV = "TORCHLESS_PT_FUZZ_SEED"
N_SEEDS = 250
MIN_CASES = 120
BUDGET_S = 45.0


def base_seed() -> int:
    """The day's base seed (days since 2000-01-01, UTC, times 1000), or the one fixed by
    ``TORCHLESS_PT_FUZZ_SEED``."""
    fixed = os.environ.get(SEED_ENV)
    if fixed:
        return int(fixed)
    today = datetime.datetime.now(datetime.timezone.utc).date()
    return (today - datetime.date(2000, 1, 1)).days * 1000


def test_differential_fuzz_against_torch():
    base = base_seed()
    print(f"pt fuzz: {SEED_ENV}={base}")
    stats = pt_fuzz.Stats()
    start = time.monotonic()
    for seed in range(base, base + N_SEEDS):
        try:
            pt_fuzz.run_case(seed, stats)
        except Exception as e:  # name the seed and base: both replay it
            raise AssertionError(
                f"seed {seed} (replay: python tests/pt_fuzz.py {seed}; this run: {SEED_ENV}={base}): {type(e).__name__}: {e}"
            ) from e
        if stats.cases >= MIN_CASES and time.monotonic() - start > BUDGET_S:
            break
    assert stats.cases >= MIN_CASES
    assert set(stats.by_layout) == set(pt_fuzz.LAYOUTS) and set(stats.by_protocol) == set(pt_fuzz.PROTOCOLS)
    assert stats.writes == 2 * stats.cases
    assert {"bfloat16", "complex32", "float8_e4m3fn", "uint64", "bool"} <= stats.dtypes
    assert len(stats.kinds) >= 12  # the special leaves (quantized, sparse, nested, Parameters...)


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
