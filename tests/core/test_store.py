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


#: every call of ``store_for``, ``resolve`` or ``is_url`` in src/torchless, by module (how
#: many): where a location enters and is resolved once into a store and a path. Below
#: these the store travels with the location (a Probe's and an Artifact's ``store``, a
#: reader's ``store=``, ``AtomicFile(store=)``, a copy piece's ``remote``).
RESOLVED_AT = {
    "io/store.py": 2,  # store_for (the one is_url test) and resolve itself
    "io/source.py": 1,  # open_source: a path or URL given as a byte source
    "io/remote.py": 2,  # accepts_storage_options (the URLs an API call names), join
    "io/atomic.py": 1,  # target(): an output made without its writer's store
    "io/digests.py": 1,  # check_digests (local files only): the CLI's verify
    "formats/base.py": 2,  # Probe.of (detection's entry), Artifact.store (an artifact made directly)
    "formats/dcp/constants.py": 1,  # store_of: a DCP reader made directly of a path or URL
    "formats/dcp/reshard.py": 2,  # reshard's destination, its source (the API's and each worker's)
    "formats/hf/ranged.py": 2,  # write_shards' destination, a range task's source in its worker
    "formats/inductor_cache/inventory.py": 1,  # the cache folder given to inventory()
    "formats/onnx/read.py": 2,  # OnnxModel made directly (set_weights, read_model), base_dir=
    "jobs/staging.py": 1,  # cleanup(): what an interrupted job left at a destination
    "scan/__init__.py": 1,  # the scanner's entry: each location the walk is given
    "scan/carriers/base.py": 1,  # a ScanEngine made directly of a path (the walk passes its store)
    "cli/commands/_output.py": 2,  # the CLI's outputs as a command names them: a file's, a folder's
}


def _location_calls(src):
    """``{module: number of calls}`` of the store's ``store_for``/``resolve`` and the
    ``is_url`` test (imported by name, or called as an attribute: ``remote.is_url``)."""
    import ast

    names = {"store_for", "resolve", "is_url"}
    out = {}
    for f in sorted(src.rglob("*.py")):
        rel = f.relative_to(src).as_posix()
        tree = ast.parse(f.read_text())
        bound = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.rsplit(".", 1)[-1] in ("store", "remote"):
                bound |= {a.asname or a.name for a in node.names if a.name in names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.module.rsplit(".", 1)[-1] == "_cli_api":
                # the CLI's facade re-exports them (resolve as resolve_location)
                bound |= {a.asname or a.name for a in node.names if a.name in names | {"resolve_location"}}
            elif isinstance(node, ast.FunctionDef) and node.name in names and node.col_offset == 0 and rel.startswith("io/"):
                bound.add(node.name)  # the defining module calling its own
        n = 0
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                fn = node.func
                if isinstance(fn, ast.Name) and fn.id in bound:
                    n += 1
                elif isinstance(fn, ast.Attribute) and (
                    fn.attr in ("store_for", "is_url") or (fn.attr == "resolve" and getattr(fn.value, "id", None) == "store")
                ):
                    n += 1  # (any object's is_url/store_for; Path.resolve is not the store's)
        if n:
            out[rel] = n
    return out


def test_a_location_is_resolved_only_where_it_enters():
    """Below the edge a location's store is passed down: ``store_for``, ``resolve`` and
    ``is_url`` are called only in :data:`RESOLVED_AT`, that many times (a call added
    anywhere else, or one more in those modules, fails here)."""
    import pathlib

    import torchless

    found = _location_calls(pathlib.Path(torchless.__file__).parent)
    assert found == RESOLVED_AT


def test_the_location_census_sees_a_new_call(tmp_path):
    """The census above counts each way of calling them (so that it can fail)."""
    pkg = tmp_path / "pkg"
    (pkg / "io").mkdir(parents=True)
    (pkg / "io" / "store.py").write_text("def store_for(x):\n    return is_url(x)\n\ndef resolve(x):\n    return store_for(x)\n")
    (pkg / "a.py").write_text(
        "from .io.store import resolve, store_for as sf\nfrom .io import remote\n"
        "def f(p):\n    sf(p); resolve(p); remote.is_url(p); p.resolve(); x.store_for(p)\n"
    )
    (pkg / "c.py").write_text(
        "from ._cli_api import resolve_location as r, store_for\nfrom ._cli_api import inventory\n"
        "def f(p):\n    r(p); store_for(p); inventory(p)\n"
    )  # through the CLI's facade
    (pkg / "b.py").write_text("def resolve(x):\n    return x\nresolve(1)\n")  # another resolve: not counted
    assert _location_calls(pkg) == {"io/store.py": 1, "a.py": 4, "c.py": 2}
