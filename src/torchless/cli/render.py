"""Formatting helpers for the CLI: objects in, text out; and :func:`echo`, the one way the
commands print text.

Everything the command line prints goes through :func:`echo` (or is JSON from
:func:`format_json`): names, keys and strings from a file never reach the terminal with
their control characters raw (:mod:`torchless.core.printable`). The formatters escape
each value whole (a newline in a tensor name is ``\n``, not a forged row); :func:`echo`
escapes everything but the newlines and tabs of the lines it is given, whatever
formatted them.
"""

from __future__ import annotations

import json
import sys
from typing import Any, TextIO

from ..core.printable import escape_controls, escape_json_text

__all__ = [
    "format_bytes",
    "format_json",
    "format_tree",
    "format_table",
    "format_info",
    "emit_json",
    "json_safe",
    "echo",
    "shown",
]


def shown(value: Any) -> str:
    """``str(value)`` as one line a terminal shows and does nothing with (every control
    character, newline included, escaped)."""
    return escape_controls(str(value))


def echo(text: Any = "", *, end: str = "\n", file: TextIO | None = None, flush: bool = False) -> None:
    """Print ``text`` (lines laid out by torchless) with every control character but
    newlines and tabs escaped: what ``print`` is for the commands."""
    print(escape_controls(str(text), keep="\n\t"), end=end, file=file if file is not None else sys.stdout, flush=flush)


def format_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def json_safe(obj: Any) -> Any:
    """``obj`` with what JSON cannot hold made explicit: non-finite floats as the strings
    ``"nan"``, ``"inf"``, ``"-inf"``; tuples as arrays; keys as strings."""
    if isinstance(obj, float):
        return obj if obj == obj and obj not in (float("inf"), float("-inf")) else repr(obj)
    if isinstance(obj, dict):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return obj


def format_json(obj: Any) -> str:
    """Strict JSON (no NaN/Infinity tokens), indented, UTF-8 kept but for the controls
    (C1, DEL, bidi) that a terminal would act on: those as ``\\u`` escapes."""
    return escape_json_text(json.dumps(json_safe(obj), indent=2, default=str, ensure_ascii=False, allow_nan=False))


def emit_json(command: str, obj: Any) -> None:
    """Print the ``--json`` result of ``command`` (its schema: ``cli/schemas/<command>.json``)."""
    print(format_json(obj))


def format_tree(tree: Any, indent: str = "") -> str:
    lines: list[str] = []

    def go(x: Any, pad: str, label: str | None) -> None:
        if label is not None:
            label = shown(label)
        head = f"{pad}{label}: " if label is not None else pad
        if isinstance(x, dict):
            if label is not None:
                lines.append(f"{pad}{label}:" + (f" {shown(x['<object>'])}" if "<object>" in x else ""))
            for k, v in x.items():
                if k == "<object>":
                    continue
                go(v, pad + ("  " if label is not None else ""), k)
        elif isinstance(x, list) and x and any(isinstance(v, (dict, list)) for v in x):
            lines.append(f"{pad}{label}:" if label is not None else pad.rstrip())
            for i, v in enumerate(x):
                go(v, pad + "  ", f"[{i}]")
        else:
            lines.append(head + shown(json.dumps(x, default=str) if not isinstance(x, str) else x))

    go(tree, indent, None)
    return "\n".join(l for l in lines if l.strip())


def format_table(rows: list[list[str]], header: list[str] | None = None) -> str:
    allrows = [[shown(c) for c in r] for r in ([header] if header else []) + rows]
    if not allrows:
        return ""
    widths = [max(len(str(r[i])) for r in allrows) for i in range(len(allrows[0]))]
    out = []
    for j, r in enumerate(allrows):
        out.append("  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=False)).rstrip())
        if header and j == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def format_info(info: dict[str, Any]) -> str:
    """Human text for an ``Artifact.info()`` dict: scalars first, then the tree."""
    lines = []
    skip = {"tree", "bytes_by_dtype"}
    for k, v in info.items():
        if (
            k in skip
            or isinstance(v, (dict, list))
            and k not in ("records", "globals_not_allowlisted", "torch_weights_only_would_refuse")
        ):
            continue
        if k.endswith("bytes") and isinstance(v, int):
            v = f"{format_bytes(v)} ({v})"
        if isinstance(v, dict):
            v = ", ".join(f"{a}={str(b).strip()}" for a, b in v.items()) or "-"
        if isinstance(v, list):
            v = ", ".join(map(str, v)) or "-"
        lines.append(f"{shown(k):>32}: {shown(v)}")
    if info.get("bytes_by_dtype"):
        lines.append(f"{'bytes_by_dtype':>32}: " + ", ".join(f"{d} {format_bytes(b)}" for d, b in info["bytes_by_dtype"].items()))
    for k, v in info.items():
        if (
            isinstance(v, (dict, list))
            and k not in skip
            and k not in ("records", "globals_not_allowlisted", "torch_weights_only_would_refuse")
        ):
            lines.append(f"{shown(k)}:")
            lines.append(format_tree(v, "  ") if v else "  -")
    if info.get("tree") is not None:
        lines.append("tree:")
        lines.append(format_tree(info["tree"], "  "))
    return "\n".join(lines)
