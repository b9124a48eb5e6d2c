"""Megatron-LM legacy checkpoints merged over TP x PP ranks, against the full model."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

import torchless
from torchless.cli.main import main
from torchless.core.errors import FormatError, NotFoundError

torch = pytest.importorskip("torch", reason="torch writes the rank files and is the oracle")
st_torch = pytest.importorskip("safetensors.torch", reason="safetensors reads the converted file")

from . import layout  # noqa: E402  (imports torch)

LAYERS = 4


def _save(tmp_path: Path, tp: int, pp: int, swiglu: bool = True) -> tuple[Path, dict]:
    sd = layout.gpt_state(layers=LAYERS, swiglu=swiglu)
    root = tmp_path / f"run_tp{tp}_pp{pp}"
    layout.write(str(root), sd, tp=tp, pp=pp, layers=LAYERS, swiglu=swiglu)
    return root, sd


@pytest.mark.parametrize(("tp", "pp", "swiglu"), [(1, 1, False), (2, 1, True), (2, 2, True), (4, 2, False)])
def test_merged_equals_full_model(tmp_path: Path, tp: int, pp: int, swiglu: bool) -> None:
    root, sd = _save(tmp_path, tp, pp, swiglu)
    assert torchless.detect(root) == "megatron"
    with torchless.open(root) as art:
        info = art.info()
        got = {n: t.numpy().copy() for n, t in art.tensors()}
        dtypes = {n: t.dtype.name for n, t in art.tensors()}
    assert (info["tensor_parallel"], info["pipeline_parallel"], info["iteration"]) == (tp, pp, "iter_0000100")
    assert sorted(got) == sorted(sd)
    for name, want in sd.items():
        assert dtypes[name] == str(want.dtype).removeprefix("torch."), name
        assert tuple(got[name].shape) == tuple(want.shape), name
        assert got[name].tobytes() == want.reshape(-1).view(torch.uint8).numpy().tobytes(), name


def test_iteration_folder_and_convert(tmp_path: Path) -> None:
    root, sd = _save(tmp_path, 2, 2)
    assert torchless.detect(root / "iter_0000100") == "megatron"
    out = tmp_path / "merged.safetensors"
    assert main(["convert", str(root), str(out)]) == 0
    back = st_torch.load_file(str(out))
    assert sorted(back) == sorted(sd) and all(torch.equal(back[k], v) for k, v in sd.items())


def test_missing_rank_names_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root, _sd = _save(tmp_path, 2, 2)
    shutil.rmtree(root / "iter_0000100" / "mp_rank_01_000")
    with pytest.raises(FormatError) as e:
        torchless.open(root)
    assert "mp_rank_01_000" in str(e.value)
    out = tmp_path / "merged.safetensors"
    assert main(["convert", str(root), str(out)]) == 2
    assert not out.exists()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "mp_rank_01_000" in err[0]


def test_mixed_world_sizes_refused(tmp_path: Path) -> None:
    root, _sd = _save(tmp_path, 2, 1)
    other, _ = _save(tmp_path / "other", 4, 1)
    victim = root / "iter_0000100" / "mp_rank_01" / "model_optim_rng.pt"
    shutil.copyfile(other / "iter_0000100" / "mp_rank_01" / "model_optim_rng.pt", victim)
    with pytest.raises(FormatError) as e:
        torchless.open(root)
    assert "mp_rank_01" in str(e.value) and "tensor_model_parallel_size" in str(e.value)


def test_bad_tracker(tmp_path: Path) -> None:
    root, _sd = _save(tmp_path, 1, 1)
    (root / "latest_checkpointed_iteration.txt").write_text("200")
    with pytest.raises(NotFoundError) as e:
        torchless.open(root)
    assert "iter_0000200" in str(e.value)
    (root / "latest_checkpointed_iteration.txt").write_text("../../etc")
    with pytest.raises(FormatError):
        torchless.open(root)
    assert os.path.isdir(root / "iter_0000100")
