"""joblib files: every array listed and read bit-exact against joblib.load, plain and
compressed; nothing in the file runs; hostile streams fail with TorchlessErrors."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import torchless
from torchless.cli.main import main
from torchless.core.errors import FormatError, LimitError, TorchlessError, TruncatedError, UnsafeGlobalError
from torchless.formats.base import LoadPolicy
from torchless.formats.joblib import JoblibArtifact
from torchless.pickle.machine import Limits

joblib = pytest.importorskip("joblib", reason="joblib is the oracle")


class Estimator:
    """Stands for a scikit-learn estimator: arrays in the instance dict."""

    def __init__(self) -> None:
        self.coef_ = np.linspace(-1, 1, 12).reshape(3, 4)
        self.classes_ = np.array([0, 1, 2], dtype=np.int64)
        self.n_features_in_ = 4


def _objects() -> dict:
    rng = np.random.default_rng(0)
    return {
        "f32": rng.standard_normal((5, 7)).astype(np.float32),
        "fortran": np.asfortranarray(rng.standard_normal((4, 3))),
        "f16": np.arange(10, dtype=np.float16),
        "i8": np.arange(-5, 5, dtype=np.int8),
        "u64": np.arange(3, dtype=np.uint64) * (1 << 40),
        "bool": np.array([True, False, True]),
        "c128": np.array([1 + 2j, -3j]),
        "scalar0d": np.array(3.5),
        "empty": np.zeros((0, 4), np.float32),
        "big_endian": np.arange(6, dtype=">i4"),
        "nested": [np.ones(3), {"deep": np.full((2, 2), 7, np.int16)}],
        "est": Estimator(),
        "objects": np.array([1, "x", None], dtype=object),
        "text": "not an array",
    }


def _flat(obj, prefix=""):
    out = {}
    if isinstance(obj, np.ndarray) and obj.dtype != object:
        out[prefix] = obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            out.update(_flat(v, f"{prefix}.{k}" if prefix else str(k)))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            out.update(_flat(v, f"{prefix}.{i}" if prefix else str(i)))
    elif hasattr(obj, "__dict__"):
        out.update(_flat(vars(obj), prefix))
    return out


@pytest.mark.differential
@pytest.mark.parametrize("compress", [0, ("zlib", 3), ("gzip", 3), ("bz2", 3), ("xz", 3), ("lzma", 3)])
def test_arrays_bit_exact_against_joblib(tmp_path, compress):
    p = tmp_path / "m.joblib"
    joblib.dump(_objects(), p, compress=compress)
    ref = _flat(joblib.load(p))
    assert torchless.detect(p) == "joblib"
    with torchless.open(p, weights_only=False) as art:
        assert art.compression == (None if not compress else compress[0])
        got = dict(art.tensors())
        assert set(got) == set(ref) - {"big_endian"} | {"big_endian"}
        for k, want in ref.items():
            t = got[k]
            arr = t.numpy()
            assert (
                arr.shape == want.shape
                and arr.dtype.newbyteorder("=") == want.dtype.newbyteorder("=")
                or str(t.dtype.name) in str(want.dtype)
            ), k
            assert np.array_equal(arr, want), k
        info = art.info()
        assert len(info["arrays"]) == len(ref) + 1  # + the object array (listed, not a tensor)
        assert any(a["dtype"] == "object" for a in info["arrays"])
        assert art.verify() == []
        est = art.load()["est"]
        assert est.cls.name == "Estimator" and est.state["n_features_in_"] == 4  # an inert placeholder


def test_detect_without_extension_and_cli(tmp_path, capsys):
    for compress in (0, 3):
        p = tmp_path / f"model{compress}.bin"
        joblib.dump({"w": np.arange(4.0)}, p, compress=compress)
        assert torchless.detect(p) == "joblib"
        assert main(["ls", str(p)]) == 0
        assert "w  float64  [4]" in capsys.readouterr().out
    assert main(["convert", str(tmp_path / "model3.bin"), str(tmp_path / "w.safetensors")]) == 0
    assert torchless.load(tmp_path / "w.safetensors")["w"].numpy().tolist() == [0, 1, 2, 3]


def test_default_policy_refuses_unknown_classes(tmp_path):
    p = tmp_path / "e.joblib"
    joblib.dump({"est": Estimator()}, p)
    with pytest.raises(UnsafeGlobalError, match="Estimator"):
        torchless.open(p)
    joblib.dump({"w": np.arange(3)}, p)  # arrays alone: the wrapper is the format itself
    assert torchless.open(p)["w"].numpy().tolist() == [0, 1, 2]


class _Boom:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"echo ran > {self.marker}",))


def test_malicious_never_runs(tmp_path):
    marker = tmp_path / "MARKER"
    p = tmp_path / "evil.joblib"
    joblib.dump({"w": np.ones(2), "x": _Boom(str(marker))}, p)
    with pytest.raises(UnsafeGlobalError):
        torchless.open(p)
    art = torchless.open(p, weights_only=False)
    assert list(dict(art.tensors())) == ["w"]
    assert not marker.exists()
    # the scanner skips the array bytes as joblib.load does and finds the payload after them
    assert torchless.scan(p, jobs=1).files[0].verdict == "dangerous"
    subprocess.run([sys.executable, "-c", f"import joblib; joblib.load({str(p)!r})"], timeout=120, capture_output=True)
    assert marker.exists()  # the oracle: joblib.load runs it


def _plain(tmp_path) -> bytes:
    p = tmp_path / "a.joblib"
    joblib.dump({"w": np.arange(64, dtype=np.float64)}, p)
    return p.read_bytes()


def test_hostile(tmp_path):
    raw = _plain(tmp_path)
    start = JoblibArtifact(tmp_path / "a.joblib").arrays[0]["offset"]
    pad = next(k for k in range(17) if raw[start - 1 - k] == k and raw[start - k : start] == b"\xff" * k)
    at = start - 1 - pad  # right after the wrapper's BUILD: padding length, padding, data
    cut = tmp_path / "cut.joblib"
    cut.write_bytes(raw[: at + 40])
    with pytest.raises(TruncatedError):
        JoblibArtifact(cut)
    bad = bytearray(raw)
    bad[at] = 200  # padding longer than the alignment
    (tmp_path / "pad.joblib").write_bytes(bytes(bad))
    with pytest.raises(FormatError, match="padding"):
        JoblibArtifact(tmp_path / "pad.joblib")
    shape = raw.index(b"K@")  # shape (64,) as BININT1 64
    bad = bytearray(raw)
    bad[shape : shape + 2] = b"J\xff"  # a 4-byte int whose bytes run into the next opcodes
    (tmp_path / "shape.joblib").write_bytes(bytes(bad))
    with pytest.raises(TorchlessError):
        JoblibArtifact(tmp_path / "shape.joblib")
    # a compressed stream inflating past the limit
    import zlib

    bomb = tmp_path / "bomb.joblib"
    bomb.write_bytes(zlib.compress(raw + b"\0" * (1 << 20)))
    with pytest.raises(LimitError):
        JoblibArtifact(bomb, LoadPolicy(limits=Limits(max_input=1 << 16)))
    (tmp_path / "junk.joblib").write_bytes(b"x\x9c" + os.urandom(64))
    with pytest.raises(TorchlessError):
        JoblibArtifact(tmp_path / "junk.joblib")
