"""joblib files (``joblib.dump``): the arrays listed and read without running anything.

A joblib file is one pickle stream, optionally compressed as a whole (joblib 1.x
``compressor.py`` prefixes: zlib ``x``, gzip ``\\x1f\\x8b``, bz2 ``BZ``, xz ``\\xfd7zXZ``,
lzma ``]\\x00``; lz4 is not supported here). Every NumPy array in the object is pickled
as a ``joblib.numpy_pickle.NumpyArrayWrapper`` whose BUILD state gives ``shape``,
``order``, ``dtype`` and (joblib >= 1.2) ``numpy_array_alignment_bytes``; the array's bytes
follow that BUILD opcode in the stream, outside the pickle (after a one-byte padding
length and the padding), and an object-dtype array follows as a nested pickle.

torchless runs the stream in its pickle machine with an ``after_build`` hook that reads
those bytes as zero-copy arrays (uncompressed files are memory-mapped), so
``info``/``ls``/``convert`` list the arrays of any joblib file - scikit-learn estimators
included, whose classes stay inert placeholders (``weights_only=False``) or are refused
(``weights_only=True``). Nothing named in the file is imported or called.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import numpy as np

from ..core.errors import FormatError, LimitError, TorchlessError, UnsupportedError
from ..core.findings import Problem
from ..core.tensor import Storage, as_tensor
from ..core.tree import iter_tensors
from ..io.source import open_source
from ..pickle.globals import GlobalRef, PickledObject
from ..pickle.machine import Limits, Unpickler
from .base import Artifact, Capabilities, FormatHandler, LoadPolicy, Probe, summarize_tensors
from .joblib_spec import EXTENSIONS, MARKER, WRAPPER, ZFILE_HEADER, compression_of
from .registry import register

__all__ = ["JoblibArtifact", "read_joblib", "compression_of", "WRAPPER"]

MAX_ARRAYS = 1 << 20


def _decompress(data: bytes | memoryview, kind: str, limit: int, *, path: Any = None, partial: bool = False) -> bytes:
    """The inflated stream (at most ``limit`` bytes: more is a LimitError, or with
    ``partial`` the first ``limit`` bytes)."""
    import bz2  # here, not for every command: detection imports this module
    import lzma

    raw = bytes(data)
    if kind == "lz4":
        raise UnsupportedError("lz4-compressed joblib file", path=path, hint="the lz4 package is not a torchless dependency")
    if kind == "zfile":
        raw = raw[ZFILE_HEADER:]
        kind = "zlib"
    if kind == "zlib":
        d: Any = zlib.decompressobj()
    elif kind == "gzip":
        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    elif kind == "bz2":
        d = bz2.BZ2Decompressor()
    else:
        d = lzma.LZMADecompressor(format=lzma.FORMAT_XZ if kind == "xz" else lzma.FORMAT_ALONE, memlimit=1 << 28)
    try:
        out = d.decompress(raw, limit + 1) if kind in ("zlib", "gzip") else d.decompress(raw, max_length=limit + 1)
    except (zlib.error, OSError, EOFError, lzma.LZMAError, ValueError) as e:
        if partial:
            return b""
        raise FormatError(f"corrupt {kind} stream: {e}", path=path) from None
    if len(out) > limit:
        if partial:
            return out[:limit]
        raise LimitError(f"{kind} stream inflates past the limit", path=path, expected=f"<= {limit} bytes")
    if not partial and not d.eof:
        raise FormatError(
            f"truncated {kind} stream: the data ends before the stream's end marker",
            path=path,
            expected="a complete compressed stream",
            found=f"{len(raw)} bytes that inflate to {len(out)} without an end",
        )
    return out


class _Resolver:
    """The default resolver, plus joblib's own wrapper class as an inert placeholder
    (it is the file format, not code: its BUILD is modelled by the after-BUILD hook)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.seen = inner.seen

    def resolve(self, module: str, name: str) -> Any:
        if (module, name) == WRAPPER:
            return GlobalRef(module, name)
        return self.inner.resolve(module, name)


def read_joblib(
    data: Any,
    *,
    weights_only: bool = True,
    path: Any = None,
    limits: Limits = Limits(),
    extra_globals: dict[str, Any] | None = None,
    view_of: Callable[..., memoryview] | None = None,
) -> tuple[Any, list[dict[str, Any]]]:
    """Unpickle a (decompressed) joblib stream: ``(object, arrays)`` where each array
    entry is ``{"offset", "shape", "dtype", "order", "value"}``.

    ``view_of`` (a :meth:`~torchless.io.source.ByteSource.view` of the source ``data``
    was read from, for an uncompressed file) makes the arrays' tensors read through the
    source on each access rather than hold views of ``data``.

    Raises:
        FormatError / TruncatedError: a malformed wrapper state or array past the end.
        UnsafeGlobalError: with ``weights_only``, a global outside the allowlist.
    """
    from .pt.read import make_resolver

    resolver = _Resolver(make_resolver(weights_only, extra=extra_globals))
    arrays: list[dict[str, Any]] = []
    buf = data

    def after_build(obj: Any, pos: int) -> tuple[int, Any] | None:
        if not isinstance(obj, PickledObject) or (obj.cls.module, obj.cls.name) != WRAPPER:
            return None
        st = obj.state
        if not isinstance(st, dict):
            raise FormatError("NumpyArrayWrapper without a state dict", path=path, offset=pos)
        shape, order, dtype = st.get("shape"), st.get("order", "C"), st.get("dtype")
        if (
            not isinstance(dtype, np.dtype)
            or not isinstance(shape, tuple)
            or not all(type(s) is int and s >= 0 for s in shape)
            or order not in ("C", "F")
        ):
            raise FormatError(
                "bad NumpyArrayWrapper state",
                path=path,
                offset=pos,
                found=f"shape={shape!r} order={order!r} dtype={type(dtype).__name__}",
            )
        if len(arrays) >= MAX_ARRAYS:
            raise LimitError("too many arrays", path=path, expected=f"<= {MAX_ARRAYS}")
        if dtype.hasobject:  # joblib pickles object arrays inline: a nested stream
            up = Unpickler(buf, resolver=resolver, limits=limits, path=path, member=f"object array @{pos}", start=pos)
            obj = up.load()
            arrays.append({"offset": pos, "shape": shape, "dtype": str(dtype), "order": order, "value": obj})
            return up.end - pos, obj
        skip = 0
        if "numpy_array_alignment_bytes" in st:
            if pos >= len(buf):
                raise FormatError("array padding length past the end of the stream", path=path, offset=pos)
            pad = buf[pos]
            align = st["numpy_array_alignment_bytes"]
            if type(align) is not int or not 0 <= pad <= max(align, 0):
                raise FormatError("bad array padding", path=path, offset=pos, found=pad)
            skip = 1 + pad
        count = 1
        for s in shape:
            count *= s
        nbytes = count * dtype.itemsize
        if pos + skip + nbytes > len(buf):
            from ..core.errors import TruncatedError

            raise TruncatedError(
                "array data runs past the end of the stream", path=path, offset=pos + skip, expected=f"{nbytes} bytes"
            )
        arr = np.frombuffer(buf, dtype=dtype, count=count, offset=pos + skip).reshape(shape, order=order)
        value: Any = arr
        try:
            value = as_tensor(arr)
        except TorchlessError:
            # a dtype torch has no name for (strings, datetimes, records): kept as an array,
            # a copy when it would be a view of the file mapping (close() unmaps the file)
            if view_of is not None:
                value = arr.copy()
        else:
            st = value.storage
            if view_of is not None and st is not None and nbytes and arr.flags.c_contiguous and arr.dtype.isnative:
                # a zero-copy view of the mapped file: read through the source on each
                # access instead of holding the view, so close() can release the file
                loader = partial(view_of, pos + skip, nbytes, what=f"array @{pos + skip}")
                value.storage = Storage._lazy(st.key, nbytes, st.dtype, st.location, loader, st.byteorder, f"array @{pos + skip}")
        arrays.append({"offset": pos + skip, "shape": shape, "dtype": str(dtype), "order": order, "value": value})
        return skip + nbytes, value

    up = Unpickler(buf, resolver=resolver, limits=limits, path=path, after_build=after_build)
    return up.load(), arrays


class JoblibArtifact(Artifact):
    """An opened joblib file.

    Attributes:
        compression: ``None`` or the compressor (``zlib``, ``gzip``, ``bz2``, ``xz``, ``lzma``).
        obj: the object tree (arrays as lazy tensors, classes as placeholders).
        arrays: every array: offset in the (decompressed) stream, shape, dtype, order.
    """

    format = "joblib"

    def __init__(self, path: Any, policy: LoadPolicy | None = None) -> None:
        super().__init__(path if not isinstance(path, (bytes, bytearray, memoryview)) else "<bytes>", policy)
        limits = self.policy.limits
        self.source = open_source(path)
        try:
            head = self.source.read_at(0, min(32, self.source.size))
            self.compression = compression_of(head) if head[:1] != b"\x80" else None
            if self.compression is None:
                data: Any = self.source.searchable()
            else:
                data = _decompress(self.source.view(0, self.source.size), self.compression, limits.max_input, path=self.path)
            self.obj, self.arrays = read_joblib(
                data,
                weights_only=self.weights_only,
                path=self.path,
                limits=limits,
                extra_globals=self.policy.extra_globals(),
                view_of=self.source.view if self.compression is None else None,
            )
        except BaseException:
            self.source.close()
            raise

    def load(self, *, weights_only: bool | None = None) -> Any:
        self.load_policy(weights_only)
        return self.obj

    def tensors(self) -> Iterator[tuple[str, Any]]:
        return iter_tensors(self.obj)

    def info(self) -> dict[str, Any]:
        out: dict[str, Any] = {"format": self.format, "path": self.path, "compression": self.compression}
        out.update(summarize_tensors(self.tensors()))
        out["arrays"] = [
            {"offset": a["offset"], "shape": list(a["shape"]), "dtype": a["dtype"], "order": a["order"]} for a in self.arrays
        ]
        return out

    def verify(self) -> list[Problem]:
        return super().verify()

    def close(self) -> None:
        self.source.close()


@register
class JoblibHandler(FormatHandler):
    name = "joblib"
    extensions = EXTENSIONS
    priority = 60  # a pickle naming joblib's array wrapper, plain or compressed
    description = "joblib.dump file (pickle + NumPy arrays after their wrappers; zlib/gzip/bz2/xz/lzma)"
    capabilities = Capabilities()

    def sniff(self, probe: Probe) -> bool:
        if probe.is_dir:
            return False
        head = probe.head
        if head[:1] == b"\x80":
            return MARKER in head or probe.suffix in EXTENSIONS
        kind = compression_of(head)
        if kind is None or kind == "lz4":
            return kind == "lz4" and probe.suffix in EXTENSIONS
        if probe.suffix in EXTENSIONS:
            return True
        try:
            inflated = _decompress(head, kind, 4096, partial=True)
        except TorchlessError:
            return False
        return inflated[:1] == b"\x80" and MARKER in inflated

    def _open(self, path: Any, policy: LoadPolicy, probe: Probe | None) -> JoblibArtifact:
        if probe is not None:
            probe.close()
        return JoblibArtifact(path, policy)
