"""An ONNX graph as torchless's graph IR (:mod:`torchless.graph.ir`), for printing and
inspection with the same tools as FX/.pt2 graphs.

The mapping:

* graph inputs -> ``placeholder`` nodes (``meta["val"]``: dtype and shape, symbolic dims
  as :class:`~torchless.graph.ir.SymValue`);
* initializers and Constant nodes -> ``get_attr`` nodes whose targets are in
  ``Graph.attributes`` (the lazy tensors of :class:`OnnxArtifact`);
* other nodes -> ``call_function`` with the string target ``"onnx.<Op>"``
  (``onnx.<domain>.<Op>`` outside the default domain); inputs are positional args (None
  for an omitted optional input), attributes are kwargs. A node with several outputs is
  followed by ``_operator.getitem`` nodes, as in FX;
* If/Loop/Scan bodies -> ``Graph.subgraphs`` (named ``<node>.<attribute>``), referenced
  by ``get_attr`` nodes in the kwargs. Values a body reads from the enclosing graph
  become extra placeholders of the body with ``meta["captured"] = True``.

This is a view: it is built on request, and nothing else in the ONNX reader depends on
it.
"""

from __future__ import annotations

from typing import Any

from .dtypes import ONNX_TYPES
from .read import OnnxModel, text

__all__ = ["to_graph"]

_MAX_DEPTH = 64


def _tensor_value(vi: Any) -> Any:
    from ...graph.ir import SymValue, TensorValue

    tt = vi.type.tensor_type if vi.type.WhichOneof("value") == "tensor_type" else None
    if tt is None or not tt.elem_type:
        return None
    t = ONNX_TYPES.get(int(tt.elem_type))
    if t is None or t.dtype is None:
        return None
    if not tt.HasField("shape"):
        return None
    shape: list[Any] = []
    for d in tt.shape.dim:
        w = d.WhichOneof("value")
        shape.append(int(d.dim_value) if w == "dim_value" else SymValue("int", text(d.dim_param) if w == "dim_param" else "?"))
    return TensorValue(t.dtype, tuple(shape), ())


def _static(t: Any) -> Any:
    from ...graph.ir import TensorValue

    return TensorValue(t.dtype, tuple(t.shape), tuple(t.stride()))


def _describe_tensor(tp: Any) -> str:
    t = ONNX_TYPES.get(int(tp.data_type))
    name = t.dtype.name if t is not None and t.dtype is not None else f"type{tp.data_type}"
    return f"tensor<{name}{list(int(d) for d in tp.dims)}>"


class _Builder:
    def __init__(self, om: OnnxModel) -> None:
        self.om = om
        self.tensors = {r.name: r.tensor for r in om.records}

    def build(self, g: Any, scope: str, outer: Any, depth: int) -> Any:
        """``outer`` resolves names of the enclosing graphs (None for the main graph)."""
        from ...graph.ir import Graph, OpRef

        graph = Graph()
        graph.meta["onnx_graph"] = text(g.name)
        env: dict[str, Any] = {}
        prefix = f"{scope}/" if scope else ""
        vinfo = {text(v.name): v for v in (*g.input, *g.output, *g.value_info)}
        inits = {text(t.name) for t in g.initializer}
        for vi in g.input:
            name = text(vi.name)
            if name in inits:
                continue
            env[name] = self._placeholder(graph, name, _tensor_value(vi))
        captured: list[tuple[str, Any]] = []

        def ref(name: str) -> Any:
            if name == "":
                return None
            if name in env:
                return env[name]
            src = outer(name) if outer is not None else None  # a value of an enclosing graph
            if src is not None:
                n = self._placeholder(graph, name, src.meta.get("val"), index=len(graph.placeholders))
                n.meta["captured"] = True
                env[name] = n
                captured.append((name, n))
                return n
            raise KeyError(name)

        for i, tp in enumerate(g.initializer):
            pname = text(tp.name) or f"initializer_{i}"
            key = prefix + pname
            if key in self.tensors:
                graph.attributes[key] = self.tensors[key]
                env[pname] = graph.get_attr(key, name=pname, meta={"val": _static(self.tensors[key]), "onnx_name": pname})
        for idx, node in enumerate(g.node):
            op, dom = text(node.op_type), text(node.domain)
            label = text(node.name) or f"{op}_{idx}"
            outs = [text(o) for o in node.output]
            if op == "Constant" and dom in ("", "ai.onnx") and outs and prefix + outs[0] in self.tensors:
                key = prefix + outs[0]
                graph.attributes[key] = self.tensors[key]
                env[outs[0]] = graph.get_attr(key, name=outs[0], meta={"val": _static(self.tensors[key]), "onnx_name": outs[0]})
                continue
            try:
                args = tuple(ref(text(x)) for x in node.input)
            except KeyError as e:
                from ...core.errors import FormatError

                raise FormatError(
                    f"node {label!r} reads {e.args[0]!r}, which no earlier node, input or initializer defines",
                    path=self.om.path,
                    member=scope or None,
                ) from None
            kwargs: dict[str, Any] = {}
            for a in node.attribute:
                kwargs[text(a.name)] = self._attr(graph, a, f"{prefix}{label}", ref, depth)
            # a plain string target: OpRef would file ONNX operators under torch.ops
            target = f"onnx.{op}" if dom in ("", "ai.onnx") else f"onnx.{dom}.{op}"
            n_name = outs[0] if len(outs) == 1 and outs[0] else label
            n = graph.call_function(target, args, kwargs, name=n_name)
            n.meta["onnx_node"] = label
            n.meta["onnx_name"] = n_name  # the value's (or node's) name as the file spells it
            if len(outs) == 1:
                if outs[0]:
                    env[outs[0]] = n
                    if outs[0] in vinfo:
                        n.meta["val"] = _tensor_value(vinfo[outs[0]])
            else:
                for j, o in enumerate(outs):
                    if o:
                        item = graph.call_function(OpRef("_operator.getitem"), (n, j), name=o)
                        item.meta["onnx_name"] = o
                        if o in vinfo:
                            item.meta["val"] = _tensor_value(vinfo[o])
                        env[o] = item
        results = []
        for vo in g.output:
            name = text(vo.name)
            results.append(ref(name))
        graph.output(tuple(results))
        graph.meta["captured"] = [name for name, _ in captured]
        return graph

    def _placeholder(self, graph: Any, name: str, val: Any, index: int | None = None) -> Any:
        n = graph.create_node("placeholder", None, name=name, meta={"val": val} if val is not None else None, index=index)
        n.target = n.name
        n.meta["onnx_name"] = name
        return n

    def _attr(self, graph: Any, a: Any, where: str, ref: Any, depth: int) -> Any:
        t = a.type
        if t == 1:
            return float(a.f)
        if t == 2:
            return int(a.i)
        if t == 3:
            return text(a.s)
        if t == 4:
            return _describe_tensor(a.t)
        if t == 6:
            return [float(x) for x in a.floats]
        if t == 7:
            return [int(x) for x in a.ints]
        if t == 8:
            return [text(x) for x in a.strings]
        if t == 9:
            return [_describe_tensor(x) for x in a.tensors]
        if t in (5, 10):
            if depth >= _MAX_DEPTH:
                from ...core.errors import LimitError

                raise LimitError(
                    "subgraphs nested too deeply", path=self.om.path, member=where, expected=f"<= {_MAX_DEPTH} levels"
                )
            bodies = [a.g] if t == 5 else list(a.graphs)
            nodes = []
            for j, body in enumerate(bodies):
                suffix = "" if t == 5 else f"[{j}]"
                scope = f"{where}/{text(a.name)}{suffix}"
                sub = self.build(body, scope, lambda name: _try(ref, name), depth + 1)
                key = scope.replace("/", ".")
                graph.subgraphs[key] = sub
                nodes.append(graph.get_attr(key, name=f"{text(a.name)}{j if t == 10 else ''}"))
            return nodes[0] if t == 5 else nodes
        return f"<attribute type {t}>"


def _try(ref: Any, name: str) -> Any:
    try:
        return ref(name)
    except KeyError:
        return None


def to_graph(om: OnnxModel) -> Any:
    """The model's main graph as a :class:`torchless.graph.ir.Graph`.

    Raises:
        FormatError: a node reads a value that nothing defines before it.
    """
    g = _Builder(om).build(om.model.graph, "", None, 0)
    g.meta["opsets"] = {(text(o.domain) or "ai.onnx"): o.version for o in om.model.opset_import}
    return g
