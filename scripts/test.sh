#!/usr/bin/env bash
# Set up (.venv with torch==2.13.0 and the test tools), lint (scripts/lint.sh: ruff and
# mypy; a lint failure fails the run) and run the whole test suite, then its differential,
# hostile-input and property suites again on the general code only (no fast paths).
# Extra arguments go to pytest, e.g. `scripts/test.sh -k zip -x`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test
bash scripts/lint.sh
.venv/bin/python -m pytest -q "$@"
if [ "$#" -eq 0 ]; then
    # the differential, hostile-input and property suites once more on the general code
    # only (torchless.core.settings: every fast path off), so both ways of reading and writing
    # pass them (the fast paths' own tests compare the two on the same inputs)
    TORCHLESS_GENERAL_PATHS=1 .venv/bin/python -m pytest -q \
        tests/formats/test_pt_differential_fuzz.py tests/formats/test_pt_hostile.py \
        tests/formats/test_pt_property.py tests/formats/test_pt.py tests/pickle tests/formats/dcp
fi
