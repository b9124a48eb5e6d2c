"""`torchless view` on a 10,000-node graph: time to the first screen in headless Chromium.

The graph is synthetic, built as torchless's own graph IR (``torchless.graph.ir``) and
turned into the viewer's model by ``torchless.view.model.graph_entries``, as a ``.pt2``'s
graph is: ``LAYERS`` layers of ``NODES_PER_LAYER`` nodes, each node in a module
(``layers.<i>`` > ``layers.<i>.attn`` / ``layers.<i>.mlp`` through ``nn_module_stack``),
a chain through every node plus a skip edge per node. A second case drops the module
metadata (a flat graph: the viewer groups it in runs of 100 nodes).

Each round is a fresh process (bench/harness.py) that starts Debian's chromium (not
timed), opens the self-contained page at ``#graph`` and reports the milliseconds from
navigation start to the end of the first graph layout and drawing
(``window.__tlGraphRendered``), then the time to expand one module group.

Usage: ``python bench/bench_view.py [--rounds 5] [--nodes 10000]``
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "src"))

from harness import Harness  # noqa: E402

CHROMIUM = os.environ.get("TORCHLESS_CHROMIUM", "/usr/bin/chromium")

CHILD = r"""
from playwright.sync_api import sync_playwright
ARGV = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run"]
with sync_playwright() as pw:
    b = pw.chromium.launch(executable_path=ARGS[1], args=ARGV)
    page = b.new_page(viewport={"width": 1400, "height": 900})
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto("file://" + P + "#graph")
    page.wait_for_function("window.__tlGraphRendered !== undefined", timeout=120000)
    first = page.evaluate("window.__tlGraphRendered") / 1000
    boxes = page.locator("svg [data-kind='group'], svg [data-kind='node']").count()
    t0 = page.evaluate("performance.now()")
    page.locator("svg [data-kind='group'][data-state='collapsed']").first.click()
    page.wait_for_function("window.__tlGraphRendered > %f" % t0, timeout=120000)
    expand = (page.evaluate("window.__tlGraphRendered") - t0) / 1000
    b.close()
    assert not errors, errors
done(first, expand=expand, boxes=boxes)
"""


def synthetic_graph(nodes: int, grouped: bool):
    from torchless.core.dtypes import by_name
    from torchless.graph.ir import Graph, OpRef, TensorValue

    per_layer = 250
    g = Graph()
    f32 = by_name("float32")
    x = g.placeholder("x", meta={"val": TensorValue(f32, (8, 512), (512, 1))})
    prev, prev2 = x, x
    ops = [OpRef("aten.linear.default"), OpRef("aten.relu.default"), OpRef("aten.add.Tensor"), OpRef("aten.mul.Tensor")]
    for i in range(nodes - 2):
        layer, k = divmod(i, per_layer)
        sub = "attn" if k < per_layer // 2 else "mlp"
        meta: dict = {"val": TensorValue(f32, (8, 512), (512, 1)), "stack_trace": f'File "model.py", line {i}, in forward'}
        if grouped:
            meta["nn_module_stack"] = {
                "L__self__": ("", "Model"),
                f"L__self___layers_{layer}": (f"layers.{layer}", "Block"),
                f"L__self___layers_{layer}_{sub}": (f"layers.{layer}.{sub}", "Attention" if sub == "attn" else "MLP"),
            }
        op = ops[i % len(ops)]
        args = (prev, prev2) if op.key in ("aten.add.Tensor", "aten.mul.Tensor") else (prev,)
        n = g.call_function(op, args, meta=meta)
        prev2, prev = prev, n
    g.output((prev,))
    assert len(g.nodes) == nodes
    return g


def write_page(path: str, nodes: int, grouped: bool) -> None:
    from torchless.view.model import VERSION, graph_entries
    from torchless.view.page import page

    graphs = graph_entries(synthetic_graph(nodes, grouped), title="synthetic")
    art = {"name": f"synthetic {nodes} nodes", "format": "pt2", "tensors": [], "graphs": graphs, "code": {}, "notes": []}
    art.update(info={}, findings=None)
    doc, _ = page({"version": VERSION, "artifacts": [art], "diff": None}, {})
    with open(path, "w", encoding="utf-8") as f:
        f.write(doc)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--nodes", type=int, default=10_000)
    a = ap.parse_args()
    if not os.path.exists(CHROMIUM):
        sys.exit(f"no Chromium at {CHROMIUM}")
    with tempfile.TemporaryDirectory() as tmp:
        h = Harness(rounds=a.rounds, warmup=a.warmup)
        for grouped in (True, False):
            p = os.path.join(tmp, f"graph_{'grouped' if grouped else 'flat'}.html")
            write_page(p, a.nodes, grouped)
            print(f"{p}: {os.path.getsize(p) / 2**20:.1f} MiB", file=sys.stderr)
            h.case(f"first_screen_{'modules' if grouped else 'flat'}_{a.nodes}", CHILD, args=[p, CHROMIUM])
        h.run()
        print(h.markdown())
        for name, c in h.cases.items():
            ex = sorted(r["expand"] for r in c.results)[len(c.results) // 2]
            boxes = int(c.results[0]["boxes"])
            print(f"- {name}: first screen {h.median(name):.3f} s (goal < 3 s), {boxes} boxes; a group expanded in {ex:.3f} s")


if __name__ == "__main__":
    main()
