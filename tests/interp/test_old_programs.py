"""ExportedPrograms written by torch 2.5, 2.6 and 2.7 (schemas 7.3, 8.2, 8.7) run in the
interpreter with the outputs torch gives.

Three oracles, each used where it exists: the output the writing torch recorded for the
example input (``samples/old_pt2/<version>/expected.json``, from ``torch.export.load`` +
``.module()`` in that torch; the archive's own sample inputs are that input); torch 2.13
loading the same archive (it refuses schema 7.3, and torch 2.6's ``cond`` archive fails
its deserializer); and the model's ``forward`` (``samples/make_old_pt2.py``) run in eager
torch 2.13 with the archive's own weights, on more inputs than the recorded one (other
batch sizes, both branches of ``cond``).
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest

import torchless
from torchless.core.errors import UsageError

torch = pytest.importorskip("torch", reason="torch is the oracle")

ROOT = Path(__file__).resolve().parents[2] / "samples" / "old_pt2"
VERSIONS = ("2.5", "2.6", "2.7")
NAMES = ("mlp", "dynamic", "cond")


def _expected(version: str) -> dict:
    return json.loads((ROOT / version / "expected.json").read_text())


def _array(rec: dict) -> np.ndarray:
    assert rec["values"] is not None, "the recorded tensor is too large to hold its values"
    return np.asarray(rec["values"], dtype=rec["dtype"]).reshape(rec["shape"])


def _weights(prog) -> dict:
    return {k: torch.from_numpy(np.array(v.numpy())) for k, v in prog.state_dict.items()}


def _eager(name: str, w: dict, x: torch.Tensor) -> torch.Tensor:
    """The models of samples/make_old_pt2.py, written out in torch with the archive's weights."""
    if name == "mlp":
        h = torch.relu(x @ w["l1.weight"].T + w["l1.bias"])
        return (h @ w["l2.weight"].T + w["l2.bias"]) * w["scale"]
    if name == "dynamic":
        return (x @ w["w"]).softmax(-1) + x.shape[0]
    if name == "cond":
        return (x @ w["w"]).sin() if x.sum() > 0 else (x.cos() @ w["w"]) * 2
    raise AssertionError(name)


def _torch_module(path: Path):
    """torch 2.13's module of an old archive, or None where torch 2.13 cannot load it."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return torch.export.load(str(path)).module()
        except Exception:  # noqa: BLE001 - schema 7.3 is refused; 2.6's cond fails to deserialize
            return None


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("name", NAMES)
def test_old_program_runs_like_torch(version: str, name: str) -> None:
    e = _expected(version)[name]
    assert "error" not in e, "every old fixture holds all three models"
    path = ROOT / version / f"{name}.pt2"
    prog = torchless.load(str(path))
    assert ".".join(map(str, prog.schema_version)) == e["version_records"][next(iter(e["version_records"]))]
    m = prog.module()
    x0 = _array(e["example_input"][0])
    # 1. the output the writing torch recorded, for its example input, which the archive
    # also stores as its sample inputs
    np.testing.assert_allclose(m(x0), _array(e["example_output"]), rtol=1e-5, atol=1e-6)
    args, kwargs = prog.sample_inputs
    assert not kwargs and len(args) == 1 and np.array_equal(np.asarray(args[0].numpy()), x0)
    np.testing.assert_allclose(m(*args), _array(e["example_output"]), rtol=1e-5, atol=1e-6)
    # 2. torch 2.13 on the same archive, where it loads it
    tm = _torch_module(path)
    if version == "2.5" or (version, name) == ("2.6", "cond"):
        assert tm is None  # when torch 2.13 starts reading these, compare with it here too
    else:
        assert tm is not None
    # 3. more inputs, against torch 2.13's module or the eager forward with the archive's weights
    w = _weights(prog)
    torch.manual_seed(1)
    rows = (2, 5, 64) if name == "dynamic" else (x0.shape[0],)
    for n in rows:
        for sign in (1.0, -1.0):
            x = torch.randn(n, x0.shape[1]).abs() * sign
            want = _eager(name, w, x)
            if tm is not None:
                np.testing.assert_allclose(tm(x).detach().numpy(), want.numpy(), rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(m(x.numpy()), want.numpy(), rtol=1e-5, atol=1e-5)
    if name == "dynamic":  # the range the program was exported for, [2, 64], is enforced
        with pytest.raises(UsageError, match=r"out of the range.*<= 64"):
            m(np.zeros((65, x0.shape[1]), np.float32))
        if tm is not None:
            with pytest.raises(AssertionError, match="<= 64"):
                tm(torch.zeros(65, x0.shape[1]))
