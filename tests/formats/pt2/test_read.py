"""Differential tests: torchless's reading of .pt2 archives against torch.export.load."""

from __future__ import annotations

import math

import numpy as np
import pytest
from tl_testutil import assert_tensor_matches

from torchless.core.dtypes import DType
from torchless.formats.pt2 import read_pt2
from torchless.graph.ir import Node, OpRef, SymValue, TensorValue

from .conftest import CASES, VARIANTS

pytestmark = pytest.mark.differential


def _torch_target(t):
    import torch

    if isinstance(t, str):
        return t
    if isinstance(t, torch._ops.OpOverload):
        return str(t)
    if isinstance(t, torch._ops.HigherOrderOperator):
        return f"higher_order.{t.name()}"
    return f"{t.__module__}.{t.__name__}"


def _norm_torch(v):
    import torch

    if isinstance(v, torch.fx.Node):
        return ("node", v.name)
    if isinstance(v, (list, tuple)):
        return type(v)(_norm_torch(x) for x in v)
    if isinstance(v, dict):
        return {k: _norm_torch(x) for k, x in v.items()}
    if isinstance(v, (torch.dtype, torch.device, torch.memory_format, torch.layout)):
        return str(v)
    if isinstance(v, torch._ops.OpOverload):
        return str(v)
    return v


def _norm_tl(v):
    if isinstance(v, Node):
        return ("node", v.name)
    if isinstance(v, (list, tuple)):
        return type(v)(_norm_tl(x) for x in v)
    if isinstance(v, dict):
        return {k: _norm_tl(x) for k, x in v.items()}
    if isinstance(v, DType):
        return v.torch_name
    if isinstance(v, OpRef):
        return v.key
    if type(v).__name__ == "Device":
        return str(v)
    if type(v).__name__ in ("Layout", "MemoryFormat"):
        return repr(v)
    return v


def _val_torch(v):
    import torch

    if isinstance(v, torch.Tensor):
        return ("tensor", str(v.dtype), [str(s) for s in v.shape], [str(s) for s in v.stride()], str(v.device))
    if isinstance(v, (torch.SymInt, torch.SymBool, torch.SymFloat)):
        return ("sym", str(v))
    if isinstance(v, (list, tuple)):
        return [_val_torch(x) for x in v]
    return v


def _val_tl(v):
    if isinstance(v, TensorValue):
        return ("tensor", v.dtype.torch_name, [str(s) for s in v.shape], [str(s) for s in v.stride], v.device)
    if isinstance(v, SymValue):
        return ("sym", str(v))
    if isinstance(v, (list, tuple)):
        return [_val_tl(x) for x in v]
    return v


def _compare_graphs(tg, g, gm, where):
    tnodes = list(tg.nodes)
    assert [n.name for n in g.nodes] == [n.name for n in tnodes], where
    for tn, n in zip(tnodes, g.nodes, strict=False):
        at = f"{where}:{n.name}"
        assert n.op == tn.op, at
        assert str(n.target) == _torch_target(tn.target), at
        assert _norm_tl(n.args) == _norm_torch(tn.args), at
        assert _norm_tl(n.kwargs) == _norm_torch(tn.kwargs), at
        for key in ("stack_trace", "nn_module_stack", "torch_fn"):
            # torch fills an absent nn_module_stack with {} inside subgraphs
            assert (n.meta.get(key) or None) == (tn.meta.get(key) or None), f"{at} meta {key}"
        if n.op != "output":
            assert _val_tl(n.meta.get("val")) == _val_torch(tn.meta.get("val")), f"{at} val"
    for name, sub in g.subgraphs.items():
        tsub = getattr(gm, name)
        _compare_graphs(tsub.graph, sub, tsub, f"{where}.{name}")


@pytest.mark.parametrize("case", VARIANTS)
def test_graph_matches_torch(case, pt2_files, torch_loaded):
    ep = torch_loaded(case)
    with read_pt2(pt2_files[case]) as arc:
        prog = arc.program
        prog.graph.lint()
        _compare_graphs(ep.graph, prog.graph, ep.graph_module, case)
        assert prog.dialect == ("ATEN" if case.endswith("_dec") else "TRAINING")


@pytest.mark.parametrize("case", VARIANTS)
def test_code_matches_graph_module_code(case, pt2_files, torch_loaded):
    ep = torch_loaded(case)
    with read_pt2(pt2_files[case]) as arc:
        g = arc.program.graph
        assert g.python_code() == ep.graph_module.code
        for name, sub in g.subgraphs.items():
            assert sub.python_code() == getattr(ep.graph_module, name).code


@pytest.mark.parametrize("case", VARIANTS)
def test_signature_matches_torch(case, pt2_files, torch_loaded):
    ep = torch_loaded(case)
    with read_pt2(pt2_files[case]) as arc:
        sig = arc.program.signature
        tin = [(s.kind.name, s.arg.name, s.target, s.persistent) for s in ep.graph_signature.input_specs]
        assert [(s.kind, s.arg, s.target, s.persistent) for s in sig.input_specs] == tin
        tout = [(s.kind.name, s.arg.name, s.target) for s in ep.graph_signature.output_specs]
        assert [(s.kind, s.arg, s.target) for s in sig.output_specs] == tout
        assert [e.fqn for e in arc.program.module_call_graph] == [e.fqn for e in ep.module_call_graph]


@pytest.mark.parametrize("case", VARIANTS)
def test_weights_bit_exact(case, pt2_files, torch_loaded):
    ep = torch_loaded(case)
    with read_pt2(pt2_files[case]) as arc:
        prog = arc.program
        assert list(prog.state_dict) == list(ep.state_dict)
        for k, t in ep.state_dict.items():
            assert_tensor_matches(prog.state_dict[k], t)
            assert prog.state_dict[k].is_parameter == isinstance(t, torch_param_type())
        assert sorted(prog.constants) == sorted(ep.constants)
        for k, t in ep.constants.items():
            assert_tensor_matches(prog.constants[k], t)


def torch_param_type():
    import torch

    return torch.nn.Parameter


def test_tied_weights_share_storage(pt2_files, torch_loaded):
    with read_pt2(pt2_files["tied"]) as arc:
        sd = arc.program.state_dict
        assert sd["emb.weight"].storage is sd["out.weight"].storage
        assert (
            arc.program.weights_config.config["emb.weight"].path_name == arc.program.weights_config.config["out.weight"].path_name
        )


@pytest.mark.parametrize("case", ["dynamic", "cond", "dynamic_dec", "cond_dec"])
def test_range_constraints_and_dynamic_dims(case, pt2_files, torch_loaded):
    ep = torch_loaded(case)
    with read_pt2(pt2_files[case]) as arc:
        prog = arc.program
        want = {}
        for sym, vr in ep.range_constraints.items():
            lo = None if not math.isfinite(float(vr.lower)) and "oo" in str(vr.lower) else int(vr.lower)
            hi = None if "oo" in str(vr.upper) else int(vr.upper)
            want[str(sym)] = (lo, hi)
        assert prog.range_constraints == want
        dims = prog.dynamic_dims()
        assert dims and all(d["symbols"][0] in want for d in dims)


@pytest.mark.parametrize("case", CASES)
def test_sample_inputs(case, pt2_files, torch_loaded):
    ep = torch_loaded(case)
    with read_pt2(pt2_files[case]) as arc:
        args, kwargs = arc.program.sample_inputs
        targs, tkwargs = ep.example_inputs
        assert len(args) == len(targs) and kwargs == {} == tkwargs
        for a, b in zip(args, targs, strict=False):
            np.testing.assert_array_equal(a.numpy(), b.numpy())
        assert arc.extra_files == {"note.txt": f"case {case}"}


def test_buffer_mutation_signature(pt2_files):
    # training IR keeps the in-place add_; the inference IR functionalizes it into an output
    with read_pt2(pt2_files["mutate"]) as arc:
        assert arc.program.signature.mutations == []
        assert "aten.add_.Tensor" in arc.program.op_histogram()
    with read_pt2(pt2_files["mutate_dec"]) as arc:
        muts = arc.program.signature.mutations
        assert [(m.kind, m.target) for m in muts] == [("BUFFER_MUTATION", "count")]
