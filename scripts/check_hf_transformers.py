"""One-off oracle check against transformers' own save_pretrained / from_pretrained.

transformers (and its ~20 dependencies) is not in the test environment; run this where
it is installed:  python scripts/check_hf_transformers.py OUTDIR

It saves a small config-built Llama (tied embeddings) with save_pretrained as sharded
safetensors, reads it with torchless (tensors bit-exact, verify clean), converts it to
.bin shards and to safetensors shards with torchless, and loads both back with
from_pretrained (every weight equal). Prints one line per check; exits 1 on a mismatch.
"""

from __future__ import annotations

import os
import shutil
import sys

import torch
from transformers import LlamaConfig, LlamaForCausalLM

import torchless


def main(out: str) -> int:
    cfg = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    m = LlamaForCausalLM(cfg)
    ref = m.state_dict()
    st = os.path.join(out, "st")
    m.save_pretrained(st, max_shard_size="20KB")
    ok = True
    with torchless.open(st) as a:
        same = all(torch.equal(torch.from_numpy(t.numpy().copy()), ref[k]) for k, t in a.tensors())
        print(
            "read save_pretrained shards:",
            torchless.detect(st),
            a.info()["files"],
            "shards,",
            a.info()["tensors"],
            "tensors, bit-exact:",
            same,
            "verify:",
            a.verify(),
        )
        ok &= same and not a.verify()
    for name, idx, kw in (
        ("bin", "pytorch_model.bin.index.json", {"use_safetensors": False}),
        ("conv", "model.safetensors.index.json", {}),
    ):
        d = os.path.join(out, name)
        os.makedirs(d)
        torchless.convert(st, os.path.join(d, idx), max_shard_size="20KB")
        shutil.copy(os.path.join(st, "config.json"), d)
        back = LlamaForCausalLM.from_pretrained(d, **kw).state_dict()
        same = all(torch.equal(v, ref[k]) for k, v in back.items())
        print(f"from_pretrained of torchless's {idx}:", same)
        ok &= same
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
