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


def _store(p: Any) -> Any:
    """The store of folder ``p`` (:func:`torchless.io.store.store_for`; imported here, so
    that importing this module for detection stays light)."""
    from ...io.store import store_for

    return store_for(p)


def _NotFound() -> type[Exception]:  # noqa: N802
    from ...core.errors import NotFoundError

    return NotFoundError


def rank_metadata_names(path: Any) -> list[str]:
    """The per-rank ``__<rank>.metadata`` files in ``path``, by rank."""
    try:
        p = os.fspath(path)
        names = _store(p).list(p)
    except (OSError, _NotFound()):
        return []
    found = [(int(m.group(1)), n) for n in names if (m := RANK_METADATA.match(n))]
    return [n for _r, n in sorted(found)]


def has_metadata(path: Any) -> bool:
    """A DCP checkpoint folder: ``.metadata``, or per-rank ``__<rank>.metadata`` files."""
    p = os.fspath(path)
    store = _store(p)
    # at a URL a HEAD request first: servers that cannot list folders (plain HTTP) serve it
    # too; a store that cannot answer raises: it must not make this "not a DCP checkpoint"
    return store.isfile(store.join(p, METADATA_NAME), "cannot check for the DCP metadata") or bool(rank_metadata_names(p))


def is_hf_dir(path: Any) -> bool:
    p = os.fspath(path)
    store = _store(p)
    try:
        if store.remote:  # (a listing names objects: no check of each)
            return store.isdir(p) and any(n.endswith(HF_SUFFIX) for n in store.list(p))
        return store.isdir(p) and any(n.endswith(HF_SUFFIX) and store.isfile(store.join(p, n)) for n in store.list(p))
    except (OSError, _NotFound()):
        return False
