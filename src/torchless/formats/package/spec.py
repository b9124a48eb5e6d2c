"""``torch.package`` archive layout: record names and their classification.

Spec: ``torch/package/package_exporter.py`` (torch 2.13). A package is a torch zip
(``<name>/...`` records) with ``.data/extern_modules``, ``.data/version``,
``.data/python_version``, ``.data/<key>.storage`` tensors, the source of every interned
module (``<module/path>.py``, ``__init__.py``), mocked modules (stubs importing
``_mock.py``) and pickled resources. The reader (:mod:`.read`, :mod:`.handler`) and the
scanner take these facts from here.
"""

from __future__ import annotations

from typing import Any

from ...container.zip import ZipReader
from ..pt.spec import BYTEORDER, DATA_PKL, DATA_VERSION, VERSION

__all__ = [
    "DATA_FOLDER",
    "EXTERN_RECORD",
    "PYTHON_VERSION_RECORD",
    "VERSION_RECORDS",
    "MOCK_RECORD",
    "MOCK_STUB",
    "MAX_TEXT",
    "is_package_records",
    "module_of_record",
    "package_modules",
    "classify_record",
]

#: the exporter's own records live under this folder (``.data/<key>.storage`` tensors too)
DATA_FOLDER = ".data/"
#: modules the package imports from the loading environment, one per line
EXTERN_RECORD = DATA_FOLDER + "extern_modules"
PYTHON_VERSION_RECORD = DATA_FOLDER + "python_version"
#: the version records ``info`` reports
VERSION_RECORDS = (DATA_VERSION, PYTHON_VERSION_RECORD)
#: the source mocked modules import ``MockedObject`` from
MOCK_RECORD = "_mock.py"
#: the first line of a mocked module's stub source (torch/package/package_exporter.py)
MOCK_STUB = b"from _mock import MockedObject"
MAX_TEXT = 16 << 20


def is_package_records(recs: list[str] | set[str] | None) -> bool:
    """A torch.package archive: an ``.data/extern_modules`` record and no ``data.pkl``."""
    if recs is None:
        return False
    return EXTERN_RECORD in recs and DATA_PKL not in recs  # (no set of a many-record list)


def module_of_record(rec: str) -> str | None:
    """The module a source record defines (``a/b.py`` -> ``a.b``, ``a/__init__.py`` -> ``a``)."""
    if not rec.endswith(".py") or rec.startswith(DATA_FOLDER):
        return None
    parts = rec[: -len(".py")].split("/")
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts) if parts and all(parts) else None


def classify_record(rec: str) -> str:
    """``code`` (module source, the mock module), ``metadata`` (the exporter's own records),
    ``storage`` (``.data/<key>.storage``) or ``other`` (a resource: a pickle or not, which
    only its bytes tell)."""
    if rec == MOCK_RECORD or module_of_record(rec) is not None:
        return "code"
    if rec.startswith(DATA_FOLDER):
        return "storage" if rec.endswith(".storage") else "metadata"
    if rec in (BYTEORDER, VERSION):
        return "metadata"
    return "other"


def package_modules(zr: ZipReader) -> dict[str, Any]:
    """``{"interned": {module: record}, "mocked": [...], "extern": [...]}`` from the
    records (no source is run; a mocked module is recognized by its stub)."""
    interned: dict[str, str] = {}
    mocked: list[str] = []
    for rec in zr.records():
        mod = module_of_record(rec)
        if mod is None or rec == MOCK_RECORD:
            continue
        e = zr.lookup(rec)
        head = bytes(zr.read(e, max_size=MAX_TEXT)[: len(MOCK_STUB)]) if e is not None and e.size >= len(MOCK_STUB) else b""
        if head == MOCK_STUB:
            mocked.append(mod)
        else:
            interned[mod] = rec
    extern: list[str] = []
    e = zr.lookup(EXTERN_RECORD)
    if e is not None:
        extern = [ln.strip() for ln in bytes(zr.read(e, max_size=MAX_TEXT)).decode("utf-8", "replace").splitlines() if ln.strip()]
    return {"interned": dict(sorted(interned.items())), "mocked": sorted(mocked), "extern": extern}
