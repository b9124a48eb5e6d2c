"""The JSON-ready summary of an ONNX model (what ``torchless info`` prints)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from ..base import summarize_tensors
from .dtypes import ONNX_TYPES
from .read import text

__all__ = ["summarize_model", "value_info", "op_histogram"]

_DOC_MAX = 200


def _elem(code: int) -> str:
    t = ONNX_TYPES.get(int(code))
    if t is None:
        return f"type{code}"
    return t.dtype.name if t.dtype is not None else t.name.lower()


def _type(tp: Any) -> dict[str, Any]:
    kind = tp.WhichOneof("value")
    if kind in ("tensor_type", "sparse_tensor_type"):
        tt = getattr(tp, kind)
        out: dict[str, Any] = {"type": _elem(tt.elem_type) if tt.elem_type else "?"}
        if kind == "sparse_tensor_type":
            out["type"] = "sparse " + out["type"]
        if tt.HasField("shape"):
            dims: list[Any] = []
            for d in tt.shape.dim:
                which = d.WhichOneof("value")
                dims.append(d.dim_value if which == "dim_value" else text(d.dim_param) if which == "dim_param" else None)
            out["shape"] = dims
        else:
            out["shape"] = None  # unknown rank
        return out
    if kind == "sequence_type":
        return {"type": "sequence", "elem": _type(tp.sequence_type.elem_type)}
    if kind == "optional_type":
        return {"type": "optional", "elem": _type(tp.optional_type.elem_type)}
    if kind == "map_type":
        return {"type": "map", "key": _elem(tp.map_type.key_type), "value": _type(tp.map_type.value_type)}
    return {"type": kind or "?"}


def value_info(vi: Any) -> dict[str, Any]:
    """``{"name", "type", "shape"}`` of a ValueInfoProto; symbolic dims stay strings,
    unknown dims are None."""
    return {"name": text(vi.name), **_type(vi.type)}


def _op(node: Any) -> str:
    op, dom = text(node.op_type), text(node.domain)
    return op if dom in ("", "ai.onnx") else f"{dom}::{op}"


def op_histogram(graph: Any, *, recurse: bool = True) -> dict[str, int]:
    """Node counts by operator (``domain::op`` outside the default domain)."""
    c: Counter[str] = Counter()

    def go(g: Any, depth: int) -> None:
        for n in g.node:
            c[_op(n)] += 1
            if recurse and depth < 64:
                for a in n.attribute:
                    if a.type == 5:
                        go(a.g, depth + 1)
                    elif a.type == 10:
                        for sg in a.graphs:
                            go(sg, depth + 1)

    go(graph, 0)
    return dict(sorted(c.items(), key=lambda kv: (-kv[1], kv[0])))


def summarize_model(om: Any) -> dict[str, Any]:
    """The summary of an :class:`~torchless.formats.onnx.read.OnnxModel`."""
    m = om.model
    g = m.graph
    init_names = {text(t.name) for t in g.initializer}
    producer = " ".join(text(x) for x in (m.producer_name, m.producer_version) if x)
    inits = [r for r in om.records if r.kind == "initializer"]
    consts = [r for r in om.records if r.kind == "constant"]
    ext_files: dict[str, dict[str, int]] = {}
    inline = 0
    for r in om.records:
        if r.external is not None:
            e = ext_files.setdefault(r.external.location, {"tensors": 0, "bytes": 0})
            e["tensors"] += 1
            e["bytes"] += r.external.length
        else:
            inline += r.tensor.nbytes
    out: dict[str, Any] = {
        "format": "onnx",
        "path": om.path,
        "ir_version": m.ir_version,
        "opsets": {(text(o.domain) or "ai.onnx"): o.version for o in m.opset_import},
        "producer": producer or None,
        "domain": text(m.domain) or None,
        "model_version": m.model_version,
        "graph": text(g.name),
        "doc_string": (text(m.doc_string)[:_DOC_MAX] + ("..." if len(m.doc_string) > _DOC_MAX else "")) or None,
        "nodes": len(g.node),
        "nodes_total": sum(op_histogram(g).values()),
        "initializers": len(inits),
        "initializer_bytes": sum(r.tensor.nbytes for r in inits),
        "constants": len(consts),
        "external_bytes": sum(e["bytes"] for e in ext_files.values()),
        "inline_bytes": inline,
        **summarize_tensors(om.tensors()),
        "inputs": [value_info(v) for v in g.input if text(v.name) not in init_names],
        "outputs": [value_info(v) for v in g.output],
        "ops": op_histogram(g),
    }
    for k in ("producer", "domain", "doc_string"):
        if out[k] is None:
            del out[k]
    if not out["model_version"]:
        del out["model_version"]
    if len(g.input) != len(out["inputs"]):
        out["initializers_as_inputs"] = len(g.input) - len(out["inputs"])
    if om.subgraphs:
        out["subgraphs"] = om.subgraphs
    if m.functions:
        out["functions"] = [
            {"name": text(f.name), "domain": text(f.domain), "nodes": len(f.node), "ops": op_histogram(f, recurse=False)}
            for f in m.functions
        ]
    if ext_files:
        out["external_data"] = ext_files
    if m.metadata_props:
        out["metadata"] = {text(p.key): text(p.value) for p in m.metadata_props}
    if om.sparse:
        out["sparse_initializers"] = [{"scope": s, "name": n, "dims": list(d)} for s, n, d in om.sparse]
    if om.unsupported:
        out["unsupported_tensors"] = {k: e.message for k, e in om.unsupported.items()}
    if om.skipped_constants:
        out["non_numeric_constants"] = [f"{n} ({a})" for n, a in om.skipped_constants]
    return out
