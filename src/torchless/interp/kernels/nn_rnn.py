"""Recurrent kernels training IR keeps whole: ``lstm.input`` (with ``proj_size``),
``gru.input``, ``rnn_tanh.input``, ``rnn_relu.input``; multi-layer, bidirectional,
``batch_first``.

The input projection of every time step is one matrix product per layer and direction;
only the recurrence (``h @ W_hh``) runs step by step, as it must. Weights come in torch's
flat order: per layer, per direction ``w_ih, w_hh[, b_ih, b_hh][, w_hr]``. Dropout between
layers (``train`` with ``dropout > 0``) draws from the interpreter's generator (``create.seed``).
"""

from __future__ import annotations

import numpy as np

from ...core.errors import UsageError
from ..registry import kernel
from . import nn_misc
from ._nn_util import compute, finish, require_float


def _sigmoid_(x: np.ndarray) -> np.ndarray:
    """``1 / (1 + exp(-x))`` in place on ``x`` (a fresh array), the same operations as
    written out; ``exp`` overflowing to inf gives 0, as it should."""
    np.negative(x, out=x)
    with np.errstate(over="ignore"):
        np.exp(x, out=x)
    x += 1
    np.reciprocal(x, out=x)
    return x


def _steps(kind: str, gi: np.ndarray, h: np.ndarray, c: np.ndarray | None, w_hh_t: np.ndarray, w_hr_t: np.ndarray | None):
    """The recurrence of one layer of LSTM or the plain RNNs, every direction at once: ``gi`` ``(T, D, B, G)`` the
    input projections (direction 1's in reversed time), ``h``/``c`` ``(D, B, H)`` fresh
    initial states, ``w_hh_t`` ``(D, H, G)``. Per step one batched matmul ``h @ W_hh``
    (one BLAS product per direction, as before) and a few whole-array operations, in
    place where the operand is a temporary. Returns ``(ys (T, D, B, H_out), h, c)``."""
    steps = gi.shape[0]
    ys = np.empty((steps, *h.shape), h.dtype)
    hs = w_hh_t.shape[-1] // 4  # LSTM: the cell size (the hidden state may be projected)
    for t in range(steps):
        g = np.matmul(h, w_hh_t)  # fresh (D, B, G)
        g += gi[t]
        if kind == "lstm":
            cand = np.tanh(g[..., 2 * hs : 3 * hs])
            sg = _sigmoid_(g)
            c = c * sg[..., hs : 2 * hs]
            cand *= sg[..., :hs]
            c += cand
            hf = np.tanh(c)
            hf *= sg[..., 3 * hs :]
            if w_hr_t is not None:
                np.matmul(hf, w_hr_t, out=ys[t])
            else:
                ys[t] = hf
        elif kind == "rnn_tanh":
            np.tanh(g, out=ys[t])
        else:
            np.maximum(g, 0, out=ys[t])
        h = ys[t]
    return ys, h, c


def _gru_steps(gi: np.ndarray, h: np.ndarray, w_hh_t: np.ndarray, b_hn):
    """GRU's recurrence, every direction at once (see :func:`_steps`)."""
    steps = gi.shape[0]
    ys = np.empty((steps, *h.shape), h.dtype)
    hs = h.shape[-1]
    for t in range(steps):
        gh = np.matmul(h, w_hh_t)  # fresh (D, B, 3H)
        git = gi[t]
        rz = _sigmoid_(np.add(git[..., : 2 * hs], gh[..., : 2 * hs]))
        hn = gh[..., 2 * hs :]
        if b_hn is not None:
            hn += b_hn
        n = rz[..., :hs] * hn
        n += git[..., 2 * hs :]
        np.tanh(n, out=n)
        y = ys[t]
        np.subtract(h, n, out=y)
        y *= rz[..., hs:]
        y += n
        h = y
    return ys, h


def _run(kind: str, input, hx: list, params: list, has_biases, num_layers, dropout, train, bidirectional, batch_first):
    require_float(kind, input)
    x = compute(input)
    if x.ndim != 3:
        raise UsageError(f"{kind}: input of {x.ndim} dims (the aten op takes (seq, batch, feature); nn modules unsqueeze)")
    if batch_first:
        x = x.swapaxes(0, 1)
    d_count = 2 if bidirectional else 1
    nl = int(num_layers)
    if len(params) % (nl * d_count):
        raise UsageError(f"{kind}: {len(params)} weights for {nl} layers x {d_count} directions")
    per = len(params) // (nl * d_count)
    has_proj = per == (5 if has_biases else 3)
    states = [compute(h) for h in hx]
    out_h, out_c = [], []
    layer_in = x
    for layer in range(nl):
        gis: list[np.ndarray] = []
        whh: list[np.ndarray] = []
        b_hns: list[np.ndarray] = []
        whr: list[np.ndarray] = []
        for d in range(d_count):
            p = [compute(t) for t in params[(layer * d_count + d) * per : (layer * d_count + d + 1) * per]]
            w_ih, w_hh = p[0], p[1]
            b_ih, b_hh = (p[2], p[3]) if has_biases else (None, None)
            hidden = w_hh.shape[1]
            xs = layer_in if d == 0 else layer_in[::-1]
            # every step's input projection at once, in one 2-d product (NumPy's matmul of
            # a 3-d operand is a loop of small ones, and of the reversed sequence no BLAS)
            gi = np.matmul(np.reshape(xs, (-1, xs.shape[-1])), w_ih.T).reshape(*xs.shape[:-1], w_ih.shape[0])
            if b_ih is not None:
                gi += b_ih
            if b_hh is not None:  # fold the recurrent bias in, except GRU's n gate (inside r * (...))
                if kind == "gru":
                    gi[..., : 2 * hidden] += b_hh[: 2 * hidden]
                else:
                    gi += b_hh
            gis.append(gi)
            whh.append(w_hh.T)
            if kind == "gru" and b_hh is not None:
                b_hns.append(b_hh[2 * hidden :])
            if has_proj:
                whr.append(p[-1].T)
        gi = np.stack(gis, axis=1)  # (T, D, B, G)
        w_hh_t = np.ascontiguousarray(np.stack(whh))  # (D, H, G)
        b_hn = np.stack(b_hns)[:, None, :] if b_hns else None
        w_hr_t = np.ascontiguousarray(np.stack(whr)) if whr else None
        first = layer * d_count
        h0 = np.stack([states[0][first + d] for d in range(d_count)])  # fresh: updated in place
        if kind == "gru":
            ys, h = _gru_steps(gi, h0, w_hh_t, b_hn)
            c = None
        else:
            c0 = np.stack([states[1][first + d] for d in range(d_count)]) if kind == "lstm" else None
            ys, h, c = _steps(kind, gi, h0, c0, w_hh_t, w_hr_t)
        for d in range(d_count):
            out_h.append(h[d])
            out_c.append(None if c is None else c[d])
        if d_count == 2:
            layer_in = np.concatenate([ys[:, 0], ys[::-1, 1]], axis=-1)
        else:
            layer_in = ys[:, 0]
        if train and dropout > 0 and layer < nl - 1:
            layer_in = compute(nn_misc._dropout(layer_in, dropout)[0])
    out = layer_in.swapaxes(0, 1) if batch_first else layer_in
    hy = np.stack(out_h)
    res = [finish(np.ascontiguousarray(out), input.dtype), finish(hy, input.dtype)]
    if kind == "lstm":
        cy = np.stack([c for c in out_c if c is not None])
        res.append(finish(cy, input.dtype))
    return tuple(res)


@kernel("aten.lstm.input")
def lstm(input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first):
    return _run("lstm", input, list(hx), list(params), has_biases, num_layers, dropout, train, bidirectional, batch_first)


@kernel("aten.gru.input")
def gru(input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first):
    return _run("gru", input, [hx], list(params), has_biases, num_layers, dropout, train, bidirectional, batch_first)


@kernel("aten.rnn_tanh.input")
def rnn_tanh(input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first):
    return _run("rnn_tanh", input, [hx], list(params), has_biases, num_layers, dropout, train, bidirectional, batch_first)


@kernel("aten.rnn_relu.input")
def rnn_relu(input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first):
    return _run("rnn_relu", input, [hx], list(params), has_biases, num_layers, dropout, train, bidirectional, batch_first)
