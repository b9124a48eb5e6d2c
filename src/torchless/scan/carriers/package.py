"""torch.package: the packaged Python source ``PackageImporter`` runs, analysed.

Decision points (``torch/package/package_importer.py``, torch 2.13):

* ``PackageImporter(f)`` builds a module tree from *every* record ending in ``.py``
  (``_add_file``: ``a/b.py`` is module ``a.b``, ``a/__init__.py`` the package ``a``) after
  the extern list (``.data/extern_modules``: those names, and everything under them, are
  imported from the loading environment; a packaged ``.py`` under an extern name makes the
  constructor raise). Nothing runs yet.
* ``import_module(name)`` runs the packaged source of ``name`` (``_make_module``:
  ``exec`` of the record with the importer's ``__import__``), after importing every parent
  package first (``_do_find_and_load`` -> ``_gcd_import(parent)``: each parent's
  ``__init__.py`` runs). The caller may name *any* packaged module, so every ``.py`` is code
  the loader may run.
* ``load_pickle(package, resource)``, ``load_text`` and ``load_binary`` first import
  ``package`` (``_zipfile_path`` -> ``_get_package`` -> ``import_module``): its
  ``__init__.py`` and its parents' run before the resource is read. ``load_pickle`` then
  imports the module of every global the pickle names (``find_class`` ->
  ``import_module``), and a mocked module's stub imports ``_mock.py``.
* Imports inside packaged code go through the same importer: packaged modules, then extern
  ones, then ``numpy``/``builtins`` (``IMPLICIT_IMPORT_ALLOWLIST``).

Every packaged ``.py`` is parsed (never run) by :mod:`torchless.scan.source` and reported with
how the loader reaches it: its problems with their severities, or an ``info`` note when it
does only what model code does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...container.zip import ZipReader
from ...formats.package.spec import DATA_FOLDER, MAX_TEXT, MOCK_RECORD, classify_record, package_modules
from ..source import analyse

if TYPE_CHECKING:
    from .common import Engine

__all__ = ["report_packaged_code", "module_of_py"]

_LOADER = "torch.package.PackageImporter"


def module_of_py(rec: str) -> str | None:
    """The module ``PackageImporter._add_file`` makes of a record (``a/b.py`` -> ``a.b``,
    ``a/__init__.py`` -> ``a``, ``_mock.py`` -> ``_mock``); None for other records."""
    if not rec.endswith(".py"):
        return None
    *prefix, last = rec.split("/")
    if len(prefix) > 1 and prefix[0] == DATA_FOLDER.rstrip("/"):
        return None  # ``_add_file`` skips ``.data/<dir>/...``
    parts = prefix if last == "__init__.py" else [*prefix, last[: -len(".py")]]
    return ".".join(parts) if parts and all(parts) else None


def _parents(mod: str) -> list[str]:
    """``a.b.c`` -> ``["a", "a.b", "a.b.c"]``: the order the importer runs them in."""
    parts = mod.split(".")
    return [".".join(parts[: i + 1]) for i in range(len(parts))]


def report_packaged_code(scanner: Engine, zr: ZipReader, member: str | None) -> None:
    """Analyse every packaged ``.py`` of a torch.package archive and report, for each, why
    ``PackageImporter`` would run it (see the module docstring)."""
    pre = f"{member} > " if member else ""
    mods = package_modules(zr)
    mocked = set(mods["mocked"])
    extern = list(mods["extern"])
    sources: dict[str, str] = {}  # module -> record
    for rec in zr.records():
        mod = module_of_py(rec)
        if mod is not None:
            sources.setdefault(mod, rec)
    why: dict[str, str] = {}

    def reach(mod: str, how: str) -> None:
        for m in _parents(mod):
            if m in sources and m not in why:
                why[m] = how if m == mod else f"as a parent package of {mod}, {how}"

    # globals a pickle names: load_pickle imports their modules (the longest packaged prefix)
    for qual in sorted(scanner.report.globals):
        mod = qual.rsplit(".", 1)[0] if "." in qual else qual
        while mod and mod not in sources and mod not in mocked:
            mod = mod.rsplit(".", 1)[0] if "." in mod else ""
        if mod:
            reach(mod, f"when load_pickle imports {mod} to find {qual}")
            if mod in mocked and "_mock" in sources:
                why.setdefault("_mock", f"when the stub of mocked module {mod} imports it (load_pickle of {qual})")
    # resources: load_pickle/load_text/load_binary(package, resource) import the package first
    for rec in zr.records():
        if classify_record(rec) != "other" or "/" not in rec:
            continue
        pkg = rec.rsplit("/", 1)[0].replace("/", ".")
        reach(pkg, f"when load_pickle/load_text/load_binary({pkg!r}, {rec.rsplit('/', 1)[1]!r}) imports package {pkg} first")
    for mod in sorted(sources):
        rec = sources[mod]
        loc = f"{pre}{zr.prefix}/{rec}" if zr.prefix else f"{pre}{rec}"
        under_extern = next((x for x in extern if mod == x or mod.startswith(x + ".")), None)
        if under_extern is not None:
            scanner.add(
                "source-code",
                "info",
                f"packaged source of {mod} lies under extern module {under_extern}: PackageImporter refuses to open "
                "the package (ImportError), so it never runs",
                loc,
                loader=_LOADER,
            )
            continue
        how = why.get(mod) or f"on importer.import_module({mod!r}), which any caller may ask for"
        e = zr.lookup(rec)
        if e is None:
            continue
        if not scanner.spend("pickle", e.size, loc, "parsing packaged Python source", loader=_LOADER):
            return
        if e.size > MAX_TEXT:
            scanner.add("limit", "high", f"packaged source of {e.size} bytes: not analysed ({how})", loc, loader=_LOADER)
            continue
        data = bytes(zr.read(e, max_size=MAX_TEXT))
        rep = analyse(data, rec)
        scanner.covered("source", rec, data)
        counted = [p for p in rep.problems if p.severity != "info"]
        for p in counted:
            if p.severity in ("unanalysable", "limit"):
                scanner.add(
                    p.severity,
                    "high",
                    f"packaged source of {mod}: {p.text()}; PackageImporter runs it {how}",
                    loc,
                    loader=_LOADER,
                )
            else:
                scanner.add(
                    "source-code",
                    p.severity,
                    f"packaged source of {mod}, {p.text()}; PackageImporter runs it {how}",
                    loc,
                    loader=_LOADER,
                )
        if not counted:
            what = "the mocked modules' MockedObject" if rec == MOCK_RECORD else f"module {mod}"
            scanner.add(
                "source-code",
                "info",
                f"packaged source of {what} ({rep.lines} lines, nothing outside model code): PackageImporter runs it {how}",
                loc,
                loader=_LOADER,
            )
