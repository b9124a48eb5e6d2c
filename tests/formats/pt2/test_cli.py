"""CLI on .pt2: graph, info, convert; multi-model archives."""

from __future__ import annotations

import json

import numpy as np
import pytest

from torchless.cli.main import main
from torchless.formats.pt2 import read_pt2, save_pt2

pytestmark = pytest.mark.differential


def test_graph_command(pt2_files, torch_loaded, capsys):
    assert main(["graph", str(pt2_files["cond"])]) == 0
    out = capsys.readouterr().out
    ep = torch_loaded("cond")
    assert ep.graph_module.code.strip() in out
    assert "# true_graph_0" in out and "# false_graph_0" in out
    assert main(["graph", "--table", str(pt2_files["cond"])]) == 0
    assert "higher_order.cond" in capsys.readouterr().out
    assert main(["graph", "--model", "nope", str(pt2_files["cond"])]) == 2


def test_info_json(pt2_files, capsys):
    assert main(["info", "--json", str(pt2_files["dynamic"])]) == 0
    info = json.loads(capsys.readouterr().out)
    prog = info["programs"]["model"]
    assert info["format"] == "pt2" and prog["dialect"] == "TRAINING"
    assert {d["input"] for d in prog["dynamic_dims"]} == {"x", "y"}
    assert prog["ops"]["aten.linear.default"] == 1
    assert prog["signature"]["inputs"][0] == {"kind": "PARAMETER", "name": "p_lin_weight", "target": "lin.weight"}


def test_convert_to_safetensors(pt2_files, tmp_path, torch_loaded):
    from safetensors.numpy import load_file

    out = tmp_path / "w.safetensors"
    assert main(["convert", str(pt2_files["mlp"]), str(out)]) == 0
    got = load_file(out)
    ep = torch_loaded("mlp")
    for k, t in {**ep.state_dict, **ep.constants}.items():
        np.testing.assert_array_equal(got[k], t.detach().numpy())


def test_multi_model_archive(pt2_files, tmp_path):
    out = tmp_path / "two.pt2"
    a, b = read_pt2(pt2_files["mlp"]), read_pt2(pt2_files["cnn_dec"])
    save_pt2(out, {"first": a.program, "second": b.program})
    with read_pt2(out) as arc:
        assert list(arc.programs) == ["first", "second"]
        assert arc.programs["second"].graph.python_code() == b.program.graph.python_code()
        np.testing.assert_array_equal(
            arc.programs["first"].state_dict["l1.weight"].numpy(), a.program.state_dict["l1.weight"].numpy()
        )
    import torchless

    with torchless.open(out) as art:
        assert "first/l1.weight" in art and "second/conv.weight" in art
