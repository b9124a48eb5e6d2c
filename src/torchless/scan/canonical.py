"""Canonical forms of unpickled values, so two unpicklers' runs of one stream compare.

The second engine (:mod:`.engine`: CPython's unpicklers, recording) and the scanner's
symbolic run (:mod:`.analysis` with ``record=True``) both reduce every value they see
with :func:`normalize`; this module is below both so that neither imports the other
to share it.
"""

from __future__ import annotations

from typing import Any

__all__ = ["normalize"]

_MAX_NORM_DEPTH = 24


class _Ids:
    """Numbers the symbolic values of one run in creation order, and maps them back."""

    def __init__(self) -> None:
        self.ids: dict[int, int] = {}
        self.keep: list[Any] = []
        self.budget = _MAX_RUN_NODES  # nodes normalised in the whole run

    def new(self, obj: Any) -> int:
        n = len(self.keep)
        self.ids[id(obj)] = n
        self.keep.append(obj)
        return n

    def get(self, obj: Any) -> int | None:
        return self.ids.get(id(obj))


#: nodes of one value normalised; past it a value becomes ``("cut",)`` at the same place
#: on both sides (a memo can share one list 2**40 times: never walk a value as a tree)
_MAX_NORM_NODES = 2000
#: nodes normalised in one run; a record that runs out is marked ``exhausted`` and the
#: scanner does not compare it (the fuzzer's streams never get there)
_MAX_RUN_NODES = 200_000


def normalize(v: Any, ids: _Ids) -> Any:
    """A canonical, comparable (and marshal-able) form of a value built by an unpickler.

    Symbolic values become ``("sym", n)`` with ``n`` their creation index, so the C
    unpickler's inert classes and the pickle machine's ``Sym`` objects compare equal
    when they were created by the same event. Cycles, very deep and very large values
    are cut, deterministically (the same cut on both sides of a comparison).
    """
    left = [min(_MAX_NORM_NODES, ids.budget)]
    out = _norm(v, ids, 0, (), left)
    ids.budget -= min(_MAX_NORM_NODES, ids.budget) - max(0, left[0])
    if left[0] < 0:
        ids.budget -= 1
    return out


def _norm(v: Any, ids: _Ids, depth: int, active: tuple[int, ...], budget: list[int]) -> Any:
    budget[0] -= 1
    if budget[0] < 0:
        return ("cut",)
    n = ids.get(v)
    if n is not None:
        return ("sym", n)
    t = type(v)
    if v is None or t is bool or t is int or t is str or t is bytes:
        return (t.__name__, v)
    if t is float:
        return ("float", repr(v))
    if t is bytearray:
        return ("bytearray", bytes(v))
    if t is memoryview:
        try:
            return ("memoryview", v.tobytes(), v.readonly)
        except (ValueError, TypeError):  # pragma: no cover - released views
            return ("memoryview",)
    if depth > _MAX_NORM_DEPTH:
        return ("deep",)
    if id(v) in active:
        return ("cycle",)
    act = active + (id(v),)
    if t is tuple or t is list:
        return (t.__name__, tuple(_norm(x, ids, depth + 1, act, budget) for x in v))
    if t is dict:
        return (
            "dict",
            tuple((_norm(k, ids, depth + 1, act, budget), _norm(x, ids, depth + 1, act, budget)) for k, x in v.items()),
        )
    if t is set or t is frozenset:
        # element order of a set is not a property of the stream: sort, then cut
        items = sorted((_norm(x, ids, depth + 1, act, [_MAX_NORM_NODES]) for x in v), key=repr)
        return (t.__name__, tuple(items))
    return ("other", t.__name__)
