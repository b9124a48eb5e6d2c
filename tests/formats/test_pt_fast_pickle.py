"""The state-dict pickle writer (``pt.write._fast_pickle``) against the general pickler:
byte-identical ``data.pkl`` and the same storages on every shape it takes, None (and the
general pickler) on everything else, and files torch loads."""

from __future__ import annotations

import numpy as np
import pytest

import torchless
from torchless.core.dtypes import by_name
from torchless.core.settings import SETTINGS
from torchless.core.tensor import Storage, Tensor, tensor
from torchless.formats.pt import write as W
from torchless.pickle.writer import Pickler2


def _general(obj):
    cp = W.CheckpointPickler()
    return Pickler2(cp.translate).dumps(obj), cp


def _check_same(obj) -> bytes:
    cp = W.CheckpointPickler()
    fast = W._fast_pickle(obj, cp)
    assert fast is not None
    data, cp2 = _general(obj)
    assert fast == data
    assert [(k, id(s)) for k, s in cp.storages] == [(k, id(s)) for k, s in cp2.storages]
    assert cp.storage_keys == cp2.storage_keys and cp._dtype_of == cp2._dtype_of
    return fast


def _plain(n: int, dtype: str = "float32") -> Tensor:
    return tensor(np.arange(n, dtype=dtype))


def test_shapes_of_state_dicts():
    shared = (2, 3)
    st = Storage("x", 24, by_name("float32"), data=bytes(24))
    st2 = Storage("y", 24, by_name("float32"), data=bytes(24))
    cases = [
        {},
        {"one": _plain(3)},
        {f"w{i}": _plain(1 + i % 5) for i in range(1500)},  # two SETITEMS batches, memo past 255
        {"storage": _plain(2), "cpu": _plain(2), "0": _plain(2), "1": _plain(1)},  # interned / cached strings
        {
            "a": Tensor(st, by_name("float32"), shared, (3, 1)),
            "b": Tensor(st2, by_name("float32"), shared, (3, 1)),  # one shape tuple object, twice
        },
        {f"m{i}": _plain(250 + i * 37) for i in range(400)},  # numels past 255 (BININT2), memo past 255
        {  # the location changes from row to row (its memo fetch is kept between rows)
            f"d{i}": Tensor(
                Storage(f"s{i}", 8, by_name("float32"), ("cpu", "cuda:0", "cuda:1")[i % 5 % 3], data=bytes(8)),
                by_name("float32"),
                (2,),
            )
            for i in range(300)
        },
        {"scalar": tensor(np.array(2.5)), "four_d": tensor(np.zeros((2, 1, 3, 2), np.float16)), "empty": _plain(0)},
        {"big": Tensor(Storage("z", 2**34, by_name("int8")), by_name("int8"), (70000, 2), (2, 1), 2**33)},
        {
            "bf16": tensor(np.zeros(3, np.float32)).__class__(
                Storage("b", 6, by_name("bfloat16"), data=bytes(6)), by_name("bfloat16"), (3,)
            )
        },
        {"grad": Tensor(Storage("g", 8, by_name("float32"), data=bytes(8)), by_name("float32"), (2,), requires_grad=True)},
        {
            "i64": _plain(7, "int64"),
            "u8": _plain(9, "uint8"),
            "b": tensor(np.array([True, False])),
            "c": tensor(np.zeros(2, np.complex64)),
        },
    ]
    for obj in cases:
        _check_same(obj)


def test_everything_else_is_left_to_the_general_pickler():
    st = Storage("x", 16, by_name("float32"), data=bytes(16))
    t = Tensor(st, by_name("float32"), (4,))
    param = Tensor(Storage("p", 8, by_name("float32"), data=bytes(8)), by_name("float32"), (2,), is_parameter=True)
    attrs = _plain(2)
    attrs.attrs["x"] = 1
    conj = Tensor(Storage("c", 8, by_name("complex64"), data=bytes(8)), by_name("complex64"), (1,), metadata={"conj": True})
    u16 = _plain(3, "uint16")  # a v3 dtype (_rebuild_tensor_v3)
    meta = Tensor(None, by_name("float32"), (2,))
    for obj in [
        [t],
        {"a": t, "b": t},  # one tensor twice
        {"a": t, "b": Tensor(st, by_name("float32"), (2,), (1,), 2)},  # one storage, two views
        {"p": param},
        {"a": attrs},
        {"c": conj},
        {"u": u16},
        {"m": meta},
        {"n": {"a": _plain(1)}},
        {"x": _plain(1), "y": 3},
        {1: _plain(1)},
        {"np": np.zeros(2, np.float32)},
    ]:
        cp = W.CheckpointPickler()
        assert W._fast_pickle(obj, cp) is None
        assert not cp.storages and not cp.storage_keys and not cp._alive


def test_saved_files_equal_with_and_without(tmp_path, monkeypatch):
    sd = {f"layer.{i}": _plain(1 + i) for i in range(40)}
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a, b = str(tmp_path / "a" / "m.pt"), str(tmp_path / "b" / "m.pt")  # one archive name
    torchless.save(sd, a)
    monkeypatch.setattr(SETTINGS, "pt_pickle", False)
    torchless.save(sd, b)
    with open(a, "rb") as f, open(b, "rb") as g:
        assert f.read() == g.read()


def test_torch_loads_it(tmp_path):
    torch = pytest.importorskip("torch", reason="torch is the oracle for loadability; not installed")
    rng = np.random.default_rng(1)
    sd = {f"m.{i}.w": tensor(rng.standard_normal((3, i + 1)).astype(np.float32)) for i in range(30)}
    sd["m.half"] = tensor(np.ones(4, np.float16))
    cp = W.CheckpointPickler()
    assert W._fast_pickle(sd, cp) is not None
    p = str(tmp_path / "m.pt")
    torchless.save(sd, p)
    back = torch.load(p, weights_only=True)
    assert list(back) == list(sd)
    for k, v in sd.items():
        assert np.array_equal(back[k].numpy(), v.numpy())
