"""Re-saving archives with new weights and extra files: torch loads and runs the result."""

from __future__ import annotations

import zipfile

import ml_dtypes
import numpy as np
import pytest

import torchless
from torchless.core.errors import NotFoundError, TorchlessError, UsageError
from torchless.core.tensor import Tensor
from torchless.formats.torchscript.write import save_edited


def _new_weights(art):
    rng = np.random.default_rng(5)
    out = {}
    for name, t in art.tensors():
        if t.dtype.numpy is None:
            continue
        if t.dtype.kind in ("float", "complex"):
            arr = rng.standard_normal(t.shape).astype(np.float32).astype(t.dtype.numpy)
        elif t.dtype.kind == "bool":
            arr = rng.integers(0, 2, t.shape).astype(bool)
        else:
            arr = rng.integers(0, 100, t.shape).astype(t.dtype.numpy)
        out[name] = arr
    return out


def _to_torch(arr, torch):
    if arr.dtype == ml_dtypes.bfloat16:
        return torch.from_numpy(arr.view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(np.ascontiguousarray(arr))


def test_scripted_edit_runs_in_torch(ts_files, torch, tmp_path):
    src = ts_files["scripted"]
    with torchless.open(src) as art:
        new = _new_weights(art)
    new.pop("shared")  # alias of sub.lin.weight: give the value once
    out = tmp_path / "edited.pt"
    res = save_edited(
        src, out, tensors=new, extra_files={"meta.json": b'{"v": 2}', "added.txt": "new"}, remove_extra=["notes.txt"]
    )
    assert sorted(res["replaced"]) == sorted(new)
    extra = {"meta.json": "", "added.txt": "", "notes.txt": ""}
    m = torch.jit.load(str(out), _extra_files=extra)
    assert extra["meta.json"] == b'{"v": 2}' and extra["added.txt"] == b"new" and extra["notes.txt"] == b""
    sd = m.state_dict()
    for k, arr in new.items():
        assert torch.equal(sd[k], _to_torch(arr, torch)), k
    assert torch.equal(sd["shared"], sd["sub.lin.weight"])  # still one tensor
    # the module computes with the new weights: compare with the original module loaded
    # and given the same values through torch
    ref = torch.jit.load(src)
    with torch.no_grad():
        for k, v in ref.state_dict(keep_vars=True).items():
            key = "sub.lin.weight" if k == "shared" else k
            if key in new:
                v.copy_(_to_torch(new[key], torch))
    x = torch.randn(4, 3)
    assert torch.equal(m(x), ref(x)) and torch.equal(m.other(x[:, :2] @ torch.ones(2, 3)), ref.other(x[:, :2] @ torch.ones(2, 3)))
    # code and pickles are unchanged, byte for byte (deflated code stays deflated)
    za, zb = zipfile.ZipFile(src), zipfile.ZipFile(out)
    pa, pb = za.namelist()[0].split("/")[0], zb.namelist()[0].split("/")[0]
    for info in za.infolist():
        rel = info.filename[len(pa) + 1 :]
        if rel.startswith(("code/", "data.pkl", "constants.pkl")):
            other = zb.getinfo(f"{pb}/{rel}")
            assert other.compress_type == info.compress_type and other.CRC == info.CRC
            assert zb.read(other) == za.read(info)
    with torchless.open(out) as art:
        assert art.verify() == []


def test_edit_constants_and_attributes(ts_files, torch, tmp_path):
    src = ts_files["traced"]
    out = tmp_path / "c.pt"
    with torchless.open(src) as art:
        c0 = dict(art.all_tensors())["CONSTANTS.c0"]
        w = np.full((3, 3), 0.25, np.float32)
        save_edited(art, out, tensors={"CONSTANTS.c0": np.array(3, dtype=c0.dtype.numpy), "lin.weight": w})
    m = torch.jit.load(str(out))
    x = torch.randn(2, 3)
    lin_b = m.lin.bias
    expected = torch.relu(x @ torch.from_numpy(w).t() + lin_b) + torch.arange(3.0) * 3
    assert torch.allclose(m(x), expected)
    # a non-parameter tensor attribute and a tensor inside a list
    out2 = tmp_path / "attrs.pt"
    save_edited(
        ts_files["scripted"],
        out2,
        tensors={
            "t": np.array([1.0, 2.0], np.float32),
            "tl.1": np.array([4.0, 5.0], np.float32),
            "u16": np.array([7, 8, 65535], np.uint16),
        },
    )
    m2 = torch.jit.load(str(out2))
    assert m2.t.tolist() == [1.0, 2.0] and m2.tl[1].tolist() == [4.0, 5.0] and m2.u16.tolist() == [7, 8, 65535]


def test_strided_and_inplace(ts_files, torch, tmp_path):
    path = tmp_path / "inplace.pt"
    path.write_bytes(open(ts_files["scripted"], "rb").read())
    before = torch.jit.load(str(path)).strided
    new = np.array([[10, 11], [12, 13], [14, 15]], np.float32)
    save_edited(str(path), str(path), tensors={"strided": Tensor.from_numpy(new)})
    m = torch.jit.load(str(path))
    assert m.strided.stride() == before.stride() and m.strided.tolist() == new.tolist()


def test_lite_edit_runs_in_mobile(ts_files, torch, tmp_path):
    from torch.jit.mobile import _load_for_lite_interpreter

    src = ts_files["lite_const"]
    out = tmp_path / "edited.ptl"
    w = np.eye(3, dtype=np.float32)
    b = np.zeros(3, np.float32)
    save_edited(src, out, tensors={"lin.weight": w, "lin.bias": b})
    mob = _load_for_lite_interpreter(str(out))
    x = torch.randn(2, 3)
    assert torch.allclose(mob(x), torch.relu(x) + torch.arange(3.0) * 2)


def test_edit_errors(ts_files, tmp_path):
    src = ts_files["scripted"]
    out = tmp_path / "x.pt"
    with pytest.raises(UsageError, match="shape"):
        save_edited(src, out, tensors={"sub.lin.weight": np.zeros((3, 3), np.float32)})
    with pytest.raises(UsageError, match="dtype"):
        save_edited(src, out, tensors={"sub.lin.weight": np.zeros((2, 3), np.float64)})
    with pytest.raises(UsageError, match="dtype"):
        save_edited(src, out, tensors={"sub.b16": Tensor.from_numpy(np.zeros(4, np.float32))})
    with pytest.raises(NotFoundError):
        save_edited(src, out, tensors={"nope": np.zeros(1)})
    with pytest.raises(UsageError, match="no new value"):
        save_edited(src, out, tensors={"buf": np.arange(3)}, strict=True)
    with pytest.raises(UsageError):
        save_edited(src, out, extra_files={"../evil": b""})
    assert not out.exists()  # nothing half-written
    for e in (UsageError, NotFoundError):
        assert issubclass(e, TorchlessError)
