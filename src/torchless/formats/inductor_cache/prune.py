"""Pruning a TorchInductor cache: plan first (a dry run), then remove exactly the plan.

:func:`plan_prune` picks whole :class:`~torchless.formats.inductor_cache.inventory.CacheEntry`
units: first every entry older than ``older_than`` (age = time since its newest file was
written), then, while the rest is larger than ``max_size``, the oldest remaining entries.
The plan lists every file and every folder that removing them empties.

:func:`apply_prune` removes those files and folders and nothing else. A file that
changed (size or mtime) or disappeared since the inventory, or whose folder is no longer
the one inventoried (a symlink swapped in), is skipped and reported, so a compile running
concurrently does not lose a fresh entry. Symbolic links are removed as links, never
followed. Removing cache entries is always safe for torch: a missing entry is a miss.
"""

from __future__ import annotations

import os
import re
import stat
import time
from dataclasses import dataclass, field
from typing import Any

from ...core.errors import UsageError
from ...core.sizes import parse_size as _parse_size
from ...io.store import LOCAL, Store
from .inventory import CacheEntry, CacheInventory, _mtime

__all__ = ["PrunePlan", "PruneResult", "apply_prune", "parse_duration", "parse_size", "plan_prune"]

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DUR = re.compile(r"(\d+(?:\.\d+)?)\s*([smhdw]?)")


def parse_duration(text: Any) -> float:
    """``"7d"``, ``"12h"``, ``"1d12h"``, ``"90m"``, ``"3600"`` (seconds) -> seconds.

    Raises:
        UsageError: anything else.
    """
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        if text < 0:
            raise UsageError("a duration cannot be negative", found=text)
        return float(text)
    t = str(text).strip().lower().replace(" ", "")
    pos = 0
    total = 0.0
    for m in _DUR.finditer(t):
        if m.start() != pos or not m.group(0):
            break
        total += float(m.group(1)) * _UNITS[m.group(2) or "s"]
        pos = m.end()
    if not t or pos != len(t):
        raise UsageError("not a duration", found=repr(text), expected="e.g. 7d, 12h, 1d12h, 90m, 30s, 2w")
    return total


def parse_size(text: Any) -> int:
    """``"1G"``, ``"500MiB"``, ``"10MB"``, ``"1000"`` -> bytes (:func:`torchless.core.sizes.parse_size`,
    the units of ``convert --max-shard-size``); ``0`` is a valid prune target (remove everything)."""
    n = _parse_size(text, allow_zero=True)
    if n < 0:
        raise UsageError("a size cannot be negative", found=text)
    return n


@dataclass
class PrunePlan:
    """What :func:`apply_prune` will remove.

    Attributes:
        root: the cache folder.
        entries: ``(entry, reason)`` pairs, oldest first.
        files: relative paths of the files to remove.
        dirs: relative folders left empty by that (deepest first).
        bytes: bytes freed.
        remaining_bytes: the cache's size afterwards.
    """

    root: str
    entries: list[tuple[CacheEntry, str]] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    dirs: list[str] = field(default_factory=list)
    bytes: int = 0
    remaining_bytes: int = 0
    _expected: dict[str, tuple[int, float]] = field(default_factory=dict, repr=False)
    #: the inventory's store (where ``root`` lives)
    store: Store = field(default=LOCAL, repr=False, compare=False)

    def to_dict(self, now: float | None = None) -> dict[str, Any]:
        now = time.time() if now is None else now
        return {
            "root": self.root,
            "entries": [
                {"id": e.id, "kind": e.kind, "size": e.size, "age_s": round(max(0.0, now - e.mtime), 3), "reason": r}
                for e, r in self.entries
            ],
            "files": list(self.files),
            "dirs": list(self.dirs),
            "bytes": self.bytes,
            "remaining_bytes": self.remaining_bytes,
        }


@dataclass
class PruneResult:
    """What :func:`apply_prune` did: removed files and folders, and what it skipped (why)."""

    removed_files: list[str] = field(default_factory=list)
    removed_dirs: list[str] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    bytes: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "removed_files": self.removed_files,
            "removed_dirs": self.removed_dirs,
            "skipped": [{"path": p, "reason": r} for p, r in self.skipped],
            "bytes": self.bytes,
        }


def plan_prune(
    inv: CacheInventory,
    *,
    older_than: float | None = None,
    max_size: int | None = None,
    kinds: list[str] | None = None,
    now: float | None = None,
) -> PrunePlan:
    """Choose the entries to remove (nothing is touched).

    Args:
        inv: the inventory to plan from.
        older_than: seconds; entries whose newest file is older are removed.
        max_size: bytes; then the oldest entries are removed until the cache fits.
        kinds: only consider entries of these kinds (the size still counts all).
        now: the reference time (default: the inventory's scan time).

    Raises:
        UsageError: neither limit given.
    """
    if older_than is None and max_size is None:
        raise UsageError("nothing to prune by", expected="older_than and/or max_size")
    now = inv.scanned_at if now is None else now
    plan = PrunePlan(inv.root, store=inv.store)
    pool = [e for e in inv.entries if kinds is None or e.kind in kinds]
    pool.sort(key=lambda e: (e.mtime, e.id))
    chosen: dict[str, str] = {}
    if older_than is not None:
        for e in pool:
            if now - e.mtime > older_than:
                chosen[e.id] = f"older than {_fmt_duration(older_than)}"
    total = inv.size - sum(e.size for e in pool if e.id in chosen)
    if max_size is not None:
        for e in pool:
            if total <= max_size:
                break
            if e.id in chosen or e.size == 0:
                continue
            chosen[e.id] = f"cache over {max_size} bytes"
            total -= e.size
    plan.entries = [(e, chosen[e.id]) for e in pool if e.id in chosen]
    removed: set[str] = set()
    for e, _r in plan.entries:
        for f in e.files:
            plan.files.append(f.rel)
            plan._expected[f.rel] = (f.size, f.mtime)
            removed.add(f.rel)
        plan.bytes += e.size
    plan.remaining_bytes = inv.size - plan.bytes
    plan.dirs = _emptied_dirs(inv, removed)
    return plan


def _emptied_dirs(inv: CacheInventory, removed: set[str]) -> list[str]:
    """Folders whose every file is removed (at least one), with their empty subfolders."""
    total: dict[str, int] = {}
    gone: dict[str, int] = {}
    for e in inv.entries:
        for f in e.files:
            parts = f.rel.split("/")
            for i in range(1, len(parts)):
                d = "/".join(parts[:i])
                total[d] = total.get(d, 0) + 1
                if f.rel in removed:
                    gone[d] = gone.get(d, 0) + 1
    emptied = {d for d, n in gone.items() if n and n == total.get(d, 0)}
    out = set()
    for d in inv.dirs:
        parts = d.split("/")
        if any("/".join(parts[:i]) in emptied for i in range(1, len(parts) + 1)):
            out.add(d)
    return sorted(out, key=lambda d: (-d.count("/"), d))


def apply_prune(plan: PrunePlan) -> PruneResult:
    """Remove exactly ``plan.files`` and then ``plan.dirs`` (skipping what changed).

    A cache at a URL of a store that lists folders (``s3://``, ``gs://``, ``az://``,
    ``memory://``) is pruned the same way through its filesystem: each file is checked
    against the listing the plan was made from (size and modification time) and deleted.
    """
    if plan.store.remote:
        return _apply_url(plan)
    res = PruneResult()
    root = os.path.realpath(plan.root)
    for rel in plan.files:
        full = os.path.join(plan.root, *rel.split("/"))
        parent_rel = os.path.dirname(rel)
        want_parent = os.path.join(root, *parent_rel.split("/")) if parent_rel else root
        if os.path.realpath(os.path.dirname(full)) != want_parent:
            res.skipped.append((rel, "its folder is no longer the one inventoried"))
            continue
        try:
            st = os.lstat(full)
        except FileNotFoundError:
            res.skipped.append((rel, "already gone"))
            continue
        if stat.S_ISDIR(st.st_mode):
            res.skipped.append((rel, "now a folder"))
            continue
        exp = plan._expected.get(rel)
        if exp is not None and (st.st_size != exp[0] or st.st_mtime != exp[1]):
            res.skipped.append((rel, "changed since the inventory"))
            continue
        try:
            os.unlink(full)
        except OSError as e:
            res.skipped.append((rel, f"{type(e).__name__}: {e.strerror or e}"))
            continue
        res.removed_files.append(rel)
        res.bytes += st.st_size
    for rel in plan.dirs:
        full = os.path.join(plan.root, *rel.split("/"))
        try:
            if os.path.islink(full):
                res.skipped.append((rel, "now a symbolic link"))
                continue
            os.rmdir(full)
        except FileNotFoundError:
            res.skipped.append((rel, "already gone"))
            continue
        except OSError:
            res.skipped.append((rel, "not empty"))
            continue
        res.removed_dirs.append(rel)
    return res


def _apply_url(plan: PrunePlan) -> PruneResult:
    """:func:`apply_prune` for a cache at a URL (object stores have no links to check)."""
    from ...io import remote

    res = PruneResult()
    fs, base = remote.filesystem(plan.root)
    base = base.rstrip("/")
    for rel in plan.files:
        p = base + "/" + rel
        try:
            fs.invalidate_cache(p)
            info = fs.info(p)
        except FileNotFoundError:
            res.skipped.append((rel, "already gone"))
            continue
        if info.get("type") == "directory":
            res.skipped.append((rel, "now a folder"))
            continue
        size = int(info.get("size") or 0)
        exp = plan._expected.get(rel)
        if exp is not None and (size != exp[0] or _mtime(info) != exp[1]):
            res.skipped.append((rel, "changed since the inventory"))
            continue
        try:
            fs.rm_file(p)
        except Exception as e:  # noqa: BLE001 - each filesystem raises its own kind
            res.skipped.append((rel, f"{type(e).__name__}: {e}"))
            continue
        res.removed_files.append(rel)
        res.bytes += size
    for rel in plan.dirs:
        p = base + "/" + rel
        fs.invalidate_cache(p)
        try:
            left = fs.ls(p, detail=False)
        except FileNotFoundError:
            # an object store's folder is the prefix of its objects: it went with the last one
            res.removed_dirs.append(rel)
            continue
        if left:
            res.skipped.append((rel, "not empty"))
            continue
        try:
            fs.rmdir(p)  # a folder of its own (memory://, a store with folder markers)
        except FileNotFoundError:
            pass
        except Exception as e:  # noqa: BLE001
            res.skipped.append((rel, f"{type(e).__name__}: {e}"))
            continue
        res.removed_dirs.append(rel)
    return res


def _fmt_duration(sec: float) -> str:
    for unit, n in (("w", 7 * 86400), ("d", 86400), ("h", 3600), ("m", 60)):
        if sec >= n and sec % n == 0:
            return f"{int(sec // n)}{unit}"
    return f"{sec:g}s"
