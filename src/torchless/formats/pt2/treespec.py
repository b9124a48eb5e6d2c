"""Pytree specs as ``.pt2`` stores them (``torch.utils._pytree.treespec_dumps``), without torch.

A program's ``in_spec`` says how ``(args, kwargs)`` flatten into the graph's user inputs and
``out_spec`` how the user outputs fold back into what ``forward`` returned. The text is
JSON, protocol 1: ``[1, node]`` with ``node = {"type": <qualified name or null>, "context":
<JSON text>, "children_spec": [node...]}``; a leaf has type ``null``. :func:`loads` reads
it into :class:`TreeSpec`; :meth:`TreeSpec.flatten` and :meth:`TreeSpec.unflatten` do
what pytree does for the built-in containers (tuple, list, dict, OrderedDict,
defaultdict, namedtuple, None).

A namedtuple's node names only its registered type (``"mymod.Out"``); its field names are
in the program's ``treespec_namedtuple_fields``, which :func:`loads` takes. A dataclass
registered with ``register_dataclass`` is a node of its own type whose context lists its
fields (``[[fields], [fields that were None]]``). torchless cannot build the user's
classes, so both come back as a namedtuple of the class's name and the same fields
(attribute access and unpacking work as on the original). A custom node whose context is
the list of its keys (a mapping such as Hugging Face's ``ModelOutput``) comes back as a
dict of the class's name with those keys, also readable as attributes. Any other custom
node is refused (:meth:`TreeSpec.unsupported_types` lists them before anything runs).
"""

from __future__ import annotations

import functools
import json
from collections import OrderedDict, defaultdict, namedtuple
from dataclasses import dataclass, field
from typing import Any

from ...core.errors import FormatError, UnsupportedError, UsageError

__all__ = ["TreeSpec", "loads", "LEAF"]

_TUPLE = ("builtins.tuple", "torch.fx.immutable_collections.immutable_tuple")
_LIST = ("builtins.list", "torch.fx.immutable_collections.immutable_list")
_DICT = ("builtins.dict", "torch.fx.immutable_collections.immutable_dict")
_ODICT = ("collections.OrderedDict",)
_DDICT = ("collections.defaultdict",)
_NT = ("collections.namedtuple",)
_NONE = ("builtins.NoneType",)
_KNOWN = (*_TUPLE, *_LIST, *_DICT, *_ODICT, *_DDICT, *_NT, *_NONE)


@dataclass(frozen=True)
class TreeSpec:
    """One node of a pytree spec: ``type`` None for a leaf."""

    type: str | None
    context: Any = None
    children: tuple[TreeSpec, ...] = field(default_factory=tuple)

    @property
    def is_leaf(self) -> bool:
        return self.type is None

    @property
    def num_leaves(self) -> int:
        return 1 if self.is_leaf else sum(c.num_leaves for c in self.children)

    def flatten(self, tree: Any, path: str = "", namer: Any = None) -> list[tuple[str, Any]]:
        """``(path, leaf)`` pairs of ``tree`` laid out as this spec says; ``namer(path)``
        gives the name an error shows for a path (default: the path itself).

        Raises:
            UsageError: ``tree`` does not have this structure (naming where).
        """
        if self.is_leaf:
            return [(path, tree)]
        t = self.type
        where = (namer(path) if namer is not None else path) or "the input"
        kids: list[tuple[str, Any]]
        if t in _NONE:
            if tree is not None:
                raise UsageError(f"{where} must be None", found=type(tree).__name__)
            return []
        if t in _TUPLE or t in _LIST or t in _NT:
            if not isinstance(tree, (tuple, list)):
                raise UsageError(f"{where} must be a sequence", found=type(tree).__name__)
            if len(tree) != len(self.children):
                raise UsageError(f"{where} has the wrong length", expected=len(self.children), found=len(tree))
            kids = [(f"{path}[{i}]", v) for i, v in enumerate(tree)]
        elif t not in _KNOWN and (dc := _dataclass_fields(self.context)) is not None:
            flat = dc[0]
            if all(hasattr(tree, f) for f in flat):
                kids = [(f"{path}.{f}", getattr(tree, f)) for f in flat]
            elif isinstance(tree, dict) and all(f in tree for f in flat):
                kids = [(f"{path}[{f!r}]", tree[f]) for f in flat]
            else:
                raise UsageError(f"{where} must have the fields {', '.join(flat)}", found=type(tree).__name__)
        elif t not in _KNOWN and (names := _key_names(self.context, len(self.children))) is not None:
            if isinstance(tree, dict) and all(k in tree for k in names):
                kids = [(f"{path}[{k!r}]", tree[k]) for k in names]
            elif all(hasattr(tree, k) for k in names):
                kids = [(f"{path}.{k}", getattr(tree, k)) for k in names]
            else:
                raise UsageError(f"{where} must have the keys {', '.join(names)}", found=type(tree).__name__)
        elif t in _DICT or t in _ODICT or t in _DDICT:
            keys = self._keys()
            if not isinstance(tree, dict):
                raise UsageError(f"{where} must be a dict", found=type(tree).__name__)
            missing = [k for k in keys if k not in tree]
            extra = [k for k in tree if k not in keys]
            if missing or extra:
                raise UsageError(
                    f"{where} has the wrong keys",
                    expected=", ".join(map(repr, keys)),
                    found=", ".join(map(repr, tree)),
                )
            kids = [(f"{path}[{k!r}]", tree[k]) for k in keys]
        else:
            raise UnsupportedError(f"pytree node type {t} is not supported")
        out: list[tuple[str, Any]] = []
        for spec, (p, v) in zip(self.children, kids, strict=True):
            out.extend(spec.flatten(v, p, namer))
        return out

    def _keys(self) -> list[Any]:
        c = self.context
        if self.type in _DDICT and isinstance(c, dict):
            return list(c.get("dict_context") or [])
        return list(c or [])

    def unflatten(self, leaves: list[Any]) -> Any:
        """The tree with this structure holding ``leaves`` (consumed in order)."""
        it = iter(leaves)
        out = self._build(it)
        if next(it, _END) is not _END:
            raise UsageError("more values than the tree spec has leaves", expected=self.num_leaves)
        return out

    def _build(self, it: Any) -> Any:
        if self.is_leaf:
            v = next(it, _END)
            if v is _END:
                raise UsageError("fewer values than the tree spec has leaves", expected=self.num_leaves)
            return v
        kids = [c._build(it) for c in self.children]
        t = self.type
        if t in _NONE:
            return None
        if t in _TUPLE:
            return tuple(kids)
        if t in _LIST:
            return kids
        if t in _DICT:
            return dict(zip(self._keys(), kids, strict=True))
        if t in _ODICT:
            return OrderedDict(zip(self._keys(), kids, strict=True))
        if t in _DDICT:
            return defaultdict(None, zip(self._keys(), kids, strict=True))
        if t in _NT:
            fields = (self.context or {}).get("fields") if isinstance(self.context, dict) else None
            if fields and len(fields) == len(kids):
                built = _namedtuple(self.context.get("class_name"), list(fields), kids)
                if built is not None:
                    return built
            return tuple(kids)
        dc = _dataclass_fields(self.context)
        if dc is not None and len(dc[0]) == len(kids):
            built = _namedtuple(t, dc[0] + dc[1], kids + [None] * len(dc[1]))
            if built is not None:
                return built
        names = _key_names(self.context, len(kids))
        if names is not None:
            return _record_class(str(t).rsplit(".", 1)[-1])(zip(names, kids, strict=True))
        raise UnsupportedError(f"pytree node type {t} is not supported")

    def unsupported_types(self) -> list[str]:
        """The node types of this spec that :meth:`flatten`/:meth:`unflatten` cannot handle."""
        out: list[str] = []
        t = self.type
        if (
            t is not None
            and t not in _KNOWN
            and _dataclass_fields(self.context) is None
            and _key_names(self.context, len(self.children)) is None
        ):
            out.append(t)
        for c in self.children:
            out.extend(t for t in c.unsupported_types() if t not in out)
        return out


def _key_names(ctx: Any, n: int) -> list[str] | None:
    """The keys of a custom mapping node whose context is its list of keys (Hugging Face's
    ``ModelOutput``: ``flatten`` gives ``(values, keys)``), or None."""
    if isinstance(ctx, list) and len(ctx) == n and all(isinstance(k, str) for k in ctx) and len(set(ctx)) == n:
        return list(ctx)
    return None


class _Record(dict[str, Any]):
    """A mapping output of a custom pytree type: a dict whose keys are also attributes."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({dict.__repr__(self)})"


@functools.lru_cache(maxsize=256)
def _record_class(name: str) -> Any:
    return type(name if name.isidentifier() else "Record", (_Record,), {"__slots__": ()})


def _namedtuple(type_name: Any, fields: list[str], values: list[Any]) -> Any:
    """A namedtuple of the last part of ``type_name`` holding ``values``; None if the
    names are not identifiers."""
    name = str(type_name or "namedtuple").rsplit(".", 1)[-1]
    try:
        return _nt_class(name, tuple(fields))(*values)
    except (TypeError, ValueError):
        return None


@functools.lru_cache(maxsize=256)
def _nt_class(name: str, fields: tuple[str, ...]) -> Any:
    return namedtuple(name, fields)  # noqa: PYI024 - rebuilt from the spec


def _dataclass_fields(ctx: Any) -> tuple[list[str], list[str]] | None:
    """``(fields, fields that were None)`` of a ``register_dataclass`` node's context, or None."""
    if (
        isinstance(ctx, list)
        and len(ctx) == 2
        and all(isinstance(part, list) and all(isinstance(f, str) for f in part) for part in ctx)
    ):
        return list(ctx[0]), list(ctx[1])
    return None


_END = object()

#: the spec of a single leaf
LEAF = TreeSpec(None)


def _node(d: Any, depth: int = 0, nt_fields: dict[str, list[str]] | None = None) -> TreeSpec:
    if depth > 500:
        raise FormatError("tree spec nests too deeply")
    if not isinstance(d, dict) or "children_spec" not in d:
        raise FormatError("malformed tree spec node", found=str(d)[:80])
    t = d.get("type")
    ctx_text = d.get("context")
    ctx: Any = None
    if isinstance(ctx_text, str):
        try:
            ctx = json.loads(ctx_text)
        except ValueError:
            ctx = ctx_text
    else:
        ctx = ctx_text
    if t is not None and t not in _KNOWN and not isinstance(t, str):
        raise FormatError("malformed tree spec type", found=repr(t)[:80])
    kids = tuple(_node(c, depth + 1, nt_fields) for c in d["children_spec"] or ())
    if t in _NT and isinstance(ctx, str) and nt_fields and ctx in nt_fields:
        ctx = {"class_name": ctx, "fields": list(nt_fields[ctx])}
    return TreeSpec(t, ctx, kids)


def loads(text: str, namedtuple_fields: dict[str, list[str]] | None = None) -> TreeSpec:
    """Read ``treespec_dumps`` text; ``namedtuple_fields`` (serialized type name -> field
    names, the program's ``treespec_namedtuple_fields``) names the fields of namedtuples.

    Raises:
        FormatError: not a protocol-1 tree spec.
    """
    try:
        obj = json.loads(text)
    except ValueError as e:
        raise FormatError("tree spec is not JSON", found=str(e)) from None
    if not (isinstance(obj, list) and len(obj) == 2 and obj[0] == 1):
        raise FormatError("unsupported tree spec protocol", expected="[1, {...}]", found=str(obj)[:40])
    return _node(obj[1], 0, namedtuple_fields)
