"""``torchless run MODEL.pt2``: run an exported program on NumPy and summarize its outputs."""

from __future__ import annotations

import argparse
import re
from typing import Any

from ...core.errors import InternalError, NotFoundError, UsageError
from ..render import echo

__all__ = ["register", "flatten_outputs", "summarize"]

_POS = re.compile(r"^arg(\d+)$")


def flatten_outputs(tree: Any, path: str = "out") -> list[tuple[str, Any]]:
    """``(path, leaf)`` for every leaf of an output pytree: ``out[0]``, ``out['logits']``."""
    if isinstance(tree, (tuple, list)):
        return [x for i, v in enumerate(tree) for x in flatten_outputs(v, f"{path}[{i}]")]
    if isinstance(tree, dict):
        return [x for k, v in tree.items() for x in flatten_outputs(v, f"{path}[{k!r}]")]
    return [(path, tree)]


def summarize(name: str, v: Any) -> dict[str, Any]:
    """Shape, dtype and min/max/mean of one output (None where they do not apply)."""
    import numpy as np

    if v is None or isinstance(v, (bool, int, float)):
        return {"name": name, "dtype": type(v).__name__, "shape": [], "min": v, "max": v, "mean": v}
    a = np.asarray(v)
    row: dict[str, Any] = {"name": name, "dtype": _dtype_name(a), "shape": [int(s) for s in a.shape]}
    if a.size == 0 or a.dtype.kind in "cVOSU":
        row.update(min=None, max=None, mean=None)
        return row
    f = a.astype(np.float64)
    row.update(min=_num(f.min()), max=_num(f.max()), mean=_num(f.mean()))
    return row


def _num(x: Any) -> float | int:
    x = float(x)
    return int(x) if x.is_integer() and abs(x) < 2**53 else x


def _dtype_name(a: Any) -> str:
    from ...core.dtypes import from_numpy

    try:
        return from_numpy(a.dtype).name
    except Exception:  # noqa: BLE001 - a dtype torch has no name for is shown as NumPy's
        return str(a.dtype)


def _read_inputs(path: str) -> tuple[list[Any], dict[str, Any]]:
    from ..._api import open as open_artifact

    art = open_artifact(path)
    try:
        items = {name: t.numpy() for name, t in art.tensors()}
    finally:
        art.close()
    pos: dict[int, Any] = {}
    kwargs: dict[str, Any] = {}
    for name, arr in items.items():
        m = _POS.match(name)
        if m:
            pos[int(m.group(1))] = arr
        else:
            kwargs[name] = arr
    if sorted(pos) != list(range(len(pos))):
        raise UsageError(
            "positional inputs must be named arg0, arg1, ... without gaps",
            path=path,
            found=", ".join(f"arg{i}" for i in sorted(pos)),
        )
    return [pos[i] for i in range(len(pos))], kwargs


def _bytes(text: str) -> int:
    """``16G``, ``512M``, ``1048576``: a byte count for ``--max-memory``."""
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    mult = 1
    if t and t[-1] in "KMGT":
        mult = 1 << (10 * ("KMGT".index(t[-1]) + 1))
        t = t[:-1]
    try:
        n = int(t) * mult
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a byte count: {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"not a positive byte count: {text!r}")
    return n


def cmd_run(args: argparse.Namespace) -> int:
    import numpy as np

    from ..._cli_api import Pt2Artifact
    from ._fit import open_required
    from ._output import check_output

    check_output(args.output, force=args.force)
    with open_required(args.path, ("pt2",), "run") as art:
        if not isinstance(art, Pt2Artifact):  # the pt2 handler opened it
            raise InternalError(f"the pt2 handler opened {type(art).__name__}")
        if bool(args.inputs) == bool(args.sample_inputs):
            raise UsageError("give either --inputs IN.npz or --sample-inputs")
        arc = art.archive
        if args.model is None:
            prog = arc.program
        elif args.model in arc.programs:
            prog = arc.programs[args.model]
        else:
            raise NotFoundError(f"no model {args.model!r}", path=args.path, expected=", ".join(arc.programs))
        if args.sample_inputs:
            sample = prog.sample_inputs
            if sample is None:
                raise NotFoundError("the archive holds no sample inputs", path=args.path, hint="pass --inputs IN.npz")
            pargs, kwargs = sample
            pargs, kwargs = list(pargs), dict(kwargs)
        else:
            pargs, kwargs = _read_inputs(args.inputs)
        from ..._cli_api import RUN_LIMITS, RunLimits, run_limits
        from ...core.errors import TorchlessError

        caps = RunLimits(
            max_elements=RUN_LIMITS.max_elements,
            max_bytes=args.max_memory if args.max_memory is not None else RUN_LIMITS.max_bytes,
            max_iterations=args.max_iterations if args.max_iterations is not None else RUN_LIMITS.max_iterations,
        )
        module = prog.module()
        try:
            with run_limits(caps):
                out = module(*pargs, **kwargs)
        except TorchlessError as e:
            raise e.with_context(path=args.path) from None
        leaves = flatten_outputs(out)
        rows = [summarize(n, v) for n, v in leaves]
        inputs = [summarize(f"arg{i}", v) for i, v in enumerate(pargs)] + [summarize(k, v) for k, v in kwargs.items()]
        if args.output:
            from ..._api import write_tensors
            from ...core.tensor import Tensor

            write_tensors({n: Tensor.from_numpy(np.asarray(v)) for n, v in leaves if v is not None}, args.output, format="npz")
        if args.json:
            from ..render import emit_json

            emit_json(
                "run",
                {
                    "path": args.path,
                    "model": prog.name,
                    "inputs": [{k: r[k] for k in ("name", "dtype", "shape")} for r in inputs],
                    "outputs": rows,
                    "output_file": args.output,
                },
            )
            return 0
    from ..render import format_table

    def cell(x: Any) -> str:
        return "-" if x is None else (f"{x:.6g}" if isinstance(x, float) else str(x))

    table = [[r["name"], r["dtype"], str(r["shape"]), cell(r["min"]), cell(r["max"]), cell(r["mean"])] for r in rows]
    echo(format_table(table, ["output", "dtype", "shape", "min", "max", "mean"]))
    if args.output:
        echo(f"wrote {len(leaves)} output{'s' if len(leaves) != 1 else ''} to {args.output}")
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser(
        "run",
        help="run an exported program (.pt2) on NumPy and summarize its outputs",
        description="Run a torch.export archive with torchless's NumPy interpreter (no torch) and print each "
        "output's shape, dtype and min/max/mean. Inputs come from an .npz (arrays named after the forward's "
        "parameters, or arg0, arg1... by position; other names as keyword arguments) or from the archive's own "
        "sample inputs.",
    )
    p.add_argument("path")
    p.add_argument(
        "--inputs", metavar="IN.npz", help="the inputs, named after the forward's parameters (or arg0, arg1... by position)"
    )
    p.add_argument("--sample-inputs", action="store_true", help="use the sample inputs stored in the archive")
    p.add_argument("-o", "--output", metavar="OUT.npz", help="write the outputs (named out[0], out['key']...) to an .npz")
    p.add_argument("--model", help="which model of a multi-model archive (default: model)")
    p.add_argument(
        "--max-memory",
        type=_bytes,
        metavar="BYTES",
        help="cap on the bytes of one tensor and of the live intermediates (suffix K/M/G/T allowed; default 16G)",
    )
    p.add_argument("--max-iterations", type=int, metavar="N", help="cap on the iterations of one while_loop (default 100000)")
    p.add_argument("--json", action="store_true", help="machine-readable output (schema: docs/cli.md)")
    from ._output import add_force_flag

    add_force_flag(p)
    p.set_defaults(func=cmd_run)
