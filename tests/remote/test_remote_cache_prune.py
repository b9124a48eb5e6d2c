"""``torchless cache prune`` of a TorchInductor cache at a URL (memory://, moto's S3 server)
plans and deletes what the same prune of the local copy plans and deletes.

Oracles: the local prune of an identical copy (its plan and its result), and what is left
on each side by the store's own listing (boto3 / the memory filesystem) against
``os.walk``.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from .test_remote import _cli
from .test_remote_formats import _inductor_cache


def _put(local: Path, backend: str, request) -> tuple[str, object]:
    """A copy of cache folder ``local`` at a URL; ``(url, lister)`` where ``lister()``
    gives the relative paths of the objects left there."""
    files = sorted(f for f in local.rglob("*") if f.is_file())
    if backend == "memory":
        fs, base = request.getfixturevalue("memfs")
        for f in files:
            fs.pipe(f"{base}/c/{f.relative_to(local).as_posix()}", f.read_bytes())
        return f"memory://{base}/c", lambda: sorted(p[len(base) + 3 :] for p in fs.find(f"{base}/c"))
    base, client = request.getfixturevalue("s3")
    bucket = base[5:]
    for f in files:
        client.put_object(Bucket=bucket, Key=f"c/{f.relative_to(local).as_posix()}", Body=f.read_bytes())

    def keys() -> list[str]:
        resp = client.list_objects_v2(Bucket=bucket, Prefix="c/")
        return sorted(o["Key"][2:] for o in resp.get("Contents", []))

    return f"{base}/c", keys


def _local_files(root: Path) -> list[str]:
    return sorted(f.relative_to(root).as_posix() for f in root.rglob("*") if f.is_file())


def _lines(text: str) -> list[str]:
    """The dry run's table without the ages (a copy's are its upload times), in any order."""
    return sorted(re.sub(r"\b\d+(\.\d+)?[smhdw]\b", "<age>", line) for line in text.splitlines())


def _plan(text: str) -> dict:
    """A prune's JSON without what differs between copies: the root and the ages."""
    d = json.loads(text)
    d.pop("root")
    for e in d["entries"]:
        e.pop("age_s")
    # oldest first: a copy's order of equal-size ties follows its upload times
    d["entries"].sort(key=lambda e: e["id"])
    d["files"].sort()
    for k in ("removed_files", "removed_dirs"):
        if "result" in d:
            d["result"][k].sort()
    return d


# by kind and by size, not by age: a copy's times are its upload times, not the local ones
@pytest.mark.parametrize("backend", ["memory", "s3"])
@pytest.mark.parametrize("limits", [["--kind", "triton_kernel", "--max-size", "0"], ["--max-size", "0"], ["--older-than", "1h"]])
def test_cache_prune_at_url_matches_local(request, tmp_path, capsys, backend, limits):
    local = tmp_path / "c"
    _inductor_cache(local)
    before = _local_files(local)
    url, listed = _put(local, backend, request)
    assert listed() == before
    # the dry run (the default, and --dry-run): the same plan, nothing removed
    for extra in ([], ["--dry-run"]):
        c1, o1, e1 = _cli(capsys, "cache", "prune", str(local), *limits, *extra, "--json")
        c2, o2, e2 = _cli(capsys, "cache", "prune", url, *limits, *extra, "--json")
        assert c1 == c2 == 0, (e1, e2)
        p1, p2 = _plan(o1), _plan(o2)
        assert sorted(p2["dirs"]) == sorted(p1["dirs"]), set(p1["dirs"]) ^ set(p2["dirs"])
        assert p2 == p1
    assert listed() == before and _local_files(local) == before
    t1 = _cli(capsys, "cache", "prune", str(local), *limits)[1]
    t2 = _cli(capsys, "cache", "prune", url, *limits)[1]
    assert _lines(t1.replace(str(local), "<p>")) == _lines(t2.replace(url, "<p>"))
    # --yes: the same files (and folders) removed, the same left
    c1, o1, e1 = _cli(capsys, "cache", "prune", str(local), *limits, "--yes", "--json")
    c2, o2, e2 = _cli(capsys, "cache", "prune", url, *limits, "--yes", "--json")
    assert c1 == c2 == 0, (e1, e2)
    r1, r2 = _plan(o1), _plan(o2)
    assert r2 == r1 and r1["result"]["skipped"] == []
    assert listed() == _local_files(local)
    if limits[-1] == "1h":
        assert r1["files"] == [] and listed() == before
    else:
        assert r1["files"] and len(listed()) == len(before) - len(r1["files"])
    if limits[0] == "--max-size":
        assert listed() == []


def test_cache_prune_at_url_skips_what_changed(request, tmp_path, capsys, memfs):
    """A file rewritten between the plan and --yes is skipped and reported, as locally."""
    from torchless.formats.inductor_cache.inventory import inventory
    from torchless.formats.inductor_cache.prune import apply_prune, plan_prune

    local = tmp_path / "c"
    _inductor_cache(local)
    url, listed = _put(local, "memory", request)
    fs, _base = memfs
    plan = plan_prune(inventory(url, parse_pickles=False), max_size=0)
    victim = plan.files[0]
    fs.pipe(url[len("memory://") :] + "/" + victim, b"rewritten by a compile running meanwhile")
    res = apply_prune(plan)
    assert res.skipped[0] == (victim, "changed since the inventory")
    assert {r for _p, r in res.skipped[1:]} <= {"not empty"}  # the folders that still hold it
    assert sorted(res.removed_files) == sorted(plan.files[1:])
    assert listed() == [victim]


def test_cache_prune_over_http_is_refused(http_root, tmp_path, capsys):
    root, base, handler = http_root
    _inductor_cache(tmp_path / "c")
    shutil.copytree(tmp_path / "c", root / "c")
    for extra in ([], ["--yes"]):
        code, _out, err = _cli(capsys, "cache", "prune", f"{base}/c/", "--max-size", "0", *extra)
        assert code == 2 and "does not list folders" in err and err.count("\n") == 1, err
    assert handler.sent == 0 and _local_files(root / "c") == _local_files(tmp_path / "c")
