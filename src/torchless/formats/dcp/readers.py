"""The reader for a checkpoint directory: DCP's own layout or its Hugging Face layout.

:class:`~.reader.DCPReader` reads ``.metadata`` and ``.distcp`` files; :class:`~.hf.HFReader`
(a subclass) reads a folder of DCP-sharded safetensors files. Choosing between them lives
above both, so that ``read`` never imports its own subclass.
"""

from __future__ import annotations

import os
from typing import Any

from .constants import has_metadata, is_hf_dir, store_of
from .hf import HFReader
from .reader import DCPReader

__all__ = ["open_reader"]


def open_reader(path: Any, store: Any = None) -> DCPReader:
    """A :class:`DCPReader` for a DCP directory (``.metadata``), or an
    :class:`~.hf.HFReader` for a directory of (DCP-sharded) safetensors files.
    ``store``: the store holding ``path``, as its caller resolved it (None: resolved here)."""
    p = os.fspath(path)
    store = store_of(p, store)
    if not has_metadata(p, store) and is_hf_dir(p, store):
        return HFReader(p, store=store)
    return DCPReader(p, store=store)
