"""The fast-path settings: one object, read from the environment once."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

from torchless.core.settings import GENERAL_PATHS_ENV, Settings

#: the general paths TORCHLESS_GENERAL_PATHS=1 selects (what tests/conftest.py used to set
#: by hand, module by module); the rest run only inside one of these or write the same bytes
GENERAL = {
    "tensor_calls",
    "pickle_tensors",
    "zip_directory",
    "pt_record_checks",
    "pt_read_ahead",
    "pt_pickle",
    "dcp_metadata",
    "dcp_items",
    "safetensors_header",
    "tensor_numpy",
    "diff_raw_first",
}


def test_every_fast_path_runs_by_default():
    s = Settings.from_environ({})
    assert all(getattr(s, f.name) is True for f in dataclasses.fields(s))
    assert Settings.from_environ({GENERAL_PATHS_ENV: "0"}) == s


def test_general_paths_turn_off_the_fast_paths():
    s = Settings.from_environ({GENERAL_PATHS_ENV: "1"})
    off = {f.name for f in dataclasses.fields(s) if getattr(s, f.name) is False}
    assert off == GENERAL
    assert {"scan_entries", "batch_entries", "safetensors_arrays"} == {f.name for f in dataclasses.fields(s)} - off


def test_the_process_settings_come_from_its_environment():
    code = "from torchless.core.settings import SETTINGS; print(SETTINGS.zip_directory, SETTINGS.tensor_calls)"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), GENERAL_PATHS_ENV: "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]
    env[GENERAL_PATHS_ENV] = ""
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.split() == ["True", "True"]
