"""One tensor coercion (``as_tensor``) for every writer: each takes the same inputs (a
torchless tensor, a NumPy array with ml_dtypes bfloat16/float8, a torch tensor of every
dtype, a torch Parameter) and writes the same bytes for equivalent inputs. The expected
values come from torch (its tensors' bytes), never from torchless."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest

import torchless
from torchless.core.errors import TorchlessError

torch = pytest.importorskip("torch", reason="the inputs under test are torch tensors")
ml_dtypes = pytest.importorskip("ml_dtypes")

SAMPLES = Path(__file__).resolve().parents[2] / "samples"

#: torch dtype -> the NumPy dtype holding the same values (ml_dtypes for the ones NumPy lacks)
DTYPES = {
    torch.float32: np.float32,
    torch.float64: np.float64,
    torch.float16: np.float16,
    torch.bfloat16: ml_dtypes.bfloat16,
    torch.float8_e4m3fn: ml_dtypes.float8_e4m3fn,
    torch.float8_e5m2: ml_dtypes.float8_e5m2,
    torch.float8_e4m3fnuz: ml_dtypes.float8_e4m3fnuz,
    torch.float8_e5m2fnuz: ml_dtypes.float8_e5m2fnuz,
    torch.complex64: np.complex64,
    torch.complex128: np.complex128,
    torch.int8: np.int8,
    torch.uint8: np.uint8,
    torch.int16: np.int16,
    torch.uint16: np.uint16,
    torch.int32: np.int32,
    torch.uint32: np.uint32,
    torch.int64: np.int64,
    torch.uint64: np.uint64,
    torch.bool: np.bool_,
}
_UINT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64, 16: torch.float64}


def _torch_value(dt: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(7)
    base = torch.randn(3, 4, generator=g, dtype=torch.float64) * 4
    if dt == torch.bool:
        return base > 0
    if dt.is_complex:
        return torch.complex(base, -base).to(dt)
    if not dt.is_floating_point:
        return base.abs().round().to(dt)
    return base.to(dt)


def _numpy_of(t: torch.Tensor, npdt) -> np.ndarray:
    """The torch tensor's bytes seen as ``npdt`` (torch's own bytes: the oracle)."""
    isz = t.element_size()
    raw = t.contiguous().view(_UINT[isz]).numpy() if isz in _UINT and t.dtype != torch.bool else None
    if t.dtype == torch.bool:
        return t.numpy().copy()
    return raw.view(npdt).copy()


def _inputs(dt: torch.dtype) -> tuple[dict[str, object], bytes]:
    t = _torch_value(dt)
    arr = _numpy_of(t, DTYPES[dt])
    out: dict[str, object] = {
        "torchless": torchless.tensor(arr.copy()),
        "numpy": arr,
        "torch": t,
        "torch-noncontiguous": t.t().contiguous().t(),  # same values, transposed strides
    }
    if dt.is_floating_point or dt.is_complex:
        out["parameter"] = torch.nn.Parameter(t.clone(), requires_grad=False)
    return out, arr.tobytes()


def _written(fmt: str, value: object, root: Path) -> tuple[bytes, bytes] | type:
    """(every written file's bytes, the tensor's bytes read back) or the error type."""
    root.mkdir()
    dst = root / {"pt": "m.pt", "safetensors": "m.safetensors", "npz": "m.npz", "hf": "m.safetensors.index.json"}[fmt]
    try:
        files = torchless.write_tensors([("x", value)], dst, format=fmt)
    except TorchlessError as e:
        assert not os.listdir(root), "a refused write left files"
        return type(e)
    blob = b"".join(Path(f).read_bytes() for f in sorted(files))
    with torchless.open(files[-1]) as art:
        back = art["x"].numpy().tobytes()
    return blob, back


@pytest.mark.parametrize("fmt", ["pt", "safetensors", "npz", "hf"])
@pytest.mark.parametrize("dt", list(DTYPES), ids=lambda d: str(d).split(".")[-1])
def test_tensor_writers_take_every_input_and_write_the_same_bytes(tmp_path, fmt, dt):
    inputs, want = _inputs(dt)
    got = {kind: _written(fmt, v, tmp_path / kind) for kind, v in inputs.items()}
    ref = got["torch"]
    if isinstance(ref, type):  # a dtype the format cannot hold: refused for every input alike
        assert all(g is ref for g in got.values()), got
        return
    assert ref[1] == want, "the values read back are not torch's"
    for kind, g in got.items():
        assert not isinstance(g, type), (kind, g)
        if kind in ("parameter", "torch-noncontiguous") and fmt == "pt":
            assert g[1] == want  # .pt keeps Parameter-ness and strides (as torch.save), same values
            continue
        assert g[0] == ref[0], f"{kind} input wrote other bytes than a torch tensor"


def _edit_inputs(shape: tuple[int, ...]) -> dict[str, object]:
    t = torch.arange(int(np.prod(shape)), dtype=torch.float32).reshape(shape) / 7
    return {
        "torchless": torchless.tensor(t.numpy().copy()),
        "numpy": t.numpy().copy(),
        "torch": t,
        "parameter": torch.nn.Parameter(t.clone(), requires_grad=False),  # requires_grad is recorded (pt2)
    }


def _same_output(write, tmp_path: Path, shape: tuple[int, ...]) -> None:
    outs = {}
    for kind, v in _edit_inputs(shape).items():
        d = tmp_path / kind
        d.mkdir()
        outs[kind] = write(v, d)
    first = outs["torch"]
    assert all(o == first for o in outs.values()), {k: len(o) for k, o in outs.items()}


def test_torchscript_set_weights_takes_every_input_alike(tmp_path):
    from torchless.formats.torchscript.write import save_edited

    def write(v, d):
        src = d / "m.pt"
        shutil.copyfile(SAMPLES / "scripted_module.pt", src)
        save_edited(src, d / "out.pt", tensors={"embed.weight": v})
        return (d / "out.pt").read_bytes()

    _same_output(write, tmp_path, (16, 8))
    got = torch.jit.load(str(tmp_path / "torch" / "out.pt")).state_dict()["embed.weight"]
    assert torch.equal(got, _edit_inputs((16, 8))["torch"])


def test_onnx_set_weights_takes_every_input_alike(tmp_path):
    pytest.importorskip("onnx")
    import onnx
    from onnx import numpy_helper

    from torchless.formats.onnx.write import set_weights

    def write(v, d):
        set_weights(SAMPLES / "mlp.onnx", {"0.weight": v}, d / "out.onnx", external_data=False)
        return (d / "out.onnx").read_bytes()

    _same_output(write, tmp_path, (32, 16))
    m = onnx.load(str(tmp_path / "torch" / "out.onnx"))
    w = {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}["0.weight"]
    np.testing.assert_array_equal(w, _edit_inputs((32, 16))["numpy"])


def test_pt2_save_takes_every_input_alike(tmp_path):
    from torchless.formats.pt2.read import read_pt2
    from torchless.formats.pt2.write import save_pt2

    def write(v, d):
        arc = read_pt2(SAMPLES / "mlp.pt2")
        try:
            prog = arc.program
            prog.state_dict["l1.weight"] = v
            save_pt2(d / "out.pt2", prog)
        finally:
            arc.close()
        return (d / "out.pt2").read_bytes()

    _same_output(write, tmp_path, (32, 16))
    ep = torch.export.load(str(tmp_path / "torch" / "out.pt2"))
    assert torch.equal(ep.state_dict["l1.weight"], _edit_inputs((32, 16))["torch"])


@pytest.mark.parametrize("fmt", ["safetensors", "npz", "hf"])  # .pt stores any object: a list is a value there
def test_a_value_that_is_not_a_tensor_is_refused_alike(tmp_path, fmt):
    dst = tmp_path / {"safetensors": "m.safetensors", "npz": "m.npz", "hf": "m.safetensors.index.json"}[fmt]
    with pytest.raises(torchless.UsageError, match="not a tensor"):
        torchless.write_tensors([("x", [1.0, 2.0])], dst, format=fmt)
    assert not os.listdir(tmp_path)
