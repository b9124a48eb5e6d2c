"""Open-world differential fuzz of weight edits (issue 31), bounded for CI.

Cases come from ``tests/edits_fuzz.py``: random small modules exported by
``torch.jit.trace``/``script``, ``torch.export`` and ``torch.onnx.export``, edited by
torchless with random new weights and run by the real loaders against the torch module
holding the same weights. The seeds change every day (a base derived from the UTC date,
printed); ``TORCHLESS_EDITS_SEED=<base>`` replays a day's run and
``PYTHONPATH=src python tests/edits_fuzz.py SEED`` one case. The run stops after
``TORCHLESS_EDITS_CASES`` cases (default 60) or 25 seconds, whichever is first, and
asserts that at least 8 cases ran. Longer runs: ``scripts/fuzz_edits.py`` (counts in
docs/robustness.md).
"""

from __future__ import annotations

import datetime
import os
import time
import warnings

import pytest

pytest.importorskip("torch", reason="torch exports the models and is the oracle")
pytest.importorskip("onnxruntime", reason="onnxruntime runs the edited ONNX models")
pytest.importorskip("onnx", reason="torch's ONNX exporter needs it")

import edits_fuzz  # noqa: E402

pytestmark = pytest.mark.differential


def _base() -> int:
    env = os.environ.get("TORCHLESS_EDITS_SEED")
    if env:
        return int(env)
    return int(datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d")) * 1000


def test_edits_against_the_real_loaders(tmp_path):
    base = _base()
    cases = int(os.environ.get("TORCHLESS_EDITS_CASES", "60"))
    print(f"edits fuzz: seeds {base}..{base + cases - 1} (TORCHLESS_EDITS_SEED={base} replays)")
    stats = edits_fuzz.Stats()
    t0 = time.monotonic()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for seed in range(base, base + cases):
            root = tmp_path / str(seed)
            root.mkdir()
            try:
                edits_fuzz.run_case(seed, stats, str(root))
            except Exception as e:  # name the seed: `python tests/edits_fuzz.py SEED` replays it
                raise AssertionError(f"seed {seed} (TORCHLESS_EDITS_SEED={base}): {type(e).__name__}: {e}") from e
            if time.monotonic() - t0 > 25:
                break
    print(stats)
    assert stats.cases >= 8, stats
