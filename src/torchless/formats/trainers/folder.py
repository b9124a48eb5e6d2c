"""Hugging Face Trainer and Accelerate checkpoint folders read as one artifact.

The artifact's tensors are the model's (the weights ``save_pretrained`` wrote, read by
:class:`~torchless.formats.hf.read.HFArtifact`, or Accelerate's FSDP DCP folder with its
``model.`` prefix removed); with ``include_optimizer=True`` the optimizer states follow
as ``optimizer.state.<param id>.<key>`` (``optimizer_1.state...`` for a second
optimizer). Everything else (scheduler, RNG states, training arguments, trainer state) is
described by :meth:`TrainerArtifact.info`. Side files are read by the safe pickle machine
with placeholders for what they name (:func:`.common.placeholder_policy`); the
``TrainingArguments`` object is never imported.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from typing import Any

from ...core import jsonsafe
from ...core.errors import FormatError, LimitError, NotFoundError, TorchlessError, UsageError
from ...core.findings import Problem
from ...core.tree import describe
from ...io.paths import confine, confined_file
from ...io.store import Store
from ..base import Artifact, LoadPolicy, summarize_tensors
from ..hf.spec import is_hf_folder
from ..ranks import member_problems
from . import spec
from .common import class_name, describe_optimizer, describe_scheduler, optimizer_tensors, placeholder_policy, scalar

__all__ = ["TrainerArtifact", "side_files", "is_trainer_folder"]

#: training arguments shown by ``info`` (all of them are in ``load_side(...)``)
_ARGS_SHOWN = (
    "learning_rate",
    "max_steps",
    "num_train_epochs",
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "weight_decay",
    "warmup_steps",
    "seed",
    "bf16",
    "fp16",
    "save_steps",
)
_STATE_SHOWN = (
    "global_step",
    "epoch",
    "max_steps",
    "num_train_epochs",
    "train_batch_size",
    "best_metric",
    "best_model_checkpoint",
)


def side_files(names: list[str]) -> dict[str, list[str]]:
    """The framework files among ``names``, by role."""
    return {
        "optimizer": [n for n in names if n == spec.TRAINER_OPTIMIZER or spec.ACCEL_OPTIMIZER_RE.match(n)],
        "scheduler": [n for n in names if n == spec.TRAINER_SCHEDULER or spec.ACCEL_SCHEDULER_RE.match(n)],
        "rng": [n for n in names if spec.RNG_RE.match(n) or spec.ACCEL_RNG_RE.match(n)],
        "training_args": [n for n in names if n == spec.TRAINING_ARGS],
        "trainer_state": [n for n in names if n == spec.TRAINER_STATE],
    }


def is_trainer_folder(folder: Any, store: Store) -> bool:
    """A Trainer or Accelerate checkpoint folder holding a model: a trainer file
    (``trainer_state.json``, ``training_args.bin``, ``random_states_N.pkl``,
    ``optimizer.bin``...) beside the model's weights or an FSDP DCP model folder. A folder
    without the model (a DeepSpeed checkpoint's, whose weights are in ``global_stepN/``) is
    left to other handlers. ``store``: the store holding ``folder``."""
    p = os.fspath(folder)
    if store.remote:
        return False
    try:
        names = os.listdir(p)
    except OSError:
        return False
    roles = side_files(names)
    if not (roles["trainer_state"] or roles["training_args"] or roles["rng"] or roles["optimizer"]):
        return False
    return any(spec.FSDP_MODEL_RE.match(n) for n in names) or is_hf_folder(p, store)


class TrainerArtifact(Artifact):
    """A ``checkpoint-N/`` folder of ``transformers.Trainer``, or an ``Accelerator.save_state`` folder.

    Attributes:
        folder: the folder.
        framework: ``"transformers.Trainer"`` (a trainer_state.json or training_args.bin)
            or ``"accelerate"``.
        files: the framework files by role (:func:`side_files`).
        state: the parsed trainer_state.json, or None.
        model: the model's weights as an artifact (``hf`` or ``dcp``), or None.
        model_source: what the model was read from (file or folder names).
    """

    format = "trainer"

    def __init__(
        self, path: Any, policy: LoadPolicy | None = None, *, include_optimizer: bool = False, store: Any = None
    ) -> None:
        super().__init__(path, policy, store=store)
        if type(include_optimizer) is not bool:
            raise UsageError("include_optimizer must be True or False", found=repr(include_optimizer)[:40])
        self.include_optimizer = include_optimizer
        p = self.path
        if self.store.remote:
            raise UsageError("a training checkpoint folder is read from a local folder", path=p)
        if not os.path.isdir(p):
            if not os.path.exists(p):
                raise NotFoundError("no such file or directory", path=p)
            raise FormatError("a training checkpoint is a folder", path=p, expected="checkpoint-N/ or a save_state folder")
        self.folder = p
        names = sorted(os.listdir(p))
        self.files = side_files(names)
        self.framework = "transformers.Trainer" if self.files["trainer_state"] or self.files["training_args"] else "accelerate"
        self.state: dict[str, Any] | None = self._read_state() if self.files["trainer_state"] else None
        self._side: dict[str, Artifact] = {}
        self.model: Artifact | None = None
        self.model_source: list[str] = []
        self._strip = ""
        fsdp = [n for n in names if spec.FSDP_MODEL_RE.match(n) and os.path.isdir(os.path.join(p, n))]
        if is_hf_folder(p, self.store):
            from ..hf.read import HFArtifact

            hf = HFArtifact(p, self.policy, store=self.store)
            self.model = hf
            self.model_source = ([hf.index] if hf.index else []) + list(hf.shard_files)
        elif fsdp:
            from ..dcp.artifact import DCPArtifact

            where = confine(p, fsdp[0], what="FSDP model folder", path=p, member=fsdp[0])
            self.model = DCPArtifact(where, self.policy, store=self.store)
            self.model_source = [fsdp[0]]
            self._strip = spec.FSDP_MODEL_KEY + "."
        self._tensors: list[tuple[str, Any]] | None = None

    # -- side files ----------------------------------------------------------------
    def _read_state(self) -> dict[str, Any]:
        where = os.path.join(self.folder, spec.TRAINER_STATE)
        real = confined_file(self.folder, spec.TRAINER_STATE, what="trainer state", path=where)
        size = os.path.getsize(real)
        if size > spec.MAX_STATE_JSON:
            raise LimitError("trainer_state.json too large", path=where, expected=f"<= {spec.MAX_STATE_JSON} bytes", found=size)
        with open(real, "rb") as f:
            data = jsonsafe.loads(f.read(), what="trainer state", path=where, max_bytes=spec.MAX_STATE_JSON, max_depth=16)
        if not isinstance(data, dict):
            raise FormatError("trainer_state.json is not a JSON object", path=where, found=type(data).__name__)
        return data

    def load_side(self, name: str) -> Any:
        """The object tree of side file ``name`` (``optimizer.pt``, ``rng_state.pth``...),
        read with placeholders for what it names (never imported), tensors lazy."""
        if name in self._side:
            return self._side[name].load()
        if not any(name in v for k, v in self.files.items() if k != "trainer_state"):
            raise NotFoundError(f"no framework file named {name!r}", path=self.folder)
        from ..pt.handler import PtArtifact

        real = confined_file(self.folder, name, what="checkpoint file", path=self.folder, member=name)
        art = PtArtifact(real, placeholder_policy(self.policy))
        self._side[name] = art
        return art.load()

    # -- Artifact ------------------------------------------------------------------
    def tensors(self) -> Iterator[tuple[str, Any]]:
        if self._tensors is None:
            out: list[tuple[str, Any]] = []
            if self.model is not None:
                cut = len(self._strip)
                for n, t in self.model.tensors():
                    out.append((n[cut:] if cut and n.startswith(self._strip) else n, t))
            if self.include_optimizer:
                for f in self.files["optimizer"]:
                    out += list(optimizer_tensors(self.load_side(f), f.rsplit(".", 1)[0]))
            self._tensors = out
        return iter(self._tensors)

    def _describe(self, role: str, name: str) -> dict[str, Any]:
        try:
            obj = self.load_side(name)
        except TorchlessError as e:
            return {"file": name, "error": str(e)}
        if role == "optimizer":
            return {"file": name, **describe_optimizer(obj)}
        if role == "scheduler":
            return {"file": name, **describe_scheduler(obj)}
        if role == "rng":
            gens = list(obj) if isinstance(obj, Mapping) else []
            return {"file": name, "generators": [str(g) for g in gens]}
        # training arguments: a TrainingArguments placeholder
        attrs = getattr(obj, "attrs", None)
        shown = {k: scalar(attrs[k]) for k in _ARGS_SHOWN if isinstance(attrs, dict) and k in attrs}
        return {"file": name, "class": class_name(obj), **shown}

    def info(self) -> dict[str, Any]:
        out: dict[str, Any] = {"format": self.format, "path": self.path, "framework": self.framework}
        if self.state is not None:
            for k in _STATE_SHOWN:
                if k in self.state:
                    out[k] = scalar(self.state[k])
            hist = self.state.get("log_history")
            out["log_history_entries"] = len(hist) if isinstance(hist, list) else None
        model_tensors = [(n, t) for n, t in self.tensors() if not self._is_optimizer_name(n)]
        out["model"] = {"source": self.model_source, "format": self.model.format if self.model else None}
        if self.model is None:
            out["model"]["note"] = "no model weights in this folder"
        out.update(summarize_tensors(model_tensors))
        out["parameter_count"] = out["elements"]  # a state dict's tensors: parameters and buffers
        for role in ("optimizer", "scheduler", "rng", "training_args"):
            out[role] = [self._describe(role, n) for n in self.files[role]]
        out["tree"] = describe({"model": dict(model_tensors)}, max_items=8)
        return out

    def _is_optimizer_name(self, name: str) -> bool:
        return self.include_optimizer and any(name.startswith(f.rsplit(".", 1)[0] + ".state.") for f in self.files["optimizer"])

    def verify(self) -> list[Problem]:
        problems: list[Problem] = []
        if self.model is not None:
            problems += self.model.verify()
        else:
            problems.append(Problem("no-model", "the folder holds no model weights", None, None, "warning"))
        for role in ("optimizer", "scheduler", "rng", "training_args"):
            for name in self.files[role]:
                try:
                    self.load_side(name)
                except TorchlessError as e:
                    problems.append(Problem(role, str(e), name))
        problems += member_problems(self._side.items())
        return problems

    def convert_to(
        self,
        dst: Any,
        *,
        format: str,
        progress: Any = None,
        strict: bool = False,
        options: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """The model's tensors into ``dst`` (with ``include_optimizer``, the optimizer
        states too); the other framework files are reported as dropped."""
        from ..hf.write import convert_tensors

        dropped = [
            {"key": n, "type": role}
            for role in ("optimizer", "scheduler", "rng", "training_args", "trainer_state")
            for n in self.files[role]
            if not (role == "optimizer" and self.include_optimizer)
        ]
        return convert_tensors(
            list(self.tensors()),
            dst,
            format=format,
            progress=progress,
            strict=strict,
            dropped=dropped,
            source=self.path,
            options=options,
        )

    def close(self) -> None:
        if self.model is not None:
            self.model.close()
        for art in self._side.values():
            art.close()
        self._side.clear()
