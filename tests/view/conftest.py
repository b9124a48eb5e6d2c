"""Artifacts for the viewer's tests, built once per session, and the headless Chromium.

The browser is Debian's ``chromium`` package driven by Playwright (``executable_path``;
never ``playwright install``). Browser tests skip, with the reason, only where that
browser or Playwright is absent.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest

SAMPLES = Path(__file__).resolve().parents[2] / "samples"
CHROMIUM = os.environ.get("TORCHLESS_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]

#: what a successful script injection would do; the tests read it back
XSS_NAMES = [
    "<script>window.__xss = 1</script>",
    '<img src=x onerror="window.__xss = 2">',
    "javascript:window.__xss = 3",
    'a.<svg onload="window.__xss = 4">.weight',
]


@pytest.fixture(scope="session")
def view_files(tmp_path_factory) -> dict[str, Path]:
    """kind -> path: a .pt checkpoint, a .pt2 with cond (torch.export), an ONNX model, a
    TorchScript module, two checkpoints to diff (``diff_a``/``diff_b``), and hostile
    files whose names and doc strings carry script payloads (``xss_pt``, ``xss_onnx``)."""
    import torchless

    out = tmp_path_factory.mktemp("view")
    files: dict[str, Path] = {}
    for kind, name in (("pt", "checkpoint.pt"), ("onnx", "mlp.onnx"), ("torchscript", "scripted_module.pt")):
        shutil.copy(SAMPLES / name, out / name)
        files[kind] = out / name
    rng = np.random.default_rng(0)
    a = {
        "enc.layer0.weight": rng.standard_normal((16, 8)).astype(np.float32),
        "enc.layer0.bias": rng.standard_normal(16).astype(np.float32),
        "enc.layer1.weight": rng.standard_normal((4, 16)).astype(np.float32),
        "head.weight": rng.standard_normal((3, 4)).astype(np.float32),
        "old.only": np.arange(5, dtype=np.int64),
    }
    b = dict(a)
    b["enc.layer0.weight"] = a["enc.layer0.weight"] + np.float32(0.5)
    b["head.weight"] = a["head.weight"] * np.float32(2)
    del b["old.only"]
    b["new.only"] = np.ones(3, dtype=np.float16)
    files["diff_a"], files["diff_b"] = out / "a.safetensors", out / "b.safetensors"
    torchless.write_tensors(a.items(), files["diff_a"])
    torchless.write_tensors(b.items(), files["diff_b"])
    xss = {n: np.full((2, 2), i, dtype=np.float32) for i, n in enumerate(XSS_NAMES)}
    files["xss_pt"] = out / "xss.pt"
    torchless.save(xss, files["xss_pt"])
    files["xss_onnx"] = _xss_onnx(out / "xss.onnx")
    return files


def _xss_onnx(path: Path) -> Path:
    onnx = pytest.importorskip("onnx", reason="the hostile ONNX model is built with the onnx package")
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.ones((2, 2), dtype=np.float32), name=XSS_NAMES[0])
    node = helper.make_node(
        "MatMul", ["x", XSS_NAMES[0]], ["y"], name="/blk<script>window.__xss=5</script>/MatMul", doc_string=XSS_NAMES[1]
    )
    node2 = helper.make_node("Relu", ["y"], ["z"], name=XSS_NAMES[2], doc_string="<b onmouseover=alert(1)>bold</b>")
    g = helper.make_graph(
        [node, node2],
        "<iframe src=javascript:alert(1)>",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [2, 2])],
        [w],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], doc_string=XSS_NAMES[3])
    onnx.save(m, str(path))
    return path


@pytest.fixture(scope="session")
def cond_pt2(tmp_path_factory) -> Path:
    """A .pt2 whose graph has a ``torch.cond`` (two subgraphs) and nn_module_stack groups."""
    torch = pytest.importorskip("torch", reason="the .pt2 with cond is exported by torch")
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 4)
            self.norm = nn.LayerNorm(4)

        def forward(self, x):
            return self.norm(torch.relu(self.lin(x)))

    class Cond(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.enc = nn.Sequential(Block(), Block())
            self.lin = nn.Linear(4, 4)

        def forward(self, x, y):
            h = self.enc(x)
            return torch.cond(h.sum() > 0, lambda a, b: self.lin(a) + b, lambda a, b: a - b, (h, y))

    ep = torch.export.export(Cond(), (torch.randn(3, 4), torch.randn(3, 4)))
    path = tmp_path_factory.mktemp("pt2") / "cond.pt2"
    torch.export.save(ep, str(path))
    return path


@pytest.fixture(scope="session")
def browser():
    """A headless Chromium (Debian's package) under Playwright, one per session."""
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"no Chromium at {CHROMIUM} (Debian: apt-get install chromium; scripts/setup.sh installs it)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="the browser tests drive Chromium with playwright")
    pw = sync_api.sync_playwright().start()
    try:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
    except BaseException:
        pw.stop()
        raise
    yield b
    b.close()
    pw.stop()
