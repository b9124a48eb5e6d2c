"""The pickle fast path (``torchless.pickle.fastpath.fast_load``) against the general
machine: on every pickle it accepts it returns what the machine returns and resolves the
same globals; on anything else it steps aside (FALLBACK). Inputs: the differential
fuzzer's random checkpoints (tests/pt_fuzz.py), plain state dicts, and byte-flipped
mutations of a state dict pickle."""

from __future__ import annotations

import collections
import io
import random
import warnings

import pytest

from torchless.container.zip import ZipReader
from torchless.core.dtypes import DTYPES
from torchless.core.errors import TorchlessError
from torchless.core.tensor import Storage, Tensor
from torchless.core.values import StorageType
from torchless.formats.pt.read import make_resolver
from torchless.pickle.fastpath import FALLBACK, fast_load
from torchless.pickle.machine import Limits, Unpickler


def _pl(pid):
    """A deterministic persistent_load shaped like torch's (and refusing the rest)."""
    if type(pid) is not tuple or len(pid) != 5 or pid[0] != "storage" or type(pid[1]) is not StorageType:
        raise TorchlessError("bad pid")
    dt = pid[1].dtype or DTYPES["uint8"]
    if type(pid[4]) is not int or pid[4] < 0:
        raise TorchlessError("bad numel")
    return Storage(str(pid[2]), pid[4] * dt.itemsize, dt, str(pid[3]))


def _shape(x, memo=None):
    """A comparable picture of an unpickled tree (tensors by their fields)."""
    if isinstance(x, Tensor):
        return (
            "T",
            x.dtype.name,
            x.shape,
            tuple(x.stride()),
            x.storage_offset(),
            x.storage.key if x.storage else None,
            x.requires_grad,
            sorted(x.metadata.items()),
        )
    if isinstance(x, dict):
        return (type(x).__name__, [(k, _shape(v)) for k, v in x.items()])
    if isinstance(x, (list, tuple)):
        return (type(x).__name__, [_shape(v) for v in x])
    return (type(x).__name__, repr(x))


def _both(data: bytes):
    """(fast outcome, machine outcome, fast seen, machine seen)."""
    r1, r2 = make_resolver(True), make_resolver(True)
    fast, _added = fast_load(data, r1, _pl, Limits())
    try:
        m = ("ok", _shape(Unpickler(data, resolver=r2, persistent_load=_pl).load()))
    except TorchlessError as e:
        m = ("error", type(e).__name__)
    return fast, m, list(r1.seen), list(r2.seen)


def _check(data: bytes) -> bool:
    fast, m, seen_f, seen_m = _both(data)
    if fast is FALLBACK:
        return False
    assert m == ("ok", _shape(fast))
    assert seen_f == seen_m
    return True


def _pickle_of(obj, protocol: int = 2) -> bytes:
    import torch

    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.save(obj, buf, pickle_protocol=protocol)
    zr = ZipReader(buf.getvalue())
    return bytes(zr.read("data.pkl"))


def test_state_dicts_take_the_fast_path():
    torch = pytest.importorskip("torch", reason="torch writes the pickles under test")
    g = torch.Generator().manual_seed(1)
    cases = [
        {f"l{i}.w": torch.randn(i + 1, generator=g) for i in range(300)},  # LONG_BINPUT/GET past 255
        collections.OrderedDict(a=torch.zeros(2, 3), b=torch.ones(3).half(), c=torch.arange(5)),
        {"shared": (lambda t: {"x": t, "y": t[1:], "z": t.view(2, 2)})(torch.arange(4.0))},
        torch.randn(3, 4, generator=g).t(),
        {
            "scalar": torch.tensor(2.0),
            "empty": torch.zeros(0),
            "b": torch.tensor([True]),
            "bf": torch.ones(2, dtype=torch.bfloat16),
        },
    ]
    for obj in cases:
        assert _check(_pickle_of(obj)), obj if not isinstance(obj, dict) else list(obj)[:3]
    # a module's state dict carries _metadata through BUILD: not a recognised shape
    assert not _check(_pickle_of(torch.nn.Linear(3, 2).state_dict()))


def test_fuzzer_checkpoints_agree():
    pytest.importorskip("torch", reason="the fuzzer's checkpoints are written by torch")
    import pt_fuzz

    # the open-world generator puts something the fast path leaves to the machine into
    # most checkpoints (complex32, sparse and nested layouts...): run seeds until enough of
    # them took the fast path, each one compared with the machine
    hits = 0
    for seed in range(400):
        if hits >= 6:
            break
        g = pt_fuzz.Gen(seed)
        g.nested = True
        obj = g.checkpoint()
        for protocol in (2, 4):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                data = pt_fuzz.torch_save(obj, "zip", protocol)
            pkl = bytes(ZipReader(data).read("data.pkl"))
            hits += _check(pkl)
    assert hits > 0


def test_mutations_agree():
    """Byte flips anywhere in a state dict pickle: whenever the fast path returns an
    object, the machine returns the same (and resolves the same globals)."""
    torch = pytest.importorskip("torch", reason="torch writes the pickle under test")
    base = _pickle_of({"a": torch.zeros(2, 3), "b": torch.arange(4).view(2, 2).t(), "c": torch.ones(1, dtype=torch.float16)})
    rng = random.Random(5)
    hits = 0
    for _ in range(600):
        b = bytearray(base)
        for _k in range(rng.choice((1, 1, 2))):
            b[rng.randrange(len(b))] = rng.choice((0, 1, 0xFF, rng.randrange(256), b[rng.randrange(len(b))]))
        hits += _check(bytes(b))
    assert hits > 0


def test_refuses_globals_outside_its_set_and_limits():
    import pickle

    # a global the allowlist would allow but the fast path does not handle: FALLBACK
    data = b"\x80\x02c" + b"builtins\nset\n" + b")R."
    assert fast_load(data, make_resolver(True), _pl)[0] is FALLBACK
    # a dangerous global: never resolved by the fast path (nothing recorded in seen)
    r = make_resolver(True)
    assert fast_load(b"\x80\x02cos\nsystem\nX\x01\x00\x00\x00x\x85R.", r, _pl)[0] is FALLBACK
    assert r.seen == []
    # protocols 2 and 4 (DCP .metadata) only: FALLBACK for the others
    assert _check(pickle.dumps({"a": 1, "b": [1, (2, 3)]}, protocol=4))
    for proto in (0, 1, 3, 5):
        assert fast_load(pickle.dumps({"a": 1}, protocol=proto), make_resolver(True), _pl)[0] is FALLBACK
    # the caller's limits: the fast path steps aside before the machine would refuse
    two = b"\x80\x02}q\x00}q\x01\x86."  # two memo entries
    for max_memo in (1, 2, 3):
        lim = Limits(max_memo=max_memo)
        fast = fast_load(two, make_resolver(True), _pl, lim)[0]
        try:
            machine = Unpickler(two, resolver=make_resolver(True), persistent_load=_pl, limits=lim).load()
        except TorchlessError:
            machine = FALLBACK
        assert fast is FALLBACK or fast == machine, max_memo
    assert fast_load(two, make_resolver(True), _pl, Limits(max_memo=1))[0] is FALLBACK
    assert fast_load(b"\x80\x02}q\x00.", make_resolver(True), _pl, Limits())[0] == {}
