# /// script
# requires-python = ">=3.10"
# dependencies = ["torch==2.13.0"]
# ///
"""Regenerate the eager-checkpoint samples in this folder (run: python samples/gen_samples.py).

The files are small and committed; the README's main job runs torchless on them.
"""

from __future__ import annotations

import os

import torch

HERE = os.path.dirname(os.path.abspath(__file__))


def main() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.LayerNorm(32), torch.nn.Linear(32, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(8, 16)).sum().backward()
    opt.step()
    ckpt = {
        "model": model.state_dict(),
        "optimizer": opt.state_dict(),
        "epoch": 3,
        "step": 1200,
        "config": {"lr": 1e-3, "betas": (0.9, 0.999), "layers": [16, 32, 4], "name": "tiny-mlp"},
    }
    torch.save(ckpt, os.path.join(HERE, "checkpoint.pt"))
    # an LLM-shaped bfloat16 state dict with tied embeddings
    emb = torch.randn(64, 24).to(torch.bfloat16)
    sd = {"embed.weight": emb, "lm_head.weight": emb}
    for i in range(2):
        sd[f"layers.{i}.attn.qkv.weight"] = torch.randn(72, 24).to(torch.bfloat16)
        sd[f"layers.{i}.attn.out.weight"] = torch.randn(24, 24).to(torch.bfloat16)
        sd[f"layers.{i}.mlp.up.weight"] = torch.randn(48, 24).to(torch.bfloat16)
        sd[f"layers.{i}.mlp.down.weight"] = torch.randn(24, 48).to(torch.bfloat16)
        sd[f"layers.{i}.norm.weight"] = torch.ones(24, dtype=torch.float32)
    torch.save(sd, os.path.join(HERE, "state_dict.pt"))
    # the pre-1.6 stream format
    torch.save(
        {"w": torch.arange(6, dtype=torch.float64).reshape(2, 3), "b": torch.zeros(3, dtype=torch.int16)},
        os.path.join(HERE, "legacy_format.pt"),
        _use_new_zipfile_serialization=False,
    )


if __name__ == "__main__":
    main()
