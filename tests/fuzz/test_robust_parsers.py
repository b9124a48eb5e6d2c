"""The pieces the fuzzer rests on: error messages, InternalError, bounded repr, strict
JSON and .npy header parsing, and the CLI's one-line contract."""

from __future__ import annotations

import io
import json
import random
import struct
from pathlib import Path

import numpy as np
import pytest

from torchless.core import jsonsafe
from torchless.core.errors import FormatError, InternalError, LimitError, TorchlessError, UsageError, short_repr
from torchless.core.npyheader import parse_header_literal, parse_npy_header

SAMPLES = Path(__file__).resolve().parents[2] / "samples"


# --- messages ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kw", "text"),
    [
        ({"found": 0}, "ranks must be at least 1 (found 0)"),
        ({"expected": ">= 1"}, "ranks must be at least 1 (expected >= 1)"),
        ({"expected": ">= 1", "found": 0}, "ranks must be at least 1 (expected >= 1, found 0)"),
        ({"expected": None, "found": ""}, "ranks must be at least 1"),
        ({"hint": "pass --ranks N."}, "ranks must be at least 1; pass --ranks N"),
    ],
)
def test_message_prints_only_what_is_set(kw, text):
    e = UsageError("ranks must be at least 1", **kw)
    assert str(e) == text
    assert "None" not in str(e)


def test_message_names_path_member_offset():
    e = FormatError("bad opcode", path="m.pt", member="archive/data.pkl", offset=3, found="0xff")
    assert str(e) == "m.pt, member 'archive/data.pkl', offset 3: bad opcode (found 0xff)"
    assert e.to_dict()["expected"] is None


def test_cli_messages_of_named_call_sites_read_as_sentences(tmp_path, capsys):
    from torchless.cli.main import main

    bogus = tmp_path / "x.bin"
    bogus.write_bytes(b"hello world, not a model")
    assert main(["info", str(bogus)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "None" not in err and err.startswith("torchless: error: ")
    # reshard --ranks 0: the message names the value without "expected None"
    from torchless.formats.dcp.reshard import reshard

    with pytest.raises(UsageError) as ei:
        reshard(SAMPLES / "dcp_ckpt", tmp_path / "out", 0)
    assert "None" not in str(ei.value) and "found 0" in str(ei.value)


@pytest.mark.allows_internal_error
def test_internal_error_says_it_is_a_bug():
    try:
        raise KeyError("x")
    except KeyError as k:
        e = InternalError.wrap(k, "reading a header", path="a.pt")
    assert isinstance(e, TorchlessError)
    assert "torchless bug" in str(e) and "KeyError" in str(e) and str(e).startswith("a.pt: ")


def test_short_repr_is_bounded_on_hostile_values():
    deep: list = []
    cur = deep
    for _ in range(100_000):
        cur.append([])
        cur = cur[0]
    dag: list = [1]
    for _ in range(300):
        dag = [dag, dag]

    class Evil:
        def __repr__(self) -> str:
            raise RuntimeError("never called")

    for v in (deep, dag, Evil(), {"k": (Evil(), b"\x00" * 10_000)}, 10**5000, "x" * 10**6):
        r = short_repr(v, 80)
        assert len(r) <= 80
    assert short_repr((1, "a")) == "(1, 'a')"
    assert short_repr((1,)) == "(1,)"


# --- pickle machine: what the input causes vs bugs -------------------------------------------
def _unpickle(data: bytes, **kw):
    from torchless.pickle.globals import AllowlistResolver
    from torchless.pickle.machine import Unpickler
    from torchless.pickle.torch_globals import DEFAULT_ALLOWLIST

    return Unpickler(data, resolver=AllowlistResolver(DEFAULT_ALLOWLIST), **kw).load()


@pytest.mark.parametrize(
    "data",
    [
        b"\x80\x02.",  # STOP on an empty stack
        b"\x80\x020.",  # POP on an empty stack
        b"\x80\x02h\x05.",  # unknown memo key
        b"\x80\x02X\x02\x00\x00\x00\xff\xfe.",  # not UTF-8
        b"\x80\x02]]\x85K\x01s.",  # unhashable key
        b"I12x\n.",  # bad INT text
        b"\x80\x02(K\x01K\x02\x91]\x91.",  # unhashable in a frozenset
    ],
)
def test_input_errors_are_format_errors(data):
    with pytest.raises(FormatError):
        _unpickle(data)


@pytest.mark.allows_internal_error
def test_bug_in_a_callback_is_internal_error():
    def bad_persistent_load(pid):
        return {}[pid]  # a KeyError from torchless code, not from the input's bytes

    with pytest.raises(InternalError, match="torchless bug") as ei:
        _unpickle(b"\x80\x02K\x01Q.", persistent_load=bad_persistent_load)
    assert isinstance(ei.value.__cause__, KeyError)

    def attr_bug(pid):
        return None.missing  # type: ignore[attr-defined]

    with pytest.raises(InternalError):
        _unpickle(b"\x80\x02K\x01Q.", persistent_load=attr_bug)


# --- strict JSON -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "err"),
    [
        (b"[" * 100_000 + b"]" * 100_000, LimitError),
        (b'{"a":' * 300 + b"1" + b"}" * 300, LimitError),
        (b'{"a": 1', FormatError),
        (b"\xff\xfe{}", FormatError),
        (b"[" + b"1" * 5000 + b"]", FormatError),  # more digits than int() converts
        (b'{"a": "' + b"[" * 10_000 + b'"}', None),  # brackets inside strings do not count
        (b'{"a": "\\"[[[[", "b": [[1]]}', None),
    ],
)
def test_jsonsafe(text, err):
    if err is None:
        assert isinstance(jsonsafe.loads(text), dict)
    else:
        with pytest.raises(err):
            jsonsafe.loads(text, path="f.json", member="m")


def test_jsonsafe_size_cap_and_depth_agree_with_json():
    with pytest.raises(LimitError):
        jsonsafe.loads(b"[1]" + b" " * 100, max_bytes=50)
    rng = random.Random(0)
    for _ in range(300):
        obj = _random_json(rng, 0)
        text = json.dumps(obj).encode()
        assert jsonsafe.loads(text) == json.loads(text)
        depth = jsonsafe.check_depth(text, 1000)
        assert depth == _depth(obj)


def _random_json(rng, d):
    r = rng.random()
    if d > 6 or r < 0.3:
        return rng.choice([1, -2.5, "a[b{", '"]}', None, True, "\\"])
    if r < 0.65:
        return [_random_json(rng, d + 1) for _ in range(rng.randrange(4))]
    return {f"k{i}[": _random_json(rng, d + 1) for i in range(rng.randrange(4))}


def _depth(o):
    if isinstance(o, list):
        return 1 + max((_depth(x) for x in o), default=0)
    if isinstance(o, dict):
        return 1 + max((_depth(x) for x in o.values()), default=0)
    return 0


# --- .npy headers --------------------------------------------------------------------------------
ARRAYS = [
    np.zeros((2, 3), "<f4"),
    np.zeros(3, ">u2"),
    np.asfortranarray(np.zeros((2, 3))),
    np.array("xyz"),
    np.zeros((0, 5), "<c16"),
    np.zeros(2, dtype=[("a", "<i4"), ("b", "<f8", (2,)), ("c", [("d", "u1")])]),
    np.zeros(1, dtype=np.dtype({"names": ["x"], "formats": ["<i2"], "titles": ["T"]})),
    np.zeros((), "<m8[s]"),
    np.zeros(4, "?"),
]


@pytest.mark.parametrize("arr", ARRAYS, ids=lambda a: str(a.dtype)[:30])
@pytest.mark.parametrize("version", [(1, 0), (2, 0), (3, 0)])
def test_npy_header_matches_numpy(arr, version):
    f = io.BytesIO()
    np.lib.format.write_array(f, arr, version=version)
    raw = f.getvalue()
    h = parse_npy_header(raw)
    back = np.load(io.BytesIO(raw))
    assert (h.dtype, h.shape, h.data_offset) == (back.dtype, back.shape, len(raw) - back.nbytes)
    assert h.fortran_order == (arr.ndim > 1 and back.flags.f_contiguous and not back.flags.c_contiguous)


def _npy(header: bytes, version=(1, 0)) -> bytes:
    lenfield = struct.pack("<H", len(header)) if version == (1, 0) else struct.pack("<I", len(header))
    return b"\x93NUMPY" + bytes(version) + lenfield + header


def test_npy_python2_long_suffix_like_numpy():
    raw = _npy(b"{'descr': '<f4', 'fortran_order': False, 'shape': (2L, 3L), }\n")
    assert parse_npy_header(raw).shape == (2, 3)
    f = io.BytesIO(raw)
    np.lib.format.read_magic(f)
    assert np.lib.format.read_array_header_1_0(f)[0] == (2, 3)
    with pytest.raises(FormatError):
        parse_npy_header(_npy(b"{'descr': '<f4', 'fortran_order': False, 'shape': (2L,), }\n", (3, 0)))


@pytest.mark.parametrize(
    "header",
    [
        b"{'descr': '<f4', 'fortran_order': False, 'shape': (" + b"(" * 3000 + b")" * 3000 + b",), }",
        b"{'descr': " + b"[" * 2000 + b"]" * 2000 + b", 'fortran_order': False, 'shape': (), }",
        b"{'descr': '<f4', 'fortran_order': False, 'shape': (4, 6), } \"\"\"",
        b"{'descr': '<f4', 'fortran_order': False, 'shape': (-1, 3), }",
        b"{'descr': '<f4', 'fortran_order': 0, 'shape': (4,), }",
        b"{'descr': '<f4', 'fortran_order': False, 'shape': (4,), 'x': 1}",
        b"{'descr': 'V' + '1', 'fortran_order': False, 'shape': (1,), }",
        b"{'descr': '<f4,,i4', 'fortran_order': False, 'shape': (1,), }",
        b"{'descr': '<U99999999999999', 'fortran_order': False, 'shape': (1,), }",
        b"{'descr': [('a', [('b', " * 200 + b"'<i4'" + b")])" * 200 + b"], 'fortran_order': False, 'shape': (1,), }",
        b"{'descr': '<f4', 'fortran_order': False, 'shape': (4, 6), }'",
        b"{'descr': '<f4', 'fortran_order': False, 'shape': (" + b"9" * 5000 + b",), }",
        b"{'descr': __import__('os'), 'fortran_order': False, 'shape': (1,), }",
    ],
)
def test_npy_hostile_headers_are_format_errors(header):
    with pytest.raises((FormatError, LimitError)):
        parse_npy_header(_npy(header))


def test_npy_parser_never_accepts_what_numpy_reads_differently():
    """Random byte edits of real headers: whenever torchless accepts a header, NumPy
    reads the same dtype, shape and order from it."""
    rng = random.Random(1)
    accepted = 0
    for i in range(1500):
        arr = ARRAYS[i % len(ARRAYS)]
        f = io.BytesIO()
        np.lib.format.write_array(f, arr, version=(1, 0))
        raw = bytearray(f.getvalue()[: 10 + struct.unpack_from("<H", f.getvalue(), 8)[0]])
        for _ in range(rng.randrange(1, 3)):
            raw[rng.randrange(10, len(raw))] = rng.choice(b"()[]{},:'\"L0123456789 -+xX\\")
        try:
            h = parse_npy_header(bytes(raw))
        except TorchlessError:
            continue
        accepted += 1
        g = io.BytesIO(bytes(raw))
        np.lib.format.read_magic(g)
        shape, fortran, dtype = np.lib.format.read_array_header_1_0(g, max_header_size=65536)
        assert (h.dtype, h.shape, h.fortran_order) == (dtype, shape, fortran), bytes(raw)
    assert accepted > 15


def test_header_literal_subset():
    assert parse_header_literal("{'a': (1, -2), 'b': [('x', '<i4', (2,))], 'c': ('t' 'u'), 'd': (3)}") == {
        "a": (1, -2),
        "b": [("x", "<i4", (2,))],
        "c": "tu",
        "d": 3,
    }
    for bad in ("{'a': 1.5}", "{'a': f(1)}", "{[1]: 2}", "{'a': 1", "(1, 2) 3", "{'a': b'x'}"):
        with pytest.raises(TorchlessError):
            parse_header_literal(bad)


# --- the CLI: one line, never a traceback ------------------------------------------------------------
@pytest.mark.allows_internal_error
def test_cli_internal_error_and_interrupt_are_one_line(tmp_path, capsys, monkeypatch):
    from torchless.cli import main as cli

    f = tmp_path / "a.npy"
    np.save(f, np.zeros(3, "<f4"))

    def bug(args):
        raise TypeError("unexpected")

    def interrupt(args):
        raise KeyboardInterrupt

    real = cli.build_parser

    def patched(func):
        def build(*args, **kwargs):
            p = real(*args, **kwargs)
            for action in p._subparsers._group_actions:  # noqa: SLF001 - test-only rewiring
                action.choices["info"].set_defaults(func=func)
            return p

        return build

    monkeypatch.setattr(cli, "build_parser", patched(bug))
    assert cli.main(["info", str(f)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "torchless bug" in err and "Traceback" not in err
    monkeypatch.setattr(cli, "build_parser", patched(interrupt))
    assert cli.main(["info", str(f)]) == 130
    err = capsys.readouterr().err
    assert err == "torchless: interrupted\n"


# --- verify's CRC streams: a 1 MB file declaring a huge deflated record stays small ------
def test_zip_verify_crc_is_streamed(tmp_path):
    import tracemalloc
    import zipfile as zf
    import zlib

    from torchless.container.zip import ZipReader
    from torchless.io.source import open_source

    from .harness import _bomb, _zip_with_bomb

    info = zf.ZipInfo("archive/data.pkl")
    small = zf.ZipInfo("archive/version")
    raw = _zip_with_bomb([(info, b""), (small, b"3\n")], 0, 64, lie=False)
    p = tmp_path / "bomb.zip"
    p.write_bytes(raw)
    zr = ZipReader(open_source(p))
    expect = zlib.crc32(bytes(64 << 20))
    assert _bomb(64)[1] == expect
    tracemalloc.start()
    try:
        assert zr.crc32("data.pkl") == expect
        problems = zr.verify()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert not [pr for pr in problems if pr.code in ("crc", "data")], problems
    assert peak < 16 << 20, peak
    # a lying size is a problem, found without inflating everything
    lie = tmp_path / "lie.zip"
    lie.write_bytes(_zip_with_bomb([(info, b""), (small, b"3\n")], 0, 64, lie=True))
    assert any(pr.code == "data" for pr in ZipReader(open_source(lie)).verify())
    # the streamed CRC equals the whole-record CRC on ordinary deflated records
    q = tmp_path / "d.zip"
    with zf.ZipFile(q, "w", zf.ZIP_DEFLATED) as z:
        z.writestr("archive/a", bytes(range(256)) * 5000)
        z.writestr("archive/b", b"")
    zr = ZipReader(open_source(q))
    for name in ("a", "b"):
        assert zr.crc32(name) == zlib.crc32(bytes(zr.read(name)))


def test_npz_header_that_made_numpy_tokenize_fail_is_a_format_error(tmp_path, capsys):
    """A mutated .npz used to escape as tokenize.TokenError (issue 11 item 15)."""
    import zipfile as zf

    import torchless
    from torchless.cli.main import main

    header = b"{'descr': [('a', '<i4'), ('b', '<f8', (2,))], 'fortran_order': False, 'shape': (2,"
    npy = _npy(header.ljust(118) + b"\n") + bytes(40)
    p = tmp_path / "bad.npz"
    with zf.ZipFile(p, "w") as z:
        z.writestr("a.npy", npy)
    with pytest.raises(Exception) as numpy_err:  # NumPy's own reader: not a ValueError
        np.load(p)["a"]
    assert not isinstance(numpy_err.value, TorchlessError)
    with pytest.raises(FormatError, match="npy"):
        torchless.open(p)
    assert main(["info", str(p)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "bug" not in err


_BOMB_CHILD = r"""
import io, resource, struct, sys, zipfile, zlib
import numpy as np
import torchless
from torchless.core.errors import LimitError

mib = 900
comp = zlib.compressobj(9, zlib.DEFLATED, -15)
chunk = bytes(1 << 20)
raw = b"".join(comp.compress(chunk) for _ in range(mib)) + comp.flush()
crc = 0
for _ in range(mib):
    crc = zlib.crc32(chunk, crc)
# an .npz whose one member is a 900 MiB deflated .npy (honest sizes): np.load would allocate it
hdr = b"{'descr': '|u1', 'fortran_order': False, 'shape': (%d,), }" % ((mib << 20) - 128,)
name = b"x.npy"
buf = io.BytesIO()
buf.write(struct.pack("<4sHHHHHIIIHH", b"PK\x03\x04", 20, 0, 8, 0, 0x21, crc, len(raw), mib << 20, len(name), 0) + name + raw)
cd = buf.tell()
sizes = (crc, len(raw), mib << 20, len(name))
cdr = struct.pack("<4sHHHHHHIIIHHHHHII", b"PK\x01\x02", 20, 20, 0, 8, 0, 0x21, *sizes, 0, 0, 0, 0, 0, 0)
buf.write(cdr + name)
cdlen = buf.tell() - cd
buf.write(struct.pack("<4sHHHHIIH", b"PK\x05\x06", 0, 0, 1, 1, cdlen, cd, 0))
path = sys.argv[1]
open(path, "wb").write(buf.getvalue())
assert len(buf.getvalue()) < (1 << 20)
# the limit leaves 512 MiB above what the interpreter already maps (never more than 1 GiB):
# with a fixed 1 GiB the 900 MiB buffer fitted or not depending on the imports' address
# space, and when it fitted, a later allocation failed instead (a flaky test)
vm = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmSize:")) << 10
lim = min(1 << 30, vm + (512 << 20))
resource.setrlimit(resource.RLIMIT_AS, (lim, lim))
try:
    arrs = torchless.load(path)
    for v in (arrs.values() if isinstance(arrs, dict) else []):
        np.asarray(v.numpy() if hasattr(v, "numpy") else v).sum()
except LimitError as e:
    print("LimitError", e)
    sys.exit(0)
except MemoryError:
    print("bare MemoryError")
    sys.exit(3)
print("loaded")
sys.exit(4)
"""


def test_deflate_bomb_under_1mb_is_a_limit_error_under_1gib(tmp_path):
    """A < 1 MB archive whose member inflates to 900 MiB, loaded under a 1 GiB address-space
    limit, ends in LimitError naming the member, never a bare MemoryError."""
    import subprocess
    import sys

    p = subprocess.run(
        [sys.executable, "-c", _BOMB_CHILD, str(tmp_path / "bomb.npz")], capture_output=True, text=True, timeout=120
    )
    assert p.returncode == 0, p.stdout + p.stderr
    assert "x.npy" in p.stdout
