"""Unpack a package (any torch zip archive) into a folder, safely.

Every name is checked before anything is written; the extraction refuses, with a
:class:`~torchless.core.errors.FormatError` naming the record:

* absolute names, drive letters, backslashes, NUL bytes, empty/``.``/``..`` components
  (path traversal: "zip slip");
* symbolic-link entries (Unix mode ``S_IFLNK`` in the external attributes);
* two records that would land on the same file (also case-insensitively, for
  case-insensitive file systems), or a file where a folder is needed.

While writing, no existing symlink inside the output folder is followed (each folder on
the way is checked with ``lstat``), existing files are kept unless ``overwrite`` is set,
and each file is written to a temporary name and renamed into place (atomic). File modes
from the archive are ignored: everything is written ``0666 & ~umask`` (never executable).
"""

from __future__ import annotations

import os
import stat
import struct
import zlib
from dataclasses import dataclass
from typing import Any

from ...container.zip import ZipEntry, ZipReader
from ...core.errors import ChecksumError, FormatError, LimitError, UsageError
from ...io.atomic import AtomicDir, AtomicFile
from ...io.source import open_source

__all__ = ["ExtractedFile", "extract_archive", "plan_extraction", "safe_parts"]


@dataclass(frozen=True)
class ExtractedFile:
    """One file written (or, in a plan, to be written)."""

    member: str
    path: str
    size: int

    def to_dict(self) -> dict[str, Any]:
        return {"member": self.member, "path": self.path, "size": self.size}


def safe_parts(name: str) -> list[str]:
    """The path components of archive name ``name``, or FormatError when it is unsafe."""
    bad = None
    if not name or "\0" in name:
        bad = "empty name or NUL byte"
    elif "\\" in name:
        bad = "backslash in name (a path separator on Windows)"
    elif name.startswith("/"):
        bad = "absolute path"
    elif len(name) >= 2 and name[1] == ":":
        bad = "drive letter"
    parts = name.rstrip("/").split("/") if bad is None else []
    if bad is None and any(p in ("", ".", "..") for p in parts):
        bad = "empty, '.' or '..' path component"
    if bad is None and any("\udc80" <= ch <= "\udcff" for ch in name):
        bad = "name is not valid UTF-8"
    if bad is not None:
        raise FormatError(
            f"unsafe archive member name: {bad}",
            member=repr(name),
            hint="the archive tries to write outside the output folder; nothing was extracted",
        )
    return parts


def _unix_mode(zr: ZipReader, e: ZipEntry) -> int | None:
    """The Unix mode in the central header's external attributes (when made on Unix)."""
    raw = zr.source.view(e.central_offset, 46, what="central directory entry")
    made_by_os = raw[5]
    (ext_attr,) = struct.unpack_from("<I", raw, 38)
    if made_by_os in (3, 19):  # Unix, OS X
        return ext_attr >> 16
    return None


def plan_extraction(zr: ZipReader, outdir: Any, *, strip_prefix: bool = False) -> list[tuple[ZipEntry, list[str]]]:
    """Check every record and return ``(entry, path components)`` for the files to write.

    Raises:
        FormatError: an unsafe name, a symlink entry, or colliding names.
    """
    plan: list[tuple[ZipEntry, list[str]]] = []
    seen: dict[str, str] = {}
    dirs: set[str] = set()
    cut = len(zr.prefix) + 1 if (strip_prefix and zr.prefix) else 0
    for e in zr.entries:
        name = e.name
        if cut and name.startswith(zr.prefix + "/"):
            name = name[cut:]
        if name == "":
            continue
        parts = safe_parts(name)
        mode = _unix_mode(zr, e)
        if mode is not None and stat.S_ISLNK(mode):
            raise FormatError("archive member is a symbolic link; refusing to extract", path=zr.path, member=e.name)
        if name.endswith("/"):
            if e.size:
                raise FormatError("directory entry with data", path=zr.path, member=e.name)
            dirs.add("/".join(parts).lower())
            continue
        key = "/".join(parts).lower()
        if key in seen:
            raise FormatError(
                "two archive members map to the same file (names differ at most in case)",
                path=zr.path,
                member=e.name,
                found=seen[key],
            )
        seen[key] = e.name
        for i in range(1, len(parts)):
            dirs.add("/".join(parts[:i]).lower())
        plan.append((e, parts))
    clash = sorted(k for k in seen if k in dirs)
    if clash:
        raise FormatError("an archive member is both a file and a folder", path=zr.path, member=seen[clash[0]])
    return plan


def _ensure_dir(root: str, parts: list[str]) -> str:
    """Create ``root/parts...`` one level at a time, refusing symlinks and non-folders."""
    cur = root
    for p in parts:
        cur = os.path.join(cur, p)
        try:
            st = os.lstat(cur)
        except FileNotFoundError:
            os.mkdir(cur)
            continue
        if stat.S_ISLNK(st.st_mode):
            raise UsageError("a symlink inside the output folder is in the way; refusing to follow it", path=cur)
        if not stat.S_ISDIR(st.st_mode):
            raise UsageError("a file inside the output folder is in the way of a folder", path=cur)
    return cur


def extract_archive(
    src: Any,
    outdir: Any,
    *,
    strip_prefix: bool = False,
    overwrite: bool = False,
    max_total_bytes: int | None = None,
    check_crc: bool = True,
) -> list[ExtractedFile]:
    """Unpack every record of the zip ``src`` under ``outdir``.

    Args:
        src: the archive (path, bytes or ByteSource).
        outdir: the output folder (created if missing).
        strip_prefix: drop the archive folder (``mlp/``) from the written paths.
        overwrite: replace files that already exist (never symlinks).
        max_total_bytes: refuse archives whose records add up to more than this.
        check_crc: compare each record's CRC-32 (when the archive stores one).

    Returns:
        The files written, in archive order.

    Raises:
        FormatError: unsafe names, symlink entries, colliding names (nothing written).
        LimitError: over ``max_total_bytes`` (nothing written).
        ChecksumError: a record's data does not match its CRC (nothing is published).
        UsageError: a file or symlink is in the way in the output folder.
    """
    zr = src if isinstance(src, ZipReader) else ZipReader(open_source(src), require_prefix=False)
    plan = plan_extraction(zr, outdir, strip_prefix=strip_prefix)
    total = sum(e.size for e, _ in plan)
    if max_total_bytes is not None and total > max_total_bytes:
        raise LimitError(
            "archive is larger than allowed to extract",
            path=zr.path,
            expected=f"<= {max_total_bytes} bytes",
            found=f"{total} bytes",
        )
    root = os.fspath(outdir)
    if os.path.islink(root):
        root = os.path.realpath(root)  # the caller named it; only links *inside* are refused
    if not overwrite:
        for _e, parts in plan:
            target = os.path.join(root, *parts)
            if os.path.lexists(target):
                raise UsageError(
                    "output file exists",
                    path=target,
                    hint="pass --force (or --overwrite; overwrite=True in Python) to replace it",
                )
    for _e, parts in plan:  # what is in the way, before anything is written
        cur = root
        for p in parts:
            cur = os.path.join(cur, p)
            if os.path.islink(cur):
                raise UsageError("a symlink inside the output folder is in the way; refusing to follow it", path=cur)
        if os.path.isdir(cur):
            raise UsageError("a folder is in the way of a file", path=cur)
    if not os.path.isdir(os.path.dirname(os.path.abspath(root))):
        os.makedirs(os.path.dirname(os.path.abspath(root)), exist_ok=True)
    out: list[ExtractedFile] = []
    # everything is extracted into a hidden folder beside ``root`` and published at the
    # end (renamed, or moved into an existing folder), so an interrupted run leaves
    # nothing half-written
    with AtomicDir(root, merge=True, replace=overwrite) as stage:
        for e, parts in plan:
            folder = _ensure_dir(stage.tmp, parts[:-1])
            data = zr.read(e)
            if check_crc and e.crc and zlib.crc32(data) != e.crc:
                raise ChecksumError(
                    "record CRC-32 does not match its data",
                    path=zr.path,
                    member=e.name,
                    expected=f"{e.crc:08x}",
                    found=f"{zlib.crc32(data):08x}",
                )
            with AtomicFile(os.path.join(folder, parts[-1]), dest=os.path.join(root, *parts)) as f:
                f.file.write(data)
            out.append(ExtractedFile(e.name, os.path.join(root, *parts), e.size))
    return out
