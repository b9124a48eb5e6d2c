"""How Megatron-LM lays out a legacy (non-distributed) checkpoint, and how its tensor-
and pipeline-parallel pieces go back together (light: imported by detection).

``megatron/training/checkpointing.py`` writes ``<save>/latest_checkpointed_iteration.txt``
(the iteration as text, or ``release``) and ``<save>/iter_<7 digits>/`` (or ``release/``)
holding one folder per model-parallel rank: ``mp_rank_<TP:02d>`` without pipeline
parallelism, ``mp_rank_<TP:02d>_<PP:03d>`` with it, each with ``model_optim_rng.pt``
(``torch.save`` of ``{"args": Namespace, "checkpoint_version", "iteration", "model":
state dict, "optimizer", "opt_param_scheduler", "rng_state"}``).

Each rank holds its slice of the tensor-parallel weights (``megatron/core/tensor_parallel/
layers.py``): column-parallel linears (fused QKV, MLP fc1, the output layer) and the
vocab-parallel embedding are split on dim 0, row-parallel linears (attention projection,
MLP fc2) on dim 1; norms and row-parallel biases are whole on every rank. The fused QKV
of Megatron core is laid out per query group ([group, q.. k v, head dim]) and groups are
split between ranks, so dim-0 concatenation restores it. With SwiGLU each rank's fc1 is
``[gate slice; up slice]``: the merged fc1 is ``[all gates; all ups]``. The vocabulary is
padded to a multiple of ``make_vocab_size_divisible_by * TP`` (``args.padded_vocab_size``):
the merged embedding keeps the padding, as Megatron's own loader does. Pipeline stages
number their layers from 0: the merged model renumbers ``layers.<i>`` by the layers of
the stages before.
"""

from __future__ import annotations

import re

__all__ = ["TRACKER", "RELEASE", "ITER_RE", "RANK_RE", "RANK_FILE", "iter_folder", "rank_folder", "split_dim", "LAYER_RE"]

TRACKER = "latest_checkpointed_iteration.txt"
RELEASE = "release"
ITER_RE = re.compile(r"^iter_(\d{7})$")
RANK_RE = re.compile(r"^mp_rank_(\d{2})(?:_(\d{3}))?$")
RANK_FILE = "model_optim_rng.pt"
#: ``layers.<i>.`` anywhere in a dotted name (``decoder.layers.3.mlp...``,
#: ``language_model.encoder.layers.3...``)
LAYER_RE = re.compile(r"(?:^|\.)layers\.(\d+)\.")

#: name endings split on dim 0 (column-parallel, vocab-parallel): Megatron core, then legacy
_DIM0 = (
    "linear_qkv.weight",
    "linear_qkv.bias",
    "linear_fc1.weight",
    "linear_fc1.bias",
    "word_embeddings.weight",
    "output_layer.weight",
    "query_key_value.weight",
    "query_key_value.bias",
    "dense_h_to_4h.weight",
    "dense_h_to_4h.bias",
)
#: name endings split on dim 1 (row-parallel)
_DIM1 = ("linear_proj.weight", "linear_fc2.weight", "attention.dense.weight", "dense_4h_to_h.weight")
#: the fc1 names whose halves are gate and up under SwiGLU
SWIGLU_NAMES = ("linear_fc1.weight", "linear_fc1.bias", "dense_h_to_4h.weight", "dense_h_to_4h.bias")


def iter_folder(iteration: int | str) -> str:
    """``iter_0000100`` (or ``release``)."""
    return RELEASE if iteration == RELEASE else f"iter_{int(iteration):07d}"


def rank_folder(tp: int, pp: int | None) -> str:
    """``mp_rank_01`` (no pipeline parallelism) or ``mp_rank_01_002``."""
    return f"mp_rank_{tp:02d}" if pp is None else f"mp_rank_{tp:02d}_{pp:03d}"


def split_dim(name: str) -> int | None:
    """The dim a tensor-parallel tensor is split on, or None (whole on every rank)."""
    if name.endswith(_DIM0):
        return 0
    if name.endswith(_DIM1):
        return 1
    return None
