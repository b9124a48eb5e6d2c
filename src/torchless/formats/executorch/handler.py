"""The ``executorch`` format handler: ExecuTorch programs (``.pte``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...core.lazy import LazyModule
from ..base import Capabilities, FormatHandler, LoadPolicy, Probe
from ..registry import register
from .spec import is_pte

if TYPE_CHECKING:  # the real modules, imported on first use at run time
    from . import read as _read
else:
    _read = LazyModule("torchless.formats.executorch.read")


@register
class ExecuTorchHandler(FormatHandler):
    name = "executorch"
    extensions = (".pte",)
    priority = 40
    description = "ExecuTorch program (.pte): execution plans, operators, delegates, constant tensors"
    capabilities = Capabilities()

    def sniff(self, probe: Probe) -> bool:
        return not probe.is_dir and is_pte(probe.head)

    def _open(self, path: Any, policy: LoadPolicy, probe: Probe | None) -> Any:
        return _read.ExecuTorchArtifact(path, policy, probe=probe)
