"""Open-world differential fuzz of the tensor writers (issue 31), bounded for CI.

Cases come from ``tests/writers_fuzz.py``. The seeds change every day (a base derived from
the UTC date, printed) so CI explores new cases over time; set
``TORCHLESS_WRITERS_SEED=<base>`` to replay a day's run, or replay one case with
``PYTHONPATH=src python tests/writers_fuzz.py SEED``. The run stops after
``TORCHLESS_WRITERS_CASES`` cases (default 60) or 20 seconds, whichever is first, and
asserts that at least 10 cases ran. Longer runs: ``scripts/fuzz_writers.py`` (counts in
docs/robustness.md).
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch", reason="torch is the oracle")
pytest.importorskip("safetensors", reason="safetensors is the oracle")

import writers_fuzz  # noqa: E402
from tl_testutil import run_daily_fuzz  # noqa: E402

pytestmark = pytest.mark.differential


def test_writers_against_the_real_readers(tmp_path):
    stats = writers_fuzz.Stats()
    run_daily_fuzz(
        writers_fuzz.run_case,
        stats,
        tmp_path,
        name="writers",
        env="TORCHLESS_WRITERS_SEED",
        replay="python tests/writers_fuzz.py",
        seconds=20,
    )
    assert stats.cases >= 10, stats
    assert stats.writes and stats.refusals, stats


@pytest.mark.parametrize("seed", [2001159])
def test_writers_seeds_the_long_runs_failed(seed, tmp_path):
    """Seeds a long run failed on, replayed. 2001159: a transposed view of shape (1, 1)
    and strides (1, 2), saved to .pt and loaded by torch with those strides; the harness's
    byte comparison raised instead of comparing (the harness's bug, not torchless's)."""
    stats = writers_fuzz.Stats()
    writers_fuzz.run_case(seed, stats, str(tmp_path))
    assert stats.cases == 1 and stats.writes, stats
