"""The interpreter's memory and loop caps: no ``.pt2`` may make a run exhaust memory or loop forever.

One place for the caps (:class:`RunLimits`, default :data:`RUN_LIMITS`; docs/interpreter.md
lists them). :data:`STATE` holds the caps of the current run; :func:`run_limits` sets them for
a block (``torchless run --max-memory`` does). The interpreter enforces them at three seams:

* before a kernel runs, :func:`precheck` computes from the node's arguments the number of
  elements an allocating operator is about to produce (factory ops from their ``size``,
  ``arange``'s range, window lengths, ``repeat``/``tile``/``repeat_interleave``, ``histc``'s
  bins, ``one_hot``'s classes, pads, ``index_select``, matrix products, upsampling, ``cat``,
  and the broadcast shape of any operator's tensor arguments); over a cap it raises
  :class:`~torchless.core.errors.LimitError` before anything is allocated;
* after a kernel, :func:`postcheck` refuses a result whose logical size is over the cap (a
  view such as ``expand`` costs nothing until a later node materializes it: it is refused
  here, before that node runs), and the interpreter keeps the bytes its live intermediates
  own under :attr:`RunLimits.max_bytes`;
* ``while_loop`` counts its iterations against :attr:`RunLimits.max_iterations` (torch's
  eager loop with a never-false condition runs forever; torchless stops with a LimitError).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from ..core.errors import LimitError, UsageError

__all__ = ["RUN_LIMITS", "STATE", "RunLimits", "active", "check_count", "owned_bytes", "postcheck", "precheck", "run_limits"]


@dataclass(frozen=True, slots=True)
class RunLimits:
    """The caps of one interpreter run.

    Attributes:
        max_elements: most elements of one tensor (a kernel's result or what it is about
            to allocate); well above real models (a 2**31-element tensor is 8 GiB of float32).
        max_bytes: most bytes the live intermediates of one graph run own at once, and most
            bytes one tensor may take.
        max_iterations: most iterations of one ``while_loop``.
    """

    max_elements: int = 2**31
    max_bytes: int = 16 << 30
    max_iterations: int = 100_000

    def __post_init__(self) -> None:
        for k in ("max_elements", "max_bytes", "max_iterations"):
            v = getattr(self, k)
            if type(v) is not int or v < 1:
                raise UsageError(f"{k} must be a positive int", found=repr(v)[:40])


#: the default caps
RUN_LIMITS = RunLimits()

#: the caps of the run in progress
STATE: ContextVar[RunLimits] = ContextVar("torchless_run_limits", default=RUN_LIMITS)


def active() -> RunLimits:
    """The caps in force."""
    return STATE.get()


@contextmanager
def run_limits(limits: RunLimits) -> Iterator[RunLimits]:
    """Run the block under ``limits``."""
    token = STATE.set(limits)
    try:
        yield limits
    finally:
        STATE.reset(token)


def check_count(count: int, itemsize: int, what: str, limits: RunLimits | None = None) -> None:
    """Refuse a tensor of ``count`` elements of ``itemsize`` bytes over the caps.

    Raises:
        LimitError: naming ``what`` (if given; the interpreter adds the node) and the
            requested size.
    """
    lim = limits or STATE.get()
    head = f"{what}: " if what else ""
    if count > lim.max_elements:
        raise LimitError(
            f"{head}tensor too large for the interpreter's cap",
            expected=f"at most {lim.max_elements} elements",
            found=f"{count} elements",
            hint="raise the cap with --max-memory / RunLimits if the model really needs it",
        )
    if count * itemsize > lim.max_bytes:
        raise LimitError(
            f"{head}tensor too large for the interpreter's cap",
            expected=f"at most {lim.max_bytes} bytes",
            found=f"{count * itemsize} bytes",
            hint="raise the cap with --max-memory / RunLimits if the model really needs it",
        )


def owned_bytes(v: Any) -> int:
    """The bytes ``v`` (an array, or a tuple/list of them) owns; views own none."""
    if isinstance(v, np.ndarray):
        return v.nbytes if v.base is None else 0
    if isinstance(v, (tuple, list)):
        return sum(owned_bytes(x) for x in v)
    return 0


def postcheck(v: Any, what: str, limits: RunLimits) -> None:
    """Refuse a kernel result whose logical size (views included) is over the caps."""
    if isinstance(v, np.ndarray):
        if v.size > limits.max_elements or v.size * v.itemsize > limits.max_bytes:
            check_count(v.size, v.itemsize, what, limits)
    elif isinstance(v, (tuple, list)):
        for x in v:
            if isinstance(x, np.ndarray):
                postcheck(x, what, limits)


# ---- pre-checks: the size an operator is about to allocate, from its arguments


def _int(v: Any) -> int | None:
    if isinstance(v, (bool, np.bool_)):
        return int(v)
    if isinstance(v, (int, np.integer)):
        return int(v)
    if isinstance(v, np.ndarray) and v.size == 1 and v.dtype.kind in "iub":
        return int(v.reshape(()))
    return None


def _prod(dims: Any) -> int | None:
    if isinstance(dims, (int, np.integer)) and not isinstance(dims, bool):
        dims = (dims,)
    if not isinstance(dims, (tuple, list)):
        return None
    n = 1
    for d in dims:
        i = _int(d)
        if i is None:
            return None
        n *= max(i, 0)
    return n


def _arg(args: tuple[Any, ...] | list[Any], kwargs: dict[str, Any], pos: int, name: str, default: Any = None) -> Any:
    if len(args) > pos:
        return args[pos]
    return kwargs.get(name, default)


def _itemsize(kwargs: dict[str, Any], default: int = 4) -> int:
    d = kwargs.get("dtype")
    size = getattr(d, "itemsize", None)
    return size if isinstance(size, int) and size > 0 else default


def _arange(args: Any, kwargs: dict[str, Any], overload: str) -> int | None:
    if overload == "default":
        start, end, step = 0, _arg(args, kwargs, 0, "end"), 1
    elif overload in ("start", "start_out"):
        start, end, step = _arg(args, kwargs, 0, "start", 0), _arg(args, kwargs, 1, "end"), 1
    elif overload == "start_step":
        start, end, step = _arg(args, kwargs, 0, "start", 0), _arg(args, kwargs, 1, "end"), _arg(args, kwargs, 2, "step", 1)
    else:
        return None
    try:
        span = (float(end) - float(start)) / float(step)
    except (TypeError, ValueError, ZeroDivisionError, OverflowError):
        return None
    if not math.isfinite(span):
        return None  # the kernel refuses it
    return max(math.ceil(span), 0)


def _pad_count(x: Any, pad: Any) -> int | None:
    if not isinstance(x, np.ndarray) or not isinstance(pad, (tuple, list)):
        return None
    shape = list(x.shape)
    for k in range(len(pad) // 2):
        lo, hi = _int(pad[2 * k]), _int(pad[2 * k + 1])
        d = len(shape) - 1 - k
        if lo is None or hi is None or d < 0:
            return None
        shape[d] = max(shape[d] + lo + hi, 0)
    return _prod(shape)


def _upsample(x: Any, args: Any, kwargs: dict[str, Any]) -> int | None:
    if not isinstance(x, np.ndarray) or x.ndim < 3:
        return None
    out = _arg(args, kwargs, 1, "output_size")
    lead = x.shape[0] * x.shape[1]
    if isinstance(out, (tuple, list)) and out:
        p = _prod(out)
        return None if p is None else lead * p
    scales = _arg(args, kwargs, 2, "scale_factors")
    if isinstance(scales, (tuple, list)) and scales:
        n = lead
        for d, s in zip(x.shape[2:], scales, strict=False):
            try:
                n *= max(math.floor(d * float(s)), 0)
            except (TypeError, ValueError, OverflowError):
                return None
        return n
    return None


def _matmul(a: Any, b: Any) -> int | None:
    if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)) or a.ndim < 1 or b.ndim < 1:
        return None
    if a.ndim >= 2 and b.ndim >= 2:
        try:
            batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
        except ValueError:
            return None
        return math.prod(batch) * a.shape[-2] * b.shape[-1]
    return None


def _elements(op: str, overload: str, args: Any, kwargs: dict[str, Any]) -> int | None:
    """The elements operator ``op`` will allocate, where its arguments say it; else None."""
    x = args[0] if args else kwargs.get("self", kwargs.get("input"))
    if op in ("empty", "zeros", "ones", "rand", "randn", "empty_permuted", "full", "empty_strided", "randint"):
        if op == "randint":
            size = next((a for a in args if isinstance(a, (tuple, list))), kwargs.get("size"))
        else:
            size = _arg(args, kwargs, 0, "size")
        return _prod(size)
    if op in ("new_empty", "new_zeros", "new_ones", "new_full", "new_empty_strided"):
        return _prod(_arg(args, kwargs, 1, "size"))
    if op == "arange":
        return _arange(args, kwargs, overload)
    if op in ("linspace", "logspace"):
        return _int(_arg(args, kwargs, 2, "steps"))
    if op.endswith("_window"):
        return _int(_arg(args, kwargs, 0, "window_length"))
    if op == "eye":
        n, m = _int(_arg(args, kwargs, 0, "n")), _int(_arg(args, kwargs, 1, "m"))
        return None if n is None else n * (n if m is None else m)
    if op == "histc":
        return _int(_arg(args, kwargs, 1, "bins", 100))
    if not isinstance(x, np.ndarray):
        return None
    if op == "one_hot":
        k = _int(_arg(args, kwargs, 1, "num_classes", -1))
        if k is None or k < 0:
            k = int(x.max()) + 1 if x.size and x.dtype.kind in "iu" else 0
        return x.size * k
    if op in ("repeat", "tile"):
        p = _prod(_arg(args, kwargs, 1, "repeats" if op == "repeat" else "dims"))
        return None if p is None else x.size * p
    if op == "repeat_interleave":
        if overload == "Tensor":  # repeat_interleave(repeats): the repeats are the input
            return int(x.astype(np.int64, copy=False).sum()) if x.size and x.dtype.kind in "iu" else None
        r, dim = _arg(args, kwargs, 1, "repeats"), _arg(args, kwargs, 2, "dim")
        d = _int(dim)
        if isinstance(r, np.ndarray) and r.size > 1:
            total = int(r.astype(np.int64, copy=False).sum()) if r.dtype.kind in "iu" else None
            if total is None:
                return None
            return total if d is None or x.ndim == 0 else total * (x.size // max(x.shape[d], 1))
        n = _int(r)
        return None if n is None else x.size * max(n, 0)
    if op in ("constant_pad_nd", "pad", "reflection_pad1d", "reflection_pad2d", "reflection_pad3d") or op.startswith(
        "replication_pad"
    ):
        return _pad_count(x, _arg(args, kwargs, 1, "pad" if op != "constant_pad_nd" else "pad"))
    if op == "index_select":
        idx, d = _arg(args, kwargs, 2, "index"), _int(_arg(args, kwargs, 1, "dim"))
        if isinstance(idx, np.ndarray) and d is not None and x.ndim:
            return idx.size * (x.size // max(x.shape[d], 1))
        return None
    if op in ("mm", "bmm", "matmul", "baddbmm", "addmm"):
        if op in ("baddbmm", "addmm"):
            return _matmul(_arg(args, kwargs, 1, "batch1" if op == "baddbmm" else "mat1"), _arg(args, kwargs, 2, "b"))
        return _matmul(x, _arg(args, kwargs, 1, "other"))
    if op.startswith("upsample_") or op == "_upsample_nearest_exact2d":
        return _upsample(x, args, kwargs)
    return None


@lru_cache(maxsize=4096)
def _parse(key: str) -> tuple[str, str, bool] | None:
    """``(op, overload, whether _elements has a rule for op)`` of an ATen key, else None."""
    parts = key.split(".")
    if parts[0] != "aten" or len(parts) < 2:
        return None
    op = parts[1]
    ruled = op in _RULED or op.endswith("_window") or op.startswith(("upsample_", "replication_pad", "reflection_pad"))
    return op, parts[2] if len(parts) > 2 else "default", ruled


#: the operators :func:`_elements` sizes (besides ``*_window``, ``upsample_*`` and the pads)
_RULED = frozenset(
    [
        "empty",
        "zeros",
        "ones",
        "rand",
        "randn",
        "empty_permuted",
        "full",
        "empty_strided",
        "randint",
        "new_empty",
        "new_zeros",
        "new_ones",
        "new_full",
        "new_empty_strided",
        "arange",
        "linspace",
        "logspace",
        "eye",
        "histc",
        "one_hot",
        "repeat",
        "tile",
        "repeat_interleave",
        "constant_pad_nd",
        "pad",
        "index_select",
        "mm",
        "bmm",
        "matmul",
        "baddbmm",
        "addmm",
        "_upsample_nearest_exact2d",
        "cat",
    ]
)


def precheck(key: str, args: Any, kwargs: dict[str, Any], what: str, limits: RunLimits) -> None:
    """Refuse, before the kernel of ``key`` runs, a result its arguments make too large.

    Raises:
        LimitError: naming ``what`` and the requested size.
    """
    parsed = _parse(key)
    if parsed is None:
        return
    op, overload, ruled = parsed
    if op == "cat":
        ts = _arg(args, kwargs, 0, "tensors")
        if isinstance(ts, (tuple, list)):
            total = sum(t.size for t in ts if isinstance(t, np.ndarray))
            item = max((t.itemsize for t in ts if isinstance(t, np.ndarray)), default=1)
            check_count(total, item, what, limits)
        return
    n = _elements(op, overload, args, kwargs) if ruled else None
    if n is not None:
        item = x.itemsize if (x := args[0] if args else None) is not None and isinstance(x, np.ndarray) else 4
        check_count(n, _itemsize(kwargs, item), what, limits)
        return
    # any operator broadcasting its tensor arguments allocates the broadcast shape, which is
    # at most the product of their sizes: only when that product is over the cap is it computed
    bound, arrays = 1, 0
    for a in args:
        if isinstance(a, np.ndarray) and a.ndim:
            bound *= max(a.size, 1)
            arrays += 1
    if arrays >= 2 and bound > limits.max_elements // 8:
        try:
            shape = np.broadcast_shapes(*(a.shape for a in args if isinstance(a, np.ndarray) and a.ndim))
        except ValueError:
            return
        item = max(a.itemsize for a in args if isinstance(a, np.ndarray))
        check_count(math.prod(shape), item, what, limits)
