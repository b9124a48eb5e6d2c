"""Walking object trees from pickles: find the tensors, summarize the rest.

Pickles are graphs, not trees: a container may be referenced many times (a memo bomb
makes 2**100 paths out of 100 lists) or contain itself. The walkers here visit every
container once, iteratively (no recursion limit), with an explicit node budget.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from .errors import LimitError
from .tensor import NestedTensor, SparseTensor, Tensor

__all__ = ["describe", "iter_leaves", "iter_tensors", "is_tensor", "json_tree", "TENSOR_TYPES"]

TENSOR_TYPES = (Tensor, SparseTensor, NestedTensor)


def is_tensor(x: Any) -> bool:
    return isinstance(x, TENSOR_TYPES)


_STR = {str}


def _children(obj: Any) -> Iterator[tuple[str, Any]]:
    """``(name, child)`` for each child of a container, in its order."""
    if isinstance(obj, dict) and set(map(type, obj)) <= _STR:
        return iter(obj.items())  # str keys are their own names: no per-item Python step
    return _children_gen(obj)


def _children_gen(obj: Any) -> Iterator[tuple[str, Any]]:
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield str(k), v
        return
    if isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield str(i), v
        return
    # imported here, not per call of the walk (an import statement costs microseconds)
    from .values import Namespace, PickledObject

    if isinstance(obj, PickledObject):
        attrs = obj.attrs
        # nn.Module: parameters, buffers and submodules under their real names
        if any(k in attrs for k in ("_parameters", "_buffers", "_modules")):
            for key in ("_parameters", "_buffers"):
                d = attrs.get(key)
                if isinstance(d, dict):
                    for k, v in d.items():
                        yield str(k), v
            mods = attrs.get("_modules")
            if isinstance(mods, dict):
                for k, v in mods.items():
                    yield str(k), v
            for k, v in attrs.items():
                if not k.startswith("_") and is_tensor(v):
                    yield k, v
            return
        for k, v in attrs.items():
            yield str(k), v
        for i, v in enumerate(obj.args):
            yield f"args.{i}", v
        for i, item in enumerate(obj.items):
            if isinstance(item, tuple) and len(item) == 2:
                yield str(item[0]), item[1]
            else:
                yield str(i), item
    elif isinstance(obj, Namespace):
        for k, v in vars(obj).items():
            yield k, v


def iter_tensors(obj: Any, prefix: str = "", *, max_nodes: int = 50_000_000) -> Iterator[tuple[str, Any]]:
    """Yield ``(dotted name, tensor)`` for every tensor reachable from ``obj``.

    A tensor reachable by several paths (tied weights) is yielded under each of them;
    a *container* reachable by several paths is walked once, under the first path found
    (depth-first, in container order), which bounds the walk on memo bombs. A top-level
    tensor gets the name ``prefix`` or ``"tensor"``.

    Raises:
        LimitError: more than ``max_nodes`` containers and leaves.
    """
    if is_tensor(obj):
        yield prefix or "tensor", obj
        return
    seen: set[int] = {id(obj)}
    # A stack of child iterators: depth-first in container order, no per-leaf push.
    # Paths are linked (parent, key) pairs joined only for the tensors yielded: building
    # every container's dotted name would be quadratic on a deeply nested pickle.
    stack: list[tuple[Any, Iterator[tuple[str, Any]]]] = [(None, _children(obj))]
    count = 1
    tensor_types = TENSOR_TYPES
    leaf_types = (str, bytes, int, float, bool, type(None))
    while stack:
        path, it = stack[-1]
        for k, v in it:
            count += 1
            if count > max_nodes:
                raise LimitError("object tree too large to walk", expected=f"<= {max_nodes} nodes")
            if isinstance(v, tensor_types):
                # a top-level key is its own name (the common flat state dict)
                yield k if path is None and not prefix else _path_name(prefix, (path, k)), v
                continue
            if isinstance(v, leaf_types) or id(v) in seen:
                continue
            seen.add(id(v))
            stack.append(((path, k), _children(v)))
            break
        else:
            stack.pop()


def _path_name(prefix: str, path: Any) -> str:
    keys = []
    while path is not None:
        path, k = path
        keys.append(k)
    name = prefix
    for k in reversed(keys):
        name = f"{name}.{k}" if name else k
    return name


def describe(obj: Any, *, max_items: int = 20, max_depth: int = 8, max_nodes: int = 5000) -> Any:
    """A JSON-ready outline of an object tree: tensors as one-line summaries, long
    containers cut to ``max_items`` entries, shared containers shown once.
    """
    from .values import GlobalRef, Namespace, PickledObject

    budget = [max_nodes]
    seen: set[int] = set()

    def go(x: Any, depth: int) -> Any:
        budget[0] -= 1
        if budget[0] < 0:
            return "…"
        if is_tensor(x):
            shape = "x".join(map(str, x.shape)) if x.shape else "scalar"
            flags = ""
            if getattr(x, "is_parameter", False):
                flags += " param"
            if isinstance(x, SparseTensor):
                flags += f" {x.layout}"
            return f"<{x.dtype.name}[{shape}]{flags}>"
        if x is None or isinstance(x, (bool, int, float, str)):
            if isinstance(x, str) and len(x) > 80:
                return x[:77] + "..."
            return x
        if isinstance(x, (bytes, bytearray)):
            return f"<{len(x)} bytes>"
        if isinstance(x, GlobalRef):
            return f"<global {x.qualname}>"
        if id(x) in seen:
            return "<shared, shown above>"
        if depth >= max_depth:
            return "…"
        seen.add(id(x))
        if isinstance(x, dict):
            out: dict[str, Any] = {}
            for i, (k, v) in enumerate(x.items()):
                if i >= max_items:
                    out["…"] = f"{len(x) - max_items} more"
                    break
                out[str(k)] = go(v, depth + 1)
            return out
        if isinstance(x, (list, tuple)):
            items = [go(v, depth + 1) for v in list(x)[:max_items]]
            if len(x) > max_items:
                items.append(f"… {len(x) - max_items} more")
            return items
        if isinstance(x, PickledObject):
            return {"<object>": x.class_name, **{k: go(v, depth + 1) for k, v in list(_children(x))[:max_items]}}
        if isinstance(x, Namespace):
            return {"<namespace>": "", **{k: go(v, depth + 1) for k, v in list(vars(x).items())[:max_items]}}
        if isinstance(x, (set, frozenset)):
            return [go(v, depth + 1) for v in list(x)[:max_items]]
        r = repr(x)
        return r if len(r) <= 80 else r[:77] + "..."

    return go(obj, 0)


def iter_leaves(obj: Any, *, max_nodes: int = 50_000_000) -> Iterator[tuple[str, Any]]:
    """Yield ``(dotted name, value)`` for every value reachable from ``obj`` that is not a
    tensor and not a container walked into (numbers, strings, None, empty containers,
    objects without children): what a flat tensor file cannot hold. Names are built as
    in :func:`iter_tensors`; shared containers are walked once.
    """
    if is_tensor(obj):
        return
    seen: set[int] = {id(obj)}
    stack: list[tuple[Any, Iterator[tuple[str, Any]]]] = [(None, _children(obj))]
    count = 1
    while stack:
        path, it = stack[-1]
        for k, v in it:
            count += 1
            if count > max_nodes:
                raise LimitError("object tree too large to walk", expected=f"<= {max_nodes} nodes")
            if is_tensor(v):
                continue
            if id(v) in seen and not isinstance(v, (str, bytes, int, float, bool, type(None))):
                continue
            kids = None if isinstance(v, (str, bytes, int, float, bool, type(None))) else list(_children(v))
            if not kids:
                yield _path_name("", (path, k)), v
                continue
            seen.add(id(v))
            stack.append(((path, k), iter(kids)))
            break
        else:
            stack.pop()


def json_tree(obj: Any, *, max_nodes: int = 1_000_000) -> Any:
    """The whole object tree as JSON values, nothing cut (``info --json``).

    Mappings become objects (keys as ``str(key)``), sequences and sets arrays, numbers,
    strings, booleans and None themselves. Everything else is an object with one
    ``__kind__`` key: ``{"__kind__": "tensor", "dtype", "shape", "parameter"}``,
    ``{"__kind__": "object", "class", "fields"}`` (placeholders, namespaces and
    TorchScript objects, whose non-dict state is the field ``__state__``),
    ``{"__kind__": "global", "name"}``, ``{"__kind__": "bytes", "size"}``,
    ``{"__kind__": "float", "value": "nan"|"inf"|"-inf"}``, ``{"__kind__": "shared", "path"}``
    (a container already shown at ``path``), ``{"__kind__": "repr", "text"}``.

    Raises:
        LimitError: more than ``max_nodes`` nodes (never a silently cut tree).
    """
    import math

    from .values import GlobalRef, Namespace, PickledObject

    count = [0]
    seen: dict[int, str] = {}

    def go(x: Any, path: str) -> Any:
        count[0] += 1
        if count[0] > max_nodes:
            raise LimitError("object tree too large for JSON", expected=f"<= {max_nodes} nodes")
        if x is None or isinstance(x, (bool, int, str)):
            return x
        if isinstance(x, float):
            return x if math.isfinite(x) else {"__kind__": "float", "value": repr(x)}
        if is_tensor(x):
            return {
                "__kind__": "tensor",
                "dtype": x.dtype.name,
                "shape": list(x.shape),
                "parameter": bool(getattr(x, "is_parameter", False)),
            }
        if isinstance(x, (bytes, bytearray)):
            return {"__kind__": "bytes", "size": len(x)}
        if isinstance(x, GlobalRef):
            return {"__kind__": "global", "name": x.qualname}
        script = hasattr(x, "qualified_name") and isinstance(getattr(x, "attrs", None), dict)  # TorchScript objects
        if script or isinstance(x, (dict, list, tuple, set, frozenset, PickledObject, Namespace)):
            if id(x) in seen:
                return {"__kind__": "shared", "path": seen[id(x)]}
            seen[id(x)] = path
        if script:
            fields = {k: go(v, f"{path}.{k}" if path else k) for k, v in x.attrs.items()}
            if getattr(x, "state", None) is not None:
                fields["__state__"] = go(x.state, f"{path}.__state__" if path else "__state__")
            return {"__kind__": "object", "class": x.qualified_name, "fields": fields}
        if isinstance(x, dict):
            return {str(k): go(v, f"{path}.{k}" if path else str(k)) for k, v in x.items()}
        if isinstance(x, (list, tuple, set, frozenset)):
            return [go(v, f"{path}.{i}" if path else str(i)) for i, v in enumerate(x)]
        if isinstance(x, (PickledObject, Namespace)):
            cls = x.class_name if isinstance(x, PickledObject) else "namespace"
            return {
                "__kind__": "object",
                "class": cls,
                "fields": {k: go(v, f"{path}.{k}" if path else k) for k, v in _children(x)},
            }
        return {"__kind__": "repr", "text": repr(x)}

    return go(obj, "")
