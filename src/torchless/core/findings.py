"""What ``verify`` and ``scan`` report: :class:`Problem` (a structural finding about one
artifact) and :class:`Finding` (one thing the security scanner found).

They live in ``core`` because every layer produces them: containers and format handlers
return problems from ``verify()``, the scanner returns findings, and the CLI renders both.
The scanner's rule table (``RULES``) and verdicts stay in :mod:`torchless.scan.findings`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["SEVERITIES", "UNANALYSED_RULES", "Finding", "Problem"]

#: most to least severe; ``info`` never makes a file "not clean".
SEVERITIES = ("critical", "high", "medium", "low", "info")

#: rules that say "these bytes could be executed by a loader and were not fully analysed":
#: any of them makes a file UNANALYSABLE (unless something dangerous was found), never CLEAN.
UNANALYSED_RULES = frozenset({"unanalysable", "malformed-pickle", "limit", "engine-disagreement", "unrecognized"})


@dataclass(frozen=True, slots=True)
class Problem:
    """A structural finding about a container (for ``verify`` and ``scan``)."""

    code: str
    message: str
    member: str | None = None
    offset: int | None = None
    severity: str = "error"

    def to_dict(self) -> dict[str, Any]:
        return {
            "code": self.code,
            "message": self.message,
            "member": self.member,
            "offset": self.offset,
            "severity": self.severity,
        }


@dataclass
class Finding:
    """One thing a scan found.

    Attributes:
        rule: id from :data:`RULES`.
        severity: one of :data:`SEVERITIES`.
        message: what and why, in one or two sentences.
        path: the file.
        member: where inside it (``archive/data.pkl``, ``legacy pickle #4``,
            ``__0_0.distcp[1577:3154] > archive/data.pkl``); None for the file itself.
        offset: byte offset inside ``member`` (or the file when no member).
        file_offset: absolute byte offset in the file when it is known (stored members).
        global_name: the global concerned, if any.
        disassembly: a few disassembled opcodes around ``offset``.
        loader: the loader that would execute what the finding is about (one of
            :data:`LOADERS`), when it is known.
    """

    rule: str
    severity: str
    message: str
    path: str
    member: str | None = None
    offset: int | None = None
    file_offset: int | None = None
    global_name: str | None = None
    disassembly: list[str] = field(default_factory=list)
    loader: str | None = None

    @property
    def unanalysed(self) -> bool:
        """True for findings that say part of the file was not analysed."""
        return self.rule in UNANALYSED_RULES and self.severity != "info"

    def to_dict(self) -> dict[str, Any]:
        return {
            "rule": self.rule,
            "severity": self.severity,
            "message": self.message,
            "path": self.path,
            "member": self.member,
            "offset": self.offset,
            "file_offset": self.file_offset,
            "global": self.global_name,
            "disassembly": list(self.disassembly),
            "loader": self.loader,
        }
