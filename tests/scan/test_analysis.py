"""Symbolic execution, the policy and the reports."""

from __future__ import annotations

import json
import os
import pickle

from hypothesis import given, settings
from hypothesis import strategies as st

from torchless.scan import SAFE, classify, scan
from torchless.scan.analysis import analyse, disassemble
from torchless.scan.policy import DANGEROUS_MODULES, DANGEROUS_NAMES
from torchless.scan.report import format_json, format_sarif, format_text


def test_every_allowlist_entry_has_a_reason():  # type: ignore[no-untyped-def]
    assert len(SAFE) > 150
    for name, entry in SAFE.items():
        assert entry.reason and len(entry.reason) > 3, name
    for table in (DANGEROUS_MODULES, DANGEROUS_NAMES):
        assert all(len(r) > 5 for r in table.values())


def test_classify():  # type: ignore[no-untyped-def]
    assert classify("torch._utils", "_rebuild_tensor_v2").verdict == "safe"
    assert classify("collections", "OrderedDict").verdict == "safe"
    assert classify("os", "system").verdict == "dangerous"
    assert classify("subprocess", "Popen").verdict == "dangerous"
    assert classify("builtins", "getattr").verdict == "dangerous"
    assert classify("torch.hub", "load").verdict == "dangerous"
    assert classify("mymodel", "Net").verdict == "unknown"
    # dotted names resolved by attribute walk are never safe
    v = classify("argparse", "_os.system")
    assert v.verdict == "dangerous" and "os.system" in v.reason
    assert classify("torch", "_utils._rebuild_tensor_v2").verdict == "unknown"
    assert classify("collections", "OrderedDict.__init__").verdict == "dangerous"
    # TorchScript class names are safe only inside TorchScript archives
    assert classify("__torch__.m", "M", torchscript=True).verdict == "safe"
    assert classify("__torch__.m", "M").verdict == "unknown"
    assert classify("torch.jit._pickle", "restore_type_tag").verdict == "safe"
    assert classify("torch.jit", "load").verdict == "dangerous"


def test_indirect_call_is_followed(gen):  # type: ignore[no-untyped-def]
    data = gen.pk(
        gen.call(
            gen.call(gen.G("builtins", "getattr"), gen.call(gen.G("builtins", "__import__"), gen.S("os")), gen.S("system")),
            gen.S("id"),
        )
    )
    res = analyse(data)
    assert res.finished and res.error is None
    assert [c.callee.kind for c in res.calls] == ["global", "global", "result"]
    assert {g.qualname for g in res.globals} == {"builtins.getattr", "builtins.__import__"}


def test_stack_global_from_memo(gen):  # type: ignore[no-untyped-def]
    data = (
        b"\x80\x04" + gen.SB("posix") + b"\x94" + gen.SB("system") + b"\x94" + b"00" + b"h\x00h\x01\x93" + gen.S("id") + b"\x85R."
    )
    (g,) = analyse(data).globals
    assert g.qualname == "posix.system" and g.opcode == "STACK_GLOBAL" and g.from_memo
    assert g.called == ["REDUCE"]


def test_python2_rename_is_reported(gen, tmp_path):  # type: ignore[no-untyped-def]
    p = tmp_path / "x.pkl"
    p.write_bytes(gen.pk(gen.call(gen.G("__builtin__", "eval"), gen.S("1"))))
    (f,) = [f for f in scan(p).findings if f.rule == "dangerous-global"]
    assert f.global_name == "builtins.eval" and "__builtin__.eval" in f.message


def test_errors_keep_what_ran_before(gen):  # type: ignore[no-untyped-def]
    data = gen.pk(gen.call(gen.G("os", "system"), gen.S("id")))[:-1] + b"\xff"
    res = analyse(data)
    assert res.error is not None and res.end is None
    assert [g.qualname for g in res.globals] == ["os.system"] and res.calls


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_never_raises_on_garbage(data):  # type: ignore[no-untyped-def]
    res = analyse(data)
    assert res.end is not None or res.error is not None
    disassemble(data, 0, res.op_offsets)


@settings(max_examples=100, deadline=None)
@given(st.binary(min_size=1, max_size=300), st.integers(0, 299))
def test_scan_never_crashes_on_corrupted_files(tmp_path_factory, blob, cut):  # type: ignore[no-untyped-def]
    base = pickle.dumps({"a": [1, 2], "b": "x"}, protocol=4)
    data = base[: cut % len(base)] + blob
    d = tmp_path_factory.mktemp("fuzz")
    p = d / "f.bin"
    p.write_bytes(data)
    rep = scan(p)
    assert rep.exit_code in (0, 1)


def test_text_file_is_not_a_pickle(tmp_path):  # type: ignore[no-untyped-def]
    p = tmp_path / "README"
    p.write_text("config: this model was trained ...\ncpu\nnotes\n")
    assert scan(p).clean


def test_reports(gen, tmp_path, capsys):  # type: ignore[no-untyped-def]
    p = tmp_path / "evil.pkl"
    p.write_bytes(gen.pk(gen.call(gen.G("os", "system"), gen.S("id"))))
    (tmp_path / "ok.pkl").write_bytes(pickle.dumps({"a": 1}))
    rep = scan(tmp_path)
    assert rep.exit_code == 1 and len(rep.files) == 2
    text = format_text(rep)
    assert "DANGEROUS" in text and "os.system" in text and "> 0x" in text and "REDUCE" in text
    doc = json.loads(format_json(rep))
    (ev,) = [f for f in doc["files"] if f["path"].endswith("evil.pkl")]
    assert ev["verdict"] == "dangerous" and ev["findings"][0]["offset"] == 2
    sarif = json.loads(format_sarif(rep))
    assert sarif["version"] == "2.1.0"
    (res,) = sarif["runs"][0]["results"]
    assert res["ruleId"] == "dangerous-global" and res["level"] == "error"
    assert res["locations"][0]["physicalLocation"]["region"]["byteOffset"] == 2
    ids = [r["id"] for r in sarif["runs"][0]["tool"]["driver"]["rules"]]
    assert ids[res["ruleIndex"]] == "dangerous-global"


def test_cli_exit_codes_and_unknown_severity(gen, tmp_path, capsys):  # type: ignore[no-untyped-def]
    from torchless.cli.main import main

    p = tmp_path / "unknown.pkl"
    p.write_bytes(gen.pk(gen.call(gen.G("mypkg.models", "Net"), gen.D())))
    assert main(["scan", str(p)]) == 1
    assert main(["scan", str(p), "--unknown-severity", "info"]) == 0
    capsys.readouterr()
    assert main(["scan", str(p), "--sarif"]) == 1
    assert json.loads(capsys.readouterr().out)["runs"][0]["results"][0]["ruleId"] == "unknown-global"
    assert main(["scan", str(p), "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["files"][0]["verdict"] == "suspicious"
    assert main(["scan", str(tmp_path / "missing.pkl")]) == 2
    assert "error" in capsys.readouterr().err


def test_many_files_in_parallel(tmp_path):  # type: ignore[no-untyped-def]
    for i in range(6):
        (tmp_path / f"f{i}.pkl").write_bytes(pickle.dumps(list(range(i))))
    rep = scan(tmp_path, jobs=2)
    assert rep.clean and len(rep.files) == 6 and [os.path.basename(f.path) for f in rep.files] == [f"f{i}.pkl" for i in range(6)]


def test_allowlisted_higher_order_call_with_computed_callable(gen, tmp_path):  # type: ignore[no-untyped-def]
    computed = gen.call(gen.G("builtins", "getattr"), gen.call(gen.G("builtins", "__import__"), gen.S("os")), gen.S("system"))
    data = gen.pk(
        gen.call(gen.G("torch._tensor", "_rebuild_from_type_v2"), computed, gen.G("torch", "Tensor"), gen.T(gen.S("id")), gen.D())
    )
    p = tmp_path / "hof.pt"
    p.write_bytes(data)
    found = [f for f in scan(p).findings if f.rule == "indirect-call"]
    assert found and "calls its argument #0" in found[0].message


def test_build_on_a_global_is_monkey_patching(gen, tmp_path):  # type: ignore[no-untyped-def]
    # BUILD (None, {'__eq__': os.system}) on the class argparse.Namespace itself
    data = gen.pk(gen.G("argparse", "Namespace") + b"N}" + gen.S("__eq__") + gen.G("os", "system") + b"s\x86b")
    p = tmp_path / "patch.pkl"
    p.write_bytes(data)
    rules = {f.rule for f in scan(p).findings}
    assert "global-mutation" in rules
    # the same BUILD on an instance is ordinary
    ok = gen.pk(gen.call(gen.G("argparse", "Namespace")) + b"}" + gen.S("lr") + b"K\x01sb")
    q = tmp_path / "ok.pkl"
    q.write_bytes(ok)
    assert scan(q).clean


def _calls_and_builds() -> bytes:
    """A stream with globals, calls, persistent ids, a BUILD and SETITEMS on results:
    every kind of symbolic value the analyser makes."""
    import collections

    class P(pickle.Pickler):
        def persistent_id(self, obj):  # type: ignore[no-untyped-def]
            return ("storage", "0") if obj == "stored" else None

    import io

    buf = io.BytesIO()
    P(buf, protocol=2).dump({"od": collections.OrderedDict(a=1, b=[1, 2]), "p": "stored", "f": collections.Counter("ab")})
    return buf.getvalue()


_LEFT_CHILD = """
import json, sys
sys.path.insert(0, sys.argv[1])
from tl_testutil import left_for_the_collector
from torchless.scan import scan
from torchless.scan.analysis import analyse

data = open(sys.argv[2], "rb").read()

def run():
    r = analyse(data, record=True)
    assert r.error is None and r.calls and r.globals
    assert len(scan(sys.argv[3:]).files) == len(sys.argv[3:])

run()  # once before: what the first call imports or caches is not what a scan leaves
print(json.dumps([type(o).__name__ for o in left_for_the_collector(run, object)]))
"""


def test_a_finished_analysis_leaves_nothing_to_the_garbage_collector(tmp_path):  # type: ignore[no-untyped-def]
    """Each symbolic value refers to its analyser and the analyser to the calls made on
    them: without cutting them apart at the end, every analysed stream was a cycle of
    objects only a full GC pass frees (about a thousand for a small checkpoint). The
    ONNX walk for external data was closures calling each other, a cycle that held the
    file's mapping open.

    Measured in a fresh interpreter: in the suite's process, threads that earlier tests
    left running (a pool, a worker) make cyclic garbage of their own while the collector
    is off, which this count cannot tell from the scan's."""
    import subprocess
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    stream = tmp_path / "calls.pkl"
    stream.write_bytes(_calls_and_builds())
    samples = [os.path.join(here, "..", "..", "samples", name) for name in ("checkpoint.pt", "mlp.onnx")]
    proc = subprocess.run(
        [sys.executable, "-c", _LEFT_CHILD, os.path.dirname(here), str(stream), *samples],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == []


def test_a_symbolic_value_refuses_calls_after_its_analysis():  # type: ignore[no-untyped-def]
    import pytest

    r = analyse(_calls_and_builds())
    callee = next(ev.callee for ev in r.calls if ev.opcode == "REDUCE")
    assert callee.qualname == "collections.OrderedDict"
    for attempt in (lambda: callee.call(()), lambda: callee.new((), {}), lambda: callee.__torchless_build__({})):
        with pytest.raises(RuntimeError, match="after its stream's analysis ended"):
            attempt()
