"""The viewer in a real headless Chromium (Debian's package, driven by Playwright).

For a .pt checkpoint, a .pt2 with cond, an ONNX model, a TorchScript module and a diff:
the page loads without console errors, shows every tensor and every graph node (the DOM's
``data-kind="tensor"`` / ``data-kind="node"`` elements against torchless's own listing),
search finds a node, a collapsed module group expands, and the ``--html`` file renders
the same with the network off. Hostile names and doc strings render as text.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import torchless
from torchless.cli.main import main as cli_main
from torchless.diff import diff as diff_paths

from .conftest import XSS_NAMES

pytestmark = pytest.mark.usefixtures("browser")


def listing(path: Path) -> tuple[list[str], list[int]]:
    """torchless's own listing: tensor names, and the node count of each graph in order."""
    with torchless.open(path, weights_only=False) as art:
        names = [n for n, _ in art.tensors()]
        if art.format == "pt2":
            graphs = [len(g.nodes) for prog in art.programs.values() for _p, g in prog.graph.walk()]
        elif art.format == "onnx":
            graphs = [len(g.nodes) for _p, g in art.graph().walk()]
        elif art.format == "torchscript":
            # the module tree, then each method's operator graph (its nodes: test_view.py
            # checks them against torch's own graphs)
            from torchless.view.model import build

            model, arts = build([path], scan=False)
            for a in arts:
                a.close()
            graphs = [len(list(art.module.named_modules()))] + [len(g["nodes"]) for g in model["artifacts"][0]["graphs"][1:]]
        else:
            graphs = []
    return names, graphs


class Page:
    """A page with its console errors, page errors, dialogs and requests recorded."""

    def __init__(self, browser: Any, url: str, *, offline: bool = False) -> None:
        self.ctx = browser.new_context(viewport={"width": 1280, "height": 800}, offline=offline)
        self.page = self.ctx.new_page()
        self.page.set_default_timeout(10_000)
        self.errors: list[str] = []
        self.requests: list[str] = []
        self.dialogs: list[str] = []
        self.page.on("console", lambda m: self.errors.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(f"page error: {e}"))
        self.page.on("request", lambda r: self.requests.append(r.url))
        self.page.on("dialog", lambda d: (self.dialogs.append(d.message), d.dismiss()))
        self.page.add_init_script("window.__xss = undefined;")
        self.page.goto(url)
        self.page.wait_for_selector("body[data-ready='1']", timeout=10_000)

    def tab(self, name: str) -> None:
        self.page.click(f"nav.tabs button[data-tab='{name}']")

    def count(self, selector: str) -> int:
        return self.page.locator(selector).count()

    def names(self, selector: str) -> list[str]:
        return self.page.locator(selector).evaluate_all("els => els.map(e => e.getAttribute('data-name'))")

    def close(self) -> None:
        self.ctx.close()


def html_file(paths: list[Path], out: Path) -> str:
    assert cli_main(["view", *map(str, paths), "--html", str(out)]) == 0
    return out.as_uri()


def check_tensors(p: Page, names: list[str]) -> None:
    p.tab("tensors")
    p.page.click("[data-action='expand-all']")
    shown = p.names("[data-kind='tensor']")
    assert len(shown) == len(names) and sorted(shown) == sorted(names)


def check_graphs(p: Page, counts: list[int]) -> None:
    p.tab("graph")
    options = p.page.locator("select.graph-select option")
    assert options.count() == len(counts)
    for i, n in enumerate(counts):
        p.page.select_option("select.graph-select", str(i))
        p.page.click("[data-action='expand-all']")
        # every node: a box, or folded into the boxes of its users (parameters, constants)
        boxes, folded = p.names("svg [data-kind='node']"), set(p.names("svg [data-kind='folded']"))
        assert len(boxes) + len(folded) == n and not folded & set(boxes), f"graph {i}"
    p.page.select_option("select.graph-select", "0")


def check_search(p: Page, name: str) -> None:
    p.tab("graph")
    p.page.select_option("select.graph-select", "0")
    p.page.click("[data-action='collapse-all']")
    p.page.fill("input[aria-label='search nodes']", name)
    p.page.press("input[aria-label='search nodes']", "Enter")
    node = p.page.locator(f"svg [data-kind='node'][data-name='{name}']")
    assert node.count() == 1 and "selected" in (node.get_attribute("class") or "")
    assert name in p.page.locator(".panel .title").text_content()


def check_expand_group(p: Page) -> None:
    p.tab("graph")
    p.page.select_option("select.graph-select", "0")
    p.page.click("[data-action='collapse-all']")
    group = p.page.locator("svg [data-kind='group'][data-state='collapsed']").first
    gname = group.get_attribute("data-name")
    boxes = "svg [data-kind='node'], svg [data-kind='group'][data-state='collapsed']"
    before = p.count(boxes)
    group.click()
    after = p.page.locator(f"svg [data-kind='group'][data-name='{gname}']")
    assert after.get_attribute("data-state") == "expanded"
    assert p.count(boxes) > before  # its members (nodes or inner groups) are shown


def check_stats(p: Page) -> None:
    p.tab("tensors")
    p.page.locator("[data-kind='tensor']").first.click()
    p.page.wait_for_selector(".panel .stats table.kv", timeout=10_000)
    text = p.page.locator(".panel .stats").text_content()
    assert "mean" in text and "sample" in text


def _first_grouped_node(path: Path) -> str:
    with torchless.open(path, weights_only=False) as art:
        for prog in art.programs.values():
            for n in prog.graph.nodes:
                if "nn_module_stack" in n.meta and len(n.meta["nn_module_stack"]) > 2:
                    return n.name
    raise AssertionError("no node inside a nested module")


@pytest.mark.parametrize("kind", ["pt", "pt2", "onnx", "torchscript"])
def test_artifact_page(browser, view_files, cond_pt2, tmp_path, kind):
    path = cond_pt2 if kind == "pt2" else view_files[kind]
    names, counts = listing(path)
    url = html_file([path], tmp_path / "v.html")
    p = Page(browser, url, offline=True)  # the --html file: nothing but itself
    try:
        check_tensors(p, names)
        check_stats(p)
        if counts:
            check_graphs(p, counts)
        if kind == "onnx":
            with torchless.open(path) as art:
                check_search(p, art.graph().nodes[-2].name)
        if kind == "pt2":
            assert len(counts) == 3  # the graph and cond's two branches
            check_search(p, _first_grouped_node(path))
            check_expand_group(p)
        if kind == "torchscript":
            check_expand_group(p)
            check_search(p, "blocks.0")
        for tab in ("treemap", "info", "findings"):
            p.tab(tab)
        assert p.count("[data-kind='treemap']") == 0  # the findings tab replaced the treemap
        assert all(u.startswith(("file:", "data:")) for u in p.requests), p.requests
        assert not p.errors, p.errors
    finally:
        p.close()


def test_html_renders_with_network_off(browser, cond_pt2, tmp_path):
    names, counts = listing(cond_pt2)
    url = html_file([cond_pt2], tmp_path / "off.html")
    p = Page(browser, url, offline=True)
    try:
        check_tensors(p, names)
        check_stats(p)  # embedded statistics
        check_graphs(p, counts)
        assert all(u.startswith(("file:", "data:")) for u in p.requests), p.requests
        assert not p.errors, p.errors
    finally:
        p.close()


def test_served_page(browser, cond_pt2):
    from torchless.view.model import build
    from torchless.view.server import TensorSource, ViewServer

    names, counts = listing(cond_pt2)
    model, arts = build([cond_pt2])
    with ViewServer(model, TensorSource(arts)).start() as srv:
        p = Page(browser, srv.url)
        try:
            check_tensors(p, names)
            check_stats(p)  # asked from the server
            check_graphs(p, counts)
            assert any("/api/stats?" in u for u in p.requests)
            assert not p.errors, p.errors
        finally:
            p.close()


def test_diff_page(browser, view_files, tmp_path):
    a, b = view_files["diff_a"], view_files["diff_b"]
    d = diff_paths(a, b)
    url = html_file([a, b], tmp_path / "diff.html")
    p = Page(browser, url)
    try:
        rows = p.page.locator("[data-kind='diff']")
        want = {("changed", c["name"]) for c in d["changed"]} | {("added", n) for n in d["added"]}
        want |= {("removed", n) for n in d["removed"]}
        got = set(zip(rows.evaluate_all("els => els.map(e => e.dataset.status)"), p.names("[data-kind='diff']"), strict=True))
        assert got == want and len(want) == 4
        p.page.locator("[data-kind='diff'][data-status='changed']").first.click()
        p.page.wait_for_selector(".panel table.kv >> text=max |b−a|")
        # both sides' tensors
        check_tensors(p, listing(a)[0])
        p.page.click("header button[data-artifact='1']")
        check_tensors(p, listing(b)[0])
        assert not p.errors, p.errors
    finally:
        p.close()


def _visit_everything(p: Page) -> None:
    for tab in p.page.locator("nav.tabs button").evaluate_all("els => els.map(e => e.dataset.tab)"):
        p.tab(tab)
        if tab == "tensors":
            p.page.click("[data-action='expand-all']")
            for row in p.page.locator("[data-kind='tensor']").all():
                row.click()
        if tab == "graph":
            p.page.click("[data-action='expand-all']")
            for node in p.page.locator("svg [data-kind='node']").all():
                node.click()
        if tab == "treemap":
            for kind in ("leaf", "branch"):  # a tensor's statistics; zooming into a module
                cells = p.page.locator(f"[data-kind='treemap'].{kind}")
                if cells.count():
                    cells.first.click(position={"x": 4, "y": 4})  # a module's header strip (its children fill the rest)
    p.page.wait_for_timeout(100)


@pytest.mark.parametrize("kind", ["xss_pt", "xss_onnx"])
def test_hostile_names_render_as_text(browser, view_files, tmp_path, kind):
    path = view_files[kind]
    names, _ = listing(path)
    for served in (False, True):
        if served:
            from torchless.view.model import build
            from torchless.view.server import TensorSource, ViewServer

            model, arts = build([path])
            srv = ViewServer(model, TensorSource(arts)).start()
            url = srv.url
        else:
            url = html_file([path], tmp_path / f"{kind}.html")
        p = Page(browser, url)
        try:
            _visit_everything(p)
            assert p.page.evaluate("window.__xss") is None
            assert not p.dialogs
            assert not p.errors, p.errors
            assert sorted(p.names("[data-kind='tensor']")) == sorted(names) if p.count("[data-kind='tensor']") else True
            body = p.page.locator("body").text_content()
            assert p.page.locator("#app img, #app iframe, #app script, #app svg [onload]").count() == 0
            if kind == "xss_onnx":
                p.tab("graph")
                p.page.click("[data-action='expand-all']")
                p.page.locator("svg [data-kind='node'][data-name='y']").click()
                assert XSS_NAMES[1] in p.page.locator(".panel").text_content()  # the doc string, as text
                p.tab("info")
                assert XSS_NAMES[3] in p.page.locator("#app").text_content()
            else:
                p.tab("tensors")
                p.page.fill("input[aria-label='search tensors']", "xss")  # a flat list of whole names
                text = p.page.locator(".tree").text_content()
                assert all(n in text for n in XSS_NAMES[:3])
            assert body
        finally:
            p.close()
            if served:
                srv.close()


def test_findings_in_place(browser, tmp_path):
    import pickle

    class Evil:
        def __reduce__(self):
            import os

            return (os.system, ("echo pwned",))

    path = tmp_path / "evil.pt"
    path.write_bytes(pickle.dumps({"w": Evil()}, protocol=2))
    rep = torchless.scan(path)
    want = [f.rule for fr in rep.files for f in fr.findings]
    p = Page(browser, html_file([path], tmp_path / "evil.html"))
    try:
        p.tab("findings")
        assert p.names("[data-kind='finding']") == want and "dangerous-global" in want
        text = p.page.locator(".findings").text_content()
        assert "posix.system" in text and "REDUCE" in text  # what would be called, and the disassembly
        assert not p.errors, p.errors
    finally:
        p.close()


def test_served_heatmap_slices(browser, tmp_path):
    import numpy as np

    from torchless.view.model import build
    from torchless.view.server import TensorSource, ViewServer

    path = tmp_path / "cube.safetensors"
    torchless.write_tensors([("cube", np.arange(60, dtype=np.float32).reshape(3, 4, 5))], path)
    model, arts = build([path], scan=False)
    with ViewServer(model, TensorSource(arts)).start() as srv:
        p = Page(browser, srv.url)
        try:
            p.page.locator("[data-kind='tensor'][data-name='cube']").click()
            p.page.wait_for_selector("text=slice [0, :, :] of [3, 4, 5]")
            p.page.fill("input[aria-label='index of dimension 0']", "2")
            p.page.dispatch_event("input[aria-label='index of dimension 0']", "change")
            p.page.wait_for_selector("text=slice [2, :, :] of [3, 4, 5]")
            assert "blue 40 → red 59" in p.page.locator(".heat").text_content()  # the values of cube[2]
            assert not p.errors, p.errors
        finally:
            p.close()


def test_notebook_inline_render(browser, view_files):
    v = torchless.view(view_files["pt"], serve=False)  # what Jupyter shows: no server
    assert v.url is None
    ctx = browser.new_context(offline=True)
    try:
        page = ctx.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.set_content(v._repr_html_())
        frame = page.frame_locator("iframe")
        frame.locator("body[data-ready='1']").wait_for(timeout=10_000)
        frame.locator("[data-action='expand-all']").click()
        assert frame.locator("[data-kind='tensor']").count() == len(listing(view_files["pt"])[0])
        assert not errors, errors
    finally:
        ctx.close()


def test_diff_page_shows_other_values(browser, tmp_path):
    from .conftest import SAMPLES

    a, b = SAMPLES / "checkpoint.pt", SAMPLES / "state_dict.pt"
    d = diff_paths(a, b)
    want = {("value changed", str(c["name"])) for c in d.get("values_changed", [])}
    want |= {("value added", str(n)) for n in d.get("values_added", [])} | {
        ("value removed", str(n)) for n in d.get("values_removed", [])
    }
    p = Page(browser, html_file([a, b], tmp_path / "values.html"), offline=True)
    try:
        rows = p.page.locator("[data-kind='diffvalue']")
        got = set(
            zip(rows.evaluate_all("els => els.map(e => e.dataset.status)"), p.names("[data-kind='diffvalue']"), strict=True)
        )
        assert got == want
        assert p.count("[data-kind='diff']") == len(d["changed"]) + len(d["added"]) + len(d["removed"]) + len(d["not_compared"])
        assert not p.errors, p.errors
    finally:
        p.close()
