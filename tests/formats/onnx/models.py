"""The torch modules behind the committed ONNX fixtures (shared by the generator and the
tests, which rebuild them to compute expected outputs). Importing this needs torch."""

from __future__ import annotations

import torch
from torch import nn


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.l1 = nn.Linear(64, 64)
        self.l2 = nn.Linear(64, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.l2(torch.relu(self.l1(x)))


class CNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 8, 3, groups=2)
        self.head = nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.conv(x))
        y = torch.relu(self.conv2(y))
        return self.head(y.mean(dim=(2, 3)))


class Cond(nn.Module):
    """torch.cond: exported as an If node with two subgraphs."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        def pos(x: torch.Tensor) -> torch.Tensor:
            return self.a(x) * 2.0

        def neg(x: torch.Tensor) -> torch.Tensor:
            return self.b(x) - 1.0

        return torch.cond(x.sum() > 0, pos, neg, (x,))


class Legacy(nn.Module):
    """For the TorchScript exporter: reshapes and constants become Constant nodes."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(16, 6)
        self.proj = nn.Linear(6, 3)
        self.register_buffer("scale", torch.tensor([0.5, 2.0, -1.0]))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        h = self.emb(idx)
        return (self.proj(h) * self.scale).reshape(idx.shape[0], -1)


class Half(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.l1 = nn.Linear(16, 8)
        self.l2 = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.l2(torch.tanh(self.l1(x)))


def build(name: str, seed: int = 0) -> nn.Module:
    """The fixture's module with deterministic weights (``seed`` 0 is what was exported)."""
    torch.manual_seed(seed)
    m = {"mlp_ext": MLP, "cnn": CNN, "cond": Cond, "legacy": Legacy, "half": Half}[name]()
    if name == "half":
        m = m.half()
    return m.eval()


def example_input(name: str) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(1)
    if name == "mlp_ext":
        return (torch.randn(3, 64, generator=g),)
    if name == "cnn":
        return (torch.randn(2, 3, 8, 8, generator=g),)
    if name == "cond":
        return (torch.randn(2, 8, generator=g),)
    if name == "legacy":
        return (torch.randint(0, 16, (2, 5), generator=g),)
    if name == "half":
        return (torch.randn(4, 16, generator=g).half(),)
    raise KeyError(name)


def reference(m: nn.Module, args: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """Eager output; torch.cond is evaluated branch by branch (same math, no compile)."""
    with torch.no_grad():
        if isinstance(m, Cond):
            (x,) = args
            return m.a(x) * 2.0 if bool(x.sum() > 0) else m.b(x) - 1.0
        return m(*args)
