"""Bad and hostile .pt2 input raises TorchlessError subclasses only."""

from __future__ import annotations

import json
import random
import zipfile

import pytest

from torchless.container.zip import TorchZipWriter
from torchless.core.errors import TorchlessError, UnsupportedError
from torchless.formats.pt2 import read_pt2

pytestmark = pytest.mark.differential


def _rewrite(src, dst, edit):
    with zipfile.ZipFile(src) as z:
        recs = [(i.filename.split("/", 1)[1], z.read(i)) for i in z.infolist()]
    with TorchZipWriter(dst) as zw:
        for name, data in recs:
            data = edit(name, data)
            if data is not None:
                zw.write(name, data)


def _edit_json(member, fn):
    def edit(name, data):
        if name == member:
            obj = json.loads(data)
            fn(obj)
            return json.dumps(obj).encode()
        return data

    return edit


def _read_all(path):
    with read_pt2(path) as arc:
        for prog in arc.programs.values():
            for t in list(prog.state_dict.values()) + list(prog.constants.values()):
                if hasattr(t, "numpy"):
                    t.numpy()
            prog.graph.python_code()
        arc.sample_inputs()


def test_schema_major_version_refused(pt2_files, tmp_path):
    out = tmp_path / "v.pt2"
    _rewrite(pt2_files["mlp"], out, _edit_json("models/model.json", lambda o: o["schema_version"].update(major=9)))
    with pytest.raises(UnsupportedError, match="schema version"):
        read_pt2(out)


@pytest.mark.parametrize(
    "member,fn",
    [
        (
            "models/model.json",
            lambda o: o["graph_module"]["graph"]["nodes"][0]["inputs"][0]["arg"].update(as_tensor={"name": "ghost"}),
        ),
        ("models/model.json", lambda o: o["graph_module"]["graph"]["nodes"].append(o["graph_module"]["graph"]["nodes"][0])),
        ("models/model.json", lambda o: o["graph_module"]["graph"]["nodes"][0]["inputs"][0].update(arg={"as_bogus": 1})),
        ("models/model.json", lambda o: o["graph_module"].pop("graph")),
        ("models/model.json", lambda o: o["graph_module"]["graph"]["tensor_values"]["x"].update(dtype=99)),
        ("data/weights/model_weights_config.json", lambda o: o["config"]["l1.weight"].update(path_name="../../etc")),
        ("data/weights/model_weights_config.json", lambda o: o["config"]["l1.weight"].update(path_name="weight_99")),
        (
            "data/weights/model_weights_config.json",
            lambda o: o["config"]["l1.weight"]["tensor_meta"]["sizes"][0].update(as_int=10**9),
        ),
        (
            "data/weights/model_weights_config.json",
            lambda o: o["config"]["l1.weight"]["tensor_meta"]["strides"].append({"as_int": 1}),
        ),
        (
            "data/weights/model_weights_config.json",
            lambda o: o["config"]["l1.weight"]["tensor_meta"].update(sizes=[{"as_expr": {"expr_str": "s0", "hint": None}}]),
        ),
    ],
)
def test_corrupt_json_raises_torchless_errors(pt2_files, tmp_path, member, fn):
    out = tmp_path / "bad.pt2"
    _rewrite(pt2_files["mlp"], out, _edit_json(member, fn))
    with pytest.raises(TorchlessError):
        _read_all(out)


def test_not_pt2(pt2_files, tmp_path):
    out = tmp_path / "n.pt2"
    _rewrite(pt2_files["mlp"], out, lambda n, d: b"pt3" if n == "archive_format" else d)
    with pytest.raises(TorchlessError):
        read_pt2(out)
    _rewrite(pt2_files["mlp"], out, lambda n, d: None if n.startswith("models/") else d)
    with pytest.raises(TorchlessError):
        read_pt2(out)


def test_truncations_and_bit_flips(pt2_files, tmp_path):
    data = pt2_files["cond"].read_bytes()
    rng = random.Random(0)
    cuts = sorted(rng.sample(range(1, len(data)), 25))
    for i, cut in enumerate(cuts):
        p = tmp_path / f"t{i}.pt2"
        p.write_bytes(data[:cut])
        with pytest.raises(TorchlessError):
            _read_all(p)
    for i in range(60):
        b = bytearray(data)
        for _ in range(4):
            b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
        p = tmp_path / f"f{i}.pt2"
        p.write_bytes(bytes(b))
        try:
            _read_all(p)
        except TorchlessError:
            pass


def test_deep_json_nesting(pt2_files, tmp_path):
    out = tmp_path / "deep.pt2"
    deep = "[" * 100000 + "]" * 100000
    _rewrite(pt2_files["mlp"], out, lambda n, d: deep.encode() if n == "models/model.json" else d)
    with pytest.raises(TorchlessError):
        read_pt2(out)
