"""Differential fuzzing of eager checkpoints against torch (issues 11, 31).

Read direction: a random nested checkpoint (every dtype, complex32 included, views with
conj/neg bits, empty, 0-d and high-rank tensors, shared and empty-shared storages (some
retyped), Parameters requiring grad (v3 dtypes too), quantized tensors of every qscheme
torch builds (per tensor, per channel, per channel with float qparams, packed), sparse
COO/CSR/CSC/BSR/BSC, nested tensors (0-d components, Parameters, attributes), jagged
nested tensors (lengths, ragged dimension 2, cached lengths, attributes), meta
tensors, Python containers shared by identity and scalars, bytes and str) is written by
``torch.save`` with a random pickle protocol 0-5 and layout (zip, the legacy stream, zip with
4096-byte alignment and CRC-32 fields 0, a zip re-encoded by Python's zipfile with
deflated records, one without the records torch 2.1+ adds, a zip turned big-endian), loaded by
torchless and by ``torch.load``, and the two trees compared: value bytes, dtype, shape,
stride, offset, flags, storage sharing, object identity and container types; complex32
values bit for bit (NaN payloads included) as torch resolves and widens them. A protocol-0
file with tensors (torch refuses its text persistent ids) must be refused by torchless too.

Write direction: what torchless loaded is saved by ``torchless.save`` and loaded by
``torch.load`` with ``weights_only`` True and False and ``mmap=True``, and compared with
torch's own load of the original; the torch objects themselves are saved by torchless
too (the writer's coercion of torch tensors).

Used by ``tests/formats/test_pt_differential_fuzz.py`` (seeded, bounded) and
``scripts/fuzz_pt.py`` (long runs).
"""

from __future__ import annotations

import collections
import io
import math
import pickle
import sys
import warnings
import zipfile
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from tl_testutil import assert_tensor_matches, torch_value_bytes, untyped_storage_bytes

import torchless
from torchless.core.tensor import JaggedTensor, NestedTensor, SparseTensor, Tensor
from torchless.core.values import StateDict

#: every dtype torch.save writes for dense tensors (classic ones through typed storages,
#: the newer ones through UntypedStorage)
DENSE = [
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
    "complex32",
    "complex64",
    "complex128",
    "float8_e4m3fn",
    "float8_e5m2",
    "float8_e4m3fnuz",
    "float8_e5m2fnuz",
    "float8_e8m0fnu",
]
LAYOUTS = ["zip", "legacy", "zip-deflated", "zip-big-endian", "zip-4096-nocrc", "zip-old-records"]
#: every pickle protocol torch.save takes (0 and 1 write the legacy magic number as text)
PROTOCOLS = [0, 1, 2, 3, 4, 5]


@dataclass
class Stats:
    """Counts of one fuzz run (written into docs/pt.md by scripts/fuzz_pt.py)."""

    cases: int = 0
    tensors: int = 0
    by_layout: dict[str, int] = field(default_factory=dict)
    by_protocol: dict[int, int] = field(default_factory=dict)
    writes: int = 0
    dtypes: set[str] = field(default_factory=set)
    kinds: set[str] = field(default_factory=set)  # the special leaves generated
    refusals: int = 0  # cases torch refuses to load, checked refused by torchless too


class Gen:
    """Random checkpoints from one seed (torch objects)."""

    def __init__(self, seed: int) -> None:
        import torch

        self.torch = torch
        self.rng = np.random.default_rng(seed)
        self.nested = True  # torch's legacy format mangles nested tensors (torch's bug)
        self.kinds: set[str] = set()

    def pick(self, seq: Any) -> Any:
        return seq[int(self.rng.integers(len(seq)))]

    def coin(self, p: float = 0.5) -> bool:
        return bool(self.rng.random() < p)

    def base(self, dtype: str) -> Any:
        torch = self.torch
        if self.coin(0.1):  # high rank, small sides
            shape = tuple(int(s) for s in self.rng.integers(1, 3, size=int(self.rng.integers(4, 8))))
        else:
            shape = tuple(int(s) for s in self.rng.integers(0, 5, size=int(self.rng.integers(0, 4))))
        n = math.prod(shape)
        td = getattr(torch, dtype)
        isz = torch.empty(0, dtype=td).element_size()
        raw = self.rng.integers(0, 256, size=n * isz, dtype=np.uint8)
        if dtype == "bool":
            raw &= 1
        t = torch.frombuffer(bytearray(raw.tobytes()), dtype=torch.uint8) if n else torch.empty(0, dtype=torch.uint8)
        return t.view(td).reshape(shape) if n else torch.empty(shape, dtype=td)

    def view(self, t: Any) -> Any:
        for _ in range(int(self.rng.integers(0, 3))):
            k = self.pick(["slice", "T", "select", "expand", "narrow", "strided"])
            if k == "slice" and t.dim() and t.shape[0]:
                t = t[int(self.rng.integers(0, t.shape[0])) :: int(self.rng.integers(1, 3))]
            elif k == "T" and t.dim() >= 2:
                t = t.transpose(0, t.dim() - 1)
            elif k == "select" and t.dim() and t.shape[-1]:
                t = t.select(-1, int(self.rng.integers(0, t.shape[-1])))
            elif k == "expand" and t.dim() and t.shape[-1] == 1:
                t = t.expand(*t.shape[:-1], 3)
            elif k == "narrow" and t.dim() and t.shape[0] > 1:
                t = t.narrow(0, 1, t.shape[0] - 1)
            elif k == "strided" and t.numel() > 2 and t.is_contiguous():
                t = t.flatten().as_strided((2,), (2,), 1 + t.storage_offset()) if t.numel() >= 5 else t
        if t.is_complex() and self.coin(0.3):  # (one bit: torch cannot resolve both on complex32)
            t = t.conj() if self.coin() else t._neg_view()
        return t

    def special(self) -> Any:
        torch = self.torch
        k = self.pick(
            ["qt", "qc", "qf", "q4", "coo", "csr", "csc", "bsr", "bsc", "nested", "nested0", "nparam", "nattr"]
            + ["meta", "param", "param3", "attr", "njag", "njlen", "njdim", "njattr"]
        )
        if k.startswith("n") and not self.nested:
            k = "coo"
        self.kinds.add(k)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if k == "qt":
                return torch.quantize_per_tensor(
                    torch.linspace(-2, 2, 6), 0.05, 3, self.pick([torch.quint8, torch.qint8, torch.qint32])
                )
            if k == "qc":
                return torch.quantize_per_channel(
                    torch.randn(3, 2, generator=torch.Generator().manual_seed(int(self.rng.integers(1 << 30)))),
                    torch.tensor([0.1, 0.2, 0.3], dtype=torch.float64),
                    torch.tensor([0, 1, 2]),
                    0,
                    torch.quint8,
                )
            if k == "qf":  # per_channel_affine_float_qparams: float zero points
                return torch.quantize_per_channel(
                    torch.randn(2, 3, generator=torch.Generator().manual_seed(int(self.rng.integers(1 << 30)))),
                    torch.tensor([0.1, 0.2, 0.3]),
                    torch.tensor([0.0, 1.5, -2.0]),
                    1,
                    torch.quint8,
                )
            if k == "q4":
                return torch.quantize_per_tensor(torch.linspace(0, 1, 5), 0.1, 0, self.pick([torch.quint4x2, torch.quint2x4]))
            if k == "coo":
                return torch.sparse_coo_tensor(torch.tensor([[0, 2], [1, 0]]), torch.tensor([1.5, -2.0]), (3, 2))
            if k == "csr":
                return torch.arange(6.0).reshape(2, 3).to_sparse_csr()
            if k in ("csc", "bsr", "bsc"):
                d = torch.arange(1.0, 7.0).reshape(2, 3) * torch.tensor([1.0, 0.0, 1.0])
                return d.to_sparse_csc() if k == "csc" else d.to_sparse(layout=getattr(torch, f"sparse_{k}"), blocksize=(1, 1))
            if k == "nested":
                return torch.nested.nested_tensor([torch.ones(2), torch.arange(3.0)])
            if k == "nested0":  # components of 0 dimensions: sizes of shape (n, 0)
                return torch.nested.nested_tensor([torch.tensor(float(i)) for i in range(int(self.rng.integers(1, 4)))])
            if k == "nparam":
                return torch.nn.Parameter(torch.nested.nested_tensor([torch.ones(2, 2), torch.zeros(1, 2)]))
            if k == "nattr":
                n = torch.nested.nested_tensor([torch.arange(2.0)])
                n.note = "nested"
                return n
            if k.startswith("nj"):
                return self.jagged(k)
            if k == "param3":  # dtypes rebuilt by _rebuild_tensor_v3, requiring grad
                return torch.nn.Parameter(self.base(self.pick(["float8_e4m3fn", "float8_e5m2", "complex32"])))
            if k == "meta":
                return torch.empty(2, 3, dtype=self.pick([torch.float32, torch.bfloat16, torch.uint16]), device="meta")
            if k == "param":
                return torch.nn.Parameter(
                    self.base(self.pick(["float32", "float16", "bfloat16", "float64"])), requires_grad=self.coin()
                )
            t = self.base("float32")
            t.note = self.pick(["a", 1, (2, 3)])
            return t

    def jagged(self, k: str) -> Any:
        """A jagged-layout nested tensor: from items (lengths cached), over values with
        offsets and lengths (holes between items), ragged in dimension 2, with an
        attribute."""
        torch = self.torch
        dtype = self.pick(["float32", "float16", "bfloat16", "int64", "float64"])
        inner = tuple(int(s) for s in self.rng.integers(0, 3, size=int(self.rng.integers(0, 3))))
        counts = [int(c) for c in self.rng.integers(0, 4, size=int(self.rng.integers(1, 4)))]
        if k == "njdim":  # ragged in the second dimension of values
            lead = int(self.rng.integers(1, 3))
            vals = self.base_of(dtype, (lead, sum(counts), *inner))
            offs = torch.tensor(np.cumsum([0, *counts]), dtype=torch.int64)
            return torch.nested.nested_tensor_from_jagged(vals, offsets=offs, jagged_dim=2)
        if k == "njlen":  # lengths shorter than the offsets' gaps
            gaps = [c + int(self.rng.integers(0, 2)) for c in counts]
            vals = self.base_of(dtype, (sum(gaps), *inner))
            offs = torch.tensor(np.cumsum([0, *gaps]), dtype=torch.int64)
            return torch.nested.nested_tensor_from_jagged(vals, offsets=offs, lengths=torch.tensor(counts, dtype=torch.int64))
        items = [self.base_of(dtype, (c, *inner)) for c in counts]
        nt = torch.nested.nested_tensor(items, layout=torch.jagged, requires_grad=dtype != "int64" and self.coin(0.3))
        if k == "njattr":
            nt.note = self.pick(["j", 2, (1, 2)])
        return nt

    def base_of(self, dtype: str, shape: tuple[int, ...]) -> Any:
        torch = self.torch
        t = torch.from_numpy(self.rng.standard_normal(shape) * 4)
        return t.to(getattr(torch, dtype))

    def scalar(self) -> Any:
        torch = self.torch
        return self.pick(
            [
                lambda: int(self.rng.integers(-(2**40), 2**40)),
                lambda: float(self.rng.normal()),
                lambda: float("nan"),
                lambda: float("-inf"),
                lambda: "s" * int(self.rng.integers(0, 4)),
                lambda: b"\x00\xff",
                lambda: b"",
                lambda: bytearray(),
                lambda: "\u00e9\U0001f600",
                lambda: None,
                lambda: True,
                lambda: complex(1.5, -2),
                lambda: torch.Size([2, 3]),
                lambda: torch.float8_e5m2,
                lambda: torch.device("cpu"),
                lambda: bytearray(b"ab"),
                lambda: {1, 2},
                lambda: collections.Counter(a=2),
                self.numpy_value,
            ]
        )()

    def numpy_value(self) -> Any:
        """NumPy values torchless keeps as NumPy (written back as NumPy pickles them)."""
        shape = tuple(int(s) for s in self.rng.integers(0, 4, size=int(self.rng.integers(0, 3))))
        n = math.prod(shape)
        order = "F" if self.coin() else "C"
        k = self.pick(["str", "dt", "td", "struct", "obj", "dtype", "scalar", "be"])
        if k == "str":
            return np.array(["ab", "c", "", "xyz"] * n, dtype=self.pick(["<U3", ">U3", "S3"]))[:n].reshape(shape, order=order)
        if k == "dt":
            return (np.arange(n) * 1000).astype(self.pick(["<M8[ms]", ">M8[10s]", "<M8[D]"])).reshape(shape, order=order)
        if k == "td":
            return np.arange(n).astype(self.pick(["<m8[us]", ">m8[h]"])).reshape(shape)
        if k == "struct":
            dt = np.dtype({"names": ["a", "b"], "formats": ["<i4", ">f8"], "offsets": [0, 8], "itemsize": 24})
            a = np.zeros(n, dt)
            a["a"] = np.arange(n)
            return a.reshape(shape)
        if k == "obj":
            a = np.empty(shape, object, order=order)
            for i, idx in enumerate(np.ndindex(shape)):
                a[idx] = self.pick([i, "s", None, (i, 1.5)])
            return a
        if k == "dtype":
            return self.pick(
                [np.dtype(">i4"), np.dtype("<M8[ns]"), np.dtype([("x", "u1"), ("y", "<f4")], align=True), np.dtype(("<i2", (2,)))]
            )
        if k == "scalar":
            return self.pick([np.datetime64("2020-01-02", "ms"), np.timedelta64(3, "D"), np.str_("abc")])
        return np.zeros(shape, dtype=self.pick([">U2", ">M8[s]"]))

    def checkpoint(self) -> Any:
        leaves: list[Any] = []
        for _ in range(int(self.rng.integers(1, 5))):
            b = self.base(self.pick(DENSE))
            leaves.append(b)
            for _ in range(int(self.rng.integers(0, 3))):
                leaves.append(self.view(b))
            if self.coin(0.2):
                leaves.append(b)  # the same object again
        if self.coin(0.2):
            # empty tensors sharing one storage, some viewing it as another dtype of the
            # same size (torch skips its dtype check for data pointer 0)
            dtype = self.pick(["bfloat16", "float16", "int16", "float32", "int32"])
            e = self.base(dtype).new_empty((0, 2))
            twin = {"bfloat16": "float16", "float16": "bfloat16", "int16": "float16", "float32": "int32", "int32": "float32"}
            leaves += [e, e[0:0], e.view(getattr(self.torch, twin[dtype])), e.view(0)]
            self.kinds.add("empty-shared")
        if self.coin(0.6):
            leaves.append(self.special())
        for _ in range(int(self.rng.integers(0, 3))):
            leaves.append(self.scalar())
        order = self.rng.permutation(len(leaves))
        kind = self.pick(["dict", "state_dict", "nested"])
        if kind == "state_dict":
            out: Any = collections.OrderedDict()
            out._metadata = collections.OrderedDict({"": {"version": 1}})  # type: ignore[attr-defined]
        else:
            out = {}
        for i in order:
            where = self.pick(["top", "list", "tuple", "dict"]) if kind == "nested" else "top"
            leaf = leaves[int(i)]
            if where == "top":
                out[f"k{i}"] = leaf
            elif where == "list":
                out.setdefault("list", []).append(leaf)
            elif where == "tuple":
                out[f"t{i}"] = (leaf, int(i))
            else:
                out.setdefault("sub", {})[f"s{i}"] = leaf
        if kind == "nested" and self.coin(0.3):
            shared = [1, "x"]  # one container object twice: one object after loading
            out = [out, {"epoch": 3, "a": shared}, shared]
            self.kinds.add("shared-container")
        return out

    def tensorless(self) -> Any:
        """A checkpoint without tensors (protocol 0 writes a storage's persistent id as
        text, which torch's loader refuses)."""
        return {f"s{i}": self.scalar() for i in range(int(self.rng.integers(1, 5)))}


# -- writing and re-encoding ---------------------------------------------------------------
def torch_save(obj: Any, layout: str, protocol: int) -> bytes:
    import torch
    from torch.utils.serialization import config

    buf = io.BytesIO()
    if layout == "zip-4096-nocrc":  # torch's own options: 4096-byte alignment, CRC-32 fields 0
        old = (config.save.storage_alignment, config.save.compute_crc32)
        config.save.storage_alignment, config.save.compute_crc32 = 4096, False
        try:
            torch.save(obj, buf, pickle_protocol=protocol)
        finally:
            config.save.storage_alignment, config.save.compute_crc32 = old
        return buf.getvalue()
    torch.save(obj, buf, pickle_protocol=protocol, _use_new_zipfile_serialization=(layout != "legacy"))
    data = buf.getvalue()
    if layout == "zip-old-records":  # torch 1.6-2.0 files: no byteorder/alignment/id records
        return rezip(data, drop={"byteorder", ".format_version", ".storage_alignment", ".data/serialization_id"})
    if layout == "zip-deflated":
        return rezip(data, deflate=True)
    if layout == "zip-big-endian":
        return big_endian(data)
    return data


def rezip(
    data: bytes,
    *,
    deflate: bool = False,
    byteorder: str | None = None,
    swap: dict[str, int] | None = None,
    drop: set[str] | None = None,
) -> bytes:
    """The same records written by Python's zipfile (no alignment, no descriptors),
    optionally deflated, with another byte order record and storages swapped."""
    src = zipfile.ZipFile(io.BytesIO(data))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED if deflate else zipfile.ZIP_STORED) as zf:
        for info in src.infolist():
            body = src.read(info)
            rel = info.filename.split("/", 1)[1]
            if drop and rel in drop:
                continue
            if byteorder is not None and rel == "byteorder":
                body = byteorder.encode()
            if swap and rel.startswith("data/") and swap.get(rel[5:], 1) > 1:
                u = swap[rel[5:]]
                body = np.frombuffer(body, dtype=f"<u{u}").astype(f">u{u}").tobytes()
            zf.writestr(info.filename, body)
    return out.getvalue()


def big_endian(data: bytes) -> bytes:
    """A little-endian zip checkpoint as a big-endian machine would have written it:
    ``byteorder`` says big and every typed storage is swapped in units of its storage
    dtype (torch's rule; torch.load of the result is checked against the original)."""
    from torchless.formats.pt.read import read_checkpoint
    from torchless.io.source import BytesSource

    cp = read_checkpoint(BytesSource(data, "<fuzz>"), weights_only=False)
    swap = {key: st.swap_unit for key, st in cp.storages.items()}
    return rezip(data, byteorder="big", swap=swap)


# -- comparison ------------------------------------------------------------------------
def _is_tensor(x: Any) -> bool:
    import torch

    return isinstance(x, torch.Tensor)


def compare(tl: Any, tt: Any, path: str = "", seen: dict | None = None) -> None:
    """torchless's tree ``tl`` is torch's ``tt``: types, values, tensors, identity."""
    import torch

    seen = {} if seen is None else seen
    if _is_tensor(tt) or isinstance(tt, (torch.Tensor,)):
        prev = seen.get(id(tt))
        if prev is not None:  # the same object twice in torch: the same object here
            assert prev is tl, f"{path}: shared object is two objects"
            return
        seen[id(tt)] = tl
        if tt.is_nested and tt.layout == torch.jagged:
            _compare_jagged(tl, tt, path)
            return
        if tt.is_nested:
            assert isinstance(tl, NestedTensor), (path, type(tl))
            assert tl.dtype.torch_name == str(tt.dtype), path
            assert tl.is_parameter == isinstance(tt, torch.nn.Parameter) and tl.requires_grad == tt.requires_grad, path
            assert tl.attrs == vars(tt), (path, tl.attrs, vars(tt))
            for a, b in zip(tl.unbind(), tt.detach().unbind(), strict=True):
                assert a.shape == tuple(b.shape) and a.stride() == b.stride(), path
                np.testing.assert_array_equal(a.numpy(), b.numpy())
            return
        if tt.is_quantized and tt.dtype in (torch.quint4x2, torch.quint2x4):
            np.testing.assert_array_equal(tl.numpy(), tt.int_repr().numpy())
            assert tl.dtype.torch_name == str(tt.dtype)
            return
        lazy_bit = tt.is_neg() or tt.is_conj()
        assert_tensor_matches(tl, tt, values=not lazy_bit)  # stored bytes always exact
        if tt.dtype == torch.complex32:
            # bit-exact, NaN payloads included: torch resolves the bits in half precision
            # and widens (quieting NaNs)
            wide = torch.empty(tt.shape, dtype=torch.complex64)
            wide.copy_(tt.detach().resolve_conj().resolve_neg())
            assert np.ascontiguousarray(tl.numpy()).tobytes() == untyped_storage_bytes(wide.untyped_storage()), path
        elif lazy_bit:
            # the sign bit of a NaN after applying a neg/conj bit differs between torch's
            # vectorized and scalar kernels; values are compared with NaN == NaN
            np.testing.assert_array_equal(tl.numpy(), tt.resolve_conj().resolve_neg().numpy())
        assert tl.is_parameter == isinstance(tt, torch.nn.Parameter), path
        attrs = {k: v for k, v in vars(tt).items()} if hasattr(tt, "__dict__") else {}
        assert getattr(tl, "attrs", {}) == attrs, (path, getattr(tl, "attrs", None), attrs)
        return
    if isinstance(tt, collections.OrderedDict):
        assert isinstance(tl, StateDict), (path, type(tl))
        assert tl.attributes.get("_metadata") == getattr(tt, "_metadata", None), path
    elif isinstance(tt, collections.Counter):
        assert type(tl) is collections.Counter, (path, type(tl))
    elif isinstance(tt, dict):
        assert type(tl) is dict, (path, type(tl))
    if isinstance(tt, (dict, list)):  # the same container twice in torch: the same here
        prev = seen.get(id(tt))
        if prev is not None:
            assert prev is tl, f"{path}: shared container is two objects"
            return
        seen[id(tt)] = tl
    if isinstance(tt, dict):
        assert list(tl.keys()) == list(tt.keys()), path
        for k in tt:
            compare(tl[k], tt[k], f"{path}.{k}", seen)
        return
    if isinstance(tt, (list, tuple)) and not isinstance(tt, torch.Size):
        assert type(tl) is type(tt), (path, type(tl), type(tt))
        assert len(tl) == len(tt), path
        for i, (a, b) in enumerate(zip(tl, tt, strict=False)):
            compare(a, b, f"{path}.{i}", seen)
        return
    if isinstance(tt, torch.dtype):
        assert tl.torch_name == str(tt), path
        return
    if isinstance(tt, (torch.device, torch.Size)):
        assert str(tl) == str(tt) if isinstance(tt, torch.device) else tuple(tl) == tuple(tt), path
        return
    if isinstance(tt, float) and math.isnan(tt):
        assert isinstance(tl, float) and math.isnan(tl), path
        return
    if isinstance(tt, np.ndarray):
        _same_array(tl, tt, path)
        return
    assert type(tl) is type(tt) and tl == tt, (path, tl, tt)


def _compare_jagged(tl: Any, tt: Any, path: str) -> None:
    """torchless's JaggedTensor is torch's jagged NestedTensor: components, items, attributes."""
    assert isinstance(tl, JaggedTensor), (path, type(tl))
    assert tl.ragged_idx == tt._ragged_idx and tl.requires_grad == tt.requires_grad and not tl.is_parameter, path
    assert_tensor_matches(tl.values, tt._values.detach())
    assert_tensor_matches(tl.offsets, tt._offsets)
    assert (tl.lengths is None) == (tt._lengths is None), path
    if tt._lengths is not None:
        assert_tensor_matches(tl.lengths, tt._lengths)
    cache = tt._metadata_cache or {}
    for key in ("min_seqlen", "max_seqlen"):
        assert getattr(tl, key) == (cache[key].shape[0] if key in cache else None), (path, key)
    attrs = {k: v for k, v in vars(tt).items() if k not in JaggedTensor.TORCH_OWN_STATE}
    assert tl.attrs == attrs, (path, tl.attrs, attrs)
    assert tl.shape == tuple(None if not isinstance(s, int) else s for s in tt.shape), (path, tl.shape, tt.shape)
    for a, b in zip(tl.unbind(), tt.detach().unbind(), strict=True):
        assert a.shape == tuple(b.shape) and a.stride() == b.stride(), path
        assert_tensor_matches(a, b)


def _same_array(a: Any, b: np.ndarray, path: str) -> None:
    assert type(a) is np.ndarray and a.dtype == b.dtype and a.dtype.str == b.dtype.str and a.shape == b.shape, (
        path,
        getattr(a, "dtype", type(a)),
        b.dtype,
    )
    assert a.flags.f_contiguous == b.flags.f_contiguous and a.flags.c_contiguous == b.flags.c_contiguous, path
    if b.dtype.hasobject:
        assert a.tolist() == b.tolist(), path
    else:
        assert a.tobytes(order="A") == b.tobytes(order="A"), path


def sharing(tree: Any, is_tensor: Any, storage_of: Any) -> list[int]:
    """For each tensor (in walk order), the index of the first with the same storage."""
    out: list[Any] = []

    def go(x: Any) -> None:
        if is_tensor(x):
            out.append(storage_of(x))
        elif isinstance(x, dict):
            for v in x.values():
                go(v)
        elif isinstance(x, (list, tuple)):
            for v in x:
                go(v)

    go(tree)
    return [out.index(k) for k in out]


def _torch_storage_key(t: Any) -> Any:
    if t.is_nested or t.is_sparse or t.layout != __import__("torch").strided or t.is_meta or t.is_quantized:
        return ("x", id(t))
    us = t.untyped_storage()
    return us.data_ptr() if us.nbytes() else ("empty", id(t))


def _tl_storage_key(t: Any) -> Any:
    if not isinstance(t, Tensor) or t.storage is None or t.quantizer is not None:
        return ("x", id(t))
    return id(t.storage) if t.storage.nbytes else ("empty", id(t))


def compare_sharing(tl: Any, tt: Any) -> None:
    a = sharing(tt, _is_tensor, _torch_storage_key)
    b = sharing(tl, lambda x: isinstance(x, (Tensor, SparseTensor, NestedTensor, JaggedTensor)), _tl_storage_key)
    assert a == b, (a, b)


# -- one case -----------------------------------------------------------------------------
def run_case(seed: int, stats: Stats | None = None, *, writes: bool = True) -> None:
    """One random checkpoint through every direction; AssertionError on a mismatch."""
    import torch

    g = Gen(seed)
    layout = g.pick(LAYOUTS)
    protocol = int(g.pick(PROTOCOLS))
    g.nested = layout != "legacy"
    obj = g.tensorless() if protocol == 0 and g.coin(0.8) else g.checkpoint()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if protocol == 0 and _refused_by_torch(raw := torch_save(obj, "legacy" if layout == "legacy" else "zip", 0)):
            # torch refuses a storage's persistent id written as text: torchless too
            try:
                torchless.open(raw, format="pt", weights_only=False).load()
            except torchless.TorchlessError:
                if stats is not None:
                    stats.refusals += 1
                    stats.by_protocol[protocol] = stats.by_protocol.get(protocol, 0) + 1
                return
            raise AssertionError("torch refuses this protocol-0 file, torchless loaded it")
        data = torch_save(obj, layout, protocol)
        try:
            ref = torch.load(io.BytesIO(data), weights_only=False)
        except (AttributeError, RuntimeError):
            # torch's legacy loader cannot read the UntypedStorage its own legacy writer
            # emits for uint16/32/64, float8 and complex32, nor its nested tensors: fall
            # back to the zip layout
            if layout != "legacy":
                raise
            layout = "zip"
            data = torch_save(obj, layout, protocol)
            ref = torch.load(io.BytesIO(data), weights_only=False)
        if layout == "zip-big-endian":  # the re-encoding itself is checked by torch
            compare_torch(ref, torch.load(io.BytesIO(torch_save(obj, "zip", protocol)), weights_only=False))
        tl = torchless.open(data, format="pt", weights_only=True, mmap=g.coin()).load()
        compare(tl, ref, "<root>")
        compare_sharing(tl, ref)
        if stats is not None:
            stats.cases += 1
            stats.by_layout[layout] = stats.by_layout.get(layout, 0) + 1
            stats.by_protocol[protocol] = stats.by_protocol.get(protocol, 0) + 1
            for _n, t in torchless.core.tree.iter_tensors(tl):
                stats.tensors += 1
                stats.dtypes.add(t.dtype.name)
            stats.kinds |= g.kinds
        if not writes:
            return
        # torch's weights-only loader refuses NumPy values in the original too; then the
        # written file is checked with weights_only=False only
        try:
            torch.load(io.BytesIO(data), weights_only=True)
            wo = True
        except pickle.UnpicklingError:
            wo = False
        # write direction: torchless.save of what torchless loaded (torch's equivalent is
        # ref) and of torch's objects; the oracle is torch.save of the same, torch.load
        for source, twin in ((tl, ref), (obj, obj)):
            twin_data = torch_save(twin, "zip", 2)
            expect = torch.load(io.BytesIO(twin_data), weights_only=False)
            buf = io.BytesIO()
            torchless.save(source, buf)
            out = buf.getvalue()
            for kw in ({"weights_only": wo}, {"weights_only": False}, {"weights_only": wo, "mmap": True}):
                if kw.get("mmap"):
                    back = _load_mmap(out, wo)
                    # torch.load(mmap=True) caches empty storages too (a slice of the map
                    # has a data pointer): compared with torch's own file loaded so
                    expect = _load_mmap(twin_data, False)
                else:
                    back = torch.load(io.BytesIO(out), **kw)
                compare_torch(back, expect)
                assert sharing(back, _is_tensor, _torch_storage_key) == sharing(expect, _is_tensor, _torch_storage_key)
            if stats is not None:
                stats.writes += 1


def _refused_by_torch(data: bytes) -> bool:
    import torch

    try:
        torch.load(io.BytesIO(data), weights_only=False)
    except AssertionError:  # torch: "saved_id must be a tuple"
        return True
    return False


def _load_mmap(data: bytes, weights_only: bool) -> Any:
    import os
    import tempfile

    import torch

    fd, p = tempfile.mkstemp(suffix=".pt")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        return torch.load(p, weights_only=weights_only, mmap=True)
    finally:
        os.unlink(p)


def compare_torch(a: Any, b: Any, path: str = "<root>") -> None:
    """Two torch trees are the same: types, tensor metadata and value bytes."""
    import torch

    if isinstance(b, torch.Tensor):
        assert isinstance(a, torch.Tensor) and type(a) is type(b), (path, type(a), type(b))
        if b.is_nested:
            assert a.is_nested and a.dtype == b.dtype and a.layout == b.layout, path
            assert a.requires_grad == b.requires_grad, path
            if b.layout == torch.jagged:
                assert a._ragged_idx == b._ragged_idx and torch.equal(a._offsets, b._offsets), path
                assert (a._lengths is None) == (b._lengths is None), path
                assert b._lengths is None or torch.equal(a._lengths, b._lengths), path
                assert torch.equal(a._values, b._values) and a._values.stride() == b._values.stride(), path
                assert {k: v.shape for k, v in a._metadata_cache.items()} == {k: v.shape for k, v in b._metadata_cache.items()}, (
                    path
                )
                own = JaggedTensor.TORCH_OWN_STATE
                assert {k: v for k, v in vars(a).items() if k not in own} == {k: v for k, v in vars(b).items() if k not in own}, (
                    path
                )
            for x, y in zip(a.unbind(), b.unbind(), strict=False):
                assert torch.equal(x, y), path
            return
        assert a.dtype == b.dtype and a.shape == b.shape and a.layout == b.layout and a.device == b.device, (
            path,
            (a.dtype, a.shape, a.layout, a.device),
            (b.dtype, b.shape, b.layout, b.device),
        )
        assert a.requires_grad == b.requires_grad, path
        assert vars(a) == vars(b), (path, vars(a), vars(b))
        if b.is_meta:
            return
        if b.layout != torch.strided:
            assert torch.equal(a.to_dense(), b.to_dense()), path
            return
        assert a.stride() == b.stride() and a.storage_offset() == b.storage_offset(), path
        if b.is_quantized:
            assert torch.equal(a.int_repr(), b.int_repr()) and a.qscheme() == b.qscheme(), path
            return
        assert a.is_conj() == b.is_conj() and a.is_neg() == b.is_neg(), path
        assert torch_value_bytes(a) == torch_value_bytes(b), path
        return
    assert type(a) is type(b), (path, type(a), type(b))
    if isinstance(b, dict):
        assert list(a) == list(b), path
        assert getattr(a, "_metadata", None) == getattr(b, "_metadata", None), path
        for k in b:
            compare_torch(a[k], b[k], f"{path}.{k}")
    elif isinstance(b, (list, tuple)) and not isinstance(b, torch.Size):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=False)):
            compare_torch(x, y, f"{path}.{i}")
    elif isinstance(b, float) and math.isnan(b):
        assert math.isnan(a), path
    elif isinstance(b, np.ndarray):
        _same_array(a, b, path)
    else:
        assert a == b, (path, a, b)


if __name__ == "__main__":  # pragma: no cover - a quick manual run
    run_case(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
