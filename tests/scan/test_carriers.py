"""Carriers recognised and read the way their loaders read them; nothing unrecognised is
CLEAN; nested payloads followed whatever their encoding; one work budget per scan.

Every malicious sample of ``corpus/gen_carriers.py`` is proven to run under its real loader
(in a forked child; the payload only creates a marker file) and must be flagged.
"""

from __future__ import annotations

import io
import json
import os
import struct
import subprocess
import sys
import time
import zipfile
import zlib

import pytest

from torchless.cli.main import main as cli_main
from torchless.core.errors import TorchlessError
from torchless.core.npyheader import parse_header_literal
from torchless.io.source import BytesSource
from torchless.scan import scan
from torchless.scan.carriers.numpy import read_npy_header
from torchless.scan.findings import LOADERS
from torchless.scan.policy import classify

from .conftest import CORPUS, ENV


@pytest.fixture(scope="module")
def carriers(tmp_path_factory):  # type: ignore[no-untyped-def]
    out = tmp_path_factory.mktemp("carriers")
    markers = tmp_path_factory.mktemp("carrier_markers")
    env = dict(os.environ, **{ENV: str(markers)})
    p = subprocess.run(
        [sys.executable, os.path.join(CORPUS, "gen_carriers.py"), str(out)], env=env, capture_output=True, text=True, timeout=300
    )
    assert p.returncode == 0, p.stderr[-3000:]
    with open(out / "manifest.json") as f:
        return out, markers, json.load(f)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="the loader runner forks one child per sample")
def test_every_carrier_sample_runs_under_its_loader(carriers):  # type: ignore[no-untyped-def]
    out, markers, man = carriers
    runnable = [m for m in man if m["loader"]]
    assert len(runnable) >= 12
    env = dict(os.environ, **{ENV: str(markers)})
    args = [f"{m['loader']}={out / m['name']}" for m in runnable]
    proc = subprocess.run(
        [sys.executable, os.path.join(CORPUS, "run_loader.py"), "60", *args], env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    deadline = time.monotonic() + 10
    missing = [m["name"] for m in runnable]
    while missing and time.monotonic() < deadline:
        missing = [n for n in missing if not os.path.exists(markers / n)]
        if missing:
            time.sleep(0.1)
    assert not missing, proc.stdout


def test_every_carrier_sample_gets_its_verdict(carriers):  # type: ignore[no-untyped-def]
    out, _markers, man = carriers
    wrong = {}
    for m in man:
        rep = scan(out / m["name"], jobs=1)
        verdicts = {f.verdict for f in rep.files}
        rules = {f.rule for f in rep.findings}
        expect_exit = 0 if m["expect"] == "clean" else 1
        if m["expect"] not in verdicts or not set(m["rules"]) <= rules or rep.exit_code != expect_exit:
            wrong[m["name"]] = (verdicts, sorted(rules), rep.exit_code)
        if m["expect"] == "clean":
            assert verdicts == {"clean"}, m["name"]
        for f in rep.findings:  # every finding names the loader that would run the bytes
            assert f.loader in LOADERS, (m["name"], f.rule, f.loader)
    # DCP: an item file scanned on its own (not named *.distcp) still finds its metadata
    (fr,) = scan(out / "x21_dcp_any_name" / "shard0.bin", jobs=1).files
    assert fr.kind == "distcp" and fr.verdict == "dangerous"
    assert any(f.rule == "dangerous-global" and f.loader == "torch.distributed.checkpoint.load" for f in fr.findings)
    # DCP: the link out of the folder is reported by the item's loader, and not followed
    rep = scan(out / "x22_dcp_link", jobs=1)
    assert "unanalysable" in {f.verdict for f in rep.files}
    assert not any(f.rule == "dangerous-global" for f in rep.findings)
    assert not wrong, wrong


# -- fail closed at the carrier level ----------------------------------------------------


def test_unrecognised_bytes_are_never_clean(tmp_path):  # type: ignore[no-untyped-def]
    blob = bytes((i * 131 + 7) % 256 for i in range(2048))
    for name in ("weights.pt", "model.ckpt", "x.pkl", "a.joblib"):
        p = tmp_path / name
        p.write_bytes(b"\x00" + blob)
        (fr,) = scan(p).files
        assert fr.verdict == "unanalysable" and fr.findings[0].rule == "unrecognized", name
    assert cli_main(["scan", str(tmp_path / "weights.pt")]) == 1
    # not a model name and nothing any loader runs: an info note, clean
    p = tmp_path / "notes.txt"
    p.write_bytes(b"\x00" + blob)
    (fr,) = scan(p).files
    assert fr.verdict == "clean" and [f.severity for f in fr.findings] == ["info"]


@pytest.mark.parametrize("first", [b"c", b"S", b"I", b"i", b"\x80"])
def test_binary_files_whose_first_byte_is_an_opcode(tmp_path, first):  # type: ignore[no-untyped-def]
    # a safetensors-like file (2 MB) whose header length starts with a text opcode: the
    # first "line" runs far past the probe window; no unpickler imports anything from it
    header = b'{"w":{"dtype":"F32","shape":[512,1024],"data_offsets":[0,2097152]}}'
    header += b" " * ((first[0] - len(header)) % 256)
    p = tmp_path / "model.safetensors"
    p.write_bytes(struct.pack("<Q", len(header)) + header + bytes(2 << 20))
    (fr,) = scan(p).files
    assert fr.verdict == "clean", [(f.rule, f.severity, f.message) for f in fr.findings]


def test_stream_the_real_unpickler_imports_from_is_analysed(tmp_path):  # type: ignore[no-untyped-def]
    # protocol 0 text that only the real unpickler decides about: it imports os
    p = tmp_path / "notes.txt"
    p.write_bytes(b"cos\nsystem\n(S'true'\ntR.")
    assert scan(p).files[0].verdict == "dangerous"


def test_empty_and_unreadable_folders_exit_2(tmp_path, capsys, monkeypatch):  # type: ignore[no-untyped-def]
    empty = tmp_path / "empty"
    empty.mkdir()
    rep = scan(empty)
    assert rep.files == [] and rep.exit_code == 2
    assert cli_main(["scan", str(empty)]) == 2
    assert "error" in capsys.readouterr().out
    locked = tmp_path / "locked"
    (locked / "sub").mkdir(parents=True)
    real_scandir = os.scandir

    def deny(path):  # type: ignore[no-untyped-def]
        if os.fspath(path).endswith("sub"):
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", deny)
    rep = scan(locked, jobs=1)
    assert rep.exit_code == 2 and [f.verdict for f in rep.files] == ["error"]
    assert rep.files[0].findings[0].rule == "unreadable"


def test_folder_links_out_are_not_followed(tmp_path):  # type: ignore[no-untyped-def]
    outside = tmp_path / "outside.pkl"
    outside.write_bytes(b"cos\nsystem\n(S'true'\ntR.")
    folder = tmp_path / "model"
    folder.mkdir()
    os.symlink(outside, folder / "weights.pkl")
    (fr,) = scan(folder).files
    assert [f.rule for f in fr.findings] == ["link-escape", "unanalysable"] and fr.verdict == "unanalysable"


# -- nested payloads -----------------------------------------------------------------------


def _zip_with_data_pkl(data_pkl: bytes) -> bytes:
    b = io.BytesIO()
    with zipfile.ZipFile(b, "w") as zf:
        zf.writestr("archive/data.pkl", data_pkl)
        zf.writestr("archive/version", "3\n")
    return b.getvalue()


def test_nested_loader_is_never_safe_and_computed_payloads_are_unanalysable(gen, tmp_path):  # type: ignore[no-untyped-def]
    assert classify("torch.storage", "_load_from_bytes").verdict == "nested"
    assert classify("joblib.numpy_pickle", "NumpyArrayWrapper").verdict == "nested"
    assert classify("pickle", "loads").verdict == "dangerous"
    computed = gen.call(gen.G("torch.storage", "_load_from_bytes"), gen.call(gen.G("mylib", "fetch"), gen.S("k")))
    p = tmp_path / "computed.pt"
    p.write_bytes(_zip_with_data_pkl(gen.pk(computed)))
    (fr,) = scan(p).files
    assert fr.verdict == "unanalysable"
    assert any(f.rule == "unanalysable" and f.global_name == "torch.storage._load_from_bytes" for f in fr.findings)


def test_nested_payload_in_bytesio_and_base64_is_followed(gen, tmp_path):  # type: ignore[no-untyped-def]
    import base64

    inner = b"cos\nsystem\n(S'true'\ntR."
    body = gen.call(
        gen.G("torch.storage", "_load_from_bytes"),
        gen.call(gen.G("base64", "b64decode"), gen.S(base64.b64encode(inner).decode())),
    )
    p = tmp_path / "b64.pt"
    p.write_bytes(_zip_with_data_pkl(gen.pk(body)))
    (fr,) = scan(p).files
    assert fr.verdict == "dangerous"
    assert any(
        f.rule == "dangerous-global" and "payload of torch.storage._load_from_bytes" in (f.member or "") for f in fr.findings
    )


def test_shared_nested_argument_is_analysed_once(gen, tmp_path):  # type: ignore[no-untyped-def]
    inner = gen.pk(gen.call(gen.G("collections", "OrderedDict")), proto=2)
    # the same payload passed 200 times through the memo
    body = (
        gen.BY(inner)
        + b"q\x01"
        + b"".join(gen.call(gen.G("torch.storage", "_load_from_bytes"), b"h\x01") + b"0" for _ in range(200))
        + b"N"
    )
    p = tmp_path / "shared.pt"
    p.write_bytes(_zip_with_data_pkl(gen.pk(body, proto=3)))
    (fr,) = scan(p).files
    assert sum(1 for f in fr.findings if f.rule == "nested-loader") == 1
    assert fr.streams <= 3


# -- NumPy headers -------------------------------------------------------------------------


def test_npy_header_parser_is_strict_and_bounded() -> None:
    assert parse_header_literal("{'descr': '<f8', 'fortran_order': False, 'shape': (3, 4), }") == {
        "descr": "<f8",
        "fortran_order": False,
        "shape": (3, 4),
    }
    assert parse_header_literal("{'shape': (3L,)}", allow_long=True) == {"shape": (3,)}
    assert parse_header_literal("{u'a': [('x', '|O'), ('y', ('<i4', (2,)))]}") == {"a": [("x", "|O"), ("y", ("<i4", (2,)))]}
    for bad in (
        "{'a': \u00b2}",
        "{'a': 1\u0663}",
        "(" * 5000 + ")" * 5000,
        "{'a': __import__('os')}",
        "{'a': 1+1}",
        "'unterminated",
        "{'a': 0x10}",
        "\x00",
        "{" * 100000,
    ):
        with pytest.raises(TorchlessError):
            parse_header_literal(bad, max_depth=64)


def test_npy_header_as_numpy_reads_it() -> None:
    np = pytest.importorskip("numpy")

    def hdr(text: str, version: tuple[int, int] = (1, 0)) -> bytes:
        enc = text.encode("latin1")
        return b"\x93NUMPY" + bytes(version) + struct.pack("<H" if version == (1, 0) else "<I", len(enc)) + enc

    assert read_npy_header(BytesSource(hdr("{'descr': '<f4', 'fortran_order': False, 'shape': (2,)}")))[0] == "plain"
    assert (
        read_npy_header(BytesSource(hdr("{'descr': [('a', '<f4'), ('b', 'O')], 'fortran_order': False, 'shape': (2,)}")))[0]
        == "object"
    )
    assert read_npy_header(BytesSource(hdr("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'x': 1}")))[0] == "refused"
    assert read_npy_header(BytesSource(hdr("{'descr': '<f4', 'fortran_order': False, 'shape': (2,)}", (4, 0))))[0] == "refused"
    # agreement with NumPy's own reader on the object question
    for descr in (
        "'|O'",
        "'object'",
        "[('a', '<i4'), ('b', ('O', (2,)))]",
        "'<f8'",
        "[('', '|V4'), ('x', '<i4')]",
        "('O', (3,))",
    ):
        text = "{'descr': %s, 'fortran_order': False, 'shape': (1,)}" % descr
        ours = read_npy_header(BytesSource(hdr(text)))[0]
        f = io.BytesIO(hdr(text))
        np.lib.format.read_magic(f)
        _shape, _fo, dtype = np.lib.format.read_array_header_1_0(f)
        assert (ours == "object") == dtype.hasobject, descr


# -- the work budget -----------------------------------------------------------------------


def test_decompression_bomb_under_1mb_is_bounded(tmp_path):  # type: ignore[no-untyped-def]
    c = zlib.compressobj(9, zlib.DEFLATED, 31)  # gzip: joblib's \x1f\x8b prefix
    chunk = b"N" * (1 << 20)
    bomb = c.compress(b"\x80\x02") + b"".join(c.compress(chunk) for _ in range(128)) + c.flush()
    assert len(bomb) < (1 << 20)
    p = tmp_path / "bomb.joblib"
    p.write_bytes(bomb)
    # CPU time of the scan in a fresh process (wall time on a shared machine says little);
    # peak memory from VmHWM: ru_maxrss keeps the parent's high-water mark across exec, so
    # after a long test session it reported the pytest process's size, not the scan's
    code = (
        "import resource, json; from torchless.scan import scan; u = resource.getrusage(resource.RUSAGE_SELF); "
        f"r = scan({str(p)!r}, jobs=1); v = resource.getrusage(resource.RUSAGE_SELF); "
        "hwm = next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmHWM:')); "
        "print(json.dumps([v.ru_utime + v.ru_stime - u.ru_utime - u.ru_stime, "
        "hwm, r.files[0].verdict, [f.rule for f in r.findings]]))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)),
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    seconds, rss_kib, verdict, rules = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seconds < 5 and rss_kib < (1 << 20), (seconds, rss_kib)
    assert verdict == "unanalysable" and "limit" in rules


def test_overlapping_zip_entries_are_analysed_once(gen, tmp_path):  # type: ignore[no-untyped-def]
    data = bytearray(gen.raw_zip([("archive/data.pkl", gen.pk(gen.call(gen.G("collections", "OrderedDict"))))]))
    cd = data.index(b"PK\x01\x02")
    eocd = data.index(b"PK\x05\x06")
    entry = bytes(data[cd:eocd])
    copies = 500
    names = [entry[:46] + (b"archive/x%04d.pkl" % i) for i in range(copies)]
    fixed = [n[:28] + struct.pack("<H", len(n) - 46) + n[30:] for n in names]
    cdir = b"".join(fixed)
    end = bytearray(data[eocd:])
    struct.pack_into("<HHII", end, 8, copies, copies, len(cdir), cd)
    p = tmp_path / "overlap.pt"
    p.write_bytes(bytes(data[:cd]) + cdir + bytes(end))
    t = time.perf_counter()
    (fr,) = scan(p).files
    assert time.perf_counter() - t < 5
    assert fr.streams == 1  # 500 names, one byte range, analysed once
    assert any(f.rule == "zip-overlap" for f in fr.findings)


def test_mutated_carriers_never_crash_or_hang(carriers, tmp_path):  # type: ignore[no-untyped-def]
    """Bit flips and truncations of every carrier sample: no internal error, bounded CPU."""
    import random
    import resource

    out, _markers, man = carriers
    rng = random.Random(1234)
    files = [out / m["name"] for m in man if (out / m["name"]).is_file()]
    worst = 0.0
    for i in range(600):
        data = bytearray(rng.choice(files).read_bytes())
        op = rng.randrange(3)
        if op == 0 and data:
            for _ in range(rng.randrange(1, 8)):
                data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        elif op == 1:
            data = data[: rng.randrange(len(data) + 1)]
        else:
            pos = rng.randrange(len(data) + 1)
            data[pos:pos] = rng.randbytes(rng.randrange(1, 64))
        p = tmp_path / f"m{i}{rng.choice(['.pt', '.npy', '.npz', '.tar', '.pkl', '.joblib', ''])}"
        p.write_bytes(bytes(data))
        t = resource.getrusage(resource.RUSAGE_SELF)
        (fr,) = scan(p, jobs=1).files
        u = resource.getrusage(resource.RUSAGE_SELF)
        worst = max(worst, u.ru_utime + u.ru_stime - t.ru_utime - t.ru_stime)
        assert fr.error is None, (p.name, fr.error)
        assert fr.verdict in ("clean", "suspicious", "unanalysable", "dangerous"), fr.verdict
    assert worst < 5, worst


def test_npy_headers_differential_against_numpy() -> None:
    """Random headers: where the strict reader decides (object / plain / refused), NumPy's
    own reader agrees; 'unanalysable' is the only way to disagree (never a silent pass)."""
    import random

    pytest.importorskip("numpy")
    try:  # NumPy's own reader (private helpers: the module moved in NumPy 2)
        from numpy.lib import _format_impl as fmt
    except ImportError:  # pragma: no cover - NumPy 1.x
        from numpy.lib import format as fmt  # type: ignore[no-redef]
    rng = random.Random(7)
    descrs = [
        "'<f4'",
        "'|O'",
        "'O'",
        "'object'",
        "'<i8'",
        "'|b1'",
        "'<U3'",
        "'|S2'",
        "'<M8[s]'",
        "'V8'",
        "[('a', '<f4'), ('b', '|O')]",
        "[('a', '<f4'), ('b', '<i2', (2,))]",
        "[('', '|V4'), ('x', '|O')]",
        "[(('t', 'n'), '|O')]",
        "('|O', (2,))",
        "('<f4', (2, 3))",
        "[('a', [('b', '|O')])]",
        "'<f4 '",
        "'Q'",
        "'bogus'",
        "[('a',)]",
        "42",
        "None",
        "[('a', '|O', 3)]",
        "u'<f8'",
    ]
    shapes = ["()", "(3,)", "(2, 3)", "(3L,)", "[3]", "(-1,)", "(True,)", "('a',)"]
    orders = ["False", "True", "0", "None"]
    decided = 0
    for _ in range(400):
        keys = [("descr", rng.choice(descrs)), ("fortran_order", rng.choice(orders)), ("shape", rng.choice(shapes))]
        if rng.random() < 0.1:
            keys.append(("extra", "1"))
        if rng.random() < 0.1:
            keys.pop(rng.randrange(len(keys)))
        rng.shuffle(keys)
        text = "{" + ", ".join(f"{k!r}: {v}" for k, v in keys) + rng.choice(["}", ", }", "}\n", " }   "])
        version = rng.choice([(1, 0), (2, 0), (3, 0), (1, 0), (4, 0)])
        enc = text.encode("utf8" if version == (3, 0) else "latin1")
        blob = b"\x93NUMPY" + bytes(version) + struct.pack("<H" if version == (1, 0) else "<I", len(enc)) + enc
        ours, _detail = read_npy_header(BytesSource(blob))
        f = io.BytesIO(blob)
        try:
            v = fmt.read_magic(f)
            fmt._check_version(v)
            _s, _fo, dtype = fmt._read_array_header(f, v, max_header_size=1 << 30)
            theirs = "object" if dtype.hasobject else "plain"
        except Exception:  # noqa: BLE001 - NumPy refuses: nothing would be read
            theirs = "refused"
        if ours != "unanalysable":
            decided += 1
            assert ours == theirs, (text, version, ours, theirs)
    assert decided > 300


def test_protocol_4_pickle_of_a_large_array_is_clean(tmp_path):  # type: ignore[no-untyped-def]
    """CPython writes objects of 64 KiB or more between frames: ordinary output, not a frame lie."""
    import pickle

    np = pytest.importorskip("numpy")
    p = tmp_path / "arrays.pkl"
    p.write_bytes(pickle.dumps({"w": np.zeros((200, 1000)), "cfg": {"a": 1}}, protocol=4))
    (fr,) = scan(p).files
    assert fr.verdict == "clean", [(f.rule, f.message) for f in fr.findings]
