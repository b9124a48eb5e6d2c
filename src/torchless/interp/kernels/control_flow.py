"""Kernels of the higher-order operators: control flow and wrappers around subgraphs.

A subgraph argument arrives as a :class:`~torchless.interp.interpreter.GraphFunction`
(calling it runs the subgraph and returns its output tuple). The semantics are those of
the ops' dense (eager) implementations in ``torch/_higher_order_ops``:

* ``cond(pred, true_fn, false_fn, operands)``: one branch, chosen by ``pred``.
* ``while_loop(cond_fn, body_fn, carried_inputs, additional_inputs, *, mutated_arg_indices)``:
  ``body_fn`` while ``cond_fn`` is true; returns the final carried values
  (``mutated_arg_indices`` only annotates the subgraphs; any other keyword is refused).
  ``while_loop_stack_output``: the same loop returning each carried value of every
  iteration stacked (the initial ones, unsqueezed, when the loop never runs).
* ``map_impl(f, xs, pos_args)``: ``f`` on each slice ``xs[i]``; the outputs stacked.
* ``scan(combine_fn, init, xs, additional_inputs)``: ``combine_fn(*carry, *x[i], *add)``
  gives ``(*carry, *y)``; returns ``[*final_carry, *stacked_ys]``.
* ``wrap_with_set_grad_enabled`` / ``invoke_subgraph``: the subgraph, called (no autograd
  here). ``wrap_with_autocast``: the subgraph, with CPU autocast's casts applied to its
  operators while enabled (:mod:`..autocast`); another device's enabled region is refused.
* ``out_dtype(op, dtype, *args)``: ``op`` computed with its inputs in ``dtype``.
* ``auto_functionalized_v2(op, _all_bases=[...], **kwargs)``: the bases copied, each
  mutable argument re-created as its view of a copy (whole base, alias, slice or
  ``as_strided``), ``op`` run in place on them; returns ``(*op_outputs, *new_bases)``.
* ``auto_functionalized(op, **kwargs)`` (v1, what export made before v2 and still makes
  with ``torch._export.config.enable_auto_functionalized_v2_for_export = False``): each
  mutable argument copied, ``op`` run in place on the copies; returns
  ``(*op_outputs, *copies)``. The mutable arguments come from the ATen schema or, for a
  custom operator, its kernel's ``mutates`` declaration.
* ``with_effects(token, op, *args)``: ``op`` run; returns ``(token, *outputs)``.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

from ...core.errors import LimitError, UnsupportedError, UsageError
from .. import autocast, limits, registry
from ..registry import kernel


def _pred(v: Any) -> bool:
    if isinstance(v, (tuple, list)):
        if len(v) != 1:
            raise UsageError("a predicate must be one value", found=f"{len(v)} values")
        v = v[0]
    if isinstance(v, np.ndarray):
        if v.size != 1:
            raise UsageError("a predicate must be a one-element tensor", found=f"shape {list(v.shape)}")
        return bool(v.reshape(()))
    return bool(v)


def _tuple(v: Any) -> tuple[Any, ...]:
    return tuple(v) if isinstance(v, (tuple, list)) else (v,)


@kernel("higher_order.cond")
def cond(pred: Any, true_fn: Any, false_fn: Any, operands: Any = ()) -> Any:
    return (true_fn if _pred(pred) else false_fn)(*operands)


def _loop(cond_fn: Any, body_fn: Any, carried_inputs: Any, additional_inputs: Any, stack: bool) -> tuple[Any, ...]:
    carried = tuple(carried_inputs)
    extra = tuple(additional_inputs)
    rows: list[tuple[Any, ...]] = []
    caps = limits.active()
    iterations = 0
    kept = 0  # bytes of the rows kept for stacking
    while _pred(cond_fn(*carried, *extra)):
        if iterations >= caps.max_iterations:
            raise LimitError(
                "while_loop ran too many iterations (its condition may never become false)",
                expected=f"at most {caps.max_iterations} iterations",
                found=f"{iterations} iterations done and the condition still true",
                hint="raise the cap with --max-iterations / RunLimits if the model really needs it",
            )
        iterations += 1
        out = _tuple(body_fn(*carried, *extra))
        if len(out) != len(carried):
            raise UsageError("while_loop body returned the wrong number of values", expected=len(carried), found=len(out))
        carried = out
        if stack:
            kept += sum(int(c.nbytes) for c in out if isinstance(c, np.ndarray))
            if kept > caps.max_bytes:
                limits.check_count(kept, 1, "while_loop_stack_output's stacked rows", caps)
            rows.append(out)
    if stack:
        if not rows:  # no iteration: each carried input with a leading dimension of 1
            return tuple(np.expand_dims(np.array(c, copy=True), 0) for c in carried)
        return tuple(_stack(rows, "while_loop_stack_output"))
    # torch's results never alias the inputs
    return tuple(np.array(c, copy=True) if isinstance(c, np.ndarray) else c for c in carried)


def _no_unknown_kwargs(op: str, kw: dict[str, Any]) -> None:
    if kw:
        raise UnsupportedError(f"{op}: unknown keyword argument{'s' if len(kw) > 1 else ''} {', '.join(sorted(kw))}")


@kernel("higher_order.while_loop")
def while_loop(
    cond_fn: Any, body_fn: Any, carried_inputs: Any, additional_inputs: Any = (), *, mutated_arg_indices: str = "", **kw: Any
) -> tuple[Any, ...]:
    # ``mutated_arg_indices`` (which carried inputs the body mutates in place) only describes
    # the subgraphs for functionalization; the eager loop ignores it, and so does this one
    _no_unknown_kwargs("higher_order.while_loop", kw)
    return _loop(cond_fn, body_fn, carried_inputs, additional_inputs, stack=False)


@kernel("higher_order.while_loop_stack_output")
def while_loop_stack_output(
    cond_fn: Any, body_fn: Any, carried_inputs: Any, additional_inputs: Any = (), **kw: Any
) -> tuple[Any, ...]:
    _no_unknown_kwargs("higher_order.while_loop_stack_output", kw)
    return _loop(cond_fn, body_fn, carried_inputs, additional_inputs, stack=True)


def _length(xs: list[Any], op: str) -> int:
    if not xs:
        raise UsageError(f"{op} needs at least one tensor to iterate over")
    n = int(np.shape(xs[0])[0]) if np.ndim(xs[0]) else -1
    for x in xs:
        if np.ndim(x) == 0 or np.shape(x)[0] != n:
            raise UsageError(f"{op}: the tensors iterated over differ in their leading dimension")
    return n


def _stack(rows: list[tuple[Any, ...]], what: str) -> list[Any]:
    if not rows:
        raise UnsupportedError(f"{what} over zero elements (the output shapes are unknown)")
    return [np.stack([np.asarray(r[k]) for r in rows]) for k in range(len(rows[0]))]


@kernel("higher_order.map_impl")
def map_impl(f: Any, xs: Any, pos_args: Any = ()) -> list[Any]:
    xs = list(xs)
    n = _length(xs, "map")
    extra = tuple(pos_args)
    rows = [_tuple(f(*(x[i] for x in xs), *extra)) for i in range(n)]
    return _stack(rows, "map")


@kernel("higher_order.scan")
def scan(combine_fn: Any, init: Any, xs: Any, additional_inputs: Any = ()) -> list[Any]:
    carry = tuple(init)
    xs = list(xs)
    extra = tuple(additional_inputs)
    n = _length(xs, "scan") if xs else 0
    ys: list[tuple[Any, ...]] = []
    k = len(carry)
    for i in range(n):
        out = _tuple(combine_fn(*carry, *(x[i] for x in xs), *extra))
        carry, y = out[:k], out[k:]
        ys.append(y)
    if n == 0:
        return list(carry)
    stacked = [np.stack([np.asarray(r[j]) for r in ys]) for j in range(len(ys[0]))]
    return [*(np.array(c, copy=True) if isinstance(c, np.ndarray) else c for c in carry), *stacked]


@kernel("higher_order.wrap_with_set_grad_enabled")
def wrap_with_set_grad_enabled(enable_grad: Any, fn: Any, *args: Any) -> Any:
    return fn(*args)


@kernel("higher_order.wrap_with_autocast")
def wrap_with_autocast(device_type: Any, dtype: Any, enabled: Any, cache_enabled: Any, fn: Any, *args: Any) -> Any:
    if not enabled:
        token = autocast.STATE.set(None)
    else:
        if str(device_type) != "cpu":
            raise UnsupportedError(
                f"an enabled {device_type} autocast region is not run: only CPU autocast's casting policy is implemented"
            )
        npd = getattr(dtype, "numpy", None) if dtype is not None else np.dtype(ml_dtypes.bfloat16)
        if npd is None:
            raise UnsupportedError(f"autocast to {dtype} has no NumPy dtype")
        token = autocast.STATE.set(np.dtype(npd))
    try:
        return fn(*args)
    finally:
        autocast.STATE.reset(token)


@kernel("higher_order.invoke_subgraph")
def invoke_subgraph(subgraph: Any, identifier: Any, *operands: Any) -> Any:
    return subgraph(*operands)


@kernel("higher_order.out_dtype")
def out_dtype(op: Any, dtype: Any, *args: Any) -> Any:
    key = getattr(op, "key", None) or str(op)
    fn = registry.require(key)
    npd = getattr(dtype, "numpy", None)
    if npd is None:
        raise UnsupportedError(f"out_dtype to {dtype} has no NumPy dtype")
    cast = [a.astype(npd) if isinstance(a, np.ndarray) else a for a in args]
    return np.asarray(fn(*cast)).astype(npd, copy=False)


# -- functionalized mutation of (custom) operators ---------------------------------------


def _op_kernel(op: Any) -> Any:
    return registry.require(getattr(op, "key", None) or str(op))


def _regenerate_view(prefix: str, kw: dict[str, Any], bases: list[Any]) -> Any:
    """The view ``auto_functionalized_v2`` describes with ``<prefix>_*`` keys (popped from
    ``kw``), taken of the new bases (torch's ``read_view_information_from_args``)."""
    index = kw.pop(f"{prefix}_base_index")
    if index is None:
        return None
    base = bases[index]
    if f"{prefix}_alias" in kw:
        kw.pop(f"{prefix}_alias")
        return base
    if f"{prefix}_storage_offset" in kw:
        size, stride, offset = kw.pop(f"{prefix}_size"), kw.pop(f"{prefix}_stride"), kw.pop(f"{prefix}_storage_offset")
        flat = base.reshape(-1)  # the new bases are C-contiguous copies
        item = base.itemsize
        return np.lib.stride_tricks.as_strided(
            flat[int(offset) :], shape=tuple(int(s) for s in size), strides=tuple(int(s) * item for s in stride)
        )
    if f"{prefix}_slice_dim" in kw:
        dim, start, end = kw.pop(f"{prefix}_slice_dim"), kw.pop(f"{prefix}_slice_start"), kw.pop(f"{prefix}_slice_end")
        dim = int(dim) % max(base.ndim, 1)
        return base[(slice(None),) * dim + (slice(start, end),)]
    return base


@kernel("higher_order.auto_functionalized_v2")
def auto_functionalized_v2(_mutable_op: Any, **kwargs: Any) -> tuple[Any, ...]:
    kw = dict(kwargs)
    kw.pop("_only_clone_these_bases", None)
    bases = [None if b is None else np.array(b, copy=True, order="C") for b in kw.pop("_all_bases", [])]
    if any(k.startswith("_") and k.endswith(("_dtype", "_device")) for k in kw):
        raise UnsupportedError(f"auto_functionalized_v2 of an out= operator ({_mutable_op}) is not supported")
    lists = [k[1 : -len("_length")] for k in list(kw) if k.startswith("_") and k.endswith("_length")]
    new: dict[str, Any] = {}
    for name in lists:
        length = kw.pop(f"_{name}_length")
        new[name] = None if length is None else [_regenerate_view(f"_{name}_{i}", kw, bases) for i in range(int(length))]
    for k in [k for k in kw if k.startswith("_") and k.endswith("_base_index")]:
        name = k[1 : -len("_base_index")]
        new[name] = _regenerate_view(f"_{name}", kw, bases)
    out = _op_kernel(_mutable_op)(**kw, **new)
    return (*out, *bases) if isinstance(out, tuple) else (out, *bases)


@kernel("higher_order.auto_functionalized")
def auto_functionalized(_mutable_op: Any, _only_clone_these_tensors: Any = None, **kwargs: Any) -> tuple[Any, ...]:
    """The older form (v1): each mutable argument copied (all of them, or those
    ``_only_clone_these_tensors`` names), the operator run in place on the copies;
    returns ``(*op_outputs, *mutable_args)`` in the schema's order of the mutable arguments."""
    key = getattr(_mutable_op, "key", None) or str(_mutable_op)
    names = registry.mutable_args(key)
    if names is None:
        raise UnsupportedError(
            f"auto_functionalized of {key}: which arguments the operator mutates is unknown "
            f"(declare them with its kernel: registry.kernel({key!r}, mutates=(...)))"
        )
    only = None if _only_clone_these_tensors is None else set(_only_clone_these_tensors)
    new = dict(kwargs)
    mutated: list[Any] = []
    for name in names:
        v = kwargs.get(name)
        if v is not None and (only is None or name in only):
            v = [np.array(a, copy=True) for a in v] if isinstance(v, (list, tuple)) else np.array(v, copy=True)
        new[name] = v
        mutated.append(v)
    out = _op_kernel(_mutable_op)(**new)
    return (*out, *mutated) if isinstance(out, tuple) else (out, *mutated)


@kernel("higher_order.with_effects")
def with_effects(token: Any, op: Any, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
    out = _op_kernel(op)(*args, **kwargs)
    if out is None:
        return (token,)
    return (token, *out) if isinstance(out, tuple) else (token, out)
