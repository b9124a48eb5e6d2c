"""TorchScript modules for the differential tests (built with torch, saved to tmp dirs).

Importing this module imports torch; only conftest's fixtures call it, after
``pytest.importorskip("torch")``.
"""

from __future__ import annotations

import enum
import os
import warnings
from typing import NamedTuple

import torch
import torch.nn as nn

warnings.filterwarnings("ignore", category=DeprecationWarning)
warnings.filterwarnings("ignore", category=UserWarning)


class Sub(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 2)
        self.nobias = nn.Linear(2, 2, bias=False)
        self.register_buffer("b16", torch.tensor([1.5, -2.0, 3.25, 0.0], dtype=torch.bfloat16))
        self.register_buffer("h16", torch.tensor([[1.0, 2.0]], dtype=torch.float16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.nobias(self.lin(x))


class Big(nn.Module):
    """Submodules, buffers of several dtypes, non-parameter tensors, containers."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.sub = Sub()
        self.sub2 = Sub()
        self.p64 = nn.Parameter(torch.randn(2, 2, dtype=torch.float64))
        self.shared = self.sub.lin.weight  # the same Parameter under two names
        self.register_buffer("buf", torch.arange(3))
        self.register_buffer("i8", torch.tensor([-1, 2, -3], dtype=torch.int8))
        self.register_buffer("flags", torch.tensor([True, False]))
        self.register_buffer("cplx", torch.tensor([1 + 2j, 3 - 1j], dtype=torch.complex64))
        self.register_buffer("strided", torch.arange(12.0).reshape(3, 4)[:, 1::2])
        self.register_buffer("tmp", torch.ones(2), persistent=False)
        self.t = torch.ones(2) * 7  # a tensor attribute, not a parameter or buffer
        self.u16 = torch.tensor([1, 2, 60000], dtype=torch.uint16)
        self.u32 = torch.tensor([1, 4000000000], dtype=torch.uint32)
        self.f8 = torch.tensor([0.5, -1.0], dtype=torch.float8_e4m3fn)
        self.tl: list[torch.Tensor] = [torch.zeros(1), torch.ones(2)]
        self.td: dict[str, torch.Tensor] = {"a": torch.full((3,), 2.0)}
        self.tt: tuple[torch.Tensor, int] = (torch.ones(1), 3)
        self.il: list[int] = [1, 2, 3]
        self.fl: list[float] = [1.5, 2.5]
        self.bl: list[bool] = [True, False]
        self.sl: list[str] = ["a", "b"]
        self.dil: dict[int, list[int]] = {1: [2, 3]}
        self.opt: torch.Tensor | None = None
        self.scale = 2.5
        self.name = "hello"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.sub(x) + self.sub2(x)
        if bool(x.sum() > 0):
            y = y * self.scale
        else:
            y = y - self.t.sum()
        return self.helper(y) + self.td["a"][0] + self.tl[1].sum()

    @torch.jit.export
    def helper(self, y: torch.Tensor) -> torch.Tensor:
        w = self.sub.lin.weight
        if bool(y.sum() > 0):
            y = y + w.sum()
        return torch.relu(y) + self.p64.sum().float()

    @torch.jit.export
    def other(self, z: torch.Tensor) -> torch.Tensor:
        w = self.sub.lin.weight
        b = self.sub.lin.bias
        return torch.nn.functional.gelu(z @ w.t() + b)


class WithConst(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(1)
        self.lin = nn.Linear(3, 3)
        self.act = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.lin(x)) + torch.arange(3.0) * 2


class Quant(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        from torch.ao.nn.quantized import Linear

        self.q = Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.q(x)


class Color(enum.Enum):
    RED = 1
    GREEN = 2


class Pair(NamedTuple):
    a: torch.Tensor
    b: int


@torch.jit.script
class Holder:
    def __init__(self, t: torch.Tensor) -> None:
        self.t = t
        self.n = 3


class WithState(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.w

    @torch.jit.export
    def __getstate__(self) -> tuple[torch.Tensor, bool]:
        return (self.w, self.training)

    @torch.jit.export
    def __setstate__(self, state: tuple[torch.Tensor, bool]) -> None:
        self.w = state[0]
        self.training = state[1]


class Exotic(nn.Module):
    """Enum, NamedTuple, TorchScript class and a module restored by __setstate__."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(2, 2)
        self.color = Color.GREEN
        self.pair = Pair(torch.ones(2), 5)
        self.h = Holder(torch.full((2,), 3.0))
        self.s = WithState()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.color == Color.GREEN:
            x = x + 1
        return self.s(self.lin(x)) + self.pair[0] + self.h.t


def build_all(d: str) -> dict[str, str]:
    """Write every fixture archive into ``d``; returns name -> path."""
    out: dict[str, str] = {}
    p = os.path.join(d, "scripted.pt")
    m = torch.jit.script(Big())
    torch.jit.save(m, p, _extra_files={"meta.json": b'{"v": 1}', "notes.txt": b"hello"})
    out["scripted"] = p

    p = os.path.join(d, "traced.pt")
    tr = torch.jit.trace(WithConst(), torch.randn(2, 3))
    torch.jit.save(tr, p)
    out["traced"] = p
    # what torch printed into the archive (torch.jit.load re-prints after recompiling)
    torch.save({name: mod.code for name, mod in tr.named_modules()}, os.path.join(d, "traced_code.pt"))

    p = os.path.join(d, "quantized.pt")
    torch.jit.save(torch.jit.script(Quant()), p)
    out["quantized"] = p

    p = os.path.join(d, "exotic.pt")
    torch.jit.save(torch.jit.script(Exotic()), p)
    out["exotic"] = p

    p = os.path.join(d, "lite.ptl")
    m._save_for_lite_interpreter(p)
    out["lite"] = p
    p = os.path.join(d, "lite_const.ptl")
    tr._save_for_lite_interpreter(p)
    out["lite_const"] = p
    # flatbuffer mobile modules (PTMF) of the same modules, and their pickled .ptl twins
    for base, mod in (
        ("scripted", m),
        ("traced", tr),
        ("quantized", torch.jit.script(Quant())),
        ("exotic", torch.jit.script(Exotic())),
    ):
        q = os.path.join(d, f"{base}.ff")
        torch.jit.save_jit_module_to_flatbuffer(mod, q, _extra_files={"meta.json": b'{"v": 2}'} if base == "scripted" else None)
        out[f"ff_{base}"] = q
        q = os.path.join(d, f"{base}_twin.ptl")
        mod._save_for_lite_interpreter(q)
        out[f"ff_{base}_twin"] = q
    from torch.jit.mobile import _backport_for_mobile

    for v in (4, 5, 6, 7):
        for base in ("lite", "lite_const"):
            q = os.path.join(d, f"{base}_v{v}.ptl")
            assert _backport_for_mobile(out[base], q, v)
            out[f"{base}_v{v}"] = q
    return out
