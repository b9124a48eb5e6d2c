"""Read ExportedProgram archives (``torch.export.save``, ``.pt2``) without torch.

:func:`read_pt2` opens the zip (``pt2.md`` §1), checks ``archive_format``, and for every
``models/<name>.json`` returns a :class:`Program`: the graph as torchless IR, the
signature, the state dict and constants as lazy tensors (one :class:`Storage` per
``weight_<i>`` record, shared by every FQN that points at it, so tied weights stay tied),
range constraints, the module call graph, and the sample inputs (read on demand through
the safe pickle machine: they are ``torch.save`` zips). Extra files are UTF-8 strings.

Example:
    >>> arc = read_pt2("mlp.pt2")
    >>> prog = arc.programs["model"]
    >>> print(prog.graph.python_code())   # doctest: +SKIP
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...container.zip import RecordLoader, ZipReader
from ...core import jsonsafe
from ...core.dtypes import by_name
from ...core.errors import FormatError, TorchlessError, UnsupportedError
from ...core.tensor import Storage, Tensor
from ...graph.ir import Graph, SymValue
from ...graph.symbolic import free_symbols
from ...io.source import BytesSource, open_source
from . import schema as S
from . import spec as C
from .serde import deserialize_graph
from .spec import is_pt2  # noqa: F401 - re-exported

__all__ = [
    "Pt2Archive",
    "Program",
    "InputSpec",
    "OutputSpec",
    "Signature",
    "OpaqueObject",
    "read_pt2",
    "is_pt2",
    "signature_from_schema",
    "dialect_of",
]

INPUT_KINDS = {
    "user_input": "USER_INPUT",
    "parameter": "PARAMETER",
    "buffer": "BUFFER",
    "tensor_constant": "CONSTANT_TENSOR",
    "custom_obj": "CUSTOM_OBJ",
    "token": "TOKEN",
    "constant_input": "USER_INPUT",
}
OUTPUT_KINDS = {
    "user_output": "USER_OUTPUT",
    "loss_output": "LOSS_OUTPUT",
    "buffer_mutation": "BUFFER_MUTATION",
    "gradient_to_parameter": "GRADIENT_TO_PARAMETER",
    "gradient_to_user_input": "GRADIENT_TO_USER_INPUT",
    "user_input_mutation": "USER_INPUT_MUTATION",
    "token": "TOKEN",
    "parameter_mutation": "PARAMETER_MUTATION",
}


@dataclass(frozen=True, slots=True)
class InputSpec:
    """One graph input, as ``torch.export.graph_signature.InputSpec``: ``kind`` (``PARAMETER``,
    ``BUFFER``, ``CONSTANT_TENSOR``, ``CUSTOM_OBJ``, ``TOKEN``, ``USER_INPUT``), the
    placeholder name ``arg`` (None for a constant user input), the state-dict/constant
    ``target``, and ``persistent`` for buffers."""

    kind: str
    arg: str | None
    target: str | None = None
    persistent: bool | None = None
    value: Any = None


@dataclass(frozen=True, slots=True)
class OutputSpec:
    """One graph output: ``kind`` (``USER_OUTPUT``, ``BUFFER_MUTATION``, ``LOSS_OUTPUT``,
    ``GRADIENT_TO_PARAMETER``, ...), the output value's name, and the mutated target."""

    kind: str
    arg: str | None
    target: str | None = None


@dataclass(frozen=True, slots=True)
class Signature:
    input_specs: tuple[InputSpec, ...]
    output_specs: tuple[OutputSpec, ...]

    @property
    def user_inputs(self) -> list[str]:
        return [s.arg for s in self.input_specs if s.kind == "USER_INPUT" and s.arg]

    @property
    def parameters(self) -> list[str]:
        return [s.target for s in self.input_specs if s.kind == "PARAMETER" and s.target]

    @property
    def buffers(self) -> list[str]:
        return [s.target for s in self.input_specs if s.kind == "BUFFER" and s.target]

    @property
    def user_outputs(self) -> list[str]:
        return [s.arg for s in self.output_specs if s.kind == "USER_OUTPUT" and s.arg]

    @property
    def mutations(self) -> list[OutputSpec]:
        return [s for s in self.output_specs if s.kind.endswith("_MUTATION")]

    @property
    def gradients(self) -> list[OutputSpec]:
        return [s for s in self.output_specs if s.kind.startswith("GRADIENT_")]

    def to_dict(self) -> dict[str, Any]:
        return {
            "inputs": [
                {
                    "kind": s.kind,
                    "name": s.arg,
                    "target": s.target,
                    **({"persistent": s.persistent} if s.persistent is not None else {}),
                }
                for s in self.input_specs
            ],
            "outputs": [{"kind": s.kind, "name": s.arg, "target": s.target} for s in self.output_specs],
        }


def _arg_name(a: Any) -> str | None:
    if isinstance(a, S.Argument):
        v = a.value
        if a.kind in ("as_sym_int", "as_sym_bool", "as_sym_float"):
            return v.value if v.kind == "as_name" else None
        return getattr(v, "name", None)
    return getattr(a, "name", None)


def signature_from_schema(sig: S.GraphSignature) -> Signature:
    """The IR-level signature of a serialized ``GraphSignature``."""
    ins = []
    for u in sig.input_specs:
        v = u.value
        k = u.kind
        if k == "parameter":
            ins.append(InputSpec("PARAMETER", v.arg.name, v.parameter_name))
        elif k == "buffer":
            ins.append(InputSpec("BUFFER", v.arg.name, v.buffer_name, v.persistent))
        elif k == "tensor_constant":
            ins.append(InputSpec("CONSTANT_TENSOR", v.arg.name, v.tensor_constant_name))
        elif k == "custom_obj":
            ins.append(InputSpec("CUSTOM_OBJ", v.arg.name, v.custom_obj_name))
        elif k == "token":
            ins.append(InputSpec("TOKEN", v.arg.name))
        elif k == "constant_input":
            ins.append(InputSpec("USER_INPUT", v.name, None, None, v.value.value))
        else:
            ins.append(InputSpec("USER_INPUT", _arg_name(v.arg)))
    outs = []
    for ou in sig.output_specs:
        v = ou.value
        target = getattr(v, "buffer_name", None) or getattr(v, "parameter_name", None) or getattr(v, "user_input_name", None)
        outs.append(OutputSpec(OUTPUT_KINDS[ou.kind], _arg_name(v.arg), target))
    return Signature(tuple(ins), tuple(outs))


@dataclass(frozen=True, slots=True)
class OpaqueObject:
    """A constant torchless does not decode (TorchBind ``custom_obj_*``, pickled
    ``opaque_obj_*``, or a pickled tensor subclass): where it is and what it is."""

    kind: str
    record: str
    nbytes: int
    reason: str = ""


def dialect_of(verifiers: list[str]) -> str:
    """``"ATEN"`` (inference IR, ``run_decompositions()``), ``"TRAINING"`` (``torch.export``
    output), or another dialect name; ``""`` maps to ATEN as in torch."""
    if not verifiers:
        return "ATEN"
    v = verifiers[0]
    return "ATEN" if v in ("", "ATEN") else v


@dataclass
class Program:
    """One ExportedProgram of an archive.

    Attributes:
        name: the model name (``model`` for ``torch.export.save``).
        graph: the graph IR (``graph.subgraphs`` holds higher-order op bodies).
        signature: inputs and outputs with their kinds and targets.
        state_dict: parameters and persistent buffers (lazy tensors).
        constants: lifted tensor constants and non-persistent buffers (lazy tensors, or
            :class:`OpaqueObject`).
        range_constraints: symbol -> ``(min, max)``; None means unbounded.
        module_call_graph: the serialized ``ModuleCallEntry`` list.
        dialect: ``"ATEN"`` or ``"TRAINING"``.
        schema: the parsed JSON (:class:`~.schema.ExportedProgram`), for exact re-emission.
    """

    name: str
    graph: Graph
    signature: Signature
    state_dict: dict[str, Any]
    constants: dict[str, Any]
    range_constraints: dict[str, tuple[int | None, int | None]]
    module_call_graph: list[S.ModuleCallEntry]
    dialect: str
    schema: S.ExportedProgram
    weights_config: S.PayloadConfig | None = None
    constants_config: S.PayloadConfig | None = None
    _archive: Any = field(default=None, repr=False)
    _module: Any = field(default=None, repr=False, compare=False)

    @property
    def schema_version(self) -> tuple[int, int]:
        sv = self.schema.schema_version
        return (sv.major, sv.minor)

    @property
    def torch_version(self) -> str:
        return self.schema.torch_version

    @property
    def guards_code(self) -> list[str]:
        return list(self.schema.guards_code)

    @property
    def sample_inputs(self) -> Any:
        """``(args, kwargs)`` from ``data/sample_inputs/<name>.pt``, or None when absent/empty."""
        return self._archive.sample_inputs(self.name) if self._archive is not None else None

    def dynamic_dims(self) -> list[dict[str, Any]]:
        """Every symbolic dimension of a user input: input, dim, expression, range."""
        out = []
        users = set(self.signature.user_inputs)
        for n in self.graph.placeholders:
            v = n.meta.get("val")
            if n.name not in users or v is None or not hasattr(v, "shape"):
                continue
            for d, s in enumerate(v.shape):
                if isinstance(s, SymValue):
                    syms = free_symbols(s.expr)
                    rng = [self.range_constraints.get(x) for x in syms]
                    out.append(
                        {"input": n.name, "dim": d, "expr": str(s), "symbols": syms, "range": rng[0] if len(rng) == 1 else rng}
                    )
        return out

    def module(self, *, check_guards: bool = True) -> Any:
        """A callable running this program on NumPy, like ``torch.export.load(p).module()``:
        ``m(*args, **kwargs)`` takes arrays (or torchless Tensors, Python scalars) as the
        exported ``forward`` did and returns its output pytree with NumPy arrays. Each call
        of ``module()`` gives a new module with its own copy of the buffers.

        Raises:
            UnsupportedError: an operator has no kernel (all of them named), before anything runs.
        """
        from .run import ExportedModule

        return ExportedModule(self, check_guards=check_guards)

    def run(self, *args: Any, **kwargs: Any) -> Any:
        """``self.module()(*args, **kwargs)`` with one module kept by the program (buffer
        mutations persist across calls)."""
        if self._module is None:
            self._module = self.module()
        return self._module(*args, **kwargs)

    def op_histogram(self) -> dict[str, int]:
        """Operator -> count over the graph and all subgraphs."""
        hist: dict[str, int] = {}
        for _p, g in self.graph.walk():
            for n in g.nodes:
                if n.op == "call_function":
                    k = str(n.target)
                    hist[k] = hist.get(k, 0) + 1
        return dict(sorted(hist.items(), key=lambda kv: (-kv[1], kv[0])))


def _payload(zr: ZipReader, cfg: S.PayloadConfig, folder: str, member: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    storages: dict[str, Storage] = {}
    for fqn, pm in cfg.config.items():
        rec = folder + pm.path_name
        if "/" in pm.path_name or pm.path_name in ("", ".", ".."):
            raise FormatError("payload path escapes its folder", member=member, found=repr(pm.path_name))
        entry = zr.lookup(rec)
        if entry is None:
            raise FormatError(f"payload {fqn!r} names a missing record", member=member, expected=rec, found="nothing")
        if pm.path_name.startswith((C.CUSTOM_OBJ_FILENAME_PREFIX, C.OPAQUE_OBJ_FILENAME_PREFIX)):
            kind = "custom_obj" if pm.path_name.startswith(C.CUSTOM_OBJ_FILENAME_PREFIX) else "opaque_obj"
            out[fqn] = OpaqueObject(kind, rec, entry.size, "TorchBind/opaque objects need their Python classes")
            continue
        if pm.use_pickle:
            out[fqn] = _pickled_tensor(zr, entry, rec)
            continue
        tm = pm.tensor_meta
        if tm is None:
            raise FormatError(f"payload {fqn!r} has no tensor_meta", member=member)
        dtype_name = S.SCALAR_TYPE_DTYPE.get(tm.dtype)
        if dtype_name is None:
            raise UnsupportedError(f"payload {fqn!r} has ScalarType {tm.dtype.name}", member=member)
        dtype = by_name(dtype_name)
        vals = []
        for part in (*tm.sizes, *tm.strides, tm.storage_offset):
            if part.kind != "as_int":
                raise FormatError(f"payload {fqn!r} has a symbolic size, stride or offset", member=member)
            vals.append(part.value)
        nd = len(tm.sizes)
        if len(tm.strides) != nd:
            raise FormatError(f"payload {fqn!r}: sizes and strides differ in length", member=member)
        sizes, strides, off = vals[:nd], vals[nd : 2 * nd], vals[-1]
        dev = tm.device.type if tm.device.index is None else f"{tm.device.type}:{tm.device.index}"
        if entry.size == 0:
            # torch loads an empty record as torch.zeros(sizes)
            t = Tensor.from_numpy(np.zeros([int(s) for s in sizes], dtype=dtype.storage), dtype, requires_grad=tm.requires_grad)
            t.is_parameter = pm.is_param
            out[fqn] = t
            continue
        if entry.size % dtype.itemsize:
            raise FormatError(
                f"payload {fqn!r}: record size is not a multiple of the element size",
                member=rec,
                expected=f"multiple of {dtype.itemsize}",
                found=entry.size,
            )
        st = storages.get(pm.path_name)
        if st is None:
            st = Storage(pm.path_name, entry.size, dtype, dev, loader=RecordLoader(zr, entry), origin=f"{zr.prefix}/{rec}")
            storages[pm.path_name] = st
        t = Tensor(st, dtype, sizes, strides, off, requires_grad=tm.requires_grad, is_parameter=pm.is_param, device=dev)
        t._check_bounds()
        out[fqn] = t
    return out


def _pickled_tensor(zr: ZipReader, entry: Any, rec: str) -> Any:
    """A tensor subclass stored as a nested ``torch.save`` zip; read with the safe machine."""
    from ..pt.read import read_checkpoint

    data = bytes(zr.read(entry))
    try:
        return read_checkpoint(BytesSource(data, name=rec), weights_only=True).obj
    except TorchlessError as e:
        return OpaqueObject("pickled", rec, entry.size, str(e))


class Pt2Archive:
    """An opened ``.pt2`` archive. Use as a context manager.

    Attributes:
        programs: model name -> :class:`Program`.
        extra_files: ``extra/`` records, decoded as UTF-8.
        records: every record name (relative to the archive folder).
    """

    def __init__(self, source: Any, *, path: str | None = None) -> None:
        parsed = source if isinstance(source, ZipReader) else None  # parsed already (by detection)
        self.source = parsed.source if parsed is not None else open_source(source)
        self.path = path or self.source.name
        try:
            zr = parsed if parsed is not None else ZipReader(self.source, require_prefix=False)
            self.legacy = C.is_legacy_pt2(zr.records()) and zr.lookup(C.ARCHIVE_FORMAT_PATH) is None
            self.zip = zr if self.legacy else zr.check_prefix()
        except TorchlessError as e:
            e.with_context(path=self.path)
            raise
        zr = self.zip
        self.records = zr.records()
        self._samples: dict[str, Any] = {}
        self.extra_files: dict[str, str] = {}
        if self.legacy:
            self.archive_version = None
            self.programs: dict[str, Program] = {}
            try:
                self.programs["model"] = self._legacy_program()
            except TorchlessError as e:
                e.with_context(path=self.path)
                raise
            return
        fmt = zr.lookup(C.ARCHIVE_FORMAT_PATH)
        if fmt is None:
            if zr.lookup(C.LEGACY_EP_JSON) is not None:
                raise FormatError(
                    "pre-2.8 ExportedProgram archive without its state dict",
                    path=self.path,
                    member=C.LEGACY_STATE_DICT,
                    expected="serialized_exported_program.json with serialized_state_dict.pt",
                    found="no serialized_state_dict.pt",
                )
            raise FormatError(
                "not a PT2 archive",
                path=self.path,
                member=C.ARCHIVE_FORMAT_PATH,
                expected="an archive_format record",
                found="nothing",
            )
        value = zr.read_bytes(fmt, max_size=64) if fmt.size <= 64 else b"?"
        if value != C.ARCHIVE_FORMAT_VALUE:
            raise FormatError(
                "not a PT2 archive", path=self.path, member=C.ARCHIVE_FORMAT_PATH, expected="b'pt2'", found=repr(value[:16])
            )
        ver = zr.lookup(C.ARCHIVE_VERSION_PATH)
        self.archive_version = (
            zr.read_bytes(ver, max_size=64).decode("ascii", "replace") if ver is not None and ver.size <= 64 else None
        )
        self.programs = {}
        for rec in self.records:
            if rec.startswith(C.MODELS_DIR) and rec.endswith(".json") and rec.count("/") == 1:
                name = rec[len(C.MODELS_DIR) : -5]
                try:
                    self.programs[name] = self._program(name, rec)
                except TorchlessError as e:
                    e.with_context(path=self.path, member=rec)
                    raise
        if not self.programs:
            raise FormatError("PT2 archive holds no models/<name>.json", path=self.path, member=C.MODELS_DIR)
        for rec in self.records:
            if rec.startswith(C.EXTRA_DIR) and not rec.endswith("/"):
                self.extra_files[rec[len(C.EXTRA_DIR) :]] = bytes(self.zip.read(rec)).decode("utf-8", "replace")

    def _config(self, rec: str) -> S.PayloadConfig | None:
        e = self.zip.lookup(rec)
        if e is None:
            return None
        try:
            obj = jsonsafe.loads(self.zip.read(e), what="payload config", path=self.path, member=rec)
            return S.from_json(S.PayloadConfig, obj)
        except FormatError as err:
            err.with_context(path=self.path, member=rec)
            raise

    def _program(self, name: str, rec: str) -> Program:
        text = bytes(self.zip.read(rec))
        ep = S.loads_program(text, member=rec)
        gm = ep.graph_module
        sig = signature_from_schema(gm.signature)
        input_names = [s.arg or "" for s in sig.input_specs]
        graph = deserialize_graph(gm.graph, member=rec, input_names=input_names)
        wc = self._config(C.WEIGHTS_CONFIG_FILENAME_FORMAT.format(name))
        cc = self._config(C.CONSTANTS_CONFIG_FILENAME_FORMAT.format(name))
        if wc is None and self.zip.lookup(f"{C.WEIGHTS_DIR}{name}.pt") is not None:
            raise UnsupportedError(
                "legacy pickled weights (data/weights/<model>.pt) are not supported",
                path=self.path,
                member=f"{C.WEIGHTS_DIR}{name}.pt",
            )
        sd = _payload(self.zip, wc, C.WEIGHTS_DIR, C.WEIGHTS_CONFIG_FILENAME_FORMAT.format(name)) if wc else {}
        consts = _payload(self.zip, cc, C.CONSTANTS_DIR, C.CONSTANTS_CONFIG_FILENAME_FORMAT.format(name)) if cc else {}
        rc = {k: (v.min_val, v.max_val) for k, v in ep.range_constraints.items()}
        return Program(name, graph, sig, sd, consts, rc, list(gm.module_call_graph), dialect_of(ep.verifiers), ep, wc, cc, self)

    def _legacy_checkpoint(self, rec: str) -> Any:
        """One ``torch.save`` archive of a pre-2.8 layout, read weights-only (None if absent)."""
        from ..pt.read import read_checkpoint

        e = self.zip.lookup(rec)
        if e is None or e.size == 0:
            return None
        try:
            return read_checkpoint(BytesSource(bytes(self.zip.read(e)), name=f"{self.path}:{rec}"), weights_only=True).obj
        except TorchlessError as err:
            err.with_context(member=rec)
            raise

    def _legacy_program(self) -> Program:
        """The program of a pre-2.8 archive (torch 2.5-2.7): its schema 5.x-7.x JSON is
        upgraded to the current schema (:func:`~.schema.loads_program` with ``legacy``)."""
        rec = C.LEGACY_EP_JSON
        ep = S.loads_program(bytes(self.zip.read(rec)), member=rec, legacy=True)
        gm = ep.graph_module
        sig = signature_from_schema(gm.signature)
        graph = deserialize_graph(gm.graph, member=rec, input_names=[s.arg or "" for s in sig.input_specs])

        def tensors(rec: str) -> dict[str, Any]:
            obj = self._legacy_checkpoint(rec)
            if obj is None:
                return {}
            if not isinstance(obj, dict):
                raise FormatError(f"{rec} does not hold a dict", path=self.path, member=rec, found=type(obj).__name__)
            return {str(k): v for k, v in obj.items()}

        sd = tensors(C.LEGACY_STATE_DICT)
        consts = tensors(C.LEGACY_CONSTANTS)
        rc = {k: (v.min_val, v.max_val) for k, v in ep.range_constraints.items()}
        return Program(
            "model", graph, sig, sd, consts, rc, list(gm.module_call_graph), dialect_of(ep.verifiers), ep, None, None, self
        )

    def sample_inputs(self, name: str = "model") -> Any:
        """``(args, kwargs)`` of model ``name``'s sample inputs (lazy tensors), or None.

        Raises:
            FormatError / UnsafeGlobalError: the pickle is malformed or names globals that
                the weights-only allowlist refuses.
        """
        if name not in self._samples and self.legacy:
            self._samples[name] = self._legacy_checkpoint(C.LEGACY_EXAMPLE_INPUTS)
        if name not in self._samples:
            rec = C.SAMPLE_INPUTS_FILENAME_FORMAT.format(name)
            e = self.zip.lookup(rec)
            if e is None or e.size == 0:
                self._samples[name] = None
            else:
                from ..pt.read import read_checkpoint

                try:
                    self._samples[name] = read_checkpoint(
                        BytesSource(bytes(self.zip.read(e)), name=f"{self.path}:{rec}"), weights_only=True
                    ).obj
                except TorchlessError as err:
                    err.with_context(member=rec)
                    raise
        return self._samples[name]

    @property
    def program(self) -> Program:
        """The single program (``model``), or the first one."""
        return self.programs.get("model") or next(iter(self.programs.values()))

    def close(self) -> None:
        self.zip.close()
        self.source.close()

    def __enter__(self) -> Pt2Archive:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def read_pt2(source: Any) -> Pt2Archive:
    """Open a ``.pt2`` archive (path, bytes or ByteSource).

    Raises:
        FormatError: not a PT2 archive, malformed JSON or payloads.
        UnsupportedError: another schema major version, pre-2.8 layout.
    """
    return Pt2Archive(source)
