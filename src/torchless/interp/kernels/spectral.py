"""Spectral kernels: the ``fft_*`` family as ``torch.fft`` records it (``fft_rfft``,
``fft_fftn``, ``fft_fftfreq``, ``fft_fftshift``...), the window functions (``hann_window``
and its siblings) and ``stft``.

Integer and bool inputs compute in float32 (torch's default dtype), float32 in complex64,
float64 in complex128; the 16-bit floats are refused (torch's CPU FFT has none). The
transforms are NumPy's (``numpy.fft``), its ``norm`` names being torch's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from .. import promote
from ..registry import kernel
from ._common import bad, norm_dim, np_dtype, refuse, tensor

_NORMS = (None, "backward", "ortho", "forward")


def _input(x: Any, op: str, real_only: bool = False, complex_in: bool = False) -> np.ndarray:
    """``x`` in the dtype the transform computes in."""
    v = tensor(x)
    if v.dtype.kind == "c":
        if real_only:
            raise bad(op, f"expects a real input tensor, but got {v.dtype}")
        return v if v.dtype in (np.complex64, np.complex128) else v.astype(np.complex64)
    if promote.category(v.dtype) <= promote.INT:
        v = v.astype(promote.DEFAULT_FLOAT)
    if v.dtype not in (np.float32, np.float64):
        raise refuse(op, f"unsupported dtype {v.dtype}")
    return v.astype(promote.to_complex(v.dtype)) if complex_in else v


def _norm(norm: Any, op: str) -> str:
    if norm not in _NORMS:
        raise bad(op, f"invalid normalization mode: {norm}")
    return norm or "backward"


def _dims(x: np.ndarray, s: Any, dim: Any, op: str) -> tuple[list[int] | None, list[int]]:
    """(s, dims) of an n-d transform: every dim when both are None, the last len(s) dims
    when only s is given."""
    if dim is None:
        dims = list(range(x.ndim)) if s is None else list(range(x.ndim - len(s), x.ndim))
    else:
        dims = [norm_dim(d, x.ndim, op) for d in ([dim] if isinstance(dim, int) else dim)]
    if len(set(dims)) != len(dims):
        raise bad(op, "dims must be unique")
    if s is not None:
        s = [int(n) if n != -1 else x.shape[d] for n, d in zip(s, dims, strict=False)]
        if len(s) != len(dims):
            raise bad(op, "when given, dim and shape arguments must have the same length")
        if any(n <= 0 for n in s):
            raise bad(op, f"invalid number of data points ({min(s)}) specified")
    return s, dims


def _cast_out(r: Any, src: np.dtype, real: bool) -> np.ndarray:
    base = promote.to_real(src) if src.kind == "c" else src
    return np.asarray(r).astype(base if real else promote.to_complex(base))


def _one_d(name: str, fn: Any, real_in: bool, real_out: bool) -> None:
    op = f"aten.{name}"

    @kernel(f"{op}.default")
    def k(self: np.ndarray, n: Any = None, dim: int = -1, norm: Any = None) -> np.ndarray:
        x = _input(self, op, real_only=real_in, complex_in=name in ("fft_irfft", "fft_hfft"))
        d = norm_dim(dim, x.ndim, op)
        if n is not None and n < 1:
            raise bad(op, f"invalid number of data points ({n}) specified")
        if x.ndim == 0:
            raise bad(op, "expects a tensor of at least one dimension")
        return _cast_out(fn(x, n=n, axis=d, norm=_norm(norm, op)), x.dtype, real_out)

    k.__name__ = name


for _name, _fn, _ri, _ro in (
    ("fft_fft", np.fft.fft, False, False),
    ("fft_ifft", np.fft.ifft, False, False),
    ("fft_rfft", np.fft.rfft, True, False),
    ("fft_irfft", np.fft.irfft, False, True),
    ("fft_hfft", np.fft.hfft, False, True),
    ("fft_ihfft", np.fft.ihfft, True, False),
):
    _one_d(_name, _fn, _ri, _ro)


def _n_d(name: str, fn: Any, real_in: bool, real_out: bool, default_dim: Any) -> None:
    op = f"aten.{name}"

    @kernel(f"{op}.default")
    def k(self: np.ndarray, s: Any = None, dim: Any = default_dim, norm: Any = None) -> np.ndarray:
        x = _input(self, op, real_only=real_in, complex_in=name.startswith("fft_irfft"))
        ss, dims = _dims(x, s, dim, op)
        if not dims:
            return x.astype(promote.to_complex(x.dtype)) if not real_out else x
        return _cast_out(fn(x, s=ss, axes=dims, norm=_norm(norm, op)), x.dtype, real_out)

    k.__name__ = name


for _sfx, _dd in (("2", [-2, -1]), ("n", None)):
    _n_d(f"fft_fft{_sfx}", np.fft.fftn, False, False, _dd)
    _n_d(f"fft_ifft{_sfx}", np.fft.ifftn, False, False, _dd)
    _n_d(f"fft_rfft{_sfx}", np.fft.rfftn, True, False, _dd)
    _n_d(f"fft_irfft{_sfx}", np.fft.irfftn, False, True, _dd)


def _freq(op: str, n: int, d: float, dtype: Any, onesided: bool) -> np.ndarray:
    """torch's ``arange`` of the frequency indices (the upper half negative unless
    ``onesided``) times ``1 / (n * d)`` (inf for n == 0, as in C)."""
    dt = np.dtype(np_dtype(dtype, promote.DEFAULT_FLOAT))
    if promote.category(dt) < promote.FLOAT:
        raise refuse(op, f"dtype {dt}: only floating point frequencies")
    if n < 0:
        raise bad(op, f"n must be non-negative, got {n}")
    idx = np.arange(n // 2 + 1 if onesided else n, dtype=np.float64)
    if not onesided:
        idx[(n + 1) // 2 :] -= n
    with np.errstate(all="ignore"):
        return (idx.astype(dt) * (np.float64(1.0) / np.float64(n * d))).astype(dt)


@kernel("aten.fft_fftfreq.default")
def fftfreq(
    n: int, d: float = 1.0, *, dtype: Any = None, layout: Any = None, device: Any = None, pin_memory: Any = None
) -> np.ndarray:
    return _freq("aten.fft_fftfreq", n, d, dtype, False)


@kernel("aten.fft_rfftfreq.default")
def rfftfreq(
    n: int, d: float = 1.0, *, dtype: Any = None, layout: Any = None, device: Any = None, pin_memory: Any = None
) -> np.ndarray:
    return _freq("aten.fft_rfftfreq", n, d, dtype, True)


@kernel("aten.fft_fftshift.default")
def fftshift(self: np.ndarray, dim: Any = None) -> np.ndarray:
    x = tensor(self)
    _, dims = _dims(x, None, dim, "aten.fft_fftshift")
    return np.roll(x, [x.shape[d] // 2 for d in dims], axis=dims) if dims else x.copy()


@kernel("aten.fft_ifftshift.default")
def ifftshift(self: np.ndarray, dim: Any = None) -> np.ndarray:
    x = tensor(self)
    _, dims = _dims(x, None, dim, "aten.fft_ifftshift")
    return np.roll(x, [(x.shape[d] + 1) // 2 for d in dims], axis=dims) if dims else x.copy()


# -- windows ----------------------------------------------------------------------------------


def _window(op: str, length: int, periodic: bool, dtype: Any, fn: Any) -> np.ndarray:
    """``fn(n, N, dt)`` at n = 0..length-1 (N the symmetric window's length: length + 1 when
    periodic), rounded to ``dt``."""
    dt = np.dtype(np_dtype(dtype, promote.DEFAULT_FLOAT))
    if promote.category(dt) != promote.FLOAT:
        raise bad(op, f"expected a floating point dtype, got {dt}")
    if length < 0:
        raise bad(op, f"requires non-negative window length, got window_length={length}")
    if length <= 1:
        return np.ones(length, dt)
    big = length + 1 if periodic else length
    return np.asarray(fn(np.arange(length, dtype=np.float64), big, dt)).astype(dt)


def _cosine(alpha: float, beta: float) -> Any:
    """torch's steps, each rounded to the dtype (computed in its opmath type, the scalars
    first rounded to the dtype): ``arange * (2 pi / (N - 1))``, ``cos``, ``* -beta``, ``+ alpha``."""

    def fn(n: np.ndarray, big: int, dt: np.dtype) -> np.ndarray:
        op = promote.opmath(dt)

        def step(v: np.ndarray) -> np.ndarray:
            return v.astype(dt).astype(op)

        def scalar(v: float) -> Any:
            return np.asarray(v).astype(dt).astype(op)

        w = step(n.astype(dt).astype(op) * scalar(2 * math.pi / (big - 1)))
        w = step(np.cos(w))
        w = step(w * scalar(-beta))
        return step(w + scalar(alpha))

    return fn


def _win_kernel(keys: Sequence[str], name: str, make: Any) -> None:
    @kernel(*keys)
    def k(
        window_length: int,
        periodic: bool = True,
        *params: Any,
        dtype: Any = None,
        layout: Any = None,
        device: Any = None,
        pin_memory: Any = None,
    ) -> np.ndarray:
        return _window(f"aten.{name}", int(window_length), bool(periodic), dtype, make(*params))

    k.__name__ = name


_win_kernel(("aten.hann_window.default", "aten.hann_window.periodic"), "hann_window", lambda: _cosine(0.5, 0.5))
_win_kernel(
    (
        "aten.hamming_window.default",
        "aten.hamming_window.periodic",
        "aten.hamming_window.periodic_alpha",
        "aten.hamming_window.periodic_alpha_beta",
    ),
    "hamming_window",
    lambda alpha=0.54, beta=0.46: _cosine(alpha, beta),
)
_win_kernel(
    ("aten.blackman_window.default", "aten.blackman_window.periodic"),
    "blackman_window",
    lambda: lambda n, big, dt: 0.42 - 0.5 * np.cos(2 * math.pi * n / (big - 1)) + 0.08 * np.cos(4 * math.pi * n / (big - 1)),
)
_win_kernel(
    ("aten.bartlett_window.default", "aten.bartlett_window.periodic"),
    "bartlett_window",
    lambda: lambda n, big, dt: 1 - np.abs(2 * n / (big - 1) - 1),
)
_win_kernel(
    ("aten.kaiser_window.default", "aten.kaiser_window.periodic", "aten.kaiser_window.beta"),
    "kaiser_window",
    lambda beta=12.0: (
        lambda n, big, dt: np.i0(beta * np.sqrt(np.clip(1 - ((n - (big - 1) / 2) / ((big - 1) / 2)) ** 2, 0, None))) / np.i0(beta)
    ),
)


# -- stft -----------------------------------------------------------------------------------

_PAD_MODES = {"reflect": "reflect", "constant": "constant", "replicate": "edge", "circular": "wrap"}


@kernel("aten.stft.default")
def stft(
    self: np.ndarray,
    n_fft: int,
    hop_length: Any = None,
    win_length: Any = None,
    window: Any = None,
    normalized: bool = False,
    onesided: Any = None,
    return_complex: Any = None,
    align_to_window: Any = None,
) -> np.ndarray:
    """Short-time Fourier transform of a 1-d or batched 2-d signal: frames of ``n_fft``
    every ``hop_length`` samples, times the window (centred in ``n_fft``), transformed;
    ``(batch?, freq, frames)``."""
    op = "aten.stft"
    if align_to_window:
        raise refuse(op, "align_to_window=True")
    x = _input(self, op)
    if x.ndim not in (1, 2):
        raise bad(op, f"expected a 1D or 2D tensor, got {x.ndim}-d")
    hop = n_fft // 4 if hop_length is None else int(hop_length)
    win = n_fft if win_length is None else int(win_length)
    length = x.shape[-1]
    if not 0 < n_fft <= length:
        raise bad(op, f"expected 0 < n_fft <= {length}, but got n_fft={n_fft}")
    if hop <= 0 or not 0 < win <= n_fft:
        raise bad(op, f"expected hop_length > 0 and 0 < win_length <= n_fft, got {hop} and {win}")
    w = None
    if window is not None:
        w = tensor(window)
        if w.shape != (win,):
            raise bad(
                op, f"expected a 1D window tensor of size equal to win_length={win}, but got window with size {list(w.shape)}"
            )
        if win < n_fft:
            left = (n_fft - win) // 2
            w = np.pad(w, (left, n_fft - win - left))
    elif win < n_fft:
        left = (n_fft - win) // 2
        w = np.pad(np.ones(win, x.dtype if x.dtype.kind == "f" else promote.to_real(x.dtype)), (left, n_fft - win - left))
    complex_result = x.dtype.kind == "c" or (w is not None and w.dtype.kind == "c")
    if return_complex is None:
        raise bad(op, "stft requires the return_complex parameter be given for real inputs")
    if onesided is None:
        onesided = not complex_result
    elif onesided and complex_result:
        raise bad(op, "cannot have onesided output if window or input is complex")
    frames = 1 + (length - n_fft) // hop
    view = np.lib.stride_tricks.sliding_window_view(x, n_fft, axis=-1)[..., ::hop, :][..., :frames, :]
    src = x.dtype
    if w is not None:
        rt = promote.promote_types(x.dtype, w.dtype)
        view = view.astype(rt) * w.astype(rt)
        src = rt
    r = np.fft.rfft(view, axis=-1) if onesided else np.fft.fft(view, axis=-1)
    if normalized:
        r = r / math.sqrt(n_fft)
    out = np.swapaxes(np.asarray(r).astype(promote.to_complex(src if src.kind != "c" else promote.to_real(src))), -1, -2)
    if return_complex:
        return np.ascontiguousarray(out)
    real = np.empty((*out.shape, 2), promote.to_real(out.dtype))
    real[..., 0], real[..., 1] = out.real, out.imag
    return real


@kernel("aten.stft.center")
def stft_center(
    self: np.ndarray,
    n_fft: int,
    hop_length: Any = None,
    win_length: Any = None,
    window: Any = None,
    center: bool = True,
    pad_mode: str = "reflect",
    normalized: bool = False,
    onesided: Any = None,
    return_complex: Any = None,
    align_to_window: Any = None,
) -> np.ndarray:
    """:func:`stft`, the signal first padded by ``n_fft // 2`` on both sides when ``center``."""
    x = tensor(self)
    if center:
        if pad_mode not in _PAD_MODES:
            raise bad("aten.stft", f"unsupported pad_mode {pad_mode!r}")
        p = n_fft // 2
        widths = [(0, 0)] * (x.ndim - 1) + [(p, p)]
        if pad_mode == "reflect" and x.shape[-1] <= p:
            raise bad("aten.stft", f"padding size {p} must be less than the input dimension {x.shape[-1]}")
        x = np.pad(x, widths, mode=_PAD_MODES[pad_mode])  # type: ignore[call-overload]  # (mode: a str of the table)
    return stft(x, n_fft, hop_length, win_length, window, normalized, onesided, return_complex, align_to_window)
