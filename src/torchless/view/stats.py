"""Statistics, histograms and heatmaps of one tensor, computed on request from a bounded sample.

A tensor of more than :data:`SAMPLE_ELEMENTS` elements is read as :data:`SAMPLE_BLOCKS`
contiguous blocks spread evenly over it (so at most ``SAMPLE_ELEMENTS`` elements of its
pages are touched, never the whole checkpoint); every answer says how many elements it
saw (``sample``) out of how many (``numel``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..core.errors import TorchlessError

__all__ = ["SAMPLE_ELEMENTS", "SAMPLE_BLOCKS", "HIST_BINS", "HEATMAP_SIDE", "tensor_stats", "heatmap", "diff_stats"]

#: elements read at most per tensor for statistics and histograms
SAMPLE_ELEMENTS = 1 << 20
#: contiguous blocks the sample is made of (evenly spread over the tensor)
SAMPLE_BLOCKS = 64
#: histogram bins
HIST_BINS = 64
#: a heatmap is at most this many cells on a side (rows and columns picked evenly)
HEATMAP_SIDE = 128

_READ_ERRORS = (TorchlessError, AttributeError, NotImplementedError, TypeError, ValueError, OverflowError)


def _flat(t: Any) -> np.ndarray:
    """The tensor's values as a flat NumPy array (a view where the reader allows)."""
    if getattr(t, "quantizer", None) is not None:
        return np.asarray(t.dequantize()).reshape(-1)
    if getattr(t, "storage", "none") is None:
        raise TorchlessError("a meta tensor has no data")
    numpy = getattr(t, "numpy", None)
    if numpy is None:
        raise TorchlessError(f"{type(t).__name__} values cannot be read as one array")
    return np.asarray(numpy()).reshape(-1)


def _sample(flat: np.ndarray, limit: int) -> tuple[np.ndarray, bool]:
    """``(values, sampled)``: the whole array when small, else evenly spread blocks."""
    n = flat.size
    if n <= limit:
        return flat, False
    block = max(1, limit // SAMPLE_BLOCKS)
    starts = np.linspace(0, n - block, SAMPLE_BLOCKS).astype(np.int64)
    return np.concatenate([flat[s : s + block] for s in starts]), True


def _as_float(a: np.ndarray) -> np.ndarray:
    if a.dtype.kind == "c":
        return np.abs(a.astype(np.complex128))
    if a.dtype.kind == "b":
        return a.astype(np.float64)
    try:
        return a.astype(np.float64)
    except (TypeError, ValueError) as e:
        raise TorchlessError(f"dtype {a.dtype} has no numeric values") from e


def _num(x: float) -> float | None:
    """A JSON-safe float (None for NaN/inf, which JSON cannot hold)."""
    return float(x) if np.isfinite(x) else None


def _summary(v: np.ndarray, bins: int) -> dict[str, Any]:
    nan = int(np.isnan(v).sum())
    inf = int(np.isinf(v).sum())
    zero = int((v == 0).sum())
    fin = v[np.isfinite(v)]
    out: dict[str, Any] = {"nan": nan, "inf": inf, "zero": zero, "finite": int(fin.size)}
    if fin.size:
        lo, hi = float(fin.min()), float(fin.max())
        out.update(min=_num(lo), max=_num(hi), mean=_num(float(fin.mean())), std=_num(float(fin.std())))
        if not (np.isfinite(lo) and np.isfinite(hi)):
            out["hist"] = None
        else:
            edges_hi = hi if hi > lo else lo + 1.0
            counts, edges = np.histogram(fin, bins=bins, range=(lo, edges_hi))
            out["hist"] = {"counts": counts.tolist(), "lo": lo, "hi": float(edges[-1])}
    else:
        out.update(min=None, max=None, mean=None, std=None, hist=None)
    return out


def tensor_stats(t: Any, *, sample: int = SAMPLE_ELEMENTS, bins: int = HIST_BINS) -> dict[str, Any]:
    """min, max, mean, std, NaN/inf/zero counts and a histogram of ``t``'s values.

    Returns ``{"numel", "sample", "sampled", "min", "max", "mean", "std", "nan", "inf",
    "zero", "finite", "hist": {"counts", "lo", "hi"}}`` (counts over the sample), or
    ``{"error": text}`` when the values cannot be read (a meta tensor, an opaque dtype, a
    damaged payload). Complex values are summarised by magnitude.
    """
    try:
        flat = _flat(t)
        part, sampled = _sample(flat, sample)
        v = _as_float(part)
    except _READ_ERRORS as e:
        return {"error": str(e) or type(e).__name__}
    return {"numel": int(flat.size), "sample": int(v.size), "sampled": sampled, **_summary(v, bins)}


def heatmap(t: Any, *, side: int = HEATMAP_SIDE, index: tuple[int, ...] = (), digits: int | None = None) -> dict[str, Any]:
    """A 2-D slice of ``t`` as at most ``side`` x ``side`` cells (rows and columns picked
    evenly): ``{"rows", "cols", "shape", "index", "values": [[float|None]], "min", "max"}``;
    ``digits`` rounds the cells to that many significant digits (a smaller page).

    ``index`` fixes the leading dimensions of a tensor of more than two (default: zeros);
    a 1-D tensor is one row. ``{"error": text}`` when there is no 2-D slice to show.
    """
    shape = tuple(int(s) for s in getattr(t, "shape", ()))
    if len(shape) == 0 or 0 in shape:
        return {"error": "no 2-D slice: the tensor is a scalar or empty"}
    lead = len(shape) - 2 if len(shape) >= 2 else 0
    index = tuple(index) + (0,) * (lead - len(index))
    index = index[:lead]
    for i, (k, s) in enumerate(zip(index, shape[:lead], strict=True)):
        if not 0 <= k < s:
            return {"error": f"index {k} out of range for dimension {i} of size {s}"}
    try:
        flat = _flat(t)
    except _READ_ERRORS as e:
        return {"error": str(e) or type(e).__name__}
    rows, cols = (shape[-2], shape[-1]) if len(shape) >= 2 else (1, shape[0])
    base = 0
    for k, s in zip(index, shape[:lead], strict=True):
        base = base * s + k
    base *= rows * cols
    ri = np.unique(np.linspace(0, rows - 1, min(rows, side)).astype(np.int64))
    ci = np.unique(np.linspace(0, cols - 1, min(cols, side)).astype(np.int64))
    try:
        idx = base + ri[:, None] * cols + ci[None, :]
        v = _as_float(flat[idx.reshape(-1)]).reshape(len(ri), len(ci))
    except _READ_ERRORS as e:
        return {"error": str(e) or type(e).__name__}
    fin = v[np.isfinite(v)]
    if digits is None:
        vals = [[_num(x) for x in row] for row in v.tolist()]
    else:
        fmt = f"{{:.{digits}g}}"
        vals = [[float(fmt.format(x)) if np.isfinite(x) else None for x in row] for row in v.tolist()]
    return {
        "shape": list(shape),
        "index": list(index),
        "rows": ri.tolist(),
        "cols": ci.tolist(),
        "values": vals,
        "min": float(fin.min()) if fin.size else None,
        "max": float(fin.max()) if fin.size else None,
    }


def diff_stats(x: Any, y: Any, *, sample: int = SAMPLE_ELEMENTS, bins: int = HIST_BINS) -> dict[str, Any]:
    """The differences ``b - a`` of two same-shape tensors over the same sample:
    ``{"numel", "sample", "sampled", "max_abs", "mean_abs", "hist", ...}`` (the
    :func:`tensor_stats` fields of the differences), or ``{"error": text}``."""
    if tuple(x.shape) != tuple(y.shape):
        return {"error": f"shapes differ: {list(x.shape)} vs {list(y.shape)}"}
    try:
        fx, fy = _flat(x), _flat(y)
        px, sampled = _sample(fx, sample)
        py, _ = _sample(fy, sample)
        with np.errstate(invalid="ignore", over="ignore"):
            d = _as_float(py) - _as_float(px)
    except _READ_ERRORS as e:
        return {"error": str(e) or type(e).__name__}
    fin = np.abs(d[np.isfinite(d)])
    out = {"numel": int(fx.size), "sample": int(d.size), "sampled": sampled, **_summary(d, bins)}
    out["max_abs"] = _num(float(fin.max())) if fin.size else None
    out["mean_abs"] = _num(float(fin.mean())) if fin.size else None
    out["changed"] = int((d != 0).sum())
    return out
