"""torchless.diff: the stored-bytes-first path against the values path, and the figures of
a one-element change in big checkpoints checked against NumPy."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

import torchless
import torchless.diff as tdiff


def _save(tmp_path, name, sd):
    p = str(tmp_path / name)
    torchless.save(sd, p)
    return p


def _both_paths(a, b, monkeypatch, **kw):
    monkeypatch.setattr(tdiff, "RAW_FIRST", True)
    raw = tdiff.diff(a, b, **kw)
    monkeypatch.setattr(tdiff, "RAW_FIRST", False)
    values = tdiff.diff(a, b, **kw)
    monkeypatch.setattr(tdiff, "RAW_FIRST", True)
    return raw, values


def _pairs():
    rng = np.random.default_rng(3)
    f32 = rng.standard_normal(5000).astype(np.float32)
    f32b = f32.copy()
    f32b[[7, 4100]] += np.float32(0.5)
    z = np.zeros(64, np.float32)
    negz = z.copy()
    negz[3] = -0.0  # other bytes, equal values
    nan = np.full(10, np.nan, np.float32)
    nan2 = nan.copy()
    nan2.view(np.uint32)[4] ^= 1  # another NaN payload: equal as values
    i64 = np.arange(300, dtype=np.int64) * (2**53)
    i64b = i64.copy()
    i64b[299] += 1  # differs beyond float64 precision
    bf = rng.standard_normal((40, 30)).astype(ml_dtypes.bfloat16)
    bfb = bf.copy()
    bfb[5, 6] = ml_dtypes.bfloat16(100)
    u8 = rng.integers(0, 255, 999, dtype=np.uint8)
    c64 = (rng.standard_normal(50) + 1j * rng.standard_normal(50)).astype(np.complex64)
    c64b = c64.copy()
    c64b[10] = np.nan
    a = {"f32": f32, "z": z, "nan": nan, "i64": i64, "bf": bf, "u8": u8, "c64": c64, "same": f32 * 2, "scalar": np.float64(1.5)}
    b = {
        "f32": f32b,
        "z": negz,
        "nan": nan2,
        "i64": i64b,
        "bf": bfb,
        "u8": u8,
        "c64": c64b,
        "same": f32 * 2,
        "scalar": np.float64(2.5),
    }
    a["scalar"] = np.array(1.5)
    b["scalar"] = np.array(2.5)
    return a, b


@pytest.mark.parametrize("chunk", [1 << 24, 64, 12])
@pytest.mark.parametrize("tol", [{}, {"atol": 0.6}, {"rtol": 1e-3}])
def test_raw_first_equals_values_path(tmp_path, monkeypatch, chunk, tol):
    a, b = _pairs()
    pa, pb = _save(tmp_path, "a.pt", a), _save(tmp_path, "b.pt", b)
    monkeypatch.setattr(tdiff, "CHUNK_BYTES", chunk)
    raw, values = _both_paths(pa, pb, monkeypatch, **tol)
    assert raw == values
    names = {c["name"] for c in raw["changed"]}
    if not tol:
        assert names == {"f32", "i64", "bf", "c64", "scalar"}


def test_non_contiguous_and_safetensors(tmp_path, monkeypatch):
    base = np.arange(600, dtype=np.float32).reshape(20, 30)
    other = base.copy()
    other[3, 4] = -1
    pa = _save(tmp_path, "a.pt", {"t": base.T, "u": base})
    pb = _save(tmp_path, "b.pt", {"t": other.T, "u": other})
    raw, values = _both_paths(pa, pb, monkeypatch)
    assert raw == values and {c["name"] for c in raw["changed"]} == {"t", "u"}
    from safetensors.numpy import save_file

    sa, sb = str(tmp_path / "a.safetensors"), str(tmp_path / "b.safetensors")
    save_file({"u": base}, sa)
    save_file({"u": other}, sb)
    raw, values = _both_paths(sa, sb, monkeypatch)
    assert raw == values and raw["changed"][0]["max_abs_diff"] == pytest.approx(float(base[3, 4] + 1))


def test_one_element_in_big_checkpoints(tmp_path, monkeypatch):
    """Two checkpoints of several chunks' worth of tensors that differ in one element:
    exactly that tensor is changed, with that element's difference as its figure."""
    monkeypatch.setattr(tdiff, "CHUNK_BYTES", 1 << 16)  # many chunks per tensor
    monkeypatch.setattr(tdiff, "RAW_FIRST", True)
    rng = np.random.default_rng(11)
    a = {f"layer{i}.w": rng.standard_normal((512, 256)).astype(np.float32) for i in range(6)}
    b = {k: v.copy() for k, v in a.items()}
    old = float(b["layer4.w"][300, 17])
    b["layer4.w"][300, 17] = np.float32(old + 3.25)
    new = float(b["layer4.w"][300, 17])
    pa, pb = _save(tmp_path, "a.pt", a), _save(tmp_path, "b.pt", b)
    calls = []
    raw = tdiff._compare_raw
    monkeypatch.setattr(tdiff, "_compare_raw", lambda *a, **k: calls.append(1) or raw(*a, **k))
    seen = []
    r = tdiff.diff(pa, pb, progress=seen.append)
    assert len(calls) == 6  # every tensor went through the stored-bytes path
    assert r["changed"] == [{"name": "layer4.w", "reason": "values", "max_abs_diff": abs(new - old)}]
    assert r["same"] == 5 and not r["added"] and not r["removed"] and not r["not_compared"]
    assert sum(seen) == 2 * sum(v.nbytes for v in a.values())
    # within tolerance: the same
    r = tdiff.diff(pa, pb, atol=math.ceil(abs(new - old)))
    assert r["identical"] and r["same"] == 6


def test_damaged_payload_not_compared(tmp_path, monkeypatch):
    a, b = _pairs()
    pa, pb = _save(tmp_path, "a.pt", a), _save(tmp_path, "b.pt", b)
    with torchless.open(pa) as x, torchless.open(pb) as y:
        tx, ty = dict(x.tensors()), dict(y.tensors())
        t = tx["f32"]
        bad = type(t)(t.storage, t.dtype, (t.storage.nbytes,), (1,), 0)  # reaches past its storage
        r = tdiff.compare_tensors(bad, bad)
        monkeypatch.setattr(tdiff, "RAW_FIRST", False)
        assert r == tdiff.compare_tensors(bad, bad)
        assert r["status"] == "not_compared"
        assert tdiff.compare_tensors(tx["u8"], ty["u8"])["status"] == "same"
