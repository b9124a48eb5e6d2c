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


def _sigmoid(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return 1 / (1 + np.exp(-x))


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
    steps = x.shape[0]
    for layer in range(nl):
        outs = []
        for d in range(d_count):
            p = [compute(t) for t in params[(layer * d_count + d) * per : (layer * d_count + d + 1) * per]]
            w_ih, w_hh = p[0], p[1]
            b_ih, b_hh = (p[2], p[3]) if has_biases else (None, None)
            w_hr = p[-1] if has_proj else None
            xs = layer_in if d == 0 else layer_in[::-1]
            hidden = w_hh.shape[1]
            gi = np.matmul(xs, w_ih.T)  # every step's input projection at once
            if b_ih is not None:
                gi += b_ih
            if b_hh is not None:  # fold the recurrent bias in, except GRU's n gate (inside r * (...))
                if kind == "gru":
                    gi[..., : 2 * hidden] += b_hh[: 2 * hidden]
                else:
                    gi += b_hh
            b_hn = b_hh[2 * hidden :] if (kind == "gru" and b_hh is not None) else None
            w_hh_t = np.ascontiguousarray(w_hh.T)
            h = states[0][layer * d_count + d]
            c = states[1][layer * d_count + d] if kind == "lstm" else None
            ys = []
            for t in range(steps):
                gh = np.matmul(h, w_hh_t)
                if kind == "lstm":
                    gates = gi[t] + gh
                    hs = gates.shape[-1] // 4
                    sg = _sigmoid(gates)
                    c = sg[..., hs : 2 * hs] * c + sg[..., :hs] * np.tanh(gates[..., 2 * hs : 3 * hs])
                    h = sg[..., 3 * hs :] * np.tanh(c)
                    if w_hr is not None:
                        h = np.matmul(h, w_hr.T)
                elif kind == "gru":
                    hs = gh.shape[-1] // 3
                    rz = _sigmoid(gi[t][..., : 2 * hs] + gh[..., : 2 * hs])
                    hn = gh[..., 2 * hs :] if b_hn is None else gh[..., 2 * hs :] + b_hn
                    n = np.tanh(gi[t][..., 2 * hs :] + rz[..., :hs] * hn)
                    z = rz[..., hs:]
                    h = n + z * (h - n)
                elif kind == "rnn_tanh":
                    h = np.tanh(gi[t] + gh)
                else:
                    h = np.maximum(gi[t] + gh, 0)
                ys.append(h)
            y = np.stack(ys) if ys else np.zeros((0, *h.shape), dtype=h.dtype)
            outs.append(y if d == 0 else y[::-1])
            out_h.append(h)
            out_c.append(c)
        layer_in = np.concatenate(outs, axis=-1) if d_count == 2 else outs[0]
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
