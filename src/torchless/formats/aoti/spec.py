"""Names and numbers of AOTInductor packages (spec ``aoti.md``; torch 2.13).

An AOTInductor package is a PT2 archive (``pt2.md`` §1) whose compiler output lives under
``data/aotinductor/<model name>/``. Every path below is relative to the archive folder.
"""

from __future__ import annotations

import re

from ..pt2.spec import (
    AOTINDUCTOR_DIR,
    ARCHIVE_FORMAT_PATH,
    ARCHIVE_VERSION_PATH,
    CONSTANTS_DIR,
    WEIGHTS_DIR,
)
from ..pt2.spec import ARCHIVE_FORMAT_VALUE as _FORMAT_BYTES
from ..pt2.spec import WEIGHT_FILENAME_PREFIX as WEIGHT_PREFIX

__all__ = [
    "AOTINDUCTOR_DIR",
    "ALIGN_BYTES",
    "ARCHIVE_FORMAT_PATH",
    "ARCHIVE_FORMAT_VALUE",
    "ARCHIVE_VERSION_PATH",
    "BLOB_START_SYMBOL",
    "BLOB_END_SYMBOL",
    "CONSTANTS_DIR",
    "DTYPE_NAMES",
    "FILE_KINDS",
    "METADATA_KEYS",
    "WEIGHTS_CONFIG_NAME",
    "WEIGHTS_DIR",
    "WEIGHT_PREFIX",
    "EXTRACT_CONSTANTS_PREFIX",
    "COMPILE_FLAGS_SUFFIX",
    "LINKER_FLAGS_SUFFIX",
    "file_kind",
    "is_aoti_records",
    "aoti_models",
]

# The PT2 record paths (``AOTINDUCTOR_DIR``: compiler output of each packaged model,
# ``data/aotinductor/<name>/...``; ``WEIGHTS_DIR`` + ``WEIGHT_PREFIX``: the
# ``pickle_weights`` layout, one ``torch.save`` zip per weight; ``CONSTANTS_DIR``: where
# ``custom_obj_*`` files go) come from :mod:`..pt2.spec`.
#: ``pickle_weights`` layout: FQN -> [file, shape, stride, storage_offset]
WEIGHTS_CONFIG_NAME = "weights_config.json"

#: the ``archive_format`` record's text (the PT2 spec's bytes, decoded as the reader keeps it)
ARCHIVE_FORMAT_VALUE = _FORMAT_BYTES.decode("ascii")
#: the C++ loader extracts every member whose name starts with this (no separator after
#: it: ``data/constants_x`` too), next to each model folder's members
EXTRACT_CONSTANTS_PREFIX = CONSTANTS_DIR.rstrip("/")

#: each constant in the blob starts at a multiple of this on CPU (spec §1.2)
ALIGN_BYTES = 64

#: symbols bracketing the constants linked into ``wrapper.so`` (spec §1.2, Linux)
BLOB_START_SYMBOL = b"_binary_constants_bin_start"
BLOB_END_SYMBOL = b"_binary_constants_bin_end"

#: keys the compiler adds to ``*_metadata.json`` (spec §1.1); user keys are merged in
METADATA_KEYS = ("AOTI_DEVICE_KEY", "AOTI_PLATFORM", "AOTI_MACHINE", "AOTI_CPU_ISA", "AOTI_COMPUTE_CAPABILITY")

#: ``cached_torch_dtype_<x>`` in the wrapper's constant table -> torchless dtype name
DTYPE_NAMES = {
    "float32": "float32",
    "float64": "float64",
    "float16": "float16",
    "bfloat16": "bfloat16",
    "int64": "int64",
    "int32": "int32",
    "int16": "int16",
    "int8": "int8",
    "uint8": "uint8",
    "uint16": "uint16",
    "uint32": "uint32",
    "uint64": "uint64",
    "bool": "bool",
    "complex64": "complex64",
    "complex128": "complex128",
    "complex32": "complex32",
    "float8_e4m3fn": "float8_e4m3fn",
    "float8_e5m2": "float8_e5m2",
    "float8_e4m3fnuz": "float8_e4m3fnuz",
    "float8_e5m2fnuz": "float8_e5m2fnuz",
    "float8_e8m0fnu": "float8_e8m0fnu",
}

#: ``<cpp stem>`` + these: the flags JSON the loader builds its compile / link command from
COMPILE_FLAGS_SUFFIX = "_compile_flags.json"
LINKER_FLAGS_SUFFIX = "_linker_flags.json"

#: (suffix, kind) in matching order: the longest suffixes first
FILE_KINDS: tuple[tuple[str, str], ...] = (
    ("_weights.blob", "weights_blob"),
    ("_serialized_weights.bin", "weights_bin"),
    ("_metadata.json", "metadata"),
    (LINKER_FLAGS_SUFFIX, "build_flags"),
    (COMPILE_FLAGS_SUFFIX, "build_flags"),
    (".wrapper.cpp", "wrapper_source"),
    (".kernel.cpp", "kernel_source"),
    (".wrapper.so", "shared_object"),
    (".so", "shared_object"),
    (".pyd", "shared_object"),  # Windows: the wrapper library is a PE DLL named .pyd
    (".dll", "shared_object"),
    (".dylib", "shared_object"),
    (".cpp", "source"),
    (".h", "source"),
    (".py", "source"),
    (".o", "object"),
    (".obj", "object"),  # Windows (COFF)
    (".ld", "linker_script"),
    (".cubin", "gpu_binary"),
    (".fatbin", "gpu_binary"),
    (".hsaco", "gpu_binary"),
    (".spv", "gpu_binary"),
    (".ptx", "gpu_source"),
    (".json", "json"),
)

_CMAKE = re.compile(r"(^|/)CMakeLists\.txt$")


def file_kind(name: str) -> str:
    """What a file of a model folder is, from its name (``wrapper_source``, ``shared_object`` ...)."""
    base = name.rsplit("/", 1)[-1]
    if base == WEIGHTS_CONFIG_NAME:
        return "weights_config"
    if _CMAKE.search(name):
        return "cmake"
    for suffix, kind in FILE_KINDS:
        if base.endswith(suffix):
            return kind
    return "other"


# Detection lives here, with the record names, so sniffing stays cheap.
def is_aoti_records(records: list[str] | None) -> bool:
    """True when zip record names (relative to the archive folder) hold AOTInductor output."""
    if records is None or "\n" + AOTINDUCTOR_DIR not in "\n" + "\n".join(records):
        return False  # (no record starts with the folder: one search instead of a loop)
    return any(r.startswith(AOTINDUCTOR_DIR) and r.count("/") >= 3 for r in records)


def aoti_models(records: list[str]) -> list[str]:
    """Model names the loader (``load_pt2``) finds: the path component after
    ``data/aotinductor/``, in first-seen order."""
    out: list[str] = []
    for r in records:
        if r.startswith(AOTINDUCTOR_DIR):
            name = r[len(AOTINDUCTOR_DIR) :].replace("\\", "/").split("/", 1)[0]
            if name not in out:
                out.append(name)
    return out
