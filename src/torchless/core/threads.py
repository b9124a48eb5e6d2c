"""One helper thread per purpose and process (the zip writer's CRC-32s, read-ahead).

A forked child does not inherit a parent's threads but does inherit the executor
objects, which believe their thread idle: work handed to one would wait forever (range
tasks hung this way in ``local:N`` workers whose parent had written a record of 1 MiB
or more). :func:`helper` therefore makes each process its own.
"""

from __future__ import annotations

import os
from typing import Any

_POOLS: dict[str, tuple[int, Any]] = {}


def helper(name: str) -> Any:
    """The single-thread ``ThreadPoolExecutor`` named ``torchless-<name>`` of this process
    (tasks run one at a time, in the order they were submitted)."""
    got = _POOLS.get(name)
    pid = os.getpid()
    if got is None or got[0] != pid:
        from concurrent.futures import ThreadPoolExecutor

        got = _POOLS[name] = (pid, ThreadPoolExecutor(1, thread_name_prefix=f"torchless-{name}"))
    return got[1]
