"""What the trainer artifacts share: opening a side file, describing optimizer and
scheduler state dicts (``torch.optim.Optimizer.state_dict()`` and friends)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any

from ...core.tree import is_tensor, iter_tensors
from ...core.values import GlobalRef, PickledObject
from ..base import LoadPolicy

__all__ = ["describe_optimizer", "describe_scheduler", "optimizer_tensors", "placeholder_policy", "class_name", "scalar"]

#: hyper-parameters shown per param group (the rest of a group is left out of ``info``)
_GROUP_KEYS = ("lr", "initial_lr", "betas", "momentum", "eps", "weight_decay", "amsgrad", "foreach", "fused")


def placeholder_policy(policy: LoadPolicy) -> LoadPolicy:
    """``policy`` with ``weights_only=False``: the side files (optimizer, scheduler, RNG
    states, training arguments) hold numpy arrays, Python random states and pickled
    objects, which become inert placeholders; nothing they name is imported or run."""
    return dataclasses.replace(policy, weights_only=False)


def class_name(v: Any) -> str:
    """``module.Name`` of a placeholder, or the Python type's name."""
    if isinstance(v, PickledObject):
        return str(v.class_name)
    if isinstance(v, GlobalRef):
        return f"{v.module}.{v.name}"
    return type(v).__name__


def scalar(v: Any) -> Any:
    """A JSON-ready number or string, else None (a tensor scalar gives its value)."""
    if isinstance(v, (bool, int, float, str)) or v is None:
        return v
    if is_tensor(v) and v.numel() == 1:
        try:
            return v.numpy().reshape(()).item()
        except Exception:  # a payload that cannot be read: verify() reports it
            return None
    if isinstance(v, (list, tuple)) and len(v) <= 8 and all(isinstance(x, (int, float, bool)) for x in v):
        return list(v)
    return None


def describe_optimizer(sd: Any) -> dict[str, Any]:
    """The outline of an optimizer state dict: params with state, the state's keys, the
    param groups' hyper-parameters and how many params each holds."""
    if not isinstance(sd, Mapping) or not isinstance(sd.get("state"), Mapping):
        return {"kind": class_name(sd), "note": "not an optimizer state dict (no 'state' mapping)"}
    state = sd["state"]
    keys: dict[str, None] = {}
    count = 0
    nbytes = 0
    for per in state.values():
        if isinstance(per, Mapping):
            for k, v in per.items():
                keys[str(k)] = None
                if is_tensor(v):
                    count += 1
                    nbytes += v.nbytes
    groups = []
    for g in sd.get("param_groups") or []:
        if isinstance(g, Mapping):
            row = {k: scalar(g[k]) for k in _GROUP_KEYS if k in g}
            params = g.get("params")
            row["params"] = len(params) if isinstance(params, (list, tuple)) else None
            groups.append(row)
    return {
        "params_with_state": len(state),
        "state_keys": list(keys),
        "state_tensors": count,
        "state_bytes": nbytes,
        "param_groups": groups,
    }


def optimizer_tensors(sd: Any, prefix: str) -> Iterator[tuple[str, Any]]:
    """``(<prefix>.state.<param id>.<key>, tensor)`` for an optimizer state dict."""
    state = sd.get("state") if isinstance(sd, Mapping) else None
    if isinstance(state, Mapping):
        yield from iter_tensors(state, f"{prefix}.state")


def describe_scheduler(sd: Any) -> dict[str, Any]:
    """A learning-rate scheduler's state dict: its step counters and last rates."""
    if not isinstance(sd, Mapping):
        return {"kind": class_name(sd)}
    out: dict[str, Any] = {}
    for k in ("last_epoch", "_step_count", "base_lrs", "_last_lr"):
        if k in sd:
            v = sd[k]
            out[k.lstrip("_")] = [scalar(x) for x in v] if isinstance(v, (list, tuple)) else scalar(v)
    out["keys"] = [str(k) for k in sd]
    return out
