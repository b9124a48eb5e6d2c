"""Between the .pt2 JSON graph (:mod:`.schema`) and torchless's graph IR (:mod:`torchless.graph.ir`).

:func:`deserialize_graph` builds the graph ``torch.export.load`` builds (``pt2.md`` §3.2-3.3):
placeholders from ``graph.inputs``; one ``call_function`` per serialized node, its
``POSITIONAL`` inputs as ``args`` and ``KEYWORD`` inputs as ``kwargs``; a ``get_attr`` node
per subgraph argument of a higher-order op (the subgraph in ``Graph.subgraphs``);
``operator.getitem`` nodes for multi-output ops; an ``output`` node. Each value's metadata
(``TensorMeta``, SymInt/SymBool/SymFloat) lands in ``node.meta["val"]`` and the node
metadata strings are parsed as torch parses them (``nn_module_stack`` -> dict of
``(path, type)``, ``torch_fn`` -> tuple, ``source_fn_stack`` -> list of pairs).

:func:`serialize_graph` is the inverse, so a transformed graph can be written back; on an
untouched graph it reproduces torch's JSON exactly.
"""

from __future__ import annotations

import json
from typing import Any

from ...core import jsonsafe
from ...core.dtypes import DType, by_name
from ...core.errors import FormatError, TorchlessError, UnsupportedError
from ...core.values import Device
from ...core.values import Layout as LayoutName
from ...core.values import MemoryFormat as MemoryFormatName
from ...graph.ir import Graph, Node, OpRef, SymValue, TensorValue
from ...graph.schema import base_of, registry
from . import schema as S

__all__ = ["deserialize_graph", "serialize_graph", "tensor_value", "tensor_meta", "parse_metadata", "dump_metadata", "GETITEM"]

GETITEM = OpRef("_operator.getitem")
_LAYOUT_BY_NAME = {v: k for k, v in S.LAYOUT_NAMES.items()}
_MF_BY_NAME = {v: k for k, v in S.MEMORY_FORMAT_NAMES.items()}
_SCALAR_ARGS = ("as_sym_int", "as_sym_bool", "as_sym_float")


# -- values ----------------------------------------------------------------------------


def _dtype(st: S.ScalarType) -> DType:
    name = S.SCALAR_TYPE_DTYPE.get(st)
    if name is None:
        raise UnsupportedError(f"ScalarType {st.name} ({int(st)}) has no dtype")
    return by_name(name)


def _sym(u: S.Union, kind: str) -> Any:
    if u.kind == "as_expr":
        e: S.SymExpr = u.value
        return SymValue(kind, e.expr_str, None if e.hint is None else e.hint.value)
    return u.value


def _unsym(v: Any, cls: type, kind: str) -> Any:
    if isinstance(v, SymValue):
        hint = None
        if v.hint is not None:
            hk = {"int": "as_int", "bool": "as_bool", "float": "as_float"}[v.kind] if not isinstance(v.hint, bool) else "as_bool"
            if isinstance(v.hint, float) and not isinstance(v.hint, bool):
                hk = "as_float"
            hint = S.SymExprHint(hk, v.hint)
        return cls("as_expr", S.SymExpr(v.expr, hint))
    return cls(kind, v)


def tensor_value(m: S.TensorMeta) -> TensorValue:
    """The IR value of a serialized ``TensorMeta``."""
    dev = m.device.type if m.device.index is None else f"{m.device.type}:{m.device.index}"
    return TensorValue(
        _dtype(m.dtype),
        tuple(_sym(s, "int") for s in m.sizes),
        tuple(_sym(s, "int") for s in m.strides),
        _sym(m.storage_offset, "int"),
        dev,
        m.requires_grad,
        S.LAYOUT_NAMES.get(m.layout, "unknown"),
    )


def tensor_meta(v: TensorValue) -> S.TensorMeta:
    """The serialized ``TensorMeta`` of an IR tensor value."""
    dev = Device(v.device)
    st = S.DTYPE_SCALAR_TYPE.get(v.dtype.name)
    if st is None:
        raise UnsupportedError(f"dtype {v.dtype.name} cannot be stored in a .pt2 graph")
    return S.TensorMeta(
        st,
        [_unsym(s, S.SymInt, "as_int") for s in v.shape],
        v.requires_grad,
        S.Device(dev.type, dev.index),
        [_unsym(s, S.SymInt, "as_int") for s in v.stride],
        _unsym(v.storage_offset, S.SymInt, "as_int"),
        _LAYOUT_BY_NAME.get(v.layout, S.Layout.Unknown),
    )


# -- metadata --------------------------------------------------------------------------


def parse_metadata(md: dict[str, str]) -> dict[str, Any]:
    """Node metadata strings -> FX ``node.meta`` values (as torch's deserializer makes them)."""
    out: dict[str, Any] = {}
    for k, v in md.items():
        if k == "nn_module_stack":
            d = {}
            for item in v.split(";") if v else []:
                key, _, rest = item.partition(",")
                path, _, ty = rest.rpartition(",")
                d[key] = (path, ty)
            out[k] = d
        elif k == "source_fn_stack":
            out[k] = [tuple(item.split(",", 1)) for item in v.split(";")] if v else []
        elif k == "torch_fn":
            out[k] = tuple(v.split(";", 1))
        elif k == "custom":
            try:
                out[k] = jsonsafe.loads(v, what="node metadata 'custom'")
            except TorchlessError:
                out[k] = v
        else:
            out[k] = v
    return out


_META_KEYS = ("stack_trace", "nn_module_stack", "source_fn_stack", "torch_fn", "custom", "from_node")


def dump_metadata(meta: dict[str, Any]) -> dict[str, str]:
    """Inverse of :func:`parse_metadata` for the keys .pt2 stores."""
    out: dict[str, str] = {}
    for k in meta.get("_pt2_meta_order", _META_KEYS):
        if k not in meta:
            continue
        v = meta[k]
        if k == "nn_module_stack" and isinstance(v, dict):
            out[k] = ";".join(f"{key},{p},{t}" for key, (p, t) in v.items())
        elif k == "source_fn_stack" and isinstance(v, list):
            out[k] = ";".join(",".join(map(str, pair)) for pair in v)
        elif k == "torch_fn" and isinstance(v, tuple):
            out[k] = ";".join(map(str, v))
        elif k == "custom" and not isinstance(v, str):
            out[k] = json.dumps(v)
        elif isinstance(v, str):
            out[k] = v
    return out


# -- JSON -> IR ------------------------------------------------------------------------


class _Reader:
    def __init__(self, sg: S.Graph, member: str | None) -> None:
        self.sg = sg
        self.member = member
        self.g = Graph()
        self.env: dict[str, Node] = {}

    def err(self, msg: str) -> FormatError:
        return FormatError(msg, member=self.member)

    def val_of(self, name: str) -> Any:
        sg = self.sg
        if name in sg.tensor_values:
            return tensor_value(sg.tensor_values[name])
        if name in sg.sym_int_values:
            return _sym(sg.sym_int_values[name], "int")
        if name in sg.sym_bool_values:
            return _sym(sg.sym_bool_values[name], "bool")
        if name in sg.sym_float_values:
            return _sym(sg.sym_float_values[name], "float")
        if name in sg.custom_obj_values:
            return sg.custom_obj_values[name]
        return None

    def define(self, name: str, node: Node) -> None:
        self.env[name] = node
        v = self.val_of(name)
        if v is not None:
            node.meta["val"] = v

    def ref(self, name: str) -> Node:
        n = self.env.get(name)
        if n is None:
            raise self.err(f"graph value {name!r} is used before it is defined")
        return n

    def arg(self, a: S.Argument, graphs: dict[str, Node]) -> Any:
        k, v = a.kind, a.value
        if k == "as_none":
            return None
        if k == "as_tensor":
            return self.ref(v.name)
        if k == "as_tensors":
            return [self.ref(t.name) for t in v]
        if k in ("as_int", "as_float", "as_string", "as_bool"):
            return v
        if k in ("as_ints", "as_floats", "as_strings", "as_bools"):
            return list(v)
        if k in _SCALAR_ARGS:
            return self.ref(v.value) if v.kind == "as_name" else v.value
        if k in ("as_sym_ints", "as_sym_bools", "as_sym_floats"):
            return [self.ref(x.value) if x.kind == "as_name" else x.value for x in v]
        if k == "as_scalar_type":
            return _dtype(v)
        if k == "as_memory_format":
            return MemoryFormatName(S.MEMORY_FORMAT_NAMES.get(v, "unknown"))
        if k == "as_layout":
            return LayoutName(S.LAYOUT_NAMES.get(v, "unknown"))
        if k == "as_device":
            return Device.make(v.type, v.index)
        if k == "as_graph":
            return graphs[v.name]
        if k == "as_optional_tensors":
            return [None if o.kind == "as_none" else self.ref(o.value.name) for o in v]
        if k == "as_optional_tensor":
            return None if v.kind == "as_none" else self.ref(v.value.name)
        if k == "as_custom_obj":
            return self.ref(v.name)
        if k == "as_operator":
            return OpRef(v)
        if k == "as_complex":
            return complex(v.real, v.imag)
        if k == "as_nested_tensors":
            return [[self.ref(t.name) for t in row] for row in v]
        if k in ("as_int_lists", "as_float_lists"):
            return [list(r) for r in v]
        if k == "as_string_to_argument":
            return {key: self.arg(x, graphs) for key, x in v.items()}
        raise UnsupportedError(f"argument kind {k!r} is not supported", member=self.member)

    def run(self, input_names: list[str] | None = None) -> Graph:
        g, sg = self.g, self.sg
        for i, a in enumerate(sg.inputs):
            if a.kind in ("as_tensor", "as_custom_obj"):
                name = a.value.name
            elif a.kind in _SCALAR_ARGS and a.value.kind == "as_name":
                name = a.value.value
            else:
                # constant inputs: torch names the placeholder after the signature entry
                name = input_names[i] if input_names and i < len(input_names) and input_names[i] else f"arg{i}"
                n = g.placeholder(name)
                n.meta["val"] = self.arg(a, {})
                continue
            n = g.create_node("placeholder", name, name=name, exact_name=True)
            self.define(name, n)
        for sn in sg.nodes:
            self.node(sn)
        outs = tuple(self.arg(a, {}) for a in sg.outputs)
        out = g.output(outs[0] if sg.is_single_tensor_return and len(outs) == 1 else outs)
        if sg.is_single_tensor_return:
            out.meta["pt2_single_tensor_return"] = True
        return g

    def node(self, sn: S.Node) -> None:
        g = self.g
        target = OpRef(sn.target)
        meta = parse_metadata(sn.metadata)
        order = list(sn.metadata)
        if tuple(order) != tuple(k for k in _META_KEYS if k in sn.metadata):
            meta["_pt2_meta_order"] = order
        graphs: dict[str, Node] = {}
        for ia in sn.inputs:
            if ia.arg.kind == "as_graph":
                ga: S.GraphArgument = ia.arg.value
                sub = _Reader(ga.graph, self.member).run()
                g.subgraphs[ga.name] = sub
                graphs[ga.name] = g.create_node(
                    "get_attr", ga.name, name=ga.name, exact_name=True, meta={k: v for k, v in meta.items()}
                )
        args: list[Any] = []
        kwargs: dict[str, Any] = {}
        names: list[str] = []
        for ia in sn.inputs:
            v = self.arg(ia.arg, graphs)
            names.append(ia.name)
            if ia.kind == S.ArgumentKind.KEYWORD:
                kwargs[ia.name] = v
            else:
                args.append(v)
        if not target.is_hop and not target.is_torch_op:
            meta["pt2_arg_names"] = names
        outs = sn.outputs
        single = len(outs) == 1 and not (target.is_hop and sn.is_hop_single_tensor_return is False)
        if single and outs[0].kind == "as_tensor":
            name = outs[0].value.name
        elif single and outs[0].kind in _SCALAR_ARGS and outs[0].value.kind == "as_name":
            name = outs[0].value.value
        else:
            name = None
        if name is not None:
            n = g.create_node("call_function", target, args, kwargs, name=name, exact_name=True, meta=meta)
            self.define(name, n)
            return
        n = g.create_node("call_function", target, args, kwargs, name=sn.name or target.op_name, meta=meta)
        if len(outs) == 1 and outs[0].kind == "as_none":
            n.meta["val"] = None
            return
        if not outs:
            return
        if sn.is_hop_single_tensor_return is not None:
            n.meta["pt2_hop_single_tensor_return"] = sn.is_hop_single_tensor_return
        if len(outs) == 1 and outs[0].kind == "as_tensors":
            # a list-returning op (split, unbind): getitems index the list directly
            n.meta["val"] = self.getitems(n, list(outs[0].value), meta)
            n.meta["pt2_list_output"] = True
        else:
            n.meta["val"] = self.getitems(n, list(outs), meta)

    def getitems(self, parent: Node, outs: list[Any], meta: dict[str, Any]) -> list[Any]:
        vals: list[Any] = []
        for idx, o in enumerate(outs):
            if isinstance(o, S.Argument):
                kind, value = o.kind, o.value
            else:
                kind, value = "as_tensor", o
            if kind in ("as_tensor",) or (kind in _SCALAR_ARGS and value.kind == "as_name"):
                name = value.name if kind == "as_tensor" else value.value
                gi = self.g.create_node("call_function", GETITEM, (parent, idx), name=name, exact_name=True, meta=dict(meta))
                self.define(name, gi)
                vals.append(gi.meta.get("val"))
            elif kind == "as_tensors":
                lst = self.g.create_node("call_function", GETITEM, (parent, idx), name="getitem", meta=dict(meta))
                lst.meta["val"] = self.getitems(lst, list(value), meta)
                vals.append(lst.meta["val"])
            elif kind == "as_none":
                vals.append(None)
            else:
                raise UnsupportedError(f"node output kind {kind!r} is not supported", member=self.member)
        return vals


def deserialize_graph(sg: S.Graph, *, member: str | None = None, input_names: list[str] | None = None) -> Graph:
    """Build the IR graph of a serialized graph (see the module docstring).

    Raises:
        FormatError: undefined or duplicate value names.
        UnsupportedError: argument kinds torchless does not model.
    """
    return _Reader(sg, member).run(input_names)


# -- IR -> JSON ------------------------------------------------------------------------


class _Writer:
    def __init__(self, g: Graph) -> None:
        self.g = g
        self.tensor_values: dict[str, S.TensorMeta] = {}
        self.sym_int: dict[str, S.SymInt] = {}
        self.sym_bool: dict[str, S.SymBool] = {}
        self.sym_float: dict[str, S.SymFloat] = {}
        self.custom: dict[str, S.CustomObjArgument] = {}
        self.getitems: dict[int, dict[int, Node]] = {}
        for n in g.nodes:
            if n.op == "call_function" and _is_getitem(n) and isinstance(n.args[0], Node) and n.args[0].op == "call_function":
                self.getitems.setdefault(id(n.args[0]), {})[n.args[1]] = n

    def record(self, name: str, v: Any) -> None:
        if isinstance(v, TensorValue):
            self.tensor_values[name] = tensor_meta(v)
        elif isinstance(v, SymValue):
            if v.kind == "int":
                self.sym_int[name] = _unsym(v, S.SymInt, "as_int")
            elif v.kind == "bool":
                self.sym_bool[name] = _unsym(v, S.SymBool, "as_bool")
            else:
                self.sym_float[name] = _unsym(v, S.SymFloat, "as_float")
        elif isinstance(v, S.CustomObjArgument):
            self.custom[name] = v

    def value_arg(self, n: Node) -> S.Argument:
        v = n.meta.get("val")
        if n.op == "get_attr" and n.target in self.g.subgraphs:
            return S.Argument("as_graph", S.GraphArgument(n.target, serialize_graph(self.g.subgraphs[n.target])))
        if isinstance(v, SymValue) or (
            n.op != "placeholder" and isinstance(v, (int, float, bool)) and not isinstance(v, TensorValue)
        ):
            kind = (
                v.kind
                if isinstance(v, SymValue)
                else ("bool" if isinstance(v, bool) else "float" if isinstance(v, float) else "int")
            )
            cls = {"int": S.SymIntArgument, "bool": S.SymBoolArgument, "float": S.SymFloatArgument}[kind]
            return S.Argument(f"as_sym_{kind}", cls("as_name", n.name))
        if isinstance(v, S.CustomObjArgument):
            return S.Argument("as_custom_obj", S.CustomObjArgument(n.name, v.class_fqn))
        return S.Argument("as_tensor", S.TensorArgument(n.name))

    def arg(self, v: Any, ty: Any = None) -> S.Argument:
        A = S.Argument
        if v is None:
            return A("as_none", True)
        if isinstance(v, Node):
            return self.value_arg(v)
        if isinstance(v, bool):
            return A("as_bool", v)
        if isinstance(v, int):
            return A("as_int", v)
        if isinstance(v, float):
            return A("as_float", v)
        if isinstance(v, str) and not isinstance(v, (Device, LayoutName, MemoryFormatName)):
            return A("as_string", v)
        if isinstance(v, DType):
            return A("as_scalar_type", S.DTYPE_SCALAR_TYPE[v.name])
        if isinstance(v, LayoutName):
            return A("as_layout", _LAYOUT_BY_NAME.get(str(v), S.Layout.Unknown))
        if isinstance(v, MemoryFormatName):
            return A("as_memory_format", _MF_BY_NAME.get(str(v), S.MemoryFormat.Unknown))
        if isinstance(v, Device):
            return A("as_device", S.Device(v.type, v.index))
        if isinstance(v, complex):
            return A("as_complex", S.ComplexValue(v.real, v.imag))
        if isinstance(v, OpRef):
            return A("as_operator", v.qualname)
        if isinstance(v, dict):
            return A("as_string_to_argument", {k: self.arg(x) for k, x in v.items()})
        if isinstance(v, (list, tuple)):
            return self.list_arg(list(v), ty)
        raise UnsupportedError(f"cannot serialize argument of type {type(v).__name__}")

    def list_arg(self, v: list[Any], ty: Any) -> S.Argument:
        A = S.Argument
        base = base_of(ty).name if ty is not None else None
        if not v:
            opt_tensor = ty is not None and "Tensor?" in str(ty)
            table = {"int": "as_ints", "SymInt": "as_ints", "float": "as_floats", "bool": "as_bools", "str": "as_strings"}
            kind = "as_optional_tensors" if opt_tensor else table.get(base or "", "as_tensors")
            return A(kind, [])
        if all(isinstance(x, bool) for x in v):
            return A("as_bools", v)
        if all(isinstance(x, int) and not isinstance(x, bool) for x in v):
            return A("as_ints", v)
        if all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v):
            return A("as_floats", [float(x) if not isinstance(x, float) else x for x in v])
        if all(isinstance(x, str) for x in v):
            return A("as_strings", v)
        if all(isinstance(x, list) for x in v):
            if all(isinstance(y, Node) for r in v for y in r):
                return A("as_nested_tensors", [[S.TensorArgument(y.name) for y in r] for r in v])
            if all(isinstance(y, int) for r in v for y in r):
                return A("as_int_lists", v)
            return A("as_float_lists", v)
        nodes = [x for x in v if isinstance(x, Node)]
        if nodes and all(isinstance(x, (Node, int)) and not isinstance(x, bool) for x in v):
            vals = [n.meta.get("val") for n in nodes]
            if all(isinstance(x, SymValue) and x.kind == "int" for x in vals):
                return A(
                    "as_sym_ints",
                    [S.SymIntArgument("as_name", x.name) if isinstance(x, Node) else S.SymIntArgument("as_int", x) for x in v],
                )
            if all(isinstance(x, SymValue) and x.kind == "bool" for x in vals) and len(nodes) == len(v):
                return A("as_sym_bools", [S.SymBoolArgument("as_name", x.name) for x in nodes])
        if all(isinstance(x, Node) for x in v):
            return A("as_tensors", [S.TensorArgument(x.name) for x in v])
        if all(isinstance(x, Node) or x is None for x in v):
            return A(
                "as_optional_tensors",
                [
                    S.OptionalTensorArgument("as_none", True)
                    if x is None
                    else S.OptionalTensorArgument("as_tensor", S.TensorArgument(x.name))
                    for x in v
                ],
            )
        raise UnsupportedError("cannot serialize a list argument mixing " + ", ".join(sorted({type(x).__name__ for x in v})))

    def node(self, n: Node) -> S.Node:
        t = n.target if isinstance(n.target, OpRef) else OpRef(str(n.target))
        schema = registry().find(t.key) if t.is_torch_op and not t.is_hop else None
        inputs: list[S.NamedArgument] = []
        if schema is not None:
            pos = schema.positional
            if len(n.args) > len(pos):
                raise FormatError(f"node {n.name!r}: {t.key} takes {len(pos)} positional arguments", found=f"{len(n.args)}")
            for a, v in zip(pos, n.args, strict=False):
                inputs.append(S.NamedArgument(a.name, self.arg(v, a.type), S.ArgumentKind.POSITIONAL))
            for k, v in n.kwargs.items():
                sa = schema.argument(k)
                inputs.append(S.NamedArgument(k, self.arg(v, sa.type if sa else None), S.ArgumentKind.KEYWORD))
        else:
            names = n.meta.get("pt2_arg_names")
            for i, v in enumerate(n.args):
                nm = (
                    ""
                    if t.is_hop
                    else (names[i] if names and i < len(names) else ("a", "b", "c", "d")[i] if i < 4 else f"arg{i}")
                )
                inputs.append(S.NamedArgument(nm, self.arg(v), S.ArgumentKind.POSITIONAL))
            for k, v in n.kwargs.items():
                inputs.append(S.NamedArgument(k, self.arg(v), S.ArgumentKind.KEYWORD))
        v = n.meta.get("val")
        items = self.getitems.get(id(n))
        hop_single = None
        if t.is_hop:
            hop_single = n.meta.get("pt2_hop_single_tensor_return", isinstance(v, TensorValue))
        if items is not None or (isinstance(v, list) and not isinstance(v, TensorValue)):
            list_out = bool(n.meta.get("pt2_list_output")) or (
                schema is not None and len(schema.returns) == 1 and type(schema.returns[0].type).__name__ == "ListType"
            )
            outs = self.multi_outputs(n, v if isinstance(v, list) else [])
            if list_out:
                if any(o.kind != "as_tensor" for o in outs):
                    raise UnsupportedError(f"list output of {n.name!r} has unused elements; .pt2 cannot name them")
                outs = [S.Argument("as_tensors", [o.value for o in outs])]
            name = n.name
        elif v is None and n.meta.get("val", 0) is None:
            outs = [S.Argument("as_none", True)]
            name = n.name
        else:
            self.record(n.name, v)
            outs = [self.value_arg(n)]
            name = n.name
        return S.Node(t.qualname, inputs, outs, dump_metadata(n.meta), hop_single, name)

    def multi_outputs(self, n: Node, vals: list[Any]) -> list[S.Argument]:
        items = self.getitems.get(id(n), {})
        count = max([len(vals)] + [i + 1 for i in items if isinstance(i, int)])
        outs: list[S.Argument] = []
        for i in range(count):
            gi = items.get(i)
            if gi is None:
                outs.append(S.Argument("as_none", True))
                continue
            sub = self.getitems.get(id(gi))
            gv = gi.meta.get("val")
            if sub is not None or isinstance(gv, list):
                names = []
                for j in range(max([len(gv) if isinstance(gv, list) else 0] + [k + 1 for k in (sub or {})])):
                    e = (sub or {}).get(j)
                    if e is None:
                        raise UnsupportedError(f"list output {gi.name!r} element {j} is unused; .pt2 cannot name it")
                    self.record(e.name, e.meta.get("val"))
                    names.append(S.TensorArgument(e.name))
                outs.append(S.Argument("as_tensors", names))
            else:
                self.record(gi.name, gv)
                outs.append(self.value_arg(gi))
        return outs

    def run(self) -> S.Graph:
        g = self.g
        inputs = []
        nodes = []
        for n in g.nodes:
            if n.op == "placeholder":
                v = n.meta.get("val")
                if isinstance(v, (TensorValue, SymValue, S.CustomObjArgument)):
                    self.record(n.name, v)
                    inputs.append(self.value_arg(n))
                else:
                    inputs.append(self.arg(v))
            elif n.op == "get_attr":
                if n.target not in g.subgraphs:
                    raise UnsupportedError(f"get_attr {n.name!r} of a non-graph attribute cannot be stored in a .pt2 graph")
            elif n.op == "call_function":
                if (
                    _is_getitem(n)
                    and isinstance(n.args[0], Node)
                    and id(n.args[0]) in self.getitems
                    and n.args[0].op == "call_function"
                ):
                    continue
                nodes.append(self.node(n))
            elif n.op == "output":
                pass
            else:
                raise UnsupportedError(f"opcode {n.op!r} cannot be stored in a .pt2 graph (node {n.name!r})")
        out = g.output_node
        if out is None:
            raise FormatError("graph has no output node")
        single = bool(out.meta.get("pt2_single_tensor_return"))
        ov = out.args[0] if out.args else ()
        outs = [self.arg(ov)] if single else [self.arg(x) for x in (ov if isinstance(ov, (tuple, list)) else (ov,))]
        return S.Graph(inputs, outs, nodes, self.tensor_values, self.sym_int, self.sym_bool, single, self.custom, self.sym_float)


def _is_getitem(n: Node) -> bool:
    t = n.target
    return isinstance(t, OpRef) and t.qualname in ("_operator.getitem", "operator.getitem") and len(n.args) == 2


def serialize_graph(g: Graph) -> S.Graph:
    """The serialized form of an IR graph (inverse of :func:`deserialize_graph`).

    Raises:
        UnsupportedError: values the .pt2 schema cannot express (call_module nodes,
            non-graph attributes, unnamed list outputs).
        FormatError: arguments that do not fit the operator's schema.
    """
    return _Writer(g).run()
