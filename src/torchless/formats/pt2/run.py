"""``Program.module()``: an exported program as a callable on NumPy, like
``torch.export.load(p).module()``.

The call's ``(args, kwargs)`` are flattened by the program's ``in_spec`` (its root
``module_call_graph`` entry), the user inputs checked and run by
:class:`torchless.interp.program.ProgramRunner`, and the user outputs folded back by the
``out_spec``. Tensor inputs may be NumPy arrays, torchless :class:`~torchless.core.tensor.Tensor`
objects, or anything ``numpy.asarray`` takes; results are NumPy arrays (and Python
scalars where the program returns SymInts).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...core.errors import FormatError, LimitError, TorchlessError, UnsupportedError, UsageError
from ...interp.guards import check_guards_code, guard_env
from ...interp.interpreter import to_array
from ...interp.program import ProgramRunner
from . import treespec

__all__ = ["ExportedModule", "call_specs"]


def call_specs(program: Any) -> tuple[treespec.TreeSpec | None, treespec.TreeSpec | None, list[str] | None]:
    """``(in_spec, out_spec, forward_arg_names)`` of the program's root module, or Nones."""
    gm = getattr(getattr(program, "schema", None), "graph_module", None)
    nt = {
        k: list(getattr(v, "field_names", None) or []) for k, v in (getattr(gm, "treespec_namedtuple_fields", None) or {}).items()
    }
    for entry in program.module_call_graph or ():
        if getattr(entry, "fqn", None) == "" and getattr(entry, "signature", None) is not None:
            sig = entry.signature
            try:
                ins = treespec.loads(sig.in_spec, nt) if sig.in_spec else None
                outs = treespec.loads(sig.out_spec, nt) if sig.out_spec else None
            except TorchlessError as e:
                e.with_context(member=f"models/{program.name}.json")
                raise
            return ins, outs, list(sig.forward_arg_names) if sig.forward_arg_names else None
    return None, None, None


def _array(v: Any) -> Any:
    if isinstance(v, (np.ndarray, bool, int, float, complex, str)) or v is None:
        return v
    if hasattr(v, "numpy") or hasattr(v, "__array__"):
        return to_array(v)
    return v


class ExportedModule:
    """A callable running one program; buffer mutations update :attr:`buffers`.

    Example:
        >>> m = torchless.load("mlp.pt2").module()          # doctest: +SKIP
        >>> y = m(np.ones((2, 4), np.float32))              # doctest: +SKIP
    """

    def __init__(self, program: Any, *, check_guards: bool = True) -> None:
        self.program = program
        self.check_guards = check_guards
        self.runner = ProgramRunner(program, check_guards=check_guards)
        self.in_spec, self.out_spec, self.arg_names = call_specs(program)
        odd = [t for spec in (self.in_spec, self.out_spec) if spec is not None for t in spec.unsupported_types()]
        if odd:  # refused before anything runs, not after the graph ran
            raise UnsupportedError(
                f"the program's inputs or outputs use pytree types torchless cannot rebuild: {', '.join(sorted(set(odd)))}",
                hint="namedtuples, register_dataclass types and mappings whose context is their keys are supported",
            )
        self.guards_code = [g for g in getattr(program, "guards_code", []) or [] if isinstance(g, str)]
        #: guards of ``guards_code`` torchless could not evaluate (on the last call)
        self.unchecked_guards: list[str] = []

    def _guards(self, leaves: list[Any]) -> None:
        """Assert the program's ``guards_code`` over the inputs (by ``forward``'s names)."""
        if not self.guards_code or self.in_spec is None:
            return
        args, kwargs = self.in_spec.unflatten(list(leaves))
        env: dict[str, Any] = dict(kwargs)
        for i, a in enumerate(args):
            env[self.arg_names[i] if self.arg_names and i < len(self.arg_names) else f"args_{i}"] = a
        self.unchecked_guards = check_guards_code(self.guards_code, guard_env(env))

    @property
    def buffers(self) -> dict[str, np.ndarray]:
        """Buffer FQN -> current value."""
        return self.runner.buffers

    def state_dict(self) -> dict[str, np.ndarray]:
        """Parameters and buffers, as ``module.state_dict()`` (current buffer values)."""
        return {**self.runner.params, **self.runner.buffers}

    def _name(self, p: str) -> str:
        """An input path as the caller wrote it: ``[0][1]`` -> ``y`` (the forward's second
        argument), ``[1]['k']`` -> ``k``, ``[0]`` -> ``args``, ``[1]`` -> ``kwargs``."""
        if p == "[0]":
            return "args"
        if p == "[1]":
            return "kwargs"
        if p.startswith("[0]["):
            i, _, rest = p[4:].partition("]")
            if i.isdigit() and self.arg_names and int(i) < len(self.arg_names):
                return self.arg_names[int(i)] + rest
            return f"args[{i}]{rest}"
        if p.startswith("[1]["):
            key, _, rest = p[4:].partition("]")
            return key.strip("'\"") + rest
        return p or "input"

    def accepted_names(self) -> list[str]:
        """The names an input may be passed by: the forward's parameters, then the keyword
        inputs the program was exported with (empty when it records no in_spec)."""
        if self.in_spec is None or len(self.in_spec.children) != 2:
            return []
        names = list(self.arg_names or [])
        return names + [str(k) for k in self.in_spec.children[1]._keys() if str(k) not in names]

    def bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """``(args, kwargs)`` with keyword inputs named after the forward's positional
        parameters moved to their positions, as Python binds ``forward(x=...)``.

        Raises:
            UsageError: a name the program has no input for (listing those it has), a
                position given twice, or one left out before a named one.
        """
        if self.in_spec is None or len(self.in_spec.children) != 2 or not kwargs:
            return args, kwargs
        n_pos = len(self.in_spec.children[0].children)
        keywords = {str(k) for k in self.in_spec.children[1]._keys()}
        names = list(self.arg_names or [])[:n_pos]
        unknown = [k for k in kwargs if k not in keywords and k not in names]
        if unknown:
            accepted = self.accepted_names()
            raise UsageError(
                f"the program has no input named {unknown[0]!r}",
                expected=f"one of {', '.join(accepted)}, or arg0, arg1... by position" if accepted else "inputs by position",
            )
        kw = dict(kwargs)
        pos = list(args)
        for i, name in enumerate(names):
            if name in kw and name not in keywords:
                if i < len(pos):
                    raise UsageError(f"input {name!r} given both by position ({i}) and by name")
                if i > len(pos):
                    raise UsageError(f"input {name!r} is given by name but {names[len(pos)]!r} before it is missing")
                pos.append(kw.pop(name))
        return tuple(pos), kw

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            args, kwargs = self.bind(args, kwargs)
        except UsageError as e:
            e.with_context(path=getattr(getattr(self.program, "_archive", None), "path", None))
            raise
        if self.in_spec is not None:
            flat = self.in_spec.flatten((tuple(args), dict(kwargs)), namer=self._name)
            paths = [p for p, _ in flat]
            leaves = [_array(v) for _, v in flat]
            names = [self._name(p) for p in paths]
        else:
            if kwargs:
                raise UsageError("this program records no in_spec: pass its inputs by position")
            leaves = [_array(v) for v in args]
            names = None
        try:
            outs = self.runner.run(leaves, names, extra_check=self._guards if self.check_guards else None)
        except TorchlessError as e:  # named by the file run; and by its program's JSON when an
            # expression it holds (a size, a guard, SymInt arithmetic) is over a cap
            arc = getattr(self.program, "_archive", None)
            member = f"models/{self.program.name}.json" if isinstance(e, LimitError) else None
            e.with_context(path=getattr(arc, "path", None), member=member)
            raise
        if self.out_spec is not None:
            if self.out_spec.num_leaves != len(outs):
                raise FormatError(
                    "out_spec does not match the program's outputs", expected=self.out_spec.num_leaves, found=len(outs)
                )
            return self.out_spec.unflatten(outs)
        return tuple(outs)

    def __repr__(self) -> str:
        return f"ExportedModule({self.program.name!r}, {len(self.program.graph.nodes)} nodes)"
