"""The scan's work budgets: the one place they are defined (docs/scan.md has the table).

A scan report is a function of the file's bytes alone: every budget counts *work* (bytes
inflated, pickle bytes and opcodes run, argument nodes searched, carriers visited, probes
asked), never time, so a budget runs out at the same place on every run, under any
machine load and any ``--jobs``. Where one runs out the rest is a ``limit`` finding that
names it, and the file is UNANALYSABLE (fail closed), never CLEAN.

Two wall-clock watchdogs remain as a last resort, for work no budget counts (a bug, a
pathological input to a C routine): :data:`WATCHDOG_SECONDS` for one file's scan and
:data:`ENGINE_WATCHDOG_SECONDS` for one request to the engine's child process. Inputs
within the budgets never reach them on an idle or a loaded machine (an input under 1 MB
scans in well under 2 s); when one fires, the report says so (a ``limit`` or
``unanalysable`` finding naming the timeout) and the file is UNANALYSABLE.
"""

from __future__ import annotations

import time
from typing import Any

# the engine's child watchdog is defined beside the worker (that file runs alone in the
# child and imports nothing); listed here with the others
from .engine import ENGINE_MAX_STREAM, ENGINE_WATCHDOG_SECONDS

__all__ = [
    "Budget",
    "BUDGET_NAMES",
    "inflate_budget",
    "pickle_budget",
    "ops_budget",
    "ARG_NODES_BASE",
    "NODES",
    "RECORD_NODES",
    "PROBES_BASE",
    "WATCHDOG_SECONDS",
    "ENGINE_WATCHDOG_SECONDS",
    "ENGINE_MAX_STREAM",
]

#: carriers, members and streams visited in one file
NODES = 50_000
#: pickle views decided by the real unpicklers: this many, plus one per 4 KiB of the file
PROBES_BASE = 5_000
#: argument nodes searched for nested payloads: this many, plus one per 4 bytes of the
#: file (each value is searched once while nothing mutates it: a shared argument costs
#: once; a torch checkpoint needs about a dozen per tensor)
ARG_NODES_BASE = 500_000
#: nodes of values normalised to compare streams with the engine's second opinion (a
#: stream past it gets no second opinion; a torch checkpoint needs about 15 per tensor)
RECORD_NODES = 50_000
#: the wall-clock watchdog of one file's scan: this many seconds plus one per 50 MiB
WATCHDOG_SECONDS = 120.0

#: what each budget counts, as the ``limit`` finding names it
BUDGET_NAMES = {
    "inflate": "decompressed bytes",
    "pickle": "pickle bytes analysed",
    "ops": "opcodes run",
    "arg_nodes": "argument nodes searched for nested payloads",
    "nodes": "carriers and members visited",
    "probes": "carriers probed by the real unpicklers",
    "seconds": "wall-clock watchdog: timeout",
}


def inflate_budget(size: int) -> int:
    """Bytes decompressed across all levels: 32 MiB or 256x the file, at most 1 GiB."""
    return min(1 << 30, max(32 << 20, 256 * size))


def pickle_budget(size: int) -> int:
    """Pickle bytes handed to the pickle machine: 2 MiB + 2x the file (+ the bytes inflated)."""
    return (2 << 20) + 2 * size


def ops_budget(size: int) -> int:
    """Opcodes the pickle machine runs: 1 million + one per 64 bytes of the file."""
    return 1_000_000 + size // 64


class Budget:
    """One work budget per scanned file: every nesting level draws from the same totals.

    Attributes:
        inflate: bytes decompressed (gzip/bz2/lzma/zlib carriers, deflated members)
            across all levels (:func:`inflate_budget`).
        pickle: bytes of pickle stream handed to the pickle machine (:func:`pickle_budget`).
        ops: opcodes the pickle machine runs (:func:`ops_budget`; a pure-data pickle
            with more opcodes than that is UNANALYSABLE, not CLEAN).
        arg_nodes: nodes of call and BUILD arguments searched for nested payloads
            (:data:`ARG_NODES_BASE` + one per 4 bytes of the file).
        record_nodes: nodes normalised for the engine's second opinion (:data:`RECORD_NODES`;
            past it streams get no second opinion, which is not a finding).
        nodes: carriers, members and streams visited (:data:`NODES`).
        probes: pickle views decided by the real unpicklers (:data:`PROBES_BASE` + one
            per 4 KiB: each is a round trip to the engine's child process).
        deadline: the wall-clock watchdog (:data:`WATCHDOG_SECONDS`), a last resort.
    A budget that runs out is a ``limit`` finding (UNANALYSABLE), never a hang.
    """

    def __init__(self, size: int) -> None:
        self.inflate = inflate_budget(size)
        self.pickle = pickle_budget(size)
        self.ops = ops_budget(size)
        self.arg_nodes = ARG_NODES_BASE + size // 4
        self.record_nodes = RECORD_NODES
        self.nodes = NODES
        self.probes = PROBES_BASE + size // 4096  # each asks the engine's child process (a round trip)
        self.watchdog = WATCHDOG_SECONDS + size / (50 << 20)
        self.deadline = time.monotonic() + self.watchdog
        self._once: set[Any] = set()
        self.exhausted: str | None = None

    def once(self, key: Any) -> bool:
        """True the first time ``key`` (source identity, offset, length / content hash) is seen."""
        if key in self._once:
            return False
        self._once.add(key)
        return True

    def take(self, what: str, n: int) -> bool:
        """Draw ``n`` units of ``what``; False (and :attr:`exhausted` set) when it runs out,
        or when the wall-clock watchdog has fired (:attr:`exhausted` is then ``seconds``)."""
        left = getattr(self, what) - n
        setattr(self, what, left)
        if left < 0:
            self.exhausted = what
            return False
        if time.monotonic() > self.deadline:  # the last resort: never silently, always a timeout finding
            self.exhausted = "seconds"
            return False
        return True
