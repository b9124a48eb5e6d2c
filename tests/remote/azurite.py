"""Azurite, Microsoft's Azure Storage emulator, for the ``az://`` tests: its blob service
started on a free 127.0.0.1 port, in memory, and its access log read back as the count of
bytes it served (the oracle for "bytes fetched").

``bash scripts/setup.sh test`` installs Azurite with npm into the project's ignored
``.tools/`` folder; an ``azurite-blob`` on ``PATH`` is used when that folder has none.
"""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import time
from pathlib import Path

#: Azurite's development account: the name and key Microsoft publishes for the emulator
#: (https://learn.microsoft.com/azure/storage/common/storage-use-azurite), not a secret
ACCOUNT = "devstoreaccount1"
KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="

_ROOT = Path(__file__).resolve().parents[2]
#: one access-log line: ``127.0.0.1 - - [date] "GET /account/container/blob HTTP/1.1" 206 65536``
_LINE = re.compile(r'"([A-Z]+) (\S+) HTTP/[0-9.]+" (\d{3}) (\d+|-)')


def find() -> str | None:
    """The ``azurite-blob`` command, or None (with ``node`` missing too: it is a Node script)."""
    if shutil.which("node") is None:
        return None
    local = _ROOT / ".tools" / "node_modules" / ".bin" / "azurite-blob"
    if local.exists():
        return str(local)
    return shutil.which("azurite-blob")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Azurite:
    """A running Azurite blob service (in memory: nothing is kept after :meth:`stop`)."""

    def __init__(self, exe: str, workdir: Path) -> None:
        self.port = _free_port()
        self.log = workdir / "access.log"
        self._out = open(self.log, "wb")
        self.proc = subprocess.Popen(
            [
                exe,
                "--blobHost",
                "127.0.0.1",
                "--blobPort",
                str(self.port),
                "--inMemoryPersistence",
                "--disableTelemetry",
                "--skipApiVersionCheck",
                "--loose",
            ],
            cwd=workdir,
            stdin=subprocess.DEVNULL,
            stdout=self._out,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 60
        while b"successfully listens" not in self.log.read_bytes():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"Azurite did not start: {self.log.read_text(errors='replace')[-2000:]}")
            time.sleep(0.1)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}/{ACCOUNT}"

    @property
    def connection_string(self) -> str:
        return f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={KEY};BlobEndpoint={self.endpoint};"

    def requests(self) -> list[tuple[str, str, int, int]]:
        """``(method, path, status, body bytes)`` of every request served so far."""
        out = []
        for m in _LINE.finditer(self.log.read_text(errors="replace")):
            method, path, status, n = m.groups()
            out.append((method, path, int(status), 0 if n == "-" or method == "HEAD" else int(n)))
        return out

    def mark(self, *, settle: float = 0.3) -> int:
        """How many requests were served so far (see :meth:`served_since`). Azurite logs a
        request once its response has gone out, so the count is read until it stays the
        same for ``settle`` seconds: a late line of an earlier request is not counted as
        one made after the mark."""
        last = -1
        deadline = time.monotonic() + 10
        while True:
            n = len(self.requests())
            if n == last or time.monotonic() > deadline:
                return n
            last = n
            time.sleep(settle)

    def served_since(self, mark: int, *, settle: float = 0.3) -> tuple[int, int]:
        """``(bytes, GET requests)`` of blob bodies served after :meth:`mark` returned ``mark``.

        Azurite writes a request's log line when the response has gone out, so the count
        is read again until it stays the same for ``settle`` seconds.
        """
        last: tuple[int, int] | None = None
        deadline = time.monotonic() + 10
        while True:
            got = [
                r
                for r in self.requests()[mark:]
                if r[0] == "GET" and r[2] in (200, 206) and "comp=" not in r[1] and "restype=" not in r[1]
            ]
            now = (sum(r[3] for r in got), len(got))
            if now == last or time.monotonic() > deadline:
                return now
            last = now
            time.sleep(settle)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._out.close()


def setup_hint() -> str:
    return "Azurite is not installed (bash scripts/setup.sh test installs it into .tools/ with npm; needs Node.js)"


__all__ = ["ACCOUNT", "KEY", "Azurite", "find", "setup_hint"]
