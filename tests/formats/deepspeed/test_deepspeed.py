"""DeepSpeed ZeRO checkpoints consolidated without torch.

Oracle: real ZeRO-1/2/3 checkpoints (fp32, bf16 and fp16 training) written by DeepSpeed on CPU
with 2 gloo ranks (``make_zero.py``), and DeepSpeed's own
``zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint`` run in a child process: the
consolidated state dict must be the same names, in the same order, dtypes, shapes and
bytes, tied names the same tensor.
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
from torchless.core.errors import FormatError, TorchlessError

torch = pytest.importorskip("torch", reason="torch is the oracle")
pytest.importorskip("deepspeed", reason="DeepSpeed writes the checkpoints and is the oracle")

HERE = os.path.dirname(os.path.abspath(__file__))
MAKE = os.path.join(HERE, "make_zero.py")
CONFIGS = [(s, d) for d in ("fp32", "bf16", "fp16") for s in (1, 2, 3)]
NAMES = [f"z{s}_{d}" for s, d in CONFIGS]
LAYOUTS = ["moe", "pp"]  # MoE expert files, pipeline-parallel layer files (make_zero.py; MoE first: a
# pipeline engine leaves DeepSpeed's process groups set for the ones after it)


def _run(*args: str) -> None:
    env = dict(os.environ, DS_ACCELERATOR="cpu", DS_BUILD_OPS="0", OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, MAKE, *args], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]


@pytest.fixture(scope="session")
def zero(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[str, dict]]:
    """``{name: (checkpoint root, zero_to_fp32's state dict)}`` for every config."""
    base = tmp_path_factory.mktemp("zero")
    _run("write", str(base), ",".join([*(f"{s}:{d}" for s, d in CONFIGS), *(f"{n}:fp32" for n in LAYOUTS)]))
    pairs = []
    for n in NAMES:
        pairs += [str(base / n), str(base / f"{n}.oracle.pt")]
    _run("oracle", *pairs)
    out = {n: (str(base / n), torch.load(base / f"{n}.oracle.pt", weights_only=True)) for n in NAMES}
    for n in LAYOUTS:  # each rank's module after DeepSpeed's own load_checkpoint
        out[n] = (str(base / n), {r: torch.load(base / n / f"oracle_rank{r}.pt", weights_only=True) for r in (0, 1)})
    return out


def _same(got: dict, want: dict) -> None:
    assert list(got) == list(want)
    for k, w in want.items():
        g = got[k]
        assert g.dtype.torch_name == str(w.dtype), k
        assert tuple(g.shape) == tuple(w.shape), k
        a = np.ascontiguousarray(g.numpy()).view(np.uint8)
        b = w.reshape(-1).contiguous().view(torch.uint8).numpy() if w.numel() else np.zeros(0, np.uint8)
        assert a.tobytes() == b.tobytes(), k


@pytest.mark.parametrize("name", NAMES)
def test_consolidated_is_zero_to_fp32(zero: dict, name: str) -> None:
    root, want = zero[name]
    with torchless.open(root) as art:
        assert art.format == "deepspeed"
        got = dict(art.tensors())
        _same(got, want)
        assert got["head.weight"] is got["embed.weight"]  # tied: one tensor, as zero_to_fp32 gives
        info = art.info()
        assert info["zero_stage"] == int(name[1]) and info["world_size"] == 2
        assert info["framework"] == "DeepSpeed" and info["ds_version"] == "0.19.8"
        assert info["inside"]["model"] and info["inside"]["lr_scheduler"]
        assert info["inside"]["optimizer_states"] == ["exp_avg", "exp_avg_sq", "step"]
        assert info["inside"]["param_groups"] == 2
        assert info["tied"] == ["embed.weight", "head.weight"]
        assert info["parameters"] == sum(want[k].numel() for k in want if "." in k and k != "head.weight")
    stage = int(name[1])
    assert ("frozen.weight" in want) == (stage >= 2)  # the oracle says where frozen params survive
    assert want["scale"].dtype == torch.float32  # a float64 buffer comes out as float32


def test_tag_folder_and_latest(zero: dict) -> None:
    root, want = zero["z3_bf16"]
    with torchless.open(os.path.join(root, "global_step2")) as art:
        _same(dict(art.tensors()), want)


@pytest.mark.parametrize("name", ["z2_bf16", "z3_fp32"])
def test_convert_matches_oracle(zero: dict, name: str, tmp_path) -> None:
    from safetensors.torch import load_file

    root, want = zero[name]
    out = tmp_path / "m.safetensors"
    assert main(["convert", root, str(out)]) == 0
    got = load_file(str(out))
    assert "head.weight" not in got  # the tied alias is stored once (recorded in __metadata__)
    assert list(got) == [k for k in want if k != "head.weight"]
    for k, v in got.items():
        assert v.dtype == want[k].dtype and torch.equal(v, want[k].detach()), k
    pt = tmp_path / "m.pt"
    torchless.convert(root, pt)
    back = torch.load(pt, weights_only=True)
    assert list(back) == list(want)
    for k, w in want.items():
        assert torch.equal(back[k], w.detach()) and back[k].dtype == w.dtype, k
    assert back["head.weight"].data_ptr() == back["embed.weight"].data_ptr()


def test_ls_and_info_cli(zero: dict, capsys) -> None:
    root, _ = zero["z3_fp32"]
    assert main(["info", root]) == 0
    out = capsys.readouterr().out
    assert "deepspeed" in out and "zero_stage: 3" in out
    assert main(["ls", root]) == 0
    assert "body.weight" in capsys.readouterr().out


def _copy(zero: dict, name: str, tmp_path) -> str:
    dst = tmp_path / name
    shutil.copytree(zero[name][0], dst)
    return str(dst / "global_step2")


@pytest.mark.parametrize("name", ["z2_fp32", "z3_fp32"])
def test_missing_rank(zero: dict, name: str, tmp_path) -> None:
    tag = _copy(zero, name, tmp_path)
    victim = sorted(f for f in os.listdir(tag) if f.endswith("_optim_states.pt"))[-1]
    os.remove(os.path.join(tag, victim))
    with pytest.raises(FormatError, match="written by 2 ranks but 1"):
        torchless.open(os.path.dirname(tag))
    out = tmp_path / "o.safetensors"
    assert main(["convert", os.path.dirname(tag), str(out)]) == 2
    assert not out.exists()


def test_truncated_rank(zero: dict, tmp_path) -> None:
    tag = _copy(zero, "z3_fp32", tmp_path)
    victim = os.path.join(tag, "zero_pp_rank_1_mp_rank_00_optim_states.pt")
    size = os.path.getsize(victim)
    with open(victim, "r+b") as f:
        f.truncate(size // 2)
    with pytest.raises(TorchlessError) as ei:
        torchless.open(os.path.dirname(tag))
    assert "zero_pp_rank_1_mp_rank_00_optim_states.pt" in str(ei.value)
    out = tmp_path / "o.safetensors"
    assert main(["convert", os.path.dirname(tag), str(out)]) == 2
    assert not out.exists()


def _rewrite(path: str, edit) -> None:
    obj = torch.load(path, weights_only=False)
    edit(obj)
    torch.save(obj, path)


def test_mixed_world_sizes(zero: dict, tmp_path) -> None:
    tag = _copy(zero, "z2_fp32", tmp_path)
    victim = os.path.join(tag, "zero_pp_rank_1_mp_rank_00_optim_states.pt")
    _rewrite(victim, lambda o: o["optimizer_state_dict"].__setitem__("partition_count", [4, 4]))
    with pytest.raises(FormatError, match="different world sizes") as ei:
        torchless.open(os.path.dirname(tag))
    assert "zero_pp_rank_1" in str(ei.value)


@pytest.mark.parametrize("name", ["z1_fp32", "z3_fp32"])
def test_inconsistent_param_shapes(zero: dict, name: str, tmp_path) -> None:
    tag = _copy(zero, name, tmp_path)
    model = sorted(f for f in os.listdir(tag) if f.endswith("_model_states.pt"))[0]

    def grow(o: dict) -> None:
        o["param_shapes"][0]["body.weight"] = torch.Size([7, 9])

    _rewrite(os.path.join(tag, model), grow)
    out = tmp_path / "o.safetensors"
    with pytest.raises(FormatError, match="param_shapes") as ei, torchless.open(os.path.dirname(tag)) as art:
        dict(art.tensors())
    assert model in str(ei.value)
    assert main(["convert", os.path.dirname(tag), str(out)]) == 2
    assert not out.exists()


def test_weights_only_refuses_other_globals(zero: dict, tmp_path) -> None:
    """The DeepSpeed classes are accepted as inert placeholders; anything else is not."""
    tag = _copy(zero, "z1_fp32", tmp_path)
    victim = os.path.join(tag, "zero_pp_rank_0_mp_rank_00_optim_states.pt")
    _rewrite(victim, lambda o: o.__setitem__("evil", os.getcwd))  # posix.getcwd, never called
    from torchless.core.errors import UnsafeGlobalError

    with pytest.raises(UnsafeGlobalError):
        torchless.open(os.path.dirname(tag))
    with torchless.open(os.path.dirname(tag), weights_only=False) as art:
        assert art.info()["zero_stage"] == 1


def test_scan_reads_rank_files_as_pt(zero: dict, capsys) -> None:
    """scan reads rank files as the .pt checkpoints they are: the DeepSpeed classes that
    pickle.load would import and call are findings, never silently allowed."""
    root, _ = zero["z2_bf16"]
    tag = os.path.join(root, "global_step2")
    assert main(["scan", os.path.join(tag, "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt")]) == 1
    out = capsys.readouterr().out
    assert "SUSPICIOUS (torch-zip" in out
    for cls in ("LossScaler", "ZeroStageEnum", "fragment_address"):
        assert "unknown-global" in out and cls in out
    assert main(["scan", os.path.join(tag, "mp_rank_00_model_states.pt")]) == 0
    assert "CLEAN (torch-zip" in capsys.readouterr().out


def test_missing_model_states_of_a_stage3_rank(zero: dict, tmp_path) -> None:
    tag = _copy(zero, "z3_bf16", tmp_path)
    os.remove(os.path.join(tag, "zero_pp_rank_1_mp_rank_00_model_states.pt"))
    with pytest.raises(FormatError, match="one model state file per rank"):
        torchless.open(os.path.dirname(tag))


def test_latest_outside_the_root_is_not_followed(zero: dict, tmp_path) -> None:
    """``latest`` naming a folder outside the root (``..``, a symlink out) is never read."""
    tag = _copy(zero, "z2_fp32", tmp_path)
    root = os.path.dirname(tag)
    other = tmp_path / "elsewhere"
    os.rename(tag, other)
    os.symlink(other, tag)  # global_step2 -> a folder outside the root
    with pytest.raises(TorchlessError):
        torchless.open(root, format="deepspeed")
    for tag_name in ("../elsewhere", ".."):
        with open(os.path.join(root, "latest"), "w") as f:
            f.write(tag_name)
        with pytest.raises(TorchlessError):
            torchless.open(root, format="deepspeed")
    with torchless.open(str(other)) as art:  # the tag folder itself, given directly, is fine
        assert art.info()["zero_stage"] == 2


def test_convert_to_npz_and_a_sharded_set(zero: dict, tmp_path) -> None:
    from safetensors.torch import load_file

    root, want = zero["z3_fp32"]
    npz = tmp_path / "m.npz"
    torchless.convert(root, npz)
    with np.load(npz) as z:
        assert list(z.files) == list(want)
        for k, w in want.items():
            assert z[k].tobytes() == w.detach().numpy().tobytes(), k
    index = tmp_path / "m.safetensors.index.json"
    res = torchless.convert(root, index, max_shard_size="300B")
    shards = [f for f in res["files"] if f.endswith(".safetensors")]
    assert len(shards) > 1
    got: dict = {}
    for f in shards:
        got.update(load_file(f))
    assert sorted(got) == sorted(k for k in want if k != "head.weight")
    for k, v in got.items():
        assert torch.equal(v, want[k].detach()), k


# -- pipeline-parallel and MoE checkpoints (module weights in several files) -----------

EXPERTS = ".deepspeed_moe.experts.deepspeed_experts."


def _loaded_model(name: str, ranks: dict) -> dict:
    """The whole model as DeepSpeed's load_checkpoint gave it to the ranks: the pipeline
    stages' modules together (each owns its layers); for MoE, rank 0's module with every
    rank's local experts under their global ids (``ep_rank * local + local_id``, as
    ``load_moe_state_dict`` maps them), each after the MoE layer's gate."""
    if name == "pp":
        both = {**ranks[0], **ranks[1]}
        assert len(both) == len(ranks[0]) + len(ranks[1])  # disjoint: one stage a layer
        return both
    local = sum(1 for k in ranks[0] if EXPERTS in k and k.endswith(".weight"))
    out: dict = {}
    for k, v in ranks[0].items():
        if EXPERTS in k:
            continue
        out[k] = v
        if k.endswith(".gate.wg.weight"):
            for r in (0, 1):
                for k2, v2 in ranks[r].items():
                    if EXPERTS in k2:
                        pre, rest = k2.split(EXPERTS)
                        lid, tail = rest.split(".", 1)
                        out[f"{pre}{EXPERTS}{r * local + int(lid)}.{tail}"] = v2
    assert len(out) == len(ranks[0]) + local * 2  # 4 experts, 2 a rank
    return out


@pytest.mark.parametrize("name", LAYOUTS)
def test_pipeline_and_moe_are_deepspeeds_own_loading(zero: dict, name: str) -> None:
    root, ranks = zero[name]
    want = _loaded_model(name, ranks)
    with torchless.open(root) as art:
        assert art.format == "deepspeed"
        got = dict(art.tensors())
        _same(got, want)
        info = art.info()
    assert info["framework"] == "DeepSpeed" and info["world_size"] == 2
    if name == "pp":
        assert info["layout"] == "pipeline" and info["pipeline_stages"] == 2 and info["zero_stage"] == 1
        assert info["layer_files"][0] == "layer_00-model_states.pt" and len(info["layer_files"]) == 5
        assert "3.num_batches_tracked" in got and not got["3.num_batches_tracked"].is_parameter
    else:
        assert info["layout"] == "moe" and info["moe_layers"] == {"moe": 4} and info["zero_stage"] == 2
        assert len(info["expert_files"]) == 4
    assert info["parameters"] == sum(v.numel() for k, v in want.items() if v.is_floating_point() and "running" not in k)


def test_pipeline_and_moe_convert(zero: dict, tmp_path) -> None:
    from safetensors.torch import load_file

    for name in LAYOUTS:
        root, ranks = zero[name]
        want = _loaded_model(name, ranks)
        out = tmp_path / f"{name}.safetensors"
        assert main(["convert", root, str(out)]) == 0
        got = load_file(str(out))
        assert list(got) == list(want)
        for k, v in got.items():
            assert torch.equal(v, want[k]), k


def _bad(root: str, tmp_path, match: str, culprit: str) -> None:
    with pytest.raises(TorchlessError, match=match or None) as ei, torchless.open(root) as art:
        dict(art.tensors())
    assert culprit in str(ei.value)
    out = tmp_path / "o.safetensors"
    assert main(["convert", root, str(out)]) == 2
    assert not out.exists()


def test_pipeline_bad_input(zero: dict, tmp_path) -> None:
    tag = _copy(zero, "pp", tmp_path / "a")
    os.remove(os.path.join(tag, "layer_02-model_states.pt"))  # a missing layer file
    _bad(os.path.dirname(tag), tmp_path, "no layer file holds it", "layer_02-model_states.pt")
    tag = _copy(zero, "pp", tmp_path / "b")
    os.remove(os.path.join(tag, "mp_rank_01_model_states.pt"))  # a missing stage
    _bad(os.path.dirname(tag), tmp_path, "needs mp_rank_00..01", "mp_rank_01_model_states.pt")
    tag = _copy(zero, "pp", tmp_path / "c")
    victim = os.path.join(tag, "layer_04-model_states.pt")
    with open(victim, "r+b") as f:  # truncated
        f.truncate(os.path.getsize(victim) // 2)
    _bad(os.path.dirname(tag), tmp_path, "", "layer_04-model_states.pt")
    tag = _copy(zero, "pp", tmp_path / "d")  # a stage of another run (another world size)
    _rewrite(os.path.join(tag, "mp_rank_01_model_states.pt"), lambda o: o.__setitem__("mp_world_size", 4))
    _bad(os.path.dirname(tag), tmp_path, "different world sizes", "mp_rank_01_model_states.pt")
    tag = _copy(zero, "pp", tmp_path / "e")  # a layer file of another model (other shapes)
    _rewrite(os.path.join(tag, "layer_02-model_states.pt"), lambda o: o.__setitem__("weight", torch.zeros(6, 8)))
    _bad(os.path.dirname(tag), tmp_path, "does not have the shape", "layer_02-model_states.pt")


def test_moe_bad_input(zero: dict, tmp_path) -> None:
    tag = _copy(zero, "moe", tmp_path / "a")
    os.remove(os.path.join(tag, "layer_0_expert_3_mp_rank_00_model_states.pt"))  # a missing expert
    _bad(os.path.dirname(tag), tmp_path, "4 experts", "layer_0_expert_3_mp_rank_00_model_states.pt")
    tag = _copy(zero, "moe", tmp_path / "b")
    victim = os.path.join(tag, "layer_0_expert_1_mp_rank_00_model_states.pt")
    with open(victim, "r+b") as f:  # truncated
        f.truncate(os.path.getsize(victim) // 2)
    _bad(os.path.dirname(tag), tmp_path, "", "layer_0_expert_1_mp_rank_00_model_states.pt")
    tag = _copy(zero, "moe", tmp_path / "c")  # a rank missing
    os.remove(os.path.join(tag, "zero_pp_rank_1_mp_rank_00_optim_states.pt"))
    _bad(os.path.dirname(tag), tmp_path, "written by 2 ranks but 1", "global_step2")
    tag = _copy(zero, "moe", tmp_path / "d")  # an expert of another model (other shapes)
    victim = os.path.join(tag, "layer_0_expert_2_mp_rank_00_model_states.pt")
    key = f"moe{EXPERTS}2.weight"
    _rewrite(victim, lambda o: o.__setitem__(key, torch.zeros(6, 7)))
    _bad(os.path.dirname(tag), tmp_path, "differ in names or shapes", "layer_0_expert_2_mp_rank_00_model_states.pt")
