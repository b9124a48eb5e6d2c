"""The three stores answer one protocol alike: a local folder, a URL's filesystem (fsspec's
``memory://``) and the in-memory test store hold the same two files and must give the same
answers (reads, ranges, listings, stats, confinement, publish, remove)."""

from __future__ import annotations

import uuid

import pytest

from torchless.core.errors import LinkEscapeError, NotFoundError
from torchless.io.store import FSSPEC, LOCAL, FsspecStore, LocalStore, MemoryStore, resolve, store_for

FILES = {"a.bin": b"0123456789", "sub/b.bin": b"xyz"}


def _local(tmp_path):
    for k, v in FILES.items():
        p = tmp_path / k
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(v)
    return LocalStore(), str(tmp_path)


def _fsspec(tmp_path):
    pytest.importorskip("fsspec", reason="fsspec (the remote extra) is not installed")
    import fsspec

    root = f"memory://store-{uuid.uuid4().hex}"
    fs = fsspec.filesystem("memory")
    for k, v in FILES.items():
        fs.pipe_file(f"{root}/{k}"[len("memory://") :], v)
    return FsspecStore(), root


def _memory(tmp_path):
    return MemoryStore({f"root/{k}": v for k, v in FILES.items()}), "root"


@pytest.fixture(params=[_local, _fsspec, _memory], ids=["local", "fsspec", "memory"])
def store(request, tmp_path):
    return request.param(tmp_path)


def test_reads_ranges_and_listing(store):
    st, root = store
    a = st.join(root, "a.bin")
    assert st.read_bytes(a) == b"0123456789"
    assert st.read_range(a, 2, 5) == b"234"
    src = st.open(a)
    try:
        assert src.size == 10 and src.read_at(7, 3) == b"789"
    finally:
        src.close()
    assert st.list(root) == ["a.bin", "sub"]
    assert st.list(st.join(root, "sub")) == ["b.bin"]
    with pytest.raises(NotFoundError):
        st.list(st.join(root, "nothing"))


def test_stat_isdir_exists(store):
    st, root = store
    assert st.stat(st.join(root, "a.bin")).size == 10
    assert not st.stat(st.join(root, "a.bin")).is_dir
    assert st.stat(st.join(root, "sub")).is_dir and st.isdir(st.join(root, "sub"))
    assert st.stat(st.join(root, "missing")) is None
    assert st.exists(st.join(root, "a.bin")) and not st.exists(st.join(root, "missing"))
    assert not st.isdir(st.join(root, "a.bin"))
    assert st.isfile(st.join(root, "a.bin")) and not st.isfile(st.join(root, "missing"))


@pytest.mark.parametrize("bad", ["../a.bin", "/etc/passwd", "a\x00b", "", ".."])
def test_confine_refuses_names_that_leave_the_folder(store, bad):
    st, root = store
    with pytest.raises(LinkEscapeError):
        st.confine(root, bad, what="storage file")


def test_confine_keeps_plain_names_and_subdirs_only_when_asked(store):
    st, root = store
    assert st.read_bytes(st.confine(root, "a.bin")) == b"0123456789"
    assert st.read_bytes(st.confine(root, "sub/b.bin", subdirs=True)) == b"xyz"
    with pytest.raises(LinkEscapeError):
        st.confine(root, "sub/b.bin")


def test_publish_and_remove(store, tmp_path):
    st, root = store
    local = tmp_path / "staged.tmp"
    local.write_bytes(b"new bytes")
    dst = st.join(root, "c.bin")
    assert st.publish(str(local), dst) == 9
    assert st.read_bytes(dst) == b"new bytes"
    st.remove(dst)
    assert not st.exists(dst)
    st.remove(dst)  # quietly: already gone


def test_a_location_resolves_once_to_its_store(tmp_path):
    assert store_for(str(tmp_path)) is LOCAL and store_for(tmp_path) is LOCAL
    assert store_for("s3://bucket/x") is FSSPEC and store_for("memory://x") is FSSPEC and store_for("file:///x") is FSSPEC
    assert resolve("file:///tmp/x.pt") == (LOCAL, "/tmp/x.pt")  # a file:// URL names a local path
    assert resolve("s3://b/k") == (FSSPEC, "s3://b/k")
    assert FSSPEC.remote and not LOCAL.remote


def test_is_url_is_asked_only_where_a_location_is_resolved():
    """Below the edge a location's store is passed down: ``is_url`` is called only by the
    store's resolution, the byte-source and fsspec modules themselves, the probe-level
    Lightning test (a probe's text); the range-write jobs ask the store too."""
    import ast
    import pathlib

    import torchless

    src = pathlib.Path(torchless.__file__).parent
    allowed = {"io/store.py", "io/source.py", "io/remote.py", "formats/trainers/lightning.py"}
    found = set()
    for f in src.rglob("*.py"):
        rel = f.relative_to(src).as_posix()
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Call):
                fn = node.func
                name = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", None)
                if name == "is_url":
                    found.add(rel)
    outside = sorted(found - allowed)
    assert outside == [], outside
