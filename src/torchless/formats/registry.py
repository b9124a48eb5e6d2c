"""The format registry and detection: argument, then magic bytes, then extension.

Handlers live in their own modules and register themselves with :func:`register`; the
modules are listed in :data:`HANDLER_MODULES` and imported on first use, so
``import torchless`` stays cheap and an optional dependency (``onnx``) is only imported
when such a file is opened.
"""

from __future__ import annotations

import importlib
from typing import Any

from ..core.errors import FormatError
from ..core.registry import Registry
from .base import FormatHandler, Probe

__all__ = ["FORMATS", "HANDLER_MODULES", "register", "detect", "handler", "handlers", "handler_for_path"]

#: name -> handler
FORMATS: Registry[str, FormatHandler] = Registry("format")

#: modules that define handlers (each calls :func:`register` at import).
HANDLER_MODULES = [
    "torchless.formats.pt.handler",
    "torchless.formats.safetensors",
    "torchless.formats.npz",
    "torchless.formats.joblib",
    "torchless.formats.onnx.handler",
    "torchless.formats.torchscript.handler",
    "torchless.formats.hf.handler",
    "torchless.formats.package.handler",
    "torchless.formats.dcp.handler",
    "torchless.formats.aoti.handler",
    "torchless.formats.pt2.handler",
]

_loaded = False


def register(h: Any) -> Any:
    """Class decorator: instantiate the handler class and add it to :data:`FORMATS`."""
    inst = h() if isinstance(h, type) else h
    FORMATS.add(inst.name, inst)
    return h


def _load() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    for m in HANDLER_MODULES:
        importlib.import_module(m)


def handlers() -> list[FormatHandler]:
    """All handlers in sniffing order."""
    _load()
    return sorted(FORMATS.values(), key=lambda h: h.priority)


def handler(name: str) -> FormatHandler:
    """The handler called ``name``."""
    _load()
    return FORMATS.get(name)


def handler_for_path(path: Any) -> FormatHandler | None:
    """The handler whose extensions match ``path`` (for choosing a writer)."""
    p = str(path).lower()
    best = None
    for h in handlers():
        for ext in h.extensions:
            if p.endswith(ext) and (best is None or len(ext) > best[0]):
                best = (len(ext), h)
    return best[1] if best else None


def detect(path: Any, format: str | None = None) -> FormatHandler:
    """The handler for ``path``: ``format`` if given, else the first that sniffs it, else
    the one owning its extension.

    Raises:
        NotFoundError: the path does not exist.
        FormatError: nothing recognizes it.
    """
    if format:
        return handler(format)
    probe = Probe.of(path)
    if not probe.is_dir and not probe.head:
        raise FormatError("the file is empty (0 bytes)", path=path, hint="an interrupted download or copy?")
    for h in handlers():
        if h.sniff(probe):
            return h
    by_ext = handler_for_path(path)
    if by_ext is not None and not probe.is_dir:
        return by_ext
    raise FormatError(
        "unrecognized artifact",
        path=path,
        expected="one of: " + ", ".join(h.name for h in handlers()),
        found=repr(probe.head[:8]) if not probe.is_dir else "a directory",
    )
