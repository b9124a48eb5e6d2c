"""Open-world differential fuzzing of weight edits against the real loaders (issue 31).

Each case is a small random module (a stack of Linear, Conv1d, BatchNorm1d, LayerNorm,
Embedding and ReLU layers; sometimes a tied output weight, a layer used twice, a
parameter shared by two layers, a buffer read in ``forward``, two layers with equal
initial weights so the exporters merge their initializers), exported by
``torch.jit.trace`` / ``torch.jit.script`` (edited with torchless's TorchScript
``set_weights``), ``torch.export`` (edited through ``read_pt2`` / ``save_pt2``) and
``torch.onnx.export`` (TorchScript exporter; the dynamo exporter in some cases; edited
with ONNX ``set_weights``). New random weights (all names, or a random subset; tied
names together) go into the artifact, the real loader runs it (``torch.jit.load``,
``torch.export.load``, onnxruntime) and its output must equal the torch module holding
the same weights (``load_state_dict``) on a random input. A refusal that names why (the
exporter folded or merged what cannot be recovered; for ONNX, weights the TorchScript
exporter stored folded or transposed under ``onnx::`` names, refused as naming no
initializer) is counted, not a failure.

Used by ``tests/formats/test_edits_differential_fuzz.py`` (seeded, bounded) and
``scripts/fuzz_edits.py`` (long runs); ``python tests/edits_fuzz.py SEED`` replays one case.
"""

from __future__ import annotations

import contextlib
import copy
import io
import os
import sys
import tempfile
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from torchless.core.errors import NotFoundError, UsageError

TARGETS = ("trace", "script", "export", "onnx")


@dataclass
class Stats:
    cases: int = 0
    edits: int = 0
    refusals: int = 0
    not_found: int = 0
    by_target: dict[str, int] = field(default_factory=dict)
    features: set[str] = field(default_factory=set)


def build(seed: int) -> tuple[Any, Any, set[str]]:
    """A random module in eval mode, an input for it, and the features it has."""
    import torch
    from torch import nn

    rng = np.random.default_rng(seed)
    torch.manual_seed(seed)
    feats: set[str] = set()
    kind = ["dense", "conv", "embed"][int(rng.integers(3))]
    layers: list[nn.Module] = []
    d = int(rng.integers(2, 6))
    if kind == "embed":
        vocab = int(rng.integers(3, 8))
        layers.append(nn.Embedding(vocab, d))
        x: Any = torch.from_numpy(rng.integers(0, vocab, size=(2, 3)))
    elif kind == "conv":
        x = torch.from_numpy(rng.standard_normal((2, d, 5)).astype(np.float32))
    else:
        x = torch.from_numpy(rng.standard_normal((3, d)).astype(np.float32))
    for _ in range(int(rng.integers(1, 5))):
        c = ["linear", "norm", "relu", "twin"][int(rng.integers(4))]
        if kind == "conv":
            if c == "norm":
                bn = nn.BatchNorm1d(d)
                bn.running_mean.copy_(torch.randn(d))
                bn.running_var.copy_(torch.rand(d) + 0.5)
                layers.append(bn)
            elif c == "relu":
                layers.append(nn.ReLU())
            else:
                d2 = int(rng.integers(2, 6))
                layers.append(nn.Conv1d(d, d2, kernel_size=int(rng.integers(1, 3)), padding="same"))
                d = d2
            continue
        if c == "linear":
            d2 = int(rng.integers(2, 6))
            layers.append(nn.Linear(d, d2, bias=bool(rng.random() < 0.8)))
            d = d2
        elif c == "norm":
            layers.append(nn.LayerNorm(d) if kind == "embed" or rng.random() < 0.5 else _bn(torch, d))
        elif c == "relu":
            layers.append(nn.ReLU())
        else:  # two layers with equal initial weights: exporters merge their initializers
            a, b = nn.Linear(d, d), nn.Linear(d, d)
            b.load_state_dict(a.state_dict())
            layers += [a, nn.ReLU(), b]
            feats.add("equal-init")
    if not any(True for layer in layers for _ in layer.parameters()):
        layers.append(nn.Conv1d(d, d, 1) if kind == "conv" else nn.Linear(d, d))
    m = Stack(layers)
    r = rng.random()
    if r < 0.2 and kind == "embed":
        m.head = nn.Linear(d, layers[0].num_embeddings, bias=False)  # type: ignore[operator]
        if d == layers[0].embedding_dim:
            m.head.weight = layers[0].weight  # tied weights
            feats.add("tied")
    elif r < 0.35:
        lin = [m2 for m2 in layers if isinstance(m2, nn.Linear) and m2.in_features == m2.out_features == d]
        if lin:
            m.again = lin[0]  # a layer used twice
            feats.add("reused")
    elif r < 0.5:
        lin = [m2 for m2 in layers if isinstance(m2, nn.Linear) and m2.in_features == m2.out_features == d]
        if lin:
            extra = nn.Linear(d, d)
            extra.weight = lin[0].weight  # one parameter in two layers
            m.extra = extra
            feats.add("shared-param")
    if rng.random() < 0.4:
        m.register_buffer("scale", torch.rand(d, 1) + 0.5 if kind == "conv" else torch.rand(d) + 0.5)
        feats.add("buffer")
    feats.add(kind)
    return m.eval(), x, feats


def _bn(torch: Any, d: int) -> Any:
    bn = torch.nn.BatchNorm1d(d)
    bn.running_mean.copy_(torch.randn(d))
    bn.running_var.copy_(torch.rand(d) + 0.5)
    return bn


def _stack_class() -> Any:
    import torch
    from torch import nn

    class _Stack(nn.Module):
        def __init__(self, layers: list[Any]) -> None:
            super().__init__()
            self.layers = nn.ModuleList(layers)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for layer in self.layers:
                x = layer(x)
            if hasattr(self, "again"):
                x = self.again(x)
            if hasattr(self, "extra"):
                x = self.extra(x)
            if hasattr(self, "scale"):
                x = x * self.scale
            if hasattr(self, "head"):
                x = self.head(x)
            return x

    return _Stack


class _Lazy:
    cls: Any = None


def Stack(layers: list[Any]) -> Any:  # noqa: N802 - a class made on first use (torch imported lazily)
    if _Lazy.cls is None:
        _Lazy.cls = _stack_class()
    return _Lazy.cls(layers)


def new_weights(m: Any, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Random new values for all names or a random subset; names of one tensor (tied,
    shared) get one array, together."""
    groups: dict[int, list[str]] = {}
    sd = m.state_dict(keep_vars=True)
    for k, v in sd.items():
        if v.dtype.is_floating_point:
            groups.setdefault(id(v), []).append(k)
    out: dict[str, np.ndarray] = {}
    subset = rng.random() < 0.4
    for names in groups.values():
        if subset and rng.random() < 0.5:
            continue
        t = sd[names[0]]
        a = rng.standard_normal(tuple(t.shape)).astype(np.float32)
        if names[0].endswith("running_var") or names[0].endswith("scale"):
            a = np.abs(a) + 0.5
        for k in names:
            out[k] = a
    if not out:  # at least one tensor: all of its names
        names = next(iter(groups.values()))
        a = rng.standard_normal(tuple(sd[names[0]].shape)).astype(np.float32)
        out.update({k: a for k in names})
    return out


def _oracle(m: Any, w: dict[str, np.ndarray], x: Any) -> np.ndarray:
    import torch

    m2 = copy.deepcopy(m)
    m2.load_state_dict({k: torch.from_numpy(v) for k, v in w.items()}, strict=False)
    with torch.no_grad():
        return m2(x).numpy()


def run_case(seed: int, stats: Stats | None = None, tmp: str | None = None) -> None:
    """One random module through one exporter and torchless's edit; AssertionError on a mismatch."""
    import torch

    rng = np.random.default_rng(seed + 7)
    m, x, feats = build(seed)
    target = TARGETS[int(rng.integers(len(TARGETS)))]
    w = new_weights(m, rng)
    want = _oracle(m, w, x)
    own = tmp is None
    d = tempfile.mkdtemp() if own else tmp
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            try:
                got = _edit_and_run(target, m, x, w, d, rng)
            except NotFoundError:
                # the TorchScript ONNX exporter stored a parameter folded or transposed
                # under an ``onnx::`` name (docs/onnx.md): refused, naming the weights
                if target != "onnx":
                    raise
                if stats is not None:
                    stats.not_found += 1
                return
            except UsageError as e:
                if "would compute something else" not in str(e) and "cannot be recovered" not in str(e):
                    raise
                if stats is not None:
                    stats.refusals += 1
                return
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, err_msg=f"{target} {sorted(feats)} {sorted(w)}")
        if stats is not None:
            stats.cases += 1
            stats.edits += len(w)
            stats.by_target[target] = stats.by_target.get(target, 0) + 1
            stats.features |= feats
    finally:
        if own:
            import shutil

            shutil.rmtree(d, ignore_errors=True)
    del torch


def _edit_and_run(target: str, m: Any, x: Any, w: dict[str, np.ndarray], d: str, rng: np.random.Generator) -> np.ndarray:
    import torch

    src, out = os.path.join(d, "src"), os.path.join(d, "out")
    if target in ("trace", "script"):
        from torchless.formats.torchscript.write import set_weights

        sm = torch.jit.trace(m, (x,)) if target == "trace" else torch.jit.script(m)
        torch.jit.save(sm, src)
        set_weights(src, w, out)
        with torch.no_grad():
            return torch.jit.load(out)(x).numpy()
    if target == "export":
        from torchless.core.tensor import Tensor
        from torchless.formats.pt2 import read_pt2, save_pt2

        torch.export.save(torch.export.export(m, (x,)), src)
        with read_pt2(src) as arc:
            prog = arc.program
            for k, v in w.items():
                old = prog.state_dict.get(k)
                assert old is not None, f"{k} not in the program's state dict"
                t = Tensor.from_numpy(v)
                t.is_parameter, t.requires_grad = old.is_parameter, old.requires_grad
                prog.state_dict[k] = t
            save_pt2(out, prog)
        with torch.no_grad():
            return torch.export.load(out).module()(x).numpy()
    import onnxruntime as ort

    from torchless.formats.onnx.write import set_weights as onnx_set

    dynamo = bool(rng.random() < 0.25)
    with _torchlib_registry_once():
        torch.onnx.export(m, (x,), src, dynamo=dynamo, input_names=["x"])
    onnx_set(src, w, out)
    sess = ort.InferenceSession(out, providers=["CPUExecutionProvider"])
    return sess.run(None, {sess.get_inputs()[0].name: x.numpy()})[0]


_REGISTRIES: dict[Any, Any] = {}


@contextlib.contextmanager
def _torchlib_registry_once() -> Any:
    """The dynamo ONNX exporter rebuilds its registry of ONNX functions from onnxscript's
    torchlib on every export (~2 s, most of a dynamo case). While this is active it is
    built once per process and opset, and each export gets its own copy (the table of
    functions copied, so nothing an export registers reaches the next); the exported
    model is the same. Only around the harness's own export call: other tests see torch
    unchanged."""
    from torch.onnx._internal.exporter import _registration

    cls = _registration.ONNXRegistry
    original = cls.__dict__["from_torchlib"]

    def from_torchlib(klass: Any, *args: Any, **kw: Any) -> Any:
        key = (klass, args, tuple(sorted(kw.items())))
        built = _REGISTRIES.get(key)
        if built is None:
            built = _REGISTRIES[key] = original.__func__(klass, *args, **kw)
        reg = klass()
        reg.__dict__.update(built.__dict__)
        reg.functions = {k: list(v) for k, v in built.functions.items()}
        return reg

    cls.from_torchlib = classmethod(from_torchlib)
    try:
        yield
    finally:
        cls.from_torchlib = original


if __name__ == "__main__":  # pragma: no cover - replay one seed
    st = Stats()
    run_case(int(sys.argv[1]), st)
    print(st)
