"""Which fast paths run: one settings object, read once from the environment.

Every hot path of torchless has a general way (the code that states the format's rules
one record, one opcode, one entry at a time) and, where a benchmark showed it worth its
lines (bench/RESULTS.md), a fast way beside it that gives the same result on the inputs
it takes and hands anything else to the general way. Each fast way is compared with its
general way on the same inputs by its own tests in every run.

:data:`SETTINGS` says which fast ways run. ``TORCHLESS_GENERAL_PATHS=1`` in the
environment (read once, when this module is imported) turns them off, so that a whole
test run exercises the general code alone; the tests of one fast way set its field
(``monkeypatch.setattr(SETTINGS, "zip_directory", False)``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields

__all__ = ["Settings", "SETTINGS", "GENERAL_PATHS_ENV"]

#: the environment variable that selects the general paths (value ``1``)
GENERAL_PATHS_ENV = "TORCHLESS_GENERAL_PATHS"


@dataclass(slots=True)
class Settings:
    """The fast paths, each True when it runs (the default), with where it lives."""

    #: pickle/machine.py: torch's tensor rebuild calls (``_rebuild_tensor_v2`` and kin)
    #: run without the generic REDUCE dispatch
    tensor_calls: bool = True
    #: pickle/machine.py (under ``tensor_calls``): a window of state-dict entries
    #: tokenised together (pickle/entryscan.py)
    scan_entries: bool = True
    #: pickle/machine.py (under ``tensor_calls``): a run of scanned entries builds its
    #: tensors together (``persistent_load_many``)
    batch_entries: bool = True
    #: pickle/writer.py: tensors written by the direct tensor writer
    pickle_tensors: bool = True
    #: container/ziprun.py: runs of same-sized central-directory entries parsed as NumPy rows
    zip_directory: bool = True
    #: formats/pt/read.py: the per-record checks on a directory run's columns at once
    pt_record_checks: bool = True
    #: formats/pt/read.py: an eager load's runs of records read ahead on a helper thread
    pt_read_ahead: bool = True
    #: formats/pt/write.py: the state-dict pickle emitted row by row (``save_plain_tensors``)
    pt_pickle: bool = True
    #: formats/dcp/metadata.py: the ``.metadata`` pickle decoded by the fast loader
    dcp_metadata: bool = True
    #: formats/dcp/items.py: a DCP item's zip directory and ``data.pkl`` decoded by the
    #: fast parser, items of a file batched
    dcp_items: bool = True
    #: formats/safetensors_spec.py: the header checked for all entries at once
    safetensors_header: bool = True
    #: formats/safetensors.py: a dict of plain arrays written with one ``writev``
    safetensors_arrays: bool = True
    #: core/tensor.py: ``numpy()`` of a C-contiguous host-order tensor is one ``frombuffer``
    tensor_numpy: bool = True
    #: diff.py: stored bytes compared before any tensor is decoded
    diff_raw_first: bool = True

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] = os.environ) -> Settings:
        """The settings ``environ`` selects: every fast path, or with
        ``TORCHLESS_GENERAL_PATHS=1`` the general paths (the fast ways that run only
        inside another one, and the safetensors array writer, stay as they are)."""
        if environ.get(GENERAL_PATHS_ENV) != "1":
            return cls()
        keep = {"scan_entries", "batch_entries", "safetensors_arrays"}
        return cls(**{f.name: f.name in keep for f in fields(cls)})


#: the settings of this process (read from the environment once, at import)
SETTINGS = Settings.from_environ()
