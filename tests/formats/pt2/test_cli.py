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


def test_set_weights_command(pt2_files, tmp_path, torch, capsys):
    """`torchless pt2 set-weights` as a user types it: torch.export.load of the output holds
    the new weights and runs as the source module does with them."""
    import warnings

    from safetensors.torch import save_file

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = torch.export.load(pt2_files["mlp_dec"])
    new = {k: (v.detach() * 2 + 1).contiguous() for k, v in ref.state_dict.items()}
    save_file({f"model.{k}": v for k, v in new.items()}, tmp_path / "w.safetensors")
    out = tmp_path / "new.pt2"
    argv = ["pt2", "set-weights", str(pt2_files["mlp_dec"]), str(tmp_path / "w.safetensors"), "-o", str(out)]
    assert main([*argv, "--strip-prefix", "model.", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert sorted(res["replaced"]) == sorted(new) and res["ignored"] == [] and res["program"] == "model"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ep = torch.export.load(out)
    for k, v in new.items():
        assert torch.equal(ep.state_dict[k], v), k
    m = ref.module()
    with torch.no_grad():
        for k, v in new.items():
            m.get_parameter(k).copy_(v) if k in dict(m.named_parameters()) else m.get_buffer(k).copy_(v)
    x = ref.example_inputs[0][0]
    assert torch.equal(ep.module()(x), m(x))
    # a weight that does not fit, and one that names nothing: exit 2, nothing written
    save_file({"l1.weight": torch.zeros(1)}, tmp_path / "bad.safetensors")
    assert main(["pt2", "set-weights", str(out), str(tmp_path / "bad.safetensors"), "-o", str(tmp_path / "x.pt2")]) == 2
    assert "does not fit" in capsys.readouterr().err and not (tmp_path / "x.pt2").exists()
    assert main([*argv]) == 2  # the output exists: refused, --force named
    assert "--force" in capsys.readouterr().err
    argv[-1] = str(tmp_path / "y.pt2")
    assert main([*argv]) == 2  # the prefix left on: no such tensors
    assert "--strip-prefix" in capsys.readouterr().err and not (tmp_path / "y.pt2").exists()
    # in place, with --force: the old archive is read in full before the replace
    assert (
        main(["pt2", "set-weights", str(out), str(tmp_path / "w.safetensors"), "-o", str(out), "--strip-prefix", "model."]) == 2
    )
    assert "--force" in capsys.readouterr().err
    save_file({k: v + 1 for k, v in new.items()}, tmp_path / "w2.safetensors")
    assert main(["pt2", "set-weights", str(out), str(tmp_path / "w2.safetensors"), "-o", str(out), "--force"]) == 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ep = torch.export.load(out)
    for k, v in new.items():
        assert torch.equal(ep.state_dict[k], v + 1), k


def test_set_weights_keeps_extra_files(pt2_files, tmp_path):
    import zipfile

    w, out = tmp_path / "w.safetensors", tmp_path / "o.pt2"
    assert main(["convert", str(pt2_files["mlp"]), str(w)]) == 0
    assert main(["pt2", "set-weights", str(pt2_files["mlp"]), str(w), "-o", str(out)]) == 0

    def extras(p):
        with zipfile.ZipFile(p) as z:
            return {i.filename.split("/", 1)[1]: z.read(i) for i in z.infolist() if "/extra/" in i.filename}

    assert extras(out) == extras(pt2_files["mlp"]) and extras(out)
