"""The local server of ``torchless view``: the page and per-tensor statistics, nothing else.

It listens on 127.0.0.1 only, on a random port unless one is given. Every request must
carry the random token of the URL it printed (``?token=...``), compared in constant time,
and a ``Host`` header naming 127.0.0.1 or localhost with that port: a page of another
site that resolves its own name to 127.0.0.1 (DNS rebinding) sends its own name and is
refused (403). It answers ``/`` (the page) and ``/api/stats``, ``/api/heatmap``,
``/api/diffstats`` (JSON about a tensor the model lists, by artifact index and tensor
name); every other path is 404. It never opens a file: tensors are read from the
artifacts opened for the model.
"""

from __future__ import annotations

import hmac
import json
import secrets
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from ..core.errors import TorchlessError
from .page import page
from .stats import diff_stats, heatmap, tensor_stats

__all__ = ["ViewServer", "TensorSource"]


class TensorSource:
    """Tensors of the opened artifacts by (artifact index, name), read under one lock."""

    def __init__(self, arts: list[Any]) -> None:
        self.arts = arts
        self._maps: list[dict[str, Any] | None] = [None] * len(arts)
        self.lock = threading.Lock()

    def get(self, a: int, name: str) -> Any:
        if not 0 <= a < len(self.arts):
            return None
        m = self._maps[a]
        if m is None:
            m = self._maps[a] = dict(self.arts[a].tensors())
        return m.get(name)

    def stats(self, a: int, name: str, **kw: Any) -> dict[str, Any] | None:
        with self.lock:
            t = self.get(a, name)
            return None if t is None else tensor_stats(t, **kw)

    def heatmap(self, a: int, name: str, **kw: Any) -> dict[str, Any] | None:
        with self.lock:
            t = self.get(a, name)
            return None if t is None else heatmap(t, **kw)

    def diffstats(self, name: str, **kw: Any) -> dict[str, Any] | None:
        with self.lock:
            x, y = self.get(0, name), self.get(1, name)
            return None if x is None or y is None else diff_stats(x, y, **kw)

    def close(self) -> None:
        for a in self.arts:
            a.close()


class _Server(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        # socketserver prints a whole traceback on stderr; a bug here gets one line, and the
        # page sees a dropped connection ("the server could not be reached")
        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionError, TimeoutError)):
            return
        print(f"torchless view: request failed: {type(exc).__name__}: {exc}", file=sys.stderr)


class ViewServer:
    """Serves one model. ``url`` holds the token; ``start()`` serves from a daemon thread,
    ``serve_forever()`` from this one; ``close()`` stops and closes the artifacts."""

    def __init__(self, model: dict[str, Any], source: TensorSource, *, port: int = 0, host: str = "127.0.0.1") -> None:
        self.model = model
        self.source = source
        self.token = secrets.token_urlsafe(24)
        self.httpd = _Server((host, port), _Handler)
        self.httpd.daemon_threads = True
        self.httpd.view = self  # type: ignore[attr-defined]  # the handler finds its ViewServer on the HTTP server
        self.host = host
        self.port = int(self.httpd.server_address[1])
        self.allowed_hosts = {f"127.0.0.1:{self.port}", f"localhost:{self.port}"}
        self.page, self.policy = page(model, {"api": "/api", "token": self.token})
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/?token={self.token}"

    def start(self) -> ViewServer:
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="torchless-view", daemon=True)
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        self.httpd.serve_forever()

    def close(self) -> None:
        if self._thread is not None:
            self.httpd.shutdown()
            self._thread.join(5)
            self._thread = None
        self.httpd.server_close()
        self.source.close()

    def __enter__(self) -> ViewServer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _int(q: dict[str, list[str]], key: str, default: int = 0) -> int:
    try:
        return int(q.get(key, [str(default)])[0])
    except ValueError:
        return -1


class _Handler(BaseHTTPRequestHandler):
    server_version = "torchless-view"
    sys_version = ""

    def log_message(self, format: str, *args: Any) -> None:  # quiet: the terminal shows the URL only
        pass

    def _send(self, code: int, body: bytes, ctype: str) -> None:
        view: ViewServer = self.server.view  # type: ignore[attr-defined]  # set by ViewServer on its HTTP server
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Referrer-Policy", "no-referrer")
        self.send_header("Cross-Origin-Resource-Policy", "same-origin")
        self.send_header("X-Frame-Options", "SAMEORIGIN")
        if ctype.startswith("text/html"):
            self.send_header("Content-Security-Policy", view.policy)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, value: Any, code: int = 200) -> None:
        self._send(code, json.dumps(value, allow_nan=False).encode("utf-8"), "application/json")

    def _refuse(self, code: int, why: str) -> None:
        self._send(code, why.encode("utf-8"), "text/plain; charset=utf-8")

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        view: ViewServer = self.server.view  # type: ignore[attr-defined]  # set by ViewServer on its HTTP server
        host = self.headers.get("Host", "")
        if host not in view.allowed_hosts:
            return self._refuse(403, "forbidden: unexpected Host header")
        parts = urlsplit(self.path)
        q = parse_qs(parts.query)
        token = q.get("token", [""])[0]
        if not hmac.compare_digest(token.encode("utf-8"), view.token.encode("utf-8")):
            return self._refuse(403, "forbidden: missing or wrong token")
        path = parts.path
        src = view.source
        if path == "/":
            return self._send(200, view.page.encode("utf-8"), "text/html; charset=utf-8")
        name = q.get("name", [None])[0]
        if path in ("/api/stats", "/api/heatmap", "/api/diffstats") and name is not None:
            try:
                if path == "/api/stats":
                    out = src.stats(_int(q, "a"), name)
                elif path == "/api/heatmap":
                    idx = q.get("index", [""])[0]
                    try:
                        index = tuple(int(x) for x in idx.split(",") if x)
                    except ValueError:
                        return self._refuse(400, "bad index")
                    out = src.heatmap(_int(q, "a"), name, index=index)
                else:
                    out = src.diffstats(name)
            except (TorchlessError, OSError) as e:
                # a damaged tensor or a file gone: the page shows the one-line reason (as an
                # unreachable server's is shown); the terminal stays quiet
                return self._json({"error": str(e) or type(e).__name__}, 422)
            if out is None:
                return self._refuse(404, "no such tensor")
            return self._json(out)
        return self._refuse(404, "not found")

    do_HEAD = do_GET

    def do_POST(self) -> None:  # noqa: N802
        self._refuse(405, "method not allowed")

    do_PUT = do_DELETE = do_POST
