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
from .base import Artifact, FormatHandler, LoadPolicy, check_options
from .registry import formats_that, handler, handler_for_path, probe_and_detect, require

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
