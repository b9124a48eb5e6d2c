"""The viewer next to Netron (issue 36 item 12), in headless Chromium, each page written
as a user writes it (``torchless view FILE --html OUT.html``) and opened by its address:

* parameters and initializers drawn inside the boxes of the nodes using them, and as
  nodes of their own with the button or ``#graph&unfold``;
* edge labels that never overlap, on a graph where six edges enter one node;
* ONNX initializers under the file's own names (``0.weight``);
* highlighted code; ``#graph`` / ``#tensor=NAME`` / ``#node=NAME`` deep links;
* a 100,000-tensor file: only the rows in view are in the DOM, the last one is reached.

Expected values come from the onnx package, torch and the files' own tensor lists.
"""

from __future__ import annotations

import time
from pathlib import Path
from urllib.parse import quote

import numpy as np
import pytest

import torchless
from torchless.cli.main import main as cli_main

from .conftest import SAMPLES
from .test_view_browser import Page, _first_grouped_node

pytestmark = pytest.mark.usefixtures("browser")


def html(paths: list[Path], out: Path, *extra: str) -> str:
    assert cli_main(["view", *map(str, paths), "--html", str(out), *extra]) == 0
    return out.as_uri()


def fan_in_onnx(path: Path, k: int = 6) -> Path:
    """x -> k unary ops -> Concat and Sum: two nodes with k labelled edges coming in."""
    onnx = pytest.importorskip("onnx", reason="the fan-in model is built with the onnx package")
    from onnx import TensorProto, helper

    ops = ["Relu", "Neg", "Abs", "Sigmoid", "Tanh", "Exp", "Floor", "Ceil"][:k]
    nodes = [helper.make_node(op, ["x"], [f"r{i}"], name=f"/branch{i}/{op}") for i, op in enumerate(ops)]
    nodes.append(helper.make_node("Concat", [f"r{i}" for i in range(k)], ["cat"], name="/Concat", axis=1))
    nodes.append(helper.make_node("Sum", [f"r{i}" for i in range(k)], ["total"], name="/Sum"))
    vi = [helper.make_tensor_value_info(f"r{i}", TensorProto.FLOAT, [2, 3]) for i in range(k)]
    g = helper.make_graph(
        nodes,
        "fan_in",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [
            helper.make_tensor_value_info("cat", TensorProto.FLOAT, [2, 3 * k]),
            helper.make_tensor_value_info("total", TensorProto.FLOAT, [2, 3]),
        ],
        value_info=vi,
    )
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def test_parameters_fold_into_their_nodes(browser, tmp_path):
    onnx = pytest.importorskip("onnx", reason="the onnx package names what each node reads")
    path = SAMPLES / "mlp.onnx"
    m = onnx.load(str(path))
    inits = {t.name for t in m.graph.initializer}
    # initializer -> the name of the node box that reads it (its single output)
    users = {i: n.output[0] for n in m.graph.node for i in n.input if i in inits}
    url = html([path], tmp_path / "mlp.html", "--no-scan")
    p = Page(browser, url + "#graph", offline=True)
    try:
        p.page.wait_for_selector("svg [data-kind='node']")
        assert p.page.get_attribute("body", "data-tab") == "graph"
        folded = p.names("svg [data-kind='folded']")
        assert sorted(folded) == sorted(users)  # each once, under the file's names ("0.weight")
        for init, user in users.items():
            box = p.page.locator(f"svg [data-kind='node'][data-name='{user}'] [data-kind='folded'][data-name='{init}']")
            assert box.count() == 1 and init in box.text_content()
        assert not set(p.names("svg [data-kind='node']")) & inits  # no placeholder boxes
        p.page.click("[data-action='toggle-fold']")
        assert p.count("svg [data-kind='folded']") == 0
        assert set(p.names("svg [data-kind='node']")) >= inits
        # clicking a folded weight shows it in the panel
        p.page.click("[data-action='toggle-fold']")
        p.page.locator("svg [data-kind='folded'][data-name='0.weight']").click()
        assert p.page.locator(".panel .title").text_content() == "0.weight"
        assert not p.errors, p.errors
    finally:
        p.close()
    p = Page(browser, url + "#graph&unfold", offline=True)  # the URL option
    try:
        p.page.wait_for_selector("svg [data-kind='node']")
        assert p.count("svg [data-kind='folded']") == 0 and set(p.names("svg [data-kind='node']")) >= inits
        assert p.page.get_attribute("[data-action='toggle-fold']", "data-state") == "unfolded"
    finally:
        p.close()


def test_pt2_parameters_fold_with_state_dict_names(browser, cond_pt2, tmp_path):
    torch = pytest.importorskip("torch", reason="torch's signature says which inputs are parameters")
    ep = torch.export.load(str(cond_pt2))
    state = {s.arg.name: s.target for s in ep.graph_signature.input_specs if s.kind.name in ("PARAMETER", "BUFFER")}
    p = Page(browser, html([cond_pt2], tmp_path / "c.html", "--no-scan") + "#graph", offline=True)
    try:
        p.page.wait_for_selector("svg [data-kind='node']")
        p.page.click("[data-action='expand-all']")
        folded = p.names("svg [data-kind='folded']")
        assert sorted(set(folded)) == sorted(state)
        text = " ".join(p.page.locator("svg [data-kind='folded']").all_text_contents())
        assert all(t in text for t in state.values())  # "enc.0.lin.weight", not p_enc_0_lin_weight
        assert not p.errors, p.errors
    finally:
        p.close()


def _rects(p: Page) -> list[dict]:
    return p.page.locator("svg text.elabel").evaluate_all(
        "els => els.map(e => { const r = e.getBoundingClientRect(); "
        "return {x: r.x, y: r.y, w: r.width, h: r.height, hidden: e.getAttribute('display') === 'none', t: e.textContent}; })"
    )


def test_edge_labels_never_overlap_with_fan_in(browser, tmp_path):
    path = fan_in_onnx(tmp_path / "fan.onnx", k=6)
    p = Page(browser, html([path], tmp_path / "fan.html", "--no-scan") + "#graph", offline=True)
    try:
        p.page.wait_for_selector("svg text.elabel")
        for zoom in (False, True):
            if zoom:  # the same at another scale
                p.page.mouse.move(600, 400)
                p.page.mouse.wheel(0, -400)
            rects = _rects(p)
            assert len(rects) == 6 + 12 + 2 and not any(
                r["hidden"] for r in rects
            )  # out of x, 6 into each of two nodes, to the output
            for i, a in enumerate(rects):
                for b in rects[i + 1 :]:
                    overlap = min(a["x"] + a["w"], b["x"] + b["w"]) - max(a["x"], b["x"]) > 0.5 and (
                        min(a["y"] + a["h"], b["y"] + b["h"]) - max(a["y"], b["y"]) > 0.5
                    )
                    assert not overlap, (a, b)
        assert "float32" in rects[0]["t"]
        assert not p.errors, p.errors
    finally:
        p.close()


def test_code_is_highlighted(browser, tmp_path):
    from torchless.view.model import build

    path = SAMPLES / "scripted_module.pt"
    model, arts = build([path], scan=False)
    for a in arts:
        a.close()
    code = model["artifacts"][0]["code"]["code"]
    p = Page(browser, html([path], tmp_path / "ts.html", "--no-scan") + "#code", offline=True)
    try:
        pre = p.page.locator("pre.hl")
        assert pre.text_content() == code  # the text exactly, only coloured
        toks = {
            k: set(p.page.locator(f"pre.hl .tok-{k}").all_text_contents()) for k in ("kw", "def", "str", "ns", "type", "const")
        }
        assert {"def", "return"} <= toks["kw"] and "forward" in toks["def"] and '"0"' in toks["str"]
        assert "torch" in toks["ns"] and "Tensor" in toks["type"] and "self" in toks["const"]
        assert not p.errors, p.errors
    finally:
        p.close()


def test_deep_links(browser, cond_pt2, tmp_path):
    names = [n for n, _ in torchless.open(SAMPLES / "checkpoint.pt").tensors()]
    url = html([SAMPLES / "checkpoint.pt"], tmp_path / "ck.html", "--no-scan")
    p = Page(browser, url + "#tensor=" + quote(names[-1]), offline=True)
    try:
        p.page.wait_for_selector(".panel .title")
        assert p.page.locator(".panel .title").text_content() == names[-1]
        row = p.page.locator(f"[data-kind='tensor'][data-name='{names[-1]}']")
        assert "selected" in row.get_attribute("class") and row.is_visible()
        # the address follows the page, and another address moves it
        p.page.locator(f"[data-kind='tensor'][data-name='{names[0]}']").click()
        assert p.page.evaluate("location.hash") == "#tensor=" + quote(names[0])
        p.page.evaluate("location.hash = '#treemap'")
        p.page.wait_for_selector("body[data-tab='treemap']")
        assert not p.errors, p.errors
    finally:
        p.close()
    node = _first_grouped_node(cond_pt2)
    p = Page(browser, html([cond_pt2], tmp_path / "g.html", "--no-scan") + "#node=" + quote(node), offline=True)
    try:
        p.page.wait_for_selector(f"svg [data-kind='node'][data-name='{node}'].selected")
        assert p.page.get_attribute("body", "data-tab") == "graph"
        assert p.page.locator(".panel .title").text_content() == node
        box = p.page.locator(f"svg [data-kind='node'][data-name='{node}']").bounding_box()
        view = p.page.locator(".graph-canvas").bounding_box()
        assert box and view and view["x"] <= box["x"] and box["x"] + box["width"] <= view["x"] + view["width"]  # scrolled to
        assert view["y"] <= box["y"] and box["y"] + box["height"] <= view["y"] + view["height"]
        assert not p.errors, p.errors
    finally:
        p.close()


def test_hundred_thousand_tensors_open_at_once(browser, tmp_path):
    n = 100_000
    names = [f"model.layers.{i // 1000}.experts.{(i // 10) % 100}.w{i % 10}" for i in range(n)]
    path = tmp_path / "big.safetensors"
    torchless.write_tensors(((k, np.full(2, i, dtype=np.float32)) for i, k in enumerate(names)), path)
    url = html([path], tmp_path / "big.html")
    p = Page(browser, url, offline=True)  # waits for the page to be ready
    try:
        opened = p.page.evaluate("performance.now()")  # ms from navigation start: parse, tree, first rows
        t = time.perf_counter()
        p.page.click("[data-action='expand-all']")
        expand_ms = (time.perf_counter() - t) * 1000
        assert (
            int(p.page.get_attribute(".tree", "data-rows")) == n + 2 + 100 + 100 + 100 * 100
        )  # tensors; model, layers, 100 layers, their experts, 10,000 experts
        assert p.count(".tree .row") < 200  # only what is in view
        p.page.evaluate("(() => { const l = document.querySelector('.tree'); l.scrollTop = l.scrollHeight; })()")
        last = p.page.locator(f"[data-kind='tensor'][data-name='{names[-1]}']")
        last.wait_for(timeout=5000)
        assert last.is_visible() and p.count(".tree .row") < 200
        last.click()
        assert p.page.locator(".panel .title").text_content() == names[-1]
        mid = names[n // 2]
        p.page.evaluate(f"location.hash = '#tensor={quote(mid)}'")
        p.page.wait_for_selector(f"[data-kind='tensor'][data-name='{mid}'].selected")
        print(f"100,000 tensors: page ready {opened:.0f} ms after navigation start, expand all {expand_ms:.0f} ms")
        assert not p.errors, p.errors
    finally:
        p.close()
