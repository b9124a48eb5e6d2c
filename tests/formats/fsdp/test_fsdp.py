"""FSDP2 per-rank ``torch.save`` state dicts (DTensors) consolidated without torch.

Oracle: real per-rank state dicts of a ``fully_shard``-ed model written on CPU by 2 gloo
ranks (``make_fsdp.py``), and FSDP's own full state dict
(``get_model_state_dict(model, StateDictOptions(full_state_dict=True))``): the same
names in the same order, dtypes, shapes and bytes.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import torchless
from torchless.cli.main import main
from torchless.core.errors import TorchlessError

torch = pytest.importorskip("torch", reason="torch writes the rank files and is the oracle")

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="module")
def fsdp(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict]:
    base = tmp_path_factory.mktemp("fsdp")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    r = subprocess.run(
        [sys.executable, os.path.join(HERE, "make_fsdp.py"), str(base)], env=env, capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return str(base / "ranks"), torch.load(base / "full.pt", weights_only=True)


def _same(got: dict, want: dict) -> None:
    assert list(got) == list(want)
    for k, w in want.items():
        g = got[k]
        assert g.dtype.torch_name == str(w.dtype), k
        assert tuple(g.shape) == tuple(w.shape), k
        b = w.detach().reshape(-1).contiguous().view(torch.uint8).numpy()
        assert np.ascontiguousarray(g.numpy()).view(np.uint8).tobytes() == b.tobytes(), k


def test_consolidated_is_fsdps_full_state_dict(fsdp: tuple) -> None:
    folder, want = fsdp
    with torchless.open(folder) as art:
        assert art.format == "fsdp"
        _same(dict(art.tensors()), want)
        info = art.info()
    assert info["world_size"] == 2 and info["rank_files"] == ["model_rank0.pt", "model_rank1.pt"]
    assert info["bytes_by_dtype"]["bfloat16"] == 16  # the bf16 layer stays bf16
    buffers = ("running_mean", "running_var", "num_batches_tracked")
    assert info["parameters"] == sum(v.numel() for k, v in want.items() if not k.endswith(buffers))


def test_convert(fsdp: tuple, tmp_path) -> None:
    from safetensors.torch import load_file

    folder, want = fsdp
    out = tmp_path / "m.safetensors"
    assert main(["convert", folder, str(out)]) == 0
    got = load_file(str(out))
    assert list(got) == list(want)
    for k, v in got.items():
        assert v.dtype == want[k].dtype and torch.equal(v, want[k]), k


def _copy(fsdp: tuple, tmp_path) -> str:
    dst = tmp_path / "ranks"
    shutil.copytree(fsdp[0], dst)
    return str(dst)


def _edit(path: str, edit) -> None:
    sd = torch.load(path, weights_only=False)
    edit(sd)
    torch.save(sd, path)


def _bad(folder: str, tmp_path, match: str | None, culprit: str) -> None:
    with pytest.raises(TorchlessError, match=match) as ei, torchless.open(folder, format="fsdp") as art:
        dict(art.tensors())
    assert culprit in str(ei.value)
    out = tmp_path / "o.safetensors"
    assert main(["convert", "--format", "fsdp", folder, str(out)]) == 2
    assert not out.exists()


def test_missing_rank(fsdp: tuple, tmp_path) -> None:
    folder = _copy(fsdp, tmp_path)
    os.remove(os.path.join(folder, "model_rank1.pt"))
    _bad(folder, tmp_path, "mesh of 2 ranks but 1 rank files", "model_rank0.pt")


def test_truncated_rank(fsdp: tuple, tmp_path) -> None:
    folder = _copy(fsdp, tmp_path)
    victim = os.path.join(folder, "model_rank1.pt")
    with open(victim, "r+b") as f:
        f.truncate(os.path.getsize(victim) // 2)
    _bad(folder, tmp_path, None, "model_rank1.pt")


def test_mixed_world_sizes(fsdp: tuple, tmp_path) -> None:
    folder = _copy(fsdp, tmp_path)

    def four(sd: dict) -> None:  # rank 1's mesh: 4 ranks (a file of another run)
        for v in sd.values():
            if hasattr(v, "_spec"):
                v._spec.mesh._rank_map = torch.arange(4, dtype=torch.int32)

    _edit(os.path.join(folder, "model_rank1.pt"), four)
    _bad(folder, tmp_path, "mesh of 4 ranks but 2", "model_rank1.pt")


def test_inconsistent_shapes(fsdp: tuple, tmp_path) -> None:
    folder = _copy(fsdp, tmp_path)

    def short(sd: dict) -> None:  # rank 1 holds 2 of 0.weight's 7 rows, not 3
        object.__setattr__(sd["0.weight"], "_local_tensor", torch.zeros(2, 5))

    _edit(os.path.join(folder, "model_rank1.pt"), short)
    _bad(folder, tmp_path, "does not have the shape", "model_rank1.pt")


def test_weights_only_refuses_other_globals(fsdp: tuple, tmp_path) -> None:
    """The DTensor classes are inert placeholders; anything else is still refused."""
    from torchless.core.errors import UnsafeGlobalError

    folder = _copy(fsdp, tmp_path)
    _edit(os.path.join(folder, "model_rank0.pt"), lambda sd: sd.__setitem__("evil", os.getcwd))
    with pytest.raises(UnsafeGlobalError):
        torchless.open(folder)


def test_scan_reads_rank_files_as_pt(fsdp: tuple, capsys) -> None:
    """scan reads a rank file as the .pt it is: the DTensor classes pickle.load would
    import are findings, never CLEAN (the fsdp reader's placeholders do not carry over)."""
    folder, _ = fsdp
    assert main(["scan", os.path.join(folder, "model_rank0.pt")]) == 1
    out = capsys.readouterr().out
    assert "SUSPICIOUS (torch-zip" in out and "unknown-global" in out
    assert "torch.distributed.tensor.DTensor" in out


def test_info_and_ls_cli(fsdp: tuple, capsys) -> None:
    folder, want = fsdp
    assert main(["info", folder]) == 0
    out = capsys.readouterr().out
    assert "fsdp" in out and "world_size: 2" in out
    assert main(["ls", folder]) == 0
    out = capsys.readouterr().out
    assert all(k in out for k in want)
