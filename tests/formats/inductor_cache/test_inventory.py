"""Inventory of TorchInductor caches: a real CPU torch.compile cache (torch is the oracle)
and synthetic layouts for what this CPU-only machine cannot produce (Triton, autotune)."""

from __future__ import annotations

import base64
import hashlib
import importlib
import json
import os
import pickle
from pathlib import Path

import pytest

from torchless.cli.main import main
from torchless.core.errors import NotFoundError, UnsupportedError
from torchless.formats.inductor_cache.inventory import default_cache_dir, entry_source, inventory, resolve_cache_dir


def key(prefix: str, seed: str) -> str:
    """A cache-style hash: prefix + 51 lower-case base32 characters (cache_key.py)."""
    return prefix + base64.b32encode(hashlib.sha256(seed.encode()).digest()).decode()[:51].lower()


def disk_files(root: Path) -> set[str]:
    out = set()
    for dirpath, _dirs, files in os.walk(root):
        for f in files:
            out.add(os.path.relpath(os.path.join(dirpath, f), root).replace(os.sep, "/"))
    return out


def check_partition(inv, root: Path) -> None:  # type: ignore[no-untyped-def]
    """Every file on disk is in exactly one entry."""
    listed = [f.rel for e in inv.entries for f in e.files]
    assert len(listed) == len(set(listed))
    assert set(listed) == disk_files(root)


# -- a real cache -------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.differential
def test_real_cache_is_inventoried(cache_copy: Path) -> None:
    inv = inventory(cache_copy)
    check_partition(inv, cache_copy)
    files = disk_files(cache_copy)
    kinds = inv.by_kind()
    # independent expectations from the paths on disk (spec §2)
    assert kinds["fxgraph"]["files"] == len([f for f in files if f.startswith("fxgraph/")]) >= 1
    assert kinds["lock"]["files"] == len([f for f in files if f.startswith("locks/")]) >= 1
    aot = [f for f in files if f.startswith("aotautograd/")]
    assert kinds["aotautograd"]["files"] == len(aot) >= 1  # inference graphs are cached (gen_cache.py)
    for e in inv.entries:
        if e.kind == "aotautograd":  # aotautograd/<key>/<content hash> in torch 2.13
            assert e.key == e.id.split("/")[1]
            assert e.detail["object"].endswith("AOTAutogradResult")
    code = [f for f in files if len(f.split("/")) == 2 and len(f.split("/")[0]) == 2]
    stems = lambda exts: {f.split("/")[1][:52] for f in code if f.endswith(exts)}  # noqa: E731
    assert kinds["output_code"]["entries"] == len(stems(".py")) >= 1
    assert kinds["cpp_kernel"]["entries"] == len(stems((".cpp", ".so"))) >= 2
    assert sum(v["files"] for v in kinds.values()) == len(files)
    assert any(e.detail.get("isa_probe") for e in inv.entries if e.kind == "cpp_kernel")

    (fx,) = [e for e in inv.entries if e.kind == "fxgraph"]
    assert fx.detail["object"] == "torch._inductor.output_code.CompiledFxGraph"
    assert fx.detail["protocol"] >= 2
    assert "torch._inductor.output_code.CompiledFxGraph" in fx.detail["globals_not_allowlisted"]
    # the FX graph entry carries the output code torch also wrote as <xx>/<cache_key>.py
    (out,) = [e for e in inv.entries if e.kind == "output_code" and e.key == fx.detail["cache_key"]]
    _rel, src = entry_source(inv, fx.id)
    assert src == (cache_copy / out.files[0].rel).read_text()
    assert fx.detail["source_code_bytes"] == out.size
    rel, text = entry_source(inv, out.id)
    assert rel.endswith(".py") and text.startswith("# AOT ID:")
    kernel = next(e for e in inv.entries if e.kind == "cpp_kernel" and not e.detail.get("isa_probe"))
    rel, text = entry_source(inv, kernel.id)
    assert rel.endswith(".cpp") and 'extern "C"' in text
    with pytest.raises(UnsupportedError, match="binary"):
        entry_source(inv, next(f.rel for f in kernel.files if f.rel.endswith(".so")))


@pytest.mark.slow
@pytest.mark.differential
def test_real_cache_at_a_url_is_the_local_inventory(
    cache_copy: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cache torch.compile wrote, uploaded to memory://: the same entries, kinds,
    sizes, pickle summaries and shown sources as the local folder; the .so files are
    never fetched (docs/remote.md)."""
    fsspec = pytest.importorskip("fsspec", reason="URLs need the remote extra")
    from torchless.io import remote

    fs = fsspec.filesystem("memory")
    base = "/ic-" + hashlib.sha256(str(cache_copy).encode()).hexdigest()[:10]
    for f in disk_files(cache_copy):
        if not (cache_copy / f).is_symlink():
            fs.pipe(f"{base}/{f}", (cache_copy / f).read_bytes())
    url = f"memory://{base}"
    inv_mod = importlib.import_module("torchless.formats.inductor_cache.inventory")  # (the package attribute is the function)

    read, asked = inv_mod._read_url, []
    monkeypatch.setattr(inv_mod, "_read_url", lambda u, n: (asked.append(u), read(u, n))[1])
    try:

        def inv_json(path: str) -> dict:
            remote.STATS.reset()
            assert main(["cache", path, "--json"]) == 0
            d = json.loads(capsys.readouterr().out)
            d.pop("root")
            for it in d["items"]:
                it.pop("mtime"), it.pop("age_s")
            return d

        want = inv_json(str(cache_copy))
        got = inv_json(url)
        assert got == want and want["files"] == len(disk_files(cache_copy))
        assert 0 < remote.STATS.bytes_fetched < want["bytes"]
        assert asked and not [u for u in asked if u.endswith(".so")]  # no shared object was fetched
        fx = next(i["id"] for i in want["items"] if i["kind"] == "fxgraph")
        for ident in (fx, next(i["id"] for i in want["items"] if i["kind"] == "output_code")):
            assert main(["cache", str(cache_copy), "--show", ident]) == 0
            local = capsys.readouterr().out
            assert main(["cache", url, "--show", ident]) == 0
            assert capsys.readouterr().out == local
    finally:
        fs.rm(base, recursive=True)


@pytest.mark.slow
@pytest.mark.differential
def test_cli_inventory(cache_copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["cache", str(cache_copy), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["files"] == len(disk_files(cache_copy)) and d["root"] == str(cache_copy)
    assert main(["cache", str(cache_copy)]) == 0
    text = capsys.readouterr().out
    assert "fxgraph" in text and "CompiledFxGraph" in text
    assert main(["cache", str(cache_copy), "--kind", "lock", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert {i["kind"] for i in d["items"]} == {"lock"}
    out_id = next(
        i["id"]
        for i in json.loads((main(["cache", str(cache_copy), "--json"]), capsys.readouterr().out)[1])["items"]
        if i["kind"] == "output_code"
    )
    assert main(["cache", str(cache_copy), "--show", out_id]) == 0
    assert capsys.readouterr().out.startswith("# AOT ID:")
    assert main(["cache", str(cache_copy), "--show", "nope"]) == 2
    assert main(["cache", str(cache_copy), "--kind", "bogus"]) == 2


@pytest.mark.differential
def test_default_location_like_torch(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    pytest.importorskip("torch", reason="torch's cache_dir_utils is the oracle")
    from torch._inductor.runtime import cache_dir_utils

    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    assert default_cache_dir() == cache_dir_utils.default_cache_dir()
    assert resolve_cache_dir() == os.path.abspath(cache_dir_utils.default_cache_dir())
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "rel" / ".." / "c"))
    mine = resolve_cache_dir()
    assert mine == cache_dir_utils.cache_dir()  # torch also creates and exports it
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "")
    assert resolve_cache_dir() == cache_dir_utils.cache_dir() == str(tmp_path)


# -- synthetic layouts ----------------------------------------------------------------------------
def write(root: Path, rel: str, data: bytes | str) -> None:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data.encode() if isinstance(data, str) else data)


TRITON_PY = """
import triton
import triton.language as tl
from torch._inductor.runtime import triton_helpers

@triton_heuristics.pointwise(size_hints={'x': 16}, filename=__file__)
@triton.jit
def triton_poi_fused_add_0(in_ptr0, out_ptr0, xnumel, XBLOCK: tl.constexpr):
    xoffset = tl.program_id(0) * XBLOCK
"""


def synthetic_cache(root: Path) -> dict[str, str]:
    """A cache with the GPU-only and rarer layouts of spec §2 (this machine has no GPU, so
    Triton cannot produce them; names follow the spec and torch/triton's naming)."""
    tk, gk, ok = key("c", "triton"), key("c", "gpu"), key("c", "out")
    th = key("", "triton-cache")[:43].upper()  # Triton's own cache dirs are base32 too
    layout = {
        f"triton/0/{th}/triton_poi_fused_add_0.cubin": "triton_cache",
        f"triton/0/{th}/triton_poi_fused_add_0.ptx": "triton_cache",
        f"triton/0/{th}/triton_poi_fused_add_0.ttir": "triton_cache",
        f"triton/0/{th}/triton_poi_fused_add_0.ttgir": "triton_cache",
        f"triton/0/{th}/triton_poi_fused_add_0.llir": "triton_cache",
        f"triton/0/{th}/triton_poi_fused_add_0.json": "triton_cache",
        f"triton/0/{th}/__grp__triton_poi_fused_add_0.json": "triton_cache",
        f"{tk[1:3]}/{tk}.py": "triton_kernel",
        f"{tk[1:3]}/{tk}.best_config": "autotune",
        f"{gk[1:3]}/{gk}.cubin": "gpu_kernel",
        f"{gk[1:3]}/{gk}.json": "gpu_kernel",
        f"{ok[1:3]}/{ok}.py": "output_code",
        f"cache/{key('', 'system')}": "autotune",
        f"aotautograd/{key('a', 'aot')}/{key('', 'entry')}": "aotautograd",
        f"{key('c', 'aoti-dir')}/{key('c', 'w')}.wrapper.cpp": "aoti_build",
        f"{key('c', 'aoti-dir')}/{key('c', 'w')}.wrapper.so": "aoti_build",
        "dynamo/code_state_abc": "dynamo",
        "precompiled_headers/x.h.gch": "precompiled_header",
        "aoti_eager/aten/cpu/add.json": "aoti_eager",
        "gcc/tmp.o": "build_temp",
        "locks/x.lock": "lock",
        "notes.txt": "other",
    }
    for rel, kind in layout.items():
        if kind == "triton_kernel":
            write(root, rel, TRITON_PY)
        elif rel.endswith(".py"):
            write(
                root,
                rel,
                "# AOT ID: ['0_inference']\nfrom torch._inductor.runtime.triton_heuristics import grid\n"
                + '"""\n@triton.jit\n"""\n',
            )
        elif kind == "aotautograd":
            write(root, rel, pickle.dumps({"compiled_fw": "x", "source_code": "def f(): pass\n"}, protocol=4))
        elif rel.endswith((".ttir", ".ttgir", ".llir", ".ptx")):
            write(root, rel, "module {\n  tt.func public @triton_poi_fused_add_0() {\n  }\n}\n")
        elif rel.endswith((".json", ".best_config")) or rel.startswith("cache/"):
            write(root, rel, json.dumps({"num_warps": 4}))
        else:
            write(root, rel, b"\x00data")
    return layout


def test_synthetic_layouts_classified(tmp_path: Path) -> None:
    root = tmp_path / "c"
    layout = synthetic_cache(root)
    inv = inventory(root)
    check_partition(inv, root)
    got = {f.rel: e.kind for e in inv.entries for f in e.files}
    assert got == layout
    (tr,) = [e for e in inv.entries if e.kind == "triton_cache"]
    assert len(tr.files) == 7 and tr.detail["kernels"] == ["triton_poi_fused_add_0"]
    (ab,) = [e for e in inv.entries if e.kind == "aoti_build"]
    assert len(ab.files) == 2
    (aa,) = [e for e in inv.entries if e.kind == "aotautograd"]
    assert aa.detail["object"] == "dict" and aa.detail["globals"] == []
    assert entry_source(inv, aa.id)[1] == "def f(): pass\n"
    rel, text = entry_source(inv, tr.id)
    assert rel.endswith(".ttir")


def test_dangerous_pickle_is_described_not_run(tmp_path: Path) -> None:
    root = tmp_path / "c"
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):  # type: ignore[no-untyped-def]
            return (os.system, (f"touch {marker}",))

    fk = key("f", "evil")
    write(root, f"fxgraph/{fk[1:3]}/{fk}/{key('', 'e')}", pickle.dumps(Evil(), protocol=4))
    fk2 = key("f", "junk")
    write(root, f"fxgraph/{fk2[1:3]}/{fk2}/{key('', 'j')}", b"\x80\x04not a pickle")
    inv = inventory(root)
    ev, junk = sorted((e for e in inv.entries if e.kind == "fxgraph"), key=lambda e: e.key != fk)
    assert ev.detail["object"] == "posix.system"
    assert ev.detail["globals_not_allowlisted"] == ["posix.system"]
    assert "error" in junk.detail
    assert not marker.exists()
    with pytest.raises(UnsupportedError, match="no source"):
        entry_source(inv, ev.id)


def test_symlinks_listed_not_followed(tmp_path: Path) -> None:
    root = tmp_path / "c"
    root.mkdir()
    secret = tmp_path / "secret.txt"
    secret.write_text("secret")
    os.symlink(secret, root / "link.py")
    os.symlink(tmp_path, root / "dirlink")
    inv = inventory(root)
    kinds = {e.id: e.kind for e in inv.entries}
    assert kinds == {"link.py": "symlink", "dirlink": "symlink"}
    with pytest.raises(UnsupportedError, match="symbolic link"):
        entry_source(inv, "link.py")


def test_missing_and_bad_paths(tmp_path: Path) -> None:
    inv = inventory(tmp_path / "absent")
    assert not inv.exists and inv.entries == []
    (tmp_path / "f").write_text("x")
    assert main(["cache", str(tmp_path / "f")]) == 2
    with pytest.raises(NotFoundError):
        inventory(tmp_path).get("nothing/here")


def test_cli_uses_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "envcache"
    layout = synthetic_cache(root)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(root))
    assert main(["cache", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["root"] == str(root) and d["files"] == len(layout)
    assert main(["cache", "prune", "--max-size", "0"]) == 0  # dry run
    assert "dry run" in capsys.readouterr().out
    assert disk_files(root) == set(layout)
