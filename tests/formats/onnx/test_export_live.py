"""Live exports with torch 2.13 (the committed fixtures come from the same calls):
the TorchScript exporter always, the dynamo exporter where onnxscript is installed."""

from __future__ import annotations

import warnings

import pytest

import torchless


def _check(onnx, path, base):
    model = onnx.load(str(path), load_external_data=False)
    with torchless.open(path) as art:
        for tp in model.graph.initializer:
            want = onnx.numpy_helper.to_array(tp, str(base))
            got = art[tp.name].numpy()
            assert got.dtype == want.dtype and got.tobytes() == want.tobytes()
        assert art.verify() == []


@pytest.mark.differential
def test_legacy_exporter(torch, onnx, tmp_path):
    m = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.GELU(), torch.nn.LayerNorm(7)).eval()
    p = tmp_path / "legacy.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(m, (torch.randn(2, 5),), str(p), dynamo=False, opset_version=17)
    _check(onnx, p, tmp_path)
    with torchless.open(p) as art:
        for k, v in m.state_dict().items():
            if k in art:
                assert art[k].numpy().tobytes() == v.numpy().tobytes()


@pytest.mark.differential
@pytest.mark.slow
def test_dynamo_exporter_external_data(torch, onnx, tmp_path):
    pytest.importorskip("onnxscript", reason="torch.onnx.export(dynamo=True) needs onnxscript")
    m = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2)).eval()
    p = tmp_path / "m.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(m, (torch.randn(2, 32),), str(p), dynamo=True, external_data=True, verbose=False)
    _check(onnx, p, tmp_path)
    with torchless.open(p) as art:
        assert art.info()["external_data"] == {"m.onnx.data": {"tensors": 1, "bytes": 32 * 32 * 4}}
        for k, v in m.state_dict().items():
            assert art[k].numpy().tobytes() == v.numpy().tobytes()
