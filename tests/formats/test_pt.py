"""Eager checkpoints (spec pt.md): torchless reads exactly what torch 2.13 reads and
writes what torch 2.13 loads. torch is the oracle (differential tests)."""

from __future__ import annotations

import collections
import io
import os
import warnings

import numpy as np
import pytest
from tl_testutil import (
    assert_tensor_matches,
    assert_tree_matches,
    build_legacy_tar,
    sharing_pattern_tl,
    sharing_pattern_torch,
    torch_tensors,
)

import torchless
from torchless.container.zip import TorchZipWriter, ZipReader
from torchless.core.dtypes import DTYPES
from torchless.core.errors import FormatError, UnsafeGlobalError, UnsupportedError
from torchless.core.tensor import Tensor
from torchless.core.tree import iter_tensors
from torchless.formats.pt.read import read_checkpoint
from torchless.io.source import open_source

pytestmark = pytest.mark.differential

ALL_DTYPES = [
    "bool",
    "uint8",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint16",
    "uint32",
    "uint64",
    "float16",
    "bfloat16",
    "float32",
    "float64",
    "float8_e4m3fn",
    "float8_e5m2",
    "float8_e4m3fnuz",
    "float8_e5m2fnuz",
    "float8_e8m0fnu",
    "complex32",
    "complex64",
    "complex128",
]


def make(torch, name: str, shape=(4, 6)):
    """A tensor of dtype ``name`` with varied values (every byte pattern differs)."""
    dt = getattr(torch, name)
    n = int(np.prod(shape))
    base = torch.linspace(-7.5, 9.25, n).reshape(shape)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if name == "bool":
            return base > 0.3
        if name.startswith(("uint", "int")):
            return (base * 37).to(torch.int64).to(dt)
        if name == "float8_e8m0fnu":
            return base.abs().add(0.01).to(dt)
        if name.startswith("complex"):
            return torch.complex(base, -base * 0.5).to(dt)
        return base.to(dt)


def load_tl(path, **kw):
    return read_checkpoint(open_source(path), **kw)


def torch_load(torch, path, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.load(path, **kw)


def check_file(torch, path, *, weights_only=True, torch_kw=None):
    """torchless's parse of ``path`` equals torch.load's: values, layout, sharing."""
    expect = torch_load(torch, path, weights_only=weights_only, **(torch_kw or {}))
    cp = load_tl(path, weights_only=weights_only)
    assert_tree_matches(cp.obj, expect)
    tt = [t for _, t in torch_tensors(expect)]
    tl = [t for _, t in iter_tensors(cp.obj)]
    plain_t = [t for t in tt if not (t.is_sparse or t.layout != torch.strided)]
    plain_l = [t for t in tl if isinstance(t, Tensor)]
    assert sharing_pattern_tl(plain_l) == sharing_pattern_torch(plain_t)
    return cp, expect


def check_torch_reads(torch, path, expect):
    """What torchless wrote loads in torch (weights_only=True and mmap=True) as ``expect``."""
    for kw in ({"weights_only": True}, {"weights_only": True, "mmap": True}):
        got = torch_load(torch, path, **kw)
        _assert_torch_equal(torch, got, expect)
        tg = [t for _, t in torch_tensors(got)]
        te = [t for _, t in torch_tensors(expect)]
        tg = [t for t in tg if t.layout == torch.strided]
        te = [t for t in te if t.layout == torch.strided]
        assert sharing_pattern_torch(tg) == sharing_pattern_torch(te)


def _assert_torch_equal(torch, a, b, path=""):
    if isinstance(b, torch.Tensor):
        assert isinstance(a, torch.Tensor), path
        assert a.dtype == b.dtype and a.shape == b.shape and a.layout == b.layout, path
        assert isinstance(a, torch.nn.Parameter) == isinstance(b, torch.nn.Parameter), path
        assert a.requires_grad == b.requires_grad, path
        if b.device.type == "meta":
            assert a.device.type == "meta" and a.stride() == b.stride()
            return
        if b.layout != torch.strided:
            assert torch.equal(a.to_dense(), b.to_dense()), path
            return
        assert a.stride() == b.stride() and a.storage_offset() == b.storage_offset(), path
        if b.is_quantized:
            assert a.qscheme() == b.qscheme()
            assert torch.equal(a.int_repr(), b.int_repr())
            assert torch.equal(a.dequantize(), b.dequantize())
            return
        assert a.is_conj() == b.is_conj() and a.is_neg() == b.is_neg(), path
        assert bytes(a.untyped_storage()) == bytes(b.untyped_storage()), path
        return
    if isinstance(b, dict):
        assert list(a.keys()) == list(b.keys()), path
        for k in b:
            _assert_torch_equal(torch, a[k], b[k], f"{path}.{k}")
        return
    if isinstance(b, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=False)):
            _assert_torch_equal(torch, x, y, f"{path}.{i}")
        return
    assert a == b or (a != a and b != b), (path, a, b)


# -- torch -> torchless ------------------------------------------------------------------
@pytest.mark.parametrize("name", ALL_DTYPES)
def test_every_dtype_reads_and_writes_back(torch, tmp_path, name):
    t = make(torch, name)
    obj = {"t": t, "T": t.t(), "slice": t[1:3, 2:5], "row": t[2], "scalar": t[1, 1].clone()}
    src = tmp_path / "src.pt"
    torch.save(obj, src)
    cp, expect = check_file(torch, src)
    # v2 names vs v3 (UntypedStorage + dtype), spec pt.md §1.7
    legacy = DTYPES[name].legacy_storage
    kinds = {g for g, _ in cp.globals_seen}
    assert ("torch._utils._rebuild_tensor_v3" in kinds) == (legacy is None)
    out = tmp_path / "back.pt"
    torchless.save(cp.obj, out)
    check_torch_reads(torch, out, expect)


@pytest.mark.parametrize("qdtype", ["quint8", "qint8", "qint32"])
def test_quantized_per_tensor_and_per_channel(torch, tmp_path, qdtype):
    dt = getattr(torch, qdtype)
    x = torch.linspace(-3, 3, 24).reshape(4, 6)
    obj = {
        "pt": torch.quantize_per_tensor(x, 0.05, 7 if qdtype != "qint8" else -3, dt),
        "pc": torch.quantize_per_channel(
            x, torch.tensor([0.1, 0.2, 0.05, 0.3], dtype=torch.float64), torch.tensor([1, 0, 2, 3]), 0, dt
        ),
        "pc1": torch.quantize_per_channel(
            x, torch.linspace(0.01, 0.1, 6, dtype=torch.float64), torch.zeros(6, dtype=torch.int64), 1, dt
        ),
    }
    src = tmp_path / "q.pt"
    torch.save(obj, src)
    cp, expect = check_file(torch, src)
    for k in obj:
        np.testing.assert_allclose(cp.obj[k].dequantize(), expect[k].dequantize().numpy(), rtol=1e-6)
    out = tmp_path / "q_back.pt"
    torchless.save(cp.obj, out)
    check_torch_reads(torch, out, expect)


def test_views_sharing_expand_zero_dim_empty(torch, tmp_path):
    big = torch.arange(60, dtype=torch.float32).reshape(6, 10)
    obj = {
        "big": big,
        "view": big[1:, 2:7],
        "T": big.t(),
        "step": big[::2, ::3],
        "col": big[:, 3],
        "expand": torch.tensor([1.5, 2.5, 3.5]).expand(4, 3),
        "expand0": torch.tensor(7, dtype=torch.int16).expand(5),
        "zero_dim": torch.tensor(3.25, dtype=torch.float64),
        "empty": torch.empty(0, 3, dtype=torch.bfloat16),
        "empty_view": big[6:],
        "channels_last": torch.arange(2 * 3 * 4 * 5, dtype=torch.float16)
        .reshape(2, 3, 4, 5)
        .contiguous(memory_format=torch.channels_last),
        "same_again": big,
        "narrow_of_view": big[1:, 2:7][1:3],
    }
    src = tmp_path / "views.pt"
    torch.save(obj, src)
    cp, expect = check_file(torch, src)
    o = cp.obj
    assert o["big"].storage is o["view"].storage is o["T"].storage is o["step"].storage
    assert o["big"] is o["same_again"]
    assert o["expand"].stride() == (0, 1)
    assert o["zero_dim"].shape == () and o["zero_dim"].numpy() == 3.25
    assert o["empty"].numpy().shape == (0, 3)
    assert len(cp.storages) == len({t.untyped_storage().data_ptr() for _, t in torch_tensors(expect)})
    out = tmp_path / "views_back.pt"
    torchless.save(o, out)
    check_torch_reads(torch, out, expect)


def test_shared_storage_across_dtypes_is_refused_on_save(tmp_path):
    a = Tensor.from_numpy(np.arange(4, dtype=np.float32))
    b = Tensor(a.storage, DTYPES["float64"], (2,))
    with pytest.raises(torchless.core.errors.UsageError):
        torchless.save({"a": a, "b": b}, tmp_path / "x.pt")


def test_nested_containers_and_optimizer_state(torch, tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.LayerNorm(7), torch.nn.Linear(7, 2))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.randn(3, 5)).sum().backward()
    opt.step()
    obj = {
        "model": model.state_dict(),
        "optim": opt.state_dict(),
        "epoch": 3,
        "meta": {
            "lrs": [1e-3, 5e-4],
            "betas": (0.9, 0.999),
            "name": "run",
            "flag": True,
            "none": None,
            "big": 2**70,
            "neg": -(2**40),
            "bytes": b"\x00\xffab",
            "set": {1, 2, 3},
            "cplx": 1 + 2j,
        },
        "list": [torch.ones(2), [torch.zeros(1, dtype=torch.int8), (torch.arange(3),)]],
        "od": collections.OrderedDict([("x", torch.ones(1)), ("y", 2)]),
        "dev": torch.device("cuda", 1),
        "dtype": torch.bfloat16,
        "size": torch.Size([2, 3]),
    }
    src = tmp_path / "nested.pt"
    torch.save(obj, src)
    cp, expect = check_file(torch, src)
    o = cp.obj
    # Module.state_dict() carries _metadata through BUILD
    assert o["model"]._metadata == expect["model"]._metadata
    assert o["optim"]["state"][0]["step"].numpy() == expect["optim"]["state"][0]["step"].item()
    assert o["meta"]["set"] == {1, 2, 3} and o["meta"]["bytes"] == b"\x00\xffab"
    assert tuple(o["size"]) == (2, 3)
    out = tmp_path / "nested_back.pt"
    torchless.save(o, out)
    check_torch_reads(torch, out, expect)
    assert torch_load(torch, out, weights_only=True)["model"]._metadata == expect["model"]._metadata


def test_sparse_layouts(torch, tmp_path):
    dense = torch.tensor([[0.0, 1.5, 0.0, 0.0], [2.0, 0.0, 0.0, -3.0], [0.0, 0.0, 0.0, 0.0], [0.5, 0.0, 4.0, 0.0]])
    coo = dense.to_sparse()
    unco = torch.sparse_coo_tensor(torch.tensor([[1, 0, 1], [0, 1, 0]]), torch.tensor([1.0, 2.0, 3.0]), (2, 2))
    obj = {
        "coo": coo,
        "uncoalesced": unco,
        "csr": dense.to_sparse_csr(),
        "csc": dense.to_sparse_csc(),
        "bsr": dense.to_sparse_bsr((2, 2)),
    }
    src = tmp_path / "sparse.pt"
    torch.save(obj, src)
    cp, expect = check_file(torch, src)
    np.testing.assert_array_equal(cp.obj["uncoalesced"].to_dense(), unco.to_dense().numpy())
    out = tmp_path / "sparse_back.pt"
    torchless.save(cp.obj, out)
    check_torch_reads(torch, out, expect)


def test_meta_conj_neg_parameters(torch, tmp_path):
    c = torch.complex(torch.arange(4.0), torch.arange(4.0) + 10)
    c2 = c.clone()
    p = torch.nn.Parameter(torch.randn(3, 2))
    frozen = torch.nn.Parameter(torch.randn(2), requires_grad=False)
    obj = {
        "meta": torch.empty(3, 4, device="meta").t(),
        "meta_bf16": torch.empty(5, dtype=torch.bfloat16, device="meta"),
        "conj": c.conj(),
        "neg": c2.conj().imag,  # a neg view (imag of a conj view) over a complex storage
        "p": p,
        "frozen": frozen,
        "grad": torch.ones(2, requires_grad=True),
    }
    src = tmp_path / "flags.pt"
    torch.save(obj, src)
    cp, expect = check_file(torch, src)
    o = cp.obj
    assert o["conj"].is_conj() and o["neg"].is_neg()
    np.testing.assert_array_equal(o["conj"].numpy(), c.conj().resolve_conj().numpy())
    np.testing.assert_array_equal(o["neg"].numpy(), c2.conj().imag.resolve_neg().numpy())
    with pytest.raises(UnsupportedError):
        o["meta"].numpy()
    out = tmp_path / "flags_back.pt"
    torchless.save(o, out)
    check_torch_reads(torch, out, expect)


def test_parameter_with_state_and_subclass(torch, tmp_path):
    p = torch.nn.Parameter(torch.arange(3.0))
    p.note = "hello"
    src = tmp_path / "pstate.pt"
    torch.save({"p": p}, src)
    cp, expect = check_file(torch, src)
    assert cp.obj["p"].attrs == {"note": "hello"} and expect["p"].note == "hello"


def test_legacy_stream_format(torch, tmp_path):
    big = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    obj = {
        "a": big,
        "v": big[1:, :2],
        "s": torch.tensor([1, 2], dtype=torch.int16),
        "bf": torch.ones(3, dtype=torch.bfloat16),
        "c": torch.tensor([1 + 2j]),
    }
    src = tmp_path / "legacy.pt"
    torch.save(obj, src, _use_new_zipfile_serialization=False)
    assert open(src, "rb").read(4) == b"\x80\x02\x8a\x0a"
    cp, expect = check_file(torch, src)
    assert cp.layout == "legacy"
    out = tmp_path / "legacy_back.pt"
    torchless.save(cp.obj, out)
    check_torch_reads(torch, out, expect)


def test_legacy_stream_with_v3_dtype_torch_cannot_read_it_back(torch, tmp_path):
    """torch 2.13 writes uint16/float8 tensors in the legacy stream format as
    UntypedStorage pids but its own legacy loader fails on them (AttributeError:
    UntypedStorage has no dtype). torchless reads the saved values."""
    obj = {"u16": torch.tensor([1, 65535, 7], dtype=torch.uint16), "f8": torch.tensor([0.5, -2.0]).to(torch.float8_e4m3fn)}
    src = tmp_path / "legacy_v3.pt"
    torch.save(obj, src, _use_new_zipfile_serialization=False)
    with pytest.raises(AttributeError):
        torch_load(torch, src, weights_only=False)
    cp = load_tl(src)
    for k, v in obj.items():
        assert_tensor_matches(cp.obj[k], v)


def test_legacy_tar_format(torch, tmp_path):
    src = tmp_path / "old.tar"
    build_legacy_tar(src)
    expect = torch_load(torch, src, weights_only=False)
    with pytest.raises(Exception, match="legacy .tar format"):
        torch_load(torch, src, weights_only=True)
    cp = load_tl(src, weights_only=False)
    assert cp.layout == "tar"
    assert cp.obj["n"] == 4
    for k in ("w", "ids"):
        t, e = cp.obj[k], expect[k]
        assert t.shape == tuple(e.shape) and t.stride() == e.stride() and t.storage_offset() == e.storage_offset()
        assert t.dtype.torch_name == str(e.dtype)
        np.testing.assert_array_equal(t.numpy(), e.numpy())
    out = tmp_path / "old_back.pt"
    torchless.save(cp.obj, out)
    check_torch_reads(torch, out, expect)


def to_big_endian(src, dst) -> None:
    """Rewrite a torch zip checkpoint as a big-endian writer would have (spec §1.11):
    typed (v2) storages byte-swapped per element, UntypedStorage (v3) left alone."""
    cp = load_tl(src, weights_only=False)
    zr = ZipReader(src)
    with TorchZipWriter(dst, zr.prefix) as zw:
        for rec, e in zip(zr.records(), zr.entries, strict=False):
            data = zr.read_bytes(e)
            if rec == "byteorder":
                data = b"big"
            elif rec.startswith("data/"):
                st = cp.storages[rec[5:]]
                if st.dtype.itemsize > 1 and st.dtype.name != "uint8":
                    data = np.frombuffer(data, st.dtype.storage).byteswap().tobytes()
            zw.write(rec, data)


def test_big_endian_file(torch, tmp_path):
    obj = {name: make(torch, name) for name in ALL_DTYPES}
    obj["view"] = obj["float32"][1:, ::2]
    obj["q"] = torch.quantize_per_tensor(torch.linspace(-1, 1, 6), 0.01, 0, torch.qint32)
    src = tmp_path / "le.pt"
    torch.save(obj, src)
    dst = tmp_path / "be.pt"
    to_big_endian(src, dst)
    expect = torch_load(torch, dst, weights_only=True)
    cp = load_tl(dst)
    assert cp.byteorder == "big"
    assert_tree_matches(cp.obj, expect)
    # the v2 values are the original ones; v3 ones are torch's (unswapped) quirk
    original = torch_load(torch, src, weights_only=True)
    for name in ALL_DTYPES:
        if DTYPES[name].legacy_storage is not None:
            assert bytes(expect[name].untyped_storage()) == bytes(original[name].untyped_storage())
    out = tmp_path / "be_back.pt"
    torchless.save(cp.obj, out)
    check_torch_reads(torch, out, expect)


def test_crc0_and_4096_alignment_files(torch, tmp_path):
    import torch.utils.serialization  # (a submodule torch does not import by itself: run alone, it is missing)

    cfg = torch.utils.serialization.config.save
    obj = {"a": torch.arange(10, dtype=torch.float32), "b": torch.ones(3, 3, dtype=torch.int64)}
    crc0 = tmp_path / "crc0.pt"
    old = (cfg.compute_crc32, cfg.storage_alignment)
    try:
        cfg.compute_crc32 = False
        torch.save(obj, crc0)
        cfg.compute_crc32 = True
        cfg.storage_alignment = 4096
        aligned = tmp_path / "a4096.pt"
        torch.save(obj, aligned)
    finally:
        cfg.compute_crc32, cfg.storage_alignment = old
    cp, _ = check_file(torch, crc0)
    assert all(e.crc == 0 for e in cp.zip.entries)
    codes = {p.code for p in cp.zip.verify()}
    assert codes == {"crc-zero"}
    cp, _ = check_file(torch, aligned)
    assert cp.records[".storage_alignment"] == "4096"
    for e in cp.zip.entries:
        assert cp.zip.data_offset(e) % 4096 == 0
    # torchless writes the same layouts
    out = tmp_path / "tl4096.pt"
    torchless.save(cp.obj, out, alignment=4096, compute_crc=False)
    check_torch_reads(torch, out, torch_load(torch, aligned, weights_only=True))
    zr = ZipReader(out)
    assert all(zr.data_offset(e) % 4096 == 0 and e.crc == 0 for e in zr.entries)


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_pickle_protocols(torch, tmp_path, protocol):
    obj = {"a": torch.arange(5), "b": [torch.ones(2, dtype=torch.float16), {"c": 1.5, "s": "text" * 3}], "set": {4, 5}}
    src = tmp_path / f"p{protocol}.pt"
    torch.save(obj, src, pickle_protocol=protocol)
    cp, _ = check_file(torch, src, weights_only=False)
    assert cp.protocol == protocol


def test_torchless_save_of_numpy_and_torch_interop(torch, tmp_path):
    import ml_dtypes

    arrs = {
        "f32": np.arange(12, dtype=np.float32).reshape(3, 4),
        "fortran": np.asfortranarray(np.arange(6, dtype=np.int32).reshape(2, 3)),
        "bf16": np.arange(5).astype(ml_dtypes.bfloat16),
        "f8": np.linspace(-2, 2, 7).astype(ml_dtypes.float8_e4m3fn),
        "be": np.arange(4, dtype=">i4"),
        "u64": np.array([2**64 - 1, 0], dtype=np.uint64),
        "scalar": np.float64(2.5),
    }
    out = tmp_path / "np.pt"
    torchless.save(arrs, out)
    for kw in ({"weights_only": True}, {"weights_only": True, "mmap": True}):
        got = torch_load(torch, out, **kw)
        for k, a in arrs.items():
            if k == "scalar":
                assert got[k] == 2.5
                continue
            g = got[k]
            assert str(g.dtype) == DTYPES[torchless.core.dtypes.from_numpy(a.dtype).name].torch_name
            assert bytes(g.contiguous().untyped_storage()) == np.ascontiguousarray(a).astype(a.dtype.newbyteorder("=")).tobytes()
    # torch tensors are converted zero-copy and keep their sharing
    base = torch.arange(20, dtype=torch.float32)
    tobj = {
        "base": base,
        "view": base[3:9].view(2, 3),
        "p": torch.nn.Parameter(torch.ones(2)),
        "c": torch.tensor([1 + 1j]).conj(),
    }
    out2 = tmp_path / "from_torch.pt"
    torchless.save(tobj, out2)
    check_torch_reads(torch, out2, tobj)


def test_writer_layout_matches_torch_save(torch, tmp_path):
    """Same object, same prefix: identical bytes except the serialization id record
    (and the CRC it folds in)."""
    obj = {"w": torch.arange(6, dtype=torch.float32).reshape(2, 3), "b": torch.ones(2, dtype=torch.int64), "e": torch.empty(0)}
    a, b = tmp_path / "same.pt", tmp_path / "tl" / "same.pt"
    b.parent.mkdir()
    torch.save(obj, a)
    torchless.save(obj, b)
    ra, rb = open(a, "rb").read(), open(b, "rb").read()
    za, zb = ZipReader(a), ZipReader(b)
    assert za.names() == zb.names()
    for ea, eb in zip(za.entries, zb.entries, strict=False):
        assert (ea.header_offset, ea.size, ea.flags, ea.method) == (eb.header_offset, eb.size, eb.flags, eb.method)
        assert za.data_offset(ea) == zb.data_offset(eb)
        if not ea.name.endswith("serialization_id"):
            assert ea.crc == eb.crc, ea.name
            assert za.read_bytes(ea) == zb.read_bytes(eb), ea.name
    sid = za.get(".data/serialization_id")
    cut = sid.header_offset
    assert ra[:cut] == rb[:cut]
    assert len(ra) == len(rb)
    # the tail (central directory + zip64 end records) differs only in the id's CRC
    diff = [i for i in range(len(ra)) if ra[i] != rb[i]]
    sid_data = za.data_offset(sid)
    allowed = set(range(sid_data, sid_data + 40)) | set(range(sid_data + 44, sid_data + 48))
    allowed |= set(range(sid.central_offset + 16, sid.central_offset + 20))
    assert set(diff) <= allowed


def test_prefix_rules(torch, tmp_path):
    for fname, prefix in (("a.b.c.pt", "a.b.c"), ("x.tar.gz", "x.tar"), ("noext", "noext")):
        torch.save({"x": torch.ones(1)}, tmp_path / fname)
        torchless.save({"x": np.ones(1, np.float32)}, tmp_path / ("tl_" + fname))
        assert ZipReader(tmp_path / fname).prefix == prefix
        assert ZipReader(tmp_path / ("tl_" + fname)).prefix == "tl_" + prefix
    for fname, prefix in (("..pt", "."), ("é.pt", "archive"), (".hidden.pt", ".hidden"), ("x.y.", "x.y")):
        torch.save({"x": torch.ones(1)}, tmp_path / fname)
        assert ZipReader(tmp_path / fname).prefix == prefix
        torchless.save({"x": np.ones(1, np.float32)}, tmp_path / fname)
        assert ZipReader(tmp_path / fname).prefix == prefix
    with pytest.raises(RuntimeError, match="invalid file name"):
        torch.save({"x": torch.ones(1)}, tmp_path / ".pt")
    with pytest.raises(torchless.core.errors.UsageError, match="invalid file name"):
        torchless.save({"x": np.ones(1, np.float32)}, tmp_path / ".pt")
    assert not (tmp_path / ".pt").exists()
    buf = io.BytesIO()
    torchless.save({"x": np.ones(1, np.float32)}, buf)
    assert ZipReader(buf.getvalue()).prefix == "archive"
    assert torch.load(io.BytesIO(buf.getvalue()), weights_only=True)["x"].tolist() == [1.0]


def test_member_names_with_leading_spaces(torch, tmp_path):
    # a prefix starting with spaces: torch looks records up as " sp/data.pkl", so must we
    from torchless.formats.pt.write import save_checkpoint

    p = tmp_path / "sp.pt"
    save_checkpoint({"w": np.arange(4, dtype=np.float32)}, p, prefix="  sp")
    assert ZipReader(p).prefix == "  sp"
    ours = torchless.load(p)["w"].numpy()
    theirs = torch.load(p, weights_only=True)["w"].numpy()
    assert np.array_equal(ours, theirs) and theirs.tolist() == [0.0, 1.0, 2.0, 3.0]


def test_torchscript_zip_is_not_an_eager_checkpoint(torch, tmp_path):
    m = torch.jit.script(torch.nn.Linear(2, 2))
    p = tmp_path / "ts.pt"
    m.save(str(p))
    with pytest.raises(FormatError, match="TorchScript"):
        load_tl(p)


def test_old_zip_without_byteorder_or_alignment_records(torch, tmp_path):
    src = tmp_path / "new.pt"
    torch.save({"a": torch.arange(4, dtype=torch.int32)}, src)
    zr = ZipReader(src)
    dst = tmp_path / "old.pt"
    with TorchZipWriter(dst, zr.prefix) as zw:
        for rec, e in zip(zr.records(), zr.entries, strict=False):
            if rec in ("byteorder", ".storage_alignment", ".data/serialization_id", ".format_version"):
                continue
            zw.write(rec, zr.read_bytes(e))
    cp, _ = check_file(torch, dst)
    assert cp.byteorder == "little" and "byteorder" not in cp.records


def test_weights_only_refuses_unknown_globals_like_torch(torch, tmp_path):
    src = tmp_path / "ns.pt"
    import argparse

    torch.save({"args": argparse.Namespace(lr=0.1), "t": torch.ones(1)}, src)
    with pytest.raises(Exception, match="argparse.Namespace"):
        torch_load(torch, src, weights_only=True)
    # torchless's default allowlist knows Namespace is data; torch's table refuses it
    cp = load_tl(src, weights_only=True)
    assert cp.obj["args"].lr == 0.1
    from torchless.formats.pt.read import make_resolver
    from torchless.pickle.torch_globals import TORCH_ALLOWLIST

    with pytest.raises(UnsafeGlobalError, match="argparse.Namespace"):
        read_checkpoint(open_source(src), resolver=make_resolver(True, TORCH_ALLOWLIST))


@pytest.mark.parametrize("name", ["float4_e2m1fn_x2", "bits8", "bits16", "bits1x8", "bits2x4", "bits4x2", "quint4x2", "quint2x4"])
def test_packed_and_bits_dtypes(torch, tmp_path, name):
    dt = getattr(torch, name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if name.startswith("quint"):
            t = torch.quantize_per_tensor(torch.linspace(0, 1, 6), 0.1, 1, dt)
        elif name == "bits16":
            t = torch.arange(6, dtype=torch.int16).view(dt)
        else:
            t = torch.arange(6, dtype=torch.uint8).view(dt)
    src = tmp_path / "p.pt"
    torch.save({"t": t}, src)
    expect = torch_load(torch, src, weights_only=True)
    cp = load_tl(src)
    got = cp.obj["t"]
    assert got.dtype.torch_name == str(dt) and got.shape == tuple(expect["t"].shape) and got.stride() == expect["t"].stride()
    assert bytes(got.storage.bytes()) == bytes(expect["t"].untyped_storage())
    out = tmp_path / "p_back.pt"
    torchless.save(cp.obj, out)
    back = torch_load(torch, out, weights_only=True)["t"]
    assert back.dtype == dt and bytes(back.untyped_storage()) == bytes(expect["t"].untyped_storage())


def test_torch_predicts_torchless_offsets(torch, tmp_path, monkeypatch):
    """torch.load(mmap=True) with calculate_storage_offsets computes every record's
    offset from the writer's exact layout (spec §1.12) instead of reading headers; with
    TORCH_SERIALIZATION_DEBUG it asserts the prediction. Empty storages included."""
    monkeypatch.setenv("TORCH_SERIALIZATION_DEBUG", "1")
    obj = {
        "a": np.arange(10, dtype=np.float32),
        "empty": np.zeros(0, np.int64),
        "b": np.ones((3, 3), np.float16),
        "e2": np.zeros((0, 4), np.float32),
        "c": np.arange(100, dtype=np.uint8),
    }
    out = tmp_path / "pred.pt"
    torchless.save(obj, out)
    cfg = torch.utils.serialization.config.load
    old = cfg.calculate_storage_offsets
    try:
        cfg.calculate_storage_offsets = True
        got = torch_load(torch, out, weights_only=True, mmap=True)
    finally:
        cfg.calculate_storage_offsets = old
    for k, a in obj.items():
        assert got[k].numpy().tobytes() == a.tobytes() and tuple(got[k].shape) == a.shape


def test_byteorder_record_variants(torch, tmp_path):
    src = tmp_path / "nobo.pt"
    torch.save({"a": torch.arange(3, dtype=torch.int16)}, src, _disable_byteorder_record=True)
    zr = ZipReader(src)
    recs = zr.records()
    assert recs.index("byteorder") > recs.index("version")  # appended by writeEndOfFile
    check_file(torch, src)
    bad = tmp_path / "bad_bo.pt"
    with TorchZipWriter(bad, zr.prefix) as zw:
        for rec, e in zip(recs, zr.entries, strict=False):
            zw.write(rec, b"middle" if rec == "byteorder" else zr.read_bytes(e))
    with pytest.raises(ValueError, match="Unknown endianness"):
        torch_load(torch, bad, weights_only=True)
    with pytest.raises(FormatError, match="byte order"):
        load_tl(bad)


@pytest.mark.parametrize("mmap", [False, True])
def test_load_reads_the_file_it_opened_after_a_rename_over_it(torch, tmp_path, mmap):
    """A checkpoint replaced by rename after it was loaded (what a training job's atomic
    save does): the tensors are those of the file that was loaded, as torch gives them.
    With mmap=False storages are read when first used, and were read from the path
    opened again: the new file's bytes at the old offsets."""
    path = tmp_path / "ckpt.pt"
    g = torch.Generator().manual_seed(0)
    first = {f"w{i}": torch.randn(300 + i, generator=g) for i in range(5)}
    torch.save(first, path)
    expect = torch.load(path, mmap=False, weights_only=True)
    sd = torchless.load(path, mmap=mmap)
    other = tmp_path / "next.pt"
    torch.save({k: torch.full_like(v, 7.0) for k, v in first.items()}, other)
    os.replace(other, path)
    for k, v in expect.items():
        assert sd[k].numpy().tobytes() == v.numpy().tobytes(), k
