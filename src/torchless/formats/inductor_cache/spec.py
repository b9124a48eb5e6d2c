"""The layout of a TorchInductor cache folder (``TORCHINDUCTOR_CACHE_DIR``; spec
``inductor_cache.md``): folder names, key shapes, and the two classifications built on
them: :func:`classify` (which entry a file belongs to: the inventory and pruning) and
:func:`loaded_kind` (what torch loads a file as: the scanner). Light: no readers, no
pickle machine.
"""

from __future__ import annotations

import os
import re

__all__ = [
    "FXGRAPH_DIR",
    "AOTAUTOGRAD_DIR",
    "TRITON_DIR",
    "DYNAMO_DIR",
    "LOCKS_DIR",
    "AUTOTUNE_DIR",
    "PCH_DIR",
    "AOTI_EAGER_DIR",
    "BUILD_TEMP_DIR",
    "KEY_RE",
    "CODE_KEY",
    "FX_KEY",
    "GPU_EXT",
    "GPU_BINARY_EXT",
    "CPP_EXT",
    "BEST_CONFIG_SUFFIX",
    "PICKLED_KINDS",
    "classify",
    "loaded_kind",
]

FXGRAPH_DIR = "fxgraph"
AOTAUTOGRAD_DIR = "aotautograd"
TRITON_DIR = "triton"
DYNAMO_DIR = "dynamo"
LOCKS_DIR = "locks"
AUTOTUNE_DIR = "cache"
PCH_DIR = "precompiled_headers"
AOTI_EAGER_DIR = "aoti_eager"
BUILD_TEMP_DIR = "gcc"

#: 51 lower-case base32 characters (``cache_key.py``); keys are a letter + that
KEY_RE = "[a-z2-7]{51}"
#: ``"c"`` + 51 base32 characters: generated code (and AOTInductor build folders)
CODE_KEY = re.compile(rf"^c{KEY_RE}")
#: ``"f"`` + 51 base32 characters: an FX graph
FX_KEY = re.compile(rf"^f{KEY_RE}$")
#: GPU kernels (and their JSON metadata) next to generated code
GPU_EXT = (".cubin", ".ptx", ".hsaco", ".spv", ".fatbin", ".json")
#: GPU binaries a Triton cache entry loads as device code (with a host ``.so``)
GPU_BINARY_EXT = (".so", ".cubin", ".hsaco", ".spv", ".fatbin")
CPP_EXT = (".cpp", ".so", ".h", ".o", ".hpp")
BEST_CONFIG_SUFFIX = ".best_config"
#: entry kinds stored as pickles
PICKLED_KINDS = (FXGRAPH_DIR, AOTAUTOGRAD_DIR)
#: PGO profiles (pickles) under ``dynamo/``
PGO_PREFIX = "code_state_"

_B32_2 = "[a-z2-7]{2}"
_HASH = "[a-z2-7]{51,52}"
_FX = re.compile(rf"(?:^|/){FXGRAPH_DIR}/{_B32_2}/f{KEY_RE}/{_HASH}$")
_AOT = re.compile(rf"(?:^|/){AOTAUTOGRAD_DIR}/{_B32_2}/a{KEY_RE}/{_HASH}$|(?:^|/){AOTAUTOGRAD_DIR}/a{KEY_RE}/{_HASH}$")
_TRITON_BIN = re.compile(rf"(?:^|/){TRITON_DIR}/[0-9]+/[A-Za-z0-9_=-]+/[^/]+\.(?:{'|'.join(e[1:] for e in GPU_BINARY_EXT)})$")
_PGO = re.compile(rf"(?:^|/){DYNAMO_DIR}/{PGO_PREFIX}[^/]*\.pkl$")
_CODE = re.compile(rf"(?:^|/)({_B32_2})/(c{KEY_RE})(\.main)?\.(py|cpp|so)$")


def loaded_kind(path: str) -> str | None:
    """The cache file kind torch loads ``path`` as (from its place in the cache layout):
    ``fxgraph``, ``aotautograd``, ``pgo``, ``py``, ``cpp``, ``so``, ``triton-binary``;
    None for other files."""
    p = path.replace(os.sep, "/")
    if _FX.search(p):
        return "fxgraph"
    if _AOT.search(p):
        return "aotautograd"
    if _PGO.search(p):
        return "pgo"
    if _TRITON_BIN.search(p):
        return "triton-binary"
    m = _CODE.search(p)
    if m:
        return m.group(4)
    return None


def classify(rel: str) -> tuple[str, str, str | None]:
    """``(kind, entry id, key)`` of a regular file from its path (relative to the cache
    folder) alone; ``code`` files are refined by their group's files."""
    parts = rel.split("/")
    top = parts[0]
    n = len(parts)
    if top == FXGRAPH_DIR and n == 4:
        return "fxgraph", rel, parts[2]
    if top == AOTAUTOGRAD_DIR and n >= 3:
        # torch 2.13 writes aotautograd/<key>/<content hash> (no <key[1:3]> shard folder,
        # unlike fxgraph/); the sharded form is accepted too
        return "aotautograd", rel, parts[1] if n == 3 else parts[2]
    if top == LOCKS_DIR:
        return "lock", rel, parts[-1].rsplit(".", 1)[0]
    if top == TRITON_DIR and n >= 4:
        return "triton_cache", "/".join(parts[:3]), parts[2]
    if top == AUTOTUNE_DIR:
        return "autotune", rel, parts[1] if n > 1 else None
    if top == PCH_DIR:
        return "precompiled_header", rel, None
    if top == AOTI_EAGER_DIR:
        return "aoti_eager", rel, None
    if top == DYNAMO_DIR:
        return "dynamo", rel, None
    if top == BUILD_TEMP_DIR:
        return "build_temp", rel, None
    if n == 2 and len(top) == 2 and CODE_KEY.match(parts[1]):
        stem = parts[1][:52]
        if parts[1].endswith(BEST_CONFIG_SUFFIX):
            return "autotune", rel, stem
        return "code", f"{top}/{stem}", stem  # refined from the group's files
    if n >= 2 and CODE_KEY.match(top) and len(top) == 52:
        return "aoti_build", top, top
    return "other", rel, None
