"""The ``deepspeed`` format handler: DeepSpeed ZeRO checkpoint folders (read-only)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from ...core.lazy import LazyModule
from ..base import Capabilities, FormatHandler, LoadPolicy, Probe
from ..registry import register

if TYPE_CHECKING:  # the real modules, imported on first use at run time
    from . import artifact as _artifact
    from . import read as _read
else:
    _artifact = LazyModule("torchless.formats.deepspeed.artifact")
    _read = LazyModule("torchless.formats.deepspeed.read")


@register
class DeepSpeedHandler(FormatHandler):
    name = "deepspeed"
    extensions = ()
    priority = 16  # after hf: a Hugging Face folder that also holds a ZeRO checkpoint stays hf
    description = "DeepSpeed ZeRO 1/2/3 checkpoint (root with 'latest', or a tag folder of rank files), consolidated"
    capabilities = Capabilities()

    def sniff(self, probe: Probe) -> bool:
        if not probe.is_dir or not isinstance(probe.path, os.PathLike):  # local folders only
            return False
        return bool(_read.is_zero_folder(probe.text))

    def _open(self, path: Any, policy: LoadPolicy, probe: Probe | None) -> _artifact.DeepSpeedArtifact:
        if probe is not None:
            probe.close()
        return _artifact.DeepSpeedArtifact(path, policy)
