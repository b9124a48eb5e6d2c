#!/usr/bin/env bash
# Set up (.venv with torch==2.13.0 and the test tools), lint (scripts/lint.sh: ruff and
# mypy; a lint failure fails the run) and run the whole test suite.
# Extra arguments go to pytest, e.g. `scripts/test.sh -k zip -x`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test
bash scripts/lint.sh
exec .venv/bin/python -m pytest -q "$@"
