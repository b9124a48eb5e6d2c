"""How training frameworks name what they save (light: imported by detection).

Hugging Face ``Trainer`` (``transformers/trainer.py``, ``_save_checkpoint``) writes
``checkpoint-<global step>/``: the model as ``save_pretrained`` writes it (see
``formats/hf/spec.py``), ``optimizer.pt`` (``optimizer.state_dict()``), ``scheduler.pt``
(``lr_scheduler.state_dict()``), ``rng_state.pth`` (or ``rng_state_<rank>.pth``: the
python / numpy / cpu / cuda generators), ``scaler.pt``, ``trainer_state.json`` (global
step, epoch, log history) and ``training_args.bin`` (``torch.save`` of the
``TrainingArguments`` object: read as an inert placeholder, never imported).

Accelerate's ``Accelerator.save_state`` (``accelerate/checkpointing.py``) writes
``model.safetensors`` (``model_<i>.safetensors`` for further models; ``pytorch_model*.bin``
without safe serialization), ``optimizer.bin`` (``optimizer_<i>.bin``), ``scheduler.bin``,
``sampler.bin``, ``scaler.pt``, ``random_states_<process>.pkl`` (a ``torch.save`` too), and
under FSDP's sharded state dict a DCP folder ``pytorch_model_fsdp_0/`` holding
``{"model": state_dict}``.

Lightning's ``Trainer.save_checkpoint`` (``_checkpoint_connector.dump_checkpoint``) writes
one ``torch.save`` of a dict with ``epoch``, ``global_step``,
``pytorch-lightning_version``, ``state_dict``, ``loops``, ``callbacks``,
``optimizer_states``, ``lr_schedulers``, and when saved ``hyper_parameters``.
"""

from __future__ import annotations

import re

__all__ = [
    "TRAINER_STATE",
    "TRAINING_ARGS",
    "TRAINER_OPTIMIZER",
    "TRAINER_SCHEDULER",
    "RNG_RE",
    "ACCEL_OPTIMIZER_RE",
    "ACCEL_SCHEDULER_RE",
    "ACCEL_RNG_RE",
    "FSDP_MODEL_RE",
    "FSDP_MODEL_KEY",
    "LIGHTNING_VERSION_KEY",
    "LIGHTNING_STATE_DICT",
    "LIGHTNING_KEYS",
    "MAX_STATE_JSON",
]

TRAINER_STATE = "trainer_state.json"
TRAINING_ARGS = "training_args.bin"
TRAINER_OPTIMIZER = "optimizer.pt"
TRAINER_SCHEDULER = "scheduler.pt"
#: ``rng_state.pth`` (one process) or ``rng_state_<rank>.pth``
RNG_RE = re.compile(r"^rng_state(?:_\d+)?\.pth$")
ACCEL_OPTIMIZER_RE = re.compile(r"^optimizer(?:_\d+)?\.bin$")
ACCEL_SCHEDULER_RE = re.compile(r"^scheduler(?:_\d+)?\.bin$")
ACCEL_RNG_RE = re.compile(r"^random_states_\d+\.pkl$")
#: Accelerate's FSDP sharded model folders (a DCP checkpoint each)
FSDP_MODEL_RE = re.compile(r"^pytorch_model_fsdp_\d+$")
#: the top-level key Accelerate gives the model's state dict inside that DCP folder
FSDP_MODEL_KEY = "model"
#: the key every Lightning checkpoint carries (both ``lightning`` and ``pytorch_lightning``)
LIGHTNING_VERSION_KEY = "pytorch-lightning_version"
LIGHTNING_STATE_DICT = "state_dict"
#: the other keys ``dump_checkpoint`` writes (described when present)
LIGHTNING_KEYS = ("epoch", "global_step", "loops", "callbacks", "optimizer_states", "lr_schedulers", "hyper_parameters")
#: trainer_state.json holds the log history: bounded
MAX_STATE_JSON = 256 << 20
