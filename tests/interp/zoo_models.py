"""The model zoo of the interpreter's tests and benchmark (issue #16): small torch modules with
example inputs, each meant to be exported with ``torch.export.export``.

Shared by ``tests/interp/test_zoo.py`` (outputs against torch in both IRs) and
``bench/bench_interp.py`` (interpreter against torch eager). Imports torch: only tests and
benchmarks use it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F


class MLP(nn.Module):
    def __init__(self, d: int = 64, h: int = 256, depth: int = 4) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for i in range(depth):
            layers += [nn.Linear(d if i == 0 else h, h), nn.GELU() if i % 2 else nn.ReLU()]
        layers.append(nn.Linear(h, 10))
        self.net = nn.Sequential(*layers)

    def forward(self, x):
        return self.net(x)


class CNNBN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(3, 16, 3, padding=1)
        self.b1 = nn.BatchNorm2d(16)
        self.c2 = nn.Conv2d(16, 32, 3, stride=2, padding=1)
        self.b2 = nn.BatchNorm2d(32)
        self.fc = nn.Linear(32, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.b1(self.c1(x))), 2)
        x = F.relu(self.b2(self.c2(x)))
        x = F.adaptive_avg_pool2d(x, 1).flatten(1)
        return self.fc(x)


class BasicBlock(nn.Module):
    """ResNet's basic block with a strided 1x1 downsample shortcut."""

    def __init__(self, cin: int = 16, cout: int = 32, stride: int = 2) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.down(x))


class MobileBlock(nn.Module):
    """MobileNetV3-style inverted residual: expand, depthwise, squeeze-excite, project."""

    def __init__(self, c: int = 16, e: int = 64) -> None:
        super().__init__()
        self.expand = nn.Conv2d(c, e, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(e)
        self.dw = nn.Conv2d(e, e, 3, padding=1, groups=e, bias=False)
        self.bn2 = nn.BatchNorm2d(e)
        self.se1 = nn.Conv2d(e, e // 4, 1)
        self.se2 = nn.Conv2d(e // 4, e, 1)
        self.proj = nn.Conv2d(e, c, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(c)

    def forward(self, x):
        y = F.hardswish(self.bn1(self.expand(x)))
        y = F.hardswish(self.bn2(self.dw(y)))
        s = F.adaptive_avg_pool2d(y, 1)
        s = F.hardsigmoid(self.se2(F.relu(self.se1(s))))
        y = self.bn3(self.proj(y * s))
        return x + y


class Encoder(nn.Module):
    def __init__(self, d: int = 64, heads: int = 4) -> None:
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(d, heads, dim_feedforward=128, dropout=0.1, batch_first=True)

    def forward(self, x):
        return self.layer(x)


class RMSNorm(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.norm = nn.RMSNorm(d, eps=1e-6)

    def forward(self, x):
        return self.norm(x)


def rotary(x, cos, sin):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


class Decoder(nn.Module):
    """A causal decoder block: RMSNorm, rotary embeddings, SDPA, SwiGLU MLP."""

    def __init__(self, d: int = 64, heads: int = 4, max_len: int = 64) -> None:
        super().__init__()
        self.heads = heads
        self.n1 = RMSNorm(d)
        self.n2 = RMSNorm(d)
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.o = nn.Linear(d, d, bias=False)
        self.w1 = nn.Linear(d, 2 * d, bias=False)
        self.w3 = nn.Linear(d, 2 * d, bias=False)
        self.w2 = nn.Linear(2 * d, d, bias=False)
        hd = d // heads
        inv = 1.0 / (10000 ** (torch.arange(0, hd, 2).float() / hd))
        t = torch.arange(max_len).float()[:, None] * inv[None]
        emb = torch.cat([t, t], dim=-1)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(self.n1(x)).split(d, dim=-1)
        q, k, v = (t.view(b, s, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))
        cos, sin = self.cos[:s], self.sin[:s]
        q, k = rotary(q, cos, sin), rotary(k, cos, sin)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(a.transpose(1, 2).reshape(b, s, d))
        h = self.n2(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class LSTMModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.rnn = nn.LSTM(16, 32, num_layers=2, batch_first=True)
        self.head = nn.Linear(32, 4)

    def forward(self, x):
        y, (h, c) = self.rnn(x)
        return self.head(y[:, -1]), h, c


class GRUModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.rnn = nn.GRU(16, 32, num_layers=1, batch_first=True, bidirectional=True)

    def forward(self, x):
        y, h = self.rnn(x)
        return y, h


class ViTBlock(nn.Module):
    def __init__(self, d: int = 64, patch: int = 4, img: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, d, patch, stride=patch)
        n = (img // patch) ** 2
        self.cls = nn.Parameter(torch.randn(1, 1, d) * 0.02)
        self.pos = nn.Parameter(torch.randn(1, n + 1, d) * 0.02)
        self.ln1 = nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(approximate="tanh"), nn.Linear(4 * d, d))

    def forward(self, img):
        x = self.patch(img).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
        h = self.ln1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class UNetBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.down = nn.Sequential(nn.Conv2d(4, 16, 3, padding=1), nn.GroupNorm(4, 16), nn.SiLU())
        self.pool = nn.AvgPool2d(2)
        self.mid = nn.Conv2d(16, 32, 3, padding=1)
        self.up = nn.ConvTranspose2d(32, 16, 2, stride=2)
        self.out = nn.Conv2d(32, 4, 3, padding=1)

    def forward(self, x):
        d = self.down(x)
        m = F.relu(self.mid(self.pool(d)))
        u = self.up(m) + F.interpolate(m[:, :16], scale_factor=2.0, mode="bilinear", align_corners=False)
        u2 = F.interpolate(u, size=(d.shape[2], d.shape[3]), mode="nearest")
        return self.out(torch.cat([u2, d], dim=1))


class EmbedCE(nn.Module):
    def __init__(self, vocab: int = 100, d: int = 32) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d, padding_idx=0)
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)

    def forward(self, tokens, targets):
        logits = self.head(self.ln(self.emb(tokens)))
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-100, label_smoothing=0.1)


class IndexOps(nn.Module):
    def forward(self, x, idx, mask):
        v, i = torch.topk(x, 3, dim=-1)
        s, si = torch.sort(x, dim=-1, descending=True)
        am = torch.argmax(x, dim=1)
        cs = torch.cumsum(x, dim=1)
        g = torch.gather(x, 1, idx)
        sc = torch.zeros_like(x).scatter(1, idx, g)
        ip = x.clone()
        ip[mask] = 0.0
        w = torch.where(x > 0, x, -x)
        mf = x.masked_fill(mask, -1.0)
        return v, i, s[:, :2], si, am, cs, sc, ip, w, mf


class Dynamic(nn.Module):
    """Dynamic batch and sequence dims: a linear, a softmax over the sequence, a reshape."""

    def __init__(self, d: int = 32) -> None:
        super().__init__()
        self.lin = nn.Linear(d, d)
        self.ln = nn.LayerNorm(d)

    def forward(self, x):
        b, s, d = x.shape
        h = self.ln(self.lin(x))
        w = torch.softmax(h.mean(-1), dim=-1)
        return (h * w[..., None]).sum(1), h.reshape(b * s, d)


class BNTrain(nn.Module):
    """BatchNorm in train mode: the export records the running-stat updates as buffer mutations."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)
        self.bn = nn.BatchNorm2d(8)
        self.bn1d = nn.BatchNorm1d(8, momentum=0.3)

    def forward(self, x):
        y = self.bn(self.conv(x))
        return self.bn1d(y.mean((2, 3)))


@dataclass
class ZooCase:
    name: str
    make: Any  # () -> nn.Module
    inputs: Any  # (torch.Generator) -> tuple of tensors
    train: bool = False
    dynamic: Any = None  # dynamic_shapes for torch.export.export
    rtol: float = 1e-4
    atol: float = 1e-5
    bench_inputs: Any = None  # larger inputs for the benchmark
    extra: dict[str, Any] = field(default_factory=dict)


def _randn(*shape, g):
    return torch.randn(*shape, generator=g)


def _idx_inputs(g):
    x = torch.randn(4, 8, generator=g)
    idx = torch.randint(0, 8, (4, 3), generator=g)
    return x, idx, x > 0.5


def _tokens(g, b=4, s=12, vocab=100):
    t = torch.randint(0, vocab, (b, s), generator=g)
    y = torch.randint(0, vocab, (b, s), generator=g)
    y[0, :3] = -100
    return t, y


ZOO: list[ZooCase] = [
    ZooCase("mlp", MLP, lambda g: (_randn(8, 64, g=g),), bench_inputs=lambda g: (_randn(256, 64, g=g),)),
    ZooCase("cnn_bn", CNNBN, lambda g: (_randn(2, 3, 16, 16, g=g),), bench_inputs=lambda g: (_randn(16, 3, 32, 32, g=g),)),
    ZooCase(
        "resnet_block", BasicBlock, lambda g: (_randn(2, 16, 16, 16, g=g),), bench_inputs=lambda g: (_randn(16, 16, 32, 32, g=g),)
    ),
    ZooCase(
        "mobilenet_block",
        MobileBlock,
        lambda g: (_randn(2, 16, 12, 12, g=g),),
        bench_inputs=lambda g: (_randn(16, 16, 32, 32, g=g),),
    ),
    ZooCase(
        "transformer_encoder", Encoder, lambda g: (_randn(2, 10, 64, g=g),), bench_inputs=lambda g: (_randn(16, 64, 64, g=g),)
    ),
    ZooCase("causal_decoder", Decoder, lambda g: (_randn(2, 12, 64, g=g),), bench_inputs=lambda g: (_randn(16, 64, 64, g=g),)),
    ZooCase("lstm", LSTMModel, lambda g: (_randn(3, 7, 16, g=g),), bench_inputs=lambda g: (_randn(32, 32, 16, g=g),)),
    ZooCase("gru", GRUModel, lambda g: (_randn(3, 7, 16, g=g),), bench_inputs=lambda g: (_randn(32, 32, 16, g=g),)),
    ZooCase("vit_block", ViTBlock, lambda g: (_randn(2, 3, 32, 32, g=g),), bench_inputs=lambda g: (_randn(16, 3, 32, 32, g=g),)),
    ZooCase("unet_block", UNetBlock, lambda g: (_randn(2, 4, 16, 16, g=g),), bench_inputs=lambda g: (_randn(8, 4, 32, 32, g=g),)),
    ZooCase("embed_ce", EmbedCE, _tokens, bench_inputs=lambda g: _tokens(g, 32, 64)),
    ZooCase("index_ops", IndexOps, _idx_inputs),
    ZooCase("dynamic", Dynamic, lambda g: (_randn(3, 5, 32, g=g),), dynamic="batch_seq"),
    ZooCase("bn_train", BNTrain, lambda g: (_randn(4, 3, 10, 10, g=g),), train=True),
]


def dynamic_shapes(case: ZooCase):
    if case.dynamic == "batch_seq":
        b, s = torch.export.Dim("batch", min=1, max=64), torch.export.Dim("seq", min=2, max=128)
        return ({0: b, 1: s},)
    return None


def build(case: ZooCase, seed: int = 0):
    """(module, example inputs) with deterministic weights."""
    torch.manual_seed(seed)
    m = case.make()
    if isinstance(m, nn.Module):
        for mod in m.modules():
            if isinstance(mod, nn.modules.batchnorm._BatchNorm):  # non-trivial running stats
                mod.running_mean.uniform_(-0.5, 0.5)
                mod.running_var.uniform_(0.5, 1.5)
    m.train(case.train)
    g = torch.Generator().manual_seed(seed + 1)
    return m, tuple(case.inputs(g))


_ = math
