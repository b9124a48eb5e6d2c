"""``torchless scan``: a security scanner that sees exactly what torch would execute.

It finds every pickle stream in every carrier (see :mod:`torchless.scan.carriers`), runs
each symbolically in torchless's pickle machine (nothing is imported or called; see
:mod:`torchless.scan.analysis`) and classifies what the stream reaches against an
allowlist (:mod:`torchless.scan.policy`). Container differentials between torch's reader
and other readers are findings of their own. Reports: :mod:`torchless.scan.report`.

Example:
    >>> import torchless
    >>> report = torchless.scan("model.pt")        # doctest: +SKIP
    >>> report.exit_code, [f.rule for f in report.findings]   # doctest: +SKIP
"""

from __future__ import annotations

import os
import sys
import types
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from ..core.errors import NotFoundError, UsageError
from ..core.findings import Finding
from ..io.remote import accepts_storage_options as _remote_opts
from .carriers import Scanner, scan_file
from .findings import RULES, SEVERITIES, AllowNote, FileReport, ScanReport
from .policy import SAFE, classify

if TYPE_CHECKING:
    from ..io.store import Store

__all__ = [
    "scan",
    "scan_file",
    "iter_files",
    "link_escapes",
    "Finding",
    "FileReport",
    "ScanReport",
    "AllowNote",
    "RULES",
    "SEVERITIES",
    "SAFE",
    "classify",
    "Scanner",
]


def iter_files(paths: Iterable[os.PathLike[str] | str]) -> list[str]:
    """Every regular file under ``paths`` (directories recursively, sorted, no symlink loops,
    no link that leaves the folder being scanned: see :func:`link_escapes`)."""
    return [f for f, _root, err, esc, _store in _walk(paths) if err is None and not esc]


def link_escapes(paths: Iterable[os.PathLike[str] | str]) -> list[str]:
    """Symbolic links under the directories in ``paths`` whose real path leaves the
    directory (never opened: a loader of the folder would read what they point at)."""
    return [f for f, _root, _err, esc, _store in _walk(paths) if esc]


def _walk(paths: Iterable[os.PathLike[str] | str]) -> list[tuple[str, str | None, str | None, bool, Store]]:
    """(path, scanned folder or None, error or None, leaves the folder, its store) for
    every file under ``paths``; folders that cannot be listed come back with their error.
    Each location given is resolved here once (the scanner's entry); its store goes with
    every file found under it."""
    out: list[tuple[str, str | None, str | None, bool, Store]] = []
    for p in paths:
        store, found = _walk_one(os.fspath(p))
        out += [(*e, store) for e in found]
    return out


def _walk_one(p: str) -> tuple[Store, list[tuple[str, str | None, str | None, bool]]]:
    from ..io.paths import within
    from ..io.store import LOCAL

    out: list[tuple[str, str | None, str | None, bool]] = []
    store: Store = LOCAL
    if isinstance(p, str) and "://" in p:
        from ..io.store import resolve

        store, p = resolve(p)  # a file:// URL names a local path
        if store.remote:
            return store, _walk_url(p, store)
    if os.path.isdir(p):
        real_root = os.path.realpath(p)
        errors: list[OSError] = []
        for root, dirs, files in os.walk(p, followlinks=False, onerror=errors.append):
            dirs.sort()
            for f in sorted(files + [d for d in dirs if os.path.islink(os.path.join(root, d))]):
                fp = os.path.join(root, f)
                if os.path.islink(fp) and not within(os.path.realpath(fp), real_root):
                    out.append((fp, p, None, True))  # never opened (a FIFO, a file elsewhere)
                elif os.path.isfile(fp):
                    out.append((fp, p, None, False))
                elif not os.path.exists(fp):
                    out.append((fp, p, "a broken link or a file that vanished", False))
        for e in errors:
            out.append((e.filename or p, p, f"cannot list the folder: {e.strerror or e}", False))
    elif os.path.exists(p):
        out.append((p, None, None, False))
        out += _index_shards(p, store)
    else:
        raise NotFoundError("no such file or directory", path=p)
    return store, out


def _walk_url(url: str, store: Store) -> list[tuple[str, str | None, str | None, bool]]:
    """Remote paths: an object, or every object under a folder (no links there)."""
    from ..io import remote

    if not remote.isdir(url):
        remote.check_exists(url)  # missing, or the store's reason (refused credentials...)
        return [(url, None, None, False), *_index_shards(url, store)]
    fs, base = remote.filesystem(url)
    base = base.rstrip("/")
    out: list[tuple[str, str | None, str | None, bool]] = []
    rels = [str(f)[len(base) :].lstrip("/") for f in fs.find(base)]
    for rel in sorted((r for r in rels if r), key=_walk_order):
        out.append((remote.join(url, rel), url, None, False))
    return out


def _walk_order(rel: str) -> tuple[tuple[int, str], ...]:
    """The order of the local walk (``os.walk``, top-down, sorted): a folder's files
    before its subfolders."""
    *dirs, name = rel.split("/")
    return (*((1, d) for d in dirs), (0, name))


def _index_shards(p: str, store: Store) -> list[tuple[str, str | None, str | None, bool]]:
    """A Hugging Face index given alone: the shards it names are what a loader reads
    (``store``: the store holding it, as the walk resolved it)."""
    from ..formats.hf.spec import index_shards, is_index_file

    if not is_index_file(os.path.basename(p)):
        return []
    return [(f, None, err, False) for f, err in index_shards(p, store=store)]


def _one(args: tuple[str, str, str | None, bool, Store]) -> FileReport:
    from ..jobs.hooks import task_fault

    task_fault()  # the tests' hooks: a scan worker that dies or stalls (no-op otherwise)
    return scan_file(args[0], args[1], args[2], args[3], store=args[4])


def _unreadable(path: str, error: str) -> FileReport:
    fr = FileReport(path, kind="unreadable", error=error)
    fr.findings.append(Finding("unreadable", "high", f"cannot read: {error}", path))
    return fr


@_remote_opts
def scan(
    path: os.PathLike[str] | str | Sequence[os.PathLike[str] | str],
    *,
    unknown_severity: str = "medium",
    jobs: int | None = None,
    coverage: bool = False,
) -> ScanReport:
    """Scan files and directories for pickles that would run code when loaded.

    Args:
        path: a file, a directory (scanned recursively: DCP checkpoints, model folders)
            or a list of them. Links that leave a scanned directory are reported
            (``link-escape``) and never opened.
        unknown_severity: severity of globals that are neither allowlisted nor known to
            be dangerous (``critical``, ``high``, ``medium``, ``low`` or ``info``; ``info``
            does not make a file unclean).
        jobs: worker processes for many files (default: all cores; 1 = in process).
        coverage: also list, per file, every pickle stream and every source the scan
            analysed, with the SHA-256 of its exact bytes (:attr:`FileReport.coverage`;
            ``coverage`` in ``to_dict()``): what the test suite's loader oracle checks
            the real loaders' unpickled and compiled bytes against.

    Returns:
        A :class:`ScanReport`: ``.files`` (one :class:`FileReport` each, with
        ``.verdict`` and ``.findings``), ``.exit_code`` (0 clean, 1 findings, 2 error:
        also when a folder cannot be read or nothing was scanned), ``.to_dict()``.

    Raises:
        NotFoundError: a path does not exist.
        UsageError: an unknown severity.
    """
    if unknown_severity not in SEVERITIES:
        raise UsageError("unknown severity", expected=" | ".join(SEVERITIES), found=unknown_severity)
    paths = [path] if isinstance(path, (str, os.PathLike)) else list(path)
    entries = _walk(paths)
    bad = [_unreadable(f, err) for f, _root, err, _esc, _store in entries if err is not None]
    # links out of the folder go through scan_file too: it reports them without opening
    # them (naming dcp.load when a sibling .metadata reads them)
    todo = [(f, unknown_severity, root, coverage, store) for f, root, err, _esc, store in entries if err is None]
    jobs = jobs or os.cpu_count() or 1
    if jobs <= 1 or len(todo) < 4:
        return ScanReport(bad + [_one(t) for t in todo])
    from ..jobs.executor import pool_map

    # the executor's process pool: a worker that dies, or a pool that stalls, fails the
    # scan in one line (no verdict), Ctrl-C stops the workers, they end with this process,
    # and each returns its remote traffic (``--stats``)
    shown = ", ".join(os.fspath(p) for p in paths[:3]) + (" ..." if len(paths) > 3 else "")
    reports = pool_map(_one, todo, min(jobs, len(todo)), None, where=shown, what="a scan worker process", action="scan")
    return ScanReport(bad + reports)


class _CallableModule(types.ModuleType):
    """``torchless.scan`` is both this package and the :func:`scan` function.

    ``torchless.scan(path)`` is the public call; keeping the attribute a module (rather
    than re-binding it to the function) keeps ``import torchless.scan.policy`` working.
    """

    def __call__(
        self,
        path: os.PathLike[str] | str | Sequence[os.PathLike[str] | str],
        *,
        unknown_severity: str = "medium",
        jobs: int | None = None,
        coverage: bool = False,
    ) -> ScanReport:
        return scan(path, unknown_severity=unknown_severity, jobs=jobs, coverage=coverage)


sys.modules[__name__].__class__ = _CallableModule
