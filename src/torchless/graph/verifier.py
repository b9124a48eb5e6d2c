"""An ATen-IR verifier in the spirit of ``torch/_export/verifier.py``, on torchless's IR.

:func:`verify_graph` checks a graph (and its subgraphs) for the dialect it claims:

* structure (:meth:`Graph.lint`) and opcodes: only ``placeholder``, ``get_attr``,
  ``call_function`` and ``output``;
* targets: ATen overloads, higher-order ops (``aten_ir.md`` §4) and the Python operators
  symbolic shapes use (``operator.add``, ``math.trunc``, ``torch.sym_max``...);
* ``ATEN`` dialect (``run_decompositions()`` output): every ATen target is functional (no
  in-place ``add_`` or ``out=`` variants: errors, as in torch) and in the core opset
  (``core_aten_ops.txt``): non-core ops are warnings, errors with ``strict_core=True``
  (torch's own verifier accepts functional non-core ops);
* ``TRAINING`` dialect (``torch.export.export`` output): non-core and mutating ops are
  allowed, as torch's ``TrainingIRVerifier`` allows them; they are reported as ``info``
  so you know what ``run_decompositions()`` will lower;
* value metadata (``meta["val"]``) on every placeholder and operator result;
* arguments bind to the operator schema (known names, positional count, required
  arguments, and tensor arguments that receive tensors).

:func:`verify_program` adds the signature checks: one input spec per placeholder in
order, every output spec naming the value the graph returns, parameters and buffers present
in the state dict, constants present among the constants, mutations naming real targets.

Findings are :class:`~torchless.container.zip.Problem` with severity ``error``,
``warning`` or ``info``; a program torch's verifier accepts yields no errors.
"""

from __future__ import annotations

from typing import Any

from ..core.errors import FormatError, TorchlessError
from ..core.findings import Problem
from .ir import Graph, Node, OpRef, SymValue, TensorValue, iter_nodes
from .schema import OpSchema, base_of, registry

__all__ = ["HIGHER_ORDER_OPS", "SYMBOLIC_OPS", "verify_graph", "verify_program", "non_core_ops"]

#: HigherOrderOperators registered in torch 2.13 (aten_ir.md §4).
HIGHER_ORDER_OPS = frozenset(
    [
        "_export_tracepoint",
        "aoti_call_delegate",
        "associative_scan",
        "auto_functionalized",
        "auto_functionalized_v2",
        "autograd_function_apply",
        "call_torchbind",
        "cond",
        "custom_function_call",
        "dynamo_bypassing_wrapper",
        "executorch_call_delegate",
        "flat_apply",
        "flex_attention",
        "flex_attention_backward",
        "foreach_map",
        "graphsafe_run_with_rng_state",
        "hints_wrapper",
        "inductor_compiled_code",
        "inline_asm_elementwise",
        "invoke_leaf_function",
        "invoke_quant",
        "invoke_quant_packed",
        "invoke_subgraph",
        "local_map_hop",
        "map_impl",
        "out_dtype",
        "print",
        "run_and_save_rng_state",
        "run_const_graph",
        "run_dtensor_rng_op",
        "run_with_rng_state",
        "scan",
        "strict_mode",
        "tag_activation_checkpoint",
        "while_loop",
        "while_loop_stack_output",
        "with_effects",
        "wrap",
        "wrap_activation_checkpoint",
        "wrap_with_autocast",
        "wrap_with_set_grad_enabled",
    ]
)

#: Python-level callables allowed in export graphs (torch's ``_allowed_builtin_ops`` and
#: ``_SYM_OPS``): symbolic shape arithmetic and tuple indexing.
SYMBOLIC_OPS = frozenset(
    [
        f"_operator.{n}"
        for n in [
            "getitem",
            "add",
            "mul",
            "sub",
            "truediv",
            "ge",
            "le",
            "gt",
            "lt",
            "eq",
            "ne",
            "floordiv",
            "mod",
            "and_",
            "or_",
            "not_",
            "pow",
            "neg",
            "abs",
            "lshift",
            "rshift",
            "pos",
        ]
    ]
    + [
        "math.ceil",
        "math.floor",
        "math.trunc",
        "builtins.round",
        "torch.sym_int",
        "torch.sym_float",
        "torch.sym_ite",
        "torch.sym_max",
        "torch.sym_min",
        "torch.sym_not",
        "torch.sym_sqrt",
        "torch.sym_sum",
        "torch._sym_sqrt",
        "torch.sym_float",
    ]
)

_ALLOWED_OPCODES = ("placeholder", "get_attr", "call_function", "output")


def _op_key(t: Any) -> str:
    return t.key if isinstance(t, OpRef) else str(t)


def _check_args(n: Node, schema: OpSchema, where: str, out: list[Problem]) -> None:
    try:
        bound = schema.bind(n.args, n.kwargs)
    except FormatError as e:
        out.append(Problem("bad-arguments", e.message, where))
        return
    for name, v in bound.items():
        a = schema.argument(name)
        if a is None:
            continue
        base = base_of(a.type).name
        if base == "Tensor" and type(a.type).__name__ == "BaseType":
            if not isinstance(v, (Node, int, float, complex)):  # numbers are wrapped, as in torch
                out.append(
                    Problem("bad-arguments", f"argument {name!r} of {schema.key} must be a tensor, got {type(v).__name__}", where)
                )
            elif (
                isinstance(v, Node)
                and v.op != "get_attr"
                and v.meta.get("val") is not None
                # a symbolic scalar is wrapped as a number is (torch.export emits
                # aten.add.Tensor(x, sym_size) for `x + x.shape[0]`)
                and not isinstance(v.meta.get("val"), (TensorValue, SymValue))
            ):
                out.append(
                    Problem(
                        "bad-arguments",
                        f"argument {name!r} of {schema.key} must be a tensor, got "
                        f"{v.name!r} ({type(v.meta.get('val')).__name__})",
                        where,
                    )
                )
        elif base in ("int", "SymInt") and type(a.type).__name__ == "BaseType":
            ok = (isinstance(v, int) and not isinstance(v, bool)) or (
                isinstance(v, Node) and isinstance(v.meta.get("val"), (SymValue, int))
            )
            if not ok:
                out.append(
                    Problem("bad-arguments", f"argument {name!r} of {schema.key} must be an int, got {type(v).__name__}", where)
                )


def verify_graph(graph: Graph, dialect: str = "ATEN", *, where: str = "", strict_core: bool = False) -> list[Problem]:
    """Check ``graph`` and its subgraphs for ``dialect`` (``"ATEN"`` or ``"TRAINING"``).

    Args:
        strict_core: in the ATEN dialect, make non-core ATen ops errors. torch's verifier
            accepts functional non-core ops (e.g. ops kept out of ``run_decompositions()``),
            so by default they are warnings.

    Returns:
        the problems found (empty: valid).
    """
    out: list[Problem] = []
    try:
        graph.lint()
    except TorchlessError as e:
        out.append(Problem("graph-structure", str(e), where or None))
    reg = registry()
    strict = dialect == "ATEN"
    for path, g in graph.walk():
        prefix = f"{where}:{path}" if where and path else (where or path)
        for n in g.nodes:
            at = f"{prefix}:{n.name}" if prefix else n.name
            if n.op not in _ALLOWED_OPCODES:
                out.append(Problem("bad-opcode", f"opcode {n.op!r} is not allowed in an exported graph", at))
                continue
            if n.op == "placeholder":
                if "val" not in n.meta:
                    out.append(Problem("missing-metadata", f"placeholder {n.name!r} has no value metadata (meta['val'])", at))
                continue
            if n.op != "call_function":
                continue
            t = n.target
            key = _op_key(t)
            if isinstance(t, OpRef) and t.is_hop:
                if t.op_name not in HIGHER_ORDER_OPS:
                    out.append(Problem("unknown-hop", f"unknown higher-order operator {key!r}", at, None, "warning"))
                for sub in iter_nodes((n.args, n.kwargs)):
                    if sub.op == "get_attr" and sub.target not in g.subgraphs and sub.target not in g.attributes:
                        out.append(Problem("missing-subgraph", f"{key} refers to missing subgraph {sub.target!r}", at))
            elif isinstance(t, OpRef) and t.is_torch_op:
                schema = reg.find(key)
                if schema is None:
                    if t.namespace == "aten":
                        out.append(Problem("unknown-op", f"{key} is not an ATen operator overload torch 2.13 has", at))
                    elif strict:
                        out.append(Problem("custom-op", f"non-ATen operator {key} (custom op)", at, None, "warning"))
                else:
                    if schema.is_out:
                        out.append(
                            Problem(
                                "out-variant",
                                f"{key} is an out= variant; exported graphs are functional",
                                at,
                                None,
                                "error" if strict else "info",
                            )
                        )
                    elif schema.is_mutating:
                        out.append(
                            Problem(
                                "inplace-op",
                                f"{key} mutates its inputs; exported graphs are functional",
                                at,
                                None,
                                "error" if strict else "info",
                            )
                        )
                    if not reg.is_core(key) and not schema.is_out and not schema.is_mutating:
                        out.append(
                            Problem(
                                "non-core-op",
                                f"{key} is not in the core ATen opset"
                                + ("" if strict else " (training IR; run_decompositions() lowers it)"),
                                at,
                                None,
                                ("error" if strict_core else "warning") if strict else "info",
                            )
                        )
                    _check_args(n, schema, at, out)
            elif key not in SYMBOLIC_OPS:
                out.append(
                    Problem(
                        "bad-target",
                        f"call_function target {key!r} is neither an operator "
                        "overload, a higher-order op nor an allowed Python operator",
                        at,
                    )
                )
            if "val" not in n.meta:
                out.append(Problem("missing-metadata", f"node {n.name!r} ({key}) has no value metadata (meta['val'])", at))
    return out


def non_core_ops(graph: Graph) -> dict[str, int]:
    """ATen overloads outside the core opset, with their counts (subgraphs included)."""
    reg = registry()
    hist: dict[str, int] = {}
    for _p, g in graph.walk():
        for n in g.nodes:
            if (
                n.op == "call_function"
                and isinstance(n.target, OpRef)
                and n.target.is_torch_op
                and not n.target.is_hop
                and not reg.is_core(n.target.key)
            ):
                hist[n.target.key] = hist.get(n.target.key, 0) + 1
    return dict(sorted(hist.items()))


def verify_program(prog: Any, *, where: str = "", strict_core: bool = False) -> list[Problem]:
    """Verify an exported program: its graph for its dialect, then its signature.

    ``prog`` needs ``graph``, ``signature`` (``input_specs``/``output_specs`` with
    ``kind``, ``arg``, ``target``), ``state_dict``, ``constants`` and ``dialect``.
    """
    out = verify_graph(prog.graph, prog.dialect, where=where, strict_core=strict_core)
    g: Graph = prog.graph
    ph = [n.name for n in g.placeholders]
    specs = list(prog.signature.input_specs)
    if len(specs) != len(ph):
        out.append(
            Problem(
                "signature", f"signature has {len(specs)} input specs but the graph has {len(ph)} placeholders", where or None
            )
        )
    for i, s in enumerate(specs):
        if s.arg is not None and s.arg not in ph:
            out.append(Problem("dangling-signature", f"input spec {s.kind} {s.arg!r} names no placeholder", where or None))
        elif s.arg is not None and i < len(ph) and ph[i] != s.arg:
            out.append(Problem("signature", f"input spec {i} is {s.arg!r} but placeholder {i} is {ph[i]!r}", where or None))
        if s.kind in ("PARAMETER",) or (s.kind == "BUFFER" and s.persistent is not False):
            if s.target not in prog.state_dict:
                out.append(
                    Problem("dangling-signature", f"{s.kind.lower()} {s.target!r} is not in the state dict", where or None)
                )
        elif (s.kind == "BUFFER" or s.kind in ("CONSTANT_TENSOR", "CUSTOM_OBJ")) and (
            s.target not in prog.constants and s.target not in prog.state_dict
        ):
            out.append(Problem("dangling-signature", f"{s.kind.lower()} {s.target!r} is not among the constants", where or None))
    out_node = g.output_node
    if out_node is not None:
        ov = out_node.args[0] if out_node.args else ()
        vals = list(ov) if isinstance(ov, (tuple, list)) else [ov]
        names = [v.name if isinstance(v, Node) else None for v in vals]
        ospecs = list(prog.signature.output_specs)
        if len(ospecs) != len(names):
            out.append(
                Problem(
                    "signature",
                    f"signature has {len(ospecs)} output specs but the graph returns {len(names)} values",
                    where or None,
                )
            )
        for i, s in enumerate(ospecs):
            if s.arg is not None and s.arg not in names:
                out.append(Problem("dangling-signature", f"output spec {s.kind} {s.arg!r} is not a graph output", where or None))
            elif i < len(names) and s.arg is not None and names[i] != s.arg:
                out.append(Problem("signature", f"output spec {i} is {s.arg!r} but output {i} is {names[i]!r}", where or None))
        targets = {(s.kind, s.target) for s in specs}
        for s in ospecs:
            if s.kind == "BUFFER_MUTATION" and ("BUFFER", s.target) not in targets:
                out.append(Problem("dangling-signature", f"buffer mutation of unknown buffer {s.target!r}", where or None))
            if s.kind in ("PARAMETER_MUTATION", "GRADIENT_TO_PARAMETER") and ("PARAMETER", s.target) not in targets:
                out.append(Problem("dangling-signature", f"{s.kind.lower()} names unknown parameter {s.target!r}", where or None))
            if s.kind in ("USER_INPUT_MUTATION", "GRADIENT_TO_USER_INPUT") and s.target not in ph:
                out.append(
                    Problem("dangling-signature", f"{s.kind.lower()} names unknown user input {s.target!r}", where or None)
                )
    return out
