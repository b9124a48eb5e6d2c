"""Text from a file made safe to show on a terminal: one function for every text output.

A tensor name, a zip member, a metadata value or a pickle string is chosen by whoever
wrote the file. Printed raw, an ``ESC [`` sequence (or its one-byte C1 form ``\\x9b``)
moves the cursor, rewrites earlier lines, sets the window title or makes a link; a
carriage return or a newline forges a line ("CLEAN"); a bidi override (U+202E) shows
text in another order than it is stored. :func:`escape_controls` spells every such
character as a Python escape (``\\x1b``, ``\\x9b``, ``\\u202e``), so the terminal shows it
and does nothing with it. Every text path of the command line goes through it (the CLI's
``render.out``, its error line, the scan report's names).

JSON output stays JSON: ``json.dumps`` escapes C0 controls itself; C1 controls, DEL and
the bidi controls are valid in JSON strings and would reach a terminal raw when the
output is not redirected, so :func:`escape_json_text` writes them as ``\\u`` escapes too
(a JSON parser reads back the very same string).
"""

from __future__ import annotations

__all__ = ["UNSAFE", "escape_controls", "escape_json_text"]

#: the characters never written raw: C0 controls, DEL, C1 controls, and the bidi
#: marks, embeddings, overrides and isolates (LRM, RLM, ALM, LRE..RLO, LRI..PDI)
UNSAFE: frozenset[str] = frozenset(
    [chr(c) for c in range(0x20)]
    + [chr(0x7F)]
    + [chr(c) for c in range(0x80, 0xA0)]
    + ["\u200e", "\u200f", "\u061c"]
    + [chr(c) for c in range(0x202A, 0x202F)]
    + [chr(c) for c in range(0x2066, 0x206A)]
)


def _spelling(ch: str) -> str:
    c = ord(ch)
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


_TABLE = {ord(ch): _spelling(ch) for ch in UNSAFE}
_JSON_TABLE = {ord(ch): f"\\u{ord(ch):04x}" for ch in UNSAFE if ord(ch) >= 0x7F}
_TABLES: dict[str, dict[int, str]] = {}


def escape_controls(text: str, *, keep: str = "") -> str:
    """``text`` with every character of :data:`UNSAFE` but those in ``keep`` (``"\\n"``
    for a block of lines torchless laid out itself) written as an escape."""
    table = _TABLES.get(keep)
    if table is None:
        table = {k: v for k, v in _TABLE.items() if chr(k) not in keep}
        _TABLES[keep] = table
    return text.translate(table)


def escape_json_text(text: str) -> str:
    """JSON text (what ``json.dumps`` wrote, C0 already escaped) with DEL, the C1 controls
    and the bidi controls written as ``\\uXXXX``: the same JSON value, nothing raw on a
    terminal. (Outside strings JSON text is ASCII without controls, so the replacement
    only ever lands inside strings.)"""
    return text.translate(_JSON_TABLE)
