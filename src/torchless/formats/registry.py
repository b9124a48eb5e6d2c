"""The format registry and detection: argument, then magic bytes, then extension.

Handlers live in their own modules and register themselves with :func:`register`; the
modules are listed in :data:`HANDLER_MODULES` and imported on first use, so
``import torchless`` stays cheap and an optional dependency (``onnx``) is only imported
when such a file is opened.
"""

from __future__ import annotations

from typing import Any

from ..core.errors import FormatError, TorchlessError, UsageError
from ..core.lazy import import_modules
from ..core.registry import Registry
from ..io.source import ByteSource, SliceSource
from .base import CAPABILITIES, CAPABILITY_TEXT, Capabilities, FormatHandler, Probe

__all__ = [
    "FORMATS",
    "HANDLER_MODULES",
    "capabilities",
    "detect",
    "formats_that",
    "probe_and_detect",
    "readers_format",
    "handler",
    "handler_for_path",
    "handlers",
    "register",
    "require",
]

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
    "torchless.formats.deepspeed.handler",
    "torchless.formats.package.handler",
    "torchless.formats.executorch.handler",
    "torchless.formats.dcp.handler",
    "torchless.formats.aoti.handler",
    "torchless.formats.pt2.handler",
    "torchless.formats.trainers.handler",
    "torchless.formats.megatron.handler",
    "torchless.formats.fsdp.handler",
]

_loaded = False


#: the method each writing capability overrides (checked at registration, never probed later)
_METHODS = {"write_tensors": "write_tensors", "write_objects": "save"}


def register(h: Any) -> Any:
    """Class decorator: instantiate the handler class and add it to :data:`FORMATS`.

    Raises:
        TypeError: not a :class:`FormatHandler`, or its :class:`Capabilities` declare a
            writer it does not define (or define one they do not declare).
    """
    inst = h() if isinstance(h, type) else h
    if not isinstance(inst, FormatHandler) or not isinstance(inst.capabilities, Capabilities):
        raise TypeError(f"{inst!r} is not a FormatHandler with declared Capabilities")
    for cap, meth in _METHODS.items():
        declared = getattr(inst.capabilities, cap)
        if declared != (getattr(type(inst), meth) is not getattr(FormatHandler, meth)):
            state = "is missing" if declared else "exists"
            raise TypeError(f"format handler {inst.name!r}: capability {cap} is declared {declared}, but method {meth} {state}")
    FORMATS.add(inst.name, inst)
    return h


def _load() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    import_modules(HANDLER_MODULES)


def handlers() -> list[FormatHandler]:
    """All handlers in sniffing order."""
    _load()
    return sorted(FORMATS.values(), key=lambda h: h.priority)


def handler(name: str) -> FormatHandler:
    """The handler called ``name``."""
    _load()
    return FORMATS.get(name)


def capabilities() -> dict[str, Capabilities]:
    """``{format name: its declared Capabilities}`` for every registered format, in
    sniffing order."""
    return {h.name: h.capabilities for h in handlers()}


def formats_that(capability: str) -> list[str]:
    """Names of the formats declaring ``capability`` (one of :data:`~torchless.formats.base.CAPABILITIES`)."""
    if capability not in CAPABILITIES:
        raise ValueError(f"unknown capability {capability!r}; one of: {', '.join(CAPABILITIES)}")
    return [h.name for h in handlers() if getattr(h.capabilities, capability)]


def require(h: FormatHandler, capability: str, *, path: Any = None) -> FormatHandler:
    """``h`` if it declares ``capability``.

    Raises:
        UsageError: it does not; the message names the formats that do
            (``npz cannot store objects; formats that can: pt, pt2``).
    """
    if capability not in CAPABILITIES:
        raise ValueError(f"unknown capability {capability!r}; one of: {', '.join(CAPABILITIES)}")
    if getattr(h.capabilities, capability):
        return h
    able = formats_that(capability)
    exts = " ".join(e for name in able for e in handler(name).extensions)
    raise UsageError(
        f"{h.name} cannot {CAPABILITY_TEXT[capability]}; formats that can: {', '.join(able) or 'none'}",
        path=path,
        expected=f"a destination named {exts}" if exts and capability.startswith("write") else None,
    )


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
    h, probe = probe_and_detect(path, format)
    if probe is not None:
        probe.close()
    return h


def _refuse_unlisted(url: str) -> None:
    """UsageError for a folder URL whose server does not list it (plain HTTP): only the
    folders that name their files (a DCP ``.metadata``) can be read there."""
    from ..core.errors import NotFoundError, UsageError
    from ..io import remote

    if remote.listable(url):
        return
    try:
        remote.listdir(url)
    except NotFoundError:
        raise UsageError(
            "this HTTP server does not list folders, and the folder holds no DCP .metadata",
            path=url,
            hint="give the URL of a file (a model, a sharded checkpoint's index); a folder of files "
            "(DCP in the Hugging Face layout) needs storage that lists folders (s3://, gs://, memory://...) "
            "or a server that serves folder listings",
        ) from None


def _sniffed(probe: Probe) -> FormatHandler | None:
    """The first handler (in sniffing order) whose sniffer recognises ``probe``."""
    for h in handlers():
        if h.sniff(probe):
            return h
    return None


def readers_format(src: ByteSource, name: str) -> str | None:
    """The format the readers recognise in the bytes of ``src`` (a file named ``name``),
    by the same sniffers :func:`detect` runs (never by the extension alone), or None.
    ``src`` stays open (the sniffers read it through a slice).

    The scanner names what it scans with it, so a file any reader opens is never
    "unrecognized" there (one place for every format's magic). Never raises for bad
    bytes: a sniffer that cannot decide is a no.
    """
    try:
        probe = Probe.of_source(SliceSource(src, 0, src.size, name=src.name), name)
    except TorchlessError:
        return None
    try:
        h = _sniffed(probe)
    except (TorchlessError, OSError, ValueError):
        return None
    finally:
        probe.close()
    return h.name if h is not None else None


def probe_and_detect(path: Any, format: str | None = None) -> tuple[FormatHandler, Probe | None]:
    """:func:`detect`, and the :class:`Probe` it made (None when ``format`` was given).

    The caller hands the probe to the handler's ``open`` (which reuses its parsed zip
    directory) or closes it.

    Raises:
        NotFoundError: the path does not exist.
        FormatError: nothing recognizes it.
    """
    if format:
        return handler(format), None
    probe = Probe.of(path)
    try:
        if not probe.is_dir and not probe.head:
            raise FormatError("the file is empty (0 bytes)", path=path, hint="an interrupted download or copy?")
        h = _sniffed(probe)
        if h is not None:
            return h, probe
        by_ext = handler_for_path(path)
        if by_ext is not None and not probe.is_dir:
            return by_ext, probe
        if probe.is_dir and isinstance(probe.path, str):  # a folder URL (a RemotePath)
            _refuse_unlisted(probe.path)
        raise FormatError(
            "unrecognized artifact",
            path=path,
            expected="one of: " + ", ".join(h.name for h in handlers()),
            found=repr(probe.head[:8]) if not probe.is_dir else "a directory",
        )
    except BaseException:
        probe.close()
        raise
