"""ExecuTorch programs (.pte) against what executorch's own deserializer read from the same
bytes (samples/executorch/*.json, written by samples/gen_executorch.py with executorch
1.5.1); hostile programs; CLI; scanner."""

from __future__ import annotations

import hashlib
import json
import random
import struct
from pathlib import Path

import numpy as np
import pytest

import torchless
from torchless.core.errors import FormatError, TorchlessError, TruncatedError, UnsupportedError
from torchless.formats.executorch.read import ExecuTorchArtifact, TensorValue, read_program

SAMPLES = Path(__file__).resolve().parents[3] / "samples" / "executorch"
NAMES = ("mlp", "dynamic", "xnnpack")


def _load(name: str) -> tuple[bytes, dict]:
    return (SAMPLES / f"{name}.pte").read_bytes(), json.loads((SAMPLES / f"{name}.json").read_text())


_KIND = {  # executorch's EValue class names -> what torchless decodes them to
    "Null": type(None),
    "Int": int,
    "Bool": bool,
    "Double": float,
    "String": str,
    "IntList": list,
    "DoubleList": list,
    "BoolList": list,
    "TensorList": tuple,
    "OptionalTensorList": tuple,
    "Tensor": TensorValue,
}


@pytest.mark.parametrize("name", NAMES)
def test_program_matches_executorch_deserializer(name):
    data, exp = _load(name)
    prog = read_program(data, f"{name}.pte")
    assert prog.identifier == exp["identifier"] and prog.version == exp["version"]
    assert len(prog.plans) == len(exp["plans"])
    for plan, ep in zip(prog.plans, exp["plans"], strict=True):
        assert plan.name == ep["name"]
        assert plan.inputs == ep["inputs"] and plan.outputs == ep["outputs"]
        assert [list(o) for o in plan.operators] == ep["operators"]
        assert plan.non_const_buffer_sizes == ep["non_const_buffer_sizes"]
        assert [type(v) for v in plan.values] == [_KIND[k] for k in ep["values"]]
        got = []
        for ins in plan.instructions:
            row = [ins.kind, ins.a] + ([] if ins.b is None else [ins.b])
            got.append(row)
        assert got == ep["instructions"]
        assert [(d.id, len(d.blob), hashlib.sha256(d.blob).hexdigest()) for d in plan.delegates] == [
            (d["id"], d["size"], d["sha256"]) for d in ep["delegates"]
        ]
        assert [{k: v.hex() for k, v in d.compile_specs.items()} for d in plan.delegates] == [
            d["compile_specs"] for d in ep["delegates"]
        ]
        constants = {vi: tv for vi, tv in plan.tensors() if tv.kind == "constant"}
        assert sorted(constants) == [c["value"] for c in ep["constants"]]
        for c in ep["constants"]:
            tv = constants[c["value"]]
            assert tv.data_buffer_idx == c["data_buffer_idx"] and list(tv.tensor.shape) == c["sizes"]
            assert tv.name == c["name"]
            raw = bytes.fromhex(c["hex"])  # the constant buffer executorch restored (with its padding)
            mine = tv.tensor.numpy().tobytes()
            assert raw[: len(mine)] == mine and len(mine) == tv.tensor.numel() * tv.tensor.dtype.itemsize


@pytest.mark.parametrize("name", NAMES)
def test_open_info_ls_convert(name, tmp_path, capsys):
    from torchless.cli.main import main

    path = SAMPLES / f"{name}.pte"
    with torchless.open(path) as art:
        assert isinstance(art, ExecuTorchArtifact)
        info = art.info()
        listed = {k: t.numpy() for k, t in art.tensors()}  # arrays taken before close stay readable
        assert not art.verify()
    assert info["format"] == "executorch" and info["identifier"] == "ET12"
    _, exp = _load(name)
    assert len(listed) == sum(len(p["constants"]) for p in exp["plans"])
    assert main(["ls", str(path)]) == 0
    assert capsys.readouterr().out.count("\n") >= len(listed)
    dst = tmp_path / "c.npz"
    assert main(["convert", str(path), str(dst)]) == 0
    with np.load(dst) as z:
        for k, t in listed.items():
            assert np.array_equal(z[k], t)


def test_delegate_blob_and_named_data():
    data, exp = _load("xnnpack")
    prog = read_program(data, "xnnpack.pte")
    (d,) = prog.plans[0].delegates
    assert d.id == "XnnpackBackend" and len(d.blob) > 0
    start, size = prog.segments[d.index]
    assert bytes(d.blob) == data[start : start + size]
    assert prog.named_data and all(0 <= s < len(prog.segments) for _k, s in prog.named_data)


# -- hostile programs ----------------------------------------------------------------------


@pytest.mark.parametrize("name", ["mlp", "xnnpack"])
def test_truncations(name):
    data, _ = _load(name)
    for n in list(range(0, 48)) + list(range(48, len(data), max(1, len(data) // 200))):
        with pytest.raises(TorchlessError):
            prog = read_program(data[:n], "x.pte")
            for p in prog.plans:  # a cut in trailing padding may still parse: touch every byte read
                for _vi, tv in p.tensors():
                    if tv.tensor.storage is not None:
                        tv.tensor.numpy()
            raise TruncatedError("parsed")  # only reached when the cut left everything intact


def test_bit_flips_only_torchless_errors():
    data, _ = _load("mlp")
    rng = random.Random(14)
    for _ in range(400):
        b = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
        try:
            prog = read_program(bytes(b), "x.pte")
            for p in prog.plans:
                for _vi, tv in p.tensors():
                    if tv.tensor.storage is not None:
                        tv.tensor.numpy()
        except TorchlessError:
            pass


def test_offsets_out_of_range_name_the_offset():
    data = bytearray(_load("mlp")[0])
    bad = bytearray(data)
    struct.pack_into("<Q", bad, 24, len(data) + 4096)  # segment base offset past the end
    with pytest.raises(FormatError) as e:
        read_program(bytes(bad), "x.pte")
    assert e.value.offset == 24
    bad = bytearray(data)
    struct.pack_into("<I", bad, 0, len(data) * 2)  # root table offset
    with pytest.raises(FormatError) as e:
        read_program(bytes(bad), "x.pte")
    assert e.value.offset is not None and "x.pte" in str(e.value)
    bad = bytearray(data)
    bad[6:8] = b"99"
    with pytest.raises(UnsupportedError, match="schema version"):
        read_program(bytes(bad), "x.pte")


def test_scan_reports_no_pickle_and_names_delegates(tmp_path):
    rep = torchless.scan(SAMPLES / "xnnpack.pte", jobs=1)
    f = rep.files[0]
    assert f.kind == "executorch" and f.verdict == "clean" and f.streams == 0
    assert any("XnnpackBackend" in x.message for x in f.findings)
    broken = tmp_path / "broken.pte"
    data = bytearray(_load("mlp")[0])
    struct.pack_into("<I", data, 0, len(data) * 2)
    broken.write_bytes(bytes(data))
    assert torchless.scan(broken, jobs=1).files[0].verdict == "unanalysable"
