"""Training-framework checkpoints read torch-free, checked against the frameworks' loaders."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import torchless
from torchless.cli.main import main
from torchless.core.errors import TorchlessError

from . import frameworks

torch = pytest.importorskip("torch", reason="torch is the oracle")
st_torch = pytest.importorskip("safetensors.torch", reason="safetensors is the oracle")


def _made(maker: Any, root: Path, module: str) -> Path:
    pytest.importorskip(module, reason=f"{module} makes the fixture")
    return Path(maker(str(root)))


@pytest.fixture(scope="session")
def hf_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _made(frameworks.make_hf_trainer, tmp_path_factory.mktemp("hf_trainer"), "transformers")


@pytest.fixture(scope="session")
def accel_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _made(frameworks.make_accelerate, tmp_path_factory.mktemp("accelerate"), "accelerate")


@pytest.fixture(scope="session")
def pl_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _made(frameworks.make_lightning, tmp_path_factory.mktemp("lightning"), "lightning")


def _read(art: Any) -> dict[str, tuple[str, np.ndarray]]:
    """Every tensor of an open artifact as (dtype name, a copy of its values)."""
    return {n: (t.dtype.name, np.array(t.numpy(), copy=True)) for n, t in art.tensors()}


def _same(got: tuple[str, np.ndarray], want: Any) -> None:
    """Same dtype, shape and every byte (torch tensors on the right)."""
    dtype, a = got
    b = want.detach().contiguous()
    assert str(b.dtype).removeprefix("torch.") == dtype
    assert tuple(a.shape) == tuple(b.shape)
    assert np.ascontiguousarray(a).tobytes() == b.reshape(-1).view(torch.uint8).numpy().tobytes()


def _flat_optimizer(sd: dict, prefix: str) -> dict[str, Any]:
    return {
        f"{prefix}.state.{pid}.{k}": v for pid, per in sd["state"].items() for k, v in per.items() if isinstance(v, torch.Tensor)
    }


# ------------------------------------------------------------- Hugging Face Trainer
def test_trainer_folder_detected_described(hf_ckpt: Path) -> None:
    assert torchless.detect(hf_ckpt) == "trainer"
    state = json.loads((hf_ckpt / "trainer_state.json").read_text())
    opt = torch.load(hf_ckpt / "optimizer.pt", weights_only=True)
    sched = torch.load(hf_ckpt / "scheduler.pt", weights_only=False)
    rng = torch.load(hf_ckpt / "rng_state.pth", weights_only=False)
    model = st_torch.load_file(str(hf_ckpt / "model.safetensors"))
    with torchless.open(hf_ckpt) as art:
        info = json.loads(json.dumps(art.info()))
    assert info["framework"] == "transformers.Trainer"
    assert (info["global_step"], info["epoch"], info["max_steps"]) == (state["global_step"], state["epoch"], state["max_steps"])
    assert info["global_step"] == 2
    assert info["model"]["source"] == ["model.safetensors"]
    assert info["tensors"] == len(model)
    assert info["parameter_count"] == sum(t.numel() for t in model.values())
    assert set(info["bytes_by_dtype"]) == {str(t.dtype).removeprefix("torch.") for t in model.values()}
    (o,) = info["optimizer"]
    assert o["file"] == "optimizer.pt"
    assert o["params_with_state"] == len(opt["state"])
    assert o["state_keys"] == list(next(iter(opt["state"].values())))
    assert [g["params"] for g in o["param_groups"]] == [len(g["params"]) for g in opt["param_groups"]]
    assert [g["lr"] for g in o["param_groups"]] == [g["lr"] for g in opt["param_groups"]]
    (s,) = info["scheduler"]
    assert s["last_epoch"] == sched["last_epoch"] and s["last_lr"] == sched["_last_lr"]
    (r,) = info["rng"]
    assert r["generators"] == list(rng)
    (a,) = info["training_args"]
    assert a["class"] == "transformers.training_args.TrainingArguments"
    args = torch.load(hf_ckpt / "training_args.bin", weights_only=False)  # imports transformers: the oracle
    assert (a["learning_rate"], a["max_steps"], a["seed"]) == (args.learning_rate, args.max_steps, args.seed)


def test_trainer_tensors_bit_identical_and_convert(hf_ckpt: Path, tmp_path: Path) -> None:
    model = st_torch.load_file(str(hf_ckpt / "model.safetensors"))
    with torchless.open(hf_ckpt) as art:
        got = _read(art)
    assert list(got) == list(model)
    for k, v in model.items():
        _same(got[k], v)
    out = tmp_path / "out.safetensors"
    assert main(["convert", str(hf_ckpt), str(out)]) == 0
    back = st_torch.load_file(str(out))
    assert list(back) == list(model)
    for k, v in model.items():
        assert torch.equal(back[k], v)


def test_trainer_optimizer_states_on_request(hf_ckpt: Path) -> None:
    opt = torch.load(hf_ckpt / "optimizer.pt", weights_only=True)
    want = _flat_optimizer(opt, "optimizer")
    with torchless.open(hf_ckpt, include_optimizer=True) as art:
        got = _read(art)
    assert {k: v for k, v in got.items() if k.startswith("optimizer.")}.keys() == want.keys()
    for k, v in want.items():
        _same(got[k], v)
    with torchless.open(hf_ckpt) as art:
        assert not any(k.startswith("optimizer.") for k in art)


def test_trainer_cli_ls_and_verify(hf_ckpt: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ls", str(hf_ckpt)]) == 0
    listed = capsys.readouterr().out
    for k in st_torch.load_file(str(hf_ckpt / "model.safetensors")):
        assert k in listed
    assert main(["verify", str(hf_ckpt)]) == 0


# ------------------------------------------------------------------------ Accelerate
def test_accelerate_state_folder(accel_dir: Path, tmp_path: Path) -> None:
    assert torchless.detect(accel_dir) == "trainer"
    model = st_torch.load_file(str(accel_dir / "model.safetensors"))
    opt = torch.load(accel_dir / "optimizer.bin", weights_only=True)
    rng = torch.load(accel_dir / "random_states_0.pkl", weights_only=False)
    with torchless.open(accel_dir, include_optimizer=True) as art:
        info = art.info()
        got = _read(art)
    assert info["framework"] == "accelerate"
    assert info["optimizer"][0]["file"] == "optimizer.bin"
    assert info["optimizer"][0]["params_with_state"] == len(opt["state"])
    assert info["rng"][0]["generators"] == list(rng)
    assert info["tensors"] == len(model)
    want = {**model, **_flat_optimizer(opt, "optimizer")}
    assert list(got) == list(want)
    for k, v in want.items():
        _same(got[k], v)


def test_accelerate_fsdp_dcp_model(accel_dir: Path, tmp_path: Path) -> None:
    """Accelerate's FSDP sharded state dict: ``pytorch_model_fsdp_0/`` is a DCP folder of
    ``{"model": state_dict}`` (written here by torch's DCP in one process, as
    ``accelerate.utils.fsdp_utils.save_fsdp_model`` calls it)."""
    import torch.distributed.checkpoint as dcp

    folder = tmp_path / "fsdp_state"
    folder.mkdir()
    for n in ("optimizer.bin", "random_states_0.pkl"):
        shutil.copyfile(accel_dir / n, folder / n)
    sd = {k: v.clone() for k, v in st_torch.load_file(str(accel_dir / "model.safetensors")).items()}
    sd["extra.bf16"] = torch.arange(6, dtype=torch.bfloat16).reshape(2, 3)
    dcp.save({"model": sd}, checkpoint_id=str(folder / "pytorch_model_fsdp_0"))
    assert torchless.detect(folder) == "trainer"
    with torchless.open(folder) as art:
        got = _read(art)
        assert art.info()["model"] == {"source": ["pytorch_model_fsdp_0"], "format": "dcp"}
    assert set(got) == set(sd)
    for k, v in sd.items():
        _same(got[k], v)


# ------------------------------------------------------------------------- Lightning
def test_lightning_ckpt_detected_described(pl_ckpt: Path) -> None:
    ck = torch.load(pl_ckpt, weights_only=False)
    assert torchless.detect(pl_ckpt) == "lightning"
    with torchless.open(pl_ckpt) as art:
        info = json.loads(json.dumps(art.info()))
        got = _read(art)
    assert info["framework"] == "lightning"
    assert info["lightning_version"] == ck["pytorch-lightning_version"]
    assert (info["epoch"], info["global_step"]) == (ck["epoch"], ck["global_step"]) == (0, 1)
    assert info["keys"] == list(ck)
    assert info["optimizer"][0]["params_with_state"] == len(ck["optimizer_states"][0]["state"])
    assert info["lr_schedulers"][0]["last_epoch"] == ck["lr_schedulers"][0]["last_epoch"]
    assert info["hyper_parameters"] == dict(ck["hyper_parameters"])
    assert list(got) == list(ck["state_dict"])
    for k, v in ck["state_dict"].items():
        _same(got[k], v)


def test_lightning_detected_by_keys_not_extension(pl_ckpt: Path, tmp_path: Path) -> None:
    renamed = tmp_path / "weights.pt"
    shutil.copyfile(pl_ckpt, renamed)
    assert torchless.detect(renamed) == "lightning"
    plain = tmp_path / "plain.ckpt"
    torch.save({"state_dict": {"w": torch.ones(2)}, "epoch": 1}, plain)
    assert torchless.detect(plain) == "pt"
    # the version key's bytes in a value, not a key: the cheap test passes, the keys decide
    decoy = tmp_path / "decoy.ckpt"
    torch.save({"state_dict": {"w": torch.ones(2)}, "note": "pytorch-lightning_version"}, decoy)
    assert torchless.detect(decoy) == "pt"


def test_lightning_convert_and_strip_prefix(pl_ckpt: Path, tmp_path: Path) -> None:
    sd = torch.load(pl_ckpt, weights_only=True)["state_dict"]
    out = tmp_path / "full.safetensors"
    assert main(["convert", str(pl_ckpt), str(out)]) == 0
    back = st_torch.load_file(str(out))
    assert list(back) == list(sd) and all(torch.equal(back[k], v) for k, v in sd.items())
    stripped = {k.removeprefix("model."): v for k, v in sd.items()}
    for opt in (True, "model."):
        dst = tmp_path / f"stripped_{opt is True}.safetensors"
        with torchless.open(pl_ckpt, strip_prefix=opt) as art:
            assert art.info()["prefix_stripped"] == "model."
            torchless.convert(art, dst)
        back = st_torch.load_file(str(dst))
        assert list(back) == list(stripped) and all(torch.equal(back[k], v) for k, v in stripped.items())


def test_lightning_optimizer_states_on_request(pl_ckpt: Path) -> None:
    ck = torch.load(pl_ckpt, weights_only=True)
    want = _flat_optimizer(ck["optimizer_states"][0], "optimizer_states.0")
    with torchless.open(pl_ckpt, include_optimizer=True) as art:
        got = _read(art)
    assert [k for k in got if k.startswith("optimizer_states.")] == list(want)
    for k, v in want.items():
        _same(got[k], v)


# ---------------------------------------------------------------------- bad input
def _copy(src: Path, tmp_path: Path) -> Path:
    dst = tmp_path / src.name
    shutil.copytree(src, dst)
    return dst


def test_damaged_side_file_is_reported(hf_ckpt: Path, tmp_path: Path) -> None:
    folder = _copy(hf_ckpt, tmp_path)
    data = (folder / "optimizer.pt").read_bytes()
    (folder / "optimizer.pt").write_bytes(data[: len(data) // 2])
    with torchless.open(folder) as art:
        info = art.info()
        problems = art.verify()
    assert info["optimizer"][0]["error"]
    assert any(p.member == "optimizer.pt" and p.severity == "error" for p in problems)
    assert main(["verify", str(folder)]) != 0
    with pytest.raises(TorchlessError), torchless.open(folder, include_optimizer=True) as art:
        list(art.tensors())


def test_bad_trainer_state_names_the_file(hf_ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = _copy(hf_ckpt, tmp_path)
    (folder / "trainer_state.json").write_text('{"global_step": 2,')
    with pytest.raises(TorchlessError) as e:
        torchless.open(folder)
    assert "trainer_state.json" in str(e.value)
    dst = tmp_path / "out.safetensors"
    assert main(["convert", str(folder), str(dst)]) == 2
    assert not dst.exists()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "trainer_state.json" in err[0]


def test_folder_without_model_is_not_claimed(hf_ckpt: Path, tmp_path: Path) -> None:
    """A Trainer folder whose weights are elsewhere (DeepSpeed's global_stepN/) is left to
    other handlers; opened as ``trainer`` it lists no tensor and says so."""
    folder = tmp_path / "no_model"
    folder.mkdir()
    for n in ("trainer_state.json", "optimizer.pt"):
        shutil.copyfile(hf_ckpt / n, folder / n)
    assert not os.path.exists(folder / "model.safetensors")
    with pytest.raises(TorchlessError):
        torchless.detect(folder)
    with torchless.open(folder, format="trainer") as art:
        assert art.keys() == []
        assert art.info()["model"]["note"] == "no model weights in this folder"
        assert any(p.code == "no-model" for p in art.verify())
