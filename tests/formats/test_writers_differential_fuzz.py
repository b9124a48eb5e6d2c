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

import datetime
import os
import time
import warnings

import pytest

pytest.importorskip("torch", reason="torch is the oracle")
pytest.importorskip("safetensors", reason="safetensors is the oracle")

import writers_fuzz  # noqa: E402

pytestmark = pytest.mark.differential


def _base() -> int:
    env = os.environ.get("TORCHLESS_WRITERS_SEED")
    if env:
        return int(env)
    return int(datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d")) * 1000


def test_writers_against_the_real_readers(tmp_path):
    base = _base()
    cases = int(os.environ.get("TORCHLESS_WRITERS_CASES", "60"))
    print(f"writers fuzz: seeds {base}..{base + cases - 1} (TORCHLESS_WRITERS_SEED={base} replays)")
    stats = writers_fuzz.Stats()
    t0 = time.monotonic()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for seed in range(base, base + cases):
            root = tmp_path / str(seed)
            root.mkdir()
            try:
                writers_fuzz.run_case(seed, stats, str(root))
            except Exception as e:  # name the seed: `python tests/writers_fuzz.py SEED` replays it
                raise AssertionError(f"seed {seed} (TORCHLESS_WRITERS_SEED={base}): {type(e).__name__}: {e}") from e
            if time.monotonic() - t0 > 20:
                break
    assert stats.cases >= 10, stats
    assert stats.writes and stats.refusals, stats
