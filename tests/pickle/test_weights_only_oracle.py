"""torch's weights-only unpickler as an oracle for the machine's default (torch) flavour.

torch.load(weights_only=True) reads GLOBALs through ``_read_global_instruction`` (Python-2
renames applied whatever the protocol) and refuses what its allowlist lacks. The
machine, recording every global it resolves, must resolve the same names in the same
order up to where torch stops.
"""

from __future__ import annotations

import io
import os
import random
import sys
import warnings

import pytest

torch = pytest.importorskip("torch", reason="torch is the oracle here")
wo = pytest.importorskip("torch._weights_only_unpickler")

from torchless.core.errors import TorchlessError  # noqa: E402
from torchless.pickle.globals import GlobalRef  # noqa: E402
from torchless.pickle.machine import Unpickler  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pickle_gen import stream  # noqa: E402


class _Recording:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    def resolve(self, module: str, name: str) -> object:
        self.seen.append((module, name))
        return GlobalRef(module, name)


def _torch_globals(data: bytes, monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    seen: list[tuple[str, str]] = []
    real = wo._read_global_instruction

    def rec(readline):  # type: ignore[no-untyped-def]
        m, n = real(readline)
        seen.append((m, n))
        return m, n

    monkeypatch.setattr(wo, "_read_global_instruction", rec)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            wo.Unpickler(io.BytesIO(data), encoding="latin1").load()
        except Exception:  # noqa: BLE001 - torch's refusal, whatever its type
            pass
    monkeypatch.setattr(wo, "_read_global_instruction", real)
    return seen


def _machine_globals(data: bytes, errors: list | None = None) -> list[tuple[str, str]]:
    r = _Recording()
    try:
        Unpickler(data, resolver=r, persistent_load=lambda pid: pid, encoding="latin1").load()
    except TorchlessError as e:
        if errors is not None:
            errors.append(e)
    return r.seen


def test_torch_saved_objects_resolve_the_same_globals(monkeypatch):
    import collections

    objs = [
        {"w": torch.zeros(2, 3), "b": torch.ones(3, dtype=torch.float16)},
        collections.OrderedDict(a=torch.arange(4), b=[1, 2.5, "x", None, (1, 2)]),
        {"s": {1, 2}, "fs": frozenset({3}), "c": complex(1, 2), "sl": slice(1, 2), "bytes": b"x", "ba": bytearray(b"y")},
    ]
    for obj in objs:
        buf = io.BytesIO()
        torch.save(obj, buf, _use_new_zipfile_serialization=False)
        raw = buf.getvalue()
        # the object pickle of the legacy stream is its 4th; run both from there
        for start in _pickle_starts(raw)[:4]:
            t = _torch_globals(raw[start:], monkeypatch)
            m = _machine_globals(raw[start:])
            assert m[: len(t)] == t and t == m or (len(t) < len(m)), (t, m)


def _pickle_starts(raw: bytes) -> list[int]:
    out = [0]
    pos = 0
    for _ in range(5):
        up = Unpickler(raw, resolver=_Recording(), persistent_load=lambda pid: pid, start=pos, encoding="latin1")
        try:
            up.load()
        except TorchlessError:
            break
        pos = up.end
        out.append(pos)
    return out


def test_generated_streams_resolve_globals_in_torchs_order(monkeypatch):
    """Generated streams (GLOBAL forms, Python-2 names, protocols): the machine's globals
    start with exactly torch's, up to where torch's allowlist stops it."""
    checked = 0
    for i in range(1500):
        data = stream(random.Random(f"wo:{i}"))
        t = _torch_globals(data, monkeypatch)
        if not t:
            continue
        errs: list = []
        m = _machine_globals(data, errs)
        if errs and type(errs[0]).__name__ == "TruncatedError" and m == t[:-1]:
            continue  # torch reads a GLOBAL line cut by the end of the data as a name; it then stops
        assert m[: len(t)] == t, (data, t, m)
        checked += 1
    assert checked > 200
