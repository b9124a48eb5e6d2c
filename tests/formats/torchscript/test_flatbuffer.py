"""Flatbuffer mobile modules (PTMF): read against torch.jit.load, the lite interpreter and
the pickled .ptl of the same module; torch's own .ptl.ff test assets; hostile buffers."""

from __future__ import annotations

import glob
import json
import os
import random
import struct

import numpy as np
import pytest

import torchless
from torchless.core.errors import FormatError, TorchlessError
from torchless.core.tensor import Tensor
from torchless.formats.torchscript.flatbuffer import read_flatbuffer
from torchless.formats.torchscript.handler import FlatbufferArtifact
from torchless.formats.torchscript.read import ScriptObject

from .conftest import as_torch_param

FF = ("scripted", "traced", "quantized", "exotic")


def _torch_assets():
    try:
        import torch
    except ImportError:
        return []
    return sorted(glob.glob(os.path.join(os.path.dirname(torch.__file__), "bin", "upgrader_models", "*.ptl.ff")))


_KEEP: list = []


def _jit_state(torch, path):
    """torch.jit.load's state_dict; the module is kept alive: the tensors of a flatbuffer
    module alias its buffer, which torch frees with the module."""
    jm = torch.jit.load(path)
    _KEEP.append(jm)
    return jm.state_dict()


def _same(tl: Tensor, tt, torch) -> None:
    assert tl.dtype.name == str(tt.dtype).replace("torch.", "")
    assert list(tl.shape) == list(tt.shape) and tl.stride() == tt.stride()
    assert torch.equal(torchless.to_torch(tl), tt)


@pytest.mark.parametrize("name", ["scripted", "traced", "quantized"])
def test_tensors_bit_exact_against_jit_load(ts_files, torch, name):
    path = ts_files[f"ff_{name}"]
    ref = _jit_state(torch, path)
    with torchless.open(path) as art:
        assert isinstance(art, FlatbufferArtifact)
        sd = dict(art.tensors())
        assert list(sd) == list(ref)
        for k, t in sd.items():
            _same(t, as_torch_param(t, ref[k]).detach(), torch)
        info = art.info()
    assert info["container"] == "flatbuffer" and info["bytecode_version"] == 9


def test_module_values_match_jit_load(ts_files, torch):
    path = ts_files["ff_scripted"]
    jm = torch.jit.load(path)
    with torchless.open(path) as art:
        root = art.load()
        assert root.qualified_name == jm._c._type().qualified_name()
        for name, sub in jm.named_modules():
            mine = root
            for part in [p for p in name.split(".") if p]:
                mine = mine.attrs[part]
            assert mine.qualified_name == sub._c._type().qualified_name()
            for attr, _v in sub._c._type().attributes() if hasattr(sub._c._type(), "attributes") else []:
                assert attr in mine.attrs
        assert art.archive.extra_file("meta.json") == b'{"v": 2}'
        # jit_sources: the code torch.jit.load compiles
        assert "def forward" in art.code()


@pytest.mark.parametrize("name", FF)
def test_bytecode_equals_pickled_twin(ts_files, torch, name):
    """Instructions, operators, constants, types, schema: the same as the bytecode.pkl
    torch writes for the same module (that reader is tested against torch.jit.mobile)."""
    with torchless.open(ts_files[f"ff_{name}"]) as art, torchless.open(ts_files[f"ff_{name}_twin"]) as twin:
        fb = art.archive.bytecode()
        pk = {m.qualified_name: m for m in twin.archive.bytecode().methods}
        assert sorted(m.qualified_name for m in fb.methods) == sorted(pk)
        for m in fb.methods:
            p = pk[m.qualified_name]
            assert m.instructions == p.instructions and m.operators == p.operators
            assert m.types == p.types and m.register_size == p.register_size
            assert [(a.name, a.type) for a in m.arguments] == [(a.name, a.type) for a in p.arguments]
            assert [(a.name, a.type) for a in m.returns] == [(a.name, a.type) for a in p.returns]
            assert len(m.constants) == len(p.constants)
            for c, d in zip(m.constants, p.constants, strict=True):
                if isinstance(c, Tensor):
                    assert np.array_equal(c.numpy(), d.numpy()) and c.dtype is d.dtype
                elif isinstance(c, ScriptObject):  # an enum member: its class and value
                    assert (c.qualified_name, c.args) == (d.qualified_name, d.args)
                else:
                    assert type(c) is type(d) and c == d


@pytest.mark.parametrize("name", ["scripted", "traced", "quantized"])
def test_operators_against_lite_interpreter(ts_files, torch, name):
    from torch.jit.mobile import _export_operator_list, _load_for_lite_interpreter

    path = ts_files[f"ff_{name}"]
    info = torch.jit._serialization.get_flatbuffer_module_info(path)
    with torchless.open(path) as art:
        bc = art.archive.bytecode()
        assert bc.version == info["bytecode_version"] and art.archive.operator_version == info["operator_version"]
        nargs = {o.full_name: -1 if o.num_args is None else o.num_args for m in bc.methods for o in m.operators}
        assert nargs == info["opname_to_num_args"]
        assert {m.qualified_name for m in bc.methods} == info["function_names"]
    assert set(nargs) == set(_export_operator_list(_load_for_lite_interpreter(path)))


@pytest.mark.parametrize("path", _torch_assets(), ids=os.path.basename)
def test_torch_shipped_assets(torch, path):
    """torch's own .ptl.ff test assets (torch/bin/upgrader_models)."""
    info = torch.jit._serialization.get_flatbuffer_module_info(path)
    ref = _jit_state(torch, path)
    with torchless.open(path) as art:
        bc = art.archive.bytecode()
        assert {o.full_name: -1 if o.num_args is None else o.num_args for m in bc.methods for o in m.operators} == info[
            "opname_to_num_args"
        ]
        assert {m.qualified_name for m in bc.methods} == info["function_names"]
        assert list(dict(art.tensors())) == list(ref)
        assert not art.verify()


def test_cli_info_ls_convert(ts_files, torch, tmp_path, capsys):
    from torchless.cli.main import main

    path = ts_files["ff_scripted"]
    assert main(["info", "--json", path]) == 0
    assert json.loads(capsys.readouterr().out)["container"] == "flatbuffer"
    assert main(["ls", path]) == 0
    assert "sub.lin.weight" in capsys.readouterr().out
    dst = tmp_path / "w.safetensors"
    assert main(["convert", path, str(dst)]) == 0
    from safetensors import safe_open

    ref = _jit_state(torch, path)
    with safe_open(str(dst), framework="pt") as f:
        # tied weights (docs/hf.md): an exact alias is stored once, recorded in __metadata__
        aliases = {a: k for a, k in (f.metadata() or {}).items() if a in ref}
        assert aliases and set(f.keys()) | set(aliases) == set(ref) and not set(f.keys()) & set(aliases)
        for k in list(f.keys()):  # noqa: SIM118 (safe_open is not a dict)
            assert torch.equal(f.get_tensor(k), ref[k].detach().contiguous())
        for a, k in aliases.items():
            assert torch.equal(f.get_tensor(k), ref[a].detach().contiguous())


# -- hostile buffers -----------------------------------------------------------------------


def _parse_all(data: bytes) -> None:
    m = read_flatbuffer(data, "x.ff")
    for _, t in m.module.state_dict().items():
        t.numpy()
    m.bytecode()


def test_truncations_raise_format_errors(ts_files):
    data = open(ts_files["ff_traced"], "rb").read()
    for n in list(range(0, 64)) + list(range(64, len(data), max(1, len(data) // 300))):
        with pytest.raises(TorchlessError):
            _parse_all(data[:n])


def test_bit_flips_only_torchless_errors(ts_files):
    data = open(ts_files["ff_scripted"], "rb").read()
    rng = random.Random(14)
    for _ in range(400):
        b = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
        try:
            _parse_all(bytes(b))
        except TorchlessError:
            pass


def test_offset_out_of_range_names_offset(ts_files):
    data = bytearray(open(ts_files["ff_traced"], "rb").read())
    struct.pack_into("<I", data, 0, len(data) + 100)  # the root offset
    with pytest.raises(FormatError) as e:
        read_flatbuffer(bytes(data), "x.ff")
    assert e.value.offset == len(data) + 100 and "x.ff" in str(e.value)
    with pytest.raises(FormatError, match="identifier"):
        read_flatbuffer(b"\x08\x00\x00\x00XXXX" + bytes(16), "x.ff")


def test_self_referencing_value_refused(ts_files):
    """A list whose item is the list itself (an index cycle) is refused, not recursed."""
    from torchless.container.flatbuffer import FlatBuffer
    from torchless.formats.torchscript.spec import FB, FB_IVALUE

    data = bytearray(open(ts_files["ff_scripted"], "rb").read())
    fb = FlatBuffer(bytes(data))
    root = fb.root()
    start, n = root.vector_pos(FB.MODULE_IVALUES, 4)
    for i in range(n):
        iv = fb.table_at(fb.uoffset(start + 4 * i))
        kind, pos = iv.union(FB.IVALUE_TYPE)
        if kind == FB_IVALUE["List"]:
            lst = fb.table_at(pos)
            items = lst.vector_pos(FB.LIST_ITEMS, 4)
            if items and items[1]:
                struct.pack_into("<I", data, items[0], i)
                break
    else:
        pytest.skip("no non-empty list value in the fixture")
    from torchless.formats.torchscript.flatbuffer import _Decoder

    fb2 = FlatBuffer(bytes(data), "x.ff")
    with pytest.raises(FormatError, match="itself"):
        _Decoder(fb2, fb2.root()).value(i)


def test_edit_weights_loads_in_torch(ts_files, torch, tmp_path):
    from torchless.formats.torchscript.write import save_edited

    src = ts_files["ff_traced"]
    dst = tmp_path / "edited.ff"
    new = np.arange(9, dtype=np.float32).reshape(3, 3)
    res = save_edited(src, dst, tensors={"lin.weight": new})
    assert res["replaced"] == ["lin.weight"]
    ref = _jit_state(torch, str(dst))
    assert np.array_equal(ref["lin.weight"].numpy(), new)
    assert torch.equal(ref["lin.bias"], _jit_state(torch, src)["lin.bias"])
    with pytest.raises(TorchlessError, match="extra files"):
        save_edited(src, tmp_path / "x.ff", extra_files={"a": b"b"})
