"""Printing graphs: Python code in the manner of ``GraphModule.code``, a node table, and
FX's ``str(graph)`` form.

:func:`python_code` follows FX's code generator: placeholders become the parameters of
``forward``, operator overloads print as ``torch.ops.aten.add.Tensor(...)``, Python
operators as infix expressions (``a > 4``, ``x[0]``), ``get_attr`` as ``self.<name>``,
keyword arguments as ``name = value``, and each statement ends by releasing the values
whose last use it was (``;  x = y = None``).
"""

from __future__ import annotations

import math
from typing import Any

from ..core.dtypes import DType
from ..core.values import Device
from .ir import Graph, Node, OpRef, SymValue, TensorValue

__all__ = ["format_value", "python_code", "tabular", "graph_str", "format_target"]

_MAGIC = {
    "add": "{} + {}",
    "sub": "{} - {}",
    "mul": "{} * {}",
    "floordiv": "{} // {}",
    "truediv": "{} / {}",
    "div": "{} / {}",
    "mod": "{} % {}",
    "pow": "{} ** {}",
    "lshift": "{} << {}",
    "rshift": "{} >> {}",
    "and_": "{} & {}",
    "or_": "{} | {}",
    "xor": "{} ^ {}",
    "getitem": "{}[{}]",
    "matmul": "{} @ {}",
    "eq": "{} == {}",
    "ne": "{} != {}",
    "lt": "{} < {}",
    "gt": "{} > {}",
    "le": "{} <= {}",
    "ge": "{} >= {}",
    "pos": "+{}",
    "neg": "-{}",
    "invert": "~{}",
}


def format_value(v: Any, ref: str = "") -> str:
    """``repr`` of an argument as FX prints it: nodes by name, dtypes as ``torch.float32``."""
    if isinstance(v, Node):
        return f"{ref}{v.name}"
    if isinstance(v, tuple):
        inner = ", ".join(format_value(x, ref) for x in v)
        return f"({inner},)" if len(v) == 1 else f"({inner})"
    if isinstance(v, list):
        return "[" + ", ".join(format_value(x, ref) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k!r}: {format_value(x, ref)}" for k, x in v.items()) + "}"
    if isinstance(v, Device):
        idx = v.index
        return f"device(type={v.type!r})" if idx is None else f"device(type={v.type!r}, index={idx})"
    if isinstance(v, DType):
        return v.torch_name
    if isinstance(v, float):
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        if math.isnan(v):
            return "nan"
        return repr(float(v))
    if isinstance(v, OpRef):
        return format_target(v)
    if isinstance(v, slice):
        return f"slice({format_value(v.start, ref)}, {format_value(v.stop, ref)}, {format_value(v.step, ref)})"
    return repr(v)


def format_target(t: Any) -> str:
    if isinstance(t, OpRef):
        return t.qualname
    return str(t)


def _format_args(args: tuple, kwargs: dict) -> str:
    a = ", ".join(format_value(x) for x in args)
    k = ", ".join(f"{name} = {format_value(x)}" for name, x in kwargs.items())
    return f"{a}, {k}" if a and k else (a or k)


def _stmt(n: Node) -> str | None:
    if n.op == "placeholder":
        return None if n.name == n.target else f"{n.name} = {n.target}"
    if n.op == "get_attr":
        return f"{n.name} = self.{n.target}"
    if n.op == "call_module":
        return f"{n.name} = self.{n.target}({_format_args(n.args, n.kwargs)})"
    if n.op == "call_method":
        obj = format_value(n.args[0]) if n.args else "None"
        return f"{n.name} = {obj}.{n.target}({_format_args(n.args[1:], n.kwargs)})"
    if n.op == "output":
        return f"return {format_value(n.args[0]) if n.args else 'None'}"
    t = n.target
    qual = t.qualname if isinstance(t, OpRef) else str(t)
    mod, _, short = qual.rpartition(".")
    if mod in ("_operator", "operator") and short in _MAGIC and not n.kwargs:
        fmt = _MAGIC[short]
        if fmt.count("{}") == len(n.args):
            return f"{n.name} = {fmt.format(*(format_value(a) for a in n.args))}"
    return f"{n.name} = {format_target(t)}({_format_args(n.args, n.kwargs)})"


def python_code(graph: Graph, name: str = "forward") -> str:
    """The graph as Python source, laid out like ``GraphModule.code``."""
    user_to_last: dict[int, list[Node]] = {}
    seen: set[int] = set()
    for user in reversed(graph.nodes):
        for n in (*_nodes(user.args), *_nodes(user.kwargs)):
            if id(n) not in seen:
                seen.add(id(n))
                user_to_last.setdefault(id(user), []).append(n)
    used: set[int] = set()
    for n in graph.nodes:
        for a in (*_nodes(n.args), *_nodes(n.kwargs)):
            used.add(id(a))
    params = []
    body = []
    for n in graph.nodes:
        if n.op == "placeholder":
            params.append(str(n.target))
        s = _stmt(n)
        if s is None:
            continue
        if n.op != "output":
            dels = list(user_to_last.get(id(n), []))
            if id(n) not in used:
                dels.append(n)
            if dels:
                s += ";  " + " = ".join([d.name for d in dels] + ["None"])
        body.append(s)
    if not body:
        body = ["pass"]
    head = f"def {name}(" + ", ".join(["self", *params]) + "):"
    return "\n\n\n" + head + "\n" + "".join(f"    {line}\n" for line in body) + "    "


def _nodes(a: Any) -> list[Node]:
    from .ir import iter_nodes

    return list(iter_nodes(a))


def _val(n: Node) -> str:
    v = n.meta.get("val")
    if isinstance(v, (TensorValue, SymValue)):
        return str(v)
    if isinstance(v, (list, tuple)):
        return "(" + ", ".join(str(x) for x in v) + ")"
    return "" if v is None else repr(v)


def tabular(graph: Graph) -> str:
    """A table like FX's ``print_tabular``, plus each value's type (``float32[s0, 4]``)."""
    rows = [["opcode", "name", "target", "args", "kwargs", "value"]]
    for n in graph.nodes:
        rows.append([n.op, n.name, format_target(n.target), format_value(n.args), format_value(n.kwargs), _val(n)])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    widths = [min(w, 60) for w in widths]

    def cut(s: str, w: int) -> str:
        return s if len(s) <= w else s[: w - 3] + "..."

    lines = []
    for i, r in enumerate(rows):
        lines.append("  ".join(cut(c, w).ljust(w) for c, w in zip(r, widths, strict=False)).rstrip())
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def graph_str(graph: Graph) -> str:
    """FX's ``str(graph)`` form: one ``%name : ... = op[target=...](...)`` line per node."""
    params = ", ".join(f"{n.name}" for n in graph.placeholders)
    lines = [f"graph({params}):"]
    users: dict[int, set[int]] = {}
    for n in graph.nodes:
        for a in _nodes((n.args, n.kwargs)):
            users.setdefault(id(a), set()).add(id(n))
    for n in graph.nodes:
        if n.op == "output":
            lines.append(f"    return {format_value(n.args[0] if n.args else None)}")
        else:
            a = format_value(n.args, ref="%")
            k = format_value(n.kwargs, ref="%")
            lines.append(
                f"    %{n.name} : [num_users={len(users.get(id(n), ()))}] = {n.op}[target={n.target}](args = {a}, kwargs = {k})"
            )
    return "\n".join(lines)
