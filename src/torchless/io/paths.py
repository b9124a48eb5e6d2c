"""Confinement of paths that come from a file's contents or from a folder listing.

Several formats read sibling files: a DCP checkpoint's ``.distcp`` files named by its
``.metadata``, an ONNX model's external-data files, the shards of a safetensors folder.
Their names come from the (untrusted) artifact, and the files themselves may be symbolic
links. :func:`confine` is the one place that decides whether such a path may be opened:

* the name must be relative, without NUL bytes, drive letters or ``..`` components
  (``/`` separated components are allowed where the format allows them: ONNX);
* its real path (every symbolic link resolved, at every level) must lie inside the real
  path of the artifact's folder.

Anything else raises :class:`~torchless.core.errors.LinkEscapeError` *before* the file is
opened or even stat'ed, so an outside file is never read (not even a FIFO or a device).
The artifact's folder itself may be reached through a link: the user named it.
"""

from __future__ import annotations

import os
import re
import stat
from typing import Any

from ..core.errors import FormatError, LinkEscapeError, NotFoundError, Where

__all__ = ["confine", "confined_file", "name_parts", "within"]

_DRIVE = re.compile(r"^[A-Za-z]:")


def within(real: str, real_root: str) -> bool:
    """True when real path ``real`` is ``real_root`` or lies below it."""
    try:
        return os.path.commonpath([real, real_root]) == real_root
    except ValueError:  # different drives (Windows)
        return False


def _refuser(name: object, what: str, subdirs: bool, where: Where) -> Any:
    def refuse(reason: str, found: Any = None) -> LinkEscapeError:
        return LinkEscapeError(
            f"refused {what}: {reason}",
            expected=f"a {'relative path' if subdirs else 'plain file name'} inside the artifact's folder",
            found=repr(name)[:120] if found is None else found,
            **where,
        )

    return refuse


def name_parts(
    name: object, *, what: str = "file", path: Any = None, member: str | None = None, subdirs: bool = False, url: bool = False
) -> list[str]:
    """The components of a name an artifact gives for a sibling file, or LinkEscapeError.

    The checks of :func:`confine` that need no filesystem: not empty, no NUL byte, not
    absolute (nor a drive letter), no ``..`` component, and one component unless
    ``subdirs``. ``url``: the name is appended to a URL, so ``?``, ``#`` and ``%`` (a
    query, a fragment, an escape such as ``%2e%2e`` a server would decode) are refused too.
    Returns the components without empty and ``.`` ones.
    """
    refuse = _refuser(name, what, subdirs, {"path": path, "member": member})
    if not isinstance(name, str) or not name:
        raise refuse("empty or not a string name")
    if "\x00" in name:
        raise refuse("NUL byte in the name")
    if name.startswith(("/", "\\")) or os.path.isabs(name) or _DRIVE.match(name):
        raise refuse("absolute path")
    parts = re.split(r"[/\\]", name)
    if ".." in parts:
        raise refuse("'..' in the path (path traversal)")
    if not subdirs and (len(parts) != 1 or name in (".",)):
        raise refuse("a path where a plain file name is expected")
    if url and any(c in name for c in "?#%"):
        raise refuse("'?', '#' or '%' in a name read from a URL (a query, a fragment or an escape)")
    return [p for p in parts if p not in ("", ".")]


def confine(
    root: Any, name: object, *, what: str = "file", path: Any = None, member: str | None = None, subdirs: bool = False
) -> str:
    """The real path of ``name`` under folder ``root``, or LinkEscapeError.

    Args:
        root: the artifact's folder (a DCP checkpoint, the folder of an ONNX model).
        name: the path as the artifact names it (relative to ``root``).
        what: what the path is, for the error message ("storage file", "external data").
        path: the file to name in errors (default: ``root``).
        member: the record or tensor the path belongs to, for errors.
        subdirs: allow ``/`` (and ``\\``) separated components (ONNX locations); a DCP
            storage file must be a plain file name.

    Returns:
        The resolved path (open this one: no link is left in it).

    Raises:
        LinkEscapeError: an empty, absolute or ``..`` name, a NUL byte, or a real path
            outside ``root`` (a symbolic link anywhere on the way that leaves it).
    """
    where: Where = {"path": os.fspath(root) if path is None else path, "member": member}
    parts = name_parts(name, what=what, subdirs=subdirs, **where)
    refuse = _refuser(name, what, subdirs, where)
    base = os.path.abspath(os.fspath(root))
    real_root = os.path.realpath(base)
    full = os.path.join(base, *parts)
    real = os.path.realpath(full)
    if not within(real, real_root):
        raise refuse(
            "it resolves outside the artifact's folder (symlink escape)",
            found=f"{name!r} -> a path outside {os.path.basename(real_root)!r}",
        )
    return real


def confined_file(
    root: Any, name: str, *, what: str = "file", path: Any = None, member: str | None = None, subdirs: bool = False
) -> str:
    """:func:`confine`, then require an existing regular file (never a FIFO or device).

    Raises:
        LinkEscapeError: as :func:`confine`, or not a regular file.
        NotFoundError: the file does not exist.
    """
    real = confine(root, name, what=what, path=path, member=member, subdirs=subdirs)
    where = path if path is not None else os.fspath(root)
    try:
        st = os.stat(real)
    except FileNotFoundError:
        raise NotFoundError(
            f"{what} not found",
            path=where,
            member=member,
            found=None if member == name else repr(name)[:120],  # (the member named it already)
        ) from None
    except OSError as e:
        raise LinkEscapeError(
            f"refused {what}: cannot stat ({e.strerror})",
            path=where,
            member=member,
            found=repr(name)[:120],
        ) from None
    if not stat.S_ISREG(st.st_mode):
        raise FormatError(
            f"refused {what}: not a regular file",
            path=where,
            member=member,
            found=repr(name)[:120],
        )
    return real
