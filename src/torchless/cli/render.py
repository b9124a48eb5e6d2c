"""Pure formatting helpers for the CLI: objects in, text out (no printing)."""

from __future__ import annotations

import json
from typing import Any

__all__ = ["format_bytes", "format_json", "format_tree", "format_table", "format_info", "emit_json", "json_safe"]


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
    """Strict JSON (no NaN/Infinity tokens), indented, UTF-8 kept."""
    return json.dumps(json_safe(obj), indent=2, default=str, ensure_ascii=False, allow_nan=False)


def emit_json(command: str, obj: Any) -> None:
    """Print the ``--json`` result of ``command`` (its schema: ``cli/schemas/<command>.json``)."""
    print(format_json(obj))


def format_tree(tree: Any, indent: str = "") -> str:
    lines: list[str] = []

    def go(x: Any, pad: str, label: str | None) -> None:
        head = f"{pad}{label}: " if label is not None else pad
        if isinstance(x, dict):
            if label is not None:
                lines.append(f"{pad}{label}:" + (f" {x['<object>']}" if "<object>" in x else ""))
            for k, v in x.items():
                if k == "<object>":
                    continue
                go(v, pad + ("  " if label is not None else ""), k)
        elif isinstance(x, list) and x and any(isinstance(v, (dict, list)) for v in x):
            lines.append(f"{pad}{label}:" if label is not None else pad.rstrip())
            for i, v in enumerate(x):
                go(v, pad + "  ", f"[{i}]")
        else:
            lines.append(head + (json.dumps(x, default=str) if not isinstance(x, str) else x))

    go(tree, indent, None)
    return "\n".join(l for l in lines if l.strip())


def format_table(rows: list[list[str]], header: list[str] | None = None) -> str:
    allrows = ([header] if header else []) + rows
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
        lines.append(f"{k:>32}: {v}")
    if info.get("bytes_by_dtype"):
        lines.append(f"{'bytes_by_dtype':>32}: " + ", ".join(f"{d} {format_bytes(b)}" for d, b in info["bytes_by_dtype"].items()))
    for k, v in info.items():
        if (
            isinstance(v, (dict, list))
            and k not in skip
            and k not in ("records", "globals_not_allowlisted", "torch_weights_only_would_refuse")
        ):
            lines.append(f"{k}:")
            lines.append(format_tree(v, "  ") if v else "  -")
    if info.get("tree") is not None:
        lines.append("tree:")
        lines.append(format_tree(info["tree"], "  "))
    return "\n".join(lines)
