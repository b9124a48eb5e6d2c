"""Every aten overload the transformers zoo's programs record (scripts/interp_zoo_ops.json,
written by scripts/interp_zoo.py from real exports in both IRs) has a kernel or a justified
exception, and docs/interpreter.md's zoo sections are what that JSON gives (no torch needed)."""

from __future__ import annotations

import importlib.util
import json
import os

from torchless.interp.registry import supported

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _script():
    spec = importlib.util.spec_from_file_location("interp_zoo", os.path.join(ROOT, "scripts", "interp_zoo.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _data(mod):
    with open(mod.DATA, encoding="utf-8") as f:
        return json.load(f)


def test_every_zoo_overload_has_a_kernel_or_a_justified_exception():
    mod = _script()
    data = _data(mod)
    ovl = mod.zoo_overloads(data)
    assert len(ovl) > 100, "the zoo's programs record the overloads"
    kernels = supported()
    missing = {k: progs for k, progs in ovl.items() if k not in kernels and k not in mod.EXCEPTIONS}
    assert not missing, "zoo-emitted overloads without a kernel or a justified exception: " + ", ".join(
        f"{k} ({', '.join(v[:3])})" for k, v in missing.items()
    )
    for k, why in mod.EXCEPTIONS.items():
        assert k not in kernels, f"{k} has a kernel now: drop its exception"
        assert len(why) > 20, f"{k}: an exception says why"


def test_other_zoo_operators_have_kernels():
    """The Python-level, higher-order and custom operators of the zoo's programs too."""
    mod = _script()
    missing = [k for k in mod.other_ops(_data(mod)) if k not in supported()]
    assert not missing, missing


def test_docs_sections_are_current():
    mod = _script()
    data = _data(mod)
    with open(mod.DOC, encoding="utf-8") as f:
        doc = f.read()
    assert mod.splice(doc, mod.ZOO_MARKER, mod.ZOO_END, mod.render_zoo(data)) == doc, "run python scripts/interp_zoo.py --render"
    assert mod.splice(doc, mod.COV_MARKER, mod.COV_END, mod.render_coverage(data, supported())) == doc, (
        "run python scripts/interp_zoo.py --render"
    )


def test_json_covers_every_zoo_architecture_in_both_irs():
    import pytest

    pytest.importorskip("torch", reason="the zoo's catalogue imports torch")
    from . import zoo_hf

    mod = _script()
    names = {f"{a.name}/{ir}" for a in zoo_hf.ARCHS for ir in ("training", "aten")}
    assert set(_data(mod)["programs"]) == names, "the zoo changed: run python scripts/interp_zoo.py"
