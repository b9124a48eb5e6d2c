"""The ``package`` format handler: ``torch.package`` archives."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...core.lazy import LazyModule
from ..base import ZIP_CRC, Capabilities, FormatHandler, LoadPolicy, Probe
from ..registry import register
from .spec import is_package_records

if TYPE_CHECKING:  # the real modules, imported on first use at run time
    from . import read as _read
else:
    _read = LazyModule("torchless.formats.package.read")


@register
class PackageHandler(FormatHandler):
    name = "package"
    extensions = ()
    priority = 45  # a torch zip without data.pkl: before the plain checkpoint handler
    description = "torch.package archive (PackageExporter): interned/extern/mocked modules, pickles, tensors"
    capabilities = Capabilities(checksum=ZIP_CRC)

    def sniff(self, probe: Probe) -> bool:
        return is_package_records(probe.zip_records())

    def _open(self, path: Any, policy: LoadPolicy, probe: Probe | None) -> Any:
        try:
            zr = probe.take_zip(require_prefix=False) if probe is not None else None
        finally:
            if probe is not None:
                probe.close()
        return _read.PackageArtifact(path, policy, zip_reader=zr)
