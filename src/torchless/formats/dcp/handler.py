"""The ``dcp`` format handler: directories holding a DCP ``.metadata``."""

from __future__ import annotations

import os
from typing import Any

from ..base import Probe
from ..registry import register
from .read import DCPArtifact
from .spec import METADATA_NAME


@register
class DCPHandler:
    name = "dcp"
    extensions: tuple[str, ...] = ()
    priority = 20
    description = "torch.distributed.checkpoint directory (.metadata + __R_N.distcp)"

    def sniff(self, probe: Probe) -> bool:
        return probe.is_dir and os.path.isfile(os.path.join(probe.path, METADATA_NAME))

    def open(self, path: Any, **kw: Any) -> DCPArtifact:
        return DCPArtifact(path, **kw)
