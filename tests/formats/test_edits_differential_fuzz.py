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

import pytest

pytest.importorskip("torch", reason="torch exports the models and is the oracle")
pytest.importorskip("onnxruntime", reason="onnxruntime runs the edited ONNX models")
pytest.importorskip("onnx", reason="torch's ONNX exporter needs it")

import edits_fuzz  # noqa: E402
from tl_testutil import run_daily_fuzz  # noqa: E402

pytestmark = pytest.mark.differential


def test_edits_against_the_real_loaders(tmp_path):
    stats = edits_fuzz.Stats()
    run_daily_fuzz(
        edits_fuzz.run_case,
        stats,
        tmp_path,
        name="edits",
        env="TORCHLESS_EDITS_SEED",
        replay="python tests/edits_fuzz.py",
        seconds=25,
    )
    assert stats.cases >= 8, stats
