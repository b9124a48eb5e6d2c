"""Garbage collection paused around a parse that builds many long-lived objects.

Reading a checkpoint of tens of thousands of tensors creates hundreds of thousands of
small container objects (tensors, storages, zip entries, tuples) that all live as long
as the result. Generational passes over them during the parse can free nothing, and the
passes that follow it (the next allocations find a young generation of 100,000+ objects,
then the middle and the old generations fill up in turn) walk them all again.

:class:`GCPause` disables the collector for the parse and, when the parse left many new
objects in the young generation, moves them straight to the oldest one on the way out
(``gc.freeze()`` then ``gc.unfreeze()``: two list splices, no traversal), then turns the
collector back on. Nothing is kept frozen: the objects stay collectable by the next full
collection, as anything old is. A program that keeps objects frozen itself
(``gc.get_freeze_count()`` above zero) is left alone: unfreezing would undo its freeze.
"""

from __future__ import annotations

import gc
from typing import Any

__all__ = ["GCPause", "PROMOTE_MIN"]

#: young objects above which the exit promotes them to the oldest generation
PROMOTE_MIN = 20_000


class GCPause:
    """``with GCPause():`` no collection inside; the collector is restored on exit (also
    on an exception), with the young objects the block left promoted when there are many."""

    __slots__ = ("_was",)

    def __enter__(self) -> GCPause:
        self._was = gc.isenabled()
        gc.disable()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._was:
            if gc.get_count()[0] > PROMOTE_MIN and gc.get_freeze_count() == 0:
                gc.freeze()
                gc.unfreeze()
            gc.enable()
