"""convert --dtype/--include/--exclude/--strip-prefix/--add-prefix (issue 36 item 7),
differential against torch: torch.load the source, filter and rename by hand, apply
``.to(dtype)`` in torch, and compare with the converted file bit for bit."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import torchless
from torchless.cli.main import main

pytestmark = pytest.mark.differential
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def _specials(torch, dtype):
    """Values where rounding matters: ties, overflow, subnormals, NaN, infinities, signed zeros."""
    f32 = np.array(
        [
            0.0,
            -0.0,
            np.inf,
            -np.inf,
            np.nan,
            -np.nan,
            1.0,
            1 + 2**-8,
            1 + 3 * 2**-8,
            1 + 2**-8 + 2**-20,
            65504.0,
            65520.0,
            3.3895e38,
            3.4028235e38,
            1e-40,
            -1e-45,
            2**-14,
            2**-24,
            2**-25,
            3 * 2**-26,
            0.1,
            -7.3,
        ],
        dtype=np.float32,
    )
    rng = np.random.default_rng(0)
    x = np.concatenate([f32, rng.standard_normal(300).astype(np.float32) * 1000])
    t = torch.from_numpy(x).to(dtype)
    if dtype == torch.float64:  # doubles whose rounding differs directly and through float32
        t = torch.cat([t, torch.tensor([1 + 2**-8 + 2**-30, 1 + 2**-11 + 2**-40, -(1 + 2**-11 + 2**-40)], dtype=torch.float64)])
    return t


def _same_bits(torch, a, b, name, *, nan_bits=False):
    """Bit for bit; NaNs: at the same places (their bits only with ``nan_bits``: torch's
    NaN bits depend on the source dtype and the CPU loop, see torchless.formats.transform)."""
    assert a.dtype == b.dtype and a.shape == b.shape, (name, a.dtype, b.dtype)
    if a.dtype.is_floating_point:
        width = {2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
        x, y = a.contiguous().view(width), b.contiguous().view(width)
        na, nb = torch.isnan(a), torch.isnan(b)
        assert torch.equal(na, nb), name
        if not nan_bits:
            x, y = x[~na.contiguous()], y[~nb.contiguous()]
        assert torch.equal(x, y), name
    else:
        assert torch.equal(a, b), name


@pytest.fixture
def src_pt(tmp_path, torch):
    sd = {
        "model.embed.weight": _specials(torch, torch.float32)[:320].reshape(5, -1)[:, :60],
        "model.layers.0.w": _specials(torch, torch.float64),
        "model.layers.0.bias": _specials(torch, torch.float16),
        "model.layers.1.w": _specials(torch, torch.bfloat16),
        "model.layers.1.steps": torch.arange(-5, 300, dtype=torch.int64),
        "model.mask": torch.tensor([True, False, True]),
        "lm_head.weight": _specials(torch, torch.float32)[::2],  # a strided view
    }
    p = tmp_path / "src.pt"
    torch.save({**sd, "epoch": 3}, p)
    return p


def test_pt_to_safetensors_as_a_user_types_it(src_pt, tmp_path, torch):
    from safetensors.torch import load_file

    env = {**os.environ, "PYTHONPATH": os.path.join(ROOT, "src")}
    argv = ["convert", "src.pt", "out.safetensors", "--dtype", "bfloat16", "--include", "model.*", "--include", "lm_head.*"]
    argv += ["--exclude", "*.bias", "--strip-prefix", "model.", "--add-prefix", "net."]
    r = subprocess.run(
        [sys.executable, "-m", "torchless", *argv], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr
    got = load_file(tmp_path / "out.safetensors")
    ref = torch.load(src_pt, weights_only=True)
    names = {  # the documented order, by hand: include, exclude, strip, add
        "model.embed.weight": "net.embed.weight",
        "model.layers.0.w": "net.layers.0.w",
        "model.layers.1.w": "net.layers.1.w",
        "model.layers.1.steps": "net.layers.1.steps",
        "model.mask": "net.mask",
        "lm_head.weight": "net.lm_head.weight",
    }
    assert sorted(got) == sorted(names.values())
    for old, new in names.items():
        want = ref[old].to(torch.bfloat16) if ref[old].is_floating_point() else ref[old]
        _same_bits(torch, got[new], want, old, nan_bits=ref[old].dtype == torch.float32)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
def test_safetensors_to_pt_every_dtype_api(src_pt, tmp_path, torch, dtype):
    from safetensors.torch import save_file

    ref = {k: v.contiguous() for k, v in torch.load(src_pt, weights_only=True).items() if k != "epoch"}
    st = tmp_path / "in.safetensors"
    save_file(ref, st)
    out = tmp_path / f"{dtype}.pt"
    res = torchless.convert(st, out, dtype=dtype, dtype_all=True)
    assert res["tensors"] == len(ref) and res["object_kept"] is False
    got = torch.load(out, weights_only=True)
    tdt = getattr(torch, dtype)
    assert sorted(got) == sorted(ref)
    for k, v in ref.items():
        _same_bits(torch, got[k], v.to(tdt), k)


def test_hf_sharded_sets(src_pt, tmp_path, torch):
    from safetensors.torch import load_file

    ref = {k: v for k, v in torch.load(src_pt, weights_only=True).items() if k != "epoch"}
    hf = tmp_path / "hf" / "model.safetensors"
    assert main(["convert", str(src_pt), str(hf), "--max-shard-size", "1KB"]) == 0
    index = str(hf) + ".index.json"
    # a sharded set in, one file out
    assert main(["convert", index, str(tmp_path / "one.safetensors"), "--dtype", "float16", "--exclude", "*.steps"]) == 0
    got = load_file(tmp_path / "one.safetensors")
    assert sorted(got) == sorted(k for k in ref if not k.endswith(".steps"))
    for k in got:
        _same_bits(torch, got[k], ref[k].to(torch.float16) if ref[k].is_floating_point() else ref[k], k)
    # a sharded set out, cast on the way
    out = tmp_path / "hf2" / "model.safetensors"
    assert (
        main(["convert", str(src_pt), str(out), "--max-shard-size", "1KB", "--dtype", "bfloat16", "--strip-prefix", "model."])
        == 0
    )
    shards = sorted(out.parent.glob("model-*.safetensors"))
    assert len(shards) > 1
    got = {k: v for s in shards for k, v in load_file(s).items()}
    assert sorted(got) == sorted(k.removeprefix("model.") for k in ref)
    for k, v in ref.items():
        _same_bits(torch, got[k.removeprefix("model.")], v.to(torch.bfloat16) if v.is_floating_point() else v, k)


def test_duplicate_names_and_bad_options(tmp_path, capsys):
    p = tmp_path / "d.safetensors"
    torchless.save({"model.w": np.ones(2, np.float32), "w": np.zeros(2, np.float32)}, p)
    assert main(["convert", str(p), str(tmp_path / "o.safetensors"), "--strip-prefix", "model."]) == 2
    err = capsys.readouterr().err
    assert "'model.w'" in err and "'w'" in err and not (tmp_path / "o.safetensors").exists()
    assert main(["convert", str(p), str(tmp_path / "o.safetensors"), "--dtype", "int8"]) == 2
    assert "bfloat16" in capsys.readouterr().err
    assert main(["convert", str(p), str(tmp_path / "o.safetensors"), "--include", "nothing*"]) == 2
    assert "no tensor" in capsys.readouterr().err
    with pytest.raises(torchless.UsageError):
        torchless.convert(p, tmp_path / "o.pt", dtype_all=True)


def test_cast_is_lazy_and_kept_nowhere(tmp_path):
    """Streaming: a cast tensor's bytes are made when read and not kept after."""
    from torchless.formats.transform import Transform

    p = tmp_path / "w.safetensors"
    vals = (np.arange(1000) % 256).astype(np.float32)  # exact in bfloat16
    torchless.save({"a": vals}, p)
    with torchless.open(p) as art:
        [(name, t)] = Transform.make(dtype="bfloat16").apply(art.tensors())
        assert t.dtype.name == "bfloat16" and t.nbytes == 2000
        assert t.storage._data is None
        np.testing.assert_array_equal(t.numpy().astype(np.float32), vals)
        assert t.storage._data is None  # nothing held after the read
