"""The ``dcp`` format handler: directories holding a DCP ``.metadata``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...core.lazy import LazyModule
from ..base import Capabilities, FormatHandler, LoadPolicy, Probe
from ..registry import register
from .constants import has_metadata, is_hf_dir

if TYPE_CHECKING:  # the real module, imported on first use at run time
    from . import artifact as _artifact
else:
    _artifact = LazyModule("torchless.formats.dcp.artifact")


@register
class DCPHandler(FormatHandler):
    name = "dcp"
    extensions = ()
    priority = 20
    description = "torch.distributed.checkpoint directory (.metadata + __R_N.distcp, or DCP-sharded safetensors)"
    capabilities = Capabilities()

    def sniff(self, probe: Probe) -> bool:
        if not probe.is_dir:
            return False
        return has_metadata(probe.path, probe.store) or is_hf_dir(probe.path, probe.store)

    def _open(self, path: Any, policy: LoadPolicy, probe: Probe | None) -> _artifact.DCPArtifact:
        if probe is not None:
            probe.close()
        return _artifact.DCPArtifact(path, policy, store=probe.store_of(path) if probe is not None else None)
