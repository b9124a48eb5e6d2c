"""Render a :class:`~torchless.scan.findings.ScanReport`: for people, JSON, SARIF 2.1.0."""

from __future__ import annotations

import json
import os
from typing import Any

from ..core.printable import escape_controls as _shown
from .findings import RULES, SEVERITIES, ScanReport

__all__ = ["format_text", "format_json", "format_sarif"]

#: kinds whose format holds data only (no pickle, no code, no program): said so when no
#: other view of the file found a stream
_DATA_ONLY = ("safetensors", "hf")

_SARIF_LEVEL = {"critical": "error", "high": "error", "medium": "warning", "low": "note", "info": "none"}


def format_text(report: ScanReport, *, verbose: bool = False) -> str:
    """One block per file: verdict, findings (what, where, why, disassembly), allowlist advice."""
    lines: list[str] = []
    for fr in report.files:
        counted = fr.counted()
        what = f"{fr.streams} pickle stream{'s' if fr.streams != 1 else ''}"
        if fr.kind in _DATA_ONLY and not fr.streams and not counted:
            what = "no executable content"
        head = f"{_shown(fr.path)}: {fr.verdict.upper()} ({fr.kind}, {what}"
        head += f", {len(counted)} finding{'s' if len(counted) != 1 else ''})" if counted else ")"
        if fr.verdict == "clean" and not verbose and not fr.weights_only and not fr.weights_only_blockers:
            lines.append(head)
            continue
        lines.append(head)
        order = {s: i for i, s in enumerate(SEVERITIES)}
        for f in sorted(fr.findings, key=lambda f: order.get(f.severity, 9)):
            if f.severity == "info" and not verbose:
                continue
            where = _shown(f.member or "(file)")
            if f.offset is not None:
                where += f" @ {f.offset:#x}"
            if f.file_offset is not None and f.file_offset != f.offset:
                where += f" (file offset {f.file_offset:#x})"
            lines.append(f"  [{f.severity}] {f.rule}: {where}")
            lines.append(f"      {_shown(f.message)}")
            for d in f.disassembly:
                lines.append(f"      {_shown(d)}")
        if fr.weights_only or fr.weights_only_blockers:
            lines.append("  torch.load(weights_only=True) refuses this file:")
            for b in fr.weights_only_blockers:
                lines.append(f"    - {_shown(b)}")
            if fr.weights_only:
                lines.append("    globals to allow with torch.serialization.add_safe_globals:")
                for n in fr.weights_only:
                    advice = {
                        "safe": "safe to allow",
                        "nested": "NEVER allow: it deserialises its argument with a loader that runs code",
                        "unknown": "unknown: allow only if you trust this class",
                        "dangerous": "NEVER allow",
                    }.get(n.verdict, "unknown")
                    lines.append(f"    - {_shown(n.global_name)}: {advice} ({_shown(n.reason)})")
        if fr.error:
            lines.append(f"  error: {_shown(fr.error)}")
    d = report.to_dict()["summary"]
    parts = ", ".join(f"{v} {k}" for k, v in sorted(d["verdicts"].items()))
    if not report.files:
        lines.append("error: no files to scan (an empty folder, or nothing that could be listed); exit code 2")
    else:
        lines.append(f"scanned {d['files']} file{'s' if d['files'] != 1 else ''}: {parts}")
    return "\n".join(lines)


def format_json(report: ScanReport) -> str:
    return json.dumps(report.to_dict(), indent=2, sort_keys=False)


def format_sarif(report: ScanReport, *, base: str | None = None) -> str:
    """SARIF 2.1.0 for code-scanning CI (one result per finding; info findings omitted)."""
    from ..core.version import __version__

    rule_ids = sorted(RULES)
    results: list[dict[str, Any]] = []
    for fr in report.files:
        for f in fr.findings:
            if f.severity == "info":
                continue
            uri = f.path
            if base:
                try:
                    uri = os.path.relpath(f.path, base)
                except ValueError:
                    pass
            region: dict[str, Any] = {}
            off = f.file_offset if f.file_offset is not None else (f.offset if f.member is None else None)
            if off is not None:
                region = {"byteOffset": off, "byteLength": 1}
            loc: dict[str, Any] = {"physicalLocation": {"artifactLocation": {"uri": uri.replace(os.sep, "/")}}}
            if region:
                loc["physicalLocation"]["region"] = region
            if f.member:
                loc["logicalLocations"] = [{"name": f.member, "kind": "member"}]
            results.append(
                {
                    "ruleId": f.rule,
                    "ruleIndex": rule_ids.index(f.rule) if f.rule in rule_ids else 0,
                    "level": _SARIF_LEVEL.get(f.severity, "warning"),
                    "message": {"text": f.message},
                    "locations": [loc],
                    "properties": {
                        "severity": f.severity,
                        "member": f.member,
                        "offset": f.offset,
                        "global": f.global_name,
                        "disassembly": f.disassembly,
                    },
                }
            )
    doc = {
        "$schema": "https://json.schemastore.org/sarif-2.1.0.json",
        "version": "2.1.0",
        "runs": [
            {
                "tool": {
                    "driver": {
                        "name": "torchless-scan",
                        "version": __version__,
                        "informationUri": "https://github.com/torchless/torchless",
                        "rules": [{"id": r, "name": r, "shortDescription": {"text": RULES[r]}} for r in rule_ids],
                    }
                },
                "results": results,
            }
        ],
    }
    return json.dumps(doc, indent=2)
