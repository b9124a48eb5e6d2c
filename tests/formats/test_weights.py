"""``set-weights`` matches weights to a model's tensors by one rule for ONNX and TorchScript
(:func:`torchless.formats.weights.match_weights`)."""

from __future__ import annotations

import os

import numpy as np
import pytest

import torchless
from torchless.core.errors import NotFoundError, UsageError
from torchless.formats.weights import match_weights

SAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "samples")

# --- the rule ---------------------------------------------------------------------------


def test_strip_prefix_and_ignored_names():
    m = match_weights([("model.a", 1), ("b", 2), ("model.zz", 3)], {"a", "b", "c"}, strip_prefix="model.", allow_missing=True)
    assert m.matched == [("a", 1), ("b", 2)]
    assert m.ignored == ["zz"]  # the name after stripping, as it was looked up


def test_missing_names_are_refused_and_listed():
    with pytest.raises(NotFoundError, match="1 weights name no initializer") as ei:
        match_weights([("a", 1), ("nope", 2)], {"a"}, what="initializer", path="m.onnx")
    assert "nope" in str(ei.value) and "m.onnx" in str(ei.value)


def test_two_weights_for_one_tensor_are_refused():
    with pytest.raises(UsageError, match="two weights map to tensor 'a'"):
        match_weights([("model.a", 1), ("a", 2)], {"a"}, strip_prefix="model.")


def test_nothing_matched_is_refused_even_when_missing_names_are_allowed():
    with pytest.raises(UsageError, match="no tensor was replaced"):
        match_weights([("x", 1)], {"a"}, allow_missing=True)
    assert match_weights([], {"a"}).matched == []  # no weights at all: nothing asked, nothing refused


def test_the_format_check_runs_before_the_missing_refusal():
    seen = []

    def check(m):
        seen.append((list(m.matched), list(m.ignored), dict(m.shapes)))
        raise UsageError("the format's own reason")

    with pytest.raises(UsageError, match="own reason"):
        match_weights([("a", np.zeros((2, 3))), ("b", np.zeros(4))], {"a"}, check=check)
    assert seen[0][1] == ["b"] and seen[0][2] == {"a": (2, 3), "b": (4,)}


# --- the same behaviour through both formats --------------------------------------------


def _set_weights(kind):
    if kind == "onnx":
        pytest.importorskip("onnx", reason="ONNX models need the onnx package")
        from torchless.formats.onnx.write import set_weights

        return os.path.join(SAMPLES, "mlp.onnx"), set_weights
    from torchless.formats.torchscript.write import set_weights

    return os.path.join(SAMPLES, "scripted_module.pt"), set_weights


def _a_float_tensor(model):
    with torchless.open(model, weights_only=False) as art:
        for name, t in art.tensors():
            if t.dtype.name == "float32" and t.numel() > 1:
                return name, t.numpy().copy()
    raise AssertionError("no float32 tensor")


@pytest.mark.parametrize("kind", ["onnx", "torchscript"])
def test_set_weights_same_rule_for_both_formats(kind, tmp_path):
    model, set_weights = _set_weights(kind)
    name, old = _a_float_tensor(model)
    new = (old + 1).astype(np.float32)
    out = str(tmp_path / ("out.onnx" if kind == "onnx" else "out.pt"))
    weights = {f"model.{name}": new, "model.nope": np.zeros(3, np.float32)}

    with pytest.raises(NotFoundError, match="nope"):
        set_weights(model, weights, out, strip_prefix="model.")
    assert not os.path.exists(out)
    with pytest.raises(UsageError, match="two weights map to"):
        set_weights(model, {f"model.{name}": new, name: new}, out, strip_prefix="model.")
    with pytest.raises(UsageError, match="was replaced"):
        set_weights(model, {"nope": new}, out, allow_missing=True)

    res = set_weights(model, weights, out, strip_prefix="model.", allow_missing=True)
    assert res["ignored"] == ["nope"] and name in res["replaced"]
    with torchless.open(out, weights_only=False) as art:
        np.testing.assert_array_equal(dict(art.tensors())[name].numpy(), new)
