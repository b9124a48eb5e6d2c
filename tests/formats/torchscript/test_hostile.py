"""Hostile TorchScript archives: dangerous globals run nothing and raise clear errors."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tl_testutil import only_torchless_errors

import torchless
from torchless.container.zip import TorchZipWriter, ZipReader
from torchless.core.errors import TorchlessError, UnsafeGlobalError
from torchless.formats.base import LoadPolicy
from torchless.formats.torchscript.handler import TorchScriptArtifact
from torchless.formats.torchscript.read import ScriptObject
from torchless.pickle.globals import PickledObject


def _evil_call(canary: str) -> bytes:
    cmd = f"touch {canary}".encode()
    return b"\x80\x02cposix\nsystem\nq\x00X" + len(cmd).to_bytes(4, "little") + cmd + b"\x85R"


def _replace(src: str, dst: str, records: dict[str, bytes]) -> str:
    zr = ZipReader(src)
    with TorchZipWriter(dst) as zw:
        for rec in zr.records():
            zw.write(rec, records.get(rec, zr.read_bytes(rec)), compress=rec.startswith("code/"))
    zr.source.close()
    return dst


def _module_with(global_pickle: bytes) -> bytes:
    # a __torch__ module whose attribute 'x' is the result of calling the global
    body = global_pickle[2:]  # drop PROTO
    return b"\x80\x02c__torch__\nEvil\n)\x81}(X\x01\x00\x00\x00x" + body + b"ub."


@pytest.fixture
def canary(tmp_path):
    p = tmp_path / "pwned"
    yield str(p)
    assert not p.exists(), "a global named by the archive was executed"


@pytest.mark.parametrize("record", ["data.pkl", "constants.pkl"])
def test_dangerous_global_refused(ts_files, tmp_path, canary, record):
    evil = _evil_call(canary) + b"."
    path = _replace(ts_files["scripted"], str(tmp_path / "evil.pt"), {record: evil})
    with pytest.raises(UnsafeGlobalError) as ei:
        torchless.open(path)
    assert ei.value.global_name == "posix.system"
    assert record in str(ei.value) and "nothing was imported or run" in str(ei.value)
    with pytest.raises(UnsafeGlobalError):
        torchless.load(path)
    # weights_only=False: an inert placeholder, never a call
    with TorchScriptArtifact(path, LoadPolicy(weights_only=False)) as art:
        obj = art.archive.module if record == "data.pkl" else art.archive.constants
        assert isinstance(obj, PickledObject) and obj.class_name == "posix.system"
        assert obj.args == (f"touch {canary}",)
        assert art.info()["globals_not_allowlisted"] == ["posix.system"]


def test_dangerous_global_inside_module(ts_files, tmp_path, canary):
    path = _replace(ts_files["scripted"], str(tmp_path / "evil2.pt"), {"data.pkl": _module_with(_evil_call(canary))})
    with pytest.raises(UnsafeGlobalError, match="posix.system"):
        torchless.open(path)
    with TorchScriptArtifact(path, LoadPolicy(weights_only=False)) as art:
        root = art.load()
        assert isinstance(root, ScriptObject) and isinstance(root.x, PickledObject)
        assert list(art.tensors()) == []


def test_dangerous_global_in_bytecode_and_debug(ts_files, tmp_path, canary):
    evil = _evil_call(canary) + b"."
    path = _replace(ts_files["lite"], str(tmp_path / "evil.ptl"), {"bytecode.pkl": evil})
    with torchless.open(path) as art:  # data.pkl is fine; bytecode is read on demand
        with pytest.raises(UnsafeGlobalError, match="bytecode.pkl"):
            art.archive.bytecode()
        assert any(p.code == "bytecode" for p in art.verify())
    zr = ZipReader(ts_files["scripted"])
    dbg = [r for r in zr.records() if r.endswith(".debug_pkl")][0]
    zr.source.close()
    path = _replace(ts_files["scripted"], str(tmp_path / "evil_dbg.pt"), {dbg: evil})
    with torchless.open(path) as art, pytest.raises(UnsafeGlobalError):
        art.archive.debug_info(dbg[: -len(".debug_pkl")])


def test_storage_pointing_outside(ts_files, tmp_path):
    # a tensor claiming more elements than its record holds
    zr = ZipReader(ts_files["traced"])
    data = zr.read_bytes("data.pkl")
    zr.source.close()
    bad = data.replace(b"X\x01\x00\x00\x000", b"X\x01\x00\x00\x001", 1)  # first storage key -> '1'
    bad = bad.replace(b"K\tt", b"M\x00\x10t", 1)  # numel 9 -> 4096
    path = _replace(ts_files["traced"], str(tmp_path / "big.pt"), {"data.pkl": bad})
    res = only_torchless_errors(lambda: [t.numpy() for _, t in torchless.open(path).tensors()])
    assert isinstance(res, TorchlessError)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzz_only_torchless_errors(ts_files, data):
    raw = bytearray(open(ts_files["traced"], "rb").read())
    n = data.draw(st.integers(1, 8))
    for _ in range(n):
        i = data.draw(st.integers(0, len(raw) - 1))
        raw[i] ^= data.draw(st.integers(1, 255))
    if data.draw(st.booleans()):
        raw = raw[: data.draw(st.integers(0, len(raw)))]

    def run() -> None:
        art = TorchScriptArtifact(bytes(raw))
        for _, t in art.all_tensors():
            if t.storage is not None:
                t.numpy()
        art.info()
        art.code()
        art.verify()

    only_torchless_errors(run)


def test_cyclic_module_refused(ts_files, tmp_path):
    # a module that contains itself (memo reference to the object being built)
    data = b"\x80\x02c__torch__\nM\nq\x00)\x81q\x01}(X\x08\x00\x00\x00trainingq\x02\x88X\x04\x00\x00\x00selfh\x01ub."
    path = _replace(ts_files["traced"], str(tmp_path / "cyc.pt"), {"data.pkl": data})
    with torchless.open(path) as art:
        res = only_torchless_errors(lambda: list(art.tensors()))
        assert isinstance(res, TorchlessError)
        only_torchless_errors(art.info)
        only_torchless_errors(art.verify)
