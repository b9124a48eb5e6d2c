"""Strict, bounded JSON parsing for every format that carries JSON.

``json.loads`` on hostile input raises ``RecursionError`` on deep nesting (and code that
walks the result recursively would overflow later), accepts unbounded sizes, and its
errors are not torchless errors. :func:`loads` checks the size first and the nesting
depth with one vectorized pass over the bracket characters (strings excluded), then
parses; every failure is a :class:`~torchless.core.errors.FormatError` or
:class:`~torchless.core.errors.LimitError` naming the file and member.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import numpy as np

from .errors import FormatError, LimitError

__all__ = ["loads", "check_depth", "MAX_JSON_DEPTH", "MAX_JSON_BYTES"]

#: deepest nesting of arrays/objects accepted (torch's own JSON records nest < 40 levels)
MAX_JSON_DEPTH = 256
#: largest JSON text accepted unless the caller passes its own cap
MAX_JSON_BYTES = 256 << 20

_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.S)
_DEPTH_STEP = np.zeros(256, dtype=np.int8)
_DEPTH_STEP[[ord("["), ord("{")]] = 1
_DEPTH_STEP[[ord("]"), ord("}")]] = -1


def check_depth(raw: bytes, max_depth: int) -> int:
    """The nesting depth of the JSON text ``raw`` (outside strings); LimitError past ``max_depth``."""
    if b"[" not in raw and b"{" not in raw:
        return 0
    bare = _STRING.sub(b"", raw) if b'"' in raw else raw
    steps = _DEPTH_STEP[np.frombuffer(bare, dtype=np.uint8)]
    if not steps.any():
        return 0
    depth = int(np.cumsum(steps, dtype=np.int64).max())
    if depth > max_depth:
        raise LimitError("JSON nested too deeply", expected=f"<= {max_depth} levels", found=f"{depth} levels")
    return depth


def loads(
    data: bytes | bytearray | memoryview | str,
    *,
    what: str = "JSON",
    path: Any = None,
    member: str | None = None,
    offset: int | None = None,
    max_bytes: int = MAX_JSON_BYTES,
    max_depth: int | None = MAX_JSON_DEPTH,
    object_pairs_hook: Callable[[list[tuple[str, Any]]], Any] | None = None,
) -> Any:
    """Parse UTF-8 JSON text with a size cap and a nesting limit.

    Args:
        what: what the text is, for messages (``"safetensors header"``).
        path, member, offset: where it came from, for messages.
        max_depth: the nesting limit, or None where the caller checks the structure it
            takes itself (no pass over the text first; nesting past the parser's own
            recursion limit is still a LimitError).
        object_pairs_hook: as in :func:`json.loads` (a TorchlessError it raises is
            passed through with the location filled in).

    Raises:
        LimitError: larger than ``max_bytes`` or nested deeper than ``max_depth``.
        FormatError: not UTF-8, or not JSON.
    """
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else bytes(data)
    if len(raw) > max_bytes:
        raise LimitError(
            f"{what} too large",
            path=path,
            member=member,
            offset=offset,
            expected=f"<= {max_bytes} bytes",
            found=f"{len(raw)} bytes",
        )
    try:
        if max_depth is not None:
            check_depth(raw, max_depth)
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise FormatError(
            f"{what} is not UTF-8 text", path=path, member=member, offset=offset if offset is None else offset + e.start
        ) from None
    except LimitError as e:
        e.message = f"{what} nested too deeply"
        raise e.with_context(path=path, member=member) from None
    try:
        return json.loads(text, object_pairs_hook=object_pairs_hook)
    except json.JSONDecodeError as e:
        raise FormatError(
            f"{what} is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}", path=path, member=member, offset=offset
        ) from None
    except ValueError as e:  # an integer with more digits than Python converts
        raise FormatError(f"{what} is not valid JSON: {e}", path=path, member=member, offset=offset) from None
    except RecursionError:  # the caller's stack was already deep: still the input's depth
        raise LimitError(
            f"{what} nested too deeply",
            path=path,
            member=member,
            offset=offset,
            expected=f"<= {max_depth} levels" if max_depth is not None else "nesting within the parser's recursion limit",
        ) from None
    except FormatError as e:  # from object_pairs_hook
        if e.offset is None:
            e.offset = offset
        raise e.with_context(path=path, member=member) from None
