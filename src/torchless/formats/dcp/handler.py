"""The ``dcp`` format handler: directories holding a DCP ``.metadata``."""

from __future__ import annotations

import os
from typing import Any

from ..base import Probe
from ..registry import register
from .constants import METADATA_NAME, is_hf_dir
from ...core.lazy import LazyModule

_read = LazyModule("torchless.formats.dcp.read")


@register
class DCPHandler:
    name = "dcp"
    extensions: tuple[str, ...] = ()
    priority = 20
    description = "torch.distributed.checkpoint directory (.metadata + __R_N.distcp, or DCP-sharded safetensors)"

    def sniff(self, probe: Probe) -> bool:
        if not probe.is_dir:
            return False
        return os.path.isfile(os.path.join(probe.path, METADATA_NAME)) or is_hf_dir(probe.path)

    def open(self, path: Any, **kw: Any) -> _read.DCPArtifact:
        return _read.DCPArtifact(path, **kw)
