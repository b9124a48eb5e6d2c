"""The layout facts of a DeepSpeed ZeRO checkpoint (deepspeed 0.19.8, ``zero_to_fp32``).

A checkpoint root holds ``latest`` (the tag's name) and one folder per tag. A tag folder
holds the model states (``mp_rank_00_model_states.pt`` for stages 1 and 2, one
``zero_pp_rank_<r>_mp_rank_00_model_states.pt`` per rank for stage 3) and one
``*_optim_states.pt`` per data-parallel rank, each a ``torch.save`` zip checkpoint.
"""

from __future__ import annotations

import math
import os
import re

__all__ = [
    "BUFFER_NAMES",
    "DS_GLOBALS",
    "EXPERT_FILE",
    "EXPERT_KEY",
    "GATE_KEY",
    "LAYER_FILE",
    "MP_MODEL_FILE",
    "FP32_FLAT_GROUPS",
    "FROZEN_PARAM_FRAGMENTS",
    "FROZEN_PARAM_SHAPES",
    "LATEST",
    "MODEL_SUFFIX",
    "OPTIM_SUFFIX",
    "OPTIMIZER_STATE_DICT",
    "PARAM_ALIGNMENT_PADDINGS",
    "PARAM_SHAPES",
    "PARTITION_COUNT",
    "SHARED_PARAMS",
    "SINGLE_PARTITION_OF_FP32_GROUPS",
    "ZERO_STAGE",
    "natural_key",
    "rank_files",
    "zero2_align",
    "zero3_partitioned_numel",
]

#: the file naming the current tag, in the checkpoint root
LATEST = "latest"
MODEL_SUFFIX = "_model_states.pt"
OPTIM_SUFFIX = "_optim_states.pt"

# the keys of the rank files (deepspeed/checkpoint/constants.py)
OPTIMIZER_STATE_DICT = "optimizer_state_dict"
FP32_FLAT_GROUPS = "fp32_flat_groups"  # stage 3
SINGLE_PARTITION_OF_FP32_GROUPS = "single_partition_of_fp32_groups"  # stages 1, 2
PARAM_ALIGNMENT_PADDINGS = "param_alignment_paddings"
PARTITION_COUNT = "partition_count"
ZERO_STAGE = "zero_stage"
PARAM_SHAPES = "param_shapes"
BUFFER_NAMES = "buffer_names"
FROZEN_PARAM_SHAPES = "frozen_param_shapes"
FROZEN_PARAM_FRAGMENTS = "frozen_param_fragments"
SHARED_PARAMS = "shared_params"
DS_VERSION = "ds_version"
#: AutoEP ZeRO-3 partition-native experts: zero_to_fp32 refuses them, so does torchless
AUTOEP_LAYERS_KEYS = ("ds_autoep_layers", "autoep_layers")
AUTOEP_FORMAT_KEY = "checkpoint_format"
AUTOEP_PARTITIONED = "zero3_partitioned"

#: the framework classes DeepSpeed pickles into its rank files. Opened under
#: ``weights_only=True`` they are accepted as inert placeholders (never imported, never
#: called), as ``allowed_globals`` would; any other class is still refused.
DS_GLOBALS = frozenset(
    {
        "deepspeed.runtime.fp16.loss_scaler.LossScaler",
        "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler",
        "deepspeed.runtime.zero.config.ZeroStageEnum",
        "deepspeed.utils.tensor_fragment.fragment_address",
        "argparse.Namespace",  # a training script's parsed arguments, where given to DeepSpeed
    }
)

#: the model states' parts ``info`` names (key -> what it is)
PARTS = {
    "module": "model",
    "optimizer": "optimizer (client)",
    "lr_scheduler": "lr_scheduler",
    "data_sampler": "data_sampler",
    "random_ltd": "random_ltd",
    "sparse_tensor_module_names": "sparse_tensor_module_names",
    "ds_config": "ds_config",
}

#: a pipeline-parallel layer's file: ``layer_<idx:02d>[-<rank repr>]-model_states.pt``
#: (``PipelineModule.ckpt_layer_path``; the rank repr names tensor-parallel coordinates)
LAYER_FILE = re.compile(r"^layer_(\d+)(-[^/]*)?-model_states\.pt$")
#: an MoE expert's file: ``layer_<moe layer>_expert_<global id>_mp_rank_<mp:02d>_model_states.pt``,
#: or the older ``expert_<global id>_mp_rank_<mp:02d>_model_states.pt`` (``_get_expert_ckpt_name``)
EXPERT_FILE = re.compile(r"^(?:layer_(\d+)_)?expert_(\d+)_mp_rank_(\d+)_model_states\.pt$")
#: the key fragment naming an expert in an MoE layer's state dict, followed by its id
EXPERT_KEY = ".deepspeed_moe.experts.deepspeed_experts."
#: the MoE gate's weight (``<layer>.deepspeed_moe.gate.wg.weight``): one row per expert
GATE_KEY = ".deepspeed_moe.gate.wg.weight"
#: the model states of one model-parallel (here: pipeline-stage) rank, stages 1 and 2
MP_MODEL_FILE = re.compile(r"^mp_rank_(\d+)_model_states\.pt$")
MP_WORLD_SIZE = "mp_world_size"
DP_WORLD_SIZE = "dp_world_size"

_DIGITS = re.compile(r"(\d+)")


def natural_key(name: str) -> list[object]:
    """zero_to_fp32's sort order of rank files (``rank_10`` after ``rank_9``)."""
    return [int(c) if c.isdigit() else c for c in _DIGITS.split(name)]


def rank_files(folder: str, suffix: str) -> list[str]:
    """The names in ``folder`` ending with ``suffix``, in zero_to_fp32's order."""
    return sorted((n for n in os.listdir(folder) if n.endswith(suffix)), key=natural_key)


def zero3_partitioned_numel(numel: int, world_size: int) -> int:
    """Elements of one parameter on each rank in stage 3 (the last rank's share padded)."""
    return math.ceil(numel / world_size)


def zero2_align(n: int, world_size: int) -> int:
    """``n`` rounded up to the 2 * world_size alignment of stage 1/2 flat groups."""
    a = 2 * world_size
    return a * math.ceil(n / a)
