"""Find every pickle stream in a file, whatever carries it, and analyse each.

Carriers (sniffed from the bytes, never from the file name):

* raw pickles (any extension), several in a row, and the legacy torch stream format
  (five pickles, then storage bytes that are never read);
* zip archives read with torch's rules (:class:`~torchless.container.zip.ZipReader`):
  torch checkpoints, TorchScript (``data.pkl``, ``constants.pkl``, ``bytecode.pkl``,
  ``code/``), ``.pt2`` (sample inputs, pickled weights: nested zips), ``.npz``; every
  member that torch *or* Python's zipfile could unpickle, duplicates included; storage
  records (``data/0`` ...) are only peeked at (4 bytes) for nested archives;
* concatenated zips (DCP ``.distcp``), split by the byte ranges of the sibling
  ``.metadata`` (itself a pickle, analysed symbolically) or, without one, by end records;
* the legacy tar layout (``storages``/``tensors``/``pickle`` walked as torch walks them);
* ``.npy`` with object arrays (a pickle after the header); gzip/bz2/xz/lzma/zlib
  compressed pickles (joblib's compressed files);
* bytes that a pickle passes to a call and that are themselves pickles or archives
  (``torch.storage._load_from_bytes``, ``pickle.loads``).

Container differentials (duplicates, name mismatches, CRCs, flags, frame lies, trailing
data, polyglots) are findings of their own.

Layout: :mod:`.base` (findings, entry, dispatch), one module per carrier (:mod:`.pickles`,
:mod:`.zips`, :mod:`.tar`, :mod:`.dcp`, :mod:`.numpy`, :mod:`.compressed`); each is a
mixin of :class:`Scanner`.
"""

from __future__ import annotations

from ..findings import FileReport
from .base import ScannerBase
from .common import MAX_DEPTH
from .compressed import CompressedCarrier
from .dcp import DcpCarrier
from .nested import NestedCarrier
from .numpy import NumpyCarrier
from .pickles import PickleCarrier
from .tar import TarCarrier
from .zips import ZipCarrier

__all__ = ["Scanner", "scan_file", "MAX_DEPTH"]


class Scanner(ScannerBase, PickleCarrier, NestedCarrier, ZipCarrier, TarCarrier, DcpCarrier, NumpyCarrier, CompressedCarrier):
    """Scan one file; findings accumulate in :attr:`report`.

    Args:
        path: the file.
        unknown_severity: severity of ``unknown-global`` findings.
        root: the folder being scanned (links that leave it are not followed).
    """


def scan_file(path: str, unknown_severity: str = "medium", root: str | None = None) -> FileReport:
    """Scan one file (never raises for bad content); ``root``: the folder being scanned."""
    return Scanner(path, unknown_severity=unknown_severity, root=root).run()
