"""The scanner's ONNX view: external-data locations that leave the model's folder.

Oracle: the real loaders' own path validation. Every model the scanner flags is one that
``onnx.load`` (and onnxruntime, when installed) refuses because of that path, and every
model they load is CLEAN; a model that does not parse is never CLEAN.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from torchless.scan import scan

onnx = pytest.importorskip("onnx", reason="the oracle: onnx writes the models and validates their paths")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402


def _model(tmp_path, name: str, location: str | None, *, in_subgraph: bool = False) -> str:
    """An MLP-like model whose weight lives in ``ext.data`` (saved by onnx), its location
    then rewritten to ``location``; with ``in_subgraph`` the external tensor is an
    attribute of a Constant node inside an If branch."""
    w = numpy_helper.from_array(np.arange(12, dtype=np.float32).reshape(3, 4), "w")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    if not in_subgraph:
        g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g", [x], [y], [w])
    else:
        branch = helper.make_graph(
            [helper.make_node("Constant", [], ["c"], value=w)],
            "b",
            [],
            [helper.make_tensor_value_info("c", TensorProto.FLOAT, [3, 4])],
        )
        cond = numpy_helper.from_array(np.array(True), "cond")
        g = helper.make_graph(
            [
                helper.make_node("If", ["cond"], ["wc"], then_branch=branch, else_branch=branch),
                helper.make_node("MatMul", ["x", "wc"], ["y"]),
            ],
            "g",
            [x],
            [y],
            [cond],
        )
    m = helper.make_model(g)
    path = tmp_path / f"{name}.onnx"
    onnx.save_model(m, path, save_as_external_data=True, location="ext.data", size_threshold=0)
    if location is not None:
        m = onnx.load(path, load_external_data=False)
        tensors = list(m.graph.initializer)
        for node in m.graph.node:
            for a in node.attribute:
                for sub in [a.g] if a.g.node else []:
                    for n in sub.node:
                        tensors += [b.t for b in n.attribute if b.t.external_data]
        for t in tensors:
            for e in t.external_data:
                if e.key == "location":
                    e.value = location
        onnx.save_model(m, path)
    return str(path)


def _loaders_refuse(path: str) -> bool:
    try:
        onnx.load(path)
    except Exception:
        refused = True
    else:
        refused = False
    try:
        import onnxruntime as ort
    except ImportError:
        return refused
    try:
        ort.InferenceSession(path)
    except Exception:
        return refused
    return False


def _verdict(path: str) -> tuple[str, list[str]]:
    rep = scan(path, jobs=1).files[0]
    return rep.verdict, [f.rule for f in rep.findings if f.severity != "info"]


@pytest.mark.parametrize("in_subgraph", [False, True], ids=["initializer", "subgraph-attribute"])
def test_onnx_external_data_escapes_are_flagged_exactly_where_the_loaders_refuse(tmp_path, in_subgraph):
    os.symlink("/etc/hostname", tmp_path / "link.data")
    cases = {
        "benign": None,
        "dotdot": "../../etc/hostname",
        "absolute": "/etc/hostname",
        "symlink": "link.data",
    }
    for name, location in cases.items():
        path = _model(tmp_path, name, location, in_subgraph=in_subgraph)
        verdict, rules = _verdict(path)
        refused = _loaders_refuse(path)
        if name == "benign":
            assert not refused and verdict == "clean" and rules == [], (name, verdict, rules)
        else:
            assert refused, f"{name}: the loaders accepted it; the case does not test what it claims"
            assert verdict == "suspicious" and rules == ["link-escape"], (name, verdict, rules)


def test_an_onnx_file_that_does_not_parse_is_never_clean(tmp_path):
    path = _model(tmp_path, "m", None)
    data = open(path, "rb").read()
    cut = tmp_path / "cut.onnx"
    cut.write_bytes(data[: len(data) // 2])
    from google.protobuf.message import DecodeError

    with pytest.raises(DecodeError):  # the real parser refuses it too
        onnx.load(str(cut))
    verdict, rules = _verdict(str(cut))
    assert verdict != "clean" and "unanalysable" in rules
