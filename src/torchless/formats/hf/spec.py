"""How ``transformers`` names a checkpoint's files (light: imported by detection and the scanner).

``save_pretrained`` writes one file (``model.safetensors``, ``pytorch_model.bin``) or,
above ``max_shard_size``, shards ``<stem>-00001-of-0000N.<ext>`` and an index
``<stem>.<ext>.index.json`` (``{"metadata": {"total_size": n}, "weight_map": {tensor:
shard}}``). A folder of safetensors files whose headers carry ``DCP_SHARDING_INFO`` is
DCP's per-rank flavour instead (``formats/dcp/hf.py``), not a Hugging Face checkpoint.
"""

from __future__ import annotations

import os
import re
import struct
from typing import Any

from ...core.errors import TorchlessError
from ...io.store import Store
from ..dcp.constants import METADATA_NAME, SHARDING_KEY

__all__ = [
    "INDEX_SUFFIX",
    "SHARD_RE",
    "KINDS",
    "SINGLE_FILES",
    "index_names",
    "is_hf_folder",
    "is_index_file",
    "shard_name",
    "has_dcp_sharding",
]

INDEX_SUFFIX = ".index.json"
#: ``pytorch_model-00001-of-00003.bin``, ``model-00001-of-00002.safetensors``
SHARD_RE = re.compile(r"^(?P<stem>.+)-(?P<i>\d{5})-of-(?P<n>\d{5})\.(?P<ext>bin|safetensors)$")
#: shard extension -> serialization
KINDS = {".bin": "bin", ".safetensors": "safetensors"}
#: the unsharded names, in transformers' order of preference
SINGLE_FILES = ("model.safetensors", "pytorch_model.bin")
_DCP_KEY = SHARDING_KEY.encode()
_MAX_SNIFF_HEADER = 16 << 20


def _listdir(p: Any, store: Store) -> list[str]:
    if store.remote and not store.isdir(p):  # (a URL that is no folder: nothing in it)
        return []
    return store.list(p)


def shard_name(stem: str, index: int, count: int, ext: str) -> str:
    """transformers' shard name: ``shard_name("model", 1, 2, ".safetensors")`` ->
    ``model-00001-of-00002.safetensors``."""
    return f"{stem}-{index:05d}-of-{count:05d}{ext}"


def is_index_file(name: str) -> bool:
    """An index's name: ``<anything>.bin.index.json`` or ``<anything>.safetensors.index.json``."""
    return name.endswith(INDEX_SUFFIX) and name[: -len(INDEX_SUFFIX)].endswith(tuple(KINDS))


def index_names(folder: Any, store: Store) -> list[str]:
    """Index files in ``folder`` (in ``store``), safetensors first (transformers prefers them)."""
    try:
        names = [n for n in _listdir(folder, store) if is_index_file(n)]
    except (OSError, TorchlessError):
        return []
    return sorted(names, key=lambda n: (not n.endswith(".safetensors" + INDEX_SUFFIX), n))


def has_dcp_sharding(path: str, store: Store) -> bool:
    """True when the safetensors file's header names ``DCP_SHARDING_INFO`` (DCP's
    per-rank flavour). Reads only the header (at most 16 MiB)."""
    if store.remote:
        from ...io.source import RemoteSource

        try:
            src = RemoteSource(path)
            if src.size < 8:
                return False
            (n,) = struct.unpack("<Q", src.read_at(0, 8))
            return n <= _MAX_SNIFF_HEADER and _DCP_KEY in src.read_at(8, min(n, src.size - 8))
        except TorchlessError:
            return False
    try:
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                return False
            (n,) = struct.unpack("<Q", head)
            return n <= _MAX_SNIFF_HEADER and _DCP_KEY in f.read(n)
    except OSError:
        return False


def is_hf_folder(folder: Any, store: Store) -> bool:
    """A folder transformers would load: an index, shards named its way, or one of its
    single-file names; never a DCP checkpoint (``.metadata`` or DCP-sharded files).
    ``store``: the store holding ``folder`` (resolved where its location entered)."""
    p = os.fspath(folder)
    try:
        names = _listdir(p, store)
    except (OSError, TorchlessError):
        return False
    if METADATA_NAME in names or any(n.startswith("__") and n.endswith(METADATA_NAME) for n in names):
        return False
    st = [n for n in names if n.endswith(".safetensors")]
    # DCP's per-rank files are named shard-<rank>-model-... (torch and torchless alike):
    # only their headers are read, never every file of a large folder
    if any(has_dcp_sharding(store.join(p, n), store) for n in st if n.startswith("shard-")):
        return False
    return bool(st) or any(is_index_file(n) or SHARD_RE.match(n) or n in SINGLE_FILES for n in names)


def index_shards(index_path: Any, *, store: Store, max_bytes: int = 256 << 20) -> list[tuple[str, str | None]]:
    """The shards an index file names, for the scanner: ``(path, error)`` each, error None
    when the shard is a regular file inside the index's folder. An index that cannot be
    parsed yields nothing (the index itself is scanned as a file). ``store``: the store
    holding it, as the scanner's entry resolved it."""
    import json

    from ...core.errors import TorchlessError
    from ...io.paths import confined_file

    p = os.fspath(index_path)
    if store.remote:
        from ...io import remote
        from ...io.source import RemoteSource

        folder = remote.dirname(p)
        try:
            src = RemoteSource(p)
            if src.size > max_bytes:
                return []
            data = json.loads(src.read_at(0, src.size))
        except (TorchlessError, ValueError, RecursionError):
            return []
    else:
        folder = os.path.dirname(p) or "."
        try:
            if os.path.getsize(p) > max_bytes:
                return []
            with open(p, "rb") as f:
                data = json.loads(f.read())
        except (OSError, ValueError, RecursionError):
            return []
    wm = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(wm, dict):
        return []
    out: list[tuple[str, str | None]] = []
    for name in dict.fromkeys(v for v in wm.values() if isinstance(v, str)):
        shown = os.path.join(folder, name)
        try:
            if store.remote:  # (no links: the name's own rule)
                store.confine(folder, name, what="shard", path=p)
            else:
                confined_file(folder, name, what="shard", path=p)
        except TorchlessError as e:
            out.append((shown, f"the index names a shard it cannot be read from: {e}"))
            continue
        out.append((shown, None))
    return out
