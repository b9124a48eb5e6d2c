"""Names that identify a DCP checkpoint directory (light: imported by detection)."""

from __future__ import annotations

import os
from typing import Any

__all__ = ["HF_SUFFIX", "METADATA_NAME", "is_hf_dir"]

METADATA_NAME = ".metadata"

HF_SUFFIX = ".safetensors"


def is_hf_dir(path: Any) -> bool:
    p = os.fspath(path)
    try:
        return os.path.isdir(p) and any(n.endswith(HF_SUFFIX) and os.path.isfile(os.path.join(p, n)) for n in os.listdir(p))
    except OSError:
        return False
