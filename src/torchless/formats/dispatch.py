"""Open and write any format through its handler: the format layer's own entry points.

:func:`torchless.open` and :func:`torchless.write_tensors` are these functions; code inside
``formats/`` (a DCP consolidation writing ``.safetensors``, ONNX ``set_weights`` reading a
checkpoint) calls them here, never through the top-level API, so that imports point down
the layers (``docs/architecture.md``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from ..core.errors import UsageError, short_repr
from .base import Artifact, FormatHandler, LoadPolicy, check_options
from .registry import formats_that, handler, handler_for_path, handlers, probe_and_detect, require

__all__ = ["open_artifact", "tensor_writer", "writable_formats", "write_tensors"]


def open_artifact(path: Any, *, format: str | None = None, policy: LoadPolicy | None = None, **kw: Any) -> Artifact:
    """Open ``path`` lazily with its handler (``format``, or detection) under one load
    policy; see :func:`torchless.open`. Detection's probe (with the parsed zip directory)
    goes to the handler, so the file's directory is parsed once.

    Raises:
        UsageError: an option the handler does not take, or one contradicting ``policy``.
    """
    if isinstance(path, (bytes, bytearray, memoryview)):
        return handler(format or "pt").open(path, policy, **kw)
    h, probe = probe_and_detect(path, format)
    return h.open(path, policy, probe=probe, **kw)  # the handler takes the probe over (or closes it)


def writable_formats() -> list[str]:
    """Names of the formats :func:`write_tensors` (and :func:`torchless.convert`) can write."""
    return formats_that("write_tensors")


def tensor_writer(path: Any, format: str | None) -> FormatHandler:
    """The handler that writes tensors to ``path`` (by ``format`` or extension).

    Raises:
        UsageError: no writable format for ``path``.
    """
    if not format and not isinstance(path, (str, os.PathLike)):
        raise UsageError(
            "expected a destination path or URL",
            expected="str or os.PathLike (or format= for a file object)",
            found=type(path).__name__,
            hint="the call is write_tensors(items, path)" if isinstance(path, (dict, list, tuple)) else None,
        )
    if format and format not in {h.name for h in handlers()}:  # no such format: the ones that write are the answer
        raise UsageError(
            f"unknown destination format {format!r}",
            path=path,
            expected="a format that writes tensors: " + ", ".join(writable_formats()),
        )
    h = handler(format) if format else handler_for_path(path)
    if h is None:
        exts = ", ".join(e for name in writable_formats() for e in handler(name).extensions)
        raise UsageError(
            "cannot write tensors to this file type",
            path=path,
            expected=f"a destination of a writable format ({', '.join(writable_formats())}: {exts})",
        )
    return require(h, "write_tensors", path=path)


def _pairs(items: Any, path: Any) -> Iterator[tuple[str, Any]]:
    """``items`` as ``(name, tensor)`` pairs: a mapping gives its items; anything that is not
    a pair with a str name is a UsageError naming the entry (not a bare unpacking error)."""
    if isinstance(items, Mapping):
        items = items.items()
    elif isinstance(items, (str, bytes)) or not isinstance(items, Iterable):
        raise UsageError(
            "expected tensors to write", path=path, expected="a mapping or (name, tensor) pairs", found=type(items).__name__
        )
    for i, entry in enumerate(items):
        if not (isinstance(entry, (tuple, list)) and len(entry) == 2 and isinstance(entry[0], str)):
            raise UsageError(
                f"entry {i} of the tensors to write is not a (name, tensor) pair",
                path=path,
                expected="(str, tensor)",
                found=short_repr(entry),
            )
        yield entry[0], entry[1]


def write_tensors(
    items: Mapping[str, Any] | Iterable[tuple[str, Any]],
    path: Any,
    *,
    format: str | None = None,
    progress: Callable[[int], None] | None = None,
    **kw: Any,
) -> list[str]:
    """Write ``(name, tensor)`` pairs with the writer of ``format`` or ``path``'s extension;
    see :func:`torchless.write_tensors`. Returns the files written."""
    h = tensor_writer(path, format)
    check_options(h, "write", kw, path=path)
    res = h.write_tensors(_pairs(items, path), path, progress=progress, **kw)
    return (
        list(res) if isinstance(res, (list, tuple)) else [os.fspath(path) if isinstance(path, (str, os.PathLike)) else "<file>"]
    )
