"""Run an exported program: its graph with the lifted state bound, inputs checked,
mutations applied.

An ExportedProgram's graph takes its parameters, buffers and constants as placeholders
(the signature's ``input_specs`` say which); :class:`ProgramRunner` binds them from the
program's state dict and constants, binds the user inputs, checks them
(:mod:`.guards`), runs the graph (:mod:`.interpreter`) and splits the outputs by the
signature's ``output_specs``: ``BUFFER_MUTATION`` outputs become the buffers' new values
and ``USER_INPUT_MUTATION`` outputs are written into the user's arrays, as torch's
unlifted module (``ExportedProgram.module()``) does; the user outputs are returned. In the
training IR a mutation is an in-place op on the buffer itself, which the runner's own
(writable) copy of each buffer receives.

The program is duck-typed (``graph``, ``signature``, ``state_dict``, ``constants``,
``range_constraints``), so this layer does not depend on the ``.pt2`` reader;
:meth:`torchless.formats.pt2.read.Program.module` builds one.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..core.errors import UnsupportedError, UsageError
from ..graph.ir import SymValue, TensorValue
from .guards import InputSlot, check_inputs
from .interpreter import plan, run_graph, to_array

__all__ = ["ProgramRunner"]


def _state_array(v: Any, what: str, *, writable: bool) -> np.ndarray:
    if not (hasattr(v, "numpy") or isinstance(v, np.ndarray)):
        raise UnsupportedError(f"{what} is not a tensor the interpreter can use", found=type(v).__name__)
    arr = to_array(v)
    return np.array(arr, copy=True) if writable or not arr.flags.c_contiguous and arr.ndim > 1 else arr


class ProgramRunner:
    """One program, ready to run; holds its own copy of the buffers.

    Attributes:
        buffers: buffer FQN -> current value (updated by mutations).
        params: parameter FQN -> value (read-only views of the stored weights).
        constants: constant FQN -> value.
    """

    def __init__(self, program: Any, *, check_guards: bool = True) -> None:
        self.program = program
        self.graph = program.graph
        self.signature = program.signature
        self.check_guards = check_guards
        self.plans: dict[int, Any] = {}
        plan(self.graph, self.plans)  # every operator has a kernel, or nothing runs
        sd, consts = program.state_dict, program.constants
        self.params: dict[str, np.ndarray] = {}
        self.buffers: dict[str, np.ndarray] = {}
        self.constants: dict[str, np.ndarray] = {}
        for s in self.signature.input_specs:
            if s.kind == "PARAMETER":
                self.params[s.target] = _state_array(
                    self._lookup(s.target, sd, consts), f"parameter {s.target!r}", writable=False
                )
            elif s.kind == "BUFFER":
                self.buffers[s.target] = _state_array(self._lookup(s.target, sd, consts), f"buffer {s.target!r}", writable=True)
            elif s.kind == "CONSTANT_TENSOR":
                self.constants[s.target] = _state_array(
                    self._lookup(s.target, consts, sd), f"constant {s.target!r}", writable=True
                )
            elif s.kind == "CUSTOM_OBJ":
                raise UnsupportedError(f"the program takes a TorchBind object ({s.target!r}); the interpreter cannot run it")
        self.placeholders = {n.name: n for n in self.graph.placeholders}
        self.user_specs = [s for s in self.signature.input_specs if s.kind == "USER_INPUT"]

    @staticmethod
    def _lookup(target: str, first: dict[str, Any], second: dict[str, Any]) -> Any:
        if target in first:
            return first[target]
        if target in second:
            return second[target]
        raise UsageError(f"the program's state has no {target!r}")

    @property
    def num_user_inputs(self) -> int:
        return len(self.user_specs)

    def _user_value(self, spec: Any, value: Any, name: str) -> Any:
        ph = self.placeholders.get(spec.arg) if spec.arg else None
        exp = ph.meta.get("val") if ph is not None else spec.value
        if isinstance(exp, TensorValue):
            arr = to_array(value)
            if arr.dtype.byteorder == ">" or (arr.dtype.byteorder == "<" and np.little_endian is False):
                arr = arr.astype(arr.dtype.newbyteorder("="))  # kernels see native byte order
            return arr
        if isinstance(exp, SymValue) and isinstance(value, np.ndarray) and value.ndim == 0:
            return value.item()
        return value

    def run(self, user_inputs: list[Any], names: list[str] | None = None, *, extra_check: Any = None) -> list[Any]:
        """Run with the flat user inputs (in signature order); returns the flat user outputs.
        ``extra_check(values)`` runs after the input checks, before the graph (the module's
        ``guards_code``).

        Raises:
            UsageError: wrong number of inputs, or an input the program was not exported for.
        """
        if len(user_inputs) != len(self.user_specs):
            raise UsageError("wrong number of inputs", expected=len(self.user_specs), found=len(user_inputs))
        names = names or [s.arg or f"arg{i}" for i, s in enumerate(self.user_specs)]
        values = [self._user_value(s, v, n) for s, v, n in zip(self.user_specs, user_inputs, names, strict=True)]
        if self.check_guards:
            slots = []
            for s, v, n in zip(self.user_specs, values, names, strict=True):
                ph = self.placeholders.get(s.arg) if s.arg else None
                slots.append(InputSlot(n, ph.meta.get("val") if ph is not None else s.value, v))
            check_inputs(slots, dict(self.program.range_constraints))
            if extra_check is not None:
                extra_check(values)
        by_arg: dict[str, Any] = {}
        graph_inputs: list[Any] = []
        it = iter(values)
        for s in self.signature.input_specs:
            if s.kind == "PARAMETER":
                v = self.params[s.target]
            elif s.kind == "BUFFER":
                v = self.buffers[s.target]
            elif s.kind == "CONSTANT_TENSOR":
                v = self.constants[s.target]
            elif s.kind == "TOKEN":
                v = np.empty((0,), np.float32)
            else:
                v = next(it)
            if s.arg:
                by_arg[s.arg] = v
            graph_inputs.append(v)
        out = run_graph(self.graph, graph_inputs, self.plans)
        outs = list(out) if isinstance(out, (tuple, list)) else [out]
        if len(outs) != len(self.signature.output_specs):
            raise UsageError(
                "the graph's outputs do not match its signature", expected=len(self.signature.output_specs), found=len(outs)
            )
        user: list[Any] = []
        for spec, v in zip(self.signature.output_specs, outs, strict=True):
            if spec.kind in ("USER_OUTPUT", "LOSS_OUTPUT"):
                user.append(v)
            elif spec.kind == "BUFFER_MUTATION":
                old = self.buffers.get(spec.target)
                new = np.array(v, copy=True)
                self.buffers[spec.target] = new.astype(old.dtype, copy=False) if old is not None else new
            elif spec.kind in ("USER_INPUT_MUTATION", "PARAMETER_MUTATION"):
                dst = by_arg.get(spec.target) if spec.kind == "USER_INPUT_MUTATION" else self.params.get(spec.target)
                if isinstance(dst, np.ndarray) and dst.flags.writeable and dst.shape == np.shape(v):
                    np.copyto(dst, v, casting="unsafe")
                elif spec.kind == "PARAMETER_MUTATION":
                    self.params[spec.target] = np.array(v, copy=True)
                else:
                    raise UsageError(f"the program mutates input {spec.target!r}, which is not a writable NumPy array")
        return user
