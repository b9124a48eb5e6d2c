"""Re-saving a TorchScript archive with new tensor values and extra files.

The module structure, code and pickles are kept byte for byte: a replaced tensor has the
same shape and dtype, so only the bytes of its storage record (``data/<key>`` or
``constants/<key>``) change, written through the tensor's own view (offset and strides)
exactly as ``param.copy_(new)`` would. Every other record is copied unchanged, deflated
``code/`` records as their original compressed bytes. Extra files (``extra/<name>``) can
be added, replaced or removed. The new ``.data/serialization_id`` is derived from the new
contents. The result is written atomically in torch 2.13's zip layout.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np

from ...container.zip import TorchZipWriter, ZipEntry, ZipReader
from ...core.errors import NotFoundError, UnsupportedError, UsageError
from ...core.tensor import Tensor, as_tensor
from ..base import LoadPolicy
from ..weights import match_weights, weight_items
from . import spec
from .handler import FlatbufferArtifact, TorchScriptArtifact, open_torchscript

__all__ = ["save_edited", "set_weights", "replacement_array"]


def replacement_array(target: Tensor, value: Any, name: str = "") -> np.ndarray:
    """``value`` as a NumPy array in ``target``'s stored element type, checked.

    Accepts what every writer accepts (:func:`~torchless.core.tensor.as_tensor`: torchless
    tensors, NumPy arrays with bfloat16/float8 through ``ml_dtypes``, torch tensors and
    Parameters) of the same dtype, or a NumPy array of the stored element type holding
    the bits (``uint16`` words for bfloat16).

    Raises:
        UsageError: a different shape or dtype.
    """
    want = target.dtype
    stored = np.dtype(want.storage)
    if (
        isinstance(value, np.ndarray)
        and value.dtype.newbyteorder("=") == stored
        and (want.numpy is None or np.dtype(want.numpy) != stored)
    ):
        arr = value  # the stored bits themselves (a bfloat16 tensor's uint16 words)
    else:
        value = as_tensor(value, name=name)  # the writers' one coercion
        if value.dtype.name != want.name:
            raise UsageError(
                f"tensor {name!r}: dtype {value.dtype.name} given, the archive has {want.name}",
                expected=want.name
                + (f" (or {stored} holding its bits)" if want.numpy is None or np.dtype(want.numpy) != stored else ""),
                hint="cast before replacing; shapes and dtypes are part of the compiled code",
            )
        arr = value.numpy() if want.numpy is not None else value.numpy(raw=True)
    if tuple(arr.shape) != tuple(target.shape):
        raise UsageError(f"tensor {name!r}: shape {list(arr.shape)} given, the archive has {list(target.shape)}")
    return arr


def _write_into(buf: bytearray, target: Tensor, arr: np.ndarray) -> None:
    st = target.storage
    assert st is not None
    target._check_bounds()
    npd = np.dtype(target.dtype.storage)
    if npd.itemsize > 1 and st.byteorder != sys.byteorder:
        npd = npd.newbyteorder(">" if st.byteorder == "big" else "<")
    if target.numel() == 0:
        return
    base = np.frombuffer(buf, dtype=npd)
    view = np.lib.stride_tricks.as_strided(
        base[target.storage_offset() :], shape=target.shape, strides=tuple(s * npd.itemsize for s in target.stride())
    )
    vals = arr
    if target.dtype.numpy is not None and target.dtype.name != "complex32":
        # the stored bits of a tensor with a conj/neg bit are the un-conjugated values
        if target.metadata.get("neg"):
            vals = np.negative(vals)
        if target.metadata.get("conj"):
            vals = np.conj(vals)
    view[...] = np.asarray(vals, dtype=npd.newbyteorder("="))


def save_edited(
    src: Any,
    dst: Any,
    *,
    tensors: Mapping[str, Any] | Iterable[tuple[str, Any]] | None = None,
    extra_files: Mapping[str, bytes | str] | None = None,
    remove_extra: Iterable[str] = (),
    strict: bool = False,
    weights_only: bool = True,
    progress: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """Write a copy of TorchScript archive ``src`` to ``dst`` with replaced values.

    Args:
        src: path of the archive (or an open
            :class:`~torchless.formats.torchscript.handler.TorchScriptArtifact`).
        dst: the output path (may equal ``src``; written atomically).
        tensors: name -> new value. Names are ``state_dict`` names (``lin.weight``) or
            the dotted paths of :meth:`TorchScriptArtifact.all_tensors` (``tl.0``,
            ``CONSTANTS.c0``). Values keep the tensor's shape and dtype.
        extra_files: extra file name -> new content (added or replaced).
        remove_extra: extra file names to drop.
        strict: every state_dict entry must be given a value.

    Returns:
        ``{"replaced": [names], "storages": n, "extra_files": [names]}``.

    Raises:
        NotFoundError: a name that is not a tensor of the archive.
        UsageError: wrong shape or dtype, or (``strict``) missing names.
    """
    own = not isinstance(src, (TorchScriptArtifact, FlatbufferArtifact))
    art = open_torchscript(src, LoadPolicy(weights_only=weights_only)) if own else src
    try:
        if isinstance(art, FlatbufferArtifact):
            if extra_files or remove_extra:
                raise UnsupportedError("a flatbuffer module's extra files cannot be edited (only tensor values)")
            return _save_flatbuffer(art, dst, tensors, strict)
        return _save(art, dst, tensors, extra_files, set(remove_extra), strict, progress)
    finally:
        if own:
            art.close()


def _save_flatbuffer(art: FlatbufferArtifact, dst: Any, tensors: Any, strict: bool) -> dict[str, Any]:
    """A copy of a flatbuffer module with tensor bytes replaced in place: the buffer's
    layout (every offset) is unchanged, so only ``storage_data`` bytes differ."""
    items = list(tensors.items()) if isinstance(tensors, Mapping) else list(tensors or [])
    sd = art.state_dict()
    known: dict[str, Tensor] = dict(sd.items())
    for n, other in art.all_tensors():
        known.setdefault(n, other)
    if strict:
        missing = [n for n in sd if n not in {k for k, _ in items}]
        if missing:
            raise UsageError(f"{len(missing)} state_dict entries have no new value", found=", ".join(missing[:8]))
    out = bytearray(art.source.view(0, art.source.size))
    replaced = []
    storages: set[int] = set()
    for name, value in items:
        t = known.get(name)
        if t is None:
            raise NotFoundError(f"the module has no tensor {name!r}", path=art.path, hint="see `torchless ls` or all_tensors()")
        st = t.storage
        if st is None or st.file_offset is None:
            raise UnsupportedError(f"tensor {name!r} has no bytes in the buffer to rewrite")
        arr = replacement_array(t, value, name)
        buf = bytearray(out[st.file_offset : st.file_offset + st.nbytes])
        _write_into(buf, t, arr)
        out[st.file_offset : st.file_offset + st.nbytes] = buf
        replaced.append(name)
        storages.add(st.file_offset)
    from ...io.atomic import atomic_write_bytes

    atomic_write_bytes(os.fspath(dst), bytes(out))
    return {"replaced": replaced, "storages": len(storages), "extra_files": list(art.archive.extra)}


def set_weights(
    model: Any,
    weights: Any,
    out: Any,
    *,
    strip_prefix: str = "",
    allow_missing: bool = False,
    extra_files: Mapping[str, bytes | str] | None = None,
    remove_extra: Iterable[str] = (),
    strict: bool = False,
    progress: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """Re-save TorchScript archive ``model`` as ``out`` with new weights matched by name
    (``torchless ts set-weights``), by the same rule as ONNX's ``set_weights``
    (:func:`torchless.formats.weights.match_weights`).

    Args:
        model: the archive (path or open
            :class:`~torchless.formats.torchscript.handler.TorchScriptArtifact`).
        weights: a weights file of any readable format, a mapping or ``(name, tensor)``
            pairs; None to change extra files only. Names are ``state_dict`` names or the
            dotted paths of :meth:`TorchScriptArtifact.all_tensors`.
        out: the new archive (may be ``model``; written atomically).
        strip_prefix: removed from each weight name first (``"model."``).
        allow_missing: ignore weights that name no tensor of the model.
        extra_files / remove_extra / strict: as :func:`save_edited`.

    Returns:
        :func:`save_edited`'s result plus ``"ignored"``: the weights that named no tensor.

    Raises:
        NotFoundError: a weight names no tensor (without ``allow_missing``).
        UsageError: two weights map to one tensor, none matched, or a shape or dtype differs.

    Example:
        >>> set_weights("model.pt", "finetuned.safetensors", "new.pt")  # doctest: +SKIP
    """
    own = not isinstance(model, (TorchScriptArtifact, FlatbufferArtifact))
    art = open_torchscript(model, LoadPolicy(weights_only=False)) if own else model
    try:
        if weights is None:
            # extra files only: no tensor gets a value, so ``strict`` does not apply
            res = save_edited(art, out, extra_files=extra_files, remove_extra=remove_extra, progress=progress)
            return {**res, "ignored": []}
        items, w = weight_items(weights)
        try:
            names = set(art.keys()) | {n for n, _ in art.all_tensors()}
            m = match_weights(items, names, strip_prefix=strip_prefix, allow_missing=allow_missing, path=art.path)
            res = save_edited(
                art, out, tensors=m.matched, extra_files=extra_files, remove_extra=remove_extra, strict=strict, progress=progress
            )
        finally:
            if w is not None:
                w.close()
        return {**res, "ignored": m.ignored}
    finally:
        if own:
            art.close()


def _save(
    art: TorchScriptArtifact, dst: Any, tensors: Any, extra_files: Any, remove_extra: set[str], strict: bool, progress: Any
) -> dict[str, Any]:
    archive = art.archive
    zr = archive.zip
    if zr is None:  # read_archive always sets it; an archive built by hand may not
        raise UnsupportedError("the TorchScript archive has no zip file to rewrite")
    items = list(tensors.items()) if isinstance(tensors, Mapping) else list(tensors or [])
    sd = art.state_dict()
    known: dict[str, Tensor] = dict(sd.items())
    for n, other in art.all_tensors():
        known.setdefault(n, other)
    if strict:
        missing = [n for n in sd if n not in {k for k, _ in items}]
        if missing:
            raise UsageError(
                f"{len(missing)} state_dict entries have no new value",
                found=", ".join(missing[:8]),
                hint="pass strict=False to keep the others",
            )
    # new bytes per storage record (relative name), written through each tensor's view
    new_bytes: dict[str, bytearray] = {}
    replaced = []
    prefix_len = len(zr.prefix) + 1
    for name, value in items:
        t = known.get(name)
        if t is None:
            raise NotFoundError(
                f"the archive has no tensor {name!r}",
                path=art.path,
                hint="see `torchless ls` (state_dict names) or all_tensors()",
            )
        if t.storage is None or not t.storage.origin:
            raise UnsupportedError(f"tensor {name!r} has no storage record to rewrite")
        arr = replacement_array(t, value, name)
        rec = t.storage.origin[prefix_len:]
        buf = new_bytes.get(rec)
        if buf is None:
            e = zr.get(rec)
            buf = bytearray(zr.read(e))
            new_bytes[rec] = buf
        _write_into(buf, t, arr)
        replaced.append(name)
    extra_new = {k: (v.encode("utf-8") if isinstance(v, str) else bytes(v)) for k, v in (extra_files or {}).items()}
    for k in list(extra_new) + list(remove_extra):
        if not k or k.startswith("/") or ".." in k.split("/"):
            raise UsageError(f"invalid extra file name {k!r}")
    # torch writes extra files first
    path = os.fspath(dst) if isinstance(dst, (str, os.PathLike)) else dst
    written_extra = []
    with TorchZipWriter(path) as zw:
        for rec in zr.records():
            if not rec.startswith(spec.EXTRA_DIR):
                continue
            e = zr.get(rec)
            name = rec[len(spec.EXTRA_DIR) :]
            if name in remove_extra:
                continue
            if name in extra_new:
                zw.write(spec.EXTRA_DIR + name, extra_new.pop(name))
            else:
                _copy(zr, zw, spec.EXTRA_DIR + name, e)
            written_extra.append(name)
        for name, data in extra_new.items():
            zw.write(spec.EXTRA_DIR + name, data)
            written_extra.append(name)
        for rec in zr.records():
            if rec.startswith(spec.EXTRA_DIR) or rec == spec.SERIALIZATION_ID:
                continue
            e = zr.get(rec)
            if rec in new_bytes:
                zw.write(rec, new_bytes[rec])
            else:
                _copy(zr, zw, rec, e)
            if progress is not None:
                progress(e.size)
        zw.write(spec.SERIALIZATION_ID, zw.serialization_id())
    return {"replaced": replaced, "storages": len(new_bytes), "extra_files": written_extra}


def _copy(zr: ZipReader, zw: TorchZipWriter, rec: str, e: ZipEntry) -> None:
    if e.method == 8:
        raw = zr.source.view(zr.data_offset(e), e.compressed_size, what=f"record {e.name!r}")
        # the original deflate stream and CRC, so code/ stays byte-identical
        zw.copy_compressed(rec, raw, e.size, e.crc)
        return
    zw.write(rec, zr.read(e))
