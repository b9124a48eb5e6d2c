"""The viewer's graph data next to Netron (issue 36 item 12), from the command line as a
user types it (``torchless view FILE --json``):

* ONNX nodes under the names the file spells (``l1.weight``, ``/l1/Gemm_output_0``), for
  both of torch's exporters: the oracle is the onnx package's reading of the file;
* parameters, buffers and initializers marked to fold (``fold``, ``ref``), per torch's
  own export signature;
* TorchScript methods as operator graphs: the operators, attribute reads and submodule
  calls of each method against torch's own graph of it (``torch.jit.load(...).graph``);
* the Python source of a torch.package archive in the Code tab, byte for byte;
* code that does not parse, or nests too deeply, gives a note, never an error.
"""

from __future__ import annotations

import json
import warnings
import zipfile
from collections import Counter
from pathlib import Path

import pytest

from torchless.cli.main import main as cli_main
from torchless.view.tsgraph import MAX_NODES, method_graph

from .conftest import SAMPLES


def view_json(path: Path, capsys) -> dict:
    assert cli_main(["view", str(path), "--json", "--no-scan"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("dynamo", [False, True], ids=["torchscript-exporter", "dynamo-exporter"])
def test_onnx_nodes_keep_the_files_names(tmp_path, capsys, dynamo):
    """The TorchScript exporter run here; the dynamo exporter's file is samples/mlp.onnx
    (samples/gen_onnx.py: a minute of export is not worth a test run)."""
    onnx = pytest.importorskip("onnx", reason="the onnx package reads the names back")
    if dynamo:
        path = SAMPLES / "mlp.onnx"
        m = onnx.load(str(path))
        assert {"0.weight", "0.bias", "3.weight"} <= {t.name for t in m.graph.initializer}
        _check_names(m, view_json(path, capsys))
        return
    torch = pytest.importorskip("torch", reason="the model is exported by torch.onnx")

    class M(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.l1 = torch.nn.Linear(4, 8)
            self.l2 = torch.nn.Linear(8, 2)

        def forward(self, x):
            return self.l2(torch.relu(self.l1(x)))

    path = tmp_path / "m.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(M(), (torch.randn(3, 4),), str(path), dynamo=False)
    capsys.readouterr()
    m = onnx.load(str(path))
    assert {"l1.weight", "l1.bias", "l2.weight", "l2.bias"} <= {t.name for t in m.graph.initializer}  # what torch writes
    _check_names(m, view_json(path, capsys))


def _check_names(m, model: dict) -> None:
    inits = [t.name for t in m.graph.initializer]
    values = {o for n in m.graph.node for o in n.output} | {i.name for i in m.graph.input}
    g = model["artifacts"][0]["graphs"][0]
    names = [n["name"] for n in g["nodes"]]
    assert set(inits) <= set(names) and values <= set(names)
    for n in g["nodes"]:
        if n["name"] in inits:
            assert n["fold"] == "initializer" and n["ref"] == n["name"]
        else:
            assert "fold" not in n


def test_pt2_state_inputs_are_marked_to_fold(cond_pt2, capsys):
    torch = pytest.importorskip("torch", reason="torch's export signature is the oracle")
    ep = torch.export.load(str(cond_pt2))
    kinds = {"PARAMETER": "parameter", "BUFFER": "buffer"}
    want = {s.arg.name: (kinds[s.kind.name], s.target) for s in ep.graph_signature.input_specs if s.kind.name in kinds}
    g = view_json(cond_pt2, capsys)["artifacts"][0]["graphs"][0]
    got = {n["name"]: (n["fold"], n["ref"]) for n in g["nodes"] if "fold" in n}
    assert got == want and want


def _torch_kinds(graph) -> Counter:
    """torch's graph of one method: aten operators, attribute reads, method calls."""
    out: Counter = Counter()
    for n in graph.nodes():
        k = n.kind()
        aten = k.startswith("aten::") and k != "aten::__getitem__"
        if aten or k in ("prim::GetAttr", "prim::CallMethod", "prim::ListConstruct"):
            out[k] += 1
    return out


def _our_kinds(g: dict) -> Counter:
    out: Counter = Counter()
    for n in g["nodes"]:
        if n["op"] == "get_attr":
            out["prim::GetAttr"] += 1
        elif n["op"] == "call_module":
            out["prim::CallMethod"] += 1
        elif n["target"] == "prim.ListConstruct":
            out["prim::ListConstruct"] += 1
        elif n["op"] == "call_function" and n["target"].startswith("torch."):
            out["aten::" + n["target"][len("torch.") :]] += 1
    return out


def test_torchscript_methods_as_operator_graphs(capsys):
    torch = pytest.importorskip("torch", reason="torch's graph of each method is the oracle")
    path = SAMPLES / "scripted_module.pt"
    model = view_json(path, capsys)["artifacts"][0]
    by_title = {g["title"]: g for g in model["graphs"][1:]}
    jm = torch.jit.load(str(path))
    checked = 0
    for mpath, sub in jm.named_modules():
        title = f"{mpath}.forward" if mpath else "forward"
        if not hasattr(sub, "forward") or not hasattr(sub.forward, "graph"):
            continue
        if title not in by_title:  # modules of one class share the first one's graphs
            continue
        g = by_title[title]
        assert _our_kinds(g) == _torch_kinds(sub.forward.graph), title
        # edges: a submodule call reads its module and the value torch passes it
        ins = {n["name"]: set() for n in g["nodes"]}
        for a, b, _label in g["edges"]:
            ins[g["nodes"][b]["name"]].add(g["nodes"][a]["name"])
        checked += 1
    assert checked == 3  # forward, embed.forward (Dense: embed, blocks.*.lin, head), blocks.0.forward
    root = by_title["forward"]
    ins = {n["name"]: set() for n in root["nodes"]}
    for a, b, _label in root["edges"]:
        ins[root["nodes"][b]["name"]].add(root["nodes"][a]["name"])
    assert ins["h0"] == {"_0", "h"} and ins["h"] == {"embed", "x"}  # h0 = (_0).forward(h)
    kinds = {n["name"]: n.get("fold") for n in by_title["embed.forward"]["nodes"]}
    assert kinds["weight"] == kinds["bias"] == "parameter"


def test_package_sources_in_the_code_tab(tmp_path, capsys):
    torch = pytest.importorskip("torch", reason="the archive is written by torch.package")
    text = 'def scale(x, k: float = 2.0):\n    """twice"""\n    return x * k  # done\n'
    path = tmp_path / "p.pt"
    with torch.package.PackageExporter(str(path)) as exp:
        exp.save_source_string("mypkg.model", text)
        exp.save_text("res", "note.txt", "hello")
    code = view_json(path, capsys)["artifacts"][0]["code"]
    with zipfile.ZipFile(path) as z:
        rec = next(n for n in z.namelist() if n.endswith("mypkg/model.py"))
        assert code["mypkg.model"] == z.read(rec).decode() == text


def test_method_graph_of_bad_code_is_a_note():
    kw = {"params": set(), "buffers": set(), "modules": set()}
    assert method_graph("def f(:\n", **kw)["note"].startswith("the code does not parse")
    assert method_graph("x = 1\n", **kw)["note"] == "no def in the code"
    deep = "def f(x):\n  return " + "(" * 5000 + "x" + ")" * 5000 + "\n"
    assert method_graph(deep, **kw)["note"]  # too deep for the parser or the walk: a note
    long = "def f(x):\n" + "".join("  x = torch.relu(x)\n" for _ in range(MAX_NODES + 10))
    g = method_graph(long, **kw)
    assert g["note"] == f"cut at {MAX_NODES} nodes" and len(g["nodes"]) == MAX_NODES
    # branches and loops: their bodies in groups, the condition a node
    code = (
        "def f(self, x, n: int):\n  if n > 0:\n    y = torch.neg(x)\n  else:\n    y = x\n"
        "  for i in range(n):\n    y = torch.add(y, i)\n  return y\n"
    )
    g = method_graph(code, **kw)
    groups = {n["name"]: n["group"] for n in g["nodes"]}
    assert groups["y"] == ["if 2"] and groups["y.1"] == ["loop 6"] and "if2" in groups and "loop6" in groups
