"""Write ExportedProgram archives that ``torch.export.load`` reads.

:func:`save_pt2` writes one or more :class:`~.read.Program` objects (read from a file,
possibly with replaced weights or a transformed graph) in torch 2.13's layout
(``pt2.md`` §1): raw weights ``data/weights/weight_<i>`` (one record per shared storage, so
tied weights stay tied), the weights and constants configs, ``models/<name>.json``
(serialized from the graph IR and signature), ``data/sample_inputs/<name>.pt``, extra files,
then ``archive_format``, ``archive_version``, ``.data/version`` (``6``), ``byteorder`` and
``.data/serialization_id``. An untouched program is re-emitted byte for byte.

Example:
    >>> arc = read_pt2("mlp.pt2")                                    # doctest: +SKIP
    >>> prog = arc.program
    >>> prog.state_dict["l1.weight"] = Tensor.from_numpy(new_w)      # doctest: +SKIP
    >>> save_pt2("mlp_new.pt2", prog)                                # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import io
import json
import sys
from collections.abc import Iterable
from typing import Any

import numpy as np

from ...container.zip import TorchZipWriter
from ...core.errors import UnsupportedError, UsageError
from ...core.tensor import Storage, Tensor, as_tensor
from ...graph.ir import Graph, SymValue, TensorValue
from . import schema as S
from . import spec as C
from .read import OpaqueObject, Program, Signature
from .serde import serialize_graph

__all__ = ["save_pt2", "set_weights", "signature_to_schema", "program_json"]


def _as_tensor(name: str, v: Any) -> Tensor:
    if isinstance(v, (bool, int, float, complex)):  # a Python number: a 0-d tensor
        v = np.asarray(v)
    return as_tensor(v, name=name)  # the writers' one coercion


def _meta(t: Tensor) -> S.TensorMeta:
    from ...core.values import Device

    st = S.DTYPE_SCALAR_TYPE.get(t.dtype.name)
    if st is None:
        raise UnsupportedError(f"dtype {t.dtype.name} cannot be stored in a .pt2 archive")
    dev = Device(t.device if t.device and t.device != "meta" else "cpu")
    return S.TensorMeta(
        st,
        [S.SymInt("as_int", int(s)) for s in t.shape],
        bool(t.requires_grad),
        S.Device(dev.type, dev.index),
        [S.SymInt("as_int", int(s)) for s in t.stride()],
        S.SymInt("as_int", t.storage_offset()),
        S.Layout.Strided,
    )


def _write_payload(
    zw: TorchZipWriter, items: dict[str, Any], folder: str, prefix: str, source: Any, params: set[str]
) -> S.PayloadConfig:
    config: dict[str, S.PayloadMeta] = {}
    # keyed by the Storage object itself (held by the dict), never by id(): a storage the
    # writer made from a NumPy array is a temporary, and a freed one's id is reused
    groups: dict[tuple[Storage, str], str] = {}
    # numbering continues over the records already in the folder (several models)
    count = sum(1 for n in zw.names if n.startswith(f"{folder}{prefix}"))
    for fqn, v in items.items():
        if isinstance(v, OpaqueObject):
            if source is None:
                raise UnsupportedError(f"constant {fqn!r} ({v.kind}) can only be copied from its source archive")
            name = v.record.rsplit("/", 1)[-1]
            if v.kind == "pickled":
                name = f"{prefix}{count}"
                count += 1
            elif f"{folder}{name}" in zw.names:
                raise UnsupportedError(f"two models hold the object record {name!r}; write them to separate archives")
            zw.write(folder + name, source.zip.read(v.record))
            config[fqn] = S.PayloadMeta(name, fqn in params, v.kind == "pickled", None)
            continue
        t = _as_tensor(fqn, v)
        if t.storage is None:
            raise UnsupportedError(f"tensor {fqn!r} has no data (meta tensor)")
        key = (t.storage, t.dtype.name)
        path = groups.get(key)
        if path is None:
            path = f"{prefix}{count}"
            count += 1
            groups[key] = path
            mv = t.storage.bytes()
            if t.storage.byteorder != sys.byteorder and t.dtype.itemsize > 1:
                arr = np.frombuffer(mv, dtype=t.dtype.storage.newbyteorder(">" if t.storage.byteorder == "big" else "<"))
                mv = arr.astype(t.dtype.storage.newbyteorder("=")).view(np.uint8).data
            zw.write(folder + path, mv)
        is_param = bool(getattr(t, "is_parameter", False)) or fqn in params
        config[fqn] = S.PayloadMeta(path, is_param, False, _meta(t))
    return S.PayloadConfig(config)


def signature_to_schema(sig: Signature, graph: Graph) -> S.GraphSignature:
    """The serialized ``GraphSignature`` of an IR signature (user inputs typed from the graph)."""
    vals = {n.name: n.meta.get("val") for n in graph.placeholders}
    outs_vals: dict[str, Any] = {}
    for n in graph.nodes:
        outs_vals[n.name] = n.meta.get("val")

    def user_arg(name: str | None, v: Any, value: Any = None) -> S.Argument:
        if name is None:
            return S.Argument("as_none", True)
        if isinstance(v, SymValue):
            cls = {"int": S.SymIntArgument, "bool": S.SymBoolArgument, "float": S.SymFloatArgument}[v.kind]
            return S.Argument(f"as_sym_{v.kind}", cls("as_name", name))
        if isinstance(v, S.CustomObjArgument):
            return S.Argument("as_custom_obj", S.CustomObjArgument(name, v.class_fqn))
        if v is None or isinstance(v, TensorValue):
            return S.Argument("as_tensor", S.TensorArgument(name))
        return S.Argument("as_tensor", S.TensorArgument(name))

    ins = []
    for s in sig.input_specs:
        ta = S.TensorArgument(s.arg or "")
        if s.kind == "PARAMETER":
            ins.append(S.InputSpec("parameter", S.InputToParameterSpec(ta, s.target or "")))
        elif s.kind == "BUFFER":
            ins.append(S.InputSpec("buffer", S.InputToBufferSpec(ta, s.target or "", bool(s.persistent))))
        elif s.kind == "CONSTANT_TENSOR":
            ins.append(S.InputSpec("tensor_constant", S.InputToTensorConstantSpec(ta, s.target or "")))
        elif s.kind == "CUSTOM_OBJ":
            v = vals.get(s.arg or "")
            fqn = v.class_fqn if isinstance(v, S.CustomObjArgument) else ""
            ins.append(S.InputSpec("custom_obj", S.InputToCustomObjSpec(S.CustomObjArgument(s.arg or "", fqn), s.target or "")))
        elif s.kind == "TOKEN":
            ins.append(S.InputSpec("token", S.InputTokenSpec(S.TokenArgument(s.arg or ""))))
        elif s.value is not None or (
            s.arg
            and not isinstance(vals.get(s.arg), (TensorValue, SymValue, S.CustomObjArgument))
            and s.arg in vals
            and vals.get(s.arg) is not None
        ):
            value = s.value if s.value is not None else vals.get(s.arg or "")
            ck = (
                "as_bool"
                if isinstance(value, bool)
                else "as_int"
                if isinstance(value, int)
                else "as_float"
                if isinstance(value, float)
                else "as_string"
                if isinstance(value, str)
                else "as_none"
            )
            ins.append(
                S.InputSpec(
                    "constant_input",
                    S.InputToConstantInputSpec(s.arg or "", S.ConstantValue(ck, True if ck == "as_none" else value)),
                )
            )
        else:
            ins.append(S.InputSpec("user_input", S.UserInputSpec(user_arg(s.arg, vals.get(s.arg or "")))))
    outs = []
    rev = {
        "BUFFER_MUTATION": ("buffer_mutation", S.BufferMutationSpec),
        "PARAMETER_MUTATION": ("parameter_mutation", S.ParameterMutationSpec),
        "GRADIENT_TO_PARAMETER": ("gradient_to_parameter", S.GradientToParameterSpec),
        "GRADIENT_TO_USER_INPUT": ("gradient_to_user_input", S.GradientToUserInputSpec),
        "USER_INPUT_MUTATION": ("user_input_mutation", S.UserInputMutationSpec),
    }
    for o in sig.output_specs:
        if o.kind == "USER_OUTPUT":
            outs.append(S.OutputSpec("user_output", S.UserOutputSpec(user_arg(o.arg, outs_vals.get(o.arg or "")))))
        elif o.kind == "LOSS_OUTPUT":
            outs.append(S.OutputSpec("loss_output", S.LossOutputSpec(S.TensorArgument(o.arg or ""))))
        elif o.kind == "TOKEN":
            outs.append(S.OutputSpec("token", S.OutputTokenSpec(S.TokenArgument(o.arg or ""))))
        elif o.kind in rev:
            k, cls = rev[o.kind]
            outs.append(S.OutputSpec(k, cls(S.TensorArgument(o.arg or ""), o.target or "")))
        else:
            raise UnsupportedError(f"output kind {o.kind!r} cannot be serialized")
    return S.GraphSignature(ins, outs)


def program_json(prog: Program) -> str:
    """``models/<name>.json`` for ``prog``: its schema with graph and signature re-serialized
    from the IR (identical to the source when nothing changed)."""
    ep = prog.schema
    g = serialize_graph(prog.graph)
    sig = signature_to_schema(prog.signature, prog.graph)
    rc = {k: S.RangeConstraint(lo, hi) for k, (lo, hi) in prog.range_constraints.items()}
    gm = dataclasses.replace(ep.graph_module, graph=g, signature=sig, module_call_graph=list(prog.module_call_graph))
    verifiers = list(ep.verifiers)
    return S.dumps(dataclasses.replace(ep, graph_module=gm, range_constraints=rc, verifiers=verifiers))


def _sample_bytes(prog: Program, sample_inputs: Any) -> bytes:
    if sample_inputs is not None:
        from ..pt.write import save_checkpoint

        buf = io.BytesIO()
        save_checkpoint(sample_inputs, buf)
        return buf.getvalue()
    arc = prog._archive
    if arc is not None:
        e = arc.zip.lookup(C.SAMPLE_INPUTS_FILENAME_FORMAT.format(prog.name))
        if e is not None:
            return bytes(arc.zip.read(e))
    return b""


def save_pt2(
    target: Any,
    programs: Program | dict[str, Program] | Iterable[Program],
    *,
    extra_files: dict[str, str | bytes] | None = None,
    sample_inputs: dict[str, Any] | None = None,
) -> None:
    """Write a ``.pt2`` archive.

    Args:
        target: a path (written atomically) or a binary file object.
        programs: one program (stored as ``model``), or a dict name -> program.
        extra_files: ``extra/<name>`` records (str is encoded as UTF-8).
        sample_inputs: model name -> ``(args, kwargs)`` to store instead of the source's.

    Raises:
        UnsupportedError: values the schema cannot hold (see :func:`serialize_graph`).
        UsageError: a state dict entry that is not a tensor.
    """
    if isinstance(programs, Program):
        progs = {"model": programs}
    elif isinstance(programs, dict):
        progs = dict(programs)
    else:
        progs = {p.name: p for p in programs}
    if not progs:
        raise UsageError("no program to write")
    with TorchZipWriter(target) as zw:
        for name, prog in progs.items():
            params = {s.target for s in prog.signature.input_specs if s.kind == "PARAMETER" and s.target}
            wc = _write_payload(zw, prog.state_dict, C.WEIGHTS_DIR, C.WEIGHT_FILENAME_PREFIX, prog._archive, params)
            zw.write(C.WEIGHTS_CONFIG_FILENAME_FORMAT.format(name), json.dumps(S.to_json(wc)).encode())
            cc = _write_payload(zw, prog.constants, C.CONSTANTS_DIR, C.TENSOR_CONSTANT_FILENAME_PREFIX, prog._archive, set())
            zw.write(C.CONSTANTS_CONFIG_FILENAME_FORMAT.format(name), json.dumps(S.to_json(cc)).encode())
            zw.write(C.MODELS_FILENAME_FORMAT.format(name), program_json(prog).encode("utf-8"))
            zw.write(C.SAMPLE_INPUTS_FILENAME_FORMAT.format(name), _sample_bytes(prog, (sample_inputs or {}).get(name)))
        for k, v in (extra_files or {}).items():
            zw.write(C.EXTRA_DIR + k, v.encode("utf-8") if isinstance(v, str) else v)
        zw.write(C.ARCHIVE_FORMAT_PATH, C.ARCHIVE_FORMAT_VALUE)
        zw.write(C.ARCHIVE_VERSION_PATH, C.ARCHIVE_VERSION_VALUE)
        zw.write(C.DATA_VERSION, f"{C.CONTAINER_MIN_VERSION}\n".encode())
        zw.write(C.BYTEORDER, sys.byteorder.encode())
        zw.write(C.SERIALIZATION_ID, zw.serialization_id())


def set_weights(
    model: Any,
    weights: Any,
    out: Any,
    *,
    program: str | None = None,
    strip_prefix: str = "",
    allow_missing: bool = False,
) -> dict[str, Any]:
    """Re-save ``.pt2`` archive ``model`` as ``out`` with new weights matched by name
    (``torchless pt2 set-weights``), by the rule every ``set-weights`` follows
    (:func:`torchless.formats.weights.match_weights`); graph, signature, constants not
    named, extra files and sample inputs are kept.

    Args:
        model: the archive (a path or an open :class:`~.read.Pt2Archive`).
        weights: a weights file of any readable format, a mapping or ``(name, tensor)``
            pairs; names are the program's ``state_dict`` and ``constants`` names.
        out: the new archive (may be ``model``: the old one is read in full before the
            atomic replace).
        program: the model in a multi-model archive (default: the only one, or ``model``).
        strip_prefix / allow_missing: as :func:`~torchless.formats.weights.match_weights`.

    Returns:
        ``{"program", "replaced": [names], "kept": [names not given], "ignored": [names
        that named nothing]}``.

    Raises:
        NotFoundError: a weight names no tensor (without ``allow_missing``), or no such program.
        UsageError: two weights map to one tensor, none matched, or a shape or dtype differs.
    """
    import copy

    from ...core.errors import NotFoundError
    from ..weights import match_weights, weight_items
    from .read import Pt2Archive, read_pt2

    own = not isinstance(model, Pt2Archive)
    arc = read_pt2(model) if own else model
    try:
        if program is None:
            program = "model" if "model" in arc.programs or len(arc.programs) != 1 else next(iter(arc.programs))
        prog = arc.programs.get(program)
        if prog is None:
            raise NotFoundError(f"the archive has no program {program!r}", found=", ".join(arc.programs), path=model)
        items, w = weight_items(weights)
        try:
            names = {*prog.state_dict, *(k for k, v in prog.constants.items() if isinstance(v, Tensor))}
            m = match_weights(items, names, strip_prefix=strip_prefix, allow_missing=allow_missing, path=model)
            replaced = []
            for name, value in m.matched:
                table = prog.state_dict if name in prog.state_dict else prog.constants
                old = table[name]
                new = copy.copy(_as_tensor(name, value))  # a view of its own: flags set below
                if tuple(new.shape) != tuple(old.shape) or new.dtype.name != old.dtype.name:
                    raise UsageError(
                        f"weight {name!r} does not fit the model",
                        path=model,
                        member=name,
                        expected=f"{old.dtype.name} {list(old.shape)}",
                        found=f"{new.dtype.name} {list(new.shape)}",
                    )
                new.requires_grad, new.is_parameter = old.requires_grad, old.is_parameter
                table[name] = new
                replaced.append(name)
            # extra files byte for byte (``arc.extra_files`` holds them decoded as text)
            extra: dict[str, str | bytes] = {
                r[len(C.EXTRA_DIR) :]: bytes(arc.zip.read(r))
                for r in arc.records
                if r.startswith(C.EXTRA_DIR) and not r.endswith("/")
            }
            save_pt2(out, dict(arc.programs), extra_files=extra)
        finally:
            if w is not None:
                w.close()
        kept = sorted(n for n in names if n not in set(replaced))
        return {"program": program, "replaced": replaced, "kept": kept, "ignored": m.ignored}
    finally:
        if own:
            arc.close()
