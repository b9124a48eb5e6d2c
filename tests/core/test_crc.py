"""core/crc: the fast CRC-32 equals zlib's on every input, and saved files do not depend on
which backend computed their CRCs (torch.save's bytes are the oracle)."""

from __future__ import annotations

import io
import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import torchless
from torchless.container.zip import ZipReader
from torchless.io import crc


@pytest.fixture(params=["native", "zlib"])
def backend(request, monkeypatch):
    if request.param == "zlib":
        monkeypatch.setattr(crc, "_NATIVE", None)
    elif crc.backend() == "zlib":
        pytest.skip("no libdeflate on this machine: crc32 is zlib.crc32")
    return request.param


def test_crc32_equals_zlib(backend):
    rng = np.random.default_rng(0)
    sizes = [0, 1, 63, crc.NATIVE_MIN - 1, crc.NATIVE_MIN, crc.NATIVE_MIN + 1, 200_003, (1 << 20) + 5]
    for n in sizes:
        raw = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        for value in (0, 1, 0xDEADBEEF, 0xFFFFFFFF):
            want = zlib.crc32(raw, value)
            assert crc.crc32(raw, value) == want, (n, value)
            assert crc.crc32(bytearray(raw), value) == want
            assert crc.crc32(memoryview(raw), value) == want
        # typed and multi-dimensional buffers count their bytes, as zlib does
        if n % 4 == 0 and n:
            arr = np.frombuffer(raw, np.float32).reshape(-1, 1) if n >= 4 else np.frombuffer(raw, np.float32)
            assert crc.crc32(arr) == zlib.crc32(raw)
            assert crc.crc32(memoryview(arr)) == zlib.crc32(raw)
        # chained over slices, as the writer feeds chunks
        mv = memoryview(raw)
        run = 0
        for i in range(0, n, 70_001):
            run = crc.crc32(mv[i : i + 70_001], run)
        assert run == zlib.crc32(raw)


def test_crc32_spans_equals_zlib_of_each_slice(backend):
    """Spans of one buffer (a mapped file's records) on both sides of SPAN_NATIVE_MIN,
    at odd offsets, empty, and reaching the buffer's end: zlib.crc32 of each slice."""
    rng = np.random.default_rng(3)
    raw = rng.integers(0, 256, 300_000, dtype=np.uint8).tobytes()
    lo = crc.SPAN_NATIVE_MIN
    spans = [(0, 0), (1, 1), (7, lo - 1), (100, lo), (5000, lo + 1), (3, 70_000), (len(raw) - 9000, 9000), (len(raw), 0)]
    offs, sizes = [o for o, _ in spans], [n for _, n in spans]
    want = [zlib.crc32(raw[o : o + n]) for o, n in spans]
    for buf in (raw, bytearray(raw), memoryview(raw), np.frombuffer(raw, np.uint8)):
        assert crc.crc32_spans(buf, offs, sizes) == want


@pytest.mark.parametrize("span", [(-1, 5), (0, 300_001), (299_999, 2), (10, -1)])
def test_crc32_spans_refuses_a_span_outside_the_buffer(span):
    """Nothing outside the buffer is read (libdeflate would read whatever lies there)."""
    with pytest.raises(ValueError, match="outside"):
        crc.crc32_spans(bytes(300_000), [0, span[0]], [10, span[1]])


def test_forcing_zlib_by_environment(monkeypatch):
    monkeypatch.setenv("TORCHLESS_CRC", "zlib")
    assert crc._load_libdeflate() is None


def test_large_records_match_torch_save(backend, tmp_path):
    """Storages past the native threshold, the parallel-CRC size and a 16 MiB chunk boundary:
    every record's CRC and bytes are torch.save's."""
    torch = pytest.importorskip("torch", reason="torch.save is the oracle")
    g = torch.Generator().manual_seed(0)
    obj = {
        "a": torch.randn(70_000 // 4, generator=g),  # 68 KiB: the direct-write path
        "b": torch.randn(3, 1 << 18, generator=g).to(torch.bfloat16),  # 1.5 MiB: CRC on the thread
        "c": torch.randint(0, 255, ((16 << 20) + 77,), generator=g, dtype=torch.uint8),  # two chunks
        "d": torch.ones(5),
    }
    a, b = tmp_path / "m.pt", tmp_path / "tl" / "m.pt"
    b.parent.mkdir()
    torch.save(obj, a)
    torchless.save(obj, b)
    za, zb = ZipReader(a), ZipReader(b)
    assert za.names() == zb.names()
    for ea, eb in zip(za.entries, zb.entries, strict=True):
        if ea.name.endswith("serialization_id"):
            continue
        assert (ea.header_offset, ea.size, ea.crc) == (eb.header_offset, eb.size, eb.crc), ea.name
        assert ea.crc == zlib.crc32(zb.read_bytes(eb)), ea.name
    buf = io.BytesIO()
    torchless.save(obj, buf)
    assert torch.load(io.BytesIO(buf.getvalue()), weights_only=True)["c"].equal(obj["c"])


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300), st.binary(max_size=300), st.integers(0, 2**32 - 1))
def test_crc32_combine_is_zlibs_crc_of_the_concatenation(a, b, seed):
    """The range tasks' CRCs joined by crc32_combine are zlib.crc32 of the whole file
    (zlib is the oracle), whatever the lengths (an empty part included)."""
    assert crc.crc32_combine(zlib.crc32(a, seed), zlib.crc32(b), len(b)) == zlib.crc32(a + b, seed)


def test_crc32_combine_of_large_parts():
    rng = np.random.default_rng(1)
    parts = [rng.integers(0, 256, n, dtype=np.uint8).tobytes() for n in (1, (1 << 20) + 3, 4096, 0, 77_777)]
    c = 0
    for p in parts:
        c = crc.crc32_combine(c, zlib.crc32(p), len(p))
    assert c == zlib.crc32(b"".join(parts))
