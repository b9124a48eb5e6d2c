"""Differential tests: torchless's view of TorchScript archives against torch.jit.load."""

from __future__ import annotations

import numpy as np
import pytest
from tl_testutil import assert_tensor_matches

import torchless
from torchless.formats.torchscript.handler import TorchScriptArtifact
from torchless.formats.torchscript.read import ScriptObject

from .conftest import as_torch_param

ALL = ["scripted", "traced", "quantized", "lite", "lite_const"] + [
    f"{b}_v{v}" for b in ("lite", "lite_const") for v in (4, 5, 6, 7)
]


def _sub(root, dotted):
    for p in [x for x in dotted.split(".") if x]:
        root = root.attrs[p]
    return root


@pytest.mark.parametrize("name", ALL)
def test_state_dict_identical(ts_files, torch, name):
    path = ts_files[name]
    assert torchless.detect(path) == "torchscript"
    ref = torch.jit.load(path).state_dict(keep_vars=True)
    with torchless.open(path) as art:
        sd = dict(art.tensors())
        assert list(sd) == list(ref)
        for k, t in sd.items():
            assert_tensor_matches(t, as_torch_param(t, ref[k]))
        # torchless.load gives the explorable module tree with the same state_dict
    root = torchless.load(path)
    assert isinstance(root, ScriptObject)
    assert list(root.state_dict()) == list(ref)


@pytest.mark.parametrize("name", ["scripted", "quantized", "lite", "lite_v4", "lite_const_v5"])
def test_method_sources_identical(ts_files, torch, name):
    path = ts_files[name]
    loaded = torch.jit.load(path)
    checked = 0
    with torchless.open(path) as art:
        for mname, mod in loaded.named_modules():
            obj = _sub(art.module, mname)
            assert obj.qualified_name == mod._c._type().qualified_name()
            for meth in obj.methods:
                assert obj.method_source(meth).code == getattr(mod, meth).code, (mname, meth)
                checked += 1
            if "forward" in obj.methods:
                assert obj.code == mod.code
    assert checked >= 3


def test_traced_sources_as_saved(ts_files, torch):
    """Traced modules: the archive holds what the traced module printed at save time."""
    import os

    saved = torch.load(os.path.join(os.path.dirname(ts_files["traced"]), "traced_code.pt"))
    with torchless.open(ts_files["traced"]) as art:
        for mname, code in saved.items():
            assert _sub(art.module, mname).code == code, mname


def test_module_tree_and_attributes(ts_files, torch):
    path = ts_files["scripted"]
    loaded = torch.jit.load(path)
    root = torchless.load(path)
    assert root.qualified_name == loaded._c._type().qualified_name() and root.qualified_name.endswith(".Big")
    assert root.is_module and root.sub.is_module
    assert [n for n, _ in root.named_children()] == [n for n, _ in loaded.named_children()]
    assert [n for n, _ in root.named_modules()] == [n for n, _ in loaded.named_modules()]
    assert [n for n, _ in root.named_parameters()] == [n for n, _ in loaded.named_parameters()]
    assert [n for n, _ in root.named_buffers()] == [n for n, _ in loaded.named_buffers()]
    # the aliased parameter is one tensor object under two names, as in torch
    assert root.shared is root.sub.lin.weight
    # non-parameter tensors, containers, typed lists and scalars
    for attr in ("t", "u16", "u32", "f8"):
        assert_tensor_matches(getattr(root, attr), getattr(loaded, attr))
    for i in range(2):
        assert_tensor_matches(root.tl[i], loaded.tl[i])
    assert_tensor_matches(root.td["a"], loaded.td["a"])
    assert_tensor_matches(root.tt[0], loaded.tt[0]) and root.tt[1] == 3
    assert root.il == [1, 2, 3] and root.fl == [1.5, 2.5] and root.bl == [True, False]
    assert root.sl == ["a", "b"] and root.dil == {1: [2, 3]} and root.opt is None
    assert root.scale == 2.5 and root.name == "hello" and root.training is loaded.training
    assert root.sub.nobias.bias is None
    assert root.u16.numpy().tolist() == [1, 2, 60000]
    assert root.sub.b16.numpy().astype(np.float32).tolist() == [1.5, -2.0, 3.25, 0.0]
    assert root.methods == ["forward", "helper", "other"]
    cs = root.class_source
    assert cs.buffers == ["buf", "i8", "flags", "cplx", "strided", "tmp"] and cs.parameters == ["p64", "shared"]


def test_quantized_packed_params(ts_files, torch):
    path = ts_files["quantized"]
    loaded = torch.jit.load(path)
    w, b = loaded.q._packed_params._weight_bias()
    with torchless.open(path) as art:  # values are read while it is open: close() releases the file
        assert list(art.tensors()) == []  # torch's state_dict is empty too
        allt = dict(art.all_tensors())
        packed = art.module.q._packed_params._packed_params
        assert packed.qualified_name == "__torch__.torch.classes.quantized.LinearPackedParamsBase"
        qw, qb = packed.state
        assert qw.dtype.name == "qint8" and qw.quantizer["qscheme"] == "per_tensor_affine"
        np.testing.assert_array_equal(qw.numpy(), w.int_repr().numpy())
        np.testing.assert_array_equal(qw.dequantize(), w.dequantize().numpy())
        np.testing.assert_array_equal(qb.numpy(), b.detach().numpy())
    assert len(allt) == 2


def test_constants_and_extra(ts_files, torch):
    path = ts_files["traced"]
    loaded = torch.jit.load(path)
    with torchless.open(path) as art:
        consts = art.archive.constants
        assert isinstance(consts, tuple) and len(consts) >= 1
        assert "CONSTANTS.c0" in dict(art.all_tensors())
        assert "CONSTANTS.c0" in loaded.code
        ti = art.archive.traced_inputs()
        assert list(ti) == ["forward"] and ti["forward"][0].shape == (2, 3)
    extra = {"meta.json": "", "notes.txt": ""}
    torch.jit.load(ts_files["scripted"], _extra_files=extra)
    with torchless.open(ts_files["scripted"]) as art:
        a = art.archive
        assert sorted(a.extra) == sorted(extra)
        for k, v in extra.items():
            assert a.extra_file(k) == (v.encode() if isinstance(v, str) else v)
        assert a.file_format_version is not None and a.records["byteorder"] == "little"


def test_debug_pkl_as_data(ts_files):
    with torchless.open(ts_files["scripted"]) as art:
        from torchless.formats.torchscript.spec import code_record_for

        rec = code_record_for(art.module.qualified_name)[0]
        dbg = art.archive.debug_info(rec)
        assert dbg[0] == "FORMAT_WITH_STRING_TABLE"
        strings, ranges = dbg[1], dbg[2]
        assert all(isinstance(s, str) for s in strings)
        off, ((text_idx, file_idx, line), start, end), handle = ranges[1]
        assert isinstance(off, int) and all(isinstance(i, int) for i in text_idx) and isinstance(line, int)


def test_info_and_verify(ts_files):
    with torchless.open(ts_files["scripted"]) as art:
        info = art.info()
        assert info["format"] == "torchscript" and info["root_class"].endswith(".Big")
        assert info["tensors"] == 18 and info["extra_files"] == {"meta.json": 8, "notes.txt": 5}
        assert info["methods"][art.module.qualified_name] == ["forward", "helper", "other"]
        assert "torch.UInt16Storage" in info["torch_weights_only_would_refuse"]
        assert info["tree"]["sub"]["lin"]["parameters"]["weight"] == "float32[2, 3]"
        assert info["parameters"] > 0
        assert art.verify() == []
    with torchless.open(ts_files["lite"]) as art:
        info = art.info()
        assert info["bytecode_version"] == 8 and info["kind"].startswith("lite")


def test_pt_reader_still_refuses(ts_files):
    from torchless.core.errors import FormatError
    from torchless.formats.pt.read import read_checkpoint
    from torchless.io.source import open_source

    with pytest.raises(FormatError, match="TorchScript"):
        read_checkpoint(open_source(ts_files["scripted"]))


def test_artifact_indexing(ts_files):
    with TorchScriptArtifact(ts_files["scripted"]) as art:
        assert "sub.lin.weight" in art and art["sub.lin.weight"].shape == (2, 3)
        assert art.code(method="forward", module="sub").startswith("def forward(self,")
        assert "class Big(Module):" in art.code()
        q = art.module.qualified_name
        assert art.code(method=f"{q}.helper") == art.module.method_source("helper").code


def test_exotic_objects(ts_files, torch):
    path = ts_files["exotic"]
    loaded = torch.jit.load(path)
    with torchless.open(path) as art:
        root = art.module
        assert root.color.value == 2 and root.color.qualified_name.endswith(".Color")
        assert isinstance(root.pair, tuple) and root.pair[1] == 5
        assert_tensor_matches(root.pair[0], loaded.pair[0])
        assert root.h.n == 3 and not root.h.is_module
        assert_tensor_matches(root.h.t, loaded.h.t)
        assert root.s.is_module and isinstance(root.s.state, tuple)
        assert_tensor_matches(root.s.state[0], loaded.s.w)
        # torch runs WithState.__setstate__ (TorchScript); torchless does not: state_dict
        # has everything else, verify() says why s.w is missing, all_tensors() has it
        ref = loaded.state_dict()
        assert list(art.keys()) == [k for k in ref if not k.startswith("s.")]
        assert "s.__getstate__.0" in dict(art.all_tensors())
        assert [p.code for p in art.verify()] == ["setstate"]
        for mname, mod in loaded.named_modules():
            obj = _sub(root, mname)
            for meth in obj.methods:
                if not meth.startswith("__"):
                    assert obj.method_source(meth).code == getattr(mod, meth).code


def test_library_modules(torch, tmp_path):
    """torch.nn library modules: LSTM (flat weights), conv + batch norm, a transformer."""
    nn = torch.nn
    mods = {
        "lstm": torch.jit.script(nn.LSTM(4, 8, 2)),
        "conv": torch.jit.script(
            nn.Sequential(
                nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 2)
            )
        ),
        "tfm": torch.jit.script(
            nn.TransformerEncoder(nn.TransformerEncoderLayer(16, 2, 32, batch_first=True), 2, enable_nested_tensor=False)
        ),
    }
    for name, m in mods.items():
        path = str(tmp_path / f"{name}.pt")
        torch.jit.save(m, path)
        loaded = torch.jit.load(path)
        ref = loaded.state_dict(keep_vars=True)
        with torchless.open(path) as art:
            sd = dict(art.tensors())
            assert list(sd) == list(ref), name
            for k, t in sd.items():
                assert_tensor_matches(t, as_torch_param(t, ref[k]))
            assert art.verify() == []
            if name == "conv":  # simple forwards: torch's reprint equals the stored text
                for mname, mod in loaded.named_modules():
                    assert _sub(art.module, mname).code == mod.code
