"""``torchless view``: a browser viewer for checkpoints, graphs, diffs and scan findings.

``torchless.view(path)`` (or ``torchless view PATH`` on the command line) opens the
artifact, builds the data model (:mod:`torchless.view.model`) and serves it with the
bundled front end from a local server (:mod:`torchless.view.server`: 127.0.0.1, random
port, random token, Host checked). ``html=OUT.html`` writes one self-contained file
instead (data, script and style embedded; statistics precomputed from small samples;
no network). Two paths show their diff. In Jupyter the returned :class:`View` renders
inline.

Example:
    >>> import torchless
    >>> v = torchless.view("model.pt", open_browser=False)   # doctest: +SKIP
    >>> v.url                                                # doctest: +SKIP
    >>> torchless.view("model.pt", html="model.html")        # doctest: +SKIP
"""

from __future__ import annotations

import html as _html
import os
import sys
import types
from typing import Any

from .model import build
from .page import page
from .server import TensorSource, ViewServer
from .stats import diff_stats, heatmap, tensor_stats

__all__ = ["view", "View", "build", "embed_stats", "write_html", "html_page", "EMBED_TENSORS", "EMBED_SAMPLE"]

#: tensors whose statistics a self-contained file carries (the first ones, in order)
EMBED_TENSORS = 1000
#: elements sampled per tensor for a self-contained file's statistics
EMBED_SAMPLE = 1 << 16
#: heatmaps a self-contained file carries (the first tensors'), their side and digits
EMBED_HEATMAPS = 200
EMBED_HEATMAP = 48
EMBED_DIGITS = 3


def embed_stats(model: dict[str, Any], arts: list[Any], *, limit: int = EMBED_TENSORS, sample: int = EMBED_SAMPLE) -> None:
    """Put statistics, heatmaps and (for a diff) differences of the first ``limit``
    tensors of each artifact into ``model["embedded"]``, each from at most ``sample``
    elements, for a page that has no server to ask."""
    src = TensorSource(arts)
    emb: dict[str, Any] = {"stats": {}, "heatmaps": {}, "diffstats": {}, "limit": limit, "sample": sample}
    for ai, a in enumerate(model["artifacts"]):
        for i, e in enumerate(a["tensors"][:limit]):
            t = src.get(ai, e["name"])
            if t is None:
                continue
            key = f"{ai}:{e['name']}"
            emb["stats"][key] = tensor_stats(t, sample=sample)
            if i < min(limit, EMBED_HEATMAPS):
                emb["heatmaps"][key] = heatmap(t, side=EMBED_HEATMAP, digits=EMBED_DIGITS)
    d = model.get("diff")
    if d:
        for c in d.get("changed", [])[:limit]:
            x, y = src.get(0, c["name"]), src.get(1, c["name"])
            if x is not None and y is not None:
                emb["diffstats"][c["name"]] = diff_stats(x, y, sample=sample)
    model["embedded"] = emb


def html_page(paths: list[Any], **kw: Any) -> str:
    """The self-contained page of one artifact (or the diff of two) as text."""
    model, arts = build(paths, **kw)
    try:
        embed_stats(model, arts)
    finally:
        for a in arts:
            a.close()
    return page(model, {})[0]


def write_html(paths: list[Any], out: Any, **kw: Any) -> str:
    """Write the self-contained page to ``out`` (atomically); returns the path."""
    from ..io.atomic import atomic_write_bytes

    doc = html_page(paths, **kw)
    out = os.fspath(out)
    atomic_write_bytes(out, doc.encode("utf-8"))
    return out


def _in_notebook() -> bool:
    return "ipykernel" in sys.modules


class View:
    """What :func:`view` returns: ``url`` (None without a server), ``html_path`` (the file
    written, if any), ``close()``; in Jupyter it renders inline (the self-contained page in
    an ``<iframe srcdoc>``)."""

    def __init__(self, paths: list[Any], server: ViewServer | None, html_path: str | None, kw: dict[str, Any]) -> None:
        self.paths = paths
        self.server = server
        self.html_path = html_path
        self._kw = kw

    @property
    def url(self) -> str | None:
        return self.server.url if self.server is not None else None

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None

    def __enter__(self) -> View:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _repr_html_(self) -> str:
        doc = html_page(self.paths, **self._kw)
        return (
            f'<iframe srcdoc="{_html.escape(doc, quote=True)}" style="width:100%;height:640px;border:1px solid #ccc" '
            'sandbox="allow-scripts"></iframe>'
        )

    def __repr__(self) -> str:
        where = self.url or self.html_path or "inline"
        return f"<torchless view of {', '.join(map(str, self.paths))}: {where}>"


def view(
    path: Any,
    path2: Any = None,
    *,
    html: Any = None,
    port: int = 0,
    open_browser: bool | None = None,
    serve: bool | None = None,
    scan: bool = True,
    format: str | None = None,
) -> View:
    """Show an artifact (or the diff of two) in the browser.

    Args:
        path, path2: the artifact; a second one shows the diff of the two.
        html: write one self-contained HTML file here instead of serving.
        port: the server's port (0: a random free one).
        open_browser: open the page in the default browser (default: when serving
            outside a notebook).
        serve: start the local server from a background thread (default: unless
            ``html`` is given or this runs in a notebook, where the view renders inline).
        scan: include ``torchless.scan`` findings.
        format: the format of both paths, when detection should not decide.

    Returns:
        A :class:`View` (``url``, ``close()``; renders inline in Jupyter).
    """
    paths = [path] if path2 is None else [path, path2]
    kw: dict[str, Any] = {"scan": scan, "format": format}
    if html is not None:
        out = write_html(paths, html, **kw)
        return View(paths, None, out, kw)
    if serve is None:
        serve = not _in_notebook()
    server = None
    if serve:
        model, arts = build(paths, **kw)
        try:
            server = ViewServer(model, TensorSource(arts), port=port).start()
        except BaseException:
            for a in arts:
                a.close()
            raise
        if open_browser if open_browser is not None else True:
            import webbrowser

            webbrowser.open(server.url)
    return View(paths, server, None, kw)


class _CallableModule(types.ModuleType):
    """``torchless.view`` is both this package and the :func:`view` function (as
    ``torchless.scan`` is), so ``import torchless.view.model`` keeps working."""

    def __call__(self, path: Any, path2: Any = None, **kw: Any) -> View:
        return view(path, path2, **kw)


sys.modules[__name__].__class__ = _CallableModule
