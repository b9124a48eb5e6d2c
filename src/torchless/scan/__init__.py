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
from typing import Any, Iterable, Sequence

from ..core.errors import NotFoundError, UsageError
from .carriers import Scanner, scan_file
from .findings import RULES, SEVERITIES, AllowNote, FileReport, Finding, ScanReport
from .policy import SAFE, classify

__all__ = ["scan", "scan_file", "iter_files", "link_escapes", "Finding", "FileReport", "ScanReport", "AllowNote", "RULES", "SEVERITIES", "SAFE", "classify", "Scanner"]


def iter_files(paths: Iterable[os.PathLike | str]) -> list[str]:
    """Every regular file under ``paths`` (directories recursively, sorted, no symlink loops,
    no link that leaves the folder being scanned: see :func:`link_escapes`)."""
    return _walk(paths)[0]


def link_escapes(paths: Iterable[os.PathLike | str]) -> list[str]:
    """Symbolic links under the directories in ``paths`` whose real path leaves the
    directory (never opened: a loader of the folder would read what they point at)."""
    return _walk(paths)[1]


def _walk(paths: Iterable[os.PathLike | str]) -> tuple[list[str], list[str]]:
    from ..core.paths import within

    out: list[str] = []
    escapes: list[str] = []
    for p in paths:
        p = os.fspath(p)
        if os.path.isdir(p):
            real_root = os.path.realpath(p)
            for root, dirs, files in os.walk(p, followlinks=False):
                dirs.sort()
                for f in sorted(files + [d for d in dirs if os.path.islink(os.path.join(root, d))]):
                    fp = os.path.join(root, f)
                    if os.path.islink(fp) and not within(os.path.realpath(fp), real_root):
                        escapes.append(fp)
                    elif os.path.isfile(fp):
                        out.append(fp)
        elif os.path.exists(p):
            out.append(p)
        else:
            raise NotFoundError("no such file or directory", path=p)
    return out, escapes


def _escape_report(path: str) -> FileReport:
    rep = FileReport(path, kind="link")
    rep.findings.append(
        Finding(
            "link-escape",
            "high",
            "symbolic link to a file outside the scanned folder: not opened or analysed, but a loader of the folder (dcp.load, onnx, sharded checkpoints) would read it",
            path,
            loader="torch.distributed.checkpoint.load / folder loaders",
        )
    )
    return rep


def _one(args: tuple[str, str]) -> FileReport:
    return scan_file(args[0], args[1])


def scan(path: os.PathLike | str | Sequence[os.PathLike | str], *, unknown_severity: str = "medium", jobs: int | None = None) -> ScanReport:
    """Scan files and directories for pickles that would run code when loaded.

    Args:
        path: a file, a directory (scanned recursively: DCP checkpoints, model folders)
            or a list of them.
        unknown_severity: severity of globals that are neither allowlisted nor known to
            be dangerous (``critical``, ``high``, ``medium``, ``low`` or ``info``; ``info``
            does not make a file unclean).
        jobs: worker processes for many files (default: all cores; 1 = in process).

    Returns:
        A :class:`ScanReport`: ``.files`` (one :class:`FileReport` each, with
        ``.verdict`` and ``.findings``), ``.exit_code`` (0 clean, 1 findings, 2 error),
        ``.to_dict()``.

    Raises:
        NotFoundError: a path does not exist.
        UsageError: an unknown severity.
    """
    if unknown_severity not in SEVERITIES:
        raise UsageError("unknown severity", expected=" | ".join(SEVERITIES), found=unknown_severity)
    paths = [path] if isinstance(path, (str, os.PathLike)) else list(path)
    files, escapes = _walk(paths)
    jobs = jobs or os.cpu_count() or 1
    if jobs <= 1 or len(files) < 4:
        reports = [scan_file(f, unknown_severity) for f in files]
    else:
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(max_workers=min(jobs, len(files))) as ex:
            reports = list(ex.map(_one, [(f, unknown_severity) for f in files], chunksize=max(1, len(files) // (jobs * 4))))
    return ScanReport(reports + [_escape_report(e) for e in escapes])


class _CallableModule(types.ModuleType):
    """``torchless.scan`` is both this package and the :func:`scan` function.

    ``torchless.scan(path)`` is the public call; keeping the attribute a module (rather
    than re-binding it to the function) keeps ``import torchless.scan.policy`` working.
    """

    def __call__(self, path: Any, **kw: Any) -> ScanReport:
        return scan(path, **kw)


sys.modules[__name__].__class__ = _CallableModule
