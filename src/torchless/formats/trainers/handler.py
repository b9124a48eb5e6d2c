"""The ``trainer`` and ``lightning`` format handlers: training-framework checkpoints."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...core.lazy import LazyModule
from ..base import Capabilities, FormatHandler, LoadPolicy, Probe
from ..registry import register

if TYPE_CHECKING:  # the real modules, imported on first use at run time
    from . import folder as _folder
    from . import lightning as _lightning
else:
    _folder = LazyModule("torchless.formats.trainers.folder")
    _lightning = LazyModule("torchless.formats.trainers.lightning")

__all__ = ["TrainerHandler", "LightningHandler"]


@register
class TrainerHandler(FormatHandler):
    name = "trainer"
    extensions = ()
    priority = 12  # before hf (15): the folder also holds a Hugging Face checkpoint
    description = "Hugging Face Trainer checkpoint-N/ or Accelerate save_state folder (model, optimizer, scheduler, RNG)"
    capabilities = Capabilities(open_options=("include_optimizer",))

    def sniff(self, probe: Probe) -> bool:
        return probe.is_dir and _folder.is_trainer_folder(probe.path, probe.store)

    def _open(self, path: Any, policy: LoadPolicy, probe: Probe | None, include_optimizer: bool = False) -> Any:
        if probe is not None:
            probe.close()
        store = probe.store_of(path) if probe is not None else None
        return _folder.TrainerArtifact(path, policy, include_optimizer=include_optimizer, store=store)


@register
class LightningHandler(FormatHandler):
    name = "lightning"
    extensions = ()
    priority = 95  # before the plain checkpoint handler (pt, 100), after the zip flavours
    description = "Lightning checkpoint (.ckpt): state_dict, optimizer states, loops, hyper-parameters"
    capabilities = Capabilities(open_options=("strip_prefix", "include_optimizer"))

    def sniff(self, probe: Probe) -> bool:
        return _lightning.sniff_lightning(probe)

    def _open(
        self,
        path: Any,
        policy: LoadPolicy,
        probe: Probe | None,
        strip_prefix: str | bool = False,
        include_optimizer: bool = False,
    ) -> Any:
        return _lightning.LightningArtifact(
            path, policy, probe=probe, strip_prefix=strip_prefix, include_optimizer=include_optimizer
        )
