"""ExportedPrograms written by torch 2.5, 2.6 and 2.7 (the pre-2.8 archive layout, schemas
7.3 and 8.x), read with the same graph IR. The expectations are what each torch's own
torch.export.load read from the same files (samples/make_old_pt2.py, run once per version
in a throwaway environment; samples/old_pt2/<version>/expected.json)."""

from __future__ import annotations

import hashlib
import json
import re
import zipfile
from pathlib import Path

import numpy as np
import pytest

import torchless
from torchless.core.errors import FormatError, TorchlessError
from torchless.formats.pt2.read import read_pt2

ROOT = Path(__file__).resolve().parents[3] / "samples" / "old_pt2"
CASES = [
    (v.name, name)
    for v in sorted(ROOT.iterdir())
    if (v / "expected.json").exists()
    for name, e in sorted(json.loads((v / "expected.json").read_text()).items())
    if "error" not in e
]


def _expected(version: str, name: str) -> dict:
    return json.loads((ROOT / version / "expected.json").read_text())[name]


def _tensor_ok(t, rec: dict) -> None:
    assert t.dtype.name == rec["dtype"] and list(t.shape) == rec["shape"]
    raw = np.ascontiguousarray(t.numpy()).tobytes()
    assert hashlib.sha256(raw).hexdigest() == rec["sha256"]


def test_every_version_is_present():
    assert {v for v, _ in CASES} >= {"2.5", "2.6", "2.7"}


@pytest.mark.parametrize("version,name", CASES)
def test_graph_code_and_nodes(version, name):
    e = _expected(version, name)
    with read_pt2(ROOT / version / f"{name}.pt2") as arc:
        assert arc.legacy
        prog = arc.program
        prog.graph.lint()
        graphs = {"": prog.graph, **prog.graph.subgraphs}
        assert sorted(graphs) == sorted(e["graphs"])
        for gname, ge in e["graphs"].items():
            g = graphs[gname]
            code = re.sub(r"\s+#.*", "", g.python_code()).strip()
            assert code == ge["code"], (version, name, gname)
            nodes = [[n.op, "" if n.op == "placeholder" else str(n.target), n.name] for n in g.nodes]
            assert [n[0] for n in nodes] == [n[0] for n in ge["nodes"]]
            assert [n[2] for n in nodes] == [n[2] for n in ge["nodes"]]


@pytest.mark.parametrize("version,name", CASES)
def test_signature_tensors_ranges(version, name):
    e = _expected(version, name)
    with torchless.open(ROOT / version / f"{name}.pt2") as art:
        assert art.format == "pt2" and art.info()["layout"].startswith("pre-2.8")
        prog = art.archive.program
        assert [[s.kind, s.arg, s.target] for s in prog.signature.input_specs] == e["inputs"]
        assert [[s.kind, s.arg, s.target] for s in prog.signature.output_specs] == e["outputs"]
        assert sorted(prog.state_dict) == sorted(e["state_dict"])
        for k, rec in e["state_dict"].items():
            _tensor_ok(prog.state_dict[k], rec)
        assert sorted(prog.constants) == sorted(e["constants"])
        for k, rec in e["constants"].items():
            _tensor_ok(prog.constants[k], rec)
        assert sorted(dict(art.tensors())) == sorted(e["state_dict"])
        assert len(prog.range_constraints) == len(e["range_constraints"])
        args, _kwargs = art.archive.sample_inputs()
        for a, rec in zip(args, e["example_input"], strict=True):
            _tensor_ok(a, rec)


def test_hostile_legacy_archives(tmp_path):
    version, name = CASES[0]
    src = ROOT / version / f"{name}.pt2"
    with zipfile.ZipFile(src) as z:
        members = {n: z.read(n) for n in z.namelist()}
    bad = tmp_path / "bad.pt2"
    for change in (
        {"serialized_exported_program.json": b"{not json"},
        {"serialized_exported_program.json": b'{"schema_version": {"major": 3, "minor": 0}}'},
        {"serialized_state_dict.pt": b"\x80\x02K\x01."},  # a pickle of an int, not a dict
        {"serialized_state_dict.pt": members["serialized_state_dict.pt"][:100]},
    ):
        with zipfile.ZipFile(bad, "w") as z:
            for n, d in {**members, **change}.items():
                z.writestr(n, d)
        with pytest.raises(TorchlessError), read_pt2(bad) as arc:
            for t in arc.program.state_dict.values():
                t.numpy()
    data = src.read_bytes()
    for n in range(0, len(data), max(1, len(data) // 60)):
        (tmp_path / "cut.pt2").write_bytes(data[:n])
        with pytest.raises((TorchlessError, FormatError)), read_pt2(tmp_path / "cut.pt2") as arc:
            for t in arc.program.state_dict.values():
                t.numpy()
