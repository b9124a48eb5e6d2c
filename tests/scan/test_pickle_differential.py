"""The scanner's pickle model against the real unpicklers (issue 10: root causes 1, 2, 7).

The oracle is CPython's C unpickler (and the pure-Python one joblib uses) with inert,
recording hooks (torchless.scan.engine): every global it resolves, every call, BUILD
and item operation, in order, through each reader path the loaders use. The scanner's
symbolic run must produce the same record; where a reader could read other bytes than
the model (frames), the scanner must flag the stream instead.
"""

from __future__ import annotations

import copyreg
import os
import struct
import subprocess
import sys

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from torchless.scan import scan_file
from torchless.scan.analysis import analyse
from torchless.scan.differential import second_opinion, symbolic_record
from torchless.scan.engine import READERS, EngineWorker, compare, record_c, record_python

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def agree(data: bytes, readers=READERS) -> None:
    model, res = symbolic_record(data)
    assert not res.frame_hazards, res.frame_hazards
    for reader in readers:
        d = compare(record_c(data, reader), model, check_end=reader != "bytes")
        assert d is None, f"{reader}: {d}"


# -- the seeded campaign -------------------------------------------------------------------
def test_differential_fuzz_campaign_has_no_divergence():
    """40k generated streams (every opcode of protocols 0-5, text forms, frames, EXT,
    memo reuse, several STOPs, mutations) through 4 reader paths of the C unpickler and
    the pure-Python one. Runs in a child process with an address-space limit (the real
    unpickler allocates what a stream asks for)."""
    n = int(os.environ.get("TORCHLESS_PICKLE_FUZZ_STREAMS", "40000"))
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "src"))
    p = subprocess.run(
        [sys.executable, os.path.join(ROOT, "scripts", "fuzz_pickle.py"), "--streams", str(n), "--seed", "10", "--chunk", "4000"],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
    )
    out = p.stdout
    assert "RESULT" in out, out[-2000:] + p.stderr[-2000:]
    result = [l for l in out.splitlines() if l.startswith("RESULT")][0]
    assert f"streams={n}" in result and "divergences=0" in result, out[-4000:]
    # the campaign reaches deep: a good share of the streams run to STOP and some hit frames
    stats = result.split("stats=", 1)[1]
    ok = int(stats.split("'model_ok': ", 1)[1].split(",")[0].rstrip("}"))
    assert ok > n // 4, stats
    assert "frame_hazard" in stats


# -- protocol-0 text arguments -------------------------------------------------------------
TEXT = st.binary(max_size=8).map(lambda b: b.replace(b"\n", b"")) | st.text(
    alphabet="0123456789+-_ xXoObBeE.LinfatyNI\t\x00", max_size=10
).map(lambda s: s.encode())


@settings(max_examples=300, deadline=None)
@given(op=st.sampled_from([b"I", b"L", b"F", b"S", b"V", b"P"]), arg=TEXT)
def test_text_arguments_parse_as_the_c_unpickler_parses_them(op, arg):
    agree(op + arg + b"\n.")


@settings(max_examples=150, deadline=None)
@given(arg=TEXT, op=st.sampled_from([b"g", b"p"]))
def test_memo_text_keys_as_the_c_unpickler(arg, op):
    # PUT then GET with text keys; the GET key is the same text (or 0). CPython's memo is
    # an array as long as the largest key: keep keys small in this (unlimited) process
    digits = arg.split(b"\0")[0].replace(b"_", b"").strip()
    try:
        key = int(digits)
    except ValueError:  # not an int to Python either ('--0', ''): no huge memo array
        key = 0
    assume(key < 1 << 16)
    agree(b"N" + op + arg + b"\n" + (b"g" + arg + b"\n" if op == b"p" else b"") + b".")


@pytest.mark.parametrize(
    "line,value",
    [
        (b"00", False),
        (b"01", True),
        (b"+1", True),
        (b" 0", False),
        (b"010", 8),
        (b"0x1f", 31),
        (b"1_000", 1000),
        (b"\x00\x00", False),
        (b"1\x00zz", 1),
    ],
)
def test_int_text_forms(line, value):
    model, _ = symbolic_record(b"I" + line + b"\n.")
    assert model.value == (type(value).__name__, value)
    agree(b"I" + line + b"\n.")


@pytest.mark.parametrize(
    "stream",
    [
        b"F1_0\n.",
        b"F 1\n.",
        b"F1e999\n.",
        b"I08\n.",
        b"I0777777777777777777777777\n.",
        b"L0x10L\n.",
        b"Finfinity\n.",
        b"F1.5L\n.",
    ],
)
def test_numbers_c_refuses_or_reads_its_own_way(stream):
    agree(stream)


# -- names, protocols, EXT, memo, several STOPs -------------------------------------------
def test_python2_renames_follow_the_protocol_like_cpython():
    for proto, expect in ((2, ("builtins", "eval")), (3, ("__builtin__", "eval")), (0, ("builtins", "eval"))):
        data = (b"\x80" + bytes([proto]) if proto else b"") + b"c__builtin__\neval\n."
        model, res = symbolic_record(data)
        assert model.events == [("global", *expect)]
        agree(data)
        # judged dangerous either way: an unrenamed Python-2 name counts as what it names
        assert res.globals[0].verdict.verdict == "dangerous"
    # PROTO in the middle switches the renames on and off, as in CPython
    agree(b"\x80\x04cUserDict\nUserDict\n0\x80\x02cUserDict\nUserDict\n0\x80\x04cwhichdb\nwhichdb\n.")
    # the full tables (issue 10 cause 7): names beyond the old partial table
    for mod, name in (
        ("Tkinter", "Tk"),
        ("urllib2", "urlopen"),
        ("cPickle", "loads"),
        ("test.test_support", "x"),
        ("exceptions", "OSError"),
    ):
        data = b"c" + mod.encode() + b"\n" + name.encode() + b"\n."
        model, _ = symbolic_record(data)
        assert model.events == record_c(data).events
        assert model.events[0][1:] != (mod, name)


@pytest.fixture
def extensions():
    codes = {7: ("os", "system"), 300: ("builtins", "eval")}
    for c, (m, n) in codes.items():
        copyreg.add_extension(m, n, c)
    yield codes
    for c, (m, n) in codes.items():
        copyreg.remove_extension(m, n, c)


def test_ext_codes_resolve_once_per_run_like_cpythons_cache(extensions):
    data = b"\x80\x02\x82\x07\x82\x07\x83\x2c\x01(\x82\x07t."
    model, _ = symbolic_record(data)
    assert [e for e in model.events if e[0] == "global"] == [("global", "os", "system"), ("global", "builtins", "eval")]
    agree(data)
    agree(b"\x80\x02\x82\x08.")  # unregistered: both stop


@pytest.mark.parametrize(
    "stream",
    [
        b"\x80\x06N.",  # unsupported protocol: the C unpickler stops (torch's weights-only goes on)
        b"]N(cos\nsystem\ntR.",  # REDUCE needs a tuple
        b"K\x01(u.",  # SETITEMS with an empty MARK is a no-op on anything
        b"]Nb.",  # BUILD None on data is a no-op
        b"]K\x00K\x05s.",  # SETITEM on a list assigns an index
        b"ios\nsystem\n.",  # INST without MARK: stops before the import
        b"c\nsystem\n.",  # empty module line
        b"(cos\nsystem\nK\x01K\x02u.",  # SETITEMS on a global with items: recorded
        b"(cos\nsystem\nK\x01u.",  # odd SETITEMS: stops before any __setitem__
        b"cos\nsystem\n)}\x92.",  # NEWOBJ_EX
        b"\x80\x05\x96\x02\x00\x00\x00\x00\x00\x00\x00ab\x98.",  # READONLY_BUFFER on a bytearray
        b"K\x01\x98.",  # READONLY_BUFFER on an int stops
        b"N.N.cos\nsystem\n.",  # several STOPs (each load reads one)
    ],
)
def test_cpython_semantics_where_torch_weights_only_differs(stream):
    agree(stream)


def test_several_stops_each_stream_agrees_from_its_offset():
    data = b"N.cos\nsystem\n.\x80\x02c__builtin__\neval\n."
    pos = 0
    while pos < len(data):
        model, res = symbolic_record(data, start=pos)
        oracle = record_c(data, "bytesio", start=pos)
        assert compare(oracle, model) is None
        pos = res.end
    assert pos == len(data)


# -- frames (issue 10 cause 2) -------------------------------------------------------------
def _frame_smuggle() -> bytes:
    """A stream that io.BytesIO readers (torch's data.pkl, ``pickle.load(io.BytesIO(b))``)
    run as os.system(...), while a linear walk (``pickle.loads``) sees one string: the
    BINUNICODE length crosses the end of a 3-byte FRAME, so the C unpickler discards the
    frame's tail and reads the length from after the frame."""
    body = b"(S'echo pwned'\nios\nsystem\n"
    return b"\x80\x04\x95" + struct.pack("<Q", 3) + b"X" + struct.pack("<H", 2 + len(body)) + b"\x00" * 4 + body + b"."


def test_frame_layouts_readers_read_differently_are_flagged(tmp_path):
    data = _frame_smuggle()
    assert record_c(data, "bytes").events == []
    assert ("global", "os", "system") in record_c(data, "bytesio").events  # the real divergence
    res = analyse(data)
    assert res.frame_hazards and "crosses the end of a FRAME" in res.frame_hazards[0][1]
    p = tmp_path / "smuggle.pkl"
    p.write_bytes(data)
    fr = scan_file(str(p))
    assert fr.verdict != "clean"
    assert any(f.rule == "unanalysable" and "FRAME" in f.message for f in fr.findings)


def test_frame_smuggle_really_runs_under_a_bytesio_reader(tmp_path):
    marker = tmp_path / "ran"
    body = b"(S'touch " + str(marker).encode() + b"'\nios\nsystem\n"
    data = b"\x80\x04\x95" + struct.pack("<Q", 3) + b"X" + struct.pack("<H", 2 + len(body)) + b"\x00" * 4 + body + b"."
    code = (
        "import io, pickle, sys; d = open(sys.argv[1], 'rb').read(); "
        "pickle.loads(d); print('loads-ok'); pickle.load(io.BytesIO(d))"
    )
    p = tmp_path / "s.pkl"
    p.write_bytes(data)
    out = subprocess.run([sys.executable, "-c", code, str(p)], capture_output=True, text=True, timeout=60)
    assert "loads-ok" in out.stdout and marker.exists(), out.stderr[-500:]
    assert scan_file(str(p)).verdict != "clean"


def test_aligned_nested_and_empty_frames_agree_on_every_reader():
    import pickle

    for obj in ({"a": list(range(300)), "b": "x" * 70000}, [b"y" * 10] * 1000):
        agree(pickle.dumps(obj, protocol=4))
        agree(pickle.dumps(obj, protocol=5))
    agree(b"\x80\x04\x95\x00\x00\x00\x00\x00\x00\x00\x00N\x95\x01\x00\x00\x00\x00\x00\x00\x00.")
    # a frame inside a frame that ends within it: every C reader just checks it
    agree(b"\x80\x04\x95\x0c\x00\x00\x00\x00\x00\x00\x00\x95\x01\x00\x00\x00\x00\x00\x00\x00N.")


def test_short_frame_read_past_by_the_python_unpickler_is_analysed(tmp_path):
    # FRAME longer than the data: the C unpickler stops, pickle._Unpickler (joblib) runs it
    data = b"\x80\x04\x95" + struct.pack("<Q", 500) + b"cos\nsystem\n(S'x'\ntR."
    assert record_c(data).events == []
    assert ("global", "os", "system") in record_python(data).events
    p = tmp_path / "short.joblib"
    p.write_bytes(data)
    fr = scan_file(str(p))
    assert fr.verdict == "dangerous"
    assert any(f.rule == "dangerous-global" and f.global_name == "os.system" for f in fr.findings)


def test_text_number_only_python_accepts_is_not_clean(tmp_path):
    # FLOAT '1_0' stops the C unpickler; the pure-Python unpickler reads 10.0 and goes on
    data = b"F1_0\n0cos\nsystem\n(S'x'\ntR."
    assert record_c(data).events == [] and record_python(data).events
    p = tmp_path / "f.pkl"
    p.write_bytes(data)
    fr = scan_file(str(p))
    assert fr.verdict in ("unanalysable", "dangerous")
    assert any(f.rule == "unanalysable" for f in fr.findings)


# -- the second engine ----------------------------------------------------------------------
def test_second_engine_child_is_resource_limited_and_agrees():
    with EngineWorker(memory=1 << 30, timeout=10) as w:
        r = w.record(b"cos\nsystem\n(S'x'\ntR.")
        assert r is not None and r.events[0] == ("global", "os", "system")
        big = w.record(b"Nr\x00\x00\x00\x40.")  # a memo index CPython allocates 16 GiB for
        assert big is not None and big.outcome == "error" and big.resource
        assert w.record(b"N.") is not None  # the same child serves the next stream
    assert second_opinion(b"cos\nsystem\n(S'x'\ntR.", 0, None) is None


def test_engine_disagreement_is_a_finding(tmp_path, monkeypatch):
    from torchless.scan import differential

    monkeypatch.setattr(differential, "second_opinion", lambda *a: "event 0: real ('global', 'os', 'system') model nothing")
    p = tmp_path / "x.pkl"
    p.write_bytes(b"\x80\x02]q\x00.")
    fr = scan_file(str(p))
    assert any(f.rule == "engine-disagreement" for f in fr.findings)
    assert fr.verdict == "unanalysable"


def test_stream_that_only_file_readers_run_is_not_skipped(tmp_path):
    """The reverse smuggle: io.BytesIO readers stop on the frame (nothing imported), a
    buffered file (``pickle.load(open(path))``, torch's legacy reader) runs os.system.
    Whether the bytes are a pickle at all is decided with every reader, in the engine's
    resource-limited child."""
    marker = tmp_path / "ran"
    body = b"0cos\nsystem\n(S'touch " + str(marker).encode() + b"'\ntR."
    data = b"\x80\x04\x95" + struct.pack("<Q", 3) + b"X\x00\x00" + b"\x00\x00" + body
    assert record_c(data, "bytesio").events == [] and record_python(data).events == []
    p = tmp_path / "blob.data"  # a name that claims nothing
    p.write_bytes(data)
    fr = scan_file(str(p))
    assert fr.verdict == "dangerous", fr.findings
    code = "import pickle, sys; pickle.load(open(sys.argv[1], 'rb'))"
    subprocess.run([sys.executable, "-c", code, str(p)], capture_output=True, timeout=60)
    assert marker.exists()


def test_memo_bomb_does_not_reach_the_scanning_process(tmp_path):
    # a memo key the C unpickler allocates a 16 GiB array for: probed in the child only
    import resource
    import time

    p = tmp_path / "m.pkl"
    p.write_bytes(b"Nr\x00\x00\x00\x40.")
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t = time.monotonic()
    fr = scan_file(str(p))
    assert time.monotonic() - t < 5
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 512 * 1024  # KiB
    assert fr.verdict in ("clean", "unanalysable")
