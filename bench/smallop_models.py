"""The small-op programs of ``bench/bench_interp.py`` (issue #32): modules whose time is one
or a few non-BLAS operators (grid sampling, resizing, masked attention, recurrences), at
realistic sizes. Same shape as ``tests/interp/zoo_models.py``'s cases (``ZooCase``), so the
benchmark's children build and export them the same way. Imports torch: benchmark only.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F
from zoo_models import ZooCase


class GridSample(nn.Module):
    def __init__(self, mode: str, align_corners: bool) -> None:
        super().__init__()
        self.mode, self.align_corners = mode, align_corners

    def forward(self, x, grid):
        return F.grid_sample(x, grid, mode=self.mode, padding_mode="zeros", align_corners=self.align_corners)


class Resize(nn.Module):
    def __init__(self, mode: str, scale: float, align_corners: bool | None = None) -> None:
        super().__init__()
        self.mode, self.scale, self.align_corners = mode, scale, align_corners

    def forward(self, x):
        return F.interpolate(x, scale_factor=self.scale, mode=self.mode, align_corners=self.align_corners)


class MaskedSDPA(nn.Module):
    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind

    def forward(self, q, k, v, mask):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


class RNN(nn.Module):
    def __init__(self, cls) -> None:
        super().__init__()
        self.rnn = cls(64, 128, num_layers=2, batch_first=True, bidirectional=True)

    def forward(self, x):
        y, h = self.rnn(x)
        return y, h


class MHA(nn.Module):
    def __init__(self, need_weights: bool) -> None:
        super().__init__()
        self.att = nn.MultiheadAttention(256, 8, batch_first=True)
        self.need_weights = need_weights

    def forward(self, x, mask):
        y, w = self.att(x, x, x, attn_mask=mask, need_weights=self.need_weights)
        return y if w is None else (y, w)


def _randn(*shape, g):
    return torch.randn(*shape, generator=g)


def _grid(g):
    # sample points slightly beyond [-1, 1], so the zero padding is exercised
    return _randn(4, 32, 64, 64, g=g), torch.rand(4, 64, 64, 2, generator=g) * 2.2 - 1.1


def _sdpa(kind):
    def inputs(g):
        q, k, v = (_randn(2, 8, 128, 64, g=g) for _ in range(3))
        causal = torch.ones(128, 128, dtype=torch.bool).tril()
        mask = causal if kind == "bool" else torch.where(causal, 0.0, -1e4) + 0.1 * _randn(128, 128, g=g)
        return q, k, v, mask

    return inputs


def _mha_inputs(g):
    x = _randn(4, 128, 256, g=g)
    return x, ~torch.ones(128, 128, dtype=torch.bool).tril()  # True = masked out (causal)


def _img(g):
    return (_randn(4, 32, 64, 64, g=g),)


SMALLOPS: list[ZooCase] = [
    ZooCase("grid_bilinear", lambda: GridSample("bilinear", False), _grid),
    ZooCase("grid_bilinear_ac", lambda: GridSample("bilinear", True), _grid),
    ZooCase("grid_nearest", lambda: GridSample("nearest", False), _grid),
    ZooCase("grid_nearest_ac", lambda: GridSample("nearest", True), _grid),
    ZooCase("resize_bilinear_up", lambda: Resize("bilinear", 2.0, False), _img),
    ZooCase("resize_bilinear_up_ac", lambda: Resize("bilinear", 2.0, True), _img),
    ZooCase("resize_bilinear_down", lambda: Resize("bilinear", 0.5, False), _img),
    ZooCase("resize_bicubic_up", lambda: Resize("bicubic", 2.0, False), _img),
    ZooCase("resize_bicubic_down", lambda: Resize("bicubic", 0.5, False), _img),
    ZooCase("resize_nearest_up", lambda: Resize("nearest", 2.0), _img),
    ZooCase("resize_nearest_down", lambda: Resize("nearest", 0.5), _img),
    ZooCase("sdpa_bool_mask", lambda: MaskedSDPA("bool"), _sdpa("bool")),
    ZooCase("sdpa_float_mask", lambda: MaskedSDPA("float"), _sdpa("float")),
    ZooCase("lstm_bi2", lambda: RNN(nn.LSTM), lambda g: (_randn(8, 64, 64, g=g),)),
    ZooCase("gru_bi2", lambda: RNN(nn.GRU), lambda g: (_randn(8, 64, 64, g=g),)),
    ZooCase("mha", lambda: MHA(True), _mha_inputs),
    ZooCase("mha_no_weights", lambda: MHA(False), _mha_inputs),
]
