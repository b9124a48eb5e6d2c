"""Exported programs for the .pt2 tests, built once per session (torch.export is slow).

Each case is exported with torch 2.13, saved as ``<case>.pt2`` (training IR, straight from
``torch.export.export``) and ``<case>_dec.pt2`` (after ``run_decompositions()``).
"""

from __future__ import annotations

from pathlib import Path

import pytest


def _models(torch):
    nn = torch.nn
    F = torch.nn.functional

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.l1 = nn.Linear(4, 8)
            self.l2 = nn.Linear(8, 3)
            self.register_buffer("scale", torch.full((3,), 2.0))
            self.register_buffer("shift", torch.arange(3.0), persistent=False)
            self.c = torch.tensor([1.0, -1.0, 0.5])  # lifted tensor constant

        def forward(self, x):
            h = F.gelu(self.l1(x), approximate="tanh")
            return torch.relu(self.l2(h)) * self.scale + self.c + self.shift

    class CNN(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3, padding=1)
            self.bn = nn.BatchNorm2d(4)
            self.fc = nn.Linear(4 * 4 * 4, 5)

        def forward(self, x):
            x = F.max_pool2d(torch.relu(self.bn(self.conv(x))), 2)
            return F.log_softmax(self.fc(torch.flatten(x, 1)), dim=-1)

    class Block(nn.Module):
        def __init__(self, d=8, heads=2):
            super().__init__()
            self.heads = heads
            self.ln1 = nn.LayerNorm(d)
            self.qkv = nn.Linear(d, 3 * d)
            self.proj = nn.Linear(d, d)
            self.ln2 = nn.LayerNorm(d)
            self.ff1 = nn.Linear(d, 2 * d)
            self.ff2 = nn.Linear(2 * d, d)

        def forward(self, x):
            b, t, d = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
            q = q.view(b, t, self.heads, d // self.heads).transpose(1, 2)
            k = k.view(b, t, self.heads, d // self.heads).transpose(1, 2)
            v = v.view(b, t, self.heads, d // self.heads).transpose(1, 2)
            att = torch.softmax(q @ k.transpose(-2, -1) / (d // self.heads) ** 0.5, dim=-1)
            y = (att @ v).transpose(1, 2).reshape(b, t, d)
            x = x + self.proj(y)
            return x + self.ff2(F.gelu(self.ff1(self.ln2(x))))

    class Dyn(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x, y):
            return self.lin(x).sum(0) + y.mean(0)

    class Cond(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x, y):
            return torch.cond(x.shape[0] > 4, lambda x, y: self.lin(x) + y, lambda x, y: x - y, (x, y))

    class While(nn.Module):
        def forward(self, i, x):
            from torch._higher_order_ops.while_loop import while_loop

            return while_loop(lambda i, x: i < 3, lambda i, x: (i + 1, x * 2.0), (i, x))

    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(10, 4)
            self.out = nn.Linear(4, 10, bias=False)
            self.out.weight = self.emb.weight

        def forward(self, ids):
            return self.out(self.emb(ids))

    class Mutate(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("count", torch.zeros(2))
            self.w = nn.Parameter(torch.ones(2))

        def forward(self, x):
            self.count.add_(1)
            return x * self.w + self.count

    class Map(nn.Module):
        def forward(self, xs, y):
            from torch._higher_order_ops.map import map as hop_map

            return hop_map(lambda x, y: x * y + 1, xs, y)

    class Scan(nn.Module):
        def forward(self, init, xs):
            from torch._higher_order_ops.scan import scan

            return scan(lambda c, x: (c + x, c * x), init, xs)

    class SymAdd(nn.Module):
        def forward(self, x):
            # a SymInt where the schema says Tensor: aten.add.Tensor(x, sym_size_int)
            return x + x.shape[0]

    Dim = torch.export.Dim
    d = Dim("d", min=2, max=64)
    return {
        "mlp": (MLP(), (torch.randn(3, 4),), None),
        "cnn": (CNN().eval(), (torch.randn(2, 3, 8, 8),), None),
        "block": (Block(), (torch.randn(2, 5, 8),), None),
        "dynamic": (
            Dyn(),
            (torch.randn(6, 4), torch.randn(5, 4)),
            {"x": {0: Dim("n", min=2, max=32)}, "y": {0: Dim("m", max=100)}},
        ),
        "cond": (Cond(), (torch.randn(6, 4), torch.randn(6, 4)), {"x": {0: d}, "y": {0: d}}),
        "while": (While(), (torch.tensor(0), torch.randn(3)), None),
        "tied": (Tied(), (torch.tensor([[1, 2, 3]]),), None),
        "mutate": (Mutate(), (torch.randn(2),), None),
        "map": (Map(), (torch.randn(3, 4), torch.randn(4)), None),
        "scan": (Scan(), (torch.zeros(4), torch.randn(5, 4)), None),
        "symadd": (SymAdd(), (torch.randn(4, 3),), {"x": {0: Dim("k", min=2, max=64)}}),
    }


CASES = ["mlp", "cnn", "block", "dynamic", "cond", "while", "tied", "mutate", "map", "scan", "symadd"]
VARIANTS = [f"{c}{s}" for c in CASES for s in ("", "_dec")]


@pytest.fixture(scope="session")
def pt2_files(tmp_path_factory, torch):
    """name -> path of a .pt2 written by torch.export.save (both IR levels)."""
    import warnings

    out: dict[str, Path] = {}
    root = tmp_path_factory.mktemp("pt2")
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, (m, args, dyn) in _models(torch).items():
            ep = torch.export.export(m, args, dynamic_shapes=dyn)
            torch.export.save(ep, root / f"{name}.pt2", extra_files={"note.txt": f"case {name}"})
            torch.export.save(ep.run_decompositions(), root / f"{name}_dec.pt2")
            out[name] = root / f"{name}.pt2"
            out[f"{name}_dec"] = root / f"{name}_dec.pt2"
    return out


@pytest.fixture(scope="session")
def torch_loaded(pt2_files, torch):
    """name -> torch.export.load of that file (torch's view, the oracle)."""
    import warnings

    cache: dict[str, object] = {}

    def get(name):
        if name not in cache:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                cache[name] = torch.export.load(pt2_files[name])
        return cache[name]

    return get
