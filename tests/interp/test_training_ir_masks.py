"""Programs as ``torch.export.export`` emits them by default (the training IR) from modules
that build attention masks the way Hugging Face transformers does (``a & b``, ``torch.diff``,
``type_as``, ``repeat_interleave``, ``baddbmm``, ``min(other)``): saved as ``.pt2``, run by
torchless at two sequence lengths of one dynamic dim, compared with torch (float32 rtol
1e-4 / atol 1e-5, bools exactly). And ``torchless run --inputs`` with inputs named after the
forward's parameters."""

from __future__ import annotations

import numpy as np
import pytest

import torchless
from torchless.cli.main import main

torch = pytest.importorskip("torch", reason="torch exports the programs and is the oracle")
nn = torch.nn

#: operators the mask program's training IR must hold (else the test tests something else)
MASK_OPS = {
    "aten.__and__.Tensor",
    "aten.__or__.Tensor",
    "aten.__xor__.Tensor",
    "aten.diff.default",
    "aten.type_as.default",
    "aten.baddbmm.default",
    "aten.min.other",
    "aten.repeat_interleave.self_int",
}


class MaskModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x, attention_mask):
        s = x.shape[1]
        causal = torch.ones(s, s, dtype=torch.bool).tril()
        pad = attention_mask.bool()
        mask = causal[None] & pad[:, None, :]
        mask = mask | (pad[:, :, None] ^ pad[:, None, :]).logical_not() & causal[None]
        pos = torch.diff(attention_mask.cumsum(-1), dim=-1, prepend=torch.zeros_like(attention_mask[:, :1]))
        h = self.proj(x).type_as(x)
        scores = torch.baddbmm(torch.zeros(1, s, s), h, h.transpose(1, 2), alpha=0.25)
        scores = torch.min(scores, torch.full_like(scores, 4.0))
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
        v = torch.repeat_interleave(h[..., :4], 2, dim=-1)
        out = scores.softmax(-1) @ v + pos[..., None].type_as(h)
        return out, mask


def _inputs(batch: int, seq: int, seed: int) -> tuple:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, seq, 8, generator=g)
    lengths = torch.randint(1, seq + 1, (batch,), generator=g)
    am = (torch.arange(seq)[None, :] < lengths[:, None]).long()
    return x, am


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    torch.manual_seed(0)
    m = MaskModel().eval()
    s = torch.export.Dim("s", min=2, max=64)
    ep = torch.export.export(m, _inputs(2, 5, 0), dynamic_shapes={"x": {1: s}, "attention_mask": {1: s}})
    path = tmp_path_factory.mktemp("masks") / "mask.pt2"
    torch.export.save(ep, path)
    return path, m


def test_training_ir_records_the_mask_ops(saved):
    path, _m = saved
    assert set(torchless.load(path).op_histogram()) >= MASK_OPS


@pytest.mark.parametrize("seq", [5, 17])
def test_mask_program_matches_torch(saved, seq):
    path, m = saved
    ours = torchless.load(path).module()
    x, am = _inputs(2, seq, seq)
    got = ours(x.numpy(), am.numpy())
    with torch.no_grad():
        want = m(x, am)
    np.testing.assert_allclose(got[0], want[0].numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(got[1], want[1].numpy())
    # the same inputs by the forward's names, as module() callers pass them
    again = ours(attention_mask=am.numpy(), x=x.numpy())
    np.testing.assert_array_equal(again[0], got[0])
    again = ours(x.numpy(), attention_mask=am.numpy())
    np.testing.assert_array_equal(again[0], got[0])
    with pytest.raises(torchless.UsageError, match="'x' before it is missing"):
        ours(attention_mask=am.numpy())


def test_cli_run_takes_inputs_named_after_forward(saved, tmp_path, capsys):
    path, m = saved
    x, am = _inputs(2, 9, 3)
    with torch.no_grad():
        want = m(x, am)[0].numpy()
    for i, names in enumerate((("x", "attention_mask"), ("arg0", "attention_mask"), ("arg0", "arg1"))):
        inp = tmp_path / f"in{i}.npz"
        np.savez(inp, **{names[0]: x.numpy(), names[1]: am.numpy()})
        out = tmp_path / f"out{i}.npz"
        assert main(["run", str(path), "--inputs", str(inp), "-o", str(out)]) == 0, names
        capsys.readouterr()
        with np.load(out) as z:
            np.testing.assert_allclose(z["out[0]"], want, rtol=1e-4, atol=1e-5)
    np.savez(tmp_path / "bad.npz", x=x.numpy(), attn_mask=am.numpy())
    assert main(["run", str(path), "--inputs", str(tmp_path / "bad.npz")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "'attn_mask'" in err and "one of x, attention_mask, or arg0" in err and "mask.pt2" in err
    np.savez(tmp_path / "twice.npz", arg0=x.numpy(), x=x.numpy(), attention_mask=am.numpy())
    assert main(["run", str(path), "--inputs", str(tmp_path / "twice.npz")]) == 2
    assert "both by position" in capsys.readouterr().err
