"""The ``package`` format handler: ``torch.package`` archives."""

from __future__ import annotations

from typing import Any

from ...core.lazy import LazyModule
from ..base import Capabilities, FormatHandler, Probe
from ..registry import register

_read = LazyModule("torchless.formats.package.read")


@register
class PackageHandler(FormatHandler):
    name = "package"
    extensions: tuple[str, ...] = ()
    priority = 45  # a torch zip without data.pkl: before the plain checkpoint handler
    description = "torch.package archive (PackageExporter): interned/extern/mocked modules, pickles, tensors"
    capabilities = Capabilities()

    def sniff(self, probe: Probe) -> bool:
        recs = probe.zip_records()
        return recs is not None and ".data/extern_modules" in recs and "data.pkl" not in recs

    def open(self, path: Any, *, weights_only: bool = True) -> Any:
        return _read.PackageArtifact(path, weights_only=weights_only)
