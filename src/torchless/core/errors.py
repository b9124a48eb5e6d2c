"""The error tree of torchless.

Every error that bad input can cause is a :class:`TorchlessError`. Subclasses also
inherit the builtin exception a caller would naturally catch, so ``except ValueError``
keeps working for code that does not know torchless::

    TorchlessError(Exception)
    ├── FormatError(ValueError)            the bytes are not what the format says
    │   ├── TruncatedError                 the input ends before a declared length
    │   ├── ChecksumError                  a CRC or digest does not match
    │   └── LinkEscapeError                a path or symlink named by the file leaves the artifact
    ├── UnsafeGlobalError(PermissionError) weights_only refused a global (never executed)
    ├── LimitError(ValueError)             an explicit safety limit was exceeded
    ├── UnsupportedError(NotImplementedError)  valid input torchless cannot handle yet
    ├── NotFoundError(FileNotFoundError, KeyError)  a path, member or key is missing
    └── UsageError(ValueError)             the caller asked for something inconsistent

Each error carries the ``path``, ``member`` (a record inside an archive) and ``offset``
where it happened, plus what was ``expected`` and what was ``found``; ``str(err)`` is one
line that names them all, which is what the CLI prints.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "ChecksumError",
    "FormatError",
    "LimitError",
    "LinkEscapeError",
    "NotFoundError",
    "TorchlessError",
    "TruncatedError",
    "UnsafeGlobalError",
    "UnsupportedError",
    "UsageError",
]


class TorchlessError(Exception):
    """Root of every error torchless raises on bad input.

    Args:
        message: what went wrong, in one sentence.
        path: the file (or directory) being read.
        member: the record inside an archive (``archive/data.pkl``), if any.
        offset: the byte offset in ``member`` (or in the file when no member).
        expected: what the format requires there.
        found: what was actually there.
        hint: how to fix or work around it.
    """

    def __init__(
        self,
        message: str,
        *,
        path: Any = None,
        member: str | None = None,
        offset: int | None = None,
        expected: Any = None,
        found: Any = None,
        hint: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.path = None if path is None else str(path)
        self.member = member
        self.offset = offset
        self.expected = expected
        self.found = found
        self.hint = hint

    def with_context(self, *, path: Any = None, member: str | None = None) -> "TorchlessError":
        """Fill in ``path``/``member`` where the raiser did not know them; returns self."""
        if self.path is None and path is not None:
            self.path = str(path)
        if self.member is None and member is not None:
            self.member = member
        return self

    def __str__(self) -> str:
        where = []
        if self.path is not None:
            where.append(self.path)
        if self.member is not None:
            where.append(f"member {self.member!r}")
        if self.offset is not None:
            where.append(f"offset {self.offset}")
        text = self.message
        if self.expected is not None or self.found is not None:
            text += f" (expected {self.expected}, found {self.found})"
        if where:
            text = ": ".join([", ".join(where), text])
        if self.hint:
            text += f"; {self.hint}"
        return text

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready description of the error."""
        return {
            "error": type(self).__name__,
            "message": self.message,
            "path": self.path,
            "member": self.member,
            "offset": self.offset,
            "expected": None if self.expected is None else str(self.expected),
            "found": None if self.found is None else str(self.found),
            "hint": self.hint,
        }


class FormatError(TorchlessError, ValueError):
    """The input does not follow the format it claims to be."""


class TruncatedError(FormatError):
    """The input ends before a length it declares."""


class ChecksumError(FormatError):
    """A stored CRC-32 or digest does not match the bytes."""


class LinkEscapeError(FormatError):
    """A path taken from the file (a sibling file's name, an external-data location) or a
    symbolic link on the way to it resolves outside the artifact's folder; nothing there
    was opened."""


class UnsafeGlobalError(TorchlessError, PermissionError):
    """A pickle names a global that the active allowlist does not allow.

    Attributes:
        global_name: the dotted name (``module.qualname``) that was refused.
    """

    def __init__(self, message: str, *, global_name: str = "", **kw: Any) -> None:
        super().__init__(message, **kw)
        self.global_name = global_name


class LimitError(TorchlessError, ValueError):
    """An explicit safety limit (size, depth, count) was exceeded."""


class UnsupportedError(TorchlessError, NotImplementedError):
    """Well-formed input that this version of torchless does not handle."""


class NotFoundError(TorchlessError, FileNotFoundError, KeyError):
    """A file, archive member or key does not exist."""

    def __str__(self) -> str:  # KeyError would otherwise repr() the message
        return TorchlessError.__str__(self)


class UsageError(TorchlessError, ValueError):
    """The caller's request is inconsistent (bad option, wrong shape for a replacement)."""
