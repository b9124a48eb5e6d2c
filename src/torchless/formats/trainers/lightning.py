"""Lightning ``.ckpt`` files: one ``torch.save`` of the dict ``dump_checkpoint`` builds.

Recognised from the dict's keys as the safe pickle machine computes them (a
``pytorch-lightning_version`` and a ``state_dict`` mapping), never from the extension.
The artifact's tensors are the ``state_dict``'s, named as the LightningModule names them
(``model.0.weight`` for an attribute ``self.model``); ``strip_prefix`` removes a prefix:
a string (``"model."``) from the names that start with it, or True for the first dotted
component when every name shares it. The optimizer states are listed with
``include_optimizer=True`` as ``optimizer_states.<i>.state.<param id>.<key>``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from ...container.zip import is_zip
from ...core.errors import FormatError, TorchlessError, UsageError
from ...core.findings import Problem
from ...core.tree import describe, is_tensor, iter_tensors
from ..base import Artifact, LoadPolicy, Probe, summarize_tensors
from ..pt.spec import DATA_PKL
from ..torchscript.spec import is_checkpoint_zip
from . import spec
from .common import class_name, describe_optimizer, describe_scheduler, optimizer_tensors, placeholder_policy, scalar

__all__ = ["LightningArtifact", "is_lightning_dict", "may_be_lightning", "MAX_SNIFF_PICKLE"]

#: detection reads a zip checkpoint's data.pkl up to this size for the version key
MAX_SNIFF_PICKLE = 64 << 20
_KEY = spec.LIGHTNING_VERSION_KEY.encode()


def is_lightning_dict(obj: Any) -> bool:
    """The top-level object of a Lightning checkpoint: a mapping with the version key and
    a ``state_dict`` mapping."""
    return (
        isinstance(obj, Mapping) and spec.LIGHTNING_VERSION_KEY in obj and isinstance(obj.get(spec.LIGHTNING_STATE_DICT), Mapping)
    )


def may_be_lightning(probe: Probe) -> bool:
    """A torch zip checkpoint whose ``data.pkl`` holds the version key's bytes (the
    cheap test before the pickle is run)."""
    if probe.is_dir or not is_zip(probe.head) or probe.store.remote:
        return False  # (a URL's data.pkl would be fetched twice: name format="lightning")
    if not is_checkpoint_zip(probe.zip_records()):
        return False
    try:
        data = probe.read_record(DATA_PKL, max_size=MAX_SNIFF_PICKLE)
    except TorchlessError:
        return False
    return data is not None and _KEY in data


def _strip(names: list[str], prefix: str | bool) -> str:
    if prefix is True:
        heads = {n.split(".", 1)[0] for n in names}
        if len(heads) != 1 or any("." not in n for n in names):
            return ""
        return heads.pop() + "."
    return str(prefix) if prefix else ""


class LightningArtifact(Artifact):
    """An opened Lightning checkpoint.

    Attributes:
        checkpoint: the underlying ``pt`` artifact (its ``load()`` is the whole dict).
        prefix: the prefix removed from the state dict's names (``""``: none).
    """

    format = "lightning"

    def __init__(
        self,
        path: Any,
        policy: LoadPolicy | None = None,
        *,
        probe: Probe | None = None,
        strip_prefix: str | bool = False,
        include_optimizer: bool = False,
    ) -> None:
        super().__init__(path if not isinstance(path, (bytes, bytearray, memoryview)) else "<bytes>", policy)
        if not isinstance(strip_prefix, (str, bool)):
            raise UsageError("strip_prefix must be a string or True/False", found=repr(strip_prefix)[:40])
        if type(include_optimizer) is not bool:
            raise UsageError("include_optimizer must be True or False", found=repr(include_optimizer)[:40])
        from ..pt.handler import PtArtifact

        self.checkpoint = PtArtifact(path, self.policy, probe=probe)
        obj = self.checkpoint.load()
        if not is_lightning_dict(obj):
            self.checkpoint.close()
            keys = sorted(map(str, obj))[:8] if isinstance(obj, Mapping) else type(obj).__name__
            raise FormatError(
                "not a Lightning checkpoint",
                path=self.path,
                expected=f"a dict with {spec.LIGHTNING_VERSION_KEY!r} and a {spec.LIGHTNING_STATE_DICT!r} mapping",
                found=keys,
            )
        self.obj: Mapping[str, Any] = obj
        sd = obj[spec.LIGHTNING_STATE_DICT]
        self.prefix = _strip([str(k) for k in sd], strip_prefix)
        self.include_optimizer = include_optimizer

    @property
    def version(self) -> Any:
        return self.obj.get(spec.LIGHTNING_VERSION_KEY)

    def load(self, *, weights_only: bool | None = None) -> Any:
        """The whole checkpoint dict (tensors lazy)."""
        self.load_policy(weights_only)
        return self.obj

    def _model(self) -> Iterator[tuple[str, Any]]:
        cut = len(self.prefix)
        for k, v in self.obj[spec.LIGHTNING_STATE_DICT].items():
            name = str(k)
            if cut and name.startswith(self.prefix):
                name = name[cut:]
            if is_tensor(v):
                yield name, v
            else:
                yield from iter_tensors(v, name)

    def tensors(self) -> Iterator[tuple[str, Any]]:
        yield from self._model()
        if self.include_optimizer:
            for i, sd in enumerate(self._optimizers()):
                yield from optimizer_tensors(sd, f"optimizer_states.{i}")

    def _optimizers(self) -> list[Any]:
        opts = self.obj.get("optimizer_states")
        return list(opts) if isinstance(opts, (list, tuple)) else []

    def info(self) -> dict[str, Any]:
        o = self.obj
        model = list(self._model())
        out: dict[str, Any] = {
            "format": self.format,
            "path": self.path,
            "framework": "lightning",
            "lightning_version": scalar(self.version),
            "epoch": scalar(o.get("epoch")),
            "global_step": scalar(o.get("global_step")),
            "keys": [str(k) for k in o],
            "prefix_stripped": self.prefix or None,
            **summarize_tensors(model),
            "parameter_count": sum(t.numel() for _n, t in model),  # parameters and buffers
            "optimizer": [describe_optimizer(sd) for sd in self._optimizers()],
            "lr_schedulers": [describe_scheduler(sd) for sd in (o.get("lr_schedulers") or [])],
            "callbacks": [str(k) for k in (o.get("callbacks") or {})] if isinstance(o.get("callbacks"), Mapping) else [],
            "hyper_parameters": describe(o.get("hyper_parameters"), max_items=16, max_depth=3)
            if "hyper_parameters" in o
            else None,
            "hparams_class": class_name(o["hyper_parameters"]) if "hyper_parameters" in o else None,
            "tree": describe({spec.LIGHTNING_STATE_DICT: dict(model)}, max_items=8),
        }
        return out

    def verify(self) -> list[Problem]:
        return self.checkpoint.verify()

    def convert_to(
        self,
        dst: Any,
        *,
        format: str,
        progress: Any = None,
        strict: bool = False,
        options: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """The ``state_dict`` (prefix stripped as asked) into ``dst``; the other keys are
        reported as dropped."""
        from ..hf.write import convert_tensors

        skip = {spec.LIGHTNING_STATE_DICT} | ({"optimizer_states"} if self.include_optimizer else set())
        dropped = [{"key": str(k), "type": class_name(v)} for k, v in self.obj.items() if k not in skip]
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
        self.checkpoint.close()


def sniff_lightning(probe: Probe, policy: LoadPolicy | None = None) -> bool:
    """:func:`may_be_lightning`, then the pickle run by the safe machine (placeholders,
    lazy tensors) and its top-level keys checked."""
    if not may_be_lightning(probe):
        return False
    from ..pt.handler import PtArtifact

    try:
        with PtArtifact(str(probe.path), placeholder_policy(policy or LoadPolicy())) as art:
            return is_lightning_dict(art.load())
    except TorchlessError:
        return False
