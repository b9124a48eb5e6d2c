"""The pickle machine: every opcode of protocols 0-5, Python's pickle as the oracle,
limits, and the guarantee that nothing a pickle names is imported or run."""

from __future__ import annotations

import collections
import copyreg
import pickle
import pickletools
import struct

import pytest

from torchless.core.errors import FormatError, LimitError, TorchlessError, UnsafeGlobalError
from torchless.pickle.globals import AllowlistResolver, PickledObject
from torchless.pickle.machine import Limits, Unpickler
from torchless.pickle.opcodes import OPCODE_NAMES, PROTOCOL_OF
from torchless.pickle.torch_globals import DEFAULT_ALLOWLIST
from torchless.pickle.writer import Global, Persistent, Pickler2, Reduce


def res(weights_only: bool = False) -> AllowlistResolver:
    return AllowlistResolver(DEFAULT_ALLOWLIST, weights_only=weights_only)


def run(data: bytes, **kw):
    kw.setdefault("resolver", res())
    return Unpickler(data, **kw).load()


def test_opcode_table_matches_pickletools():
    expected = {ord(op.code) if len(op.code) == 1 else op.code: op.name for op in pickletools.opcodes}
    expected = {(k if isinstance(k, int) else ord(k)): v for k, v in expected.items()}
    assert expected == OPCODE_NAMES
    for op in pickletools.opcodes:
        assert PROTOCOL_OF[op.name] == op.proto, op.name


class _Slots:
    __slots__ = ("a",)


VALUES = [
    None,
    True,
    False,
    0,
    1,
    -1,
    255,
    256,
    65535,
    65536,
    -(2**31),
    2**31 - 1,
    2**31,
    -(2**31) - 1,
    2**63,
    -(2**64) - 5,
    2**2100 + 12345,
    -(2**2100),
    0.0,
    -0.0,
    1.5,
    1e308,
    float("inf"),
    -float("inf"),
    3.141592653589793,
    "",
    "a",
    "ü€𝄞",
    "x" * 300,
    "line\nbreak\\slash\r\x00",
    b"",
    b"\x00\xff" * 3,
    b"y" * 300,
    bytearray(b"ab\x00"),
    (),
    (1,),
    (1, 2),
    (1, 2, 3),
    (1, 2, 3, 4),
    [],
    [1],
    list(range(1200)),
    {},
    {"a": 1, 2: "b", (1, 2): [3]},
    {i: str(i) for i in range(1100)},
    {1, 2, 3},
    set(),
    frozenset({4, 5}),
    frozenset(),
    1 + 2j,
    {"nested": [({"deep": (None, [True])},)]},
    collections.OrderedDict([("z", 1), ("a", 2)]),
]


def _shared():
    inner = [1, 2]
    t = ("s", inner)
    return [inner, inner, t, t, {"k": inner}]


def _recursive():
    a = [1]
    a.append(a)
    d = {}
    d["self"] = d
    return [a, d]


def _norm(x, seen=None):
    """Structure of ``x`` with shared/recursive references made comparable."""
    seen = {} if seen is None else seen
    if isinstance(x, (list, dict, tuple, set, frozenset)):
        if id(x) in seen:
            return ("ref", seen[id(x)])
        seen[id(x)] = len(seen)
        if isinstance(x, dict):
            return (
                type(x).__name__
                if type(x) is not collections.OrderedDict and not isinstance(x, collections.OrderedDict)
                else "OrderedDict",
                [(_norm(k, seen), _norm(v, seen)) for k, v in x.items()],
            )
        if isinstance(x, (set, frozenset)):
            return (type(x).__name__, sorted(map(repr, x)))
        return (type(x).__name__, [_norm(v, seen) for v in x])
    if isinstance(x, float) and x != x:
        return "nan"
    return (type(x).__name__, x)


@pytest.mark.parametrize("protocol", range(6))
def test_plain_values_match_python_pickle(protocol):
    for v in VALUES + [float("nan")]:
        data = pickle.dumps(v, protocol=protocol)
        got = run(data)
        assert _norm(got) == _norm(v), (protocol, v if len(repr(v)) < 100 else type(v))
    for make in (_shared, _recursive):
        v = make()
        got = run(pickle.dumps(v, protocol=protocol))
        assert _norm(got) == _norm(v)
    # shared references stay shared
    got = run(pickle.dumps(_shared(), protocol=protocol))
    assert got[0] is got[1] and got[2] is got[3] and got[4]["k"] is got[0]


def test_protocol5_out_of_band_and_readonly_buffers():
    bufs = []
    data = pickle.dumps(
        [pickle.PickleBuffer(b"abc"), pickle.PickleBuffer(bytearray(b"xy"))], protocol=5, buffer_callback=bufs.append
    )
    got = run(data, buffers=[b.raw() for b in bufs])
    assert [bytes(g) for g in got] == [b"abc", b"xy"]
    with pytest.raises(FormatError):
        run(data)
    with pytest.raises(FormatError):
        run(data, buffers=[])


def _ops(data: bytes) -> set[str]:
    return {op.name for op, _a, _p in pickletools.genops(data)}


HAND_MADE = {
    # opcodes Python 3's pickler never emits for plain data, written by hand
    "STRING": (b"S'abc'\n.", "abc"),
    "BINSTRING": (b"T\x03\x00\x00\x00abc.", "abc"),
    "SHORT_BINSTRING": (b"U\x03abc.", "abc"),
    "POP": (b"K\x01K\x020.", 1),
    "POP_MARK": (b"K\x07(K\x01K\x021.", 7),
    "DUP": (b"]2\x86.", ([], [])),
    "LONG4": (b"\x8b\x02\x00\x00\x00\x00\x01.", 256),
    "INST": (b"(K\x01K\x02K\x03i__builtin__\nslice\n.", slice(1, 2, 3)),
    "OBJ": (b"(c__builtin__\nslice\nK\x01K\x02K\x03o.", slice(1, 2, 3)),
    "NEWOBJ_EX": (b"\x80\x04cargparse\nNamespace\n)}\x8c\x01a\x94K\x05s\x92.", None),
    "PERSID": (b"Pkey\n.", ("pid", "key")),
    "BINPERSID": (b"X\x03\x00\x00\x00keyQ.", ("pid", "key")),
    "FLOAT": (b"F2.5\n.", 2.5),
    "INT": (b"I01\n.", True),
    "LONG": (b"L12345678901234567890L\n.", 12345678901234567890),
    "GET": (b"(lp0\ng0\na.", None),
    "EXT1": (b"\x82\xf0.", None),
    "BINUNICODE8": (b"\x8d" + struct.pack("<Q", 3) + b"abc.", "abc"),
    "BINBYTES8": (b"\x8e" + struct.pack("<Q", 2) + b"ab.", b"ab"),
    "NEWOBJ": (pickle.dumps(__import__("argparse").Namespace(a=5), protocol=2), None),
    "BUILD": (pickle.dumps(__import__("argparse").Namespace(a=5), protocol=0), None),
    "LONG_BINGET": (None, None),
}


def test_every_opcode_is_implemented():
    seen: set[str] = set()
    for protocol in range(6):
        for v in VALUES + [_shared(), _recursive()]:
            seen |= _ops(pickle.dumps(v, protocol=protocol))
    bufs = []
    seen |= _ops(pickle.dumps([pickle.PickleBuffer(b"abc")], protocol=5, buffer_callback=bufs.append))
    seen |= _ops(pickle.dumps(pickle.PickleBuffer(b"abc"), protocol=5, buffer_callback=bufs.append)) | {"READONLY_BUFFER"}
    seen |= set(HAND_MADE)
    seen |= {"EXT2", "EXT4"}
    assert set(OPCODE_NAMES.values()) - seen <= {"FRAME"}  # FRAME is seen at protocol 4 on large input
    assert "FRAME" in _ops(pickle.dumps(list(range(20000)), protocol=4))


@pytest.mark.parametrize("name", sorted(HAND_MADE))
def test_hand_made_opcodes(name):
    data, expect = HAND_MADE[name]
    if name in ("PERSID", "BINPERSID"):
        assert run(data, persistent_load=lambda pid: ("pid", pid)) == expect
        with pytest.raises(FormatError):
            run(data)
        return
    if name == "LONG_BINGET":
        v = [[i] for i in range(300)]
        v.append(v[-1])
        data = pickle.dumps(v, protocol=2)
        assert "LONG_BINGET" in _ops(data)
        got = run(data)
        assert got[-1] is got[-2] and got[-1] == [299]
        return
    if name in ("NEWOBJ_EX", "NEWOBJ", "BUILD"):
        assert name in _ops(data)
        got = run(data)
        assert got.a == 5
        return
    if name == "GET":
        got = run(data)
        assert got[0] is got
        return
    if name == "EXT1":
        copyreg.add_extension("collections", "OrderedDict", 0xF0)
        try:
            assert getattr(run(data), "name", None) == "collections.OrderedDict"
            assert isinstance(run(b"\x83\xf0\x00)R."), dict)
            assert isinstance(run(b"\x84\xf0\x00\x00\x00)R."), dict)
        finally:
            copyreg.remove_extension("collections", "OrderedDict", 0xF0)
        with pytest.raises(FormatError):
            run(data)
        return
    got = run(data)
    if name == "DUP":
        assert got[0] is got[1]
        return
    assert got == expect and type(got) is type(expect)


def test_python2_names_are_remapped():
    # torch 2.13 writes sets as GLOBAL '__builtin__ set' (fix_imports), spec says 'builtins set'
    assert run(b"\x80\x02c__builtin__\nset\n]K\x01a\x85R.") == {1}
    assert run(b"c__builtin__\nxrange\n(K\x01K\x03tR.", resolver=res()) == range(1, 3)


def test_unknown_globals_are_placeholders_or_refused():
    data = b"\x80\x02cmymod\nMyClass\n)\x81}X\x01\x00\x00\x00aK\x01sb."
    obj = run(data)
    assert isinstance(obj, PickledObject) and obj.class_name == "mymod.MyClass" and obj.attrs == {"a": 1}
    with pytest.raises(UnsafeGlobalError) as ei:
        run(data, resolver=res(True))
    assert ei.value.global_name == "mymod.MyClass"


def test_limits_are_enforced():
    with pytest.raises(LimitError):
        run(pickle.dumps([1, 2, 3]), limits=Limits(max_input=5))
    with pytest.raises(LimitError):
        run(pickle.dumps([[i] for i in range(400)], protocol=2), limits=Limits(max_memo=300))
    with pytest.raises(LimitError):
        run(pickle.dumps([[i] for i in range(40)], protocol=4), limits=Limits(max_memo=30))  # MEMOIZE
    with pytest.raises(LimitError):
        run(b"(" * 50 + b"N.", limits=Limits(max_marks=20))
    key = ()
    for _ in range(30):
        key = (key,)
    with pytest.raises(LimitError):
        run(pickle.dumps({key: 1}, protocol=2), limits=Limits(max_key_depth=10))
    assert run(pickle.dumps({key: 1}, protocol=2)) == {key: 1}
    with pytest.raises(LimitError):
        run(pickle.dumps("x" * 100, protocol=2), limits=Limits(max_object_bytes=50))
    with pytest.raises(ValueError):
        Limits(max_memo=0)


def test_memo_bound_grows_with_the_pickle(monkeypatch):
    """Beyond MEMO_FLOOR a pickle may make one memo entry per four bytes it spans
    (a DCP .metadata of a million tensors makes 25 million, one per eight bytes), and
    never more than an explicit max_memo. CPython's unpickler reads all of these."""
    import torchless.pickle.machine as machine

    monkeypatch.setattr(machine, "MEMO_FLOOR", 100)
    real = pickle.dumps([[i] for i in range(400)], protocol=2)  # ~800 memo entries, ~6 bytes each
    assert run(real) == pickle.loads(real)
    with pytest.raises(LimitError, match="memo"):  # the explicit bound still holds
        run(real, limits=Limits(max_memo=300))
    dense = b"\x80\x04N" + b"\x94" * 1000 + b"."  # 1,000 MEMOIZEs in 1,004 bytes
    assert pickle.loads(dense) is None
    with pytest.raises(LimitError, match="memo") as ei:
        run(dense)
    assert ei.value.expected == "<= 251"  # 1,004 // 4
    monkeypatch.setattr(machine, "MEMO_FLOOR", 1000)
    assert run(dense) is None


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\x80\x02",
        b"X\xff\xff\xff\xffabc.",  # BINUNICODE declares 4 GiB
        b"\x8d" + struct.pack("<Q", 2**63) + b".",  # BINUNICODE8
        b"\x8e" + struct.pack("<Q", 2**64 - 1) + b".",  # BINBYTES8
        b"\x96" + struct.pack("<Q", 2**40) + b".",  # BYTEARRAY8
        b"\x95" + struct.pack("<Q", 2**60) + b"N.",  # FRAME
        b"\x8b\xff\xff\xff\x7f.",  # LONG4
        b"T\xff\xff\xff\xff.",  # negative BINSTRING
        b"h\x05.",  # memo miss
        b"a.",  # empty stack
        b"t.",  # no mark
        b"N\x85\x85\x85R.",  # REDUCE on a tuple
        b"}]]s.",  # unhashable key
        b"\xff.",  # unknown opcode
        b"cos\nsystem",  # no newline
        b"X\x02\x00\x00\x00\xff\xfe.",  # bad utf-8
        b"I12x\n.",
        b"F1.2.3\n.",
        b"N(u.",
        b"N(e.",
        b"]N\x90.",
        b"q\x01.",  # BINPUT with an empty stack
        b"r\xff\xff\xff\xff.",
        b"(]\x91.",  # unhashable in a frozenset
        b"K\x01K\x02\x93.",  # STACK_GLOBAL with ints
    ],
)
def test_malformed_pickles_raise_torchless_errors(data):
    with pytest.raises(TorchlessError):
        run(data)


def test_truncation_at_every_byte_raises_truncated_or_format_error():
    data = pickle.dumps({"a": [1, 2.5, "x" * 10, (None, True)], "b": {1, 2}, "c": b"zz", "d": 2**80}, protocol=2)
    for i in range(len(data)):
        with pytest.raises(TorchlessError):
            run(data[:i])


def test_unknown_protocol_number_is_accepted_like_torch():
    # torch.load(weights_only=True) warns "Detected pickle protocol 9" and loads
    up = Unpickler(b"\x80\x09K\x05.", resolver=res())
    assert up.load() == 5 and up.info.protocol == 9


def test_end_and_protocol_info():
    data = pickle.dumps([1], protocol=3) + b"trailing"
    up = Unpickler(data, resolver=res())
    assert up.load() == [1]
    assert up.end == len(data) - len(b"trailing")
    assert up.info.protocol == 3


def test_trace_sees_every_opcode():
    data = pickle.dumps({"a": (1, 2)}, protocol=2)
    seen = []
    Unpickler(data, resolver=res(), trace=lambda pos, name, arg: seen.append((pos, name))).load()
    assert [n for _, n in seen] == [op.name for op, _a, _p in pickletools.genops(data)]
    assert [p for p, _ in seen] == [p for _o, _a, p in pickletools.genops(data)]


def test_writer_matches_cpython_protocol2_for_plain_data():
    """Pickler2 emits what CPython's pickler (protocol 2, fix_imports) emits."""
    values = [
        {"a": [1, 2.5, "x", (None, True, False)], "b": 2**70, "c": -5, "d": 70000, "e": (), "f": [], "g": {}},
        list(range(2500)),
        {str(i): i for i in range(1500)},
        [(1,), (1, 2), (1, 2, 3), (1, 2, 3, 4)],
        b"\x00\xffbytes",
        {5, 6},
        1 + 2j,
        bytearray(b"xy"),
        -(2**2100),
    ]
    for v in values:
        ours = Pickler2(lambda o: _translate(o)).dumps(v)
        assert ours == pickle.dumps(v, protocol=2), v if len(repr(v)) < 80 else type(v)
        assert _norm(run(ours)) == _norm(v)


def _translate(o):
    if isinstance(o, set):
        return Reduce(Global("builtins", "set"), (list(o),))
    if isinstance(o, complex):
        return Reduce(Global("builtins", "complex"), (o.real, o.imag))
    if isinstance(o, bytearray):
        return Reduce(Global("builtins", "bytearray"), (bytes(o),))
    return o


def test_writer_refuses_unknown_types_and_deep_nesting():
    from torchless.core.errors import UsageError

    with pytest.raises(UsageError):
        Pickler2().dumps(object())
    deep: list = []
    cur = deep
    for _ in range(2000):
        nxt: list = []
        cur.append(nxt)
        cur = nxt
    with pytest.raises(UsageError):
        Pickler2().dumps(deep)
    assert run(Pickler2().dumps(Persistent(("storage", "x"))), persistent_load=lambda p: p) == ("storage", "x")
