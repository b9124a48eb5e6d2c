"""torchless's graph IR: a Graph of Nodes with FX's six opcodes, shared by every graph format.

Modelled on ``torch.fx`` (``torch/fx/node.py``, ``graph.py``) without its linked list,
code objects or torch types: a :class:`Graph` holds a plain ``list`` of :class:`Node`; a
node has an ``op`` (one of :data:`OPCODES`), a ``name`` unique in its graph (given by the
graph's :class:`Namespace`), a ``target``, ``args``/``kwargs`` that may contain other nodes,
and a ``meta`` dict. Targets are whatever the format uses: :class:`OpRef` for operators
(``aten.addmm.default``, ``higher_order.cond``, ``_operator.gt``), a plain string for
placeholders, attributes and anything else.

Opcodes (as in FX):

* ``placeholder``: a graph input; ``target`` is the parameter name.
* ``get_attr``: an attribute of the owning module; ``target`` is its dotted name. For
  higher-order ops the attribute is a subgraph, found in :attr:`Graph.subgraphs`.
* ``call_function``: ``target(*args, **kwargs)``.
* ``call_module`` / ``call_method``: a submodule's forward / a method of ``args[0]``.
* ``output``: ``args[0]`` is the returned value.

Value metadata lives in ``node.meta["val"]``: a :class:`TensorValue` (dtype, symbolic
shape, strides...), a :class:`SymValue` (SymInt/SymBool/SymFloat), or a list of them.

Example:
    >>> g = Graph()
    >>> x = g.placeholder("x")
    >>> y = g.call_function(OpRef("aten.relu.default"), (x,))
    >>> _ = g.output((y,))
    >>> print(g.python_code())  # doctest: +SKIP
"""

from __future__ import annotations

import builtins
import keyword
import math
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from ..core.dtypes import DType
from ..core.errors import FormatError
from ..core.values import Device

__all__ = [
    "OPCODES",
    "Node",
    "Graph",
    "Namespace",
    "OpRef",
    "TensorValue",
    "SymValue",
    "map_arg",
    "iter_nodes",
    "format_target",
    "format_value",
    "graph_str",
    "python_code",
    "tabular",
]

OPCODES = ("placeholder", "get_attr", "call_function", "call_module", "call_method", "output")


@dataclass(frozen=True, slots=True)
class OpRef:
    """An operator named by its qualified name.

    ``qualname`` is how serialized graphs name it: ``torch.ops.aten.add.Tensor``,
    ``torch.ops.higher_order.cond``, ``_operator.gt``, ``math.trunc``, ``torch.sym_int``.
    ``str()`` gives FX's short form (``aten.add.Tensor``) for ``torch.ops`` targets.
    """

    qualname: str

    def __post_init__(self) -> None:
        if (
            not self.qualname.startswith(("torch.ops.", "_operator.", "operator.", "math.", "torch.", "builtins."))
            and "." in self.qualname
        ):
            object.__setattr__(self, "qualname", "torch.ops." + self.qualname)

    @property
    def is_torch_op(self) -> bool:
        return self.qualname.startswith("torch.ops.")

    @property
    def is_hop(self) -> bool:
        """A higher-order operator (``torch.ops.higher_order.<name>``)."""
        return self.qualname.startswith("torch.ops.higher_order.")

    @property
    def key(self) -> str:
        """``aten.add.Tensor`` / ``higher_order.cond`` / ``_operator.gt``."""
        return self.qualname[10:] if self.is_torch_op else self.qualname

    @property
    def namespace(self) -> str:
        return self.key.split(".", 1)[0]

    @property
    def op_name(self) -> str:
        """``add`` for ``aten.add.Tensor``, ``cond`` for HOPs, ``gt`` for ``_operator.gt``."""
        parts = self.key.split(".")
        return parts[1] if len(parts) > 1 else parts[0]

    @property
    def overload(self) -> str | None:
        parts = self.key.split(".")
        return parts[2] if self.is_torch_op and not self.is_hop and len(parts) > 2 else None

    def __str__(self) -> str:
        return self.key

    def __repr__(self) -> str:
        return f"OpRef({self.key!r})"


@dataclass(frozen=True, slots=True)
class SymValue:
    """A symbolic scalar: ``kind`` ``"int"``, ``"bool"`` or ``"float"``; ``expr`` as stored
    (``sympy.srepr`` text for .pt2); ``hint`` the example value if known."""

    kind: str
    expr: str
    hint: Any = None

    def __str__(self) -> str:
        from .symbolic import pretty

        return pretty(self.expr)

    def __repr__(self) -> str:
        return f"Sym{self.kind.capitalize()}({self})"


SizeLike = int | SymValue


@dataclass(frozen=True, slots=True)
class TensorValue:
    """What a tensor value looks like (FX's ``meta["val"]`` FakeTensor, as data)."""

    dtype: DType
    shape: tuple[SizeLike, ...]
    stride: tuple[SizeLike, ...]
    storage_offset: SizeLike = 0
    device: str = "cpu"
    requires_grad: bool = False
    layout: str = "strided"

    @property
    def is_dynamic(self) -> bool:
        return any(isinstance(s, SymValue) for s in (*self.shape, *self.stride, self.storage_offset))

    def __str__(self) -> str:
        return f"{self.dtype.name}[{', '.join(str(s) for s in self.shape)}]"


def map_arg(a: Any, fn: Callable[[Node], Any]) -> Any:
    """Apply ``fn`` to every node inside ``a`` (tuples, lists, dicts, slices kept)."""
    if isinstance(a, Node):
        return fn(a)
    if isinstance(a, tuple):
        return tuple(map_arg(x, fn) for x in a)
    if isinstance(a, list):
        return [map_arg(x, fn) for x in a]
    if isinstance(a, dict):
        return {k: map_arg(v, fn) for k, v in a.items()}
    if isinstance(a, slice):
        return slice(map_arg(a.start, fn), map_arg(a.stop, fn), map_arg(a.step, fn))
    return a


def iter_nodes(a: Any) -> Iterator[Node]:
    """Every node inside ``a``, in argument order (repeats included)."""
    if isinstance(a, Node):
        yield a
    elif isinstance(a, (tuple, list)):
        for x in a:
            yield from iter_nodes(x)
    elif isinstance(a, dict):
        for x in a.values():
            yield from iter_nodes(x)
    elif isinstance(a, slice):
        yield from iter_nodes((a.start, a.stop, a.step))


class Node:
    """One operation. See the module docstring for what each field means per opcode."""

    __slots__ = ("graph", "name", "op", "target", "args", "kwargs", "meta")

    def __init__(
        self, graph: Graph, name: str, op: str, target: Any, args: tuple, kwargs: dict, meta: dict | None = None
    ) -> None:
        if op not in OPCODES:
            raise FormatError(f"unknown node opcode {op!r}", expected=", ".join(OPCODES))
        self.graph = graph
        self.name = name
        self.op = op
        self.target = target
        self.args = tuple(args)
        self.kwargs = dict(kwargs)
        self.meta: dict[str, Any] = dict(meta or {})

    @property
    def all_input_nodes(self) -> list[Node]:
        """Distinct nodes this node reads, in first-use order."""
        seen: dict[int, Node] = {}
        for n in iter_nodes((self.args, self.kwargs)):
            seen.setdefault(id(n), n)
        return list(seen.values())

    @property
    def users(self) -> list[Node]:
        """Nodes that read this one, in graph order."""
        return [u for u in self.graph.nodes if any(n is self for n in iter_nodes((u.args, u.kwargs)))]

    @property
    def val(self) -> Any:
        return self.meta.get("val")

    def format(self) -> str:
        """One line: ``%name : op[target=...](args = ..., kwargs = ...)`` like FX's ``format_node``."""
        a = format_value(self.args, ref="%")
        k = format_value(self.kwargs, ref="%")
        return f"%{self.name} : [num_users={len(self.users)}] = {self.op}[target={self.target}](args = {a}, kwargs = {k})"

    def __repr__(self) -> str:
        return self.name


_ILLEGAL = re.compile(r"[^0-9a-zA-Z_]+")
_SUFFIX = re.compile(r"(.*)_(\d+)$")
_RESERVED = set(keyword.kwlist) | set(dir(builtins)) | {"self", "torch", "inf", "nan", "math", "operator"}


class Namespace:
    """Unique Python identifiers for a graph's values, with FX's rules.

    Invariants: every returned name is a valid identifier, no keyword or builtin, and was
    not returned before; a taken ``name`` becomes ``name_1``, ``name_2``... (an existing
    ``_N`` suffix is continued).
    """

    def __init__(self) -> None:
        self._used: set[str] = set()
        self._base_count: dict[str, int] = {}

    def create_name(self, candidate: str) -> str:
        name = _ILLEGAL.sub("_", candidate) or "_unnamed"
        if name[0].isdigit():
            name = f"_{name}"
        m = _SUFFIX.match(name)
        if m is None:
            base, num = name, None
        else:
            base, num = m.group(1), int(m.group(2))
        cand = base if num is None else f"{base}_{num}"
        if num is None:
            num = self._base_count.get(base, 0)
        while cand in self._used or cand in _RESERVED:
            num += 1
            cand = f"{base}_{num}"
        self._used.add(cand)
        self._base_count[base] = max(self._base_count.get(base, 0), num)
        return cand

    def reserve(self, name: str) -> bool:
        """Take ``name`` exactly; False when it is taken or not an identifier."""
        if name in self._used or not name.isidentifier() or keyword.iskeyword(name):
            return False
        self._used.add(name)
        return True

    def release(self, name: str) -> None:
        self._used.discard(name)

    def __contains__(self, name: object) -> bool:
        return name in self._used


@dataclass
class Graph:
    """A list of nodes in execution order, with the subgraphs their ``get_attr`` nodes name.

    Attributes:
        nodes: the nodes in order.
        subgraphs: ``get_attr`` target -> :class:`Graph` (higher-order op bodies).
        attributes: other ``get_attr`` targets -> values (lazy tensors, constants).
        meta: graph-level metadata (the format's extras).
    """

    nodes: list[Node] = field(default_factory=list)
    subgraphs: dict[str, Graph] = field(default_factory=dict)
    attributes: dict[str, Any] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    namespace: Namespace = field(default_factory=Namespace, repr=False)

    # -- building ------------------------------------------------------------------
    def create_node(
        self,
        op: str,
        target: Any,
        args: Iterable[Any] = (),
        kwargs: dict[str, Any] | None = None,
        name: str | None = None,
        meta: dict[str, Any] | None = None,
        *,
        exact_name: bool = False,
        index: int | None = None,
    ) -> Node:
        """Add a node (at the end, or at ``index``) and return it.

        ``name`` is a candidate made unique by the namespace; with ``exact_name`` the name
        must be free (as when reading a serialized graph whose names are fixed).

        Raises:
            FormatError: ``exact_name`` and the name is taken or not an identifier.
        """
        if name is None:
            name = _default_name(op, target)
        if exact_name:
            if not self.namespace.reserve(name):
                raise FormatError(f"duplicate or invalid value name {name!r} in graph")
        else:
            name = self.namespace.create_name(name)
        n = Node(self, name, op, target, tuple(args), kwargs or {}, meta)
        if index is None:
            self.nodes.append(n)
        else:
            self.nodes.insert(index, n)
        return n

    def placeholder(self, name: str, **kw: Any) -> Node:
        return self.create_node("placeholder", name, name=name, **kw)

    def get_attr(self, target: str, **kw: Any) -> Node:
        kw.setdefault("name", target.replace(".", "_"))
        return self.create_node("get_attr", target, **kw)

    def call_function(self, target: Any, args: Iterable[Any] = (), kwargs: dict[str, Any] | None = None, **kw: Any) -> Node:
        return self.create_node("call_function", target, args, kwargs, **kw)

    def output(self, value: Any, **kw: Any) -> Node:
        kw.setdefault("name", "output")
        return self.create_node("output", "output", (value,), **kw)

    # -- editing -------------------------------------------------------------------
    def erase_node(self, node: Node) -> None:
        """Remove a node that nothing uses.

        Raises:
            FormatError: the node still has users.
        """
        if node.users:
            raise FormatError(f"cannot erase {node.name!r}: still used by " + ", ".join(u.name for u in node.users))
        self.nodes.remove(node)
        self.namespace.release(node.name)

    def replace_all_uses_with(self, old: Node, new: Any) -> list[Node]:
        """Point every use of ``old`` at ``new``; returns the changed users."""
        changed = []
        for u in self.nodes:
            if any(n is old for n in iter_nodes((u.args, u.kwargs))):
                u.args = map_arg(u.args, lambda n: new if n is old else n)
                u.kwargs = map_arg(u.kwargs, lambda n: new if n is old else n)
                changed.append(u)
        return changed

    # -- queries -------------------------------------------------------------------
    def find_nodes(self, *, op: str | None = None, target: Any = None) -> list[Node]:
        return [
            n
            for n in self.nodes
            if (op is None or n.op == op) and (target is None or n.target == target or str(n.target) == str(target))
        ]

    @property
    def placeholders(self) -> list[Node]:
        return [n for n in self.nodes if n.op == "placeholder"]

    @property
    def output_node(self) -> Node | None:
        for n in reversed(self.nodes):
            if n.op == "output":
                return n
        return None

    def node(self, name: str) -> Node:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)

    def walk(self, prefix: str = "") -> Iterator[tuple[str, Graph]]:
        """This graph and every nested subgraph as ``(path, graph)``; the root's path is ``""``."""
        yield prefix, self
        for name, sub in self.subgraphs.items():
            yield from sub.walk(f"{prefix}.{name}" if prefix else name)

    # -- checking ------------------------------------------------------------------
    def lint(self) -> None:
        """Check structure: known opcodes, unique names, defs before uses, nodes of this
        graph only, placeholders first, exactly one output at the end, get_attr targets
        resolvable.

        Raises:
            FormatError: the first violation found.
        """
        seen: set[int] = set()
        names: set[str] = set()
        outputs = 0
        placeholders_done = False
        for i, n in enumerate(self.nodes):
            if n.op not in OPCODES:
                raise FormatError(f"node {n.name!r} has unknown opcode {n.op!r}")
            if n.graph is not self:
                raise FormatError(f"node {n.name!r} belongs to another graph")
            if n.name in names:
                raise FormatError(f"duplicate node name {n.name!r}")
            names.add(n.name)
            if n.op == "placeholder":
                if placeholders_done:
                    raise FormatError(f"placeholder {n.name!r} comes after other nodes")
            else:
                placeholders_done = True
            for a in iter_nodes((n.args, n.kwargs)):
                if a.graph is not self:
                    raise FormatError(f"node {n.name!r} uses {a.name!r} from another graph")
                if id(a) not in seen:
                    raise FormatError(f"node {n.name!r} uses {a.name!r} before it is defined")
            if n.op == "output":
                outputs += 1
                if i != len(self.nodes) - 1:
                    raise FormatError("the output node is not the last node")
            if n.op == "get_attr" and n.target not in self.subgraphs and n.target not in self.attributes:
                raise FormatError(f"get_attr {n.name!r} names unknown attribute {n.target!r}")
            seen.add(id(n))
        if outputs != 1:
            raise FormatError("a graph needs exactly one output node", found=f"{outputs}")
        for sub in self.subgraphs.values():
            sub.lint()

    # -- printing ------------------------------------------------------------------
    def python_code(self, name: str = "forward") -> str:
        """The graph as Python source, in the manner of ``GraphModule.code``."""
        return python_code(self, name)

    def tabular(self) -> str:
        """A table of nodes (opcode, name, target, args, kwargs, value)."""
        return tabular(self)

    def __str__(self) -> str:
        return graph_str(self)

    def __len__(self) -> int:
        return len(self.nodes)

    def __iter__(self) -> Iterator[Node]:
        return iter(self.nodes)


def _default_name(op: str, target: Any) -> str:
    if op in ("placeholder", "get_attr") and isinstance(target, str):
        return target
    if isinstance(target, OpRef):
        return target.op_name
    if isinstance(target, str):
        return target.rsplit(".", 1)[-1]
    return getattr(target, "__name__", op)


# -- printing (FX keeps its CodeGen beside the Graph too) ---------------------------------
# Printing graphs: Python code in the manner of ``GraphModule.code``, a node table, and
# FX's ``str(graph)`` form.
#
# :func:`python_code` follows FX's code generator: placeholders become the parameters of
# ``forward``, operator overloads print as ``torch.ops.aten.add.Tensor(...)``, Python
# operators as infix expressions (``a > 4``, ``x[0]``), ``get_attr`` as ``self.<name>``,
# keyword arguments as ``name = value``, and each statement ends by releasing the values
# whose last use it was (``;  x = y = None``).

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
            args = format_value(n.args, ref="%")
            kwargs = format_value(n.kwargs, ref="%")
            uses = len(users.get(id(n), ()))
            lines.append(f"    %{n.name} : [num_users={uses}] = {n.op}[target={n.target}](args = {args}, kwargs = {kwargs})")
    return "\n".join(lines)
