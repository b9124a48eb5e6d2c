"""AOTInductor packages whose constants are linked into the compiled binary (a ``.so``, or
the ``.o`` of a ``package_cpp_only`` build), at URLs: the binary is read by ranges (its
header, section table, section names and symbol tables), never fetched whole, and each
constant's ``numpy()`` fetches its own range. The local copy is the reference for the
output; the arrays the synthetic packages were built from, and torch's state dict for the
compiled ones, are the oracles of the bytes. The HTTP server counts what it sent."""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

import numpy as np
import pytest

import torchless
from torchless.container.zip import ZipReader
from torchless.io import remote

from .test_remote import _cli
from .test_remote_formats import _same, place  # noqa: F401 - place is a fixture

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from formats.aoti.conftest import aoti_packages, package  # noqa: E402, F401 - fixtures
from formats.aoti.synth import STEM, blob, make_elf, make_package, sample_consts  # noqa: E402
from formats.aoti.synth_bin import make_macho, make_pe  # noqa: E402

BACKENDS = ("memory", "http", "s3")
D = "data/aotinductor/model/"
BLOCK = 1 << 16  # RemoteSource's cache block


def _consts() -> dict[str, np.ndarray]:
    consts = sample_consts()
    consts["big"] = np.arange(1 << 20, dtype=np.float32)  # 4 MiB that info / ls must not fetch
    consts["tail"] = np.arange(300, dtype=np.int16)
    return consts


def _binary(path: Path) -> tuple[str, int]:
    zr = ZipReader(path)
    try:
        (e,) = [e for e in zr.entries if e.name.endswith((".so", ".o", ".pyd"))]
        assert e.method == 0  # torch's writer stores records: they have byte ranges
        return e.name.split("/", 1)[1], e.size
    finally:
        zr.close()


#: Mach-O (thin, universal) and PE libraries, as a macOS / Windows build would package them
FOREIGN = {
    "macho": (f"{STEM}.wrapper.so", make_macho),
    "fat": (f"{STEM}.wrapper.so", lambda b: make_macho(b, fat=True)),
    "pe": (f"{STEM}.wrapper.pyd", make_pe),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("layout", ["embedded", "object", *FOREIGN])
def test_linked_constants_are_read_by_range(tmp_path, place, capsys, backend, layout):  # noqa: F811
    consts = _consts()
    (tmp_path / "p").mkdir()
    if layout in FOREIGN:
        lib, make = FOREIGN[layout]
        local = make_package(tmp_path / "p" / "p.pt2", consts, layout="none", extra={D + lib: make(blob(consts))})
    else:
        local = make_package(tmp_path / "p" / "p.pt2", consts, layout=layout)
    _rec, so_size = _binary(local)
    url, _base, handler = place(local, backend)
    for cmd in (["info"], ["ls"], ["info", "--json"], ["ls", "--json"]):
        if handler is not None:
            handler.sent = 0
        code, fetched, err = _same(capsys, str(local), url, *cmd)
        assert code == 0, err
        if handler is not None:
            assert fetched == handler.sent, cmd
        # the zip directory, the sources, the binary's header and tables: a few blocks
        assert 0 < fetched <= 6 * BLOCK < so_size // 8, (cmd, fetched, so_size)
    remote.SHARED_BLOCKS.clear()
    remote.STATS.reset()
    with torchless.open(url) as art, torchless.open(local) as loc:
        opened = remote.STATS.bytes_fetched
        assert 0 < opened <= 6 * BLOCK, opened
        got, want = dict(art.tensors()), dict(loc.tensors())
        assert set(got) == set(want) == set(consts)
        for k, a in consts.items():
            remote.STATS.reset()
            if handler is not None:
                handler.sent = 0
            arr = got[k].numpy()
            n = remote.STATS.bytes_fetched
            if handler is not None:
                assert n == handler.sent, k
            assert arr.dtype == a.dtype and arr.shape == a.shape, k
            assert arr.tobytes() == np.ascontiguousarray(a).tobytes() == want[k].numpy().tobytes(), k
            if a.nbytes >= 1 << 20:
                assert n == a.nbytes, (k, n)  # exactly its range (a direct read)
            else:
                assert n <= 2 * BLOCK, (k, n)  # its range, in the blocks that hold it


def _lying(kind: str, payload: bytes) -> bytes:
    """A shared object whose section table lies: ``far`` (e_shoff past the end), ``cut``
    (the file ends inside the table), ``count`` (65535 sections), ``symtab`` (a symbol
    table that runs past the end), ``names`` (the section-name table past the end)."""
    so = bytearray(make_elf(payload))
    shoff = struct.unpack_from("<Q", so, 40)[0]
    if kind == "far":
        struct.pack_into("<Q", so, 40, 1 << 40)
    elif kind == "cut":
        so = so[: shoff + 100]
    elif kind == "count":
        struct.pack_into("<H", so, 60, 0xFFFF)
    elif kind == "symtab":  # section 2 (.dynsym): size
        struct.pack_into("<Q", so, shoff + 2 * 64 + 32, 1 << 40)
    elif kind == "names":  # section 4 (.shstrtab): offset
        struct.pack_into("<Q", so, shoff + 4 * 64 + 24, len(so) - 4)
    return bytes(so)


@pytest.mark.parametrize("backend", ["memory", "http"])
@pytest.mark.parametrize("kind", ["far", "cut", "count", "symtab", "names"])
def test_lying_section_table_at_url(tmp_path, place, capsys, backend, kind):  # noqa: F811
    """A truncated or lying section table is reported as locally (one error naming the
    file, the member and the offset, in info's binaries), after a bounded fetch: no read
    past the end, no allocation the size of a lying field."""
    consts = _consts()
    so = _lying(kind, blob(consts))
    (tmp_path / "p").mkdir()
    rec = D + f"{STEM}.wrapper.so"
    local = make_package(tmp_path / "p" / "p.pt2", consts, layout="none", extra={rec: so})
    url, _base, handler = place(local, backend)
    for cmd in (["info"], ["ls"], ["info", "--json"], ["verify"]):
        code, fetched, err = _same(capsys, str(local), url, *cmd)
        assert "Traceback" not in err
        if cmd[0] != "verify":
            assert code == 0, err
            assert 0 < fetched <= 6 * BLOCK < len(so) // 8, (cmd, fetched)
        else:
            assert code == 1  # verify reports the binary
    code, out, err = _cli(capsys, "info", url, "--json")
    (binary,) = json.loads(out)["models_detail"]["model"]["binaries"].values()
    if kind in ("far", "cut", "count"):
        msg = binary["error"]
        assert url in msg and f"member 'pkg/{rec}'" in msg and "offset" in msg, msg
        assert "section header table lies outside the file" in msg or "too many" in msg, msg
    elif kind == "symtab":
        assert "error" not in binary and any("runs past the end" in p for p in binary["problems"]), binary
    else:  # no section names: the tables are still found by their types
        assert "error" not in binary and binary["constants_blob"] is not None, binary
    with torchless.open(url) as art:
        if kind in ("far", "cut", "count"):
            assert dict(art.tensors()) == {}


# -- compiled by torch (AOTInductor on CPU; tests/formats/aoti/conftest.py) -------------------
@pytest.mark.slow
@pytest.mark.differential
@pytest.mark.parametrize("backend", ["memory", "http"])
@pytest.mark.parametrize("package", ["embedded", "object", "mmap"], indirect=True)
def test_compiled_package_at_url(package: Path, aoti_packages: Path, place, capsys, backend):  # noqa: F811
    """A package torch compiled: info / ls at a URL print what they print locally after
    reading a small part of the shared object, and every constant is torch's bytes."""
    import torch

    sd = torch.load(aoti_packages / "sd.pt")
    folder = package.parent / f"remote-{package.stem}"
    folder.mkdir(exist_ok=True)
    local = folder / package.name
    local.write_bytes(package.read_bytes())
    url, _base, handler = place(local, backend)
    zr = ZipReader(local)
    binaries = sum(e.size for e in zr.entries if e.name.endswith((".so", ".o")))
    zr.close()
    for cmd in (["info"], ["ls", "--json"], ["info", "--json"]):
        code, fetched, err = _same(capsys, str(local), url, *cmd)
        assert code == 0, err
        if package.stem == "embedded":  # a 1.4 MB .so: its header and tables only
            assert 0 < fetched < binaries // 4, (cmd, fetched, binaries)
    remote.SHARED_BLOCKS.clear()
    with torchless.open(url) as art:
        names = dict(art.tensors())
        assert {"l1.weight", "l1.bias", "l2.weight", "scale", "offset"} <= set(names)
        for fqn, t in names.items():
            want = sd[fqn].contiguous().view(-1).view(torch.uint8).numpy().tobytes()
            assert t.tobytes() == want, fqn


@pytest.mark.parametrize("backend", ["memory", "http"])
def test_deflated_binary_is_fetched_whole_once(tmp_path, place, capsys, backend):  # noqa: F811
    """A deflated record has no byte ranges (torch stores its records; another zip tool
    may not): the binary is fetched whole, once, and read as locally."""
    import zipfile

    consts = _consts()
    src = make_package(tmp_path / "s.pt2", consts, layout="embedded")
    (tmp_path / "p").mkdir()
    local = tmp_path / "p" / "p.pt2"
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(local, "w") as zout:
        for i in zin.infolist():
            method = zipfile.ZIP_DEFLATED if i.filename.endswith(".so") else zipfile.ZIP_STORED
            zout.writestr(i.filename, zin.read(i), compress_type=method)
    with zipfile.ZipFile(local) as z:
        (so,) = [i for i in z.infolist() if i.filename.endswith(".so")]
    url, _base, handler = place(local, backend)
    for cmd in (["info"], ["info", "--json"], ["ls"]):
        code, fetched, err = _same(capsys, str(local), url, *cmd)
        assert code == 0, err
        assert so.compress_size <= fetched <= so.compress_size + 4 * BLOCK, (cmd, fetched)
    remote.SHARED_BLOCKS.clear()
    remote.STATS.reset()
    with torchless.open(url) as art:
        for k, a in consts.items():
            assert art[k].numpy().tobytes() == np.ascontiguousarray(a).tobytes(), k
    assert remote.STATS.bytes_fetched <= so.compress_size + 4 * BLOCK  # the record once
