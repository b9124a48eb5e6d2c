"""The transformers model zoo of the interpreter's end-to-end tests (tests/interp/test_hf_zoo.py)
and of ``scripts/interp_zoo.py``: tiny configs, random weights, nothing downloaded.

Each entry names a transformers model class, its config class, the kind of inputs it takes
and config overrides. :func:`build` makes the model from the config (every config field the
tiny defaults of :data:`TINY` name, when the config has it) and re-initialises every
parameter from N(0, 0.1) with a fixed seed (transformers' own init leaves biases, layer
scales and some projections at zero, which would hide wrong kernels). :func:`export`
exports it with one dynamic dimension (the sequence length for text, the decoder length
for seq2seq and Whisper, the batch for images, the waveform length for Wav2Vec2-style
audio) or, where torch cannot export that, with the next candidate (see ``dynamic``), and
:func:`inputs` gives the inputs at a size: two sizes of the dynamic dimension are run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

VOCAB = 100

#: config fields of a tiny model, applied where the config class has the field
TINY: dict[str, Any] = {
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "intermediate_size": 64,
    "vocab_size": VOCAB,
    "max_position_embeddings": 64,
    "d_model": 32,
    "encoder_layers": 2,
    "decoder_layers": 2,
    "encoder_attention_heads": 2,
    "decoder_attention_heads": 2,
    "encoder_ffn_dim": 64,
    "decoder_ffn_dim": 64,
    "num_layers": 2,
    "num_heads": 2,
    "d_kv": 16,
    "d_ff": 64,
    "n_layer": 2,
    "n_head": 2,
    "n_embd": 32,
    "n_positions": 64,
    "embedding_size": 32,
    "pad_token_id": 0,
}


@dataclass(frozen=True)
class Arch:
    """One zoo entry: ``model``/``config`` are transformers class names; ``kind`` one of
    text, seq2seq, vision, audio, whisper, speech2text; ``overrides`` config fields."""

    name: str
    family: str
    model: str
    config: str
    kind: str
    overrides: dict[str, Any] = field(default_factory=dict)
    tiny: bool = True  # apply TINY (vision and audio models set their own sizes)


_LLAMA_LIKE = {"head_dim": 16}
_VISION = {
    "image_size": 32,
    "patch_size": 8,
    "num_channels": 3,
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "intermediate_size": 64,
}
_CONV_STAGES = {"num_channels": 3, "hidden_sizes": [8, 16], "depths": [1, 1], "num_stages": 2}
_W2V = {
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "intermediate_size": 64,
    "conv_dim": (16, 16),
    "conv_stride": (5, 2),
    "conv_kernel": (10, 3),
    "num_conv_pos_embeddings": 8,
    "num_conv_pos_embedding_groups": 2,
    "vocab_size": 32,
    "do_stable_layer_norm": True,
    "feat_extract_norm": "layer",
}

ARCHS: tuple[Arch, ...] = (
    # encoders
    Arch("bert", "encoder", "BertModel", "BertConfig", "text"),
    Arch("roberta", "encoder", "RobertaModel", "RobertaConfig", "text", {"pad_token_id": 1}),
    Arch("distilbert", "encoder", "DistilBertModel", "DistilBertConfig", "text", {"dim": 32, "hidden_dim": 64}),
    Arch("albert", "encoder", "AlbertModel", "AlbertConfig", "text"),
    Arch("electra", "encoder", "ElectraModel", "ElectraConfig", "text"),
    Arch("deberta-v2", "encoder", "DebertaV2Model", "DebertaV2Config", "text"),
    Arch("mpnet", "encoder", "MPNetModel", "MPNetConfig", "text"),
    Arch("xlm-roberta", "encoder", "XLMRobertaModel", "XLMRobertaConfig", "text", {"pad_token_id": 1}),
    Arch("megatron-bert", "encoder", "MegatronBertModel", "MegatronBertConfig", "text"),
    Arch(
        "mobilebert",
        "encoder",
        "MobileBertModel",
        "MobileBertConfig",
        "text",
        {"intra_bottleneck_size": 16, "true_hidden_size": 16},
    ),
    Arch("squeezebert", "encoder", "SqueezeBertModel", "SqueezeBertConfig", "text"),
    Arch("ernie", "encoder", "ErnieModel", "ErnieConfig", "text"),
    # decoders
    Arch("gpt2", "decoder", "GPT2LMHeadModel", "GPT2Config", "text"),
    Arch("llama", "decoder", "LlamaForCausalLM", "LlamaConfig", "text", _LLAMA_LIKE),
    Arch("mistral", "decoder", "MistralForCausalLM", "MistralConfig", "text", _LLAMA_LIKE),
    Arch("qwen2", "decoder", "Qwen2ForCausalLM", "Qwen2Config", "text"),
    Arch("qwen3", "decoder", "Qwen3ForCausalLM", "Qwen3Config", "text", _LLAMA_LIKE),
    Arch("phi", "decoder", "PhiForCausalLM", "PhiConfig", "text"),
    Arch("phi3", "decoder", "Phi3ForCausalLM", "Phi3Config", "text"),
    Arch("gemma", "decoder", "GemmaForCausalLM", "GemmaConfig", "text", _LLAMA_LIKE),
    Arch("gemma2", "decoder", "Gemma2ForCausalLM", "Gemma2Config", "text", _LLAMA_LIKE),
    Arch("opt", "decoder", "OPTForCausalLM", "OPTConfig", "text", {"ffn_dim": 64, "word_embed_proj_dim": 32}),
    Arch(
        "gpt-neo",
        "decoder",
        "GPTNeoForCausalLM",
        "GPTNeoConfig",
        "text",
        {"attention_types": [[["global", "local"], 1]], "window_size": 4},
    ),
    Arch("gpt-neox", "decoder", "GPTNeoXForCausalLM", "GPTNeoXConfig", "text"),
    Arch("gptj", "decoder", "GPTJForCausalLM", "GPTJConfig", "text", {"rotary_dim": 8}),
    Arch("bloom", "decoder", "BloomForCausalLM", "BloomConfig", "text"),
    Arch("falcon", "decoder", "FalconForCausalLM", "FalconConfig", "text"),
    Arch("stablelm", "decoder", "StableLmForCausalLM", "StableLmConfig", "text"),
    Arch("starcoder2", "decoder", "Starcoder2ForCausalLM", "Starcoder2Config", "text"),
    Arch("olmo2", "decoder", "Olmo2ForCausalLM", "Olmo2Config", "text"),
    Arch("codegen", "decoder", "CodeGenForCausalLM", "CodeGenConfig", "text", {"rotary_dim": 8}),
    Arch("cohere", "decoder", "CohereForCausalLM", "CohereConfig", "text", {"logit_scale": 1.0}),
    Arch("granite", "decoder", "GraniteForCausalLM", "GraniteConfig", "text"),
    # mixture of experts
    Arch("mixtral", "moe", "MixtralForCausalLM", "MixtralConfig", "text", {"num_local_experts": 4, "num_experts_per_tok": 2}),
    Arch(
        "qwen2-moe",
        "moe",
        "Qwen2MoeForCausalLM",
        "Qwen2MoeConfig",
        "text",
        {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "shared_expert_intermediate_size": 32},
    ),
    Arch("olmoe", "moe", "OlmoeForCausalLM", "OlmoeConfig", "text", {"num_experts": 4, "num_experts_per_tok": 2}),
    Arch(
        "qwen3-moe",
        "moe",
        "Qwen3MoeForCausalLM",
        "Qwen3MoeConfig",
        "text",
        {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "head_dim": 16},
    ),
    # encoder-decoder
    Arch("t5", "seq2seq", "T5Model", "T5Config", "seq2seq"),
    Arch("mt5", "seq2seq", "MT5Model", "MT5Config", "seq2seq"),
    Arch("bart", "seq2seq", "BartModel", "BartConfig", "seq2seq"),
    Arch("mbart", "seq2seq", "MBartModel", "MBartConfig", "seq2seq"),
    Arch("pegasus", "seq2seq", "PegasusModel", "PegasusConfig", "seq2seq"),
    Arch("marian", "seq2seq", "MarianModel", "MarianConfig", "seq2seq", {"decoder_start_token_id": 0}),
    Arch("m2m100", "seq2seq", "M2M100Model", "M2M100Config", "seq2seq"),
    Arch("blenderbot", "seq2seq", "BlenderbotModel", "BlenderbotConfig", "seq2seq"),
    # vision
    Arch("vit", "vision", "ViTModel", "ViTConfig", "vision", _VISION, tiny=False),
    Arch("deit", "vision", "DeiTModel", "DeiTConfig", "vision", _VISION, tiny=False),
    Arch("beit", "vision", "BeitModel", "BeitConfig", "vision", {**_VISION, "use_relative_position_bias": True}, tiny=False),
    Arch("dinov2", "vision", "Dinov2Model", "Dinov2Config", "vision", _VISION, tiny=False),
    Arch("convnext", "vision", "ConvNextModel", "ConvNextConfig", "vision", _CONV_STAGES, tiny=False),
    Arch("convnextv2", "vision", "ConvNextV2Model", "ConvNextV2Config", "vision", _CONV_STAGES, tiny=False),
    Arch(
        "swin",
        "vision",
        "SwinModel",
        "SwinConfig",
        "vision",
        {"image_size": 32, "patch_size": 4, "embed_dim": 16, "depths": [1, 1], "num_heads": [2, 2], "window_size": 4},
        tiny=False,
    ),
    Arch(
        "resnet",
        "vision",
        "ResNetModel",
        "ResNetConfig",
        "vision",
        {"embedding_size": 8, "hidden_sizes": [8, 16], "depths": [1, 1], "layer_type": "basic"},
        tiny=False,
    ),
    Arch(
        "regnet",
        "vision",
        "RegNetModel",
        "RegNetConfig",
        "vision",
        {"embedding_size": 8, "hidden_sizes": [8, 16], "depths": [1, 1], "groups_width": 8},
        tiny=False,
    ),
    Arch(
        "mobilenet-v2",
        "vision",
        "MobileNetV2Model",
        "MobileNetV2Config",
        "vision",
        {"image_size": 32, "depth_multiplier": 0.25},
        tiny=False,
    ),
    Arch(
        "segformer",
        "vision",
        "SegformerModel",
        "SegformerConfig",
        "vision",
        {
            "num_encoder_blocks": 2,
            "depths": [1, 1],
            "sr_ratios": [2, 1],
            "hidden_sizes": [8, 16],
            "num_attention_heads": [1, 2],
            "patch_sizes": [7, 3],
            "strides": [4, 2],
            "mlp_ratios": [2, 2],
        },
        tiny=False,
    ),
    Arch(
        "poolformer",
        "vision",
        "PoolFormerModel",
        "PoolFormerConfig",
        "vision",
        {
            "hidden_sizes": [8, 16],
            "depths": [1, 1],
            "num_encoder_blocks": 2,
            "patch_sizes": [7, 3],
            "strides": [4, 2],
            "padding": [2, 1],
        },
        tiny=False,
    ),
    # audio
    Arch("wav2vec2", "audio", "Wav2Vec2Model", "Wav2Vec2Config", "audio", _W2V, tiny=False),
    Arch("hubert", "audio", "HubertModel", "HubertConfig", "audio", _W2V, tiny=False),
    Arch("wavlm", "audio", "WavLMModel", "WavLMConfig", "audio", _W2V, tiny=False),
    Arch(
        "whisper",
        "audio",
        "WhisperModel",
        "WhisperConfig",
        "whisper",
        {"num_mel_bins": 16, "max_source_positions": 16, "max_target_positions": 32},
    ),
)

BY_NAME = {a.name: a for a in ARCHS}


def build(arch: Arch) -> torch.nn.Module:
    import transformers as tr

    cfg_cls = getattr(tr, arch.config)
    base = cfg_cls()
    kw = {k: v for k, v in TINY.items() if arch.tiny and hasattr(base, k)}
    kw.update(arch.overrides)
    cfg = cfg_cls(**kw)
    torch.manual_seed(0)
    m = getattr(tr, arch.model)(cfg).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float32).mul_(0.1).to(p.dtype))
    return m


def _ids(g: torch.Generator, batch: int, seq: int) -> torch.Tensor:
    return torch.randint(3, VOCAB, (batch, seq), generator=g)


def inputs(arch: Arch, size: int, seed: int = 0) -> dict[str, Any]:
    """The model's keyword inputs with the dynamic dimension at ``size``."""
    g = torch.Generator().manual_seed(seed + size)
    k = arch.kind
    if k in ("text", "seq2seq"):
        ids = _ids(g, 2, size)
        am = torch.ones(2, size, dtype=torch.long)
        am[0, max(1, size - 2) :] = 0
        kw: dict[str, Any] = {"input_ids": ids, "attention_mask": am}
        if k == "seq2seq":
            kw["decoder_input_ids"] = _ids(g, 2, size)
        if arch.family in ("decoder", "moe") or k == "seq2seq":
            kw["use_cache"] = False
        return kw
    if k == "vision":
        return {"pixel_values": torch.randn(size, 3, 32, 32, generator=g)}
    if k == "audio":
        return {"input_values": torch.randn(2, size * 40, generator=g)}
    if k == "whisper":
        return {"input_features": torch.randn(2, 16, 32, generator=g), "decoder_input_ids": _ids(g, 2, size), "use_cache": False}
    raise KeyError(k)


#: the two sizes of the dynamic dimension each kind runs at (the first is the export's)
SIZES = {"text": (8, 13), "seq2seq": (8, 13), "vision": (2, 3), "audio": (10, 14), "whisper": (5, 9)}


def dynamic(arch: Arch) -> tuple[str, dict[str, Any]]:
    """The dynamic dimension's description and the ``dynamic_shapes`` for it."""
    k = arch.kind
    kw = inputs(arch, SIZES[k][0])
    dyn: dict[str, Any] = {n: None for n in kw}
    if k in ("text", "seq2seq"):
        s = torch.export.Dim("seq", min=3, max=32)
        dyn["input_ids"] = {1: s}
        dyn["attention_mask"] = {1: s}
        if k == "seq2seq":
            dyn["decoder_input_ids"] = {1: torch.export.Dim("dec", min=3, max=32)}
        return "sequence length", dyn
    if k == "vision":
        dyn["pixel_values"] = {0: torch.export.Dim("batch", min=1, max=8)}
        return "batch", dyn
    if k == "audio":
        dyn["input_values"] = {1: torch.export.Dim.AUTO}
        return "waveform length", dyn
    dyn["decoder_input_ids"] = {1: torch.export.Dim("dec", min=3, max=16)}
    return "decoder length", dyn


def export(arch: Arch, m: torch.nn.Module) -> torch.export.ExportedProgram:
    """The training-IR program (``torch.export.export``'s default) with the dynamic dim."""
    _, dyn = dynamic(arch)
    return torch.export.export(m, (), inputs(arch, SIZES[arch.kind][0]), dynamic_shapes=dyn)


def scale(out: Any) -> float:
    """The largest magnitude among torch's floating outputs (how far from zero they are)."""
    vals = [
        float(t.detach().abs().max()) for t in leaves(out) if isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel()
    ]
    return max(vals, default=0.0)


def leaves(out: Any) -> list[Any]:
    """The output's tensors in order: a ModelOutput's values by key, tuples flattened."""
    if hasattr(out, "to_tuple"):
        out = out.to_tuple()
    elif isinstance(out, dict):
        out = tuple(out.values())
    if isinstance(out, (tuple, list)):
        return [leaf for o in out for leaf in leaves(o)]
    return [] if out is None else [out]


def compare(got: Any, want: Any) -> tuple[bool, float, str]:
    """(matches, largest abs difference, what differs) of torchless's output against
    torch's: floating tensors within rtol 1e-4 / atol 1e-5, ints and bools exact."""
    import numpy as np

    g, w = leaves(got), leaves(want)
    if len(g) != len(w):
        return False, float("inf"), f"{len(g)} outputs, torch {len(w)}"
    worst = 0.0
    for i, (a, b) in enumerate(zip(g, w, strict=True)):
        b = b.detach().numpy() if isinstance(b, torch.Tensor) else np.asarray(b)
        a = np.asarray(a)
        if a.shape != b.shape or a.dtype != b.dtype:
            return False, float("inf"), f"output {i}: {a.dtype}{list(a.shape)}, torch {b.dtype}{list(b.shape)}"
        if a.size == 0:
            continue
        if np.issubdtype(b.dtype, np.floating):
            a64, b64 = a.astype(np.float64), b.astype(np.float64)
            worst = max(worst, float(np.nanmax(np.abs(a64 - b64))) if np.isfinite(b64).all() else 0.0)
            if not np.allclose(a64, b64, rtol=1e-4, atol=1e-5, equal_nan=True):
                return False, worst, f"output {i} differs"
        elif not np.array_equal(a, b):
            return False, float("inf"), f"output {i} ({b.dtype}) differs"
    return True, worst, ""


def run(arch: Arch, ir: str, path: str, m: torch.nn.Module | None = None, ep: Any = None) -> list[tuple[int, bool, float, str]]:
    """Export ``arch`` (or reuse ``m`` and its training-IR ``ep``) in ``ir`` ("training" or
    "aten"), save it at ``path``, run it with torchless at both sizes and compare with
    eager torch: one (size, matches, max abs difference, what differs) per size."""
    if m is None:
        m = build(arch)
    if ep is None:
        ep = export(arch, m)
    if ir == "aten":
        ep = ep.run_decompositions()
    torch.export.save(ep, path)
    return run_saved(arch, path, m)


def run_saved(arch: Arch, path: str, m: torch.nn.Module) -> list[tuple[int, bool, float, str]]:
    """Run the saved program at ``path`` with torchless at both sizes against ``m``: one
    (size, matches, max abs difference, what differs) per size."""
    import torchless

    module = torchless.load(path).module()
    rows = []
    for size in SIZES[arch.kind]:
        kw = inputs(arch, size)
        got = module(**{k: v.numpy() if isinstance(v, torch.Tensor) else v for k, v in kw.items()})
        with torch.no_grad():
            want = m(**kw)
        ok, err, why = compare(got, want)
        rows.append((size, ok, err, why))
    return rows
