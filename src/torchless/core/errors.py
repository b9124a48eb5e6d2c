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
    ├── UsageError(ValueError)             the caller asked for something inconsistent
    ├── WriteError(OSError)                an output could not be written (full disk,
    │                                      read-only folder); nothing was published
    └── InternalError(RuntimeError)        a bug in torchless, not in the input

Only what the input (or the caller) can cause is reported as one of the first six; an
unexpected exception inside torchless is wrapped as :class:`InternalError`, whose message
says it is a torchless bug, so that a bug never passes for a bad file.

Each error carries the ``path``, ``member`` (a record inside an archive) and ``offset``
where it happened, plus what was ``expected`` and what was ``found``; ``str(err)`` is one
line that names them all, which is what the CLI prints::

    model.pt: member 'archive/data.pkl', offset 12: invalid pickle opcode 0xff (expected a pickle opcode, found 0xff)

Only the parts that are set are printed (``(found 0)`` when only ``found`` is known).
Values for ``found`` should be built with :func:`short_repr`, which stays bounded on
deep or huge input.
"""

from __future__ import annotations

import os
from typing import Any, TypedDict

__all__ = [
    "ChecksumError",
    "FormatError",
    "InternalError",
    "LimitError",
    "LinkEscapeError",
    "NotFoundError",
    "TorchlessError",
    "TruncatedError",
    "UnsafeGlobalError",
    "UnsupportedError",
    "UsageError",
    "Where",
    "WhereAt",
    "WriteError",
    "short_repr",
]


class Where(TypedDict, total=False):
    """The location keywords of :class:`TorchlessError`, gathered once and passed as ``**where``."""

    path: Any
    member: str | None


class WhereAt(Where, total=False):
    """:class:`Where` with the byte ``offset`` too."""

    offset: int | None


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
        self.path = _path_text(path)
        self.member = member
        self.offset = offset
        self.expected = expected
        self.found = found
        self.hint = hint

    def with_context(self, *, path: Any = None, member: str | None = None) -> TorchlessError:
        """Fill in ``path``/``member`` where the raiser did not know them; returns self."""
        if self.path is None and path is not None:
            self.path = _path_text(path)
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
        text = self.message.strip().rstrip(".;:,") or type(self).__name__
        parts = []
        if _is_set(self.expected):
            parts.append(f"expected {self.expected}")
        if _is_set(self.found):
            parts.append(f"found {self.found}")
        if parts:
            text += f" ({', '.join(parts)})"
        if where:
            text = ": ".join([", ".join(where), text])
        if self.hint:
            text += f"; {self.hint.strip().rstrip('.')}"
        return text

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready description of the error."""
        return {
            "error": type(self).__name__,
            "message": self.message,
            "path": self.path,
            "member": self.member,
            "offset": self.offset,
            "expected": str(self.expected) if _is_set(self.expected) else None,
            "found": str(self.found) if _is_set(self.found) else None,
            "hint": self.hint,
        }


def _path_text(path: Any) -> str | None:
    """A path as text; anything that is not a path (a caller's swapped argument: a dict of
    tensors, an array) is shown as a bounded repr, never its full ``str()``."""
    if path is None:
        return None
    if isinstance(path, str):
        return path
    if isinstance(path, os.PathLike):
        return str(os.fspath(path))
    return short_repr(path)


def _is_set(v: Any) -> bool:
    return v is not None and not (isinstance(v, str) and not v.strip())


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


class WriteError(TorchlessError, OSError):
    """An output could not be written (full disk, size limit, read-only or missing folder).

    ``path`` is the destination the caller named, never a temporary name; nothing was
    published there.
    """

    def __str__(self) -> str:  # OSError would otherwise format its args
        return TorchlessError.__str__(self)


class InternalError(TorchlessError, RuntimeError):
    """An unexpected exception inside torchless: a bug, never a property of the input.

    ``str()`` says so and names the original exception; ``__cause__`` keeps it (with its
    traceback) for the bug report.
    """

    def __init__(self, message: str, **kw: Any) -> None:
        super().__init__(message, **kw)
        if not self.hint:
            self.hint = "this is a torchless bug, please report it with the input that caused it"

    @classmethod
    def wrap(cls, exc: BaseException, doing: str, **kw: Any) -> InternalError:
        """An InternalError for ``exc`` raised while ``doing`` something (chain it with ``from``)."""
        return cls(f"internal error while {doing}: {type(exc).__name__}: {_bounded(str(exc), 200)}", **kw)


def _bounded(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: max(0, limit - 1)] + "\u2026"


_SCALARS = (bool, int, float, complex, type(None))


def short_repr(obj: Any, limit: int = 80, *, depth: int = 3, items: int = 6) -> str:
    """A ``repr`` of ``obj`` that is bounded in time, depth and length.

    Builtin containers are shown ``depth`` levels deep and ``items`` entries wide; any
    other object shows only its type, so a hostile value (a deep or self-sharing tree, an
    object whose ``repr`` recurses) can never make an error message hang or recurse.
    """

    def rep(x: Any, d: int) -> str:
        t = type(x)
        if t in _SCALARS:
            if t is int and x.bit_length() > 256:
                return f"<int of {x.bit_length()} bits>"
            return repr(x)
        if t is str:
            return repr(x[:limit]) + ("\u2026" if len(x) > limit else "")
        if t in (bytes, bytearray):
            return repr(bytes(x[:limit])) + ("\u2026" if len(x) > limit else "")
        if t in (list, tuple, set, frozenset, dict):
            if d >= depth:
                return "[\u2026]" if t is list else "(\u2026)" if t is tuple else "{\u2026}"
            if t is dict:
                body = [f"{rep(k, d + 1)}: {rep(v, d + 1)}" for _, (k, v) in zip(range(items), x.items(), strict=False)]
            else:
                body = [rep(v, d + 1) for _, v in zip(range(items), x, strict=False)]
            if len(x) > items:
                body.append("\u2026")
            inner = ", ".join(body)
            if t is list:
                return f"[{inner}]"
            if t is tuple:
                return f"({inner}{',' if len(x) == 1 else ''})"
            if t is dict:
                return "{" + inner + "}"
            return f"{t.__name__}({{{inner}}})"
        return f"<{t.__name__}>"

    return _bounded(rep(obj, 0), limit)
