"""The public functions: one entry point over every format."""

from __future__ import annotations

import os
from typing import Any, Callable, Iterable

from .core.errors import UsageError
from .formats.base import Artifact, check_options
from .formats.registry import detect as _detect
from .formats.registry import handler, handler_for_path

__all__ = ["convert", "detect", "load", "open", "save", "write_tensors"]

_open = open


def detect(path: Any) -> str:
    """The format name of the artifact at ``path`` (``"pt"``, ``"safetensors"``...).

    Detection goes magic bytes and structure first, then the extension.

    Raises:
        NotFoundError: no such path.
        FormatError: nothing recognizes it.
    """
    return _detect(path).name


def open(path: Any, *, format: str | None = None, **kw: Any) -> Artifact:  # noqa: A001
    """Open any artifact lazily: tensors are listed without reading their bytes.

    Args:
        path: a file or directory (DCP checkpoints, caches).
        format: skip detection and use this handler.
        **kw: handler options. Every handler takes ``weights_only`` (default True; formats
            that hold no pickles ignore it); the others are listed by
            :func:`torchless.formats.base.accepted_options`.

    Returns:
        An :class:`~torchless.formats.base.Artifact`; iterate ``tensors()`` or index it
        by tensor name; use it as a context manager. Its ``load()`` honours the
        ``weights_only`` given here and refuses the other policy.

    Raises:
        UsageError: an option the handler does not take (the message lists the ones it does).

    Example:
        >>> with torchless.open("model.pt") as ckpt:          # doctest: +SKIP
        ...     for name, t in ckpt.tensors():
        ...         print(name, t.dtype, t.shape)
    """
    h = handler(format or "pt") if isinstance(path, (bytes, bytearray, memoryview)) else _detect(path, format)
    check_options(h, "open", kw, path=None if isinstance(path, (bytes, bytearray, memoryview)) else path)
    weights_only = kw.get("weights_only", True)
    if type(weights_only) is not bool:
        raise UsageError("weights_only must be True or False", found=repr(weights_only)[:40])
    art = h.open(path, **kw)
    art.weights_only = weights_only  # the policy, decided once: load() holds to it
    return art


def load(path: Any, *, weights_only: bool = True, format: str | None = None, **kw: Any) -> Any:
    """Load an artifact's object tree (for checkpoints: what ``torch.load`` returns).

    Tensors in the result are :class:`~torchless.core.tensor.Tensor` views over the
    memory-mapped file; ``numpy()`` reads them.

    Args:
        weights_only: refuse any global not on torchless's allowlist (the default, as in
            torch). With False, unknown globals become inert
            :class:`~torchless.pickle.globals.PickledObject` placeholders. Nothing a file
            names is imported or called either way.

    Raises:
        UnsafeGlobalError: ``weights_only=True`` and the pickle names a global that is
            not allowed (the message names it).
        UsageError: an option the format does not take.
    """
    return open(path, format=format, weights_only=weights_only, **kw).load(weights_only=weights_only)


def _writer(path: Any, format: str | None) -> Any:
    h = handler(format) if format else (handler_for_path(path) if isinstance(path, (str, os.PathLike)) else None)
    return h if h is not None else handler("pt")  # like torch.save: any other name is a checkpoint


def save(obj: Any, path: Any, *, format: str | None = None, **kw: Any) -> None:
    """Save ``obj``: a torch checkpoint by default, or by ``format``/extension.

    ``.pt``/``.pth`` (and file objects) get torch 2.13's zip layout, loadable by
    ``torch.load(weights_only=True)``; ``.safetensors`` and ``.npz`` take a flat dict of
    tensors. Every writer takes the same tensors: torchless tensors, NumPy arrays
    (ml_dtypes included), torch tensors and Parameters. Writes are atomic.

    Raises:
        UsageError: an option the format's writer does not take, or an object it cannot hold.
    """
    h = _writer(path, format)
    if getattr(h, "save", None) is not None:
        check_options(h, "write", kw, path=path)
        h.save(obj, path, **kw)  # type: ignore[attr-defined]
        return
    if not isinstance(obj, dict):
        raise UsageError(f"{h.name} files hold a flat dict of tensors", found=type(obj).__name__)
    write_tensors(obj.items(), path, format=h.name, **kw)


def write_tensors(items: Iterable[tuple[str, Any]], path: Any, *, format: str | None = None, progress: Callable[[int], None] | None = None, **kw: Any) -> None:
    """Write ``(name, tensor)`` pairs in the format of ``path``'s extension (or ``format``).

    Raises:
        UsageError: a format torchless cannot write tensors to, or an option its writer
            does not take.
    """
    h = handler(format) if format else handler_for_path(path)
    if h is None or not hasattr(h, "write_tensors"):
        raise UsageError("cannot write tensors to this file type", path=path, expected="a .pt, .safetensors, .npz ... destination")
    check_options(h, "write", kw, path=path)
    h.write_tensors(items, path, progress=progress, **kw)  # type: ignore[attr-defined]


def convert(src: Any, dst: Any, *, src_format: str | None = None, dst_format: str | None = None, progress: Callable[[int], None] | None = None, **kw: Any) -> dict[str, Any]:
    """Copy every tensor of ``src`` into a new file ``dst`` (format from its extension).

    Dtypes are preserved (bfloat16 and float8 included); tensors are streamed one at a
    time from the source's memory map.

    Returns:
        ``{"tensors": n, "bytes": total}``.

    Raises:
        UsageError: an option the destination's writer does not take.
    """
    h = handler(dst_format) if dst_format else handler_for_path(dst)
    if h is not None:
        check_options(h, "write", kw, path=dst)  # before any work
    # weights_only=False: unknown classes become placeholders whose tensors still convert;
    # nothing is imported or run either way
    with open(src, format=src_format, weights_only=False) as art:
        export = getattr(art, "convert_to", None)  # formats with their own streaming export (dcp)
        if export is not None:
            return export(dst, format=dst_format, progress=progress, **kw)
        items = list(art.tensors())
        total = {"tensors": len(items), "bytes": sum(t.nbytes for _, t in items)}
        write_tensors(items, dst, format=dst_format, progress=progress, **kw)
    return total
