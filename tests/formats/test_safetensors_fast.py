"""The fast ways of issue 33 against the general code, on the same inputs in every run:
the safetensors header checked all at once (``SETTINGS.safetensors_header``) and
``Tensor.numpy()``'s one-frombuffer path (``SETTINGS.tensor_numpy``); plus the
safetensors package as the oracle, and ``mmap=False`` reading a safetensors file into
memory of its own."""

from __future__ import annotations

import json
import struct

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

import torchless
import torchless.core.tensor as tensor_mod
import torchless.formats.safetensors_spec as spec
from torchless.core.dtypes import DTYPES
from torchless.core.errors import TorchlessError
from torchless.core.settings import SETTINGS
from torchless.core.tensor import Storage, Tensor
from torchless.io.source import BytesSource

CODES = {"F32": 4, "F16": 2, "BF16": 2, "I64": 8, "U8": 1, "BOOL": 1, "F8_E4M3": 1}


def _both(monkeypatch: pytest.MonkeyPatch, fn):  # type: ignore[no-untyped-def]
    """``fn()`` with the fast way, then with the general one: each a result or the error."""
    out = []
    for fast in (True, False):
        monkeypatch.setattr(SETTINGS, "safetensors_header", fast)
        try:
            out.append(("ok", fn()))
        except TorchlessError as e:
            out.append((type(e).__name__, str(e)))
    return out


@hs.composite
def headers(draw):  # type: ignore[no-untyped-def]
    """Header text (valid or broken in one of the ways the rules name) and its data size."""
    n = draw(hs.integers(0, 6))
    names = draw(hs.lists(hs.sampled_from(["a", "b", "c:d", "e", "__metadata__x", "f\\"]), min_size=n, max_size=n, unique=True))
    ents, off = [], 0
    for name in names:
        code = draw(hs.sampled_from(sorted(CODES)))
        shape = draw(hs.lists(hs.integers(0, 3), max_size=3))
        size = int(np.prod(shape)) * CODES[code]
        ents.append([name, {"dtype": code, "shape": shape, "data_offsets": [off, off + size]}])
        off += size
    if draw(hs.booleans()):
        ents.reverse()  # another JSON order than the data's
    how = draw(
        hs.sampled_from(
            ["ok", "dup", "dupzero", "dupkey", "bool", "neg", "size", "hole", "extra", "code", "meta", "metadup", "nest", "trail"]
        )
    )
    meta = {"format": "pt"} if draw(hs.booleans()) else None
    pairs = [json.dumps(k) + ":" + json.dumps(v) for k, v in ents]
    if ents and how in ("dup", "dupzero"):
        k, v = ents[draw(hs.integers(0, len(ents) - 1))]
        if how == "dupzero":
            v = {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]}
        pairs.append(json.dumps(k) + ":" + json.dumps(v))
    if ents and how == "dupkey":
        pairs[0] = pairs[0][:-1] + ',"dtype":"F32"}'
    if ents and how in ("bool", "neg", "size", "hole", "extra", "code", "nest"):
        k, v = ents[0]
        v = dict(v)
        if how == "bool":
            v["shape"] = [True] + v["shape"]
        elif how == "neg":
            v["data_offsets"] = [-1, v["data_offsets"][1]]
        elif how == "size":
            v["data_offsets"] = [v["data_offsets"][0], v["data_offsets"][1] + 1]
        elif how == "hole":
            v["data_offsets"] = [x + 4 for x in v["data_offsets"]]
        elif how == "extra":
            v["x"] = 1
        elif how == "code":
            v["dtype"] = ["F32"]
        elif how == "nest":
            v["shape"] = [{"a": 1}]
        pairs[0] = json.dumps(k) + ":" + json.dumps(v)
    if how == "meta":
        meta = {"k": 1}
    if meta is not None:
        pairs.insert(0, '"__metadata__":' + json.dumps(meta))
    if how == "metadup":
        pairs.insert(0, '"__metadata__":{"a":"1","a":"2"}')
    return "{" + ",".join(pairs) + "}", off + (3 if how == "trail" else 0)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(headers())
def test_fast_header_checks_agree_with_the_general_ones(monkeypatch, case):  # type: ignore[no-untyped-def]
    text, size = case
    raw = text.encode()
    raw += b" " * (-len(raw) % 8)
    blob = struct.pack("<Q", len(raw)) + raw + bytes(size)
    fast, general = _both(monkeypatch, lambda: spec.parse_header(BytesSource(blob, "x.safetensors")))
    assert fast == general


def test_a_duplicate_of_an_empty_tensor_is_refused(monkeypatch):  # type: ignore[no-untyped-def]
    """Two entries of one name that collapse into one consistent entry: no hole betrays
    them, the count of keys does."""
    raw = b'{"a":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},"a":{"dtype":"F32","shape":[0],"data_offsets":[0,0]}}'
    blob = struct.pack("<Q", len(raw)) + raw
    for res in _both(monkeypatch, lambda: spec.parse_header(BytesSource(blob, "x.safetensors"))):
        assert res[0] == "FormatError" and "duplicate" in res[1]


def _numpy_both(monkeypatch: pytest.MonkeyPatch, t: Tensor, raw: bool = False):  # type: ignore[no-untyped-def]
    out = []
    for fast in (True, False):
        monkeypatch.setattr(SETTINGS, "tensor_numpy", fast)
        try:
            a = t.numpy(raw=raw)
            out.append(("ok", a.dtype, a.shape, a.tobytes(), a.flags.writeable))
        except TorchlessError as e:
            out.append((type(e).__name__, str(e)))
    return out


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    dtype=hs.sampled_from(["float32", "bfloat16", "float8_e4m3fn", "int64", "bool", "complex64", "complex32", "qint8"]),
    shape=hs.lists(hs.integers(0, 4), max_size=3),
    offset=hs.integers(0, 3),
    extra=hs.integers(-8, 8),
    layout=hs.sampled_from(["c", "transposed", "size1", "given"]),
    order=hs.sampled_from(["little", "big"]),
    meta=hs.sampled_from([None, {"neg": True}, {"conj": True}]),
    raw=hs.booleans(),
)
def test_fast_numpy_agrees_with_the_general_view(monkeypatch, dtype, shape, offset, extra, layout, order, meta, raw):  # type: ignore[no-untyped-def]
    dt = DTYPES[dtype]
    shape = tuple(shape)
    numel = int(np.prod(shape))
    strides = list(tensor_mod._contiguous_strides(shape))
    if layout == "transposed" and len(shape) > 1:
        strides = strides[::-1]
    elif layout == "size1" and shape:
        strides[0] = 7 if shape[0] == 1 else strides[0]
    nbytes = max(0, (offset + numel) * dt.itemsize + extra)
    data = bytes((i * 37) % 251 for i in range(nbytes))
    st = Storage("0", nbytes, dt, data=data, byteorder=order)
    try:
        t = Tensor(st, dt, shape, tuple(strides), offset, metadata=meta)
    except TorchlessError:
        return
    fast, general = _numpy_both(monkeypatch, t, raw)
    assert fast == general  # (the arrays' writeable flags included)


def test_safetensors_files_read_as_the_package_reads_them(tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    from safetensors.numpy import load_file, save_file

    rng = np.random.default_rng(0)
    d = {
        f"t{i}": rng.standard_normal(rng.integers(0, 5, size=rng.integers(0, 4))).astype(dt)
        for i, dt in enumerate([np.float32, np.float16, ml_dtypes.bfloat16, np.int64, np.uint8] * 8)
    }
    p = tmp_path / "m.safetensors"
    save_file(d, str(p), metadata={"a": "b:c"})  # (a ':' inside a string: the general check decides)
    want = load_file(str(p))
    for fast in (True, False):
        monkeypatch.setattr(SETTINGS, "safetensors_header", fast)
        monkeypatch.setattr(SETTINGS, "tensor_numpy", fast)
        for mmap in (True, False):
            got = {k: v.numpy() for k, v in torchless.load(p, mmap=mmap).items()}
            assert sorted(got) == sorted(want)
            for k, v in want.items():
                assert got[k].dtype == v.dtype and got[k].shape == v.shape and got[k].tobytes() == v.tobytes()


def test_mmap_false_reads_a_safetensors_file_into_memory_of_its_own(tmp_path):  # type: ignore[no-untyped-def]
    """``mmap=False`` (the policy: "read each into its own buffer") was ignored by the
    safetensors reader: the arrays were views of the file's mapping, and changed with the
    file. Now the data is read at once; the arrays keep the values loaded."""
    from safetensors.numpy import save_file

    p = tmp_path / "m.safetensors"
    save_file({"a": np.arange(1024, dtype=np.float32), "b": np.ones(8, np.int64)}, str(p))
    got = {k: v.numpy() for k, v in torchless.load(p, mmap=False).items()}
    size = p.stat().st_size
    with open(p, "r+b") as f:  # the same file changed in place (no new inode)
        f.seek(size - 4200)
        f.write(b"\xff" * 4200)
    assert np.array_equal(got["a"], np.arange(1024, dtype=np.float32))
    assert np.array_equal(got["b"], np.ones(8, np.int64))
    assert not got["a"].flags.writeable


def _arrays(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    for i, dt in enumerate(
        [np.float32, np.float16, ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn, np.int64, np.uint8, np.bool_, np.complex64]
    ):
        shape = tuple(rng.integers(0, 4, size=rng.integers(0, 4)))
        out[f"w{i}.{seed}"] = np.asarray(rng.standard_normal(shape) * 5).astype(dt)  # (0-d: an array, not a scalar)
    return out


@pytest.mark.parametrize("fmt", ["safetensors", "pt"])
@pytest.mark.parametrize("seed", range(6))
def test_a_dict_of_numpy_arrays_is_written_as_the_general_path_writes_it(tmp_path, monkeypatch, fmt, seed):  # type: ignore[no-untyped-def]
    """The same bytes with and without the plain-array writer, including inputs it leaves
    to the general path (a transposed array, another byte order, a name it cannot take)."""

    d = _arrays(seed)
    if fmt == "safetensors":
        d.pop(f"w7.{seed}")  # (no complex dtype in safetensors)
    if seed == 3:
        d["t"] = np.arange(6, dtype=np.float32).reshape(2, 3).T
    if seed == 4:
        d["be"] = np.arange(3, dtype=">i4")
    if seed == 5:
        d["__metadata__" if fmt == "safetensors" else "ok"] = np.zeros(2, np.float32)
    got = {}
    for fast in (True, False):
        monkeypatch.setattr(SETTINGS, "safetensors_arrays", fast)
        monkeypatch.setattr(SETTINGS, "pt_pickle", fast)
        (tmp_path / str(fast)).mkdir()
        p = tmp_path / str(fast) / f"m.{fmt}"  # (one name: a .pt's folder inside is the file's stem)
        try:
            torchless.save(d, p)
            got[fast] = p.read_bytes()
        except TorchlessError as e:
            got[fast] = type(e).__name__
    assert got[True] == got[False]
    if fmt == "pt" and isinstance(got[True], bytes):  # torch reads it back (the oracle)
        torch = pytest.importorskip("torch", reason="torch is the oracle")
        back = torch.load(tmp_path / "True" / "m.pt", weights_only=True)
        assert list(back) == list(d)
        for k, v in d.items():
            assert back[k].shape == v.shape
            assert (
                back[k].contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
                == np.ascontiguousarray(v).astype(v.dtype.newbyteorder("<")).tobytes()
            )


def test_neg_bit_on_bool_is_a_format_error():  # type: ignore[no-untyped-def]
    # torch cannot resolve it either ("neg_cpu" not implemented for 'Bool'); a hostile
    # file's metadata must give a TorchlessError, not NumPy's TypeError
    st = Storage("0", 2, DTYPES["bool"], data=b"\x01\x00")
    t = Tensor(st, DTYPES["bool"], (2,), (1,), 0, metadata={"neg": True})
    with pytest.raises(TorchlessError, match="neg bit on a bool"):
        t.numpy()
    assert t.numpy(raw=True).tolist() == [True, False]
