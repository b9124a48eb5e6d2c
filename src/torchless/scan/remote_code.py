"""Hugging Face remote code: the ``.py`` files ``from_pretrained(..., trust_remote_code=True)`` runs.

Decision points (``transformers`` 5.x, ``dynamic_module_utils.py`` and the ``Auto*`` classes):

* ``AutoConfig``/``AutoModel*`` read ``config.json``; ``AutoTokenizer`` reads
  ``tokenizer_config.json`` (then ``config.json``); ``AutoProcessor``,
  ``AutoImageProcessor``, ``AutoFeatureExtractor``, ``AutoVideoProcessor`` read
  ``processor_config.json``/``preprocessor_config.json``/``video_preprocessor_config.json``;
  ``GenerationConfig`` reads ``generation_config.json``. Each looks its class up in the
  file's ``auto_map`` (``{"AutoModel": "modeling_x.XModel"}``, or a list
  ``[slow, fast]`` for tokenizers); ``pipeline(task, model=folder)`` looks the task up in
  ``config.json``'s ``custom_pipelines`` (``impl``, ``pt``, ``tf`` class references).
* A class reference is ``module.Class`` (a module file ``module.py`` in the model's folder)
  or ``repo--module.Class`` (the module comes from another repository: a local folder or a
  Hub repo, from the Hub cache when offline). ``get_class_from_dynamic_module`` copies the
  module and every file its relative imports name (``get_relative_import_files``: the
  regexes :data:`RELATIVE_IMPORT_RES`, recursively, each ``<name>.py`` beside it) into the
  modules cache and imports it: its module-level code runs, then the loader calls the
  class (``__init__``, ``from_pretrained``, ``forward`` ...).

When a scanned file is one of :data:`CONFIG_FILES`, every module its references name (and
the relative-import closure) is parsed by :mod:`torchless.scan.source` and reported on
that file; a referenced module that is missing, or that resolves outside the scanned
folder, is a finding (``unanalysable``; ``link-escape``), never clean. A scanned ``.py``
is analysed too: at full severity when a config in its folder names it (or reaches it by a
relative import), else as source that no loader of the folder runs (its problems at most
``medium``, and an ``info`` note).
"""

from __future__ import annotations

import os
import re
from typing import Any

from ..core import jsonsafe
from ..core.errors import TorchlessError
from ..io.paths import within
from .source import SourceReport, analyse

#: the scanner (``carriers.base.ScanEngine``; not imported: the scanner imports this module)
ScanEngine = Any

__all__ = [
    "CONFIG_FILES",
    "RELATIVE_IMPORT_RES",
    "LOADER",
    "class_references",
    "scan_if_remote_code",
]

#: the files whose ``auto_map`` (and ``custom_pipelines``) name remote code
CONFIG_FILES = (
    "config.json",
    "tokenizer_config.json",
    "preprocessor_config.json",
    "processor_config.json",
    "video_preprocessor_config.json",
    "generation_config.json",
)
#: transformers' ``get_relative_imports``: ``import .x`` and ``from .x import y`` -> ``x.py``
RELATIVE_IMPORT_RES = (
    re.compile(r"^\s*import\s+\.(\S+)\s*$", re.M),
    re.compile(r"^\s*from\s+\.(\S+)\s+import", re.M),
)
LOADER = "transformers from_pretrained(trust_remote_code=True)"
_MAX_CONFIG = 16 << 20
_MAX_MODULES = 256  # modules followed per config (relative-import closure included)
_MAX_SOURCE = 32 << 20


def class_references(doc: Any) -> list[tuple[str, str]]:
    """``(where, reference)`` for every class reference of a config document: ``auto_map``
    values (strings, or lists of strings and nulls) and ``custom_pipelines`` entries
    (``impl``, ``pt``, ``tf``)."""
    out: list[tuple[str, str]] = []
    if not isinstance(doc, dict):
        return out
    amap = doc.get("auto_map")
    if isinstance(amap, dict):
        for k, v in amap.items():
            for ref in v if isinstance(v, list) else [v]:
                if isinstance(ref, str):
                    out.append((f"auto_map[{k!r}]", ref))
    pipes = doc.get("custom_pipelines")
    if isinstance(pipes, dict):
        for task, spec in pipes.items():
            if not isinstance(spec, dict):
                continue
            for key in ("impl", "pt", "tf"):
                v = spec.get(key)
                for ref in v if isinstance(v, list) else [v]:
                    if isinstance(ref, str):
                        out.append((f"custom_pipelines[{task!r}][{key!r}]", ref))
    return out


def _relative_files(text: str, rep: SourceReport) -> list[str]:
    """Module files (relative to the module's folder) its relative imports name: what
    transformers copies (its regexes) and what Python's import then reads (``a.b`` ->
    ``a/b.py`` or ``a/b/__init__.py``)."""
    names: list[str] = []
    for rx in RELATIVE_IMPORT_RES:
        names += [m + ".py" for m in rx.findall(text)]
    for level, mod in rep.relative:
        if level == 1 and mod:
            p = mod.replace(".", "/")
            names += [p + ".py", p + "/__init__.py"]
    return list(dict.fromkeys(names))


class _Resolver:
    """Reads module files for one scanned file, never outside ``home`` (the scanned folder)."""

    def __init__(self, scanner: ScanEngine, folder: str) -> None:
        self.scanner = scanner
        self.folder = folder
        self.home = os.path.realpath(scanner.root if scanner.root is not None else folder)

    def where(self, full: str) -> str:
        return os.path.relpath(full, os.path.dirname(self.scanner.path))

    def repo_folder(self, repo: str) -> str | None:
        """The folder of ``repo`` inside the scanned folder: a local path, or its snapshot in
        a Hub cache (``models--org--name/snapshots/<rev>``) beside the model."""
        if os.path.isabs(repo) and os.path.isdir(repo) and within(os.path.realpath(repo), self.home):
            return repo
        cache = "models--" + repo.replace("/", "--")
        d = self.folder
        for _ in range(6):
            snaps = os.path.join(d, cache, "snapshots")
            if os.path.isdir(snaps) and within(os.path.realpath(snaps), self.home):
                revs = sorted(os.listdir(snaps))
                return os.path.join(snaps, revs[-1]) if revs else None
            if os.path.realpath(d) == self.home or os.path.dirname(d) == d:
                break
            d = os.path.dirname(d)
        return None


def _analyse_closure(
    scanner: ScanEngine, res: _Resolver, base: str, module_file: str, how: str, cap: str | None, required: bool
) -> None:
    """Analyse ``base/module_file`` and every module its relative imports reach."""
    todo = [(module_file, how, required)]
    seen: set[str] = set()
    while todo:
        name, why, must = todo.pop(0)
        full = os.path.normpath(os.path.join(base, name))
        if full in seen:
            continue
        seen.add(full)
        if len(seen) > _MAX_MODULES:
            scanner.add("limit", "high", f"more than {_MAX_MODULES} remote-code modules; the rest not analysed", loader=LOADER)
            return
        rel = res.where(full)
        if not os.path.lexists(full):
            if must:
                scanner.add(
                    "unanalysable",
                    "high",
                    f"remote-code module {rel} is not in the folder ({why}): the loader would fetch it from elsewhere or "
                    "fail; not analysed",
                    rel,
                    loader=LOADER,
                )
            continue
        if not within(os.path.realpath(full), res.home):
            scanner.add(
                "link-escape",
                "high",
                f"remote-code module {rel} resolves outside the scanned folder ({why}); not read",
                rel,
                loader=LOADER,
            )
            scanner.add("unanalysable", "high", f"remote-code module {rel} outside the scanned folder was not analysed", rel)
            continue
        try:
            with open(full, "rb") as f:
                data = f.read(_MAX_SOURCE + 1)
        except OSError as e:
            scanner.add("unanalysable", "high", f"remote-code module {rel} cannot be read ({e.strerror}); not analysed", rel)
            continue
        if not scanner.spend("pickle", len(data), rel, "parsing remote-code Python source", loader=LOADER):
            return
        rep = analyse(data, rel)
        scanner.covered("source", rel, data)
        _report(scanner, rep, rel, why, cap)
        text = data.decode("utf-8", "replace")
        mod_dir = os.path.dirname(name)
        for dep in _relative_files(text, rep):
            todo.append((os.path.join(mod_dir, dep), f"imported relatively by {rel}; {why}", False))


def _report(scanner: ScanEngine, rep: SourceReport, rel: str, why: str, cap: str | None) -> None:
    counted = [p for p in rep.problems if p.severity != "info"]
    order = ("critical", "high", "medium", "low")
    for p in counted:
        if p.severity in ("unanalysable", "limit"):
            scanner.add(p.severity, "high", f"{rel}: {p.text()}; {why}", rel, loader=LOADER)
            continue
        sev = p.severity
        if cap is not None and order.index(sev) < order.index(cap):
            sev = cap
        scanner.add("source-code", sev, f"{rel}, {p.text()}; {why}", rel, loader=LOADER)
    if not counted:
        scanner.add(
            "source-code",
            "info",
            f"{rel} ({rep.lines} lines): Python source, nothing outside model code; {why}",
            rel,
            loader=LOADER,
        )


def _config_refs(path: str) -> list[tuple[str, str]] | str:
    """The class references of a config file, or why it could not be read."""
    try:
        with open(path, "rb") as f:
            raw = f.read(_MAX_CONFIG + 1)
        return class_references(jsonsafe.loads(raw, what="Hugging Face config", path=path, max_bytes=_MAX_CONFIG))
    except (OSError, TorchlessError) as e:
        return str(e)


def _run_refs(scanner: ScanEngine, res: _Resolver, cfg: str, refs: list[tuple[str, str]], cap: str | None) -> None:
    for where, ref in refs:
        how = f"from_pretrained(trust_remote_code=True) runs it: {cfg} {where} = {ref!r}"
        repo, _, cls = ref.rpartition("--")
        parts = cls.split(".")
        if ref.count("--") > 1 or len(parts) != 2 or not all(parts):
            scanner.add(
                "source-code",
                "low",
                f"{cfg} {where} = {ref!r} is not 'module.Class' or 'repo--module.Class': transformers refuses it",
                cfg,
                loader=LOADER,
            )
            continue
        base = res.folder
        if repo:
            found = res.repo_folder(repo)
            if found is None:
                scanner.add(
                    "unanalysable",
                    "high",
                    f"{cfg} {where} = {ref!r}: the module comes from repository {repo!r}, which is not in the scanned "
                    "folder (scan the Hub cache folder that holds it); not analysed",
                    cfg,
                    loader=LOADER,
                )
                continue
            base = found
        _analyse_closure(scanner, res, base, parts[0] + ".py", how, cap, True)


def scan_if_remote_code(scanner: ScanEngine) -> None:
    """Remote code a Hugging Face config names, or a ``.py`` file beside a model (see the
    module docstring). Local files only."""
    with scanner.loading(LOADER):  # every finding names the loader that runs the source
        _scan(scanner)


def _scan(scanner: ScanEngine) -> None:
    path = scanner.path
    name = os.path.basename(path)
    folder = os.path.dirname(os.path.abspath(path))
    if name in CONFIG_FILES:
        refs = _config_refs(path)
        if isinstance(refs, str) or not refs:
            return  # not JSON: the other views report it
        _run_refs(scanner, _Resolver(scanner, folder), name, refs, None)
        return
    if not name.endswith(".py"):
        return
    # a .py: named (directly or through relative imports) by a config beside it?
    res = _Resolver(scanner, folder)
    target = os.path.normpath(os.path.abspath(path))
    for cfg in CONFIG_FILES:
        refs = _config_refs(os.path.join(folder, cfg)) if os.path.isfile(os.path.join(folder, cfg)) else []
        if isinstance(refs, str):
            continue
        for where, ref in refs:
            cls = ref.rpartition("--")[2]
            if "--" in ref or cls.count(".") != 1:
                continue
            if _reaches(folder, cls.split(".")[0] + ".py", target):
                how = f"from_pretrained(trust_remote_code=True) runs it: {cfg} {where} = {ref!r}"
                _analyse_closure(scanner, res, folder, name, how, None, True)
                return
    _analyse_closure(
        scanner,
        res,
        folder,
        name,
        "Python source beside the model that no auto_map or custom_pipelines entry of its folder names: no "
        "loader of the folder runs it (its problems are reported at most medium)",
        "medium",
        True,
    )


def _reaches(folder: str, module_file: str, target: str) -> bool:
    """Whether ``module_file`` or its relative-import closure is ``target``."""
    todo, seen = [module_file], set[str]()
    while todo and len(seen) < _MAX_MODULES:
        f = os.path.normpath(os.path.join(folder, todo.pop()))
        if f in seen or not os.path.isfile(f):
            continue
        seen.add(f)
        if f == target:
            return True
        try:
            with open(f, "rb") as fh:
                data = fh.read(_MAX_SOURCE + 1)
        except OSError:
            continue
        text = data.decode("utf-8", "replace")
        names = [m + ".py" for rx in RELATIVE_IMPORT_RES for m in rx.findall(text)]
        names += [m.replace(".", "/") + ".py" for m in re.findall(r"^\s*from\s+\.([\w.]+)\s+import", text, re.M)]
        todo += [os.path.join(os.path.dirname(os.path.relpath(f, folder)), n) for n in names]
    return False
