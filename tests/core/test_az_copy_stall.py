"""An Azure server-side copy that never progresses is given up after the stall timeout
(and aborted), so a publish waiting on it with signals held cannot wait forever; one that
progresses is waited for however long it takes."""

from __future__ import annotations

import asyncio
import types

import pytest

from torchless.io.cloud import azure


class _Target:
    def __init__(self, steps: list[tuple[str, str]]) -> None:
        self.steps = steps  # (status, progress) answered in turn, the last one forever
        self.aborted: list[str] = []

    async def start_copy_from_url(self, url: str) -> dict:
        return {"copy_status": "pending"}

    async def get_blob_properties(self) -> types.SimpleNamespace:
        status, progress = self.steps.pop(0) if len(self.steps) > 1 else self.steps[0]
        return types.SimpleNamespace(copy=types.SimpleNamespace(status=status, progress=progress, id="copy-1"))

    async def abort_copy(self, copy_id: str) -> None:
        self.aborted.append(copy_id)


def _fs(target: _Target) -> types.SimpleNamespace:
    service = types.SimpleNamespace(get_blob_client=lambda c, k: target if k == "dst" else object())
    return types.SimpleNamespace(split_path=lambda p: ("c", p, None), service_client=service)


@pytest.fixture(autouse=True)
def _no_auth(monkeypatch):
    monkeypatch.setattr(azure, "source_auth", lambda fs: None)
    monkeypatch.setattr(azure, "source_url", lambda fs, client, auth: "https://example.invalid/src")


def test_a_copy_without_progress_is_aborted_after_the_stall_timeout(monkeypatch):
    monkeypatch.setenv("TORCHLESS_STALL_TIMEOUT", "1")
    target = _Target([("pending", "0/100")])
    with pytest.raises(OSError, match="made no progress for 1 s"):
        asyncio.run(asyncio.wait_for(azure.copy(_fs(target), "src", "dst"), timeout=30))
    assert target.aborted == ["copy-1"]


def test_a_progressing_copy_is_waited_for(monkeypatch):
    monkeypatch.setenv("TORCHLESS_STALL_TIMEOUT", "1")
    steps = [("pending", f"{i}/10") for i in range(8)] + [("success", "10/10")]
    target = _Target(steps)
    asyncio.run(asyncio.wait_for(azure.copy(_fs(target), "src", "dst"), timeout=60))
    assert target.aborted == []
