"""Reading an ExecuTorch program (``.pte``) without executorch or torch.

The flatbuffer is parsed with the bounds-checked reader of
:mod:`torchless.container.flatbuffer`; constant tensors are zero-copy views of the file
(inline ``constant_buffer`` or the constant segment), delegate blobs are views of their
segment or inline data. Nothing is executed: delegate blobs are backend payloads,
reported with their size and never interpreted. A ``.pte`` carries no pickle.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from ...container.flatbuffer import FlatBuffer, Table
from ...core.dtypes import DTYPES
from ...core.errors import FormatError, LimitError, TorchlessError, TruncatedError, UnsupportedError
from ...core.findings import Problem
from ...core.tensor import Storage, Tensor
from ...io.source import ByteSource, BytesSource, open_source
from ..base import Artifact, LoadPolicy, Probe, summarize_tensors
from ..torchscript.spec import C10_SCALAR_TYPES
from . import spec
from .spec import P

__all__ = ["Delegate", "ExecuTorchArtifact", "ExecutionPlan", "Instruction", "Program", "TensorValue", "read_program"]

#: values one execution plan may hold
MAX_VALUES = 4_000_000


@dataclass
class TensorValue:
    """An ``EValue`` of kind Tensor: the tensor (with data for constants and mutable
    buffers with an initial state, a meta tensor otherwise) and how the program holds it."""

    tensor: Tensor
    kind: str  # "constant", "mutable" (initial state in a mutable segment), "external", "activation", "input"
    data_buffer_idx: int
    dynamism: str
    name: str | None = None  # ExtraTensorInfo.fully_qualified_name


@dataclass(frozen=True)
class Instruction:
    """One instruction: ``KernelCall`` (operator index, argument value indices),
    ``DelegateCall`` (delegate index, args), ``MoveCall`` (from, to), ``JumpFalseCall``
    (condition value, destination), ``FreeCall`` (value)."""

    kind: str
    a: int
    b: Any = None


@dataclass
class Delegate:
    """A lowered subgraph: backend id, where its processed blob is (``offset``, ``size``
    in the file), compile specs. ``blob`` reads the bytes through the artifact's source
    on each access (a zero-copy view of a mapped file), so the parsed program keeps no
    view of the file and closing the artifact releases it."""

    id: str
    location: str
    index: int
    compile_specs: dict[str, bytes]
    offset: int
    size: int
    source: ByteSource = field(repr=False, compare=False)

    @property
    def blob(self) -> memoryview:
        return self.source.view(self.offset, self.size, what=f"delegate {self.id!r} blob")


@dataclass
class ExecutionPlan:
    name: str
    values: list[Any]
    inputs: list[int]
    outputs: list[int]
    operators: list[tuple[str, str]]
    instructions: list[Instruction]
    delegates: list[Delegate]
    non_const_buffer_sizes: list[int]
    input_spec: str | None = None
    output_spec: str | None = None

    def tensors(self) -> Iterator[tuple[int, TensorValue]]:
        for i, v in enumerate(self.values):
            if isinstance(v, TensorValue):
                yield i, v


@dataclass
class Program:
    """A parsed ``.pte``.

    Attributes:
        identifier: the file identifier (``ET12``).
        version: ``Program.version``.
        program_size, segment_base_offset, segment_data_size: the extended header
            (None when the file has none).
        segments: ``(absolute file offset, size)`` of every data segment.
        plans: the execution plans (methods) in file order.
        named_data: ``(key, segment index)`` pairs (data shared with backends).
    """

    identifier: str
    version: int
    program_size: int | None
    segment_base_offset: int | None
    segment_data_size: int | None
    segments: list[tuple[int, int]]
    plans: list[ExecutionPlan]
    named_data: list[tuple[str, int]] = field(default_factory=list)
    constant_count: int = 0

    def plan(self, name: str) -> ExecutionPlan:
        for p in self.plans:
            if p.name == name:
                return p
        from ...core.errors import NotFoundError

        raise NotFoundError(f"no execution plan {name!r}", expected=", ".join(p.name for p in self.plans))


def _ints(t: Table, index: int, fmt: str = "i") -> list[int]:
    return [int(x) for x in t.scalars(index, fmt)]


class _Reader:
    """Parses the flatbuffer from ``buf`` (a view of the whole file); every byte range a
    parsed value reads later (constant tensors, delegate blobs) is taken from ``source``
    when it is read, so nothing parsed keeps a view of ``buf``."""

    def __init__(self, buf: Any, name: str, source: ByteSource, size: int | None = None) -> None:
        self.fb = FlatBuffer(buf, name, what="ExecuTorch program")
        self.source = source
        self.name = name
        # the file's size: ``buf`` may hold the flatbuffer program only (a remote file,
        # whose segments are read by range when a tensor or blob is asked for)
        self.size = self.fb.size if size is None else size

    def err(self, message: str, offset: int | None, **kw: Any) -> FormatError:
        return FormatError(message, path=self.name, offset=offset, **kw)

    def header(self) -> tuple[int | None, int | None, int | None]:
        b = self.fb.b
        if self.size < 12 or bytes(b[8:12]) != spec.EH_MAGIC:
            return None, None, None
        length = self.fb.scalar(12, "I", "extended header length")
        if length < spec.EH_MIN_LENGTH:
            raise self.err("extended header too short", 12, expected=f">= {spec.EH_MIN_LENGTH}", found=length)
        self.fb.check(8, length, "extended header")
        prog = self.fb.scalar(16, "Q", "program size")
        base = self.fb.scalar(24, "Q", "segment base offset")
        data = self.fb.scalar(32, "Q", "segment data size") if length >= spec.EH_FULL_LENGTH else None
        if prog > self.size:
            raise TruncatedError(
                "ExecuTorch program: the extended header's program size is past the end of the file",
                path=self.name,
                offset=16,
                expected=f"<= {self.size}",
                found=prog,
            )
        if base > self.size or base < prog and base != 0:
            raise self.err("segment base offset outside the file", 24, expected=f"{prog}..{self.size}", found=base)
        if data is not None and base + data > self.size:
            raise TruncatedError(
                "ExecuTorch program: segment data runs past the end of the file",
                path=self.name,
                offset=32,
                expected=f"{base + data} bytes",
                found=self.size,
            )
        return prog, base, data

    def read(self) -> Program:
        fb = self.fb
        ident = bytes(fb.b[4:8]) if self.size >= 8 else b""
        if not spec.is_pte(ident.rjust(8, b"\0")):
            raise self.err("not an ExecuTorch program", 4, expected="ET + two digits (ET12)", found=ident)
        if ident not in spec.KNOWN_IDENTIFIERS:
            raise UnsupportedError(
                "ExecuTorch program schema version this reader does not know",
                path=self.name,
                offset=4,
                expected=", ".join(i.decode() for i in spec.KNOWN_IDENTIFIERS),
                found=ident.decode("latin-1"),
            )
        prog_size, base, data_size = self.header()
        if prog_size:  # offsets inside the flatbuffer may not leave it
            self.fb.size = prog_size
        root = fb.root()
        segments: list[tuple[int, int]] = []
        for s in root.tables(P.PROGRAM_SEGMENTS, "DataSegment"):
            off, size = s.scalar(P.SEGMENT_OFFSET, "Q"), s.scalar(P.SEGMENT_SIZE, "Q")
            start = (base or 0) + off
            if base is None or start + size > self.size:
                raise TruncatedError(
                    "ExecuTorch program: data segment outside the file",
                    path=self.name,
                    offset=s.pos,
                    expected=f"end <= {self.size}",
                    found=f"{start}+{size}",
                )
            segments.append((start, size))
        self.segments = segments
        self.const_inline = root.tables(P.PROGRAM_CONSTANT_BUFFER, "Buffer")
        cs = root.table(P.PROGRAM_CONSTANT_SEGMENT, "SubsegmentOffsets")
        self.const_seg = self._subsegment(cs) if cs is not None else None
        self.mutable = [self._subsegment(t) for t in root.tables(P.PROGRAM_MUTABLE_SEGMENTS, "SubsegmentOffsets")]
        self.delegate_inline = root.tables(P.PROGRAM_DELEGATE_DATA, "BackendDelegateInlineData")
        plans = [self.plan(t) for t in root.tables(P.PROGRAM_PLANS, "ExecutionPlan")]
        named = [
            (t.string(P.NAMED_KEY) or "", t.scalar(P.NAMED_SEGMENT, "I")) for t in root.tables(P.PROGRAM_NAMED_DATA, "NamedData")
        ]
        for key, si in named:
            if si >= len(segments):
                raise self.err(
                    f"named data {key!r} names a segment that does not exist", None, expected=f"< {len(segments)}", found=si
                )
        n_const = len(self.const_seg[1]) if self.const_seg and len(self.const_seg[1]) else len(self.const_inline)
        return Program(
            ident.decode("latin-1"),
            root.scalar(P.PROGRAM_VERSION, "I"),
            prog_size,
            base,
            data_size,
            segments,
            plans,
            named,
            max(n_const - 1, 0),
        )

    def _subsegment(self, t: Table) -> tuple[int, list[int]]:
        si = t.scalar(P.SUBSEG_INDEX, "I")
        offsets = _ints(t, P.SUBSEG_OFFSETS, "Q")
        if offsets and si >= len(self.segments):
            raise self.err("subsegment names a segment that does not exist", t.pos, expected=f"< {len(self.segments)}", found=si)
        return si, offsets

    def plan(self, t: Table) -> ExecutionPlan:
        name = t.string(P.PLAN_NAME) or ""
        meta = t.table(P.PLAN_CONTAINER_META, "ContainerMetadata")
        vec = t.vector_pos(P.PLAN_VALUES, 4)
        if vec is not None and vec[1] > MAX_VALUES:
            raise LimitError("execution plan has too many values", path=self.name, expected=f"at most {MAX_VALUES}", found=vec[1])
        raw = t.tables(P.PLAN_VALUES, "EValue")
        values = [self.value(ev, name, i) for i, ev in enumerate(raw)]
        n = len(values)
        inputs, outputs = _ints(t, P.PLAN_INPUTS), _ints(t, P.PLAN_OUTPUTS)
        for what, idx in (("input", inputs), ("output", outputs)):
            bad = [i for i in idx if not 0 <= i < n]
            if bad:
                raise self.err(f"plan {name!r}: {what} value index out of range", t.pos, expected=f"< {n}", found=bad[0])
        for i in inputs:
            v = values[i]
            if isinstance(v, TensorValue) and v.kind == "activation":
                v.kind = "input"
        operators = [(o.string(P.OP_NAME) or "", o.string(P.OP_OVERLOAD) or "") for o in t.tables(P.PLAN_OPERATORS, "Operator")]
        delegates = [self.delegate(d) for d in t.tables(P.PLAN_DELEGATES, "BackendDelegate")]
        instructions: list[Instruction] = []
        for ch in t.tables(P.PLAN_CHAINS, "Chain"):
            for ins in ch.tables(P.CHAIN_INSTRUCTIONS, "Instruction"):
                instructions.append(self.instruction(ins, name, n, len(operators), len(delegates)))
        return ExecutionPlan(
            name,
            values,
            inputs,
            outputs,
            operators,
            instructions,
            delegates,
            _ints(t, P.PLAN_NON_CONST_SIZES, "q"),
            None if meta is None else meta.string(P.META_INP),
            None if meta is None else meta.string(P.META_OUT),
        )

    def instruction(self, ins: Table, plan: str, n_values: int, n_ops: int, n_delegates: int) -> Instruction:
        kind, pos = ins.union(P.UNION_TYPE)
        if not 1 <= kind <= len(spec.INSTRUCTIONS) or pos is None:
            raise self.err(
                f"plan {plan!r}: unknown instruction kind", ins.pos, expected=f"1..{len(spec.INSTRUCTIONS)}", found=kind
            )
        name = spec.INSTRUCTIONS[kind - 1]
        t = self.fb.table_at(pos, name)

        def check(i: int, limit: int, what: str) -> int:
            if not 0 <= i < limit:
                raise self.err(f"plan {plan!r}: {name} {what} out of range", t.pos, expected=f"< {limit}", found=i)
            return i

        if name in ("KernelCall", "DelegateCall"):
            first = t.scalar(P.CALL_FIRST, "i")
            check(first, n_ops if name == "KernelCall" else n_delegates, "operator" if name == "KernelCall" else "delegate")
            args = _ints(t, P.CALL_SECOND)
            for a in args:
                check(a, n_values, "argument")
            return Instruction(name, first, args)
        if name == "MoveCall":
            return Instruction(
                name,
                check(t.scalar(P.CALL_FIRST, "i"), n_values, "source"),
                check(t.scalar(P.CALL_SECOND, "i"), n_values, "target"),
            )
        if name == "JumpFalseCall":
            return Instruction(name, check(t.scalar(P.CALL_FIRST, "i"), n_values, "condition"), t.scalar(P.CALL_SECOND, "i"))
        return Instruction(name, check(t.scalar(P.CALL_FIRST, "i"), n_values, "value"))

    def delegate(self, d: Table) -> Delegate:
        ref = d.table(P.DELEGATE_PROCESSED, "BackendDelegateDataReference")
        loc = ref.scalar(P.REF_LOCATION, "b", 0) if ref is not None else 0
        idx = ref.scalar(P.REF_INDEX, "I", 0) if ref is not None else 0
        if loc == 0:
            if idx >= len(self.delegate_inline):
                raise self.err("delegate data index out of range", d.pos, expected=f"< {len(self.delegate_inline)}", found=idx)
            start, size = self.delegate_inline[idx].span(P.BUFFER_DATA) or (0, 0)
        elif loc == 1:
            if idx >= len(self.segments):
                raise self.err("delegate segment index out of range", d.pos, expected=f"< {len(self.segments)}", found=idx)
            start, size = self.segments[idx]
        else:
            raise self.err("unknown delegate data location", d.pos, expected="0 (inline) or 1 (segment)", found=loc)
        specs = {}
        for cs in d.tables(P.DELEGATE_SPECS, "CompileSpec"):
            v = cs.bytes(P.SPEC_VALUE)
            specs[cs.string(P.SPEC_KEY) or ""] = bytes(v) if v is not None else b""
        return Delegate(d.string(P.DELEGATE_ID) or "", spec.DATA_LOCATIONS[loc], idx, specs, start, size, self.source)

    def value(self, ev: Table, plan: str, vi: int) -> Any:
        kind, pos = ev.union(P.UNION_TYPE)
        if kind == 0:
            return None
        if not 1 <= kind <= len(spec.KERNEL_TYPES):
            raise self.err(
                f"plan {plan!r}: value {vi} has an unknown kind", ev.pos, expected=f"1..{len(spec.KERNEL_TYPES)}", found=kind
            )
        name = spec.KERNEL_TYPES[kind - 1]
        if pos is None:
            return None
        t = self.fb.table_at(pos, name)
        if name == "Null":
            return None
        if name == "Int":
            return t.scalar(P.SCALAR_VALUE, "q")
        if name == "Bool":
            return bool(t.scalar(P.SCALAR_VALUE, "B"))
        if name == "Double":
            return t.scalar(P.SCALAR_VALUE, "d", 0.0)
        if name == "String":
            return t.string(P.SCALAR_VALUE) or ""
        if name == "IntList":
            return _ints(t, P.ITEMS, "q")
        if name == "DoubleList":
            return [float(x) for x in t.scalars(P.ITEMS, "d")]
        if name == "BoolList":
            return [bool(x) for x in t.scalars(P.ITEMS, "?")]
        if name in ("TensorList", "OptionalTensorList"):
            return ("value indices", _ints(t, P.ITEMS))
        return self.tensor(t, plan, vi)

    def tensor(self, t: Table, plan: str, vi: int) -> TensorValue:
        code = t.scalar(P.TENSOR_SCALAR_TYPE, "b", 0)
        if not 0 <= code < len(C10_SCALAR_TYPES) or C10_SCALAR_TYPES[code] not in DTYPES:
            raise self.err(f"plan {plan!r}: tensor value {vi} has an unknown scalar type", t.pos, found=code)
        dtype = DTYPES[C10_SCALAR_TYPES[code]]
        sizes = _ints(t, P.TENSOR_SIZES)
        order = _ints(t, P.TENSOR_DIM_ORDER, "B")
        if not order:
            order = list(range(len(sizes)))
        if sorted(order) != list(range(len(sizes))):
            raise self.err(f"plan {plan!r}: tensor value {vi}: dim_order is not a permutation of its dims", t.pos, found=order)
        strides = [0] * len(sizes)
        acc = 1
        for d in reversed(order):
            strides[d] = acc
            acc *= max(sizes[d], 1)
        numel = 1
        for s in sizes:
            numel *= s
        if any(s < 0 for s in sizes):
            raise self.err(f"plan {plan!r}: tensor value {vi} has a negative size", t.pos, found=sizes)
        nbytes = numel * dtype.itemsize
        idx = t.scalar(P.TENSOR_BUFFER_IDX, "I")
        alloc = t.table(P.TENSOR_ALLOCATION, "AllocationDetails")
        extra = t.table(P.TENSOR_EXTRA, "ExtraTensorInfo")
        fqn = extra.string(P.EXTRA_FQN) if extra is not None else None
        location = extra.scalar(P.EXTRA_LOCATION, "b", 0) if extra is not None else 0
        dyn = t.scalar(P.TENSOR_DYNAMISM, "b", 0)
        dynamism = spec.DYNAMISM[dyn] if 0 <= dyn < len(spec.DYNAMISM) else str(dyn)
        data_offset = None
        if location == 1:
            kind = "external"
        elif idx == 0:
            kind = "activation"
        elif alloc is None:
            kind = "constant"
            data_offset = self.constant_bytes(idx, nbytes, t.pos, plan, vi)
        else:
            kind = "mutable"
            mi = extra.scalar(P.EXTRA_MUTABLE_IDX, "Q", 0) if extra is not None else 0
            if mi < len(self.mutable):
                data_offset = self.sub_bytes(self.mutable[mi], idx, nbytes, t.pos, f"mutable data segment {mi}")
        st = None
        if data_offset is not None:
            what = f"{plan} value {vi}"
            st = Storage(
                f"{plan}.{vi}",
                nbytes,
                dtype,
                "cpu",
                loader=partial(self.source.view, data_offset, nbytes, what=what),
                origin=what,
                file_offset=data_offset,
            )
        tensor = Tensor(st, dtype, sizes, strides, 0, requires_grad=bool(t.scalar(P.TENSOR_REQUIRES_GRAD, "B", 0)))
        if st is None:
            tensor.device = "meta"
        return TensorValue(tensor, kind, idx, dynamism, fqn)

    def constant_bytes(self, idx: int, nbytes: int, pos: int, plan: str, vi: int) -> int:
        """The file offset of constant ``idx``'s ``nbytes`` bytes (checked)."""
        if self.const_seg is not None and self.const_seg[1]:
            return self.sub_bytes(self.const_seg, idx, nbytes, pos, "constant segment")
        if idx >= len(self.const_inline):
            raise self.err(
                f"plan {plan!r}: tensor value {vi} names a constant buffer that does not exist",
                pos,
                expected=f"< {len(self.const_inline)}",
                found=idx,
            )
        start, size = self.const_inline[idx].span(P.BUFFER_DATA) or (0, 0)
        if size < nbytes:
            raise TruncatedError(
                f"ExecuTorch program: constant buffer {idx} is smaller than its tensor",
                path=self.name,
                offset=pos,
                expected=f"{nbytes} bytes",
                found=size,
            )
        return start

    def sub_bytes(self, sub: tuple[int, list[int]], idx: int, nbytes: int, pos: int, what: str) -> int:
        """The file offset of entry ``idx`` of a subsegment, checked to hold ``nbytes``."""
        si, offsets = sub
        if idx >= len(offsets):
            raise self.err(f"tensor names an entry past the {what}'s offsets", pos, expected=f"< {len(offsets)}", found=idx)
        start, size = self.segments[si]
        off = offsets[idx]
        if off + nbytes > size:
            raise TruncatedError(
                f"ExecuTorch program: tensor data runs past the end of the {what}",
                path=self.name,
                offset=start + off,
                expected=f"{nbytes} bytes",
                found=max(size - off, 0),
            )
        return start + off


def read_program(buf: Any, name: str = "<pte>", *, source: ByteSource | None = None) -> Program:
    """Parse a ``.pte`` (bytes or a memoryview over the whole file). Tensor data and
    delegate blobs are read later through ``source`` (the file's byte source; by default
    one over ``buf``), so a source that is closed releases the file.

    Raises:
        FormatError / TruncatedError: offsets, sizes or indices outside the file or its tables.
        UnsupportedError: a file identifier other than ``ET12``.
        LimitError: more than :data:`MAX_VALUES` values in a plan.
    """
    return _Reader(buf, name, source if source is not None else BytesSource(buf, name)).read()


class ExecuTorchArtifact(Artifact):
    """An opened ``.pte``: ``tensors()`` are the constant tensors (and mutable buffers'
    initial states), named by their fully qualified name when the program records one,
    else ``<plan>.values.<index>``; ``program`` is the parsed :class:`Program`."""

    format = "executorch"

    def __init__(self, path: Any, policy: LoadPolicy | None = None, *, probe: Probe | None = None) -> None:
        super().__init__(path if not isinstance(path, (bytes, bytearray, memoryview)) else "<bytes>", policy)
        if probe is not None:
            probe.close()
        self.source = open_source(path)
        try:
            buf, size = spec.program_view(self.source)
            self.program = _Reader(buf, str(self.path), self.source, size).read()
        except TorchlessError as e:
            self.source.close()
            e.with_context(path=self.path)
            raise
        except BaseException:
            self.source.close()
            raise

    def tensors(self) -> Iterator[tuple[str, Any]]:
        seen: set[tuple[int, int]] = set()
        for plan in self.program.plans:
            for vi, tv in plan.tensors():
                if tv.kind not in ("constant", "mutable") or tv.tensor.storage is None:
                    continue
                key = (tv.kind == "mutable", tv.data_buffer_idx)
                if key in seen:  # one constant used by several plans
                    continue
                seen.add(key)
                yield tv.name or f"{plan.name}.values.{vi}", tv.tensor

    def load(self, *, weights_only: bool | None = None) -> Any:
        """The parsed :class:`Program` (no pickle: nothing to refuse)."""
        self.load_policy(weights_only)
        return self.program

    def info(self) -> dict[str, Any]:
        p = self.program
        out: dict[str, Any] = {
            "format": "executorch",
            "path": self.path,
            "container": "flatbuffer",
            "identifier": p.identifier,
            "schema_version": p.version,
            "extended_header": None
            if p.program_size is None
            else {
                "program_size": p.program_size,
                "segment_base_offset": p.segment_base_offset,
                "segment_data_size": p.segment_data_size,
            },
            "segments": [{"offset": o, "size": s} for o, s in p.segments],
            "constants": p.constant_count,
        }
        out.update(summarize_tensors(self.tensors()))
        plans = {}
        for plan in p.plans:
            kinds: dict[str, int] = {}
            for v in plan.values:
                k = v.kind if isinstance(v, TensorValue) else type(v).__name__
                kinds[k] = kinds.get(k, 0) + 1
            plans[plan.name] = {
                "values": len(plan.values),
                "value_kinds": kinds,
                "inputs": plan.inputs,
                "outputs": plan.outputs,
                "instructions": len(plan.instructions),
                "operators": [f"{n}.{o}" if o else n for n, o in plan.operators],
                "delegates": [{"id": d.id, "location": d.location, "size": len(d.blob)} for d in plan.delegates],
                "non_const_buffer_sizes": plan.non_const_buffer_sizes,
            }
        out["plans"] = plans
        if p.named_data:
            out["named_data"] = {k: s for k, s in p.named_data}
        return out

    def verify(self) -> list[Problem]:
        problems: list[Problem] = []
        for name, t in self.tensors():
            try:
                t._check_bounds()
            except TorchlessError as e:
                problems.append(Problem("tensor", str(e), name))
        return problems

    def close(self) -> None:
        self.source.close()
