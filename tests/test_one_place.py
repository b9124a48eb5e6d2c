"""Format facts live in one place: each format's ``spec`` module.

Every layout constant (magic numbers, record names, PT2 archive paths, DCP class names)
may appear as a literal in one module of ``src/`` only; everything else imports it. And
the scanner (``torchless.scan``) imports format *specs*, never format readers, so it
cannot re-learn (or run) a reader's rules.

The literals are found with :mod:`ast` (docstrings and comments are prose, not code).
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "torchless"
#: the conformance suite is a test oracle shipped in src/: it spells layouts on purpose,
#: independently of the specs it checks the handlers against
ORACLES = ("torchless/testing/",)

#: magic numbers: bytes constants that must not be spelled twice
MAGIC_BYTES = [
    b"PK\x03\x04",
    b"PK\x05\x06",
    b"PK\x01\x02",
    b"PK\x06\x06",
    b"PK\x06\x07",
    b"PK\x07\x08",
    b"PTMF",
    b"\x93NUMPY",
    b"PYTORCH1",
    b"ZF",
    b"\x1f\x8b",
    b"\xfd7zXZ",
    b"\x04\x22\x4d\x18",
    b"from _mock import MockedObject",
]
MAGIC_INTS = [0x1950A86A20F9469CFC6C, 1001]

#: record names and archive paths (unambiguous strings: checked wherever they appear)
RECORD_NAMES = [
    "data.pkl",
    "constants.pkl",
    "bytecode.pkl",
    "traced_inputs.pkl",
    ".data/version",
    ".format_version",
    ".storage_alignment",
    ".data/serialization_id",
    "extern_modules",
    "python_version",
    "joblib.numpy_pickle",
    ".metadata",
    "archive_format",
    "archive_version",
    "data/aotinductor/",
    "data/weights/",
    "data/constants/",
    "data/sample_inputs/",
    "xl_model_weights/",
    "serialized_exported_program.json",
    "__torchless_dtypes__.json",
    "_StorageInfo",
    "torch.distributed.checkpoint.metadata",
    "torch.distributed.checkpoint.filesystem",
    "code/",
    ".debug_pkl",
    "_compile_flags.json",
    "_linker_flags.json",
    "__metadata__",
    "DCP_SHARDING_INFO",
]

#: short names that are also ordinary words (a JSON key ``"version"``, a label): counted
#: only where code uses them as a record name, i.e. in a tuple/list/set of names, in a
#: comparison, or as the first argument of a call (``lookup``, ``write``, ``get`` ...).
RECORD_WORDS = ["version", "byteorder"]

#: (module, word): uses of RECORD_WORDS that are not the record of that name
NOT_RECORDS = {
    ("torchless/cli/main.py", "version"): "argparse's action name",
    ("torchless/formats/torchscript/bytecode.py", "version"): "the name of a bytecode tuple field in error messages",
    ("torchless/formats/dcp/spec.py", "version"): "a field of DCP's Metadata dataclass, not a zip record",
    ("torchless/formats/dcp/metadata.py", "version"): "a field of DCP's Metadata dataclass, not a zip record",
}

#: the legacy tar's member names (common words too): a collection of all three is the layout
TAR_MEMBERS = {"storages", "tensors", "pickle"}


def _modules() -> list[tuple[str, ast.Module]]:
    out = []
    for p in sorted(SRC.rglob("*.py")):
        rel = p.relative_to(SRC.parent).as_posix()
        if rel.startswith(ORACLES):
            continue
        out.append((rel, ast.parse(p.read_text(encoding="utf-8"), filename=rel)))
    return out


def _docstrings(tree: ast.Module) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                ids.add(id(first.value))
    return ids


def _record_word_uses(tree: ast.Module) -> set[int]:
    """ids of string constants used the way a record name is used (``__slots__`` aside)."""
    ids: set[int] = set()
    slots = {
        id(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__slots__" for t in node.targets)
    }
    for node in ast.walk(tree):
        if id(node) in slots:
            continue
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            ids.update(id(e) for e in node.elts if isinstance(e, ast.Constant))
        elif isinstance(node, ast.Compare):
            ids.update(id(e) for e in [node.left, *node.comparators] if isinstance(e, ast.Constant))
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            ids.add(id(node.args[0]))
    return ids


def _literal_sites(modules: list[tuple[str, ast.Module]] | None = None) -> dict[object, set[str]]:
    """literal -> the modules spelling it."""
    wanted_bytes = set(MAGIC_BYTES)
    wanted_ints = set(MAGIC_INTS)
    wanted_str = set(RECORD_NAMES)
    words = set(RECORD_WORDS)
    sites: dict[object, set[str]] = defaultdict(set)
    for rel, tree in modules if modules is not None else _modules():
        docs = _docstrings(tree)
        record_uses = _record_word_uses(tree)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Constant) or id(node) in docs:
                continue
            v = node.value
            if isinstance(v, bytes):
                for m in wanted_bytes:
                    if v == m or (len(m) >= 4 and v.startswith(m)):
                        sites[m].add(rel)
                continue
            is_int = type(v) is int and v in wanted_ints
            is_name = isinstance(v, str) and (
                v in wanted_str or (v in words and id(node) in record_uses and (rel, v) not in NOT_RECORDS)
            )
            if is_int or is_name:
                sites[v].add(rel)
    return sites


def test_legacy_tar_member_names_spelled_once() -> None:
    where = set()
    for rel, tree in _modules():
        for node in ast.walk(tree):
            if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
                names = {e.value for e in node.elts if isinstance(e, ast.Constant)}
                if names >= TAR_MEMBERS:
                    where.add(rel)
    assert len(where) == 1, f"the legacy tar layout {sorted(TAR_MEMBERS)} is spelled in {sorted(where)}"


def test_the_checker_sees_a_second_spelling() -> None:
    fake = [
        (
            "torchless/formats/x/spec.py",
            ast.parse('"""doc: data.pkl"""\nMAGIC = b"PTMF"\nREC = "data.pkl"\nV = ("version", "x")\n'),
        ),
        ("torchless/scan/y.py", ast.parse('def f(h):\n    """data.pkl"""\n    return h[4:8] == b"PTMF" or h == "data.pkl"\n')),
        ("torchless/cli/z.py", ast.parse('D = {"version": 1}\nG = lookup("version")\n')),
    ]
    sites = _literal_sites(fake)
    assert sites[b"PTMF"] == {"torchless/formats/x/spec.py", "torchless/scan/y.py"}
    assert sites["data.pkl"] == {"torchless/formats/x/spec.py", "torchless/scan/y.py"}  # docstrings are prose
    assert sites["version"] == {"torchless/formats/x/spec.py", "torchless/cli/z.py"}  # a dict key is not a record use


def test_the_checker_finds_literals() -> None:
    # the check can fail: every listed magic and record name is spelled somewhere
    sites = _literal_sites()
    missing = [x for x in [*MAGIC_BYTES, *MAGIC_INTS, *RECORD_NAMES] if not sites.get(x)]
    assert not missing, f"not found anywhere in src/ (stale list?): {missing}"


@pytest.mark.parametrize("literal", [*MAGIC_BYTES, *MAGIC_INTS, *RECORD_NAMES, *RECORD_WORDS], ids=repr)
def test_layout_constant_spelled_once(literal: object) -> None:
    where = sorted(_SITES.get(literal, ()))
    assert len(where) <= 1, f"{literal!r} is spelled in {len(where)} modules: {where}; import it from the format's spec"


def test_each_constant_lives_in_a_spec_or_container_module() -> None:
    owners = {next(iter(v)) for k, v in _SITES.items() if len(v) == 1}
    allowed = ("/spec.py", "_spec.py", "torchless/container/zip.py", "torchless/core/npyheader.py", "dcp/constants.py")
    stray = sorted(o for o in owners if not o.endswith(allowed))
    # record words and readers' error labels may live elsewhere; magic bytes and record names may not
    strict = {k for k in [*MAGIC_BYTES, *MAGIC_INTS, *RECORD_NAMES]}
    stray_strict = sorted({next(iter(v)) for k, v in _SITES.items() if k in strict and len(v) == 1} & set(stray))
    assert not stray_strict, f"layout constants defined outside a spec module: {stray_strict}"


_SITES = _literal_sites()


# -- the scanner imports specs, not readers ---------------------------------------------


def _imports(rel: str, tree: ast.Module) -> list[tuple[str, list[str]]]:
    """``(absolute module, names imported from it)`` for every import anywhere in the
    file (function-local imports included); ``import a.b`` gives ``("a.b", [])``."""
    pkg = rel[: -len(".py")].replace("/", ".")
    if pkg.endswith(".__init__"):
        pkg = pkg[: -len(".__init__")]
    else:
        pkg = pkg.rsplit(".", 1)[0]
    out: list[tuple[str, list[str]]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, []) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out.append((mod, [a.name for a in node.names]))
    return out


def _is_spec(mod: str) -> bool:
    last = mod.rsplit(".", 1)[-1]
    return last == "spec" or last.endswith("_spec")


def test_scanner_imports_format_specs_not_readers() -> None:
    bad = []
    specs = set()
    for rel, tree in _modules():
        if not rel.startswith("torchless/scan/"):
            continue
        for mod, names in _imports(rel, tree):
            if mod != "torchless.formats" and not mod.startswith("torchless.formats."):
                continue
            if _is_spec(mod):
                specs.add(mod)
            elif names and all(_is_spec(n) for n in names):  # ``from ...formats.pt import spec``
                specs.update(f"{mod}.{n}" for n in names)
            elif mod == "torchless.formats.registry" and names == ["readers_format"]:
                pass  # the one question asked of the readers: the name their sniffers give a file
            else:
                bad.append(f"{rel}: {mod} ({', '.join(names)})")
    assert not bad, "the scanner imports format modules that are not specs:\n" + "\n".join(sorted(bad))
    assert len(specs) >= 5, f"the scanner imports only {sorted(specs)}: the walk is broken"


def test_import_walk_resolves_relative_imports() -> None:
    tree = ast.parse("from ...formats.pt import spec\nfrom .common import x\ndef f():\n    from ...formats.dcp.read import y\n")
    got = dict(_imports("torchless/scan/carriers/zips.py", tree))
    assert got["torchless.formats.pt"] == ["spec"]
    assert got["torchless.scan.carriers.common"] == ["x"]
    assert got["torchless.formats.dcp.read"] == ["y"]  # found inside a function too


# -- sniffers run on any byte source, nested members included ------------------------------


def _torch():
    return pytest.importorskip("torch", reason="the oracle writers are torch's")


def _nested(data: bytes, name: str) -> bytes:
    """``data`` stored as a member of an outer zip, read back by Python's zipfile."""
    import io
    import zipfile

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("outer/" + name, data)
    with zipfile.ZipFile(io.BytesIO(buf.getvalue())) as z:
        return z.read("outer/" + name)


def _sniffed(data: bytes, name: str) -> list[str]:
    from torchless.formats import registry
    from torchless.formats.base import Probe

    p = Probe.of_source(data, name)
    return [h.name for h in registry.handlers() if h.sniff(p)]


def test_handlers_sniff_nested_members() -> None:
    import io

    import numpy as np

    torch = _torch()
    b = io.BytesIO()
    torch.save({"w": torch.arange(4.0)}, b)
    pt = b.getvalue()
    b = io.BytesIO()
    torch.save({"w": torch.arange(4.0)}, b, _use_new_zipfile_serialization=False)
    legacy = b.getvalue()
    b = io.BytesIO()
    torch.jit.save(torch.jit.script(torch.nn.Linear(2, 2)), b)
    ts = b.getvalue()
    b = io.BytesIO()
    np.save(b, np.arange(3))
    npy = b.getvalue()
    from safetensors.numpy import save as st_save

    st = st_save({"w": np.arange(3, dtype=np.float32)})
    for data, name, fmt in [
        (pt, "m.pt", "pt"),
        (legacy, "m.pt", "pt"),
        (ts, "m.pt", "torchscript"),
        (npy, "a.npy", "npz"),
        (st, "m.safetensors", "safetensors"),
    ]:
        got = _sniffed(_nested(data, name), name)
        assert got[:1] == [fmt], (name, fmt, got)


def test_specs_sniff_any_byte_source() -> None:
    import io

    from torchless.formats.pt import spec as pt_spec
    from torchless.formats.torchscript import spec as ts_spec
    from torchless.io.source import BytesSource

    torch = _torch()
    b = io.BytesIO()
    torch.save([1, 2], b, _use_new_zipfile_serialization=False)
    legacy = b.getvalue()
    assert pt_spec.is_legacy_stream(legacy)
    # the legacy magic really is what torch writes first
    import pickle

    assert pickle.loads(legacy) == pt_spec.LEGACY_MAGIC
    b = io.BytesIO()
    torch.save([1, 2], b)
    zipped = b.getvalue()
    assert zipped[:4] == pt_spec.ZIP_MAGIC and not pt_spec.is_legacy_stream(zipped)
    # a tar is recognised on a byte source as torch's tarfile.open call would
    import tarfile

    t = io.BytesIO()
    with tarfile.open(fileobj=t, mode="w", format=tarfile.USTAR_FORMAT) as tf:
        for n in pt_spec.LEGACY_TAR_MEMBERS:
            info = tarfile.TarInfo(n)
            info.size = 1
            tf.addfile(info, io.BytesIO(b"x"))
    assert pt_spec.opens_as_tar(BytesSource(t.getvalue())) and pt_spec.is_tar_header(t.getvalue()[:512])
    assert not pt_spec.opens_as_tar(BytesSource(zipped))
    b = io.BytesIO()
    torch.jit.save(torch.jit.script(torch.nn.Linear(2, 2)), b)
    import zipfile

    recs = [n.split("/", 1)[1] for n in zipfile.ZipFile(io.BytesIO(b.getvalue())).namelist()]
    assert ts_spec.is_torchscript_zip(recs) and ts_spec.may_be_torchscript(recs)
    assert not ts_spec.is_checkpoint_zip(recs)
    assert {ts_spec.classify_record(r) for r in recs} >= {"code", "pickle", "metadata"}


def test_the_version_lives_in_one_place():
    """pyproject.toml takes the version from core/version.py (setuptools reads the literal
    without importing the package); no second copy to drift."""
    import tomllib

    meta = tomllib.loads((SRC.parents[1] / "pyproject.toml").read_text(encoding="utf-8"))
    assert "version" not in meta["project"]
    assert "version" in meta["project"]["dynamic"]
    assert meta["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "torchless.core.version.__version__"}
