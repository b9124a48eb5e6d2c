"""Graph IR: namespace, building, editing, lint, printing, symbolic expressions."""

from __future__ import annotations

import pytest

from torchless.core.dtypes import by_name
from torchless.core.errors import FormatError
from torchless.graph.ir import Graph, Namespace, OpRef, SymValue, TensorValue
from torchless.graph.symbolic import free_symbols, pretty


def _tiny():
    g = Graph()
    x = g.placeholder("x")
    x.meta["val"] = TensorValue(by_name("float32"), (SymValue("int", "Symbol('s0', positive=True, integer=True)"), 4), (4, 1))
    r = g.call_function(OpRef("aten.relu.default"), (x,))
    a = g.call_function(OpRef("torch.ops.aten.add.Tensor"), (r, x), {"alpha": 2})
    gt = g.call_function(OpRef("_operator.gt"), (a, 4))
    g.output((a, gt))
    return g


def test_namespace_rules():
    ns = Namespace()
    assert ns.create_name("add") == "add"
    assert ns.create_name("add") == "add_1"
    assert ns.create_name("add_1") == "add_2"
    assert ns.create_name("def") == "def_1"
    assert ns.create_name("1x.y") == "_1x_y"
    assert ns.create_name("list") == "list_1"
    assert not ns.reserve("add") and ns.reserve("fresh")


def test_opref():
    r = OpRef("aten.add.Tensor")
    assert r.qualname == "torch.ops.aten.add.Tensor" and str(r) == "aten.add.Tensor"
    assert (r.namespace, r.op_name, r.overload) == ("aten", "add", "Tensor")
    h = OpRef("torch.ops.higher_order.cond")
    assert h.is_hop and h.op_name == "cond" and h.overload is None
    assert OpRef("_operator.gt").key == "_operator.gt"


def test_code_and_table():
    g = _tiny()
    g.lint()
    code = g.python_code()
    assert "def forward(self, x):" in code
    assert "relu = torch.ops.aten.relu.default(x)" in code
    assert "add = torch.ops.aten.add.Tensor(relu, x, alpha = 2);  relu = x = None" in code
    assert "gt = add > 4" in code
    assert code.rstrip().endswith("return (add, gt)")
    table = g.tabular()
    assert "float32[s0, 4]" in table and "call_function" in table
    assert str(g).startswith("graph(x):")


def test_users_and_replace():
    g = _tiny()
    x = g.node("x")
    assert [u.name for u in x.users] == ["relu", "add"]
    n = g.call_function(OpRef("aten.neg.default"), (x,), index=1)
    g.replace_all_uses_with(x, n)
    n.args = (x,)
    assert [u.name for u in x.users] == ["neg"]
    g.lint()
    with pytest.raises(FormatError):
        g.erase_node(n)


@pytest.mark.parametrize("breakit", ["dup", "order", "output", "foreign", "attr"])
def test_lint_catches(breakit):
    g = _tiny()
    if breakit == "dup":
        g.nodes[2].name = "relu"
    elif breakit == "order":
        g.nodes[1], g.nodes[2] = g.nodes[2], g.nodes[1]
    elif breakit == "output":
        g.nodes.append(g.nodes[-1])
    elif breakit == "foreign":
        other = _tiny()
        g.nodes[1].args = (other.nodes[0],)
    else:
        g.get_attr("missing", index=1)
    with pytest.raises(FormatError):
        g.lint()


def test_exact_names():
    g = Graph()
    g.create_node("placeholder", "x", name="x", exact_name=True)
    with pytest.raises(FormatError):
        g.create_node("placeholder", "x", name="x", exact_name=True)


@pytest.mark.parametrize(
    "srepr,text",
    [
        ("Symbol('s17', positive=True, integer=True)", "s17"),
        ("Add(Symbol('s0', integer=True), Integer(1))", "s0 + 1"),
        ("Mul(Integer(2), Symbol('s0'))", "2*s0"),
        ("StrictGreaterThan(Symbol('s17', positive=True, integer=True), Integer(4))", "s17 > 4"),
        ("Add(Symbol('a'), Mul(Integer(-1), Symbol('b')))", "a - b"),
        ("FloorDiv(Symbol('s0'), Integer(2))", "s0 // 2"),
        ("not srepr (", "not srepr ("),
    ],
)
def test_pretty(srepr, text):
    assert pretty(srepr) == text


def test_free_symbols():
    assert free_symbols("Add(Symbol('s0'), Mul(Symbol('s1'), Symbol('s0')))") == ["s0", "s1"]
