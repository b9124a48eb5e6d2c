"""How the pickle machine turns a GLOBAL into something: rebuilders and placeholders.

A pickle names callables by ``module`` and ``name``. torchless never imports them. A
:class:`Resolver` maps the pair to one of:

* a **value** (a dtype, a layout name, a qscheme): the GLOBAL itself is the data;
* a :class:`Rebuilder`: torchless's own function that builds the object the named
  callable would have built, from the pickle's arguments only (``torch._utils
  ._rebuild_tensor_v2`` becomes a :class:`~torchless.core.tensor.Tensor` over a lazy
  storage);
* a :class:`GlobalRef`: an inert name. REDUCE/NEWOBJ on it make a
  :class:`PickledObject` that records the call (and BUILD records the state) so that a
  pickled ``nn.Module`` can be explored without its classes.

Which globals are allowed is an :class:`Allowlist` (name -> (rebuilder, reason)); the
reason is shown by ``torchless scan`` and documents why each entry is harmless.
"""

from __future__ import annotations

import _compat_pickle
from collections.abc import Callable, ItemsView, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..core.errors import UnsafeGlobalError
from ..core.values import GlobalRef, PickledObject

__all__ = [
    "Allowlist",
    "AllowlistResolver",
    "Entry",
    "GlobalRef",
    "PickledObject",
    "Rebuilder",
    "Resolver",
    "python2_name",
    "is_python2_name",
    "register_builder",
    "BUILDERS",
]

#: type -> ``builder(obj, state) -> obj`` for BUILD on objects torchless made whose
#: class cannot carry a ``__torchless_build__`` method (NumPy dtypes, tensors).
BUILDERS: dict[type, Callable[[Any, Any], Any]] = {}


def register_builder(kind: type, fn: Callable[[Any, Any], Any]) -> None:
    """Route BUILD on instances of ``kind`` to ``fn(obj, state)``."""
    BUILDERS[kind] = fn


class Rebuilder:
    """A torchless function standing in for a global that a pickle may call.

    Args:
        name: the dotted global name it stands for (``torch._utils._rebuild_tensor_v2``).
        call: what REDUCE (and OBJ/INST) does with the argument tuple.
        new: what NEWOBJ does with ``(args, kwargs)``; defaults to ``call(args)``.
        wraps_single_arg: REDUCE with a non-tuple argument calls ``call((arg,))``
            instead of failing (TorchScript's C++ pickler writes enums that way).
    """

    __slots__ = ("name", "_call", "_new", "wraps_single_arg")

    def __init__(
        self,
        name: str,
        call: Callable[[tuple[Any, ...]], Any],
        new: Callable[[tuple[Any, ...], dict[str, Any]], Any] | None = None,
        *,
        wraps_single_arg: bool = False,
    ) -> None:
        self.name = name
        self._call = call
        self._new = new
        self.wraps_single_arg = wraps_single_arg

    def call(self, args: tuple[Any, ...]) -> Any:
        return self._call(args)

    def new(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if self._new is not None:
            return self._new(args, kwargs)
        if kwargs:
            raise TypeError(f"{self.name} takes no keyword arguments")
        return self._call(args)

    def __repr__(self) -> str:
        return f"<rebuilder {self.name}>"


@dataclass(frozen=True)
class Entry:
    """An allowlisted global: what it resolves to and why that is harmless."""

    target: Any
    reason: str


class Allowlist:
    """A named table of allowed globals: ``"module.name" -> Entry``.

    Filled by explicit :meth:`add` calls in the module that defines the rebuilders; a
    duplicate raises, so two tables cannot silently disagree.
    """

    def __init__(self, name: str, entries: Mapping[str, Entry] | None = None) -> None:
        self.name = name
        self._entries: dict[str, Entry] = dict(entries or {})

    def add(self, qualname: str, target: Any, reason: str) -> None:
        if qualname in self._entries:
            raise ValueError(f"{qualname} is already in allowlist {self.name}")
        self._entries[qualname] = Entry(target, reason)

    def add_many(self, names: Iterable[str], make: Callable[[str], Any], reason: str) -> None:
        for n in names:
            self.add(n, make(n), reason)

    def get(self, qualname: str) -> Entry | None:
        return self._entries.get(qualname)

    def __contains__(self, qualname: str) -> bool:
        return qualname in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def items(self) -> ItemsView[str, Entry]:
        return self._entries.items()

    def merged(self, *others: Allowlist, name: str | None = None) -> Allowlist:
        """A new allowlist with this one's entries and the others' (later ones win)."""
        out = dict(self._entries)
        for o in others:
            out.update(o._entries)
        return Allowlist(name or self.name, out)


# Python 2 names: CPython's own tables (``_compat_pickle`` holds only these dicts; nothing
# else is imported). The unpicklers apply them while the stream's protocol is below 3.
IMPORT_MAPPING: dict[str, str] = dict(_compat_pickle.IMPORT_MAPPING)
NAME_MAPPING: dict[tuple[str, str], tuple[str, str]] = dict(_compat_pickle.NAME_MAPPING)


#: the part of those tables that torch's weights-only unpickler applies (torch._utils
#: keeps a subset of them, with the same values, and applies it at every protocol)
TORCH_IMPORT_KEYS = frozenset(
    {
        "__builtin__",
        "copy_reg",
        "Queue",
        "repr",
        "_abcoll",
        "UserDict",
        "UserList",
        "UserString",
        "whichdb",
        "StringIO",
        "cStringIO",
    }
)
TORCH_NAME_KEYS = frozenset(
    {
        ("__builtin__", "xrange"),
        ("__builtin__", "reduce"),
        ("__builtin__", "intern"),
        ("__builtin__", "unichr"),
        ("__builtin__", "unicode"),
        ("__builtin__", "long"),
        ("itertools", "izip"),
        ("itertools", "imap"),
        ("itertools", "ifilter"),
        ("itertools", "ifilterfalse"),
        ("itertools", "izip_longest"),
        ("UserDict", "IterableUserDict"),
        ("UserList", "UserList"),
        ("UserString", "UserString"),
        ("__builtin__", "basestring"),
        ("exceptions", "StandardError"),
        ("UserDict", "UserDict"),
    }
)


def python2_name(module: str, name: str, *, torch_subset: bool = False) -> tuple[str, str]:
    """Apply the Python-2 renames that CPython's unpicklers apply (protocol < 3), or with
    ``torch_subset`` the part of them torch's weights-only unpickler applies."""
    pair = NAME_MAPPING.get((module, name))
    if pair is not None and (not torch_subset or (module, name) in TORCH_NAME_KEYS):
        return pair
    if torch_subset and module not in TORCH_IMPORT_KEYS:
        return module, name
    return IMPORT_MAPPING.get(module, module), name


def is_python2_name(module: str, name: str) -> bool:
    """Whether the Python-2 tables rename ``module.name``."""
    return (module, name) in NAME_MAPPING or module in IMPORT_MAPPING


class Resolver(Protocol):
    """What the pickle machine asks to resolve a GLOBAL (after Python-2 renames)."""

    def resolve(self, module: str, name: str) -> Any:  # pragma: no cover - protocol
        ...


@dataclass
class AllowlistResolver:
    """Resolve through an :class:`Allowlist`; anything else is refused or a placeholder.

    Args:
        allowlist: the allowed globals.
        weights_only: refuse (``UnsafeGlobalError``) any global not on the list; when
            False, such globals become inert :class:`GlobalRef` placeholders.
        extra: additional names the caller trusts (``"module.name"`` ->
            :class:`Entry` or target), like torch's ``add_safe_globals``.
        seen: every global resolved, in order, with whether it was allowed (for reports).
    """

    allowlist: Allowlist
    weights_only: bool = True
    extra: dict[str, Any] = field(default_factory=dict)
    seen: list[tuple[str, bool]] = field(default_factory=list)

    def resolve(self, module: str, name: str) -> Any:
        qual = f"{module}.{name}"
        entry = self.allowlist.get(qual)
        if entry is None and qual in self.extra:
            e = self.extra[qual]
            entry = e if isinstance(e, Entry) else Entry(e, "allowed by the caller")
        if entry is not None:
            self.seen.append((qual, True))
            return entry.target
        self.seen.append((qual, False))
        if self.weights_only:
            shown = qual[len("builtins.") :] if qual.startswith("builtins.") else qual
            raise UnsafeGlobalError(
                f"refusing global {shown}: not on torchless's allowlist (nothing was imported or run)",
                global_name=qual,
                hint="load with weights_only=False to get an inert placeholder for it",
            )
        return GlobalRef(module, name)
