"""The viewer page: the bundled script and style (``static/``) and the data model in one HTML
document, under a Content-Security-Policy that allows exactly that script and style.

The model is embedded as JSON in a ``<script type="application/json">`` element with
``<``, ``>`` and ``&`` escaped, so nothing from a file can end the element; the page reads
it with ``JSON.parse`` and shows every string with ``textContent``.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
from importlib import resources
from typing import Any

from ..core.errors import UnsupportedError
from .model import dumps

__all__ = ["asset", "page", "build_info"]


def asset(name: str) -> str:
    """A bundled static file (``viewer.js``, ``viewer.css``, ``build.json``)."""
    try:
        return resources.files(__package__).joinpath("static").joinpath(name).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UnsupportedError(
            f"the viewer's front end is not built (static/{name} is missing); run scripts/build_viewer.sh"
        ) from None


def build_info() -> dict[str, Any]:
    """What ``scripts/build_viewer.sh`` recorded: the hash of the sources it built from."""
    return json.loads(asset("build.json"))


def _sha(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode("utf-8")).digest()).decode("ascii") + "'"


def csp(js: str, css: str, *, connect: bool) -> str:
    """The policy: this script, this style, data: images, and the server itself for the
    statistics requests (``connect``) or nothing else at all."""
    connect_src = "'self'" if connect else "'none'"
    return (
        f"default-src 'none'; script-src {_sha(js)}; style-src {_sha(css)}; img-src data:; "
        f"connect-src {connect_src}; base-uri 'none'; form-action 'none'"
    )


def page(model: dict[str, Any], config: dict[str, Any]) -> tuple[str, str]:
    """(the HTML document, its Content-Security-Policy). ``config``: ``{"api": path,
    "token": token}`` when a server answers statistics requests, ``{}`` for a file."""
    js, css = asset("viewer.js"), asset("viewer.css")
    if "</script" in js.lower() or "</style" in css.lower():
        raise UnsupportedError("the bundled viewer script would end its own element; rebuild it")
    policy = csp(js, css, connect=bool(config.get("api")))
    names = [a.get("name", "") for a in model.get("artifacts", [])]
    title = html.escape("torchless view: " + " vs ".join(names), quote=True)
    doc = (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{html.escape(policy, quote=True)}">'
        '<meta name="referrer" content="no-referrer">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{title}</title><style>{css}</style></head>\n<body>"
        '<div id="app"></div>\n'
        f'<script type="application/json" id="tl-data">{dumps(model)}</script>\n'
        f'<script type="application/json" id="tl-config">{dumps(config)}</script>\n'
        f"<script>{js}</script>\n</body></html>\n"
    )
    return doc, policy
