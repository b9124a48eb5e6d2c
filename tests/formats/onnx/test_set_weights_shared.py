"""set-weights on exports whose initializers are shared (issue 31 class 12).

torch's TorchScript exporter (``dynamo=False``) merges initializers of equal values into
one and gives the other names through ``Identity`` nodes: a fresh BatchNorm's
``running_mean`` is ``Identity(bn.bias)`` and its ``running_var`` ``Identity(bn.weight)``,
and two parameters with equal values share one initializer. Setting one name used to
change the others too (onnxruntime then differed from torch), and a full state dict was
refused because the Identity names were not initializers. Oracle: onnxruntime against
the torch module holding the same weights.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from torchless.formats.onnx.write import set_weights


def _module(torch):
    nn = torch.nn

    class M(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 4)
            self.bn = nn.BatchNorm1d(4)  # fresh: running_mean == bias == 0, running_var == weight == 1
            self.fc2 = nn.Linear(4, 4)
            with torch.no_grad():
                self.fc2.bias.copy_(self.fc.bias)  # two parameters with equal values

        def forward(self, x):
            return self.fc2(torch.relu(self.bn(self.fc(x))))

    torch.manual_seed(0)
    return M().eval()


@pytest.fixture(scope="module")
def export(torch, onnx, tmp_path_factory):
    d = tmp_path_factory.mktemp("shared")
    m = _module(torch)
    x = torch.randn(3, 4)
    p = d / "m.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(m, (x,), str(p), dynamo=False, dynamic_axes={"x": {0: "n"}}, input_names=["x"])
    mp = onnx.load(str(p))
    inits = {i.name for i in mp.graph.initializer}
    aliases = {n.output[0]: n.input[0] for n in mp.graph.node if n.op_type == "Identity" and n.input[0] in inits}
    return {"path": p, "module": m, "x": x, "dir": d, "aliases": aliases}


def _run(ort, path, x):
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return sess.run(None, {sess.get_inputs()[0].name: x.numpy()})[0]


def _torch_with(torch, m, weights):
    m2 = type(m)().eval()
    m2.load_state_dict(m.state_dict())
    with torch.no_grad():
        for k, v in weights.items():
            m2.get_parameter(k).copy_(torch.from_numpy(v)) if k in dict(m2.named_parameters()) else m2.get_buffer(k).copy_(
                torch.from_numpy(v)
            )
    return m2


def test_the_exporter_shares_these_initializers(export):
    # the premise: if torch stops merging them, this test says so instead of passing vacuously
    a = export["aliases"]
    assert a.get("bn.running_mean") == "bn.bias" and a.get("bn.running_var") == "bn.weight"
    assert a.get("fc2.bias") == "fc.bias"


@pytest.mark.parametrize("name", ["bn.bias", "bn.weight", "bn.running_mean", "fc.bias", "fc2.bias"])
def test_setting_one_shared_name_changes_only_that_name(export, torch, ort, name):
    """Fails on the old code: setting bn.bias also set running_mean (onnxruntime differed
    from torch), and running_mean / fc2.bias named no initializer."""
    m = export["module"]
    rng = np.random.default_rng(1)
    shape = tuple(m.state_dict()[name].shape)
    val = (rng.standard_normal(shape) + (2.0 if "var" in name else 0.0)).astype(np.float32)
    out = export["dir"] / f"one_{name}.onnx"
    res = set_weights(export["path"], {name: val}, out)
    assert res["replaced"] == [name]
    x = export["x"]
    want = _torch_with(torch, m, {name: val})(x).detach().numpy()
    np.testing.assert_allclose(_run(ort, out, x), want, rtol=1e-5, atol=1e-5)


def test_a_full_state_dict_runs_like_torch(export, torch, ort):
    m = export["module"]
    rng = np.random.default_rng(2)
    sd = {
        k: (np.abs(rng.standard_normal(tuple(v.shape))) + 0.5).astype(np.float32)
        for k, v in m.state_dict().items()
        if v.is_floating_point()
    }
    out = export["dir"] / "full.onnx"
    res = set_weights(export["path"], sd, out)
    assert res["ignored"] == [] and set(res["replaced"]) == set(sd)
    x = export["x"]
    np.testing.assert_allclose(_run(ort, out, x), _torch_with(torch, m, sd)(x).detach().numpy(), rtol=1e-5, atol=1e-5)
    # nothing edited in a group: the sharing stays as exported
    res = set_weights(export["path"], {"fc.weight": sd["fc.weight"]}, export["dir"] / "w.onnx")
    assert "bn.running_mean" in res["kept"]
