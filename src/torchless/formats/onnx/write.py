"""Replacing an ONNX model's initializers with new weights (``set_weights``).

The workflow is "fine-tuned in PyTorch, deployed as ONNX": export once, then copy new
weights from a state dict (``.pt``, ``.safetensors``, ``.npz`` or a dict of arrays) into
the initializers with the same names. Shapes and dtypes must match exactly: the graph
was traced for them.

The output is written atomically. With external data (on request, when the source model
used it, or when the tensors exceed :data:`AUTO_EXTERNAL_BYTES`), every tensor larger
than ``size_threshold`` bytes goes to ``<output file name>.data`` beside the model (the
name ``torch.onnx.export`` uses), back to back at 64-byte aligned offsets; the data file
is committed before the model. Tensors the source kept in external data are copied from
their memory map without an intermediate copy.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from ...core.errors import LimitError, UnsupportedError, UsageError
from ...core.tensor import as_tensor
from ...io.atomic import AtomicFile, publish
from ..weights import WeightMatch, match_weights, weight_items
from .dtypes import PackedTensor, numel_of, onnx_type, pack_bits
from .read import EXTERNAL, PROTOBUF_LIMIT, ExternalData, OnnxModel, text

__all__ = [
    "AUTO_EXTERNAL_BYTES",
    "DirectShares",
    "data_file_for",
    "directly_shared",
    "set_weights",
    "writes_data_file",
    "shared_initializers",
    "transformed_initializers",
]

#: tensors above this total force external data (torch's ``_LARGE_MODEL_THRESHOLD``,
#: 1536 MiB, leaves room below protobuf's 2 GiB for the graph itself).
AUTO_EXTERNAL_BYTES = 1536 * 1024 * 1024

_ALIGN = 64


def data_file_for(out: Any) -> str:
    """The external-data file :func:`set_weights` writes for the model ``out``:
    ``<out name>.data`` beside it, spelled as ``out`` was given."""
    out = os.fspath(out)
    return os.path.join(os.path.dirname(out), os.path.basename(out) + ".data")


def writes_data_file(model: Any, external_data: bool | None) -> bool:
    """Whether :func:`set_weights` of the ``.onnx`` ``model`` writes :func:`data_file_for`
    its output: ``external_data`` when given; when None, whether the source used external
    data or its tensors exceed :data:`AUTO_EXTERNAL_BYTES` (the source is opened)."""
    if external_data is not None:
        return external_data
    om = OnnxModel(model, include_constants=False)
    try:
        return _external_by_default(om)
    finally:
        om.close()


def _external_by_default(om: OnnxModel) -> bool:
    used_external = any(tp.data_location == EXTERNAL for tp in _all_tensor_protos(om.model))
    return used_external or sum(r.tensor.nbytes for r in om.records) > AUTO_EXTERNAL_BYTES


_DATA_FIELDS = (
    "raw_data",
    "float_data",
    "int32_data",
    "string_data",
    "int64_data",
    "double_data",
    "uint64_data",
    "external_data",
)


def _new_bytes(name: str, value: Any, rec: Any) -> Any:
    """Check ``value`` against the initializer ``rec`` and return its little-endian bytes."""
    if isinstance(value, PackedTensor):
        got_dtype, shape = value.dtype.name, value.shape
    elif isinstance(value, np.ndarray) and rec.onnx.packed and value.dtype == rec.onnx.element:
        got_dtype, shape = rec.tensor.dtype.name, value.shape  # int4/uint4/float4 elements, packed below
    else:
        value = as_tensor(value, name=name)  # the writers' one coercion
        got_dtype, shape = value.dtype.name, value.shape
        if value.quantizer is not None:
            raise UnsupportedError("quantized tensors cannot replace ONNX initializers", member=name, hint="dequantize first")
    want_dtype = rec.tensor.dtype.name
    if got_dtype != want_dtype:
        raise UsageError(
            f"dtype mismatch for initializer {name!r}",
            member=name,
            expected=want_dtype,
            found=got_dtype,
            hint="cast the weights before exporting them",
        )
    if tuple(shape) != tuple(rec.dims):
        raise UsageError(f"shape mismatch for initializer {name!r}", member=name, expected=list(rec.dims), found=list(shape))
    if rec.onnx.packed:
        if isinstance(value, PackedTensor):
            return value.numpy(raw=True)
        return pack_bits(np.asarray(value).view(np.uint8), rec.onnx.bits)
    from ..safetensors import _tensor_chunks  # contiguous little-endian chunks, zero copy when possible

    _n, chunks = _tensor_chunks(value)
    return chunks[0] if len(chunks) == 1 else b"".join(bytes(c) for c in chunks)


def _all_tensor_protos(model: Any, *, skip_main_initializers: bool = False) -> Iterable[Any]:
    """Every TensorProto of the model that may hold data (graphs, nodes, functions)."""

    def from_nodes(nodes: Any, depth: int) -> Iterable[Any]:
        for n in nodes:
            for a in n.attribute:
                if a.type == 4:
                    yield a.t
                elif a.type == 9:
                    yield from a.tensors
                elif a.type == 11:
                    yield a.sparse_tensor.values
                    yield a.sparse_tensor.indices
                elif a.type == 5 and depth < 64:
                    yield from from_graph(a.g, depth + 1)
                elif a.type == 10 and depth < 64:
                    for g in a.graphs:
                        yield from from_graph(g, depth + 1)

    def from_graph(g: Any, depth: int) -> Iterable[Any]:
        if not (skip_main_initializers and depth == 0):
            yield from g.initializer
        for sp in g.sparse_initializer:
            yield sp.values
            yield sp.indices
        yield from from_nodes(g.node, depth)

    yield from from_graph(model.graph, 0)
    for f in model.functions:
        yield from from_nodes(f.node, 1)


def shared_initializers(graph: Any, initializers: set[str]) -> dict[str, tuple[str, int]]:
    """``{name: (initializer, node index)}`` for the main graph's ``Identity`` nodes that
    give an initializer another name (chains resolved to the initializer).

    torch's TorchScript exporter merges initializers of equal values into one and names
    the others through ``Identity`` (a fresh BatchNorm's ``running_mean`` becomes
    ``Identity(bn.bias)``, its ``running_var`` ``Identity(bn.weight)``); replacing the
    initializer then would change every name that reads it.
    """
    out: dict[str, tuple[str, int]] = {}
    for i, node in enumerate(graph.node):
        if node.op_type != "Identity" or node.domain not in ("", "ai.onnx") or len(node.input) != 1 or len(node.output) != 1:
            continue
        src, dst = text(node.input[0]), text(node.output[0])
        root = src if src in initializers else out[src][0] if src in out else None
        if root is not None and dst and dst not in initializers and dst not in out:
            out[dst] = (root, i)
    return out


def _unshare(mp: Any, aliases: dict[str, tuple[str, int]], edited: set[str]) -> None:
    """Give every name of a shared initializer its own initializer where any of them gets
    a new weight: a copy of the initializer (its data, inline or external) under the
    ``Identity`` node's output name, and the node removed, so the names' consumers read
    their own tensor and a new weight changes only its own name."""
    groups: dict[str, list[str]] = {}
    for a, (root, _i) in aliases.items():
        groups.setdefault(root, []).append(a)
    touched = {root: names for root, names in groups.items() if edited & {root, *names}}
    if not touched:
        return
    snapshots = {}
    for tp in mp.graph.initializer:
        n = text(tp.name)
        if n in touched:
            snapshots[n] = type(tp)()
            snapshots[n].CopyFrom(tp)
    drop = []
    for root, names in touched.items():
        for a in names:
            tp = mp.graph.initializer.add()
            tp.CopyFrom(snapshots[root])
            tp.name = a
            drop.append(aliases[a][1])
    for i in sorted(drop, reverse=True):
        del mp.graph.node[i]


#: node metadata torch's dynamo exporter records: the FX node a node comes from (its text
#: names the parameters and buffers the node reads as ``%p_<name>`` / ``%b_<name>``)
FX_NODE_KEY = "pkg.torch.onnx.fx_node"
_PLACEHOLDER = re.compile(r"%([pb]_\w+)")


def _mangled(name: str) -> set[str]:
    """The placeholder names torch.export gives parameter / buffer ``name``."""
    flat = re.sub(r"[^0-9A-Za-z_]", "_", name)
    return {f"p_{flat}", f"b_{flat}"}


def directly_shared(graph: Any, initializers: dict[str, tuple[int, ...]], weights: dict[str, tuple[int, ...]]) -> DirectShares:
    """Initializers the model reads for other parameters too, with no ``Identity``
    between: torch's dynamo exporter merges initializers of equal values and points every
    consumer at one of them. A node's FX text (``pkg.torch.onnx.fx_node``) still names the
    parameters it read (``%p_b_weight``): a node that reads initializer ``I`` while its FX
    text names parameters but not ``I`` reads it for another parameter (a foreign use).
    A weight ``W`` (not an initializer) is recovered for such a use when the node's FX
    text names ``W``, ``W`` and ``I`` have the same last name part and shape, and exactly
    one weight fits.
    """
    out = DirectShares()
    by_mangled: dict[str, list[str]] = {}
    for w in weights:
        if w not in initializers:
            for m in _mangled(w):
                by_mangled.setdefault(m, []).append(w)
    for i, node in enumerate(graph.node):
        fx = next((p.value for p in node.metadata_props if p.key == FX_NODE_KEY), None)
        if fx is None:
            continue
        read = set(_PLACEHOLDER.findall(fx))
        if not read:
            continue
        wanted = {w for m in read for w in by_mangled.get(m, ())}
        out.named |= wanted
        for slot, inp in enumerate(node.input):
            name = text(inp)
            if name not in initializers or read & _mangled(name):
                continue
            out.foreign.setdefault(name, []).append((i, slot))
            leaf = name.rsplit(".", 1)[-1]
            fits = [w for w in wanted if w.rsplit(".", 1)[-1] == leaf and tuple(weights[w]) == initializers[name]]
            if len(fits) == 1 and out.recovered.setdefault(fits[0], name) == name:
                out.use_of[(i, slot)] = fits[0]
    out.named -= set(out.recovered)
    return out


class DirectShares:
    """What :func:`directly_shared` found: ``foreign`` {initializer: [(node index, input
    slot)]} read for another parameter; ``recovered`` {weight: the initializer it reads};
    ``use_of`` {(node index, input slot): recovered weight}; ``named``: weights some
    node's FX text names that were not recovered (which initializer holds them cannot be
    told)."""

    def __init__(self) -> None:
        self.foreign: dict[str, list[tuple[int, int]]] = {}
        self.recovered: dict[str, str] = {}
        self.use_of: dict[tuple[int, int], str] = {}
        self.named: set[str] = set()


def _unshare_direct(mp: Any, shares: DirectShares, edited: set[str]) -> None:
    """Where a shared initializer or a weight recovered for it gets a new value: each
    foreign use reads its own copy of the initializer (under the recovered weight's name,
    else a new name: its parameter keeps the old value), so a new weight changes only its
    own parameter."""
    touched = {root for root in shares.foreign if root in edited or any(shares.recovered.get(w) == root for w in edited)}
    if not touched:
        return
    snapshots = {}
    for tp in mp.graph.initializer:
        n = text(tp.name)
        if n in touched:
            snapshots[n] = type(tp)()
            snapshots[n].CopyFrom(tp)
    taken = {text(tp.name) for tp in mp.graph.initializer}
    for root in sorted(touched):
        made: dict[str, str] = {}
        for i, slot in shares.foreign[root]:
            w = shares.use_of.get((i, slot))
            if w is None:  # a parameter whose name was not recovered: a copy of its old value
                w = f"{root}.unshared_{i}_{slot}"
                while w in taken:
                    w += "_"
            if w not in made:
                tp = mp.graph.initializer.add()
                tp.CopyFrom(snapshots[root])
                tp.name = w
                made[w] = w
                taken.add(w)
            mp.graph.node[i].input[slot] = w


#: node metadata the ONNX exporter's optimizer (onnxscript rewriter) leaves on rewritten nodes
REWRITE_RULE_KEY = "pkg.onnxscript.rewriter.rule_name"
_ANONYMOUS = re.compile(r"^(val_\d+|_val_\d+|onnx::.+|_?v_\d+)$")


def transformed_initializers(
    model: Any, replaced: set[str], unmatched: dict[str, tuple[int, ...]], weight_names: set[str]
) -> list[str]:
    """Why replacing initializers by name would give a wrong model (empty: it would not).

    * an initializer read by a node that the exporter's optimizer rewrote (node metadata
      ``pkg.onnxscript.rewriter.rule_name``, e.g. ``FuseBatchNormIntoConv``) holds values
      the rewrite computed (a convolution with a BatchNorm folded in keeps the name
      ``conv1.weight``);
    * BatchNorm statistics (``X.running_mean``/``X.running_var``) among the weights, while
      the model has neither such initializers nor a BatchNormalization node: the exporter
      folded that BatchNorm into the layer before it;
    * a weight that names no initializer while an anonymous initializer (``val_N``,
      ``onnx::...``) has its shape: the exporter renamed (and maybe transformed) it.
    """
    g = model.graph
    problems: list[str] = []
    for node in g.node:
        rule = next((p.value for p in node.metadata_props if p.key == REWRITE_RULE_KEY), None)
        if rule is None:
            continue
        for name in node.input:
            if name in replaced:
                problems.append(
                    f"initializer {name!r} is read by node {node.name or node.op_type!r}, which the exporter's {rule} "
                    f"rewrite produced, so it holds computed values, not the module's {name}"
                )
    inits = {text(t.name): tuple(t.dims) for t in g.initializer}
    has_bn = any(n.op_type == "BatchNormalization" for n in g.node)
    for w in sorted(weight_names):
        if w.endswith(".running_mean"):
            prefix = w[: -len(".running_mean")]
            if prefix + ".running_var" in weight_names and w not in inits and not has_bn:
                problems.append(
                    f"the weights hold BatchNorm {prefix!r} but the model has no BatchNormalization and no {w!r}: the "
                    "exporter folded it into the layer before it"
                )
    floats = {1, 10, 11, 16}  # FLOAT, FLOAT16, DOUBLE, BFLOAT16: weights, not shape/axes constants
    anonymous = {text(t.name): tuple(t.dims) for t in g.initializer if _ANONYMOUS.match(text(t.name)) and t.data_type in floats}
    for w, shape in sorted(unmatched.items()):
        same = [n for n, d in anonymous.items() if d == tuple(shape) and len(shape) > 0]
        if same:
            problems.append(
                f"weight {w!r} {list(shape)} names no initializer, and anonymous initializer(s) {', '.join(same[:3])} "
                "have its shape: the exporter renamed it"
            )
    return problems


def set_weights(
    model: Any,
    weights: Any,
    out: Any,
    *,
    external_data: bool | None = None,
    size_threshold: int = 256,
    allow_missing: bool = False,
    strip_prefix: str = "",
    progress: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """Write a copy of ONNX ``model`` whose initializers hold ``weights``.

    Args:
        model: the source ``.onnx`` path.
        weights: a path (any format torchless reads: ``.pt``, ``.safetensors``, ``.npz``
            ...), a mapping ``name -> Tensor | ndarray`` or ``(name, tensor)`` pairs.
        out: the new model path (may equal ``model``).
        external_data: True to write ``<out name>.data``; False to keep everything in the
            model file; None (default) keeps external data when the source used it or the
            tensors exceed 1.5 GiB.
        size_threshold: with external data, tensors of at most this many bytes stay inline.
        allow_missing: ignore weights that name no initializer (else UsageError).
        strip_prefix: remove this prefix from weight names first (``"model."``).
        progress: called with the byte count of each tensor written.

    Returns:
        ``{"replaced": [...], "kept": [...], "ignored": [...], "output": out,
        "data_file": path or None, "bytes": n}``.

    Raises:
        UsageError: a weight's shape or dtype differs from the initializer's; no
            initializer would be replaced; or the exporter folded or renamed initializers
            (see :func:`transformed_initializers`), so replacing by name would give a model
            that computes something else (refused even with ``allow_missing``).
        NotFoundError: a weight names no initializer (without ``allow_missing``).
        LimitError: the model would exceed 2 GiB without external data.

    Example:
        >>> set_weights("model.onnx", "finetuned.safetensors", "new.onnx")  # doctest: +SKIP
    """
    om = OnnxModel(model, include_constants=False)
    try:
        return _set_weights(om, weights, os.fspath(out), external_data, size_threshold, allow_missing, strip_prefix, progress)
    finally:
        om.close()


def _set_weights(
    om: OnnxModel,
    weights: Any,
    out: str,
    external_data: bool | None,
    size_threshold: int,
    allow_missing: bool,
    strip_prefix: str,
    progress: Any,
) -> dict[str, Any]:
    items, art = weight_items(weights)
    try:
        return _write(om, items, out, external_data, size_threshold, allow_missing, strip_prefix, progress)
    finally:
        if art is not None:
            art.close()


def _write(
    om: OnnxModel,
    items: list[tuple[str, Any]],
    out: str,
    external_data: bool | None,
    size_threshold: int,
    allow_missing: bool,
    strip_prefix: str,
    progress: Any,
) -> dict[str, Any]:
    mp = om.model
    main = {r.proto_name: r for r in om.records if r.kind == "initializer" and r.scope == ""}
    # names the exporter made Identity copies of one initializer (it merges equal ones):
    # each may be given its own weight, checked against the initializer it reads
    aliases = shared_initializers(mp.graph, set(main))
    targets = {**main, **{a: main[root] for a, (root, _i) in aliases.items()}}
    # names the dynamo exporter merged into one initializer without Identity
    given = {(n[len(strip_prefix) :] if strip_prefix and n.startswith(strip_prefix) else n): v for n, v in items}
    direct = directly_shared(
        mp.graph,
        {n: tuple(int(d) for d in main[n].dims) for n in main},
        {n: tuple(getattr(v, "shape", ())) for n, v in given.items() if n not in targets},
    )
    targets.update({w: main[root] for w, root in direct.recovered.items()})
    new: dict[str, Any] = {}

    def check(m: WeightMatch) -> None:
        for key, value in m.matched:
            new[key] = _new_bytes(key, value, targets[key])
        shapes = m.shapes
        problems = transformed_initializers(mp, set(new), {k: shapes[k] for k in m.ignored if k in shapes}, set(shapes))
        problems += [
            f"weight {w!r} is read by the model through an initializer merged with other parameters' "
            "(the exporter deduplicated equal values), and which one cannot be recovered"
            for w in sorted(direct.named)
        ]
        if problems:
            shown = "; ".join(problems[:3]) + (f"; and {len(problems) - 3} more" if len(problems) > 3 else "")
            raise UsageError(
                "refusing to write a model that would compute something else: the exporter "
                f"transformed initializers, so weights cannot be matched by name ({shown})",
                path=om.path,
                hint=(
                    "export the model again from the module holding these weights (torch.onnx.export), "
                    "or export with optimize=False so each parameter stays its own initializer"
                ),
            )

    # no weights at all is allowed: a re-layout, e.g. to or from external data
    ignored = match_weights(
        items, targets, strip_prefix=strip_prefix, allow_missing=allow_missing, what="initializer", path=om.path, check=check
    ).ignored
    _unshare(mp, aliases, set(new))
    _unshare_direct(mp, direct, set(new))
    # every tensor's bytes: replaced, or the source's (from the model or its data file)
    src_ext = ExternalData(om.external.base_dir, om.path, om.external.store)
    if external_data is None:
        external_data = _external_by_default(om)
    plan: list[tuple[Any, Any]] = []
    for tp in mp.graph.initializer:
        if text(tp.name) in new:
            plan.append((tp, new[text(tp.name)]))
        elif tp.data_location == EXTERNAL or (external_data and tp.HasField("raw_data")):
            plan.append((tp, None))
    for tp in _all_tensor_protos(mp, skip_main_initializers=True):
        if tp.data_location == EXTERNAL or (external_data and tp.HasField("raw_data")):
            plan.append((tp, None))

    def source_bytes(tp: Any) -> Any:
        if tp.data_location != EXTERNAL:
            return tp.raw_data
        ot = onnx_type(tp.data_type, what=text(tp.name), path=om.path)
        return src_ext.view(src_ext.ref(tp, text(tp.name), ot.nbytes(numel_of(tp.dims))))

    data_path = data_file_for(out)
    data_name = os.path.basename(data_path)
    data_file = None
    written = 0
    try:
        if external_data:
            data_file = AtomicFile(data_path)
        pos = 0
        for tp, data in plan:
            mv = memoryview(source_bytes(tp) if data is None else data).cast("B")
            for f in _DATA_FIELDS:
                tp.ClearField(f)
            if data_file is not None and len(mv) > size_threshold:
                pad = (-pos) % _ALIGN
                if pad:
                    data_file.file.write(b"\0" * pad)
                    pos += pad
                data_file.file.write(mv)
                tp.data_location = EXTERNAL
                for k, v in (("location", data_name), ("offset", str(pos)), ("length", str(len(mv)))):
                    e = tp.external_data.add()
                    e.key, e.value = k, v
                pos += len(mv)
            else:
                tp.data_location = 0
                tp.raw_data = bytes(mv)
            written += len(mv)
            if progress is not None:
                progress(len(mv))
        size = mp.ByteSize()
        if size > PROTOBUF_LIMIT:
            raise LimitError(
                "the model would exceed protobuf's 2 GiB limit",
                path=out,
                expected=f"<= {PROTOBUF_LIMIT} bytes",
                found=size,
                hint="write the tensors to external data (--external-data)",
            )
        model_file = AtomicFile(out)
        try:
            model_file.file.write(mp.SerializeToString())
        except BaseException:
            model_file.abort()
            raise
        publish([data_file, model_file] if data_file is not None else [model_file])  # data first, then the model naming it
    except BaseException:
        if data_file is not None:
            data_file.abort()
        raise
    finally:
        src_ext.close()
    return {
        "output": out,
        "data_file": data_path if data_file is not None else None,
        "replaced": sorted(new),
        "kept": sorted(n for n in targets if n not in new),
        "ignored": ignored,
        "bytes": written,
    }


STACK_TRACE_KEY = "pkg.torch.onnx.stack_trace"


def strip_stack_traces(path: str) -> int:
    """Remove the per-node stack traces torch's exporter records, in place (atomically).

    They hold absolute source paths of the machine that exported the model; a model
    meant to be shared or committed usually should not. External data references are
    kept as they are (the data file is not touched).

    Returns:
        The number of metadata entries removed.
    """
    from .read import import_onnx

    onnx = import_onnx()
    model = onnx.load(path, load_external_data=False)
    removed = 0

    def walk(graph: Any) -> None:
        nonlocal removed
        for node in graph.node:
            keep = [p for p in node.metadata_props if p.key != STACK_TRACE_KEY]
            if len(keep) != len(node.metadata_props):
                removed += len(node.metadata_props) - len(keep)
                del node.metadata_props[:]
                node.metadata_props.extend(keep)
            for attr in node.attribute:
                if attr.HasField("g"):
                    walk(attr.g)
                for g in attr.graphs:
                    walk(g)

    walk(model.graph)
    for fn in model.functions:
        for node in fn.node:
            keep = [p for p in node.metadata_props if p.key != STACK_TRACE_KEY]
            removed += len(node.metadata_props) - len(keep)
            del node.metadata_props[:]
            node.metadata_props.extend(keep)
    if removed:
        with AtomicFile(path) as f:
            f.file.write(model.SerializeToString())
    return removed
