"""ExecuTorch programs (.pte) at URLs (``memory://``, an HTTP range server, moto's S3
server): ``info`` / ``ls`` / ``scan`` print what they print for the local copy, ``convert``
writes the same bytes, and ``info`` / ``ls`` / ``scan`` fetch the flatbuffer program (and
a few blocks), never the constant segment.

The programs are executorch's (``samples/executorch``, written by executorch 1.5.1); the
expected tensor bytes are what executorch's own deserializer read from them (the ``.json``
beside each). To make "the constant segment is not fetched" measurable, :func:`_grow`
puts 4 MiB in front of the constants inside mlp.pte's constant segment (every offset
into the segment and the sizes that cover it are moved by as much), so the constants lie
4 MiB past the program.
"""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest

from torchless.io import remote

from .test_remote import _cli

SAMPLES = Path(__file__).resolve().parents[2] / "samples" / "executorch"
PAD = 4 << 20
_DTYPES = {0: "uint8", 1: "int8", 2: "int16", 3: "int32", 4: "int64", 5: "float16", 6: "float32", 7: "float64", 11: "bool"}


def _grow(data: bytes, pad: int) -> bytes:
    """mlp.pte with ``pad`` bytes at the start of its (only) data segment, the constant
    segment: the DataSegment size, the extended header's segment data size and every
    constant offset move by ``pad``. Positions come from the flatbuffer wire format."""
    from torchless.container.flatbuffer import FlatBuffer
    from torchless.formats.executorch.spec import P

    fb = FlatBuffer(data, "mlp.pte")
    root = fb.root()
    (seg,) = root.tables(P.PROGRAM_SEGMENTS)
    assert seg.scalar(P.SEGMENT_OFFSET, "Q") == 0
    size_pos = seg.field(P.SEGMENT_SIZE, 8)
    cs = root.table(P.PROGRAM_CONSTANT_SEGMENT)
    assert cs is not None and cs.scalar(P.SUBSEG_INDEX, "I") == 0
    start, n = cs.vector_pos(P.SUBSEG_OFFSETS, 8)
    base = struct.unpack_from("<Q", data, 24)[0]
    out = bytearray(data[:base]) + bytes(range(256)) * (pad // 256) + data[base:]
    struct.pack_into("<Q", out, size_pos, struct.unpack_from("<Q", data, size_pos)[0] + pad)
    struct.pack_into("<Q", out, 32, struct.unpack_from("<Q", data, 32)[0] + pad)  # segment data size
    for i in range(n):
        p = start + 8 * i
        struct.pack_into("<Q", out, p, struct.unpack_from("<Q", data, p)[0] + pad)
    return bytes(out)


def _expected(name: str) -> dict[str, bytes]:
    """name -> the constant's bytes as executorch's deserializer read them (the oracle)."""
    exp = json.loads((SAMPLES / f"{name}.json").read_text())
    out = {}
    for plan in exp["plans"]:
        for c in plan["constants"]:
            numel = int(np.prod(c["sizes"], dtype=np.int64)) if c["sizes"] else 1
            nb = numel * np.dtype(_DTYPES[c["scalar_type"]]).itemsize
            out[c["name"] or f"{plan['name']}.values.{c['value']}"] = bytes.fromhex(c["hex"])[:nb]
    return out


@pytest.fixture(scope="module")
def programs(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("pte")
    out = {}
    for name in ("mlp", "dynamic", "xnnpack"):
        shutil.copy(SAMPLES / f"{name}.pte", d / f"{name}.pte")
        out[name] = d / f"{name}.pte"
    (d / "big.pte").write_bytes(_grow((SAMPLES / "mlp.pte").read_bytes(), PAD))
    out["big"] = d / "big.pte"
    return out


@pytest.fixture
def put(request):
    """``put(local file, backend) -> (url, http handler or None)``."""

    def place(local: Path, backend: str):
        if backend == "memory":
            fs, base = request.getfixturevalue("memfs")
            fs.pipe(f"{base}/{local.name}", local.read_bytes())
            return f"memory://{base}/{local.name}", None
        if backend == "http":
            root, url, handler = request.getfixturevalue("http_root")
            shutil.copy(local, root / local.name)
            return f"{url}/{local.name}", handler
        base, client = request.getfixturevalue("s3")
        client.put_object(Bucket=base[5:], Key=local.name, Body=local.read_bytes())
        return f"{base}/{local.name}", None

    return place


def test_grown_program_keeps_executorchs_constants(programs, tmp_path, capsys):
    """The test file itself: the grown program holds executorch's constants, 4 MiB on."""
    big = programs["big"]
    assert big.stat().st_size == (SAMPLES / "mlp.pte").stat().st_size + PAD
    code, _out, err = _cli(capsys, "convert", str(big), str(tmp_path / "c.npz"))
    assert code == 0, err
    with np.load(tmp_path / "c.npz") as z:
        assert {k: z[k].tobytes() for k in z.files} == _expected("mlp")


@pytest.mark.parametrize("backend", ["memory", "http", "s3"])
@pytest.mark.parametrize("name", ["mlp", "dynamic", "xnnpack", "big"])
def test_pte_at_url_matches_local(programs, put, tmp_path, capsys, backend, name):
    local = programs[name]
    url, handler = put(local, backend)
    total = local.stat().st_size
    for cmd in (["info"], ["info", "--json"], ["ls"], ["ls", "--json"], ["scan"], ["verify"]):
        if handler is not None:
            handler.sent = 0
        c1, o1, e1 = _cli(capsys, *cmd, str(local))
        c2, o2, e2 = _cli(capsys, *cmd, url)
        fetched = remote.STATS.bytes_fetched
        assert c1 == c2 and c1 in (0, 1), (cmd, e1, e2)
        assert o1.replace(str(local), "<p>") == o2.replace(url, "<p>"), cmd
        if handler is not None:  # --stats's counter is what the server sent
            assert fetched == handler.sent, cmd
        if name == "big" and cmd[0] in ("info", "ls"):
            # the program and its header block: never the 4 MiB in front of the constants
            assert 0 < fetched < (128 << 10), (cmd, fetched, total)
        elif name == "big" and cmd[0] == "scan":  # the program, and the probes' blocks at the ends
            assert 0 < fetched < (256 << 10), (cmd, fetched, total)
        elif cmd[0] == "verify":
            assert fetched > 0, cmd  # the constants, by range (the padding before them is no tensor's)
    want, got = tmp_path / "local.npz", tmp_path / "remote.npz"
    c1, _o, e1 = _cli(capsys, "convert", str(local), str(want))
    c2, _o, e2 = _cli(capsys, "convert", url, str(got))
    assert c1 == c2 == 0, (e1, e2)
    assert got.read_bytes() == want.read_bytes()
    with np.load(got) as z:
        assert {k: z[k].tobytes() for k in z.files} == _expected("mlp" if name == "big" else name)
