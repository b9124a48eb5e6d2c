"""The public functions: one entry point over every format."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from .core.errors import UsageError
from .formats.base import Artifact, LoadPolicy, check_options
from .formats.dispatch import open_artifact, tensor_writer, writable_formats
from .formats.dispatch import write_tensors as _write_tensors
from .formats.registry import capabilities, handler, handler_for_path, require
from .formats.registry import detect as _detect
from .io.remote import accepts_storage_options as _remote_opts

__all__ = ["capabilities", "convert", "detect", "load", "open", "save", "writable_formats", "write_tensors"]

_open = open


@_remote_opts
def detect(path: Any) -> str:
    """The format name of the artifact at ``path`` (``"pt"``, ``"safetensors"``...).

    Detection goes magic bytes and structure first, then the extension.

    Raises:
        NotFoundError: no such path.
        FormatError: nothing recognizes it.
    """
    return _detect(path).name


@_remote_opts
def open(path: Any, *, format: str | None = None, policy: LoadPolicy | None = None, **kw: Any) -> Artifact:  # noqa: A001
    """Open any artifact lazily: tensors are listed without reading their bytes.

    Args:
        path: a file or directory (DCP checkpoints, caches), or the bytes of a checkpoint.
        format: skip detection and use this handler.
        policy: the :class:`~torchless.formats.base.LoadPolicy` (``weights_only``, ``limits``,
            ``allowed_globals``, ``mmap``, ``encoding``), decided here once.
        **kw: the policy's fields as keywords (they must agree with ``policy`` when both
            are given), and the format's own options (``torchless formats --json`` lists
            them: ``base_dir`` for ONNX...).

    Returns:
        An :class:`~torchless.formats.base.Artifact`; iterate ``tensors()`` or index it
        by tensor name; use it as a context manager. Its ``load()`` holds to the policy
        given here and refuses the other ``weights_only``.

    Raises:
        UsageError: an option the format does not take (the message lists the ones it
            does), or one that contradicts ``policy``.

    Example:
        >>> with torchless.open("model.pt") as ckpt:          # doctest: +SKIP
        ...     for name, t in ckpt.tensors():
        ...         print(name, t.dtype, t.shape)
    """
    return open_artifact(path, format=format, policy=policy, **kw)


@_remote_opts
def load(path: Any, *, format: str | None = None, policy: LoadPolicy | None = None, **kw: Any) -> Any:
    """Load an artifact's object tree (for checkpoints: what ``torch.load`` returns).

    Tensors in the result are :class:`~torchless.core.tensor.Tensor` views over the
    memory-mapped file; ``numpy()`` reads them. Takes what :func:`open` takes.

    Args:
        policy: the load policy; ``weights_only`` (default True, as in torch) refuses any
            global not on torchless's allowlist. With ``weights_only=False``, unknown
            globals become inert :class:`~torchless.pickle.globals.PickledObject`
            placeholders. Nothing a file names is imported or called either way.

    Raises:
        UnsafeGlobalError: ``weights_only`` and the pickle names a global that is not
            allowed (the message names it).
        UsageError: an option the format does not take.
    """
    return open(path, format=format, policy=policy, **kw).load()


def _writer(path: Any, format: str | None) -> Any:
    h = handler(format) if format else (handler_for_path(path) if isinstance(path, (str, os.PathLike)) else None)
    return h if h is not None else handler("pt")  # like torch.save: any other name is a checkpoint


@_remote_opts
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
    if h.capabilities.write_objects:
        check_options(h, "write", kw, path=path)
        h.save(obj, path, **kw)
        return
    if not isinstance(obj, dict):
        require(h, "write_objects", path=path)  # names the formats that store objects
    write_tensors(obj.items(), path, format=h.name, **kw)


@_remote_opts
def write_tensors(
    items: Mapping[str, Any] | Iterable[tuple[str, Any]],
    path: Any,
    *,
    format: str | None = None,
    progress: Callable[[int], None] | None = None,
    **kw: Any,
) -> list[str]:
    """Write tensors (a mapping, or ``(name, tensor)`` pairs) in the format of ``path``'s extension (or ``format``).

    Returns the files written (several for sharded safetensors: the shards, then the
    index).

    Raises:
        UsageError: no writable format for ``path``, or an option the format does not
            take (``max_shard_size`` for ``.pt``).
    """
    return _write_tensors(items, path, format=format, progress=progress, **kw)


def _non_tensor_leaves(obj: Any, max_items: int = 10_000) -> list[dict[str, str]]:
    """Dotted keys and types of the values a flat tensor file cannot hold."""
    from .core.tree import iter_leaves

    out = []
    for key, v in iter_leaves(obj):
        out.append({"key": key, "type": type(v).__name__ if not hasattr(v, "class_name") else v.class_name})
        if len(out) >= max_items:
            break
    return out


@_remote_opts
def convert(
    src: Any,
    dst: Any,
    *,
    src_format: str | None = None,
    dst_format: str | None = None,
    progress: Callable[[int], None] | None = None,
    strict: bool = False,
    dtype: Any = None,
    dtype_all: bool = False,
    include: str | Iterable[str] | None = None,
    exclude: str | Iterable[str] | None = None,
    strip_prefix: str | None = None,
    add_prefix: str | None = None,
    **kw: Any,
) -> dict[str, Any]:
    """Copy ``src`` into a new file ``dst`` (format from its extension, or ``dst_format``).

    A checkpoint converted to its own format keeps its whole object (``.pt`` to ``.pt``
    keeps ``epoch``, ``config``, optimizer ``param_groups``...; ``.safetensors`` keeps its
    ``__metadata__``). Converting to a flat tensor format (``.safetensors``, ``.npz``)
    keeps the tensors by their dotted names and drops everything else; what was dropped
    is returned. Dtypes are preserved (bfloat16 and float8 included); tensors are
    streamed one at a time from the source's memory map.

    Args:
        src: a path (opened here, detected once, closed after), or an
            :class:`~torchless.formats.base.Artifact` already open (used as it is and left
            open: the caller that opened it closes it).
        strict: refuse (before writing anything) when the conversion would drop a value.
        dtype: cast the floating-point tensors to this dtype (``"bfloat16"``,
            ``"float16"``, ``"float32"``, ``"float64"``, or a torch dtype) as torch's
            ``.to(dtype)`` rounds; ``dtype_all``: integer and bool tensors too.
        include / exclude: globs (``fnmatch``) on the dotted source names: keep the
            names that match an ``include`` (all when none), then drop those matching an
            ``exclude``.
        strip_prefix / add_prefix: then remove a prefix from the names that have it,
            and put one before every name.
            The steps are those of :mod:`torchless.formats.transform`, in that order; with
            any of them only the tensors travel (a flat state dict, even to ``.pt``), each
            cast as it is written.
        **kw: options of the destination format (``max_shard_size`` for safetensors);
            an option the destination does not take is an error.

    Returns:
        ``{"tensors": n, "bytes": total, "files": [written paths], "object_kept": bool,
        "dropped": [{"key", "type"}]}``.

    Raises:
        UsageError: an option that does not apply, ``strict`` and something would be
            dropped, or two tensors renamed to one name (both named).
    """
    from .formats.pt.handler import PtArtifact
    from .formats.transform import Transform

    tf = Transform.make(
        dtype=dtype, dtype_all=dtype_all, include=include, exclude=exclude, strip_prefix=strip_prefix, add_prefix=add_prefix
    )

    h = tensor_writer(dst, dst_format)
    # range tasks on an executor (sharded safetensors): not options of the format
    ranged = {k: kw.pop(k) for k in ("executor", "max_task_bytes", "resume") if kw.get(k) not in (None, False)}
    kw = {k: v for k, v in kw.items() if k not in ("executor", "max_task_bytes", "resume")}
    if ranged and h.name != "safetensors":
        raise UsageError("an executor writes safetensors output only", found=h.name, hint="write .safetensors")
    check_options(h, "write", {k: v for k, v in kw.items() if v is not None}, path=dst)  # before any work
    own = not isinstance(src, Artifact)
    if not own and src_format is not None and src_format != src.format:
        raise UsageError(f"src_format={src_format!r} given with an open {src.format} artifact", path=src.path)
    # weights_only=False: unknown classes become placeholders whose tensors still convert;
    # nothing is imported or run either way
    art = open(src, format=src_format, weights_only=False) if own else src
    try:
        if ranged and art.format == "hf":
            raise UsageError("an executor does not apply to Hugging Face checkpoint folders yet", path=art.path)
        if tf.active:
            if ranged:
                raise UsageError("an executor does not apply with dtype, include, exclude or prefixes yet", path=art.path)
            return _convert_transformed(art, dst, h, tf, progress=progress, strict=strict, options=kw)
        opts = {**kw, **ranged} if art.format == "dcp" else kw
        res = art.convert_to(dst, format=h.name, progress=progress, strict=strict, options=opts)  # dcp, hf: their own export
        if res is not None:
            res.setdefault("dropped", [{"key": k, "type": "non-tensor value"} for k in res.pop("skipped", [])])
            res.setdefault("object_kept", h.name == "pt")
            res.setdefault("files", [os.fspath(dst)])
            return res
        items = list(art.tensors())
        total = {"tensors": len(items), "bytes": sum(t.nbytes for _, t in items)}
        obj_kept = False
        dropped: list[dict[str, str]] = []
        if isinstance(art, PtArtifact) and h.name == "pt":
            cp = art.checkpoint
            refused = sorted({g for g, ok in cp.globals_seen if not ok})
            if not refused:
                from .formats.pt.write import save_checkpoint

                save_checkpoint(cp.obj, dst, progress=progress)
                return {**total, "files": [os.fspath(dst)], "object_kept": True, "dropped": []}
            dropped = [
                {"key": "", "type": f"object with classes outside the allowlist ({', '.join(refused[:4])})"}
            ] + _non_tensor_leaves(cp.obj)
        elif isinstance(art, PtArtifact):
            dropped = _non_tensor_leaves(art.checkpoint.obj)
        elif art.format == "safetensors":
            meta = getattr(art, "metadata", None) or {}
            if h.name == "safetensors":
                obj_kept = True
                if meta and "metadata" not in kw:
                    kw["metadata"] = meta
            elif meta:
                from .formats.safetensors_spec import METADATA_KEY

                dropped = [{"key": METADATA_KEY, "type": "dict"}]
        elif art.format in ("npz", "hf"):  # tensors, and for .npz other members np.load returns as bytes
            obj_kept = h.name == art.format
            if art.format == "npz":
                names = {n for n, _ in items}
                dropped = [{"key": str(k), "type": type(v).__name__} for k, v in art.load().items() if k not in names]
                obj_kept = obj_kept and not dropped
        elif art.format == "joblib":  # a pickled object tree holding arrays
            obj = art.load()
            if h.name == "pt":
                from .core.errors import TorchlessError
                from .formats.pt.write import save_checkpoint

                try:
                    save_checkpoint(obj, dst, progress=progress)  # atomic: nothing is left on failure
                    return {**total, "files": [os.fspath(dst)], "object_kept": True, "dropped": []}
                except TorchlessError:
                    pass  # a value torch's format cannot hold: the tensors alone, named below
            dropped = _non_tensor_leaves(obj)
        else:  # code, graphs, module structure: only the tensors travel
            dropped = [
                {
                    "key": "",
                    "type": (
                        f"everything in the {art.format} artifact that is not a tensor "
                        "(code, graph, module structure); only its tensors are converted"
                    ),
                }
            ]
        # tied weights: the one rule of formats/shared.py (safetensors stores an alias once)
        from .formats.shared import alias_metadata, dropped_entries, drops_aliases, split_aliases

        # (the writer applies it; here it is reported, and checked before anything is written)
        aliases = split_aliases(items, dst)[1] if drops_aliases(dst, h.name) else {}
        if aliases:
            dropped += dropped_entries(aliases)
            total = {
                "tensors": len(items) - len(aliases),
                "bytes": sum(t.nbytes for n, t in items if n not in aliases),
            }
        if strict and dropped:
            _refuse_drop(dropped, h.name, src if own else art.path)
        if ranged:  # range tasks: the workers read the source themselves
            from .formats.hf.ranged import write_shards

            ents = [(n, t.dtype, tuple(t.shape), t.nbytes) for n, t in items if n not in aliases]
            if aliases:
                kw["metadata"] = alias_metadata(kw.get("metadata"), aliases)
            files = write_shards(os.fspath(src if own else art.path), ents, dst, progress=progress, **kw, **ranged)
        else:
            files = write_tensors(items, dst, format=h.name, progress=progress, **kw)
    finally:
        if own:
            art.close()
    return {**total, "files": files, "object_kept": obj_kept, "dropped": dropped}


def _refuse_drop(dropped: list[dict[str, str]], dst_format: str, path: Any) -> None:
    shown = ", ".join(d["key"] or d["type"] for d in dropped[:8]) + (" ..." if len(dropped) > 8 else "")
    raise UsageError(
        f"converting to {dst_format} would drop {len(dropped)} value(s): {shown}",
        path=path,
        hint="write .pt to keep the whole object and shared tensors, or leave out --strict to convert the tensors only",
    )


def _convert_transformed(
    art: Artifact, dst: Any, h: Any, tf: Any, *, progress: Any, strict: bool, options: dict[str, Any]
) -> dict[str, Any]:
    """:func:`convert` with filters, renames or a cast: the tensors alone, streamed."""
    from .formats.pt.handler import PtArtifact

    items = tf.apply(art.tensors(), path=art.path)
    if not items:
        raise UsageError("no tensor is left to convert", path=art.path, hint="check --include/--exclude against `torchless ls`")
    kw = dict(options)
    dropped: list[dict[str, str]] = []
    if isinstance(art, PtArtifact):
        dropped = _non_tensor_leaves(art.checkpoint.obj)
    elif art.format == "safetensors":
        meta = getattr(art, "metadata", None) or {}
        if meta and h.name == "safetensors" and "metadata" not in kw:
            kw["metadata"] = meta
        elif meta:
            from .formats.safetensors_spec import METADATA_KEY

            dropped = [{"key": METADATA_KEY, "type": "dict"}]
    elif art.format not in ("hf", "npz"):
        dropped = [
            {"key": "", "type": f"everything in the {art.format} artifact that is not a tensor; only its tensors are converted"}
        ]
    if strict and dropped:
        _refuse_drop(dropped, h.name, art.path)
    files = write_tensors(items, dst, format=h.name, progress=progress, **kw)
    total = {"tensors": len(items), "bytes": sum(t.nbytes for _, t in items)}
    return {**total, "files": files, "object_kept": False, "dropped": dropped}
