"""The README's first command, ``bash scripts/demo.sh``, runs to its end: every command
of the main job on the sample artifacts exits as the script expects (``set -e``; the
commands that must fail are run through its ``try``)."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.skipif(shutil.which("bash") is None, reason="the demo is a bash script")
def test_the_demo_runs_to_its_end():
    cli = pathlib.Path(sys.executable).parent / "torchless"
    if not cli.exists():
        pytest.skip(f"no torchless command beside {sys.executable} (install torchless first)")
    env = dict(os.environ, TORCHLESS_DEMO_CLI=str(cli))
    r = subprocess.run(["bash", "scripts/demo.sh"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    assert r.stdout.rstrip().endswith("demo finished")
