"""The ATen-IR verifier: accepts what torch accepts, flags hand-broken programs."""

from __future__ import annotations

from dataclasses import replace

import pytest

from torchless.formats.pt2 import InputSpec, OutputSpec, read_pt2
from torchless.graph.ir import OpRef
from torchless.graph.verifier import non_core_ops, verify_program

from .conftest import VARIANTS

pytestmark = pytest.mark.differential


def _errors(problems):
    return [p for p in problems if p.severity == "error"]


@pytest.mark.parametrize("case", VARIANTS)
def test_accepts_what_torch_accepts(case, pt2_files, torch_loaded):
    torch_loaded(case)  # torch.export.load ran torch's verifier on it
    with read_pt2(pt2_files[case]) as arc:
        assert _errors(verify_program(arc.program)) == []
        if case.endswith("_dec"):
            assert non_core_ops(arc.program.graph) == {}
            assert _errors(verify_program(arc.program, strict_core=True)) == []


def test_training_ir_names_non_core_ops(pt2_files):
    with read_pt2(pt2_files["mlp"]) as arc:
        probs = verify_program(arc.program)
        assert non_core_ops(arc.program.graph) == {"aten.linear.default": 2}
        assert {p.code for p in probs} == {"non-core-op"} and {p.severity for p in probs} == {"info"}


def _prog(pt2_files, case="mlp_dec"):
    return read_pt2(pt2_files[case]).program


def test_flags_non_core_op(pt2_files):
    prog = _prog(pt2_files)
    prog.graph.node("relu").target = OpRef("aten.hardswish.default")
    probs = verify_program(prog)
    assert [(p.code, p.severity, p.member) for p in probs] == [("non-core-op", "warning", "relu")]
    assert [p.code for p in _errors(verify_program(prog, strict_core=True))] == ["non-core-op"]


def test_flags_inplace_and_out_ops(pt2_files):
    prog = _prog(pt2_files)
    prog.graph.node("relu").target = OpRef("aten.relu_.default")
    assert [p.code for p in _errors(verify_program(prog))] == ["inplace-op"]
    prog.graph.node("relu").target = OpRef("aten.atan2.out")
    assert "out-variant" in [p.code for p in _errors(verify_program(prog))]


def test_flags_missing_metadata(pt2_files):
    prog = _prog(pt2_files)
    del prog.graph.node("addmm").meta["val"]
    del prog.graph.node("x").meta["val"]
    assert sorted(p.member for p in _errors(verify_program(prog)) if p.code == "missing-metadata") == ["addmm", "x"]


def test_flags_dangling_signature(pt2_files):
    prog = _prog(pt2_files)
    sig = prog.signature
    ins = list(sig.input_specs)
    ins[0] = InputSpec("PARAMETER", "p_gone", "gone.weight")
    prog.signature = replace(
        sig, input_specs=tuple(ins), output_specs=sig.output_specs + (OutputSpec("BUFFER_MUTATION", "nothing", "nobuf"),)
    )
    codes = [p.code for p in _errors(verify_program(prog))]
    assert codes.count("dangling-signature") >= 3 and "signature" in codes


def test_flags_bad_target_and_arguments(pt2_files):
    prog = _prog(pt2_files)
    prog.graph.node("relu").target = OpRef("builtins.eval")
    prog.graph.node("permute").kwargs = {"bogus": 1}
    codes = {p.code for p in _errors(verify_program(prog))}
    assert {"bad-target", "bad-arguments"} <= codes


def test_flags_call_module(pt2_files):
    prog = _prog(pt2_files)
    prog.graph.node("relu").op = "call_module"
    assert "bad-opcode" in [p.code for p in _errors(verify_program(prog))]


def test_cli_verify_exit_codes(pt2_files, tmp_path, capsys):
    from torchless.cli.main import main
    from torchless.formats.pt2 import save_pt2

    assert main(["verify", str(pt2_files["mlp_dec"])]) == 0
    prog = _prog(pt2_files)
    prog.graph.node("relu").target = OpRef("aten.relu_.default")
    bad = tmp_path / "bad.pt2"
    save_pt2(bad, prog)
    assert main(["verify", str(bad)]) == 1
    assert "inplace-op" in capsys.readouterr().out
