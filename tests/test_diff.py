"""torchless.diff: the stored-bytes-first path against the values path, and the figures of
a one-element change in big checkpoints checked against NumPy."""

from __future__ import annotations

import math
import pathlib

import ml_dtypes
import numpy as np
import pytest

import torchless
import torchless.diff as tdiff
from torchless.core.settings import SETTINGS

SAMPLES = pathlib.Path(__file__).resolve().parents[1] / "samples"


def _save(tmp_path, name, sd):
    p = str(tmp_path / name)
    torchless.save(sd, p)
    return p


def _both_paths(a, b, monkeypatch, **kw):
    monkeypatch.setattr(SETTINGS, "diff_raw_first", True)
    raw = tdiff.diff(a, b, **kw)
    monkeypatch.setattr(SETTINGS, "diff_raw_first", False)
    values = tdiff.diff(a, b, **kw)
    monkeypatch.setattr(SETTINGS, "diff_raw_first", True)
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
    monkeypatch.setattr(SETTINGS, "diff_raw_first", True)
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
        monkeypatch.setattr(SETTINGS, "diff_raw_first", False)
        assert r == tdiff.compare_tensors(bad, bad)
        assert r["status"] == "not_compared"
        assert tdiff.compare_tensors(tx["u8"], ty["u8"])["status"] == "same"


# -- what is not a tensor is compared too ----------------------------------------------


def test_diff_compares_plain_values_of_checkpoints(tmp_path):
    """Two checkpoints with equal tensors but another learning rate or config are not
    identical (torch.save writes them; torch.load reads back the values we expect)."""
    torch = pytest.importorskip("torch", reason="differential: torch writes the checkpoints")
    from torchless.diff import diff

    w = torch.arange(6, dtype=torch.float32)
    torch.save({"w": w, "lr": 0.1, "cfg": {"a": 1}, "tag": "x"}, tmp_path / "a.pt")
    torch.save({"w": w, "lr": 0.2, "cfg": {"a": 1, "b": "z"}}, tmp_path / "b.pt")
    res = diff(tmp_path / "a.pt", tmp_path / "b.pt")
    assert res["same"] == 1 and not res["changed"]
    assert res["values_added"] == ["cfg.b"] and res["values_removed"] == ["tag"]
    assert res["values_changed"] == [{"name": "lr", "a": "0.1", "b": "0.2"}]
    assert not res["identical"]
    assert diff(tmp_path / "a.pt", tmp_path / "a.pt")["identical"]


def test_diff_of_a_checkpoint_and_its_flat_conversion_names_the_dropped_values(tmp_path, capsys):
    """convert to .safetensors drops the optimizer settings; diff says so and exits 1."""
    from torchless.cli.main import main

    src = SAMPLES / "checkpoint.pt"
    out = tmp_path / "c.safetensors"
    dropped = torchless.convert(src, out)["dropped"]
    res = tdiff.diff(src, out)
    assert not res["changed"] and not res["added"] and not res["removed"]
    assert res["values_removed"] == sorted(d["key"] for d in dropped)
    assert main(["diff", str(src), str(out)]) == 1
    text = capsys.readouterr().out
    assert f"other values: 0 added, {len(dropped)} removed, 0 changed" in text


def test_diff_compares_code_and_graphs(tmp_path):
    """TorchScript code and .pt2 graphs are compared: the same weights under other code
    differ (torch writes both files)."""
    torch = pytest.importorskip("torch", reason="differential: torch writes the modules")
    from torchless.diff import diff

    class A(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(3, 2)

        def forward(self, x):
            return self.lin(x).relu()

    class B(A):
        def forward(self, x):
            return self.lin(x).sigmoid()

    torch.manual_seed(0)
    a = A()
    b = B()
    b.load_state_dict(a.state_dict())
    torch.jit.save(torch.jit.script(a), tmp_path / "a.pt")
    torch.jit.save(torch.jit.script(b), tmp_path / "b.pt")
    res = diff(tmp_path / "a.pt", tmp_path / "b.pt")
    assert res["same"] == 2 and not res["changed"]
    assert "code" in [c["name"] for c in res["values_changed"]] and not res["identical"]

    x = (torch.randn(4, 3),)
    torch.export.save(torch.export.export(a, x), tmp_path / "a.pt2")
    torch.export.save(torch.export.export(b, x), tmp_path / "b.pt2")
    res = diff(tmp_path / "a.pt2", tmp_path / "b.pt2")
    assert res["same"] == 2 and "model:graph" in [c["name"] for c in res["values_changed"]]
    assert diff(tmp_path / "a.pt2", tmp_path / "a.pt2")["identical"]


def test_diff_compares_aoti_records_by_crc(tmp_path):
    """Every record of an AOTInductor package but the weights is compared by size and
    CRC-32: a package whose compiled code changed (one byte of the wrapper) differs."""
    import shutil

    from torchless.diff import diff

    src = SAMPLES / "mlp_aoti.pt2"
    assert diff(src, src)["identical"]
    with torchless.open(src) as a:
        z = a.package.zip
        e = next(e for e in z.entries if e.name.endswith(".cpp") and e.method == 0 and e.size > 100)
        start = z.data_offset(e) if callable(getattr(z, "data_offset", None)) else None
    assert start is not None
    bad = tmp_path / "bad.pt2"
    shutil.copy(src, bad)
    data = bytearray(bad.read_bytes())
    data[start + 50] ^= 0x20
    # keep the stored CRC consistent with the edit, as a rebuilt package would be
    import struct
    import zlib

    crc = zlib.crc32(bytes(data[start : start + e.size]))
    struct.pack_into("<I", data, e.header_offset + 14, crc)
    struct.pack_into("<I", data, e.central_offset + 16, crc)
    bad.write_bytes(bytes(data))
    res = diff(src, bad)
    assert not res["identical"]
    assert [c["name"] for c in res["values_changed"]] == ["record:" + e.name.split("/", 1)[1]]


def test_diff_never_calls_unmodelled_content_identical(tmp_path):
    """A format whose non-tensor content diff does not model is 'not compared' (exit 1),
    never identical: a stand-in artifact of an unmodelled format shows the rule."""
    from torchless.diff import diff_artifacts

    class Unmodelled:
        format = "inductor_cache"

        def tensors(self):
            return iter(())

    res = diff_artifacts(Unmodelled(), Unmodelled())
    assert not res["identical"]
    assert any("not the rest of it" in c["reason"] for c in res["not_compared"])


def test_diff_compares_dtypes_and_devices_and_refuses_values_it_cannot_model(tmp_path):
    """A checkpoint's dtype and device values are compared by what they are (torch writes
    them; float32 vs bfloat16 was reported the same), and a leaf of a type diff does not
    model is 'not compared', never silently equal."""
    torch = pytest.importorskip("torch", reason="differential: torch writes the checkpoints")
    from torchless.diff import diff, diff_artifacts

    torch.save({"dev": torch.device("cpu"), "dt": torch.float32}, tmp_path / "a.pt")
    torch.save({"dev": torch.device("cuda", 0), "dt": torch.bfloat16}, tmp_path / "b.pt")
    res = diff(tmp_path / "a.pt", tmp_path / "b.pt")
    assert sorted(c["name"] for c in res["values_changed"]) == ["dev", "dt"]
    assert diff(tmp_path / "a.pt", tmp_path / "a.pt")["identical"]

    class Opaque:
        pass

    class Art:
        format = "joblib"

        def tensors(self):
            return iter(())

        def load(self):
            return {"x": Opaque()}

    res = diff_artifacts(Art(), Art())
    assert not res["identical"] and [c["name"] for c in res["not_compared"]] == ["a: x", "b: x"]
