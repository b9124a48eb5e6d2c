"""No public function of ``src/torchless`` hides its options in ``**kwargs`` (#13: unknown
options are a UsageError everywhere, never swallowed). A ``**kwargs`` parameter is allowed
only in the places listed here, each with its reason: options checked against a format's
declaration (a UsageError naming the accepted ones), or a forwarder to an explicit
signature. Private helpers (``_name``) are not part of the surface."""

from __future__ import annotations

import ast
import functools
import pathlib

import numpy as np
import pytest

SRC = pathlib.Path(__file__).resolve().parents[1] / "src" / "torchless"

_CHECKED = "format options, checked against the handler's declared options (UsageError naming the accepted ones)"
_ERROR_FIELDS = "error fields (path, member, offset, expected, found...) forwarded to TorchlessError's keywords"
ALLOWED: dict[str, str] = {
    "_api.open": _CHECKED,
    "_api.load": _CHECKED,
    "_api.save": _CHECKED,
    "_api.write_tensors": _CHECKED,
    "_api.convert": _CHECKED,
    "formats.base.FormatHandler.open": _CHECKED,
    "formats.dispatch.open_artifact": _CHECKED,
    "formats.dispatch.write_tensors": _CHECKED,
    "core.errors.UnsafeGlobalError.__init__": _ERROR_FIELDS,
    "core.errors.InternalError.__init__": _ERROR_FIELDS,
    "core.errors.InternalError.wrap": _ERROR_FIELDS,
    "core.values.Namespace.__init__": "argparse.Namespace(**kwargs): the keywords are the object's attributes",
    "core.remote.accepts_storage_options.wrapper": "a decorator: forwards to the wrapped function's explicit signature",
    "scan.carriers.common.walks.deco.wrapper": "a decorator: forwards to the wrapped method's explicit signature",
    "graph.ir.Graph.placeholder": "torch.fx's Graph API: forwards to create_node's explicit keywords",
    "graph.ir.Graph.get_attr": "torch.fx's Graph API: forwards to create_node's explicit keywords",
    "graph.ir.Graph.call_function": "torch.fx's Graph API: forwards to create_node's explicit keywords",
    "graph.ir.Graph.output": "torch.fx's Graph API: forwards to create_node's explicit keywords",
    "pickle.machine.unpickle": "forwards to Unpickler's explicit keywords",
    "formats.pt2.schema.Union.create": "a union's constructor: exactly one variant, by its field name (FormatError otherwise)",
    "formats.pt2.read.Program.run": "the exported program's own keyword inputs (checked against its input spec)",
    "formats.pt2.run.ExportedModule.__call__": "the exported program's own keyword inputs (checked against its input spec)",
}

#: modules whose functions take an operator's arguments as a graph node gives them (ATen
#: schemas), not options: the interpreter's kernels
KERNEL_MODULES = ("interp.kernels.",)


@functools.cache
def _kwargs_functions() -> dict[str, int]:
    found: dict[str, int] = {}
    for f in sorted(SRC.rglob("*.py")):
        mod = ".".join(f.relative_to(SRC).with_suffix("").parts).removesuffix(".__init__")

        def walk(node: ast.AST, prefix: str, hidden: bool) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                    name = f"{prefix}.{child.name}"
                    private = hidden or (child.name.startswith("_") and not child.name.endswith("__"))
                    if not isinstance(child, ast.ClassDef) and child.args.kwarg is not None and not private:
                        found[name] = child.lineno
                    walk(child, name, private)
                else:
                    walk(child, prefix, hidden)

        walk(ast.parse(f.read_text(encoding="utf-8")), mod, False)
    return found


def test_no_public_function_takes_unlisted_kwargs():
    found = [f for f in _kwargs_functions() if not f.startswith(KERNEL_MODULES)]
    unlisted = sorted(set(found) - set(ALLOWED))
    assert not unlisted, f"public functions taking **kwargs (give them explicit keyword parameters): {unlisted}"


def test_the_allowlist_has_no_stale_entries():
    stale = sorted(set(ALLOWED) - set(_kwargs_functions()))
    assert not stale, f"ALLOWED names functions that no longer take **kwargs: {stale}"


# --- the pass-throughs that became explicit: options reach the writer, unknown ones are refused


@pytest.fixture(scope="module")
def dcp_dir(tmp_path_factory):
    import shutil

    p = tmp_path_factory.mktemp("dcp") / "ckpt"
    shutil.copytree(pathlib.Path(__file__).resolve().parents[1] / "samples" / "dcp_ckpt", p)
    return p


def test_consolidate_refuses_an_unknown_option_naming_the_accepted_ones(dcp_dir, tmp_path):
    from torchless import UsageError, dcp

    for dst, accepted in [("x.safetensors", "max_shard_size"), ("x.npz", "compress"), ("x.pt", "alignment")]:
        with pytest.raises(UsageError, match="unknown option 'bogus'") as e:
            dcp.consolidate(dcp_dir, tmp_path / dst, options={"bogus": 1})
        assert accepted in str(e.value)
        assert not (tmp_path / dst).exists()
    with pytest.raises(UsageError, match="max_shard_size"):
        dcp.consolidate(dcp_dir, tmp_path / "y.pt", max_shard_size="1MB")
    with pytest.raises(TypeError):
        dcp.consolidate(dcp_dir, tmp_path / "z.safetensors", bogus=1)  # an explicit signature


def test_consolidate_passes_the_writer_options(dcp_dir, tmp_path):
    import zipfile

    from torchless import dcp

    dcp.consolidate(dcp_dir, tmp_path / "c.npz", options={"compress": True})
    with zipfile.ZipFile(tmp_path / "c.npz") as z:
        assert {i.compress_type for i in z.infolist()} == {zipfile.ZIP_DEFLATED}
    dcp.consolidate(dcp_dir, tmp_path / "m.safetensors", options={"metadata": {"who": "test"}})
    from safetensors import safe_open

    with safe_open(str(tmp_path / "m.safetensors"), "np") as f:
        assert f.metadata()["who"] == "test"


def test_hf_convert_refuses_unknown_options(tmp_path):
    import torchless
    from torchless import UsageError

    src = tmp_path / "hf"
    src.mkdir()
    torchless.write_tensors([("a", np.arange(6, dtype=np.float32)), ("b", np.ones(3, np.float32))], src / "model.safetensors")
    (src / "config.json").write_text("{}")
    assert torchless.detect(src) == "hf"
    with pytest.raises(UsageError, match="unknown option 'metadata'") as e:
        torchless.convert(src, tmp_path / "out.safetensors.index.json", metadata={"x": "y"})  # a sharded set takes no metadata
    assert "max_shard_size" in str(e.value)
    res = torchless.convert(src, tmp_path / "out.npz", compress=True)
    assert res["tensors"] == 2
    with pytest.raises(UsageError, match="unknown option"):
        torchless.convert(src, tmp_path / "o.npz", bogus=1)
