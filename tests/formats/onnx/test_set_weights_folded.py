"""set-weights refuses exports whose initializers no longer hold the module's parameters
(BatchNorm folded into Conv under the conv's name, renamed ``val_N`` initializers), and
refuses to replace nothing; an unoptimized export takes the same weights and runs equal
to torch."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from torchless.cli.main import main
from torchless.core.errors import UsageError
from torchless.formats.onnx.write import set_weights


def _module(torch):
    nn = torch.nn

    class ConvBN(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(3, 4, 3)
            self.bn1 = nn.BatchNorm2d(4)
            self.fc = nn.Linear(4, 2)

        def forward(self, x):
            return self.fc(torch.relu(self.bn1(self.conv1(x))).mean(dim=(2, 3)))

    torch.manual_seed(0)
    m = ConvBN().eval()
    with torch.no_grad():
        m.bn1.running_mean.uniform_(-1, 1)
        m.bn1.running_var.uniform_(0.5, 2.0)
        m.bn1.weight.uniform_(0.5, 1.5)
    return m


@pytest.fixture(scope="module")
def exports(torch, onnx, tmp_path_factory):
    pytest.importorskip("onnxscript", reason="torch.onnx.export(dynamo=True) needs onnxscript")
    d = tmp_path_factory.mktemp("convbn")
    m = _module(torch)
    x = torch.randn(1, 3, 8, 8)
    out = {}
    for optimize in (True, False):
        p = d / f"convbn_{'opt' if optimize else 'plain'}.onnx"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(m, (x,), str(p), dynamo=True, optimize=optimize, verbose=False)
        out[optimize] = p
    # fine-tuned weights: every parameter and BatchNorm statistic changed
    with torch.no_grad():
        for t in m.state_dict().values():
            if t.is_floating_point():
                t.add_(0.25)
    sd = {k: v for k, v in m.state_dict().items() if k != "bn1.num_batches_tracked"}
    wp = d / "finetuned.pt"
    torch.save(sd, wp)
    return {"opt": out[True], "plain": out[False], "weights": wp, "module": m, "x": x, "dir": d}


def test_folded_batchnorm_is_refused(exports, capsys):
    with pytest.raises(UsageError, match="FuseBatchNormIntoConv|folded"):
        set_weights(exports["opt"], exports["weights"], exports["dir"] / "bad.onnx", allow_missing=True)
    assert not (exports["dir"] / "bad.onnx").exists()
    code = main(
        [
            "onnx",
            "set-weights",
            str(exports["opt"]),
            str(exports["weights"]),
            "-o",
            str(exports["dir"] / "bad.onnx"),
            "--allow-missing",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and "conv1.weight" in err and "--allow-missing" not in err.split(";")[-1]


def test_folded_batchnorm_without_metadata_is_refused(exports, onnx):
    """Exports stripped of node metadata: the graph itself shows the fold."""
    mp = onnx.load(str(exports["opt"]))
    for n in mp.graph.node:
        del n.metadata_props[:]
    p = exports["dir"] / "stripped.onnx"
    onnx.save(mp, str(p))
    with pytest.raises(UsageError, match="BatchNorm 'bn1'"):
        set_weights(p, exports["weights"], exports["dir"] / "bad2.onnx", allow_missing=True)


def test_renamed_initializer_is_refused(exports, onnx):
    mp = onnx.load(str(exports["plain"]))
    for t in mp.graph.initializer:
        if t.name == "fc.weight":
            t.name = "val_7"
    for n in mp.graph.node:
        for i, name in enumerate(n.input):
            if name == "fc.weight":
                n.input[i] = "val_7"
    p = exports["dir"] / "renamed.onnx"
    onnx.save(mp, str(p))
    with pytest.raises(UsageError, match="val_7"):
        set_weights(p, exports["weights"], exports["dir"] / "bad3.onnx", allow_missing=True)


def test_nothing_replaced_is_an_error(exports, torch, capsys):
    wp = exports["dir"] / "unrelated.pt"
    torch.save({"other.weight": torch.zeros(3)}, wp)
    with pytest.raises(UsageError, match="no initializer was replaced"):
        set_weights(exports["plain"], wp, exports["dir"] / "none.onnx", allow_missing=True)
    code = main(
        ["onnx", "set-weights", str(exports["plain"]), str(wp), "-o", str(exports["dir"] / "none.onnx"), "--allow-missing"]
    )
    assert code == 2 and "no initializer was replaced" in capsys.readouterr().err


def test_unoptimized_export_takes_the_weights_and_matches_torch(exports, torch, ort):
    out = exports["dir"] / "new.onnx"
    res = set_weights(exports["plain"], exports["weights"], out)
    assert set(res["replaced"]) >= {"conv1.weight", "bn1.running_mean", "fc.weight"}
    sess = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    x = exports["x"]
    (got,) = sess.run(None, {sess.get_inputs()[0].name: x.numpy()})
    with torch.no_grad():
        want = exports["module"](x).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
