"""Lite-interpreter bytecode (.ptl) at several bytecode versions, against torch.jit.mobile."""

from __future__ import annotations

import pytest

import torchless
from torchless.core.errors import FormatError, UnsupportedError
from torchless.core.tensor import Tensor
from torchless.formats.torchscript.bytecode import parse_bytecode

CASES = [("lite", 8), ("lite_const", 8)] + [(f"{b}_v{v}", v) for b in ("lite", "lite_const") for v in (4, 5, 6, 7)]


@pytest.mark.parametrize("name,version", CASES)
def test_bytecode_matches_mobile(ts_files, torch, name, version):
    from torch.jit.mobile import _export_operator_list, _get_model_bytecode_version, _load_for_lite_interpreter

    path = ts_files[name]
    assert _get_model_bytecode_version(path) == version
    with torchless.open(path) as art:  # tensors are read while it is open: close() releases the file
        bc = art.archive.bytecode()
        assert bc.version == version and bc.supported_by_torch
        ops = {o.full_name for m in bc.methods for o in m.operators}
        assert ops == set(_export_operator_list(_load_for_lite_interpreter(path)))
        fwd = bc.method("forward")
        assert fwd.instructions[-1].op == "RET" and fwd.register_size > 0
        assert fwd.arguments[0].name == "self" and fwd.arguments[1].type == "Tensor"
        assert fwd.returns[0].type == "Tensor"
        if version >= 6:
            assert all(o.num_args is not None for o in fwd.operators)
        else:
            assert all(o.num_args is None for o in fwd.operators)
        if name.startswith("lite_const"):
            # the traced constant tensor lives in constants/ (bytecode/ before v5)
            tensors = [c for c in fwd.constants if isinstance(c, Tensor)]
            assert len(tensors) == 1 and tensors[0].numpy().tolist() == 2
            assert tensors[0].storage.origin.split("/", 1)[1].startswith("bytecode/" if version == 4 else "constants/")
        else:
            assert {m.qualified_name.rsplit(".", 1)[1] for m in bc.methods} >= {"forward", "helper", "other"}


def test_parse_bytecode_rejects_bad_structure():
    with pytest.raises(FormatError):
        parse_bytecode(("x",))
    with pytest.raises(FormatError):
        parse_bytecode((8, ("m", (("instructions", (("OP", "a", 0),)),))))
    with pytest.raises(UnsupportedError):
        parse_bytecode((2,))
    bc = parse_bytecode(
        (
            8,
            (
                "__torch__.M.f",
                (("instructions", (("RET", 0, 0),)), ("operators", ()), ("constants", ()), ("types", ()), ("register_size", 0)),
            ),
        )
    )
    assert bc.methods[0].arguments is None and bc.methods[0].instructions[0].op == "RET"
