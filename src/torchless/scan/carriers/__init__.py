"""Find every byte a loader could execute in a file, whatever carries it, and analyse it.

Every file is taken in *every* view a supported loader could take of it, recognised the
way that loader recognises it (:mod:`.recognize`), never by name:

* pickles (:mod:`.pickles`): any bytes, since every loader falls back to ``pickle.load``;
  CPython's own unpicklers, run inert, decide whether anything would execute; several in a
  row and torch's legacy stream (five pickles);
* zip archives read with torch's rules (:mod:`.zips`): torch checkpoints, TorchScript,
  ``.pt2``; every record torch unpickles by name, every other member in every view,
  duplicates included, polyglots; ``.npz`` through Python's ``zipfile`` as NumPy reads it
  (:mod:`.numpy`, with ``.npy`` headers parsed as NumPy parses them);
* the legacy tar layout through ``tarfile`` as torch opens it (:mod:`.tar`);
* DCP items located by the ``.metadata`` byte ranges whatever the file names (:mod:`.dcp`);
* compressed streams by joblib's prefix table and any lzma/zlib header (:mod:`.compressed`);
* nested payloads: the arguments of nested loaders (``_load_from_bytes``, ``pickle.loads``
  ...), whatever their encoding (:mod:`.nested`).

What no carrier recognises and no loader would execute is an ``unrecognized`` note; what a
loader would execute and the walkers cannot follow is ``unanalysable``; one work budget per
file (:class:`.base.Budget`) bounds everything, and running out is a ``limit`` finding.
Container differentials (duplicates, name mismatches, CRCs, flags, frame lies, trailing
data, polyglots) are findings of their own.

Layout: :mod:`.base` (the scan engine: findings, budget, entry, dispatch), one module per
carrier, each an independent analysis object (:class:`.common.Carrier`) that the engine
makes and runs, and that a test can run alone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..findings import FileReport
from .base import ScanEngine
from .common import MAX_DEPTH, Carrier
from .compressed import CompressedCarrier
from .dcp import DcpCarrier
from .nested import NestedCarrier
from .numpy import NumpyCarrier
from .onnx import OnnxCarrier
from .pickles import PickleCarrier
from .tar import TarCarrier
from .zips import ZipCarrier

if TYPE_CHECKING:
    from ...io.store import Store

__all__ = [
    "Scanner",
    "ScanEngine",
    "scan_file",
    "MAX_DEPTH",
    "Carrier",
    "CompressedCarrier",
    "DcpCarrier",
    "NestedCarrier",
    "NumpyCarrier",
    "OnnxCarrier",
    "PickleCarrier",
    "TarCarrier",
    "ZipCarrier",
]

#: the scanner of one file is the scan engine (the name torchless.scan exports)
Scanner = ScanEngine


def scan_file(
    path: str, unknown_severity: str = "medium", root: str | None = None, coverage: bool = False, store: Store | None = None
) -> FileReport:
    """Scan one file (never raises for bad content); ``root``: the folder being scanned;
    ``coverage``: list what was analysed (:attr:`FileReport.coverage`); ``store``: the
    store holding it, as the walk resolved it (None: resolved for ``path``)."""
    return Scanner(path, unknown_severity=unknown_severity, root=root, coverage=coverage, store=store).run()
