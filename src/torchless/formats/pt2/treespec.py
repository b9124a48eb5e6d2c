"""Pytree specs as ``.pt2`` stores them (``torch.utils._pytree.treespec_dumps``), without torch.

A program's ``in_spec`` says how ``(args, kwargs)`` flatten into the graph's user inputs and
``out_spec`` how the user outputs fold back into what ``forward`` returned. The text is
JSON, protocol 1: ``[1, node]`` with ``node = {"type": <qualified name or null>, "context":
<JSON text>, "children_spec": [node...]}``; a leaf has type ``null``. :func:`loads` reads
it into :class:`TreeSpec`; :meth:`TreeSpec.flatten` and :meth:`TreeSpec.unflatten` do
what pytree does for the built-in containers (tuple, list, dict, OrderedDict,
defaultdict, namedtuple, None).
"""

from __future__ import annotations

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
                name = str(self.context.get("class_name") or "namedtuple").rsplit(".", 1)[-1]
                try:
                    return namedtuple(name, fields)(*kids)  # noqa: PYI024 - rebuilt from the spec
                except (TypeError, ValueError):
                    pass
            return tuple(kids)
        raise UnsupportedError(f"pytree node type {t} is not supported")


_END = object()

#: the spec of a single leaf
LEAF = TreeSpec(None)


def _node(d: Any, depth: int = 0) -> TreeSpec:
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
    kids = tuple(_node(c, depth + 1) for c in d["children_spec"] or ())
    return TreeSpec(t, ctx, kids)


def loads(text: str) -> TreeSpec:
    """Read ``treespec_dumps`` text.

    Raises:
        FormatError: not a protocol-1 tree spec.
    """
    try:
        obj = json.loads(text)
    except ValueError as e:
        raise FormatError("tree spec is not JSON", found=str(e)) from None
    if not (isinstance(obj, list) and len(obj) == 2 and obj[0] == 1):
        raise FormatError("unsupported tree spec protocol", expected="[1, {...}]", found=str(obj)[:40])
    return _node(obj[1])
