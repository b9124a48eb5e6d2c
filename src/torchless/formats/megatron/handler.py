"""The ``megatron`` format handler: Megatron-LM legacy checkpoint folders."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...core.lazy import LazyModule
from ..base import Capabilities, FormatHandler, LoadPolicy, Probe
from ..registry import register

if TYPE_CHECKING:  # the real module, imported on first use at run time
    from . import read as _read
else:
    _read = LazyModule("torchless.formats.megatron.read")

__all__ = ["MegatronHandler"]


@register
class MegatronHandler(FormatHandler):
    name = "megatron"
    extensions = ()
    priority = 14  # a folder: before hf (15) and dcp (20)
    description = "Megatron-LM legacy checkpoint (iter_N/mp_rank_TT[_PPP]/model_optim_rng.pt), ranks merged"
    capabilities = Capabilities()

    def sniff(self, probe: Probe) -> bool:
        return probe.is_dir and _read.is_megatron_folder(probe.path, probe.store)

    def _open(self, path: Any, policy: LoadPolicy, probe: Probe | None) -> Any:
        if probe is not None:
            probe.close()
        return _read.MegatronArtifact(path, policy, store=probe.store_of(path) if probe is not None else None)
