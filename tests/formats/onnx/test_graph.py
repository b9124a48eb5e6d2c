"""The ONNX graph view in torchless's graph IR: structure checked by Graph.lint, one IR
node per ONNX node, subgraphs with captured outer values."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

import torchless
from torchless.cli.main import main
from torchless.core.errors import FormatError

from .conftest import NAMES, fixture_path


def _count_ops(g):
    c = Counter()
    for n in g.node:
        if n.op_type != "Constant":
            c[f"onnx.{n.op_type}"] += 1
    return c


@pytest.mark.parametrize("name", NAMES)
def test_graph_matches_model(onnx, name):
    m = onnx.load(fixture_path(name), load_external_data=False)
    with torchless.open(fixture_path(name)) as art:
        g = art.graph()
        tensors = dict(art.tensors())
    g.lint()
    calls = Counter(str(n.target) for n in g.nodes if n.op == "call_function")
    assert calls == _count_ops(m.graph)
    inits = {t.name for t in m.graph.initializer}
    assert [n.meta["onnx_name"] for n in g.placeholders] == [v.name for v in m.graph.input if v.name not in inits]
    attrs = [n.target for n in g.nodes if n.op == "get_attr" and n.target in g.attributes]
    assert set(attrs) == inits | {n.output[0] for n in m.graph.node if n.op_type == "Constant"}
    for t in attrs:  # the attributes are the artifact's lazy tensors
        assert g.attributes[t] is tensors[t]
    assert len(g.output_node.args[0]) == len(m.graph.output)
    code = g.python_code()
    assert "def forward(self" in code


def test_cond_subgraphs_capture_outer_values(onnx):
    with torchless.open(fixture_path("cond")) as art:
        g = art.graph()
    g.lint()
    (if_node,) = [n for n in g.nodes if n.target == "onnx.If"]
    then_attr = if_node.kwargs["then_branch"]
    assert then_attr.op == "get_attr"
    sub = g.subgraphs[then_attr.target]
    captured = [n.meta["onnx_name"] for n in sub.placeholders if n.meta.get("captured")]
    assert "a.weight" in captured and sub.meta["captured"] == captured
    assert [p for p, _ in g.walk()] == ["", "node_cond__0.then_branch", "node_cond__0.else_branch"]


def test_loop_scan_multi_output(onnx, tmp_path):
    from onnx import TensorProto, helper

    sbody = helper.make_graph(
        [helper.make_node("Add", ["s", "e"], ["s2"]), helper.make_node("Mul", ["s2", "k"], ["o"])],
        "scan_body",
        [helper.make_tensor_value_info("s", TensorProto.FLOAT, [2]), helper.make_tensor_value_info("e", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("s2", TensorProto.FLOAT, [2]), helper.make_tensor_value_info("o", TensorProto.FLOAT, [2])],
    )
    g = helper.make_graph(
        [
            helper.make_node("Scan", ["x", "seq"], ["fin", "outs"], body=sbody, num_scan_inputs=1),
            helper.make_node("Identity", ["outs"], ["y"]),
        ],
        "main",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2]),
            helper.make_tensor_value_info("seq", TensorProto.FLOAT, ["T", 2]),
        ],
        [
            helper.make_tensor_value_info("fin", TensorProto.FLOAT, [2]),
            helper.make_tensor_value_info("y", TensorProto.FLOAT, ["T", 2]),
        ],
        initializer=[onnx.numpy_helper.from_array(np.array([2.0, 3.0], np.float32), "k")],
    )
    p = tmp_path / "scan.onnx"
    p.write_bytes(helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)]).SerializeToString())
    with torchless.open(p) as art:
        gr = art.graph()
    gr.lint()
    getitems = [n for n in gr.nodes if str(n.target) == "_operator.getitem"]
    assert [(n.name, n.args[1]) for n in getitems] == [("fin", 0), ("outs", 1)]
    assert str(gr.placeholders[1].meta["val"]) == "float32[T, 2]"
    sub = gr.subgraphs["Scan_0.body"]
    assert [n.meta.get("captured", False) for n in sub.placeholders] == [False, False, True]
    # a node that reads an undefined value is a format error
    bad = helper.make_graph([helper.make_node("Relu", ["nowhere"], ["z"])], "g", [], [helper.make_tensor_value_info("z", 1, [1])])
    (tmp_path / "bad.onnx").write_bytes(helper.make_model(bad).SerializeToString())
    with torchless.open(tmp_path / "bad.onnx") as art, pytest.raises(FormatError, match="nowhere"):
        art.graph()


def test_graph_cli(onnx, capsys):
    assert main(["onnx", "graph", fixture_path("mlp_ext")]) == 0
    out = capsys.readouterr().out
    assert "onnx.Gemm(x, l1_weight, l1_bias" in out
    assert main(["onnx", "graph", fixture_path("cond"), "--table"]) == 0
    out = capsys.readouterr().out
    assert "# node_cond__0.then_branch" in out and "onnx.If" in out
