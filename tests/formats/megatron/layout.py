"""Writes Megatron-LM legacy checkpoints from a full state dict (torch), as Megatron lays them out.

``iter_<7 digits>/mp_rank_<TP:02d>[_<PP:03d>]/model_optim_rng.pt`` holding
``{"args": argparse.Namespace, "checkpoint_version": 3.0, "iteration", "model", "rng_state"}``
and ``latest_checkpointed_iteration.txt``. Tensor-parallel slices: column-parallel (QKV,
fc1, embedding, output layer) on dim 0, row-parallel (proj, fc2) on dim 1, SwiGLU fc1
sliced per half; pipeline stages get consecutive layers numbered from 0.
"""

from __future__ import annotations

import argparse
import os
import re
from typing import Any

import torch

_DIM0 = (
    "linear_qkv.weight",
    "linear_qkv.bias",
    "linear_fc1.weight",
    "linear_fc1.bias",
    "word_embeddings.weight",
    "output_layer.weight",
)
_DIM1 = ("linear_proj.weight", "linear_fc2.weight")


def gpt_state(
    layers: int = 4, hidden: int = 8, ffn: int = 12, vocab: int = 32, swiglu: bool = True, seed: int = 0
) -> dict[str, Any]:
    """A Megatron-core GPT state dict with random values (bf16 and fp32 mixed)."""
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    sd: dict[str, Any] = {"embedding.word_embeddings.weight": r(vocab, hidden).to(torch.bfloat16)}
    for i in range(layers):
        p = f"decoder.layers.{i}."
        sd[p + "self_attention.linear_qkv.layer_norm_weight"] = r(hidden)
        sd[p + "self_attention.linear_qkv.weight"] = r(3 * hidden, hidden).to(torch.bfloat16)
        sd[p + "self_attention.linear_qkv.bias"] = r(3 * hidden)
        sd[p + "self_attention.linear_proj.weight"] = r(hidden, hidden).to(torch.bfloat16)
        sd[p + "self_attention.linear_proj.bias"] = r(hidden)
        sd[p + "mlp.linear_fc1.layer_norm_weight"] = r(hidden)
        sd[p + "mlp.linear_fc1.weight"] = r((2 if swiglu else 1) * ffn, hidden).to(torch.bfloat16)
        sd[p + "mlp.linear_fc2.weight"] = r(hidden, ffn).to(torch.bfloat16)
    sd["decoder.final_layernorm.weight"] = r(hidden)
    sd["output_layer.weight"] = r(vocab, hidden).to(torch.bfloat16)
    return sd


def _slice(name: str, t: Any, tp: int, rank: int, swiglu: bool) -> Any:
    if name.endswith(_DIM0):
        if swiglu and "linear_fc1." in name:
            gate, up = t.chunk(2, dim=0)
            return torch.cat([gate.chunk(tp, dim=0)[rank], up.chunk(tp, dim=0)[rank]], dim=0).clone()
        return t.chunk(tp, dim=0)[rank].clone()
    if name.endswith(_DIM1):
        return t.chunk(tp, dim=1)[rank].clone()
    return t.clone()


def write(
    root: str,
    sd: dict[str, Any],
    *,
    tp: int,
    pp: int,
    layers: int,
    swiglu: bool,
    iteration: int = 100,
    args: dict[str, Any] | None = None,
) -> str:
    """Write the rank folders under ``root``; returns the iteration folder."""
    per = layers // pp
    it = os.path.join(root, f"iter_{iteration:07d}")
    ns = argparse.Namespace(
        num_layers=layers,
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        swiglu=swiglu,
        padded_vocab_size=sd["embedding.word_embeddings.weight"].shape[0],
        **(args or {}),
    )
    for q in range(pp):
        stage: dict[str, Any] = {}
        for name, t in sd.items():
            m = re.search(r"layers\.(\d+)\.", name)
            if m:
                i = int(m[1])
                if not q * per <= i < (q + 1) * per:
                    continue
                name = name.replace(f"layers.{i}.", f"layers.{i - q * per}.", 1)
            elif name.startswith("embedding.") and q != 0 or name.startswith(("output_layer.", "decoder.final_")) and q != pp - 1:
                continue
            stage[name] = t
        for t_rank in range(tp):
            model = {n: _slice(n, t, tp, t_rank, swiglu) for n, t in stage.items()}
            folder = os.path.join(it, f"mp_rank_{t_rank:02d}" if pp == 1 else f"mp_rank_{t_rank:02d}_{q:03d}")
            os.makedirs(folder)
            torch.save(
                {
                    "args": ns,
                    "checkpoint_version": 3.0,
                    "iteration": iteration,
                    "model": model,
                    "rng_state": [{"random_rng_state": (3, tuple(range(4)), None)}],
                },
                os.path.join(folder, "model_optim_rng.pt"),
            )
    with open(os.path.join(root, "latest_checkpointed_iteration.txt"), "w") as f:
        f.write(str(iteration))
    return it
