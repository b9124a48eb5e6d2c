"""Record paths of a PT2 archive (``torch.export.save``), relative to the archive folder.

Spec: ``pt2.md`` §1 (``torch/export/pt2_archive/constants.py``, defined in C++).
"""

from __future__ import annotations

__all__ = [
    "ARCHIVE_FORMAT_PATH",
    "ARCHIVE_FORMAT_VALUE",
    "ARCHIVE_VERSION_PATH",
    "ARCHIVE_VERSION_VALUE",
    "MODELS_DIR",
    "MODELS_FILENAME_FORMAT",
    "WEIGHTS_DIR",
    "WEIGHT_FILENAME_PREFIX",
    "WEIGHTS_CONFIG_FILENAME_FORMAT",
    "CONSTANTS_DIR",
    "TENSOR_CONSTANT_FILENAME_PREFIX",
    "CUSTOM_OBJ_FILENAME_PREFIX",
    "OPAQUE_OBJ_FILENAME_PREFIX",
    "CONSTANTS_CONFIG_FILENAME_FORMAT",
    "SAMPLE_INPUTS_DIR",
    "SAMPLE_INPUTS_FILENAME_FORMAT",
    "EXTRA_DIR",
    "AOTINDUCTOR_DIR",
    "CONTAINER_MIN_VERSION",
    "LEGACY_EP_JSON",
    "LEGACY_VERSION_PATH",
]

ARCHIVE_FORMAT_PATH = "archive_format"
ARCHIVE_FORMAT_VALUE = b"pt2"
ARCHIVE_VERSION_PATH = "archive_version"
ARCHIVE_VERSION_VALUE = b"0"
MODELS_DIR = "models/"
MODELS_FILENAME_FORMAT = "models/{}.json"
WEIGHTS_DIR = "data/weights/"
WEIGHT_FILENAME_PREFIX = "weight_"
WEIGHTS_CONFIG_FILENAME_FORMAT = "data/weights/{}_weights_config.json"
CONSTANTS_DIR = "data/constants/"
TENSOR_CONSTANT_FILENAME_PREFIX = "tensor_"
CUSTOM_OBJ_FILENAME_PREFIX = "custom_obj_"
OPAQUE_OBJ_FILENAME_PREFIX = "opaque_obj_"
CONSTANTS_CONFIG_FILENAME_FORMAT = "data/constants/{}_constants_config.json"
SAMPLE_INPUTS_DIR = "data/sample_inputs/"
SAMPLE_INPUTS_FILENAME_FORMAT = "data/sample_inputs/{}.pt"
EXTRA_DIR = "extra/"
AOTINDUCTOR_DIR = "data/aotinductor/"
#: PT2ArchiveWriter calls set_min_version(6): ``.data/version`` is ``6\n``.
CONTAINER_MIN_VERSION = 6
#: pre-2.8 archives (no ``archive_format``)
LEGACY_EP_JSON = "serialized_exported_program.json"
LEGACY_VERSION_PATH = "version"


# Detection lives here, with the record names, so sniffing stays cheap.
def is_pt2(records: list[str] | None) -> bool:
    """Whether zip record names (relative to the prefix) look like a PT2 archive."""
    if not records:
        return False
    return ARCHIVE_FORMAT_PATH in records and any(r.startswith(MODELS_DIR) and r.endswith(".json") for r in records)
