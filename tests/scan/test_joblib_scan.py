"""The scanner reads joblib files as joblib.load does: the bytes of each array after its
NumpyArrayWrapper are skipped, so ordinary joblib files are clean while a payload anywhere
in the stream (before, between or after arrays, in any compression) is still found, and
array bytes that pickle.load would run as opcodes are reported from that run."""

from __future__ import annotations

import io
import os

import numpy as np
import pytest

import torchless

joblib = pytest.importorskip("joblib", reason="joblib writes the files the scanner must read as joblib.load does")


class _Boom:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (os.system, (f"echo ran > {self.marker}",))


BENIGN = {
    "dtypes": {
        "f32": np.ones(3, np.float32),
        "i64": np.arange(5),
        "bool": np.array([True, False]),
        "unicode": np.array(["ab", "cde"]),
        "bytes": np.array([b"x", b"yz"]),
        "c64": np.ones(2, np.complex64),
        "fortran": np.asfortranarray(np.ones((3, 2))),
        "empty": np.zeros((0, 3)),
        "zero_d": np.array(3.5),
        "datetime": np.array(["2020-01-01"], dtype="datetime64[D]"),
        "big_endian": np.arange(4, dtype=">i4"),
    },
    "nested": [{"a": np.ones(3)}, (np.arange(4), {"b": np.zeros(2, np.int16)}), "text", 3],
}


@pytest.mark.parametrize("compress", [0, ("zlib", 3), ("gzip", 3), ("bz2", 3), ("lzma", 3), ("xz", 3)], ids=str)
@pytest.mark.parametrize("name", sorted(BENIGN))
def test_benign_joblib_files_are_clean(tmp_path, name, compress):
    p = tmp_path / f"{name}.joblib"
    joblib.dump(BENIGN[name], p, compress=compress)
    rep = torchless.scan(p, jobs=1).files[0]
    assert rep.verdict == "clean", [f"{f.rule}: {f.message}" for f in rep.findings]
    assert any(f.loader == "joblib.load" and "skipped as joblib.load" in f.message for f in rep.findings)
    joblib.load(p)  # the oracle reads it (and these files hold nothing that runs)


@pytest.mark.parametrize("compress", [0, ("zlib", 3), ("xz", 3)], ids=str)
@pytest.mark.parametrize("where", ["after", "before", "between"])
def test_malicious_joblib_is_dangerous(tmp_path, where, compress):
    marker = tmp_path / "MARKER"
    boom = _Boom(str(marker))
    obj = {
        "after": {"w": np.ones(2), "x": boom},
        "before": {"x": boom, "w": np.ones(2)},
        "between": [np.ones(2), boom, np.arange(3)],
    }[where]
    p = tmp_path / "evil.joblib"
    joblib.dump(obj, p, compress=compress)
    rep = torchless.scan(p, jobs=1).files[0]
    assert rep.verdict == "dangerous"
    hits = [f for f in rep.findings if f.rule == "dangerous-global"]
    assert hits and any(f.global_name in ("os.system", "posix.system") for f in hits)
    assert not marker.exists()


def test_object_arrays_stay_unanalysable(tmp_path):
    """An object array first in the file: joblib unpickles its pickle with a fresh unpickler
    (modelled), but plain pickle.load reads that pickle inline, inside the outer FRAME and
    memo, and stops with an error there: that view is reported too, never clean. (Object
    arrays after a raw array, where pickle.load stops first, scan CLEAN:
    test_review3_decisions.py's controls.)"""
    p = tmp_path / "obj.joblib"
    joblib.dump({"o": np.array([1, "a", None], dtype=object)}, p)
    assert torchless.scan(p, jobs=1).files[0].verdict == "unanalysable"


class _Unseekable(io.BytesIO):
    def tell(self) -> int:
        raise io.UnsupportedOperation("not seekable")


def test_array_bytes_that_pickle_load_runs_are_reported(tmp_path):
    """An array whose bytes are opcodes: joblib.load skips them, pickle.load runs them.
    (joblib writes no alignment padding when its file cannot tell(); with padding, the
    padding-length byte is an invalid opcode where pickle.load stops.)"""
    import pickle

    marker = tmp_path / "MARKER"
    payload = f"cos\nsystem\n(S'echo ran > {marker}'\ntR0".encode()
    buf = _Unseekable()
    joblib.dump({"w": np.frombuffer(payload, dtype=np.uint8)}, buf)
    p = tmp_path / "smuggled.joblib"
    p.write_bytes(buf.getvalue())
    rep = torchless.scan(p, jobs=1).files[0]
    assert rep.verdict == "dangerous", [f"{f.rule}: {f.message}" for f in rep.findings]
    assert any(f.global_name in ("os.system", "posix.system") for f in rep.findings)
    assert np.array_equal(joblib.load(p)["w"], np.frombuffer(payload, dtype=np.uint8))  # joblib skips them
    assert not marker.exists()
    with open(p, "rb") as f:
        try:
            pickle.load(f)  # runs them (the stream may even finish)
        except Exception:  # noqa: BLE001, S110 - what follows the payload may not parse
            pass
    assert marker.exists()


def test_unpadded_arrays_are_clean(tmp_path):
    buf = _Unseekable()
    joblib.dump(BENIGN["dtypes"], buf)
    p = tmp_path / "unpadded.joblib"
    p.write_bytes(buf.getvalue())
    assert torchless.scan(p, jobs=1).files[0].verdict == "clean"
    joblib.load(p)


def test_wrapper_with_a_lying_shape_is_not_clean(tmp_path):
    """A shape larger than the stream: the joblib view cannot be read, the file is not clean."""
    p = tmp_path / "a.joblib"
    joblib.dump({"w": np.arange(4, dtype=np.int64)}, p)
    data = p.read_bytes()
    bad = data.replace(b"K\x04\x85", b"M\x00\x10\x85", 1)  # shape (4,) -> (4096,)
    assert bad != data
    p.write_bytes(bad)
    assert torchless.scan(p, jobs=1).files[0].verdict != "clean"
