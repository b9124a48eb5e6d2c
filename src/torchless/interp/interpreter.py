"""Run a :class:`~torchless.graph.ir.Graph` node by node on NumPy.

:func:`run_graph` binds the placeholders to the given values, evaluates every
``call_function`` node through its kernel (:mod:`.registry`), and returns the output
node's value. Each graph is compiled into a :class:`Plan` (a module keeps its plans across
calls): the kernel of every node,
resolved before anything runs (:func:`check_kernels` names *every* operator without a
kernel in one :class:`~torchless.core.errors.UnsupportedError`), and for each node the
values whose last use it is, so that intermediate arrays are released as soon as nothing
reads them (peak memory close to torch's).

A ``get_attr`` node naming a subgraph (the body of a higher-order op) evaluates to a
:class:`GraphFunction`, a callable that runs that subgraph; the higher-order ops' kernels
(``higher_order.cond``, ``while_loop``, ``map_impl``, ``scan``...) receive it like any other
argument and call it. A ``get_attr`` naming another attribute gives its value (a tensor
as a NumPy array).

Example:
    >>> from torchless.graph.ir import Graph, OpRef
    >>> g = Graph()
    >>> a, b = g.placeholder("a"), g.placeholder("b")
    >>> _ = g.output((g.call_function(OpRef("_operator.add"), (a, b)),))
    >>> run_graph(g, [2, 3])
    (5,)
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..core.errors import InternalError, LimitError, TorchlessError, UnsupportedError, UsageError
from ..graph.ir import Graph, Node, OpRef, iter_nodes, map_arg
from . import autocast, limits, registry
from .kernels._common import quiet

__all__ = ["GraphFunction", "Plan", "check_kernels", "missing_kernels", "node_key", "plan", "run_graph", "to_array"]


def node_key(n: Node) -> str:
    """The registry key of a ``call_function`` node's target."""
    t = n.target
    return t.key if isinstance(t, OpRef) else str(t)


def missing_kernels(graph: Graph) -> dict[str, int]:
    """Operator key -> number of nodes, for every operator of ``graph`` and its subgraphs
    that has no kernel."""
    out: dict[str, int] = {}
    for _path, g in graph.walk():
        for n in g.nodes:
            if n.op == "call_function":
                k = node_key(n)
                if registry.lookup(k) is None:
                    out[k] = out.get(k, 0) + 1
                # operators passed as arguments (auto_functionalized_v2, with_effects, out_dtype)
                for a in (*n.args, *n.kwargs.values()):
                    if isinstance(a, OpRef) and registry.lookup(a.key) is None:
                        out[a.key] = out.get(a.key, 0) + 1
            elif n.op in ("call_module", "call_method"):
                k = f"{n.op}:{n.target}"
                out[k] = out.get(k, 0) + 1
    return out


def check_kernels(graph: Graph) -> None:
    """Refuse, before anything runs, a graph with operators the interpreter lacks.

    Raises:
        UnsupportedError: naming every missing operator (with its node count).
    """
    miss = missing_kernels(graph)
    if miss:
        listed = ", ".join(f"{k} (x{c})" if c > 1 else k for k, c in sorted(miss.items()))
        raise UnsupportedError(
            f"the interpreter has no kernel for {len(miss)} operator{'s' if len(miss) > 1 else ''}: {listed}",
            hint="see docs/interpreter.md, Coverage",
        )


def to_array(v: Any) -> np.ndarray:
    """A tensor-like value (NumPy array, torchless Tensor, anything with ``__array__``) as an ndarray."""
    if isinstance(v, np.ndarray):
        return v
    detach = getattr(v, "detach", None)  # a torch tensor that requires grad
    if callable(detach) and not isinstance(v, np.generic):
        v = detach()
    numpy = getattr(v, "numpy", None)
    if callable(numpy) and not isinstance(v, np.generic):
        return np.asarray(numpy())
    return np.asarray(v)


class GraphFunction:
    """A subgraph as a callable: ``f(*args)`` runs it and returns its output value (the
    tuple/list the subgraph returns, as FX's ``GraphModule`` does)."""

    __slots__ = ("graph", "name", "plans")

    def __init__(self, graph: Graph, name: str = "", plans: dict[int, Plan] | None = None) -> None:
        self.graph = graph
        self.name = name
        self.plans = plans if plans is not None else {}

    def __call__(self, *args: Any) -> Any:
        return run_graph(self.graph, list(args), self.plans)

    def __repr__(self) -> str:
        return f"GraphFunction({self.name!r})"


class Plan:
    """A graph compiled for running: per node, its kernel and the values freed after it.

    Attributes:
        graph: the graph.
        placeholders: the placeholder nodes, in order.
        steps: ``(index, node, kernel, free)`` for every non-placeholder node; ``kernel`` is
            None for ``get_attr`` and ``output``; ``free`` lists the indices of the values
            whose last reader is this node.
    """

    def __init__(self, graph: Graph) -> None:
        check_kernels(graph)
        self.graph = graph
        index = {id(n): i for i, n in enumerate(graph.nodes)}
        self.index = index
        last: dict[int, int] = {}
        for i, n in enumerate(graph.nodes):
            for a in iter_nodes((n.args, n.kwargs)):
                j = index.get(id(a))
                if j is None:
                    raise InternalError(f"node {n.name!r} reads {a.name!r}, which is not in its graph")
                last[j] = i
        # values read other than by `getitem(value, 0)` or by a getitem nothing reads: the
        # others may run their kernel's first-element-only variant (registry.first_only)
        whole: set[int] = set()
        for i, n in enumerate(graph.nodes):
            item = n.op == "call_function" and node_key(n) == "_operator.getitem" and len(n.args) == 2
            lean = item and (n.args[1] == 0 or i not in last)
            for a in iter_nodes((n.args, n.kwargs)):
                if not (lean and n.args[0] is a):
                    whole.add(index[id(a)])
        frees: dict[int, list[int]] = {}
        for j, i in last.items():
            frees.setdefault(i, []).append(j)
        self.placeholders = [n for n in graph.nodes if n.op == "placeholder"]
        self.steps: list[tuple[int, Node, Any, tuple[int, ...]]] = []
        for i, n in enumerate(graph.nodes):
            if n.op == "placeholder":
                continue
            fn = registry.require(node_key(n)) if n.op == "call_function" else None
            if fn is not None and i not in whole and i in last:
                fn = registry.lookup_first_only(node_key(n)) or fn
            # a value nothing reads is dropped right after it is computed
            free = tuple(frees.get(i, ())) + (() if i in last or n.op == "output" else (i,))
            self.steps.append((i, n, fn, free))
        #: per step, how its arguments are gathered (see :func:`_arg_recipe`)
        self.recipes = [_arg_recipe(n, index) if fn is not None else None for _i, n, fn, _f in self.steps]
        #: per step, the operator key the limits' pre-check reads ("" for non-ATen targets);
        #: computed once here, not per node per call
        self.keys = [n.target.key if isinstance(n.target, OpRef) else "" for _i, n, _fn, _f in self.steps]


#: an argument recipe: (args template, (position, value index) per top-level node argument,
#: kwargs template, (name, value index) per node keyword argument); None where a node sits
#: inside a container (a list of tensors, a slice...), which :func:`map_arg` handles
Recipe = tuple[tuple[Any, ...], tuple[tuple[int, int], ...], dict[str, Any], tuple[tuple[str, int], ...]] | None


def _holds_node(a: Any) -> bool:
    return next(iter_nodes(a), None) is not None


def _arg_recipe(n: Node, index: dict[int, int]) -> Recipe:
    """How to build the call arguments of ``n`` without walking them per call: constants
    are kept as recorded and each top-level node argument is filled from its value slot."""
    slots: list[tuple[int, int]] = []
    for pos, a in enumerate(n.args):
        if isinstance(a, Node):
            slots.append((pos, index[id(a)]))
        elif _holds_node(a):
            return None
    kw_slots: list[tuple[str, int]] = []
    for k, a in n.kwargs.items():
        if isinstance(a, Node):
            kw_slots.append((k, index[id(a)]))
        elif _holds_node(a):
            return None
    return tuple(n.args), tuple(slots), dict(n.kwargs), tuple(kw_slots)


def plan(graph: Graph, plans: dict[int, Plan] | None = None) -> Plan:
    """The :class:`Plan` of ``graph``: from ``plans`` (a cache keyed by ``id(graph)``, held
    by whoever runs the graph repeatedly, such as a module) or compiled now and stored there.
    A plan reflects the graph when it was made: edit the graph, then make a new module."""
    if plans is not None:
        hit = plans.get(id(graph))
        if hit is not None and hit.graph is graph:
            return hit
    p = Plan(graph)
    if plans is not None:
        plans[id(graph)] = p
    return p


def _get_attr(graph: Graph, n: Node, plans: dict[int, Plan]) -> Any:
    t = n.target
    if t in graph.subgraphs:
        return GraphFunction(graph.subgraphs[t], str(t), plans)
    if t in graph.attributes:
        v = graph.attributes[t]
        return to_array(v) if hasattr(v, "numpy") or hasattr(v, "__array__") else v
    raise UsageError(f"get_attr {n.name!r} names unknown attribute {t!r}")


def run_graph(graph: Graph, inputs: list[Any], plans: dict[int, Plan] | None = None) -> Any:
    """Run ``graph`` with ``inputs`` bound to its placeholders, in order; returns the
    output node's value (``args[0]``, with every node replaced by its value). ``plans``
    caches the compiled graph and its subgraphs across calls (see :func:`plan`).

    Raises:
        UnsupportedError: an operator has no kernel (raised before any node runs), or a
            kernel cannot honour an argument.
        UsageError: wrong number of inputs; a runtime assertion of the graph failed.
    """
    if plans is None:
        plans = {}
    p = plan(graph, plans)
    if len(inputs) != len(p.placeholders):
        raise UsageError("wrong number of graph inputs", expected=str(len(p.placeholders)), found=str(len(inputs)))
    env: list[Any] = [None] * len(graph.nodes)
    for ph, v in zip(p.placeholders, inputs, strict=True):
        env[p.index[id(ph)]] = v

    def value(a: Node) -> Any:
        return env[p.index[id(a)]]

    result: Any = None
    autocast_dtype = autocast.STATE.get()
    caps = limits.STATE.get()
    live = 0  # bytes the values of env own (limits.owned_bytes), under caps.max_bytes
    owned = [0] * len(graph.nodes)
    args: Any
    kwargs: dict[str, Any]
    with quiet():  # once for the graph: every kernel's own quiet() is then free
        for (i, n, fn, free), recipe, key in zip(p.steps, p.recipes, p.keys, strict=True):
            if fn is not None:
                if recipe is None:
                    args = map_arg(n.args, value) if n.args else ()
                    kwargs = map_arg(n.kwargs, value) if n.kwargs else {}
                else:
                    args, slots, kwargs, kw_slots = recipe
                    if slots:
                        args = list(args)
                        for pos, j in slots:
                            args[pos] = env[j]
                    if kw_slots:
                        kwargs = dict(kwargs)
                        for k, j in kw_slots:
                            kwargs[k] = env[j]
                if autocast_dtype is not None and isinstance(n.target, OpRef):
                    args, kwargs = autocast.cast_args(n.target.op_name, args, kwargs, autocast_dtype)
                try:
                    limits.precheck(key, args, kwargs, "", caps)
                    out = fn(*args, **kwargs)
                    limits.postcheck(out, "", caps)
                    b = limits.owned_bytes(out)
                    if b and live + b > caps.max_bytes:
                        raise LimitError(
                            "the live intermediates of the run would exceed the interpreter's memory cap",
                            expected=f"at most {caps.max_bytes} bytes",
                            found=f"{live + b} bytes",
                            hint="raise the cap with --max-memory / RunLimits if the model really needs it",
                        )
                    live += b
                    owned[i] = b
                except TorchlessError as e:
                    if not getattr(e, "_interp_node", None):
                        e._interp_node = n.name  # type: ignore[attr-defined]  # a marker set on the exception once, for the outermost node
                        e.message = f"{e.message} (at node {n.name!r}, {node_key(n)})"
                    raise
                except IndexError as e:  # an index tensor out of range (torch raises IndexError too)
                    raise UsageError(f"index out of range at node {n.name!r} ({node_key(n)}): {e}") from e
                except Exception as e:  # noqa: BLE001 - any other failure of a kernel is a torchless bug
                    raise InternalError(f"kernel {node_key(n)} failed at node {n.name!r}: {type(e).__name__}: {e}") from e
                if isinstance(out, np.generic):
                    out = np.asarray(out)
                env[i] = out
            elif n.op == "get_attr":
                env[i] = _get_attr(graph, n, plans)
            elif n.op == "output":
                result = map_arg(n.args[0], value) if n.args else None
            else:
                raise UnsupportedError(f"the interpreter does not run {n.op} nodes ({n.name!r})")
            for j in free:
                env[j] = None
                live -= owned[j]
                owned[j] = 0
    return result
