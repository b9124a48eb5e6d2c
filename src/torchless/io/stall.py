"""How long torchless waits on work that shows no progress before it gives up: a process
pool whose workers do nothing, a server-side copy whose progress does not move. One
setting, ``TORCHLESS_STALL_TIMEOUT`` (seconds; 0: no limit), read here for both."""

from __future__ import annotations

import os

from ..core.errors import UsageError

__all__ = ["STALL_ENV", "STALL_TIMEOUT", "stall_timeout"]

STALL_ENV = "TORCHLESS_STALL_TIMEOUT"
STALL_TIMEOUT = 600.0  # seconds with no progress


def stall_timeout() -> float:
    """Seconds a job may show no progress before it fails (``TORCHLESS_STALL_TIMEOUT``;
    0: no limit)."""
    v = os.environ.get(STALL_ENV, "").strip()
    if not v:
        return STALL_TIMEOUT
    try:
        t = float(v)
    except ValueError:
        t = -1.0
    if not t >= 0:
        raise UsageError(f"cannot read {STALL_ENV}", found=v, expected="seconds (0: no limit)")
    return t
