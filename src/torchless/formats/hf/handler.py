"""The ``hf`` format handler: Hugging Face checkpoint folders and their index files."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from ...core.lazy import LazyModule
from ..base import ZIP_CRC, Capabilities, FormatHandler, LoadPolicy, Probe
from ..registry import register
from .spec import INDEX_SUFFIX, is_hf_folder, is_index_file

if TYPE_CHECKING:  # the real modules, imported on first use at run time
    from . import read as _read
    from . import write as _write
else:
    _read = LazyModule("torchless.formats.hf.read")
    _write = LazyModule("torchless.formats.hf.write")


@register
class HFHandler(FormatHandler):
    name = "hf"
    extensions = (INDEX_SUFFIX,)
    priority = 15  # before dcp, which owns folders of DCP-sharded safetensors
    description = "Hugging Face checkpoint: safetensors or .bin shards + index json (folder or index file)"
    capabilities = Capabilities(
        write_tensors=True, write_options=("max_shard_size",), checksum=ZIP_CRC + " of .bin shards (.safetensors shards: none)"
    )

    def sniff(self, probe: Probe) -> bool:
        if probe.is_dir:
            return is_hf_folder(probe.path, probe.store)
        return is_index_file(probe.name) and probe.head.lstrip()[:1] == b"{"

    def _open(self, path: Any, policy: LoadPolicy, probe: Probe | None) -> Any:
        if probe is not None:
            probe.close()
        return _read.HFArtifact(path, policy, store=probe.store_of(path) if probe is not None else None)

    def write_tensors(
        self,
        items: Iterable[tuple[str, Any]],
        path: Any,
        *,
        progress: Callable[[int], None] | None = None,
        max_shard_size: Any = None,
    ) -> list[str]:
        """Write a sharded set whose index is ``path`` (``<name>.safetensors.index.json`` or
        ``<name>.bin.index.json``); one shard means the unsharded file and no index."""
        files, _aliases = _write.write_sharded(items, path, max_shard_size, progress=progress)
        return files
