"""The atomic file's ``writev``: the same bytes as one ``write`` of each buffer, whatever
the system call takes at a time, and the same errors and fault-injection count."""

from __future__ import annotations

import os

import pytest

import torchless.io.atomic as atomic
from torchless.core.errors import WriteError
from torchless.io.atomic import FAULT_ENV, AtomicFile

needs_writev = pytest.mark.skipif(not hasattr(os, "writev"), reason="no os.writev here")


def _bufs(n: int) -> list:
    data = bytes(range(256)) * 40
    return [data[i % 97 : i % 97 + 1 + i % 301] if i % 3 else memoryview(data)[i % 50 : 200 + i] for i in range(n)]


@needs_writev
@pytest.mark.parametrize("step", [None, 1, 7, 1000])
def test_writev_writes_what_write_writes(tmp_path, monkeypatch, step):
    """Many more buffers than one call takes, after buffered bytes; short writes of
    ``step`` bytes go on where they stopped."""
    if step is not None:
        real = os.writev
        monkeypatch.setattr(atomic.os, "writev", lambda fd, bufs: real(fd, [b"".join(bufs)[:step]]))
    bufs = _bufs(3 * atomic.IOV_MAX + 5)
    a = AtomicFile(tmp_path / "a.bin")
    a.file.write(b"head")
    assert a.file.writev(bufs) == sum(len(b) for b in bufs)
    assert a.file.tell() == 4 + sum(len(b) for b in bufs)  # the buffered file knows where it is
    a.file.write(b"tail")
    a.commit()
    assert (tmp_path / "a.bin").read_bytes() == b"head" + b"".join(bufs) + b"tail"


@needs_writev
def test_writev_fault_is_a_write_error(tmp_path, monkeypatch):
    monkeypatch.setenv(FAULT_ENV, "100:ENOSPC")
    a = AtomicFile(tmp_path / "a.bin")
    with pytest.raises(WriteError) as e:
        a.file.writev(_bufs(10))
    assert str(tmp_path / "a.bin") in str(e.value)
    a.abort()
    assert os.listdir(tmp_path) == []
