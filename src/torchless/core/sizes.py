"""Sizes written by a person: the one parser behind every size option and argument.

``convert --max-shard-size``, ``dcp plan`` and ``reshard --plan-only``'s synthetic
checkpoints, ``--max-task-bytes``, ``extract --max-size`` and ``cache prune --max-size``
all read a size through :func:`parse_size`: a number (``1000``, ``1.5``, ``1e9``) with an
optional unit, case and spaces ignored. Decimal units ``B``, ``K``/``KB``, ``M``/``MB``,
``G``/``GB``, ``TB`` (powers of 1000) and binary units ``KiB``, ``MiB``, ``GiB``, ``TiB``
(powers of 1024). A fraction of a byte is dropped. A size must be positive, except where
the caller allows zero (``cache prune --max-size 0`` removes everything).
"""

from __future__ import annotations

from typing import Any

from .errors import UsageError

__all__ = ["parse_size", "SIZE_UNITS"]

#: unit -> bytes; the longest unit that ends the text wins (``MiB`` before ``B``)
SIZE_UNITS: dict[str, int] = {
    "KIB": 1 << 10,
    "MIB": 1 << 20,
    "GIB": 1 << 30,
    "TIB": 1 << 40,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "K": 10**3,
    "M": 10**6,
    "G": 10**9,
    "B": 1,
}


def parse_size(text: Any, *, allow_zero: bool = False) -> int:
    """``"5GB"``, ``"1G"``, ``"500MiB"``, ``"1e9"``, ``"1000"`` or an int -> bytes.

    Raises :class:`UsageError` for text that is not a size, and for text whose size is not
    positive (zero is accepted with ``allow_zero``). An int is returned as it is.
    """
    if isinstance(text, int):
        return text  # a number given by a program is taken as it is
    else:
        t = str(text).strip().upper().replace(" ", "")
        for u in sorted(SIZE_UNITS, key=len, reverse=True):
            if t.endswith(u):
                num, mul = t[: -len(u)], SIZE_UNITS[u]
                break
        else:
            num, mul = t, 1
        try:
            val = int(float(num) * mul)
        except (ValueError, OverflowError):
            raise UsageError(f"bad size {text!r}", expected="a number with an optional unit (5GB, 1G, 500MiB)") from None
    if val < 0 or (val == 0 and not allow_zero):
        raise UsageError("size must be positive", found=text)
    return val
