"""A stand-in for the Hugging Face Hub's HTTP API on 127.0.0.1, for ``hf://`` tests.

It implements what ``huggingface_hub``'s ``HfFileSystem`` calls to read a model repo, no
more: the revision API (``GET /api/models/{repo}[/revision/{rev}]``), the tree listing
(``GET /api/models/{repo}/tree/{rev}[/{path}]``, paginated by a ``Link: <...>; rel="next"``
header as the Hub does, two entries a page so that the client has to follow it),
``POST /api/models/{repo}/paths-info/{rev}`` and the file downloads
(``GET``/``HEAD /{repo}/resolve/{rev}/{path}``) with single-range support and the headers
the client reads (``ETag``, ``X-Repo-Commit``, ``Content-Length``, ``Content-Range``,
``Accept-Ranges``). Errors carry the Hub's ``X-Error-Code`` (``RepoNotFound``,
``RevisionNotFound``, ``EntryNotFound``). Everything else, uploads included, is 405.

Repos are folders: ``root/user/repo/...``; revision ``main`` (or the commit id
:data:`COMMIT`) serves the folder as it is. The handler counts the body bytes it sent for
``resolve`` requests and the requests of each kind (the oracle for "bytes fetched").
"""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import threading
import urllib.parse
from collections import Counter
from typing import Any

COMMIT = "0123456789abcdef0123456789abcdef01234567"
PAGE = 2


class HubHandler(http.server.BaseHTTPRequestHandler):
    root = ""
    sent = 0
    counts: Counter[str] = Counter()
    lock = threading.Lock()

    def log_message(self, *a: object) -> None:
        pass

    def _count(self, kind: str, n: int = 0) -> None:
        with self.lock:
            type(self).counts[kind] += 1
            type(self).sent += n

    def _json(self, obj: Any, status: int = 200, headers: dict[str, str] | None = None) -> None:
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _error(self, status: int, code: str, message: str) -> None:
        self._json({"error": message}, status, {"X-Error-Code": code, "X-Error-Message": message})

    # -- the repo on disk ---------------------------------------------------------
    def _repo(self, repo: str, rev: str) -> str | None:
        folder = os.path.join(self.root, *repo.split("/"))
        if repo.count("/") != 1 or ".." in repo.split("/") or not os.path.isdir(folder):
            self._error(404, "RepoNotFound", f"Repository not found: {repo}")
            return None
        if rev not in ("main", COMMIT):
            self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
            return None
        return folder

    @staticmethod
    def _entry(folder: str, rel: str) -> dict[str, Any]:
        full = os.path.join(folder, *rel.split("/"))
        if os.path.isdir(full):
            oid = hashlib.sha1(rel.encode()).hexdigest()
            return {"type": "directory", "oid": oid, "path": rel}
        size = os.path.getsize(full)
        h = hashlib.sha256()
        with open(full, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        oid = hashlib.sha1(h.digest()).hexdigest()
        out: dict[str, Any] = {"type": "file", "oid": oid, "size": size, "path": rel}
        if size >= 1024:  # large files are LFS objects on the Hub
            out["lfs"] = {"oid": h.hexdigest(), "size": size, "pointerSize": 134}
        return out

    @staticmethod
    def _safe(rel: str) -> bool:
        return all(p not in ("", ".", "..") for p in rel.split("/")) if rel else True

    # -- routes -------------------------------------------------------------------
    def do_GET(self) -> None:  # noqa: N802
        self._route()

    def do_HEAD(self) -> None:  # noqa: N802
        self._route()

    def do_POST(self) -> None:  # noqa: N802
        url = urllib.parse.urlsplit(self.path)
        parts = urllib.parse.unquote(url.path).strip("/").split("/")
        if len(parts) == 6 and parts[:2] == ["api", "models"] and parts[4] == "paths-info":
            self._count("paths-info")
            n = int(self.headers.get("Content-Length") or 0)
            form = urllib.parse.parse_qs(self.rfile.read(n).decode())
            folder = self._repo("/".join(parts[2:4]), parts[5])
            if folder is None:
                return
            out = []
            for rel in form.get("paths", []):
                rel = rel.strip("/")
                if self._safe(rel) and rel and os.path.exists(os.path.join(folder, *rel.split("/"))):
                    out.append(self._entry(folder, rel))
            self._json(out)
            return
        self._count("refused")
        self._error(405, "MethodNotAllowed", "this stand-in serves reads only")

    def _route(self) -> None:
        url = urllib.parse.urlsplit(self.path)
        parts = urllib.parse.unquote(url.path).strip("/").split("/")
        if parts[:2] == ["api", "models"] and (len(parts) == 4 or (len(parts) >= 6 and parts[4] == "revision")):
            self._count("revision")
            folder = self._repo("/".join(parts[2:4]), "/".join(parts[5:]) or "main")
            if folder is not None:
                siblings = []
                for d, _sub, files in os.walk(folder):
                    for f in files:
                        siblings.append({"rfilename": os.path.relpath(os.path.join(d, f), folder).replace(os.sep, "/")})
                self._json({"id": "/".join(parts[2:4]), "sha": COMMIT, "private": False, "siblings": sorted(siblings, key=str)})
            return
        if len(parts) >= 6 and parts[:2] == ["api", "models"] and parts[4] == "tree":
            self._count("tree")
            self._tree("/".join(parts[2:4]), parts[5], "/".join(parts[6:]), urllib.parse.parse_qs(url.query))
            return
        if len(parts) >= 5 and parts[2] == "resolve":
            self._resolve("/".join(parts[:2]), parts[3], "/".join(parts[4:]))
            return
        self._count("unknown")
        self._error(404, "NotFound", f"no such route in the stand-in: {url.path}")

    def _tree(self, repo: str, rev: str, rel: str, query: dict[str, list[str]]) -> None:
        folder = self._repo(repo, rev)
        if folder is None:
            return
        full = os.path.join(folder, *rel.split("/")) if rel else folder
        if not self._safe(rel) or not os.path.isdir(full):
            self._error(404, "EntryNotFound", f"{rel} does not exist on {rev}")
            return
        recursive = query.get("recursive", ["false"])[0].lower() == "true"
        entries = []
        for d, subs, files in os.walk(full):
            for name in sorted(subs) + sorted(files):
                r = os.path.relpath(os.path.join(d, name), folder).replace(os.sep, "/")
                entries.append(self._entry(folder, r))
            if not recursive:
                break
        entries.sort(key=lambda e: e["path"])
        start = int(query.get("cursor", ["0"])[0])
        page = entries[start : start + PAGE]
        headers = {}
        if start + PAGE < len(entries):
            q = {k: v[0] for k, v in query.items()}
            q["cursor"] = str(start + PAGE)
            nxt = f"http://{self.headers['Host']}{urllib.parse.urlsplit(self.path).path}?{urllib.parse.urlencode(q)}"
            headers["Link"] = f'<{nxt}>; rel="next"'
        self._json(page, headers=headers)

    def _resolve(self, repo: str, rev: str, rel: str) -> None:
        folder = self._repo(repo, rev)
        if folder is None:
            self._count("resolve")
            return
        full = os.path.join(folder, *rel.split("/"))
        if not self._safe(rel) or not os.path.isfile(full):
            self._count("resolve")
            self._error(404, "EntryNotFound", f"{rel} does not exist on {rev}")
            return
        size = os.path.getsize(full)
        entry = self._entry(folder, rel)
        etag = entry["lfs"]["oid"] if "lfs" in entry else entry["oid"]
        start, end = 0, size - 1
        rng = self.headers.get("Range")
        status = 200
        if rng and rng.lower().startswith("bytes=") and self.command == "GET":
            a, _, b = rng[6:].partition("-")
            if a:
                start, end = int(a), (min(size - 1, int(b)) if b else size - 1)
            else:
                start = max(0, size - int(b))
            if start >= size:
                self._count("resolve")
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{size}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            status = 206
        n = max(0, end - start + 1)
        self.send_response(status)
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        self.send_header("Content-Length", str(n))
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("ETag", f'"{etag}"')
        self.send_header("X-Repo-Commit", COMMIT)
        if "lfs" in entry:
            self.send_header("X-Linked-Etag", f'"{etag}"')
            self.send_header("X-Linked-Size", str(size))
        self.end_headers()
        if self.command == "HEAD":
            self._count("resolve-head")
            return
        with open(full, "rb") as f:
            f.seek(start)
            body = f.read(n)
        self._count("resolve", len(body))
        self.wfile.write(body)


class Hub:
    """The stand-in server, started on a free 127.0.0.1 port (``with Hub(root) as hub``)."""

    def __init__(self, root: str) -> None:
        self.handler = type("H", (HubHandler,), {"root": root, "sent": 0, "counts": Counter(), "lock": threading.Lock()})
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), self.handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Hub:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def reset(self) -> None:
        with self.handler.lock:
            self.handler.sent = 0
            self.handler.counts = Counter()

    @property
    def sent(self) -> int:
        return int(self.handler.sent)

    @property
    def counts(self) -> Counter[str]:
        return self.handler.counts
