"""The ATen schema parser and registry."""

from __future__ import annotations

from importlib import resources

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from torchless.core.errors import FormatError, NotFoundError
from torchless.graph.schema import Arg, BaseType, ListType, OpSchema, OptionalType, Return, parse_schema, parse_type, registry


def _lines(name):
    text = resources.files("torchless.graph").joinpath("data", name).read_text()
    return [ln.split("\t") for ln in text.splitlines() if ln and not ln.startswith("#")]


def test_every_core_aten_line_parses_and_prints_back():
    rows = _lines("core_aten_ops.txt")
    assert len(rows) == 193
    for key, text in rows:
        s = parse_schema(text)
        assert str(s) == text
        assert "aten::" + s.key[len("aten.") :] == key


def test_every_non_core_line_parses_and_prints_back():
    for _key, text in _lines("aten_ops.txt"):
        assert str(parse_schema(text)) == text


def test_registry_core_and_lookup():
    reg = registry()
    assert len(reg.core_keys) == 193
    assert reg.is_core("aten.addmm.default") and reg.is_core("torch.ops.aten.add.Tensor")
    assert not reg.is_core("aten.linear.default") and "aten.linear.default" in reg
    s = reg.get("aten.linear.default")
    assert [a.name for a in s.arguments] == ["input", "weight", "bias"]
    assert s.arguments[2].default == "None" and isinstance(s.arguments[2].type, OptionalType)
    with pytest.raises(NotFoundError):
        reg.get("aten.nope.default")


def test_schema_properties():
    reg = registry()
    assert reg.get("aten.add_.Tensor").is_inplace
    assert reg.get("aten.atan2.out").is_out
    assert not reg.get("aten.add.Tensor").is_mutating
    gelu = reg.get("aten.gelu.default")
    assert gelu.bind(("x",), {"approximate": "tanh"}) == {"self": "x", "approximate": "tanh"}
    with pytest.raises(FormatError):
        gelu.bind(("x", "y", "z"), {})
    with pytest.raises(FormatError):
        gelu.bind((), {})


def test_types():
    t = parse_type("Tensor(a!)[]")
    assert t == ListType(BaseType("Tensor", "a!")) and t.is_write
    assert parse_type("int[1]?") == OptionalType(ListType(BaseType("int"), 1))
    assert str(parse_type("Tensor?[]")) == "Tensor?[]"


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "aten::",
        "aten::f(",
        "aten::f(Tensor) -> Tensor",
        "aten::f(Tensor x) ->",
        "aten::f(Tensor x, Tensor x) -> Tensor",
        "aten::f(Tensor x=) -> Tensor",
        "aten::f(Tensor(a x) -> Tensor",
        "aten::f(int[x] a) -> Tensor",
    ],
)
def test_malformed_schemas_raise_format_error(bad):
    with pytest.raises(FormatError):
        parse_schema(bad)


_ident = st.builds(
    lambda a, b: a + b,
    st.sampled_from(["self", "other", "x", "dim", "_w", "a1", "keepdim"]),
    st.sampled_from(["", "_1", "2", "_out_"]),
)
_base = st.builds(
    BaseType,
    st.sampled_from(["Tensor", "int", "SymInt", "float", "bool", "str", "Scalar", "ScalarType", "Device", "Layout"]),
    st.sampled_from([None, "a", "a!", "b!", "a -> *"]),
)


_TYPES = st.recursive(
    _base,
    lambda inner: st.one_of(st.builds(ListType, inner, st.sampled_from([None, 1, 2, 3])), st.builds(OptionalType, inner)),
    max_leaves=2,
)


def _types():
    return _TYPES


_default = st.sampled_from(
    [None, "None", "0", "-1", "1.", "1e-05", "[]", "[0, 1]", "True", "False", '"mean"', "'tanh'", "contiguous_format"]
)


@st.composite
def _schemas(draw):
    names = draw(st.lists(_ident, max_size=6, unique=True))
    star = draw(st.integers(0, len(names)))
    args = tuple(Arg(n, draw(_types()), draw(_default), i >= star) for i, n in enumerate(names))
    rets = tuple(
        Return(draw(_types()), draw(st.sampled_from([None, "values", "indices"]))) for _ in range(draw(st.integers(0, 3)))
    )
    tup = len(rets) != 1 or draw(st.booleans())
    return OpSchema(
        draw(st.sampled_from(["aten", "prims", "my_ns"])),
        draw(_ident),
        draw(st.sampled_from(["", "Tensor", "int", "default_1"])),
        args,
        rets,
        tup,
    )


@settings(max_examples=150, deadline=None)
@given(_schemas())
def test_parse_print_round_trip(s):
    text = str(s)
    assert parse_schema(text) == s
    assert str(parse_schema(text)) == text
