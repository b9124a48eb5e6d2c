"""No public function of ``src/torchless`` reads or drops options hidden in ``**kwargs``
(#13: unknown options are a UsageError everywhere, never swallowed). A ``**kwargs`` that is
only passed on (every use ``f(**kwargs)``) is fine: the callee's explicit signature refuses
an unknown keyword. Any other is listed in ``ALLOWED`` with its reason (format options
checked against the handler's declaration, a UsageError naming the accepted ones, and a
few APIs whose keywords are data). The interpreter's kernels take ATen operators'
arguments, not options. Private helpers (``_name``) are not part of the surface."""

from __future__ import annotations

import ast
import functools
import pathlib

import numpy as np
import pytest

SRC = pathlib.Path(__file__).resolve().parents[1] / "src" / "torchless"

_CHECKED = "format options, checked against the handler's declared options (UsageError naming the accepted ones)"
#: public functions that read their ``**kwargs`` themselves (a pure forwarder, every use
#: ``f(**kwargs)``, needs no entry: the callee's explicit signature refuses the unknown)
ALLOWED: dict[str, str] = {
    "_api.save": _CHECKED,
    "_api.convert": _CHECKED,
    "formats.base.FormatHandler.open": _CHECKED,
    "formats.dispatch.write_tensors": _CHECKED,
    "io.remote.accepts_storage_options.wrapper": "a decorator: takes storage_options, forwards the rest",
    "core.values.Namespace.__init__": "argparse.Namespace(**kwargs): the keywords are the object's attributes",
    "graph.ir.Graph.get_attr": "torch.fx's Graph API: a default node name, then create_node's explicit keywords",
    "graph.ir.Graph.output": "torch.fx's Graph API: a default node name, then create_node's explicit keywords",
    "formats.pt2.schema.Union.create": "a union's constructor: exactly one variant, by its field name (FormatError otherwise)",
    "interp.custom_ops.custom_op.register.run": (
        "a plugin kernel's calling convention: the node's keyword arguments, bound to the plugin's "
        "parameters by its schema (UnsupportedError otherwise)"
    ),
    "formats.pt2.run.ExportedModule.__call__": "the exported program's own keyword inputs (checked against its input spec)",
}

#: modules whose functions take an operator's arguments as a graph node gives them (ATen
#: schemas), not options: the interpreter's kernels
KERNEL_MODULES = ("interp.kernels.",)


def _only_forwards(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """True when ``fn`` only passes its ``**kwargs`` on (every use is ``f(**kwargs)``):
    then the callee's explicit signature refuses an unknown keyword. Reading, popping or
    ignoring them is the function's own handling, which needs an entry in ALLOWED."""
    kw = fn.args.kwarg
    assert kw is not None
    spread = [k.value for node in ast.walk(fn) if isinstance(node, ast.Call) for k in node.keywords if k.arg is None]
    forwarded = [v for v in spread if isinstance(v, ast.Name) and v.id == kw.arg]
    uses = [n for n in ast.walk(fn) if isinstance(n, ast.Name) and n.id == kw.arg]
    return bool(forwarded) and len(forwarded) == len(uses)


@functools.cache
def _kwargs_functions() -> dict[str, bool]:
    """Public functions taking ``**kwargs``: name -> whether they only forward them."""
    found: dict[str, bool] = {}
    for f in sorted(SRC.rglob("*.py")):
        mod = ".".join(f.relative_to(SRC).with_suffix("").parts).removesuffix(".__init__")

        def walk(node: ast.AST, prefix: str, hidden: bool) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                    name = f"{prefix}.{child.name}"
                    private = hidden or (child.name.startswith("_") and not child.name.endswith("__"))
                    if not isinstance(child, ast.ClassDef) and child.args.kwarg is not None and not private:
                        found[name] = _only_forwards(child)
                    walk(child, name, private)
                else:
                    walk(child, prefix, hidden)

        walk(ast.parse(f.read_text(encoding="utf-8")), mod, False)
    return found


def test_no_public_function_takes_unlisted_kwargs():
    found = [f for f, forwards in _kwargs_functions().items() if not forwards and not f.startswith(KERNEL_MODULES)]
    unlisted = sorted(set(found) - set(ALLOWED))
    assert not unlisted, f"public functions that read or drop their **kwargs (give them explicit keyword parameters): {unlisted}"


def test_the_allowlist_has_no_stale_entries():
    found = _kwargs_functions()
    stale = sorted(n for n in ALLOWED if found.get(n, True))
    assert not stale, f"ALLOWED names functions that no longer take **kwargs, or only forward them: {stale}"


def test_the_forwarder_rule_can_fail():
    def parse(src: str) -> ast.FunctionDef:
        fn = ast.parse(src).body[0]
        assert isinstance(fn, ast.FunctionDef)
        return fn

    assert _only_forwards(parse("def f(x, **kw):\n    return g(x, **kw)"))
    assert not _only_forwards(parse("def f(x, **_):\n    return g(x)"))  # swallowed
    assert not _only_forwards(parse("def f(x, **kw):\n    return g(x, kw.get('a'), **kw)"))  # read


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
