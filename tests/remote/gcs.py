"""A Google Cloud Storage emulator on 127.0.0.1, for ``gs://`` tests: the JSON API of the
PyPI package ``gcp-storage-emulator`` (objects kept in memory), served by a handler that
logs each request, counts the body bytes of media downloads (the oracle for "bytes
fetched"), records the order objects are created in, can hold or fail one request, and
reports handler errors instead of printing them (a client closing a connection it no
longer needs is not one).

What the emulator implements that gcsfs uses: bucket and object metadata, listings with
a delimiter, media downloads with ``Range: bytes=START-END`` (not the suffix form
``bytes=-N``, which torchless does not send), one-request (multipart) uploads and
resumable upload sessions, copies and deletes. What it lacks, and this module stands in
for:

* ``DELETE`` of a resumable session's URL (what gcsfs sends when a chunk failed, to
  cancel the session): 501 there, which gcsfs retries for half a minute; here the
  session is dropped and the answer is GCS's 499;
* ``objects.move`` (``POST .../o/{object}/moveTo/o/{destination}``, what gcsfs's ``mv``
  calls; torchless moves range tasks' staged files into place with it): 501 there,
  retried, then gcsfs copies and deletes; here a copy and a delete in one request.

Not stood in for: the gRPC Storage Control API (``getStorageLayout``) that gcsfs's
default class, ``ExtendedGcsFileSystem``, calls to tell hierarchical and zonal buckets
from flat ones. The emulator does not speak gRPC, and gcsfs retries that call for 60 s
on every operation before it falls back to its JSON-API class, ``GCSFileSystem``, the
class it uses for flat buckets: :func:`plain_gcsfs` gives that class, which the tests
register for ``gs://`` (``GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false`` does the same when it
is set before gcsfs is imported).
"""

from __future__ import annotations

import functools
import http.server
import json
import re
import threading
import urllib.parse
import urllib.request
from typing import Any


class Traffic:
    """Requests the emulator received, ``(method, path, query, Range header)`` each,
    unquoted; ``sent``: body bytes of media downloads; ``created``: the objects created,
    ``gs://bucket/key`` each, in the order they appeared. ``hold(pred)`` makes the first
    request matching ``pred`` wait in the server until ``release()`` (``fail=True``: it
    is then answered 403, which gcsfs does not retry, instead of being served); ``hit`` is set when it arrives."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.log: list[tuple[str, str, str, str]] = []
        self.sent = 0
        self.downloads = 0
        self.created: list[str] = []
        self.errors: list[BaseException] = []
        self.pred: Any = None
        self.hit = threading.Event()
        self.go = threading.Event()
        self.fail = False

    def hold(self, pred: Any) -> None:
        self.pred = pred

    def release(self, *, fail: bool = False) -> None:
        self.fail = fail
        self.go.set()


#: ``POST /storage/v1/b/{bucket}/o/{object}/moveTo/o/{destination}`` (names %-quoted)
_MOVE = re.compile(r"^/storage/v1/b/([-.\w]+)/o/([^/]+)/moveTo/o/([^/]+)$")


def _handler(storage: Any, traffic: Traffic) -> Any:
    from gcp_storage_emulator.server import RequestHandler, Router

    class Handler(RequestHandler):
        def log_message(self, *a: object) -> None:
            pass

        _media = False
        _status = 0

        def send_response(self, code: int, message: str | None = None) -> None:
            self._status = code
            super().send_response(code, message)

        def send_header(self, keyword: str, value: str) -> None:
            # counted before the body is written: a client that has the bytes finds them counted
            if self._media and keyword.lower() == "content-length" and self._status in (200, 206):
                traffic.sent += int(value)
                traffic.downloads += 1
            super().send_header(keyword, value)

        def _serve(self, method: str) -> None:
            parts = urllib.parse.urlsplit(self.path)
            req = (method, urllib.parse.unquote(parts.path), urllib.parse.unquote(parts.query), self.headers.get("Range") or "")
            traffic.log.append(req)
            pred = traffic.pred
            if pred is not None and pred(req):
                traffic.pred = None
                traffic.hit.set()
                traffic.go.wait(60)
                if traffic.fail:
                    self.rfile.read(int(self.headers.get("Content-Length") or 0))
                    self._answer(403, {"error": {"code": 403, "message": "injected"}})
                    return
            if method == "DELETE" and parts.path.startswith("/upload/"):
                # cancel a resumable upload session (the emulator has no route: 501)
                uid = urllib.parse.parse_qs(parts.query).get("upload_id", [""])[0]
                if storage.resumable.pop(uid, None) is None:
                    self._answer(404, {"error": {"code": 404, "message": "no such upload"}})
                    return
                storage._delete_file("_resumable", storage.safe_id(uid))
                self._answer(499, {})  # what GCS answers a cancelled session
                return
            move = _MOVE.match(parts.path) if method == "POST" else None
            if move:  # objects.move (the emulator has no route: 501): a copy and a delete, in one request
                from gcp_storage_emulator.exceptions import NotFound
                from gcp_storage_emulator.handlers.objects import _copy

                bucket, src, dst = (urllib.parse.unquote(g) for g in move.groups())
                try:
                    obj = _copy(f"http://{self.headers.get('Host')}", storage, bucket, src, bucket, dst)
                    storage.delete_file(bucket, src)
                except NotFound:
                    self._answer(404, {"error": {"code": 404, "message": "no such object"}})
                    return
                self._answer(200, obj)
                return
            self._media = method == "GET" and (parts.path.startswith("/download/") or "alt=media" in parts.query)
            Router(self).handle(method)

        def _answer(self, code: int, obj: Any) -> None:
            body = json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:  # noqa: N802
            self._serve("GET")

        def do_POST(self) -> None:  # noqa: N802
            self._serve("POST")

        def do_PUT(self) -> None:  # noqa: N802
            self._serve("PUT")

        def do_DELETE(self) -> None:  # noqa: N802
            self._serve("DELETE")

        def do_PATCH(self) -> None:  # noqa: N802
            self._serve("PATCH")

    return functools.partial(Handler, storage)


class Emulator:
    """The emulator on a free 127.0.0.1 port (``with Emulator() as gcs:``); ``endpoint``
    is what ``STORAGE_EMULATOR_HOST`` takes, ``storage`` the emulator's store (read
    directly by the tests: what the server holds)."""

    def __init__(self) -> None:
        from gcp_storage_emulator.storage import Storage

        self.storage = Storage(use_memory_fs=True)
        self.traffic = Traffic()
        traffic = self.traffic
        create = self.storage.create_file

        def create_file(bucket_name: str, file_name: str, *a: Any, **kw: Any) -> Any:
            out = create(bucket_name, file_name, *a, **kw)
            traffic.created.append(f"gs://{bucket_name}/{file_name}")
            return out

        self.storage.create_file = create_file

        class Server(http.server.HTTPServer):
            def handle_error(self, request: Any, client_address: Any) -> None:
                import sys

                e = sys.exc_info()[1]
                if not isinstance(e, ConnectionError):  # a client that stopped reading is not an error
                    traffic.errors.append(e)  # type: ignore[arg-type]

        self.server = Server(("127.0.0.1", 0), _handler(self.storage, traffic))
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Emulator:
        self.thread.start()
        return self

    def __exit__(self, *a: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    # -- the tests' own access (not through gcsfs) ------------------------------------
    def create_bucket(self, name: str) -> None:
        from gcp_storage_emulator.handlers.buckets import create_bucket

        create_bucket(name, self.storage)

    def put(self, url: str, data: bytes) -> None:
        """Upload ``data`` as object ``gs://bucket/key`` with a media upload (urllib)."""
        bucket, _, key = url[5:].partition("/")
        q = urllib.parse.urlencode({"uploadType": "media", "name": key})
        req = urllib.request.Request(
            f"{self.endpoint}/upload/storage/v1/b/{bucket}/o?{q}",
            data=data,
            method="POST",
            headers={"Content-Type": "application/octet-stream"},
        )
        with urllib.request.urlopen(req, timeout=60) as r:
            assert r.status == 200, r.status

    def get(self, url: str) -> bytes:
        bucket, _, key = url[5:].partition("/")
        return bytes(self.storage.get_file(bucket, key, show_error=False))

    def keys(self, url: str) -> list[str]:
        """Names of the objects under folder ``url``, relative to it."""
        bucket, _, prefix = url[5:].partition("/")
        prefix = prefix.rstrip("/") + "/" if prefix else ""
        objs, _ = self.storage.get_file_list(bucket, prefix=prefix or None)
        return sorted(o["name"][len(prefix) :] for o in objs)

    def uploads(self) -> dict[str, Any]:
        """Resumable upload sessions not finished (nor cancelled)."""
        return dict(self.storage.resumable)


def plain_gcsfs() -> Any:
    """gcsfs's JSON-API filesystem class (not ``ExtendedGcsFileSystem``: see the module
    docstring)."""
    import gcsfs.core

    return gcsfs.core.GCSFileSystem
