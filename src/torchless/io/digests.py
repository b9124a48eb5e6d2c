"""SHA-256 digests for ``verify --sha256`` and ``verify --manifest``.

Formats without a checksum of their own (safetensors, ONNX and its external data, DCP,
joblib...: :attr:`~torchless.formats.base.Capabilities.checksum` is empty) cannot see a
flipped payload byte; a digest recorded when the file was written can. A manifest is the
output of ``sha256sum``: one ``HEX  NAME`` (or ``HEX *NAME``) a line, names relative to the
manifest's folder, blank lines and ``#`` comments skipped. Files are hashed in 1 MiB chunks
(memory stays flat whatever their size); a manifest holds at most :data:`MAX_MANIFEST_BYTES`.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from typing import Any

from ..core.errors import FormatError, LimitError, NotFoundError, UsageError
from ..core.findings import Problem

__all__ = ["Digest", "MAX_MANIFEST_BYTES", "check_digests", "read_manifest", "sha256_file"]

#: the largest manifest read (a line per file: far more than any checkpoint holds)
MAX_MANIFEST_BYTES = 16 << 20
_CHUNK = 1 << 20
_HEX = re.compile(r"[0-9a-fA-F]{64}")
_LINE = re.compile(r"^\\?([0-9a-fA-F]{64}) [ *](.+)$")


@dataclass(frozen=True)
class Digest:
    """One file checked: its path, the expected and the actual SHA-256 (None: missing)."""

    file: str
    expected: str
    actual: str | None

    @property
    def ok(self) -> bool:
        return self.actual == self.expected

    def to_dict(self) -> dict[str, Any]:
        return {"file": self.file, "expected": self.expected, "actual": self.actual, "ok": self.ok}


def sha256_file(path: str) -> str:
    """The SHA-256 of the file at ``path`` as lowercase hex, read in chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _hex(text: str, what: str) -> str:
    if not _HEX.fullmatch(text.strip()):
        raise UsageError(f"{what} is not a SHA-256 digest", expected="64 hexadecimal digits", found=repr(text[:80]))
    return text.strip().lower()


def read_manifest(path: str) -> list[tuple[str, str]]:
    """``(hex digest, file path)`` for each line of a ``sha256sum`` manifest; the paths are
    joined to the manifest's folder.

    Raises:
        NotFoundError: no such manifest.
        LimitError: a manifest larger than :data:`MAX_MANIFEST_BYTES`.
        FormatError: a line that is not ``HEX  NAME``, naming the line.
    """
    try:
        size = os.path.getsize(path)
    except OSError:
        raise NotFoundError("no such manifest", path=path) from None
    if size > MAX_MANIFEST_BYTES:
        raise LimitError("manifest too large", path=path, expected=f"at most {MAX_MANIFEST_BYTES} bytes", found=size)
    with open(path, "rb") as f:
        text = f.read().decode("utf-8", "replace")
    base = os.path.dirname(path)
    out = []
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        m = _LINE.match(line.rstrip("\r"))
        if m is None:
            raise FormatError(
                f"line {i} of the manifest is not a sha256sum line",
                path=path,
                expected="HEX  NAME (64 hexadecimal digits, two spaces or ' *', the file name)",
                found=repr(line[:80]),
            )
        out.append((m.group(1).lower(), os.path.join(base, m.group(2))))
    if not out:
        raise FormatError("the manifest lists no file", path=path, expected="HEX  NAME lines")
    return out


def check_digests(path: str, *, sha256: str | None = None, manifest: str | None = None) -> tuple[list[Digest], list[Problem]]:
    """Compare ``path`` with ``sha256``, and every file ``manifest`` lists with its digest.

    Returns ``(digests, problems)``: an error ``sha256-mismatch`` naming each file whose
    digest differs, ``sha256-missing`` for a listed file that is absent, and a warning
    ``not-in-manifest`` for the file ``path`` (or, for a folder, each file directly in it)
    that the manifest does not list.

    Raises:
        UsageError: ``sha256`` is not 64 hex digits, or is given for a folder; a URL.
    """
    from .store import store_for

    if any(store_for(p).remote for p in (path, manifest) if p is not None):  # (both asked in one place)
        raise UsageError("--sha256 and --manifest check local files only", path=path)
    digests: list[Digest] = []
    problems: list[Problem] = []

    def check(file: str, want: str) -> None:
        got = sha256_file(file) if os.path.isfile(file) else None
        d = Digest(file, want, got)
        digests.append(d)
        if got is None:
            problems.append(Problem("sha256-missing", f"{file}: listed with a digest, but no such file", member=file))
        elif not d.ok:
            problems.append(Problem("sha256-mismatch", f"{file}: sha256 {got} differs from the expected {want}", member=file))

    if sha256 is not None:
        want = _hex(sha256, "--sha256")
        if os.path.isdir(path):
            raise UsageError("--sha256 takes one file; this is a folder", path=path, hint="use --manifest FILE")
        check(path, want)
    if manifest is not None:
        listed = read_manifest(manifest)
        for want, file in listed:
            check(file, want)
        seen = {os.path.realpath(f) for _, f in listed} | {os.path.realpath(manifest)}
        here = (
            [os.path.join(path, n) for n in sorted(os.listdir(path)) if os.path.isfile(os.path.join(path, n))]
            if os.path.isdir(path)
            else [path]
        )
        for f in here:
            if os.path.realpath(f) not in seen:
                problems.append(
                    Problem("not-in-manifest", f"{f}: not listed in the manifest {manifest}", member=f, severity="warning")
                )
    return digests, problems
