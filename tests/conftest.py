"""Shared fixtures for the torchless test suite.

Helpers that several test files import live in ``tl_testutil.py`` next to this file.
"""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

if os.environ.get("TORCHLESS_GENERAL_PATHS") == "1":
    # run the whole suite on the general code only: the pickle machine opcode by opcode and
    # the pickler without its direct tensor writer (tests/formats/test_pt_fast_paths.py
    # compares the two ways on the same inputs in every run)
    import torchless.pickle.machine
    import torchless.pickle.writer

    torchless.pickle.machine.FAST_TENSOR_CALLS = False
    torchless.pickle.writer.FAST_TENSORS = False
    import torchless.container.zip

    torchless.container.zip.FAST_DIRECTORY = False  # the central directory entry by entry
    # the DCP .metadata and item decoders, the state-dict pickle writer, diff's stored-bytes
    # path (their own tests compare each with the general code in every run)
    import torchless.diff
    import torchless.formats.dcp.metadata
    import torchless.formats.dcp.reader
    import torchless.formats.pt.write

    torchless.formats.dcp.metadata.GENERAL_ONLY = True
    torchless.formats.dcp.reader.DCPReader.general_only = True
    torchless.formats.pt.write.FAST_PICKLE = False
    torchless.diff.RAW_FIRST = False
    import torchless.formats.pt.read

    torchless.formats.pt.read.FAST_RECORD_CHECKS = False  # the per-record checks entry by entry
    torchless.formats.pt.read.READ_AHEAD = False  # an eager load's runs read when asked for
    import torchless.core.tensor
    import torchless.formats.safetensors_spec

    torchless.formats.safetensors_spec.FAST_HEADER = False  # entries checked one by one
    torchless.core.tensor.FAST_NUMPY = False  # numpy() through the general strided view


@pytest.fixture(scope="session")
def torch():
    """torch 2.13 as the oracle; tests that need it skip where it is not installed."""
    return pytest.importorskip("torch", reason="torch is the differential oracle; not installed")


@pytest.fixture(autouse=True)
def _no_internal_errors(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch):
    """Fail any test during which torchless raised an InternalError (a bug), even when the
    test, or torchless itself (the scanner turns errors into findings), swallowed it as
    one more TorchlessError. Tests about InternalError itself are marked
    ``allows_internal_error``."""
    if request.node.get_closest_marker("allows_internal_error"):
        yield
        return
    from torchless.core.errors import InternalError

    seen: list[str] = []
    real_init = InternalError.__init__

    def init(self, message, **kw):  # noqa: ANN001
        seen.append(message)
        real_init(self, message, **kw)

    monkeypatch.setattr(InternalError, "__init__", init)
    yield
    if seen:
        pytest.fail(f"torchless raised {len(seen)} InternalError(s) (bugs, whatever caught them): {seen[:3]}")
