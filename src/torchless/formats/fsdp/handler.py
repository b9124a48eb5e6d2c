"""The ``fsdp`` format handler: a folder of FSDP2 per-rank state dicts (read-only)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from ...core.lazy import LazyModule
from ..base import Capabilities, FormatHandler, LoadPolicy, Probe
from ..registry import register

if TYPE_CHECKING:  # the real module, imported on first use at run time
    from . import read as _read
else:
    _read = LazyModule("torchless.formats.fsdp.read")


@register
class FsdpHandler(FormatHandler):
    name = "fsdp"
    extensions = ()
    priority = 40  # after the folder formats with their own index files (hf, deepspeed, dcp, trainer)
    description = "FSDP2 per-rank torch.save state dicts (<stem>0.pt..<stem>N-1.pt of DTensors), consolidated"
    capabilities = Capabilities()

    def sniff(self, probe: Probe) -> bool:
        if not probe.is_dir or not isinstance(probe.path, os.PathLike):  # local folders only
            return False
        return _read.rank_file_names(probe.text) is not None

    def _open(self, path: Any, policy: LoadPolicy, probe: Probe | None) -> _read.FsdpArtifact:
        if probe is not None:
            probe.close()
        return _read.FsdpArtifact(path, policy)
