"""Servers for the remote tests, on 127.0.0.1 only: moto's S3 server and an HTTP server
that honours Range requests (and counts the bytes it sent: the oracle for "bytes fetched")."""

from __future__ import annotations

import http.server
import os
import socket
import threading
import uuid

import pytest

fsspec = pytest.importorskip("fsspec", reason="the remote extra (fsspec) is not installed")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RangeHandler(http.server.SimpleHTTPRequestHandler):
    """Static files with single-range support; counts body bytes and requests, and keeps
    the largest body sent (one request's size)."""

    sent = 0
    requests = 0
    largest = 0

    def log_message(self, *a: object) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802
        path = self.translate_path(self.path)
        if not os.path.isfile(path):
            self.send_error(404)
            return
        size = os.path.getsize(path)
        rng = self.headers.get("Range")
        start, end = 0, size - 1
        if rng and rng.startswith("bytes="):
            a, _, b = rng[6:].partition("-")
            if a:
                start = int(a)
                end = min(size - 1, int(b)) if b else size - 1
            else:
                start = max(0, size - int(b))
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        else:
            self.send_response(200)
        n = max(0, end - start + 1)
        self.send_header("Content-Length", str(n))
        self.send_header("Accept-Ranges", "bytes")
        self.end_headers()
        with open(path, "rb") as f:
            f.seek(start)
            body = f.read(n)
        type(self).sent += len(body)
        type(self).requests += 1
        type(self).largest = max(type(self).largest, len(body))
        self.wfile.write(body)

    def do_HEAD(self) -> None:  # noqa: N802
        path = self.translate_path(self.path)
        if not os.path.isfile(path):
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(os.path.getsize(path)))
        self.send_header("Accept-Ranges", "bytes")
        self.end_headers()


@pytest.fixture
def http_root(tmp_path):
    """``(folder served, base URL, handler class with counters)``."""
    root = tmp_path / "www"
    root.mkdir()

    class H(RangeHandler):
        sent = 0
        requests = 0
        largest = 0

        def __init__(self, *a, **kw):
            super().__init__(*a, directory=str(root), **kw)

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield root, f"http://127.0.0.1:{srv.server_address[1]}", H
    finally:
        srv.shutdown()
        srv.server_close()


class S3Traffic:
    """What moto's server received (``(method, key path, query, copy source)`` per
    request), and a gate: ``hold(pred)`` makes the first request matching ``pred`` wait
    in the server, so a test can act (signal the client, look at the bucket) while that
    request is in flight; ``hit`` is set when it arrives, ``release()`` lets it go on
    (``fail=True``: answered with an S3 error instead)."""

    def __init__(self) -> None:
        self.log: list[tuple[str, str, str, str]] = []
        self.pred = None
        self.hit = threading.Event()
        self.go = threading.Event()
        self.fail = False
        self.on = False

    def reset(self, on: bool = False) -> None:
        self.on = on
        self.log = []
        self.pred = None
        self.hit = threading.Event()
        self.go = threading.Event()
        self.fail = False

    def hold(self, pred) -> None:
        self.pred = pred

    def release(self, *, fail: bool = False) -> None:
        self.fail = fail
        self.go.set()

    def middleware(self, app):
        def wrapped(environ, start_response):
            if not self.on:
                return app(environ, start_response)
            req = (
                environ["REQUEST_METHOD"],
                environ.get("PATH_INFO") or "",
                environ.get("QUERY_STRING") or "",
                environ.get("HTTP_X_AMZ_COPY_SOURCE") or "",
            )
            self.log.append(req)
            pred = self.pred
            if pred is not None and pred(req):
                self.pred = None
                self.hit.set()
                self.go.wait(60)
                if self.fail:
                    body = b"<?xml version='1.0'?><Error><Code>AccessDenied</Code><Message>injected</Message></Error>"
                    start_response("403 Forbidden", [("Content-Type", "application/xml"), ("Content-Length", str(len(body)))])
                    return [body]
            return app(environ, start_response)

        return wrapped


TRAFFIC = S3Traffic()


@pytest.fixture(scope="session")
def s3_server():
    """moto's standalone S3 server on a free 127.0.0.1 port, its requests seen by
    :data:`TRAFFIC`; the endpoint URL."""
    pytest.importorskip("s3fs", reason="s3fs is not installed")
    pytest.importorskip("boto3", reason="moto[server] is not installed")
    server_mod = pytest.importorskip("moto.server", reason="moto[server] is not installed")
    from moto.moto_server import threaded_moto_server as tms

    class Server(server_mod.ThreadedMotoServer):
        def _server_entry(self) -> None:  # ThreadedMotoServer's, with the app wrapped
            app = TRAFFIC.middleware(tms.DomainDispatcherApplication(tms.create_backend_app))
            self._server = tms.make_server(self._ip_address, self._port, app, True, request_handler=tms.MotoRequestHandler)
            self._server_ready_event.set()
            self._server.serve_forever()

    port = _free_port()
    srv = Server(ip_address="127.0.0.1", port=port, verbose=False)
    srv.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        srv.stop()


@pytest.fixture
def s3_traffic(s3):
    """:data:`TRAFFIC`, emptied, for a test that counts or holds requests."""
    TRAFFIC.reset(on=True)
    yield TRAFFIC
    TRAFFIC.release()
    TRAFFIC.reset()


@pytest.fixture
def s3(s3_server, monkeypatch):
    """A fresh bucket; yields ``(s3://bucket URL, boto3 client)``. Credentials and the
    endpoint come from the standard AWS environment variables."""
    import boto3

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server)
    for k in ("AWS_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(k, raising=False)
    bucket = "tl-" + uuid.uuid4().hex[:12]
    client = boto3.client("s3", endpoint_url=s3_server)
    client.create_bucket(Bucket=bucket)
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()
    yield f"s3://{bucket}", client


@pytest.fixture
def memfs():
    """fsspec's in-memory filesystem, emptied after the test."""
    fs = fsspec.filesystem("memory")
    base = "/t-" + uuid.uuid4().hex[:10]
    yield fs, base
    try:
        fs.rm(base, recursive=True)
    except FileNotFoundError:
        pass
