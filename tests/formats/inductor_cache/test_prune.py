"""``cache prune``: the plan (dry run) removes nothing; applying it removes exactly the
planned files and folders, checked against the file system before and after."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from torchless.cli.main import main
from torchless.core.errors import UsageError
from torchless.formats.inductor_cache.inventory import inventory
from torchless.formats.inductor_cache.prune import apply_prune, parse_duration, plan_prune

from .test_inventory import synthetic_cache

DAY = 86400.0


def snapshot(root: Path) -> dict[str, tuple[int, int] | None]:
    """Every file (size, mtime_ns) and folder (None) below root."""
    out: dict[str, tuple[int, int] | None] = {}
    for dirpath, dirs, files in os.walk(root):
        for d in dirs:
            out[os.path.relpath(os.path.join(dirpath, d), root).replace(os.sep, "/")] = None
        for f in files:
            st = os.lstat(os.path.join(dirpath, f))
            out[os.path.relpath(os.path.join(dirpath, f), root).replace(os.sep, "/")] = (st.st_size, st.st_mtime_ns)
    return out


def age(root: Path, entry, days: float, now: float) -> None:  # type: ignore[no-untyped-def]
    for f in entry.files:
        os.utime(root / f.rel, (now - days * DAY, now - days * DAY), follow_symlinks=False)


def check_exact(before: dict, after: dict, plan) -> None:  # type: ignore[no-untyped-def]
    gone = set(before) - set(after)
    assert gone == set(plan.files) | set(plan.dirs)
    assert set(after) <= set(before)
    for k in after:  # nothing else was touched
        assert after[k] == before[k]


def prepare(root: Path) -> tuple:  # type: ignore[type-arg]
    now = time.time()
    inv = inventory(root, parse_pickles=False)
    ents = sorted(inv.entries, key=lambda e: e.id)
    for i, e in enumerate(ents):
        age(root, e, days=i, now=now)  # entry i is i days old
    return inventory(root, parse_pickles=False), now


def run_exact(root: Path, **kw) -> None:  # type: ignore[no-untyped-def]
    inv, now = prepare(root)
    plan = plan_prune(inv, now=now, **kw)
    before = snapshot(root)
    assert snapshot(root) == before  # planning touched nothing
    res = apply_prune(plan)
    after = snapshot(root)
    assert res.skipped == []
    assert res.removed_files == plan.files and res.removed_dirs == plan.dirs
    check_exact(before, after, plan)
    return inv, plan, now  # type: ignore[return-value]


def test_prune_by_age_synthetic(tmp_path: Path) -> None:
    root = tmp_path / "c"
    synthetic_cache(root)
    inv, plan, now = run_exact(root, older_than=7 * DAY)
    assert plan.entries and all(now - e.mtime > 7 * DAY for e, _ in plan.entries)
    assert all(now - e.mtime <= 7 * DAY for e in inventory(root).entries)


def test_prune_by_size_oldest_first(tmp_path: Path) -> None:
    root = tmp_path / "c"
    synthetic_cache(root)
    inv0 = inventory(root)
    limit = inv0.size // 2
    inv, plan, _now = run_exact(root, max_size=limit)
    assert inventory(root).size <= limit
    removed = [e for e, _ in plan.entries]
    kept = [e for e in inv.entries if e.id not in {r.id for r in removed} and e.size]
    assert max(e.mtime for e in removed) <= min(e.mtime for e in kept)


def test_prune_kind_filter(tmp_path: Path) -> None:
    root = tmp_path / "c"
    synthetic_cache(root)
    inv, plan, _ = run_exact(root, older_than=0, kinds=["triton_cache"])
    assert {e.kind for e, _ in plan.entries} == {"triton_cache"}
    assert "triton" in plan.dirs and not (root / "triton").exists()


@pytest.mark.slow
@pytest.mark.differential
def test_prune_real_cache(cache_copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    inv, now = prepare(cache_copy)
    before = snapshot(cache_copy)
    # dry run through the CLI: lists, removes nothing
    assert main(["cache", "prune", str(cache_copy), "--older-than", "1d", "--json"]) == 0
    dry = json.loads(capsys.readouterr().out)
    assert dry["dry_run"] and dry["files"]
    assert snapshot(cache_copy) == before
    assert main(["cache", "prune", str(cache_copy), "--older-than", "1d", "--dry-run"]) == 0
    assert "dry run: nothing removed" in capsys.readouterr().out
    assert snapshot(cache_copy) == before
    # --yes removes exactly the listed files and folders
    assert main(["cache", "prune", str(cache_copy), "--older-than", "1d", "--yes", "--json"]) == 0
    done = json.loads(capsys.readouterr().out)
    after = snapshot(cache_copy)
    assert set(before) - set(after) == set(dry["files"]) | set(dry["dirs"])
    assert done["result"]["removed_files"] == dry["files"] and done["result"]["skipped"] == []
    for k in after:
        assert after[k] == before[k]
    # the youngest entry (0 days) survived, the rest went
    assert len(inventory(cache_copy).entries) == 1


def test_changed_files_are_skipped(tmp_path: Path) -> None:
    root = tmp_path / "c"
    synthetic_cache(root)
    inv, now = prepare(root)
    plan = plan_prune(inv, older_than=0, now=now + 1)
    victim = plan.files[0]
    (root / victim).write_bytes(b"rewritten by a concurrent compile")
    res = apply_prune(plan)
    assert (victim, "changed since the inventory") in res.skipped
    assert (root / victim).exists()
    assert set(res.removed_files) == set(plan.files) - {victim}


def test_symlink_removed_not_target(tmp_path: Path) -> None:
    root = tmp_path / "c"
    root.mkdir()
    target = tmp_path / "keep.txt"
    target.write_text("keep")
    os.symlink(target, root / "l")
    inv = inventory(root)
    res = apply_prune(plan_prune(inv, older_than=0, now=time.time() + 10))
    assert res.removed_files == ["l"] and target.read_text() == "keep"


def test_parse_duration() -> None:
    assert parse_duration("7d") == 7 * DAY
    assert parse_duration("1d12h") == 1.5 * DAY
    assert parse_duration("90m") == 5400
    assert parse_duration("30") == 30
    assert parse_duration("2w") == 14 * DAY
    for bad in ["", "7x", "d", "-1d", "1d x"]:
        with pytest.raises(UsageError):
            parse_duration(bad)


def test_cli_usage_errors(tmp_path: Path) -> None:
    assert main(["cache", "prune", str(tmp_path)]) == 2
    assert main(["cache", "prune", str(tmp_path), "--older-than", "1d", "--yes", "--dry-run"]) == 2
    assert main(["cache", str(tmp_path), "--older-than", "1d"]) == 2
    assert main(["cache", "prune", str(tmp_path), "x", "--max-size", "1G"]) == 2
    assert (
        main(["cache", "prune", str(tmp_path / "none"), "--max-size", "1G"]) == 2
    )  # a named folder that does not exist is an error
