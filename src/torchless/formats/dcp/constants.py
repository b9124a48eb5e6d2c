"""Names that identify a DCP checkpoint directory (light: imported by detection)."""

from __future__ import annotations

import os
import re
from typing import Any

__all__ = ["HF_SUFFIX", "METADATA_NAME", "RANK_METADATA", "is_hf_dir", "rank_metadata_names", "has_metadata"]

METADATA_NAME = ".metadata"

HF_SUFFIX = ".safetensors"

#: ``dcp.save(..., use_collectives=False)``: every rank writes its own ``__<rank>.metadata``
RANK_METADATA = re.compile(r"^__(\d+)\.metadata$")


def rank_metadata_names(path: Any) -> list[str]:
    """The per-rank ``__<rank>.metadata`` files in ``path``, by rank."""
    try:
        names = os.listdir(os.fspath(path))
    except OSError:
        return []
    found = [(int(m.group(1)), n) for n in names if (m := RANK_METADATA.match(n))]
    return [n for _r, n in sorted(found)]


def has_metadata(path: Any) -> bool:
    """A DCP checkpoint folder: ``.metadata``, or per-rank ``__<rank>.metadata`` files."""
    p = os.fspath(path)
    return os.path.isfile(os.path.join(p, METADATA_NAME)) or bool(rank_metadata_names(p))


def is_hf_dir(path: Any) -> bool:
    p = os.fspath(path)
    try:
        return os.path.isdir(p) and any(n.endswith(HF_SUFFIX) and os.path.isfile(os.path.join(p, n)) for n in os.listdir(p))
    except OSError:
        return False
