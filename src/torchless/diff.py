"""Comparing two artifacts (``torchless diff``): their tensors by name, and everything
else they hold (:func:`artifact_values`).

Every tensor present on both sides ends in exactly one bucket: ``same`` (every element
equal, or within ``atol``/``rtol``), ``changed`` (dtype, shape or values differ) or
``not_compared`` (its values could not be read: a meta tensor, a dtype NumPy cannot
hold, a damaged payload). A tensor that was not compared is never counted as the same.

Values are compared in bounded chunks of the memory-mapped data, so two files of any
size are compared in about ``CHUNK_ELEMENTS`` elements of memory, and ``progress`` is
told how many bytes were compared. Plain contiguous tensors are compared by their stored
bytes first, chunk by chunk: equal bytes are equal values (or the same NaN), so only a
chunk whose bytes differ is turned into numbers; the pages of each compared chunk are
dropped from the process right after (they stay in the page cache), so memory stays flat
however large the files are.

What is not a tensor is compared too, because two checkpoints whose tensors match but
whose ``epoch``, learning rate or TorchScript code differ are not the same: every plain
value of the object tree (numbers, strings, placeholders of unknown classes by class
name), ``.safetensors`` metadata, DCP's non-tensor items, TorchScript code and attributes,
each ``.pt2`` program's graph code, signature and ranges, an ONNX graph's code, and every
record of an AOTInductor package (compiled code, configs) by size and CRC-32. A format
whose non-tensor content diff does not model (an inductor cache, a torch.package) gets a
``not_compared`` entry: it is never reported identical.
"""

from __future__ import annotations

import mmap
from collections.abc import Callable
from typing import Any

import numpy as np

from .core.errors import TorchlessError, short_repr
from .core.settings import SETTINGS

__all__ = ["diff", "diff_artifacts", "diff_bytes", "compare_tensors", "artifact_values", "CHUNK_ELEMENTS"]

#: elements compared at a time (bounds memory: about 16 bytes each on both sides)
CHUNK_ELEMENTS = 1 << 22
#: stored bytes compared at a time on the raw path
CHUNK_BYTES = 1 << 24


def _values(t: Any) -> np.ndarray:
    if getattr(t, "quantizer", None) is not None:
        return np.asarray(t.dequantize())
    if getattr(t, "storage", "none") is None:
        raise TorchlessError("a meta tensor has no data")
    numpy = getattr(t, "numpy", None)
    if numpy is None:
        raise TorchlessError(f"{type(t).__name__} values cannot be read as one array")
    return np.asarray(numpy())


def _as_float(a: np.ndarray) -> np.ndarray | None:
    """A float64/complex128 view for arithmetic, or None when the dtype has no numbers."""
    try:
        if a.dtype.kind == "c":
            return a.astype(np.complex128)
        if a.dtype.kind in "fiub" or a.dtype.type.__module__ != "numpy":
            return a.astype(np.float64)
    except (TypeError, ValueError):
        return None
    return None


def _compare_chunk(x: np.ndarray, y: np.ndarray, rtol: float, atol: float) -> tuple[bool, float]:
    """``(differs, max_abs_diff)`` of two same-shape 1-D chunks."""
    if x.dtype.kind in "iub" and y.dtype.kind in "iub":
        neq = x != y  # exact: int64 values beyond 2**53 differ even when their floats agree
        if not neq.any():
            return False, 0.0
        d = np.abs(x[neq].astype(np.float64) - y[neq].astype(np.float64))
        mad = float(d.max())
        return bool(atol == 0 and rtol == 0) or bool(np.any(d > atol + rtol * np.abs(y[neq].astype(np.float64)))), mad
    xf, yf = _as_float(x), _as_float(y)
    if xf is None or yf is None:  # opaque (void) dtypes: bytes must match
        differs = x.tobytes() != y.tobytes()
        return differs, float("nan") if differs else 0.0
    same = (xf == yf) | (np.isnan(xf) & np.isnan(yf))
    if bool(same.all()):
        return False, 0.0
    dx, dy = xf[~same], yf[~same]
    with np.errstate(invalid="ignore", over="ignore"):
        d = np.abs(dx - dy)
    d = np.where(np.isnan(d), np.inf, d)  # a NaN on one side only, or inf - inf of other signs
    mad = float(d.max())
    close = d <= atol + rtol * np.abs(dy)
    return bool(not close.all()), mad


def _raw_view(t: Any) -> memoryview | None:
    """The stored bytes of ``t``'s elements, when comparing them is comparing its values:
    a plain contiguous tensor in host byte order whose dtype NumPy holds; else None."""
    st = getattr(t, "storage", None)
    if (
        st is None
        or type(t).__name__ != "Tensor"
        or getattr(t, "quantizer", None) is not None
        or t.metadata.get("conj")
        or t.metadata.get("neg")
        or t.dtype.numpy is None
        or t.dtype.name == "complex32"
        or st.needs_swap
        or not t.is_contiguous()
    ):
        return None
    t._check_bounds()
    isz = t.dtype.itemsize
    start = t.storage_offset() * isz
    return st.bytes()[start : start + t.numel() * isz]


class _Pages:
    """Drops the pages of compared ranges of memory-mapped files from this process (the
    page cache keeps them): reading two big files through their maps would otherwise
    grow the resident set by both files."""

    def __init__(self) -> None:
        self._base: dict[int, tuple[Any, int]] = {}

    def release(self, mv: memoryview) -> None:
        m = mv.obj
        if not isinstance(m, mmap.mmap) or not hasattr(m, "madvise") or not hasattr(mmap, "MADV_DONTNEED") or not len(mv):
            return
        try:
            base = self._base.get(id(m))
            if base is None or base[0] is not m:
                base = self._base[id(m)] = (m, np.frombuffer(m, np.uint8, count=1).ctypes.data)
            start = np.frombuffer(mv, np.uint8).ctypes.data - base[1]
            lo = start - start % mmap.PAGESIZE
            hi = min(start + len(mv), len(m))
            m.madvise(mmap.MADV_DONTNEED, lo, hi - lo)
        except (ValueError, OSError, TypeError, BufferError):
            pass


def _equal_bytes(x: memoryview, y: memoryview) -> bool:
    n = len(x)
    k = n - n % 8
    a, b = np.frombuffer(x, np.uint8), np.frombuffer(y, np.uint8)
    if k and not np.array_equal(a[:k].view(np.uint64), b[:k].view(np.uint64)):
        return False
    return bool(np.array_equal(a[k:], b[k:]))


def _compare_raw(
    x: Any,
    y: Any,
    xv: memoryview,
    yv: memoryview,
    rtol: float,
    atol: float,
    progress: Callable[[int], None] | None,
    pages: _Pages,
) -> tuple[bool, float]:
    npd = x.dtype.numpy
    isz = x.dtype.itemsize
    step = max(isz, CHUNK_BYTES - CHUNK_BYTES % isz)
    n = len(xv)
    differs = False
    mad = 0.0
    for i in range(0, n, step):
        cx, cy = xv[i : i + step], yv[i : i + step]
        if not _equal_bytes(cx, cy):
            d, m = _compare_chunk(np.frombuffer(cx, npd), np.frombuffer(cy, npd), rtol, atol)
            differs |= d
            mad = max(mad, m) if m == m else float("nan")
        pages.release(cx)
        pages.release(cy)
        if progress is not None:
            progress(len(cx) * 2)
    return differs, mad


def compare_tensors(
    x: Any,
    y: Any,
    *,
    rtol: float = 0.0,
    atol: float = 0.0,
    progress: Callable[[int], None] | None = None,
    _pages: _Pages | None = None,
) -> dict[str, Any]:
    """Compare two lazy tensors.

    Returns ``{"status": "same" | "changed" | "not_compared", "reason": str,
    "max_abs_diff": float | None}``.
    """
    if x.dtype.name != y.dtype.name or tuple(x.shape) != tuple(y.shape):
        return {
            "status": "changed",
            "reason": f"{x.dtype.name}{list(x.shape)} -> {y.dtype.name}{list(y.shape)}",
            "max_abs_diff": None,
        }
    if SETTINGS.diff_raw_first:
        try:
            xr, yr = _raw_view(x), _raw_view(y)
            if xr is not None and yr is not None:
                differs, mad = _compare_raw(x, y, xr, yr, rtol, atol, progress, _pages or _Pages())
                if differs:
                    return {"status": "changed", "reason": "values", "max_abs_diff": None if mad != mad else mad}
                return {"status": "same", "reason": "", "max_abs_diff": mad}
        except (TorchlessError, AttributeError, NotImplementedError, TypeError, ValueError) as e:
            return {"status": "not_compared", "reason": str(e) or type(e).__name__, "max_abs_diff": None}
    try:
        xv, yv = _values(x), _values(y)
    except (TorchlessError, AttributeError, NotImplementedError, TypeError, ValueError) as e:
        return {"status": "not_compared", "reason": str(e) or type(e).__name__, "max_abs_diff": None}
    xf, yf = xv.reshape(-1), yv.reshape(-1)
    n = xf.size
    mad = 0.0
    differs = False
    step = CHUNK_ELEMENTS
    try:
        for i in range(0, n, step):
            d, m = _compare_chunk(xf[i : i + step], yf[i : i + step], rtol, atol)
            differs |= d
            if m == m:
                mad = max(mad, m)
            else:
                mad = float("nan")
            if progress is not None:
                progress(min(step, n - i) * x.dtype.itemsize * 2)
    except TorchlessError as e:  # a payload that cannot be read (truncated, damaged)
        return {"status": "not_compared", "reason": str(e), "max_abs_diff": None}
    if differs:
        return {"status": "changed", "reason": "values", "max_abs_diff": None if mad != mad else mad}
    return {"status": "same", "reason": "", "max_abs_diff": mad}


def diff_artifacts(
    a: Any,
    b: Any,
    *,
    rtol: float = 0.0,
    atol: float = 0.0,
    progress: Callable[[int], None] | None = None,
    tensors_only: bool = False,
) -> dict[str, Any]:
    """Compare the tensors of two opened artifacts by name.

    Returns ``{"added": [names], "removed": [names], "changed": [{name, reason,
    max_abs_diff}], "not_compared": [{name, reason}], "same": n, "values_added": [keys],
    "values_removed": [keys], "values_changed": [{name, a, b}], "identical": bool}``;
    ``identical`` is True only when nothing was added, removed, changed or left
    uncompared, tensors and other values alike (:func:`artifact_values`), or, with
    ``tensors_only``, when the tensors are (the other values are then not looked at and
    the ``values_*`` lists are empty).
    """
    ta = dict(a.tensors())
    tb = dict(b.tensors())
    added = sorted(set(tb) - set(ta))
    removed = sorted(set(ta) - set(tb))
    changed: list[dict[str, Any]] = []
    not_compared: list[dict[str, Any]] = []
    same = 0
    pages = _Pages()
    for name in [n for n in ta if n in tb]:
        r = compare_tensors(ta[name], tb[name], rtol=rtol, atol=atol, progress=progress, _pages=pages)
        if r["status"] == "same":
            same += 1
        elif r["status"] == "changed":
            changed.append({"name": name, "reason": r["reason"], "max_abs_diff": r["max_abs_diff"]})
        else:
            not_compared.append({"name": name, "reason": r["reason"]})
    va, skipped_a = artifact_values(a) if not tensors_only else ({}, [])
    vb, skipped_b = artifact_values(b) if not tensors_only else ({}, [])
    not_compared += [{"name": f"a: {s['name']}", "reason": s["reason"]} for s in skipped_a]
    not_compared += [{"name": f"b: {s['name']}", "reason": s["reason"]} for s in skipped_b]
    values_added = sorted(set(vb) - set(va))
    values_removed = sorted(set(va) - set(vb))
    values_changed = [{"name": k, "a": _shown(va[k]), "b": _shown(vb[k])} for k in sorted(set(va) & set(vb)) if va[k] != vb[k]]
    identical = not (added or removed or changed or not_compared or values_added or values_removed or values_changed)
    return {
        "added": added,
        "removed": removed,
        "changed": changed,
        "not_compared": not_compared,
        "same": same,
        "values_added": values_added,
        "values_removed": values_removed,
        "values_changed": values_changed,
        "identical": identical,
    }


def _shown(c: Any) -> str:
    """A changed value for the report: short, and for code only its size."""
    kind, v = c[0], c[1]
    if kind == "record":
        return f"{c[1]} bytes, CRC-32 {c[2]:08x}"
    if kind == "array":
        return f"array {c[1]} sha256 {c[2][:12]}"
    if kind == "pickled":
        return f"{c[1]} sha256 {c[2][:12]}"
    if kind == "object" and len(c) == 3:
        return c[2][:120]
    if kind == "code":
        return f"<{len(v.splitlines())} lines of code>"
    if isinstance(v, str) and type(v) is not str:  # a str subclass (Device, Layout): its repr says what it is
        return repr(v)[:120]
    return short_repr(v) if kind != "json" else short_repr(v, limit=120)


#: formats whose every non-tensor part artifact_values models (the rest: a not_compared entry)
_TENSORS_ONLY = ("hf", "npy")


def _canon(v: Any) -> Any:
    """A comparable stand-in for one leaf value: builtins by type and value (NaN equal to
    NaN), anything else by its class (placeholders by the class the file names)."""
    if v is None or isinstance(v, (bool, int, str, bytes)):
        return (type(v).__name__, v)
    if isinstance(v, float):
        return ("float", "nan" if v != v else v)
    if isinstance(v, complex):
        return ("complex", repr(v))
    if isinstance(v, (list, tuple, dict, set, frozenset)) and not v:
        return (type(v).__name__, ())
    name = getattr(v, "class_name", None) or getattr(v, "qualname", None)
    if callable(getattr(v, "digest", None)):  # bytes torchless keeps but does not model (an object array)
        return ("pickled", str(name), v.digest())
    if isinstance(v, (np.generic, np.ndarray)):  # arrays torch has no dtype for: strings, records
        import hashlib

        a = np.array(v, order="C", copy=None)
        return ("array", f"{a.dtype.str}{list(a.shape)}", hashlib.sha256(a.tobytes()).hexdigest())
    if name:  # a placeholder: the class the file names is all it holds
        return ("object", str(name))
    t = type(v)
    if t.__module__.startswith("torchless.") and "__repr__" in vars(t):
        return ("object", t.__name__, repr(v)[:1000])  # torchless's value types (DType, Layout...)
    return (_UNMODELLED, t.__name__)


#: the first element of _canon's answer for a value it cannot compare
_UNMODELLED = "unmodelled"


def _leaves(obj: Any, prefix: str = "") -> dict[str, Any]:
    from .core.tree import iter_leaves

    return {f"{prefix}{k}": _canon(v) for k, v in iter_leaves(obj)}


def artifact_values(art: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """What :func:`diff_artifacts` compares beside the tensors: ``{key: comparable}`` for
    every non-tensor part of ``art``, and ``not_compared`` entries for what it cannot model.

    Keys are dotted names of the object tree's plain values (as ``convert`` names what it
    drops), ``__metadata__.<key>`` for safetensors, ``<program>:graph`` /
    ``<program>:signature`` / ``<program>:range_constraints`` for ``.pt2``, ``code`` for
    TorchScript and ONNX.
    """
    fmt = getattr(art, "format", "")
    out: dict[str, Any] = {}
    skipped: list[dict[str, Any]] = []
    try:
        if hasattr(art, "checkpoint"):  # eager .pt: the whole pickled object
            out.update(_leaves(art.checkpoint.obj))
        elif fmt in ("joblib",):
            out.update(_leaves(art.load()))
        elif fmt == "npz":
            tensors = {k for k, _ in art.tensors()}
            out.update({str(k): _canon(v) for k, v in art.load().items() if k not in tensors})
        elif fmt == "safetensors":
            for k, v in sorted((getattr(art, "metadata", None) or {}).items()):
                out[f"__metadata__.{k}"] = _canon(v)
        elif fmt == "dcp":
            out.update(_leaves(art.values()))
        elif fmt == "torchscript":
            out.update(_leaves(art.load()))
            out["code"] = ("code", art.code())
        elif fmt == "pt2":
            for name, prog in art.programs.items():
                out[f"{name}:graph"] = ("code", prog.graph.python_code())
                out[f"{name}:signature"] = ("json", repr(prog.signature.to_dict()))
                out[f"{name}:range_constraints"] = ("json", repr(sorted(prog.range_constraints.items())))
                for k, v in prog.constants.items():
                    if not hasattr(v, "dtype"):
                        out[f"{name}:constants.{k}"] = _canon(v)
        elif fmt == "onnx":
            info = art.info()
            out["code"] = ("code", art.graph().python_code())
            for k in ("ir_version", "opsets", "producer", "inputs", "outputs"):
                out[k] = ("json", repr(info.get(k)))
        elif fmt == "aoti":  # compiled code and configs: every record by size and CRC-32
            pkg = art.package
            weights = {getattr(w, "name", w) for w in (pkg.weight_files or [])}
            prefix = f"{pkg.zip.prefix}/" if pkg.zip.prefix else ""
            for e in pkg.zip.entries:
                name = e.name[len(prefix) :] if e.name.startswith(prefix) else e.name
                if name not in weights and not name.endswith("serialization_id"):
                    out[f"record:{name}"] = ("record", e.size, e.crc)
        elif fmt not in _TENSORS_ONLY:
            skipped.append(
                {
                    "name": "(non-tensor content)",
                    "reason": f"diff compares the tensors of this {fmt} artifact, not the rest of it",
                }
            )
    except TorchlessError as e:
        skipped.append({"name": "(non-tensor content)", "reason": f"could not be read: {e}"})
    for key in [k for k, c in out.items() if c[0] == _UNMODELLED]:  # never "same" on a guess
        skipped.append({"name": key, "reason": f"a {out.pop(key)[1]} value diff cannot compare"})
    return out, skipped


def diff_bytes(a: Any, b: Any) -> int:
    """Bytes :func:`diff_artifacts` reads (for a progress total): both sides of every
    tensor present in both with equal dtype and shape."""
    ta = dict(a.tensors())
    tb = dict(b.tensors())
    total = 0
    for n, x in ta.items():
        y = tb.get(n)
        if y is not None and x.dtype.name == y.dtype.name and tuple(x.shape) == tuple(y.shape):
            total += 2 * x.nbytes
    return total


def diff(
    a: Any,
    b: Any,
    *,
    format: str | None = None,
    rtol: float = 0.0,
    atol: float = 0.0,
    progress: Callable[[int], None] | None = None,
    tensors_only: bool = False,
) -> dict[str, Any]:
    """Compare the artifacts at paths ``a`` and ``b`` (see :func:`diff_artifacts`).
    Nothing is executed: unknown classes are placeholders."""
    from ._api import open as open_artifact

    with open_artifact(a, format=format, weights_only=False) as x, open_artifact(b, format=format, weights_only=False) as y:
        return diff_artifacts(x, y, rtol=rtol, atol=atol, progress=progress, tensors_only=tensors_only)
