"""The command line's rule for outputs: an existing file is never overwritten silently.

Every command that writes a file (``convert``, ``ts``/``onnx``/``pt2 set-weights``,
``run -o``) calls :func:`check_output` before any work: an output that exists is refused
with one line naming ``--force``; with ``--force`` it is replaced atomically (the new file is
built under a temporary name beside it and renamed over it at the end), so the destination
may be the source: the old file is read, through its open map, until the replace. The Python
API keeps torch's behaviour (``torchless.save`` overwrites, as ``torch.save`` does).
A URL destination is asked through its store (``s3://``, ``memory://`` ... by fsspec); a
store that cannot tell refuses rather than guess "missing".
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from ...core.errors import UsageError

__all__ = ["add_force_flag", "check_output", "check_output_folder", "output_exists"]


def add_force_flag(p: argparse.ArgumentParser) -> None:
    """``--force`` on a writing command's parser."""
    p.add_argument(
        "--force",
        action="store_true",
        help="replace an existing output (atomically; the output may be the source itself)",
    )


def check_output(path: Any, *, force: bool, also: tuple[str, ...] = ()) -> None:
    """Refuse ``path`` (and the sibling files ``also`` names, e.g. a shard index) when it
    exists, unless ``force``.

    Raises:
        UsageError: the output exists and ``force`` is not set.
    """
    if force or path is None:
        return
    for q in (os.fspath(path), *also):
        if output_exists(q):
            raise UsageError(
                "the output exists",
                path=q,
                hint="pass --force to overwrite it (atomically), or choose another output",
            )


def output_exists(path: Any) -> bool:
    """Whether something is at the output ``path``: a local path (a dangling link
    included), or a URL asked through its store (``s3://``, ``memory://`` ... by fsspec;
    a ``file://`` URL is the local path it names).

    Raises:
        UsageError: the store cannot tell (it is never taken as "missing").
    """
    from ..._cli_api import resolve_location

    store, p = resolve_location(os.fspath(path))
    return store.exists(p, "cannot check whether the output exists") if store.remote else os.path.lexists(p)


def check_output_folder(path: Any, *, force: bool) -> None:
    """Refuse an output folder (``reshard``'s) that exists and is not empty, unless
    ``force``. A file in the way is left to the writer's own refusal; the writer still
    builds the folder's files beside it and moves them in at the end.

    Raises:
        UsageError: the folder holds something and ``force`` is not set.
    """
    from ..._cli_api import resolve_location

    if force or path is None:
        return
    store, p = resolve_location(os.fspath(path))
    if store.remote:
        held = store.exists(p, "cannot check whether the output exists") and store.isdir(p) and bool(store.list(p))
    else:
        held = os.path.isdir(p) and bool(os.listdir(p))
    if held:
        raise UsageError(
            "the output folder exists and is not empty",
            path=p,
            hint="pass --force to write into it (its files are kept; a DCP checkpoint there is never written over), "
            "or choose an empty folder",
        )
