"""set-weights on dynamo exports whose initializers are shared directly (issue 31).

torch's dynamo exporter (``dynamo=True``) merges initializers of equal values into one
and points every consumer at it, with no ``Identity``: the other parameter's name is
gone from the graph. Each node keeps the FX node it came from
(``pkg.torch.onnx.fx_node``), whose text names the parameters it read (``%p_b_weight``);
from that the edited name gets its own initializer and only its consumers are rewired.
Where the name cannot be recovered the write is refused naming the weight. Oracle:
onnxruntime against the torch module holding the same weights.
"""

from __future__ import annotations

import contextlib
import io
import warnings

import numpy as np
import pytest

from torchless.core.errors import UsageError
from torchless.formats.onnx.write import set_weights

torch = pytest.importorskip("torch", reason="torch exports the models and is the oracle")


class Twins(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(3, 3)
        self.b = torch.nn.Linear(3, 3)
        self.b.load_state_dict(self.a.state_dict())  # equal values: merged by the exporter
        self.ln = torch.nn.LayerNorm(3)
        self.ln2 = torch.nn.LayerNorm(3)

    def forward(self, x):
        return self.ln2(self.b(self.ln(self.a(x))))


class Leaves(torch.nn.Module):  # merged parameters whose last name parts differ
    def __init__(self) -> None:
        super().__init__()
        self.u = torch.nn.Parameter(torch.ones(3))
        self.v = torch.nn.Parameter(torch.ones(3))

    def forward(self, x):
        return x * self.u + self.v


def _export(m, path) -> None:
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        torch.onnx.export(m, (torch.randn(2, 3),), str(path), dynamo=True)


@pytest.fixture(scope="module")
def twins(onnx, tmp_path_factory):
    p = tmp_path_factory.mktemp("direct") / "twins.onnx"
    torch.manual_seed(0)
    m = Twins().eval()
    _export(m, p)
    return m, p


def _run(ort, path, x):
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return sess.run(None, {sess.get_inputs()[0].name: x.numpy()})[0]


def _random_weights(m, seed: int, names=None) -> dict[str, np.ndarray]:
    g = torch.Generator().manual_seed(seed)
    return {k: torch.randn(v.shape, generator=g).numpy() for k, v in m.state_dict().items() if names is None or k in names}


def _torch_with(m, weights):
    m2 = type(m)().eval()
    m2.load_state_dict({**m.state_dict(), **{k: torch.from_numpy(v) for k, v in weights.items()}})
    return m2


def test_the_exporter_shares_directly(twins, onnx):
    # the premise: b reads a's initializers with no Identity, so "b.weight" is in no graph name
    _m, p = twins
    mp = onnx.load(str(p))
    inits = {i.name for i in mp.graph.initializer}
    assert "b.weight" not in inits and "a.weight" in inits
    assert not any(n.op_type == "Identity" for n in mp.graph.node)
    assert sum("a.weight" in n.input for n in mp.graph.node) == 2


@pytest.mark.parametrize("names", [None, ("b.weight",), ("a.bias", "ln2.weight")], ids=["all", "b.weight", "mixed"])
def test_each_name_gets_its_own_weight(twins, ort, tmp_path, names):
    m, p = twins
    w = _random_weights(m, 1, names)
    out = tmp_path / "new.onnx"
    report = set_weights(str(p), w, str(out))
    assert sorted(report["replaced"]) == sorted(w)
    x = torch.randn(2, 3, generator=torch.Generator().manual_seed(2))
    want = _torch_with(m, w)(x).detach().numpy()
    np.testing.assert_allclose(_run(ort, out, x), want, rtol=1e-5, atol=1e-5)


def test_unrecoverable_name_refused(onnx, ort, tmp_path):
    m = Leaves().eval()
    p = tmp_path / "leaves.onnx"
    _export(m, p)
    assert {i.name for i in onnx.load(str(p)).graph.initializer} == {"u"}  # the premise
    for allow in (False, True):
        with pytest.raises(UsageError, match="'v'.*cannot be recovered"):
            set_weights(str(p), _random_weights(m, 3), str(tmp_path / "new.onnx"), allow_missing=allow)
    # only u given: v (still equal to the old u) keeps reading the merged initializer, so
    # the result would differ from torch; refused too, naming v
    with pytest.raises(UsageError, match="'v'"):
        set_weights(str(p), {**_random_weights(m, 3, ("u",)), "v": np.ones(3, np.float32)}, str(tmp_path / "n2.onnx"))
