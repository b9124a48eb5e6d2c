"""A small explicit registry: entries are added by the module that defines them.

A duplicate key raises (two modules cannot silently claim one name), and a miss raises
:class:`~torchless.core.errors.NotFoundError` listing the known keys.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from .errors import NotFoundError

__all__ = ["Registry"]

K = TypeVar("K")
V = TypeVar("V")


class Registry(Generic[K, V]):
    """An ordered mapping with registration discipline.

    Args:
        kind: what the entries are (``"format"``, ``"kernel"``), for error messages.
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[K, V] = {}

    def add(self, key: K, value: V) -> V:
        if key in self._items:
            raise ValueError(f"{self.kind} {key!r} is already registered")
        self._items[key] = value
        return value

    def register(self, key: K) -> Callable[[V], V]:
        """Decorator form of :meth:`add`."""

        def deco(value: V) -> V:
            return self.add(key, value)

        return deco

    def get(self, key: K) -> V:
        try:
            return self._items[key]
        except KeyError:
            known = ", ".join(map(str, self._items))
            raise NotFoundError(f"unknown {self.kind} {key!r}", expected=f"one of: {known}") from None

    def find(self, key: K) -> V | None:
        return self._items.get(key)

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def __iter__(self) -> Iterator[K]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def values(self) -> list[V]:
        return list(self._items.values())

    def items(self) -> list[tuple[K, V]]:
        return list(self._items.items())
