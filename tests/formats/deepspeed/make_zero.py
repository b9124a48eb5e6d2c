"""Write real DeepSpeed ZeRO checkpoints on CPU (gloo, 2 processes), and consolidate them
with DeepSpeed's own ``get_fp32_state_dict_from_zero_checkpoint`` (the oracle).

Usage (the test session fixture runs these; also by hand):
    python make_zero.py write OUT 1:fp32,3:bf16 [WORLD] [HIDDEN]  # OUT/z1_fp32/{latest,global_step2/}...
    python make_zero.py write OUT pp:fp32,moe:fp32                # OUT/pp, OUT/moe (+ oracle_rank<r>.pt)
    python make_zero.py oracle CKPT OUT.pt [CKPT OUT.pt ...]       # zero_to_fp32's state dicts, torch.save'd

The model: tied embedding/head weights (``shared_params``), a frozen parameter
(``frozen_param_shapes``/``frozen_param_fragments``), a float buffer and an integer
buffer, two parameter groups, an lr scheduler, parameter sizes that do not divide by the world size
(padding). DTYPE is fp32, bf16 or fp16.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rank_main(out: str, configs: list[tuple[str, str]], world: int, hidden: int) -> None:
    """Write one checkpoint per ``(stage, dtype)`` under ``out/z<stage>_<dtype>`` (one
    process group, so the imports are paid once)."""
    import deepspeed
    import torch

    deepspeed.init_distributed(dist_backend="gloo")
    for stage, dtype in configs:
        if stage in LAYOUTS:
            LAYOUTS[stage](os.path.join(out, stage))
        else:
            _write_one(os.path.join(out, f"z{stage}_{dtype}"), int(stage), dtype, hidden)
        torch.distributed.barrier()
    sys.stdout.flush()
    os._exit(0)  # the gloo process group can hang at interpreter exit


def _write_one(out: str, stage: int, dtype: str, hidden: int) -> None:
    import deepspeed
    import torch
    from torch import nn

    torch.manual_seed(1234 + stage)

    class Tiny(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(11, hidden)
            self.frozen = nn.Linear(hidden, 5)
            self.frozen.weight.requires_grad_(False)
            self.frozen.bias.requires_grad_(False)
            self.body = nn.Linear(hidden, hidden)
            self.norm = nn.LayerNorm(hidden)
            self.head = nn.Linear(hidden, 11, bias=False)
            self.head.weight = self.embed.weight  # tied
            self.register_buffer("scale", torch.linspace(0.5, 1.5, 3, dtype=torch.float64))
            self.register_buffer("steps", torch.arange(4, dtype=torch.int64))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.embed(x)
            h = self.norm(self.body(h)) + self.frozen(h).sum(-1, keepdim=True) * self.scale[0].to(h.dtype)
            return self.head(h)

    model = Tiny()
    decay = [p for n, p in model.named_parameters() if p.requires_grad and n.endswith("weight")]
    no_decay = [p for n, p in model.named_parameters() if p.requires_grad and not n.endswith("weight")]
    groups = [{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=1e-2)
    config = {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 1,
        "zero_optimization": {"stage": stage},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 1000,
    }
    if dtype == "bf16":
        config["bf16"] = {"enabled": True}
    elif dtype == "fp16":
        config["fp16"] = {"enabled": True, "initial_scale_power": 4}
        # DeepSpeed's CPU accelerator says no to fp16 ("Type fp16 is not supported on your
        # device", a capability check in DeepSpeedEngine); torch computes fp16 on CPU, so the
        # check is answered yes and DeepSpeed's own fp16 ZeRO optimizer and saving code run.
        from deepspeed.accelerator import get_accelerator

        type(get_accelerator()).is_fp16_supported = lambda self: True
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, lr_scheduler=sched, config=config)
    g = torch.Generator().manual_seed(7 + engine.global_rank)
    for _ in range(2):
        x = torch.randint(0, 11, (2, 3), generator=g)
        loss = engine(x).float().pow(2).mean()
        engine.backward(loss)
        engine.step()
    engine.save_checkpoint(out, tag="global_step2")
    engine.destroy()


def _ds_config(stage: int) -> dict:
    return {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 1,
        "zero_optimization": {"stage": stage},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 1000,
    }


def _oracle_after_load(out: str, make_engine) -> None:
    """DeepSpeed's own loading: a fresh engine (other initial weights) loads the
    checkpoint; each rank saves its module's state dict as ``out/oracle_rank<r>.pt``."""
    import torch

    torch.manual_seed(999)
    engine = make_engine()
    engine.load_checkpoint(out, load_optimizer_states=False, load_lr_scheduler_states=False)
    torch.save(engine.module.state_dict(), os.path.join(out, f"oracle_rank{engine.global_rank}.pt"))
    engine.destroy()


def _write_pp(out: str) -> None:
    """A 2-stage PipelineModule (ZeRO-1, fp32): ``layer_XX-model_states.pt`` files, a
    layer without parameters (ReLU), an integer buffer (BatchNorm's step count)."""
    import deepspeed
    import torch
    from deepspeed.pipe import LayerSpec, PipelineModule
    from torch import nn

    def make():
        layers = [
            LayerSpec(nn.Linear, 5, 7),
            LayerSpec(nn.ReLU),
            LayerSpec(nn.Linear, 7, 6),
            LayerSpec(nn.BatchNorm1d, 6),
            LayerSpec(nn.Linear, 6, 3),
        ]
        model = PipelineModule(
            layers=layers, num_stages=2, loss_fn=lambda o, y: (o - y).pow(2).mean(), partition_method="uniform"
        )
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        return deepspeed.initialize(model=model, optimizer=opt, config=_ds_config(1))[0]

    torch.manual_seed(4321)
    engine = make()
    g = torch.Generator().manual_seed(3)
    data = iter([(torch.randn(2, 5, generator=g), torch.randn(2, 3, generator=g)) for _ in range(2)])
    for _ in range(2):
        engine.train_batch(data)
    engine.save_checkpoint(out, tag="global_step2")
    engine.destroy()
    _oracle_after_load(out, make)


def _write_moe(out: str) -> None:
    """deepspeed.moe.layer.MoE, 4 experts over ep_size 2 (2 local experts a rank), ZeRO-2
    fp32: ``layer_0_expert_<id>_mp_rank_00_model_states.pt`` files."""
    import deepspeed
    import torch
    from deepspeed.moe.layer import MoE
    from deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer
    from torch import nn

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inp = nn.Linear(5, 6)
            self.moe = MoE(hidden_size=6, expert=nn.Linear(6, 6), num_experts=4, ep_size=2, k=1)
            self.out = nn.Linear(6, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h, _, _ = self.moe(self.inp(x))
            return self.out(h)

    def make():
        model = Net()
        groups = split_params_into_different_moe_groups_for_optimizer({"params": list(model.parameters()), "name": "p"})
        opt = torch.optim.AdamW(groups, lr=1e-2)
        return deepspeed.initialize(model=model, optimizer=opt, config=_ds_config(2))[0]

    torch.manual_seed(4321)
    engine = make()
    g = torch.Generator().manual_seed(3 + engine.global_rank)
    for _ in range(2):
        loss = engine(torch.randn(2, 4, 5, generator=g)).pow(2).mean()
        engine.backward(loss)
        engine.step()
    engine.save_checkpoint(out, tag="global_step2")
    engine.destroy()
    _oracle_after_load(out, make)


#: the module-weight layouts (written under ``out/<name>``, with DeepSpeed-loaded oracles;
#: "pp" last: the pipeline engine leaves DeepSpeed's groups set for engines after it)
LAYOUTS = {"pp": _write_pp, "moe": _write_moe}


def write(out: str, configs: list[tuple[str, str]], world: int = 2, hidden: int = 7, timeout: float = 600) -> None:
    """Run ``world`` ranks writing ``out/z<stage>_<dtype>`` for each of ``configs``."""
    port = _free_port()
    procs = []
    for rank in range(world):
        env = dict(
            os.environ,
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE=str(world),
            LOCAL_WORLD_SIZE=str(world),
            DS_ACCELERATOR="cpu",
            DS_BUILD_OPS="0",
            OMP_NUM_THREADS="1",
        )
        spec = ",".join(f"{st}:{dt}" for st, dt in configs)
        cmd = [sys.executable, __file__, "_rank", out, spec, str(world), str(hidden)]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    outs = []
    for p in procs:
        try:
            o, _ = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
        outs.append(o.decode(errors="replace"))
    if any(p.returncode for p in procs):
        raise RuntimeError("deepspeed ranks failed:\n" + "\n".join(o[-3000:] for o in outs))


def oracle(pairs: list[tuple[str, str]]) -> None:
    """``torch.save`` zero_to_fp32's state dict of each checkpoint root to its output."""
    import torch
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    for ckpt, out in pairs:
        torch.save(get_fp32_state_dict_from_zero_checkpoint(ckpt), out)


def _configs(spec: str) -> list[tuple[str, str]]:
    return [(a, b) for a, b in (c.split(":") for c in spec.split(","))]


if __name__ == "__main__":
    cmd, *args = sys.argv[1:]
    if cmd == "_rank":
        _rank_main(args[0], _configs(args[1]), int(args[2]), int(args[3]))
    elif cmd == "write":
        write(args[0], _configs(args[1]), *(int(a) for a in args[2:4]))
    elif cmd == "oracle":
        oracle(list(zip(args[::2], args[1::2], strict=True)))
    else:
        raise SystemExit(__doc__)
