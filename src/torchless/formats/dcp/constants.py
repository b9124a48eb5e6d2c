"""Names that identify a DCP checkpoint directory (light: imported by detection)."""

from __future__ import annotations

import os
import re
from typing import Any

__all__ = [
    "HF_SUFFIX",
    "METADATA_NAME",
    "RANK_METADATA",
    "SAVED_OFFSETS",
    "SHARDING_KEY",
    "VERSION_KEY",
    "is_hf_dir",
    "is_metadata_name",
    "rank_metadata_names",
    "has_metadata",
]

METADATA_NAME = ".metadata"

HF_SUFFIX = ".safetensors"

#: safetensors ``__metadata__`` keys of DCP's Hugging Face storage layout (spec ``dcp.md`` §5):
#: the JSON sharding info (each tensor's ``saved_offsets`` in the full tensor) and the version
SHARDING_KEY = "DCP_SHARDING_INFO"
VERSION_KEY = "DCP_VERSION"
SAVED_OFFSETS = "saved_offsets"

#: ``dcp.save(..., use_collectives=False)``: every rank writes its own ``__<rank>.metadata``
RANK_METADATA = re.compile(r"^__(\d+)" + re.escape(METADATA_NAME) + "$")


def is_metadata_name(name: str) -> bool:
    """A file ``dcp.load`` could read as metadata: ``.metadata`` or any ``*.metadata``
    (per-rank files, and names a reader could be pointed at)."""
    return name.endswith(METADATA_NAME)


def store_of(p: Any, store: Any = None) -> Any:
    """``store`` when the caller has it (resolved where the location entered: detection's
    probe, the public API), else the store of folder ``p``, resolved here: the one place
    the DCP readers resolve a location that was handed to them bare (a :class:`DCPReader`
    made directly of a path or URL). Imported lazily, so that importing this module for
    detection stays light."""
    if store is not None:
        return store
    from ...io.store import store_for

    return store_for(p)


def _NotFound() -> type[Exception]:  # noqa: N802
    from ...core.errors import NotFoundError

    return NotFoundError


def rank_metadata_names(path: Any, store: Any = None) -> list[str]:
    """The per-rank ``__<rank>.metadata`` files in ``path`` (in ``store``), by rank."""
    try:
        p = os.fspath(path)
        names = store_of(p, store).list(p)
    except (OSError, _NotFound()):
        return []
    found = [(int(m.group(1)), n) for n in names if (m := RANK_METADATA.match(n))]
    return [n for _r, n in sorted(found)]


def has_metadata(path: Any, store: Any) -> bool:
    """A DCP checkpoint folder: ``.metadata``, or per-rank ``__<rank>.metadata`` files
    (``store``: the store holding ``path``)."""
    p = os.fspath(path)
    # at a URL a HEAD request first: servers that cannot list folders (plain HTTP) serve it
    # too; a store that cannot answer raises: it must not make this "not a DCP checkpoint"
    return store.isfile(store.join(p, METADATA_NAME), "cannot check for the DCP metadata") or bool(rank_metadata_names(p, store))


def is_hf_dir(path: Any, store: Any) -> bool:
    """A folder of ``.safetensors`` files (DCP's Hugging Face layout) in ``store``."""
    p = os.fspath(path)
    try:
        if store.remote:  # (a listing names objects: no check of each)
            return store.isdir(p) and any(n.endswith(HF_SUFFIX) for n in store.list(p))
        return store.isdir(p) and any(n.endswith(HF_SUFFIX) and store.isfile(store.join(p, n)) for n in store.list(p))
    except (OSError, _NotFound()):
        return False
