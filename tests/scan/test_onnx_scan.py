"""The scanner's ONNX view: external-data locations that leave the model's folder.

Oracle: the real loaders' own path validation. Every model the scanner flags is one that
``onnx.load`` (and onnxruntime, when installed) refuses because of that path, and every
model they load is CLEAN; a model that does not parse is never CLEAN.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from torchless.scan import scan

onnx = pytest.importorskip("onnx", reason="the oracle: onnx writes the models and validates their paths")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402


def _model(tmp_path, name: str, location: str | None, *, in_subgraph: bool = False) -> str:
    """An MLP-like model whose weight lives in ``ext.data`` (saved by onnx), its location
    then rewritten to ``location``; with ``in_subgraph`` the external tensor is an
    attribute of a Constant node inside an If branch."""
    w = numpy_helper.from_array(np.arange(12, dtype=np.float32).reshape(3, 4), "w")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    if not in_subgraph:
        g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g", [x], [y], [w])
    else:
        branch = helper.make_graph(
            [helper.make_node("Constant", [], ["c"], value=w)],
            "b",
            [],
            [helper.make_tensor_value_info("c", TensorProto.FLOAT, [3, 4])],
        )
        cond = numpy_helper.from_array(np.array(True), "cond")
        g = helper.make_graph(
            [
                helper.make_node("If", ["cond"], ["wc"], then_branch=branch, else_branch=branch),
                helper.make_node("MatMul", ["x", "wc"], ["y"]),
            ],
            "g",
            [x],
            [y],
            [cond],
        )
    m = helper.make_model(g)
    path = tmp_path / f"{name}.onnx"
    onnx.save_model(m, path, save_as_external_data=True, location="ext.data", size_threshold=0)
    if location is not None:
        m = onnx.load(path, load_external_data=False)
        tensors = list(m.graph.initializer)
        for node in m.graph.node:
            for a in node.attribute:
                for sub in [a.g] if a.g.node else []:
                    for n in sub.node:
                        tensors += [b.t for b in n.attribute if b.t.external_data]
        for t in tensors:
            for e in t.external_data:
                if e.key == "location":
                    e.value = location
        onnx.save_model(m, path)
    return str(path)


def _loaders_refuse(path: str) -> bool:
    try:
        onnx.load(path)
    except Exception:
        refused = True
    else:
        refused = False
    try:
        import onnxruntime as ort
    except ImportError:
        return refused
    try:
        ort.InferenceSession(path)
    except Exception:
        return refused
    return False


def _verdict(path: str) -> tuple[str, list[str]]:
    rep = scan(path, jobs=1).files[0]
    return rep.verdict, [f.rule for f in rep.findings if f.severity != "info"]


@pytest.mark.parametrize("in_subgraph", [False, True], ids=["initializer", "subgraph-attribute"])
def test_onnx_external_data_escapes_are_flagged_exactly_where_the_loaders_refuse(tmp_path, in_subgraph):
    os.symlink("/etc/hostname", tmp_path / "link.data")
    cases = {
        "benign": None,
        "dotdot": "../../etc/hostname",
        "absolute": "/etc/hostname",
        "symlink": "link.data",
    }
    for name, location in cases.items():
        path = _model(tmp_path, name, location, in_subgraph=in_subgraph)
        verdict, rules = _verdict(path)
        refused = _loaders_refuse(path)
        if name == "benign":
            assert not refused and verdict == "clean" and rules == [], (name, verdict, rules)
        else:
            assert refused, f"{name}: the loaders accepted it; the case does not test what it claims"
            assert verdict == "suspicious" and rules == ["link-escape"], (name, verdict, rules)


def test_an_onnx_file_that_does_not_parse_is_never_clean(tmp_path):
    path = _model(tmp_path, "m", None)
    data = open(path, "rb").read()
    cut = tmp_path / "cut.onnx"
    cut.write_bytes(data[: len(data) // 2])
    from google.protobuf.message import DecodeError

    with pytest.raises(DecodeError):  # the real parser refuses it too
        onnx.load(str(cut))
    verdict, rules = _verdict(str(cut))
    assert verdict != "clean" and "unanalysable" in rules


# -- the loader's parser, not the file name, decides what is a model ----------------------
def _field(num: int, wire: int, payload: bytes = b"") -> bytes:
    """One protobuf field, encoded as protobuf's parser reads it."""

    def varint(v: int) -> bytes:
        out = bytearray()
        while True:
            b = v & 0x7F
            v >>= 7
            out.append(b | (0x80 if v else 0))
            if not v:
                return bytes(out)

    tag = varint(num << 3 | wire)
    if wire == 0:
        return tag + varint(int.from_bytes(payload[:4].ljust(4, b"\0"), "little"))
    if wire == 1:
        return tag + payload[:8].ljust(8, b"\0")
    if wire == 5:
        return tag + payload[:4].ljust(4, b"\0")
    if wire == 3:  # a group: the payload is its fields, then the end tag
        return tag + payload + varint(num << 3 | 4)
    return tag + varint(len(payload)) + payload


def _junk(rng) -> bytes:
    """A field protobuf parses and ONNX ignores: an unknown number, or a known ModelProto
    number with the wrong wire type (protobuf keeps it as an unknown field), or a group."""
    num = rng.choice([1, 2, 5, 7, 8, 14, 25, 99, 1000, 536870911])
    wire = rng.choice([0, 1, 2, 3, 5])
    if num in (2, 7, 8, 14, 25) and wire == 2:
        wire = 5  # a right-typed string or message field would change the model itself
    if num in (1, 5) and wire == 0:
        wire = 1
    inner = (
        _field(rng.randrange(1, 50), 0, bytes([rng.randrange(256)])) if wire == 3 else bytes(rng.randrange(256) for _ in range(6))
    )
    return _field(num, wire, inner)


def _oracle_escapes(data: bytes, root: str) -> list[str] | None:
    """The external locations that leave ``root`` as onnx's own parser reads the model
    (None when protobuf refuses the bytes)."""
    from google.protobuf.message import DecodeError

    m = onnx.ModelProto()
    try:
        m.ParseFromString(data)
    except DecodeError:
        return None
    from onnx.external_data_helper import _get_all_tensors

    out = []
    for t in _get_all_tensors(m):
        if t.data_location == TensorProto.EXTERNAL:
            loc = {e.key: e.value for e in t.external_data}.get("location", "")
            real = os.path.realpath(os.path.join(root, loc))
            if (
                os.path.isabs(loc)
                or ".." in loc.split("/")
                or os.path.commonpath([real, os.path.realpath(root)]) != os.path.realpath(root)
            ):
                out.append(loc)
    return out


@pytest.mark.parametrize("suffix", [".onnx", ".bin", ".pt", ""])
def test_a_model_disguised_by_name_or_ignored_fields_is_still_scanned(tmp_path, suffix):
    """Fuzz against protobuf's parser: ignored fields (unknown numbers, known numbers of
    the wrong wire type, groups) before, between and after the model's fields, and any
    file name. Whenever onnx's parser reads an external location that leaves the folder,
    the scanner flags it; it calls nothing clean that it could not walk."""
    import random

    escaping = open(_model(tmp_path, "evil", "../../etc/hostname"), "rb").read()
    from torchless.formats.onnx.spec import fields

    parts = [escaping[s - _hdr : e] for s, e, _hdr in _top_spans(escaping)]
    assert b"".join(parts) == escaping
    rng = random.Random(f"onnx-disguise{suffix}")
    flagged = 0
    for i in range(40):
        mixed = b""
        for p in parts:
            mixed += b"".join(_junk(rng) for _ in range(rng.randrange(3))) + p
        mixed += b"".join(_junk(rng) for _ in range(rng.randrange(2)))
        path = tmp_path / f"case{i}{suffix}"
        path.write_bytes(mixed)
        want = _oracle_escapes(mixed, str(tmp_path))
        verdict, rules = _verdict(str(path))
        if want is None:  # protobuf refuses it: no loader reads anything from it
            continue
        assert want, "the case lost its escaping location: the generator is wrong"
        assert verdict != "clean" and "link-escape" in rules, (i, mixed[:40], verdict, rules)
        flagged += 1
        list(fields(mixed, 0, len(mixed)))  # the walk tiles what protobuf parsed
    assert flagged >= 30  # most cases parse: the test exercises what it claims


def _top_spans(data: bytes) -> list[tuple[int, int, int]]:
    """``(payload start, end, header length)`` of each top-level field (to re-split a model)."""
    from torchless.formats.onnx.spec import fields

    out = []
    prev = 0
    for _n, _w, s, e in fields(data, 0, len(data)):
        out.append((s, e, s - prev))
        prev = e
    return out


def test_a_renamed_benign_model_is_clean_and_random_bytes_are_not_models(tmp_path):
    import random

    from torchless.formats.onnx.spec import parses_as_model

    benign = open(_model(tmp_path, "ok", None), "rb").read()
    (tmp_path / "ok.bin").write_bytes(benign)
    assert _verdict(str(tmp_path / "ok.bin")) == ("clean", [])
    rng = random.Random(5)
    for _ in range(200):  # random bytes are not taken for a model
        assert not parses_as_model(bytes(rng.randrange(256) for _ in range(rng.randrange(1, 300))))
    # a group's end tag of the wrong field, a zero field number: protobuf refuses both, so does the walk
    assert not parses_as_model(_field(7, 2, b"") + b"\x1b\x08\x01\x24")
    assert not parses_as_model(_field(7, 2, b"") + b"\x00\x00")


def _oracle_locations(data: bytes) -> set[str] | None:
    """The external locations onnx reads from the model, as its own parser and
    ``external_data_helper`` see them (None when protobuf refuses the bytes)."""
    from google.protobuf.message import DecodeError
    from onnx.external_data_helper import _get_all_tensors

    m = onnx.ModelProto()
    try:
        m.ParseFromString(data)
        locs = (
            {e.key: e.value for e in t.external_data}.get("location", "")
            for t in _get_all_tensors(m)
            if t.data_location == TensorProto.EXTERNAL
        )  # proto2 strings that are not UTF-8 come back as bytes
        return {v.decode("utf-8", "replace") if isinstance(v, bytes) else v for v in locs}
    except (DecodeError, UnicodeDecodeError):
        return None


@pytest.mark.parametrize("in_subgraph", [False, True], ids=["initializer", "subgraph-attribute"])
def test_the_walk_sees_every_location_protobuf_parses_in_mutated_models(tmp_path, in_subgraph):
    """Bit flips, truncations and spliced duplicates of an escaping model: whenever
    protobuf's parser (the loader's) accepts the bytes, the walk tiles them and finds every
    external location onnx's helper would read (it may find more: sparse tensors and
    subgraphs of any attribute type, which onnxruntime reads)."""
    import random

    from torchless.formats.onnx.spec import external_locations

    data = open(_model(tmp_path, "m", "../../etc/hostname", in_subgraph=in_subgraph), "rb").read()
    rng = random.Random(f"walk{in_subgraph}")
    parsed = 0
    for _ in range(400):
        b = bytearray(data)
        r = rng.random()
        if r < 0.2:
            b = b[: rng.randrange(len(b))]
        elif r < 0.4:  # a slice of the model appended: repeated and merged fields
            i = rng.randrange(len(b))
            b += b[i : i + rng.randrange(1, 200)]
        for _ in range(rng.randint(0, 3)):
            if b:
                b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
        want = _oracle_locations(bytes(b))
        if want is None:
            continue
        parsed += 1
        got = {loc.location for loc in external_locations(bytes(b))}  # raises if the walk refuses
        assert want <= got, (want, got)
    assert parsed >= 100


def test_a_singular_tensor_given_in_two_pieces_is_merged_as_protobuf_merges_it(tmp_path):
    """``data_location`` in one occurrence of ``AttributeProto.t`` and the ``location`` in
    another: protobuf merges them into one external tensor, and so does the walk."""
    from torchless.formats.onnx.spec import external_locations

    path = _model(tmp_path, "m", "../../etc/hostname")
    m = onnx.load(path, load_external_data=False)
    t = m.graph.initializer[0]  # w, external, its location rewritten to escape
    assert t.data_location == TensorProto.EXTERNAL
    first = onnx.TensorProto(dims=t.dims, data_type=t.data_type, name=t.name, data_location=TensorProto.EXTERNAL)
    second = onnx.TensorProto()
    second.external_data.extend(t.external_data)
    attr_bytes = (
        _field(1, 2, b"value")
        + _field(20, 0, bytes([onnx.AttributeProto.TENSOR]))
        + _field(5, 2, first.SerializeToString())
        + _field(5, 2, second.SerializeToString())
    )
    a2 = onnx.AttributeProto()
    a2.ParseFromString(attr_bytes)
    assert a2.t.data_location == TensorProto.EXTERNAL and a2.t.external_data[0].value == "../../etc/hostname"
    del m.graph.initializer[:]
    node = helper.make_node("Constant", [], ["w"]).SerializeToString() + _field(5, 2, attr_bytes)
    # a second graph piece: protobuf merges it into the first, appending the node
    data = m.SerializeToString() + _field(7, 2, _field(1, 2, node))
    assert _oracle_locations(data) == {"../../etc/hostname"}
    assert "../../etc/hostname" in {loc.location for loc in external_locations(data)}
    p = tmp_path / "merged.onnx"
    p.write_bytes(data)
    verdict, rules = _verdict(str(p))
    assert verdict != "clean" and "link-escape" in rules


def test_too_many_ignored_fields_to_walk_is_unanalysable_not_clean(tmp_path):
    """Past the walk's limit of top-level fields the bytes may still be a model that
    protobuf parses (here: it is, with an escaping location): never clean."""
    from torchless.formats.onnx.spec import MAX_TOP_FIELDS

    escaping = open(_model(tmp_path, "evil", "../../etc/hostname"), "rb").read()
    data = _field(99, 0, b"\x01") * (MAX_TOP_FIELDS + 1) + escaping
    assert _oracle_locations(data) == {"../../etc/hostname"}  # the loader's parser reads the model
    p = tmp_path / "padded.bin"
    p.write_bytes(data)
    verdict, rules = _verdict(str(p))
    assert verdict != "clean" and "unanalysable" in rules
