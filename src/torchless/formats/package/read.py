"""Reading a ``torch.package`` archive without importing or running anything in it.

A package is a torch zip (``<name>/...`` records) holding:

* ``.data/extern_modules``: the modules the package imports from the loading
  environment (one per line); ``.data/version``, ``.data/python_version``;
* ``<module/path>.py`` (and ``__init__.py``): the source of every *interned* module,
  which ``PackageImporter`` compiles and runs when a pickle (or the user) imports it;
  *mocked* modules are stubs importing ``_mock.py``'s ``MockedObject``;
* pickles saved with ``save_pickle(package, resource, obj)`` at ``<package>/<resource>``,
  whose tensors are ``('storage', storage_type, key, location, numel)`` persistent ids
  naming ``.data/<key>.storage`` records; other resources (``save_text``/``save_binary``).

torchless lists all of it and reads each pickle with its own pickle machine (classes of
the package become inert placeholders under ``weights_only=False``; under the default
``weights_only=True`` they are refused), so tensors are read without running packaged
code. ``PackageImporter.load_pickle`` would import and execute the interned source of
every class a pickle names: :meth:`PackageArtifact.imports` lists what each pickle would
import from the package, and the scanner reports it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ...container.zip import ZipReader
from ...core.errors import TorchlessError
from ...core.findings import Problem
from ...core.tree import iter_tensors
from ...io.source import open_source
from ..base import Artifact, LoadPolicy, summarize_tensors
from .spec import MOCK_STUB, classify_record, is_package_records, package_modules
from .spec import VERSION_RECORDS as _INFO_RECORDS

__all__ = ["PackageArtifact", "is_package_records", "MOCK_STUB", "package_modules"]


class PackageArtifact(Artifact):
    """An opened torch.package archive.

    Attributes:
        zip: the :class:`~torchless.container.zip.ZipReader`.
        modules: interned (module -> source record), mocked and extern module names.
        pickles: the records that are pickles (``<package>/<resource>``).
        resources: the other resource records (text, binary).
    """

    format = "package"

    def __init__(self, path: Any, policy: LoadPolicy | None = None, *, zip_reader: ZipReader | None = None) -> None:
        super().__init__(path if not isinstance(path, (bytes, bytearray, memoryview)) else "<bytes>", policy)
        self.source = zip_reader.source if zip_reader is not None else open_source(path)
        try:
            self.zip = zip_reader.check_prefix() if zip_reader is not None else ZipReader(self.source)
            self.modules = package_modules(self.zip)
            self.pickles: list[str] = []
            self.resources: list[str] = []
            for rec in self.zip.records():
                if classify_record(rec) != "other":
                    continue
                e = self.zip.lookup(rec)
                head = bytes(self.zip.read(e)[:2]) if e is not None and e.size >= 2 else b""
                (self.pickles if head[:1] == b"\x80" and 2 <= head[1] <= 5 else self.resources).append(rec)
        except BaseException:
            self.source.close()
            raise
        self._objs: dict[str, Any] = {}
        self._globals: dict[str, list[tuple[str, bool]]] = {}

    def load_pickle(self, record: str) -> Any:
        """The object of one pickle (``"<package>/<resource>"``), read by torchless's pickle
        machine under the artifact's ``weights_only`` policy; tensors lazy."""
        obj = self._objs.get(record)
        if obj is None and record not in self._objs:
            from ..pt.read import make_resolver, read_zip_checkpoint

            pol = self.policy
            cp = read_zip_checkpoint(
                self.zip,
                weights_only=pol.weights_only,
                resolver=make_resolver(pol.weights_only, extra=pol.extra_globals()) if pol.allowed_globals else None,
                limits=pol.limits,
                pickle_name=record,
                data_dir=".data",
                record_suffix=".storage",
            )
            obj = self._objs[record] = cp.obj
            self._globals[record] = list(cp.globals_seen)
        return obj

    def load(self, *, weights_only: bool | None = None) -> Any:
        """``{pickle record: object}`` for every pickle."""
        self.load_policy(weights_only)
        return {rec: self.load_pickle(rec) for rec in self.pickles}

    def imports(self) -> dict[str, list[str]]:
        """Per pickle, the interned modules ``PackageImporter.load_pickle`` would import
        (and so run) for the globals it names."""
        out: dict[str, list[str]] = {}
        interned = self.modules["interned"]
        for rec in self.pickles:
            self.load_pickle(rec)
            mods = set()
            for g, _ok in self._globals.get(rec, []):
                mod = g.rsplit(".", 1)[0] if "." in g else g
                while mod:
                    if mod in interned:
                        mods.add(mod)
                        break
                    mod = mod.rsplit(".", 1)[0] if "." in mod else ""
            out[rec] = sorted(mods)
        return out

    def tensors(self) -> Iterator[tuple[str, Any]]:
        for rec in self.pickles:  # "<package>/<resource>:<dotted name in the object>"
            for name, t in iter_tensors(self.load_pickle(rec), prefix="\0"):
                yield rec + ":" + (name[2:] if name.startswith("\0.") else "" if name == "\0" else name), t

    def info(self) -> dict[str, Any]:
        out: dict[str, Any] = {"format": self.format, "path": self.path}
        for name in _INFO_RECORDS:
            e = self.zip.lookup(name)
            if e is not None and e.size <= 64:
                out[name.split("/")[-1]] = bytes(self.zip.read(e)).decode("ascii", "replace").strip()
        out["modules"] = {
            "interned": list(self.modules["interned"]),
            "mocked": self.modules["mocked"],
            "extern": self.modules["extern"],
        }
        out["pickles"] = self.pickles
        out["resources"] = self.resources
        out.update(summarize_tensors(self.tensors()))
        out["imports"] = self.imports()
        out["note"] = (
            "PackageImporter.load_pickle imports the interned modules a pickle names and "
            "runs their source; torchless reads the pickles without running anything"
        )
        return out

    def verify(self) -> list[Problem]:
        problems = list(self.zip.verify(crc=True))
        for rec in self.pickles:
            try:
                self.load_pickle(rec)
            except TorchlessError as e:
                problems.append(Problem("pickle", str(e), rec))
        try:
            return problems + super().verify()
        except TorchlessError as e:  # a pickle that does not parse: reported above
            return problems or [Problem("pickle", str(e))]

    def close(self) -> None:
        self.source.close()
