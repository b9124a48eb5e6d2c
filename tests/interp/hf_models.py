"""Tiny random-weight Hugging Face transformers models (config objects only, nothing
downloaded) for the interpreter's end-to-end tests and ``scripts/hf_zoo.py``: each exported
with ``torch.export.export`` (the training IR) with a dynamic sequence length, and after
``run_decompositions()`` (the ATen IR)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

#: model name -> (config factory, model factory) names in transformers
NAMES = ("gpt2", "llama", "bert", "t5")


def build(name: str) -> torch.nn.Module:
    import transformers as tr

    torch.manual_seed(0)
    if name == "gpt2":
        m = tr.GPT2LMHeadModel(tr.GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=100, n_positions=64))
    elif name == "llama":
        cfg = tr.LlamaConfig(
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            hidden_size=32,
            intermediate_size=64,
            vocab_size=100,
            max_position_embeddings=64,
        )
        m = tr.LlamaForCausalLM(cfg)
    elif name == "bert":
        cfg = tr.BertConfig(
            num_hidden_layers=2,
            num_attention_heads=2,
            hidden_size=32,
            intermediate_size=64,
            vocab_size=100,
            max_position_embeddings=64,
        )
        m = tr.BertModel(cfg)
    elif name == "t5":
        m = tr.T5Model(tr.T5Config(num_layers=2, num_heads=2, d_model=32, d_kv=16, d_ff=64, vocab_size=100))
    else:
        raise KeyError(name)
    return m.eval()


def inputs(name: str, batch: int, seq: int, seed: int) -> dict[str, Any]:
    """Token ids and an attention mask with padding at the end of the first row."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 100, (batch, seq), generator=g)
    am = torch.ones(batch, seq, dtype=torch.long)
    am[0, max(1, seq - 2) :] = 0
    kw: dict[str, Any] = {"input_ids": ids, "attention_mask": am}
    if name == "t5":
        kw["decoder_input_ids"] = ids[:, : max(2, seq // 2)].clone()
    if name != "bert":
        kw["use_cache"] = False
    return kw


def export(name: str, m: torch.nn.Module) -> torch.export.ExportedProgram:
    """The training-IR program, the sequence length (and the decoder's) dynamic."""
    kw = inputs(name, 2, 8, 0)
    s = torch.export.Dim("seq", min=2, max=32)
    dyn: dict[str, Any] = {"input_ids": {1: s}, "attention_mask": {1: s}}
    if name == "t5":
        dyn["decoder_input_ids"] = {1: torch.export.Dim("dec", min=2, max=32)}
    if "use_cache" in kw:
        dyn["use_cache"] = None
    return torch.export.export(m, (), kw, dynamic_shapes=dyn)


def first_output(out: Any) -> Any:
    """The first tensor of a model output (logits / last hidden state)."""
    if hasattr(out, "to_tuple"):
        return out.to_tuple()[0]
    if isinstance(out, dict):
        return next(iter(out.values()))
    return out[0] if isinstance(out, (tuple, list)) else out


def numpy_kwargs(kw: dict[str, Any], to_np: Callable[[Any], Any] = lambda t: t.numpy()) -> dict[str, Any]:
    return {k: to_np(v) if isinstance(v, torch.Tensor) else v for k, v in kw.items()}
