"""The viewer's Python side: data model, statistics, the server's refusals, the page, the CLI.

Oracles: torchless's own listing through the public API, NumPy on the same arrays, and
the HTTP status codes a client sees. The browser tests are in test_view_browser.py.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import re
from pathlib import Path

import numpy as np
import pytest

import torchless
from torchless.cli.main import main as cli_main
from torchless.diff import diff as diff_paths
from torchless.view import stats as S
from torchless.view.model import build, dumps
from torchless.view.server import TensorSource, ViewServer

VIEWER = Path(__file__).resolve().parents[2] / "viewer"
STATIC = Path(__file__).resolve().parents[2] / "src" / "torchless" / "view" / "static"


class Arr:
    """A stand-in tensor over a NumPy array (what the statistics need: shape, numpy())."""

    def __init__(self, a: np.ndarray) -> None:
        self.a = a
        self.shape = a.shape

    def numpy(self) -> np.ndarray:
        return self.a


# -- the model ----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["pt", "onnx", "torchscript"])
def test_model_lists_what_the_api_lists(view_files, kind):
    path = view_files[kind]
    model, arts = build([path], scan=False)
    try:
        with torchless.open(path, weights_only=False) as art:
            want = [(n, t.dtype.name, list(t.shape), t.nbytes) for n, t in art.tensors()]
            storages = [id(t.storage) for _n, t in art.tensors()]
        got = [(e["name"], e["dtype"], e["shape"], e["nbytes"]) for e in model["artifacts"][0]["tensors"]]
        assert got == want
        shared = [storages.count(s) > 1 for s in storages]
        assert [e["shared"] for e in model["artifacts"][0]["tensors"]] == shared
    finally:
        for a in arts:
            a.close()


def test_model_shared_storage_and_parameters(tmp_path):
    torch = pytest.importorskip("torch", reason="tied weights and Parameters are saved by torch")
    lin = torch.nn.Linear(3, 3)
    sd = {"a.weight": lin.weight, "b.weight": lin.weight, "view": lin.weight.detach()[0], "other": torch.ones(2)}
    p = tmp_path / "tied.pt"
    torch.save(sd, p)
    model, arts = build([p], scan=False)
    for a in arts:
        a.close()
    t = {e["name"]: e for e in model["artifacts"][0]["tensors"]}
    assert t["a.weight"]["storage"] == t["b.weight"]["storage"] == t["view"]["storage"] != t["other"]["storage"]
    assert t["a.weight"]["shared"] and t["view"]["shared"] and not t["other"]["shared"]
    assert t["a.weight"]["param"] and not t["other"]["param"]


def test_model_pt2_graphs_subgraphs_and_groups(cond_pt2):
    model, arts = build([cond_pt2], scan=False)
    for a in arts:
        a.close()
    graphs = model["artifacts"][0]["graphs"]
    with torchless.open(cond_pt2) as art:
        (prog,) = art.programs.values()
        walked = list(prog.graph.walk())
    assert [len(g["nodes"]) for g in graphs] == [len(g.nodes) for _p, g in walked]
    assert [g["parent"] for g in graphs] == [None, 0, 0]
    main = graphs[0]
    subs = [n["subgraph"] for n in main["nodes"] if "subgraph" in n]
    assert sorted(subs) == [1, 2]
    for (_p, g), entry in zip(walked, graphs, strict=True):
        want = sorted((a.name, b.name) for b in g.nodes for a in b.all_input_nodes)
        got = sorted((entry["nodes"][i]["name"], entry["nodes"][j]["name"]) for i, j, _l in entry["edges"])
        assert got == want
    groups = {tuple(n["group"]) for n in main["nodes"]}
    assert ("enc", "enc.0", "enc.0.lin") in groups or any(len(g) >= 2 for g in groups)
    linear = next(n for n in main["nodes"] if n["target"].startswith("aten.linear"))
    assert linear["schema"].startswith("aten::linear(") and linear["stack"] and linear["val"].startswith("float32[")


def test_model_diff(view_files):
    a, b = view_files["diff_a"], view_files["diff_b"]
    model, arts = build([a, b], scan=False)
    for x in arts:
        x.close()
    assert model["diff"] == json.loads(json.dumps(diff_paths(a, b)))


def test_model_findings_of_a_dangerous_pickle(tmp_path):
    import pickle

    class Evil:
        def __reduce__(self):
            import os

            return (os.system, ("echo <script>",))

    p = tmp_path / "evil.pt"
    p.write_bytes(pickle.dumps(Evil(), protocol=2))
    model, arts = build([p])
    for a in arts:
        a.close()
    rep = torchless.scan(p)
    f = model["artifacts"][0]["findings"]
    assert [x["rule"] for fr in f["files"] for x in fr["findings"]] == [x.rule for fr in rep.files for x in fr.findings]
    assert any(x.get("global") == "posix.system" or "system" in str(x.get("global")) for fr in f["files"] for x in fr["findings"])


def test_dumps_cannot_end_the_script_element():
    s = dumps({"name": "</script><script>alert(1)</script><!--", "x": "a&b\u2028"})
    assert "<" not in s and ">" not in s and "&" not in s
    assert json.loads(s) == {"name": "</script><script>alert(1)</script><!--", "x": "a&b\u2028"}


# -- statistics ---------------------------------------------------------------------------


def test_stats_match_numpy():
    rng = np.random.default_rng(1)
    a = rng.standard_normal((7, 9)).astype(np.float32)
    a[0, 0], a[1, 1], a[2, 2], a[3, 3] = np.nan, np.inf, 0.0, 0.0
    st = S.tensor_stats(Arr(a))
    fin = a[np.isfinite(a)].astype(np.float64)
    assert (st["nan"], st["inf"], st["zero"]) == (1, 1, int((a == 0).sum()))
    assert st["min"] == fin.min() and st["max"] == fin.max()
    assert st["mean"] == pytest.approx(fin.mean()) and st["std"] == pytest.approx(fin.std())
    assert not st["sampled"] and st["sample"] == a.size
    counts, _ = np.histogram(fin, bins=S.HIST_BINS, range=(fin.min(), fin.max()))
    assert st["hist"]["counts"] == counts.tolist()


def test_stats_sample_large_tensors():
    a = np.arange(100_000, dtype=np.float64)
    st = S.tensor_stats(Arr(a), sample=6400)
    assert st["sampled"] and st["sample"] == 6400 and st["numel"] == 100_000
    assert st["min"] == 0 and st["max"] == 99_999  # the blocks reach both ends
    assert sum(st["hist"]["counts"]) == 6400


def test_stats_of_unreadable_values():
    class Meta:
        shape = (2,)
        storage = None

    assert "error" in S.tensor_stats(Meta())


def test_heatmap_picks_rows_and_columns():
    a = np.arange(3 * 300 * 200, dtype=np.float32).reshape(3, 300, 200)
    hm = S.heatmap(Arr(a), side=64, index=(2,))
    rows, cols = np.array(hm["rows"]), np.array(hm["cols"])
    assert len(rows) <= 64 and len(cols) <= 64 and rows[0] == 0 and rows[-1] == 299 and cols[-1] == 199
    assert np.array(hm["values"]).tolist() == a[2][np.ix_(rows, cols)].astype(np.float64).tolist()
    assert "error" in S.heatmap(Arr(a), index=(3,))


def test_diff_stats():
    x = np.zeros(10, dtype=np.float32)
    y = x.copy()
    y[3] = 2.5
    st = S.diff_stats(Arr(x), Arr(y))
    assert st["max_abs"] == 2.5 and st["mean_abs"] == pytest.approx(0.25) and st["changed"] == 1


# -- the server ---------------------------------------------------------------------------


def _get(srv: ViewServer, path: str, host: str | None = None) -> tuple[int, bytes]:
    c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
    try:
        c.putrequest("GET", path, skip_host=True)
        c.putheader("Host", host if host is not None else f"127.0.0.1:{srv.port}")
        c.endheaders()
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


def test_server_refuses_wrong_token_host_and_paths(view_files):
    path = view_files["pt"]
    model, arts = build([path], scan=False)
    with ViewServer(model, TensorSource(arts)).start() as srv:
        t = srv.token
        assert srv.url.startswith("http://127.0.0.1:") and srv.httpd.server_address[0] == "127.0.0.1"
        status, body = _get(srv, f"/?token={t}")
        assert status == 200 and b"tl-data" in body
        assert _get(srv, f"/?token={t}", host=f"localhost:{srv.port}")[0] == 200
        assert _get(srv, "/")[0] == 403
        assert _get(srv, "/?token=" + t[:-1] + ("A" if t[-1] != "A" else "B"))[0] == 403
        for host in ("evil.example:%d" % srv.port, "127.0.0.1", "127.0.0.1:1", ""):
            assert _get(srv, f"/?token={t}", host=host)[0] == 403, host
        name = "model.0.weight"
        status, body = _get(srv, f"/api/stats?token={t}&a=0&name={name}")
        with torchless.open(path) as art:
            want = S.tensor_stats(dict(art.tensors())[name])
        assert status == 200 and json.loads(body) == json.loads(json.dumps(want))
        assert _get(srv, f"/api/stats?a=0&name={name}")[0] == 403
        for p in (
            "/../../../../etc/passwd",
            "/static/viewer.js",
            "/viewer.js",
            "/%2e%2e/%2e%2e/etc/passwd",
            "/" + str(path),
            "/api/stats",
            "/api/stats?name=../../etc/passwd&a=0",
            "/api/stats?name=model.0.weight&a=1",
            "/api/heatmap?name=" + str(path),
        ):
            sep = "&" if "?" in p else "?"
            assert _get(srv, f"{p}{sep}token={t}")[0] == 404, p
        assert _get(srv, f"/api/heatmap?token={t}&a=0&name={name}")[0] == 200


def test_page_policy_allows_only_the_bundled_script(view_files):
    from torchless.view.page import asset, page

    model, arts = build([view_files["pt"]], scan=False)
    for a in arts:
        a.close()
    doc, policy = page(model, {})
    js = asset("viewer.js")
    import base64

    digest = base64.b64encode(hashlib.sha256(js.encode()).digest()).decode()
    assert f"script-src 'sha256-{digest}'" in policy and "unsafe-inline" not in policy and "connect-src 'none'" in policy
    assert re.findall(r"<script>", doc) == ["<script>"]  # one executable script, the bundle


# -- the entry points ---------------------------------------------------------------------


def test_cli_html_and_errors(view_files, tmp_path, capsys):
    out = tmp_path / "o.html"
    assert cli_main(["view", str(view_files["pt"]), "--html", str(out), "--no-scan"]) == 0
    assert out.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    capsys.readouterr()
    assert cli_main(["view", str(tmp_path / "missing.pt"), "--html", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_python_view(view_files, tmp_path):
    v = torchless.view(view_files["pt"], html=tmp_path / "p.html")
    assert v.url is None and Path(v.html_path).exists()
    with torchless.view(view_files["pt"], open_browser=False, scan=False) as v:
        assert v.url and _get(v.server, "/?token=" + v.server.token)[0] == 200
        inline = v._repr_html_()
    assert inline.startswith("<iframe srcdoc=") and "<script>" not in inline  # escaped into the attribute
    assert isinstance(torchless.view, type(torchless))  # a callable module, like torchless.scan


# -- the shipped build --------------------------------------------------------------------


def _sources_hash() -> str:
    """What viewer/build.mjs records: SHA-256 over sorted relative paths and contents of
    package.json, package-lock.json, build.mjs and src/**."""
    files = ["package.json", "package-lock.json", "build.mjs"]
    files += [p.relative_to(VIEWER).as_posix() for p in (VIEWER / "src").rglob("*") if p.is_file()]
    h = hashlib.sha256()
    for rel in sorted(files):
        h.update(rel.encode() + b"\0")
        h.update((VIEWER / rel).read_bytes())
        h.update(b"\0")
    return h.hexdigest()


def test_shipped_build_matches_the_sources():
    info = json.loads((STATIC / "build.json").read_text())
    assert info["sources_sha256"] == _sources_hash(), "viewer/ changed: run scripts/build_viewer.sh and commit static/"
    for name, sha in info["outputs_sha256"].items():
        assert hashlib.sha256((STATIC / name).read_bytes()).hexdigest() == sha, f"static/{name} was edited by hand"
    lock = json.loads((VIEWER / "package-lock.json").read_text())
    pkg = json.loads((VIEWER / "package.json").read_text())
    for deps in (pkg.get("dependencies", {}), pkg.get("devDependencies", {})):
        for name, ver in deps.items():
            assert re.fullmatch(r"\d+\.\d+\.\d+", ver), f"{name} is not pinned: {ver}"
            assert lock["packages"][f"node_modules/{name}"]["version"] == ver


def test_cli_serves_until_interrupted(view_files):
    import os
    import signal
    import subprocess
    import sys
    import urllib.request

    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2] / "src"))
    cmd = [sys.executable, "-m", "torchless", "view", str(view_files["pt"]), "--no-browser", "--no-scan"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = proc.stdout.readline()
        m = re.fullmatch(r"torchless view: (http://127\.0\.0\.1:(\d+)/\?token=\S+)\n", line)
        assert m, line
        with urllib.request.urlopen(m.group(1), timeout=10) as r:
            assert r.status == 200 and b'id="tl-data"' in r.read()
        proc.send_signal(signal.SIGINT)
        _out, err = proc.communicate(timeout=20)
        assert proc.returncode in (0, 130) and "Traceback" not in err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_self_contained_file_embeds_bounded_statistics(tmp_path):
    from torchless import view as V

    rng = np.random.default_rng(2)
    items = [(f"m{i}.w", rng.standard_normal((20, 30)).astype(np.float32)) for i in range(V.EMBED_HEATMAPS + 30)]
    path = tmp_path / "many.safetensors"
    torchless.write_tensors(items, path)
    model, arts = build([path], scan=False)
    try:
        V.embed_stats(model, arts, limit=V.EMBED_HEATMAPS + 10)
    finally:
        for a in arts:
            a.close()
    emb = model["embedded"]
    assert len(emb["stats"]) == V.EMBED_HEATMAPS + 10 and len(emb["heatmaps"]) == V.EMBED_HEATMAPS
    hm = emb["heatmaps"]["0:m0.w"]
    a = items[0][1].astype(np.float64)
    want = [[float(f"{x:.{V.EMBED_DIGITS}g}") for x in a[r, hm["cols"]]] for r in hm["rows"]]
    assert hm["values"] == want


class _Broken:
    """A stand-in tensor whose read fails the way a file that went away does."""

    shape = (4,)

    def numpy(self) -> np.ndarray:
        raise OSError(5, "Input/output error", "m.pt")


class _Arts:
    def __init__(self, tensors: dict) -> None:
        self._t = tensors

    def tensors(self):
        if self._t is None:
            raise torchless.ChecksumError("CRC-32 mismatch", path="m.pt", member="data.pkl")
        return iter(self._t.items())

    def close(self) -> None:
        pass


def test_server_answers_a_failed_read_in_one_line(capfd):
    """A read that fails past what the statistics catch (an I/O error; a listing that
    fails) is a 422 with the one-line reason the page shows, not a traceback on the
    terminal and a dropped connection."""
    good = Arr(np.arange(4, dtype=np.float32))
    src = TensorSource([_Arts({"bad": _Broken(), "good": good}), _Arts(None)])
    with ViewServer({"artifacts": []}, src).start() as srv:
        t = srv.token
        for q, why in (
            ("stats?a=0&name=bad", "Input/output error"),
            ("heatmap?a=0&name=bad", "Input/output error"),
            ("stats?a=1&name=good", "CRC-32 mismatch"),
            ("diffstats?name=good", "CRC-32 mismatch"),
        ):
            status, body = _get(srv, f"/api/{q}&token={t}")
            assert status == 422, (q, status, body)
            err = json.loads(body)["error"]
            assert why in err and "m.pt" in err and "\n" not in err, err
        # the server still serves after it
        assert _get(srv, f"/api/stats?token={t}&a=0&name=good")[0] == 200
    err = capfd.readouterr().err
    assert "Traceback" not in err, err
