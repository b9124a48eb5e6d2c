#!/usr/bin/env bash
# Style, lint and types with the project's configuration (pyproject.toml): `ruff format
# --check`, `ruff check` and `mypy`. Fails on the first tool that reports a problem.
# Uses .venv (scripts/setup.sh test installs the pinned ruff and mypy); LINT_PYTHON
# names another interpreter that has them.
set -euo pipefail
cd "$(dirname "$0")/.."
py="${LINT_PYTHON:-.venv/bin/python}"
paths=(src tests bench scripts samples)
"$py" -m ruff format --check --quiet "${paths[@]}"
"$py" -m ruff check --quiet "${paths[@]}"
"$py" -m mypy
