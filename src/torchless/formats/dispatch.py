"""Open and write any format through its handler: the format layer's own entry points.

:func:`torchless.open` and :func:`torchless.write_tensors` are these functions; code inside
``formats/`` (a DCP consolidation writing ``.safetensors``, ONNX ``set_weights`` reading a
checkpoint) calls them here, never through the top-level API, so that imports point down
the layers (``docs/architecture.md``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import Any

from ..core.errors import UsageError
from .base import Artifact, FormatHandler, check_options
from .registry import detect, formats_that, handler, handler_for_path, require

__all__ = ["open_artifact", "tensor_writer", "writable_formats", "write_tensors"]


def open_artifact(path: Any, *, format: str | None = None, **kw: Any) -> Artifact:
    """Open ``path`` lazily with its handler (``format``, or detection); see :func:`torchless.open`.

    Raises:
        UsageError: an option the handler does not take, or a ``weights_only`` that is not a bool.
    """
    raw = isinstance(path, (bytes, bytearray, memoryview))
    h = handler(format or "pt") if raw else detect(path, format)
    check_options(h, "open", kw, path=None if raw else path)
    weights_only = kw.get("weights_only", True)
    if type(weights_only) is not bool:
        raise UsageError("weights_only must be True or False", found=repr(weights_only)[:40])
    art = h.open(path, **kw)
    art.weights_only = weights_only  # the policy, decided once: load() holds to it
    return art


def writable_formats() -> list[str]:
    """Names of the formats :func:`write_tensors` (and :func:`torchless.convert`) can write."""
    return formats_that("write_tensors")


def tensor_writer(path: Any, format: str | None) -> FormatHandler:
    """The handler that writes tensors to ``path`` (by ``format`` or extension).

    Raises:
        UsageError: no writable format for ``path``.
    """
    h = handler(format) if format else handler_for_path(path)
    if h is None:
        exts = ", ".join(e for name in writable_formats() for e in handler(name).extensions)
        raise UsageError(
            "cannot write tensors to this file type",
            path=path,
            expected=f"a destination of a writable format ({', '.join(writable_formats())}: {exts})",
        )
    return require(h, "write_tensors", path=path)


def write_tensors(
    items: Iterable[tuple[str, Any]],
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
    res = h.write_tensors(items, path, progress=progress, **kw)
    return (
        list(res) if isinstance(res, (list, tuple)) else [os.fspath(path) if isinstance(path, (str, os.PathLike)) else "<file>"]
    )
