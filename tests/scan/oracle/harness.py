"""The loader oracle: run the real loaders (``child.py``), scan the same files with
``coverage=True``, and check that the scanner analysed every span they unpickled and every
source they compiled, and that a file whose loader reached a payload is never CLEAN.

Used by ``tests/scan/test_oracle.py`` (bounded counts) and ``scripts/oracle_fuzz.py`` (long
runs). Test helper only.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
from collections import defaultdict
from typing import Any

CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "child.py")

#: file names of sources compiled by torch itself from a graph the scanner models (torch.fx
#: code generation of ``torch.export.load``), not text the file carries
GENERATED = ("<eval_with_key>",)


EMPTY = hashlib.sha256(b"").hexdigest()  # an empty source runs nothing (transformers' package __init__)


def run_loaders(jobs: list[tuple[str, str]], *, procs: int = 2, timeout: float = 1200) -> list[dict[str, Any]]:
    """Run ``(loader, path)`` jobs in ``procs`` child processes (each forks per job)."""
    # contiguous slices: the jobs of one carrier (one heavy import: transformers) stay together
    size = -(-len(jobs) // procs)
    chunks = [jobs[i : i + size] for i in range(0, len(jobs), size)] if len(jobs) >= 2 * procs else [jobs]
    running = []
    for chunk in chunks:
        fd, name = tempfile.mkstemp(suffix=".json")
        with os.fdopen(fd, "w") as f:
            json.dump(chunk, f)
        # output to files, not pipes: a child blocked on a full pipe nobody reads yet would stall
        out_f, err_f = tempfile.TemporaryFile(), tempfile.TemporaryFile()
        p = subprocess.Popen([sys.executable, CHILD, name], stdout=out_f, stderr=err_f)
        running.append((p, name, chunk, out_f, err_f))
    out: list[dict[str, Any]] = []
    for p, name, chunk, out_f, err_f in running:
        p.wait(timeout=timeout)
        os.unlink(name)
        out_f.seek(0)
        err_f.seek(0)
        stdout, stderr = out_f.read(), err_f.read()
        out_f.close()
        err_f.close()
        assert p.returncode == 0, stderr.decode(errors="replace")[-3000:]
        rows = [json.loads(line) for line in stdout.decode().splitlines() if line.startswith("{")]
        assert len(rows) == len(chunk), stderr.decode(errors="replace")[-3000:]
        out += rows
    return out


def scan_coverage(paths: list[str]) -> dict[str, dict[str, Any]]:
    """path -> ``{"clean", "verdicts", "pickles", "sources"}`` from ``torchless.scan``."""
    import torchless

    out: dict[str, dict[str, Any]] = {}
    for p in paths:
        rep = torchless.scan(p, coverage=True, jobs=1)
        cov = [c for fr in rep.files for c in (fr.coverage or [])]
        out[p] = {
            "clean": all(fr.verdict == "clean" for fr in rep.files) and bool(rep.files),
            "verdicts": sorted({fr.verdict for fr in rep.files}),
            "pickles": {c["sha256"] for c in cov if c["what"] == "pickle"},
            "sources": {c["sha256"] for c in cov if c["what"] == "source"},
        }
    return out


def problems(row: dict[str, Any], scan: dict[str, Any]) -> list[str]:
    """What the scanner missed of one loader run (empty: covered)."""
    if not scan["clean"]:
        return []  # UNANALYSABLE, SUSPICIOUS or DANGEROUS: never reported as fine
    out = []
    for r in row["reached"]:
        out.append(f"payload reached ({r['event']}: {r['detail'][:80]}) but the scan is CLEAN")
    for s in row["spans"]:
        if s["sha256"] is None:
            out.append(f"an unpickled span the oracle could not read back ({s.get('error')}); scan CLEAN")
        elif s["sha256"] in scan["pickles"] or (not s["complete"] and s.get("stop_sha256") in scan["pickles"]):
            continue
        elif not s["complete"] and not s["globals"] and not row["reached"]:
            continue  # the unpickler failed before resolving any global: nothing of it ran
        else:
            out.append(f"unpickled span not analysed ({s['length']} bytes, complete={s['complete']}, sha256 {s['sha256'][:12]})")
    for s in row["sources"]:
        if s["filename"].startswith(GENERATED) or s["sha256"] in (EMPTY, *scan["sources"]):
            continue
        out.append(f"compiled source not analysed ({s['filename']}, sha256 {s['sha256'][:12]})")
    return out


def check(cases: list[dict[str, Any]], *, procs: int = 2) -> dict[str, dict[str, Any]]:
    """Run every case's loaders and the scan; per class: cases, loader runs, payloads
    reached, spans seen, and the failures (``[(path, loader, problem)]``)."""
    jobs = [(ld, c["path"]) for c in cases for ld in c["loaders"]]
    rows = run_loaders(jobs, procs=procs)
    scans = scan_coverage([c["path"] for c in cases])
    by_path = defaultdict(list)
    for r in rows:
        by_path[r["path"]].append(r)
    out: dict[str, dict[str, Any]] = {}
    for c in cases:
        st = out.setdefault(c["cls"], {"cases": 0, "runs": 0, "reached": 0, "spans": 0, "sources": 0, "failures": []})
        st["cases"] += 1
        for r in by_path[c["path"]]:
            st["runs"] += 1
            st["reached"] += bool(r["reached"])
            st["spans"] += len(r["spans"])
            st["sources"] += len(r["sources"])
            for p in problems(r, scans[c["path"]]):
                st["failures"].append((c["path"], r["loader"], p))
    return out
