"""Record paths of a PT2 archive (``torch.export.save``), relative to the archive folder.

Spec: ``pt2.md`` §1 (``torch/export/pt2_archive/constants.py``, defined in C++). The
reader, the writer, the AOTInductor package reader and the scanner take them from here.
"""

from __future__ import annotations

import re

from ..pt.spec import BYTEORDER, DATA_VERSION, SERIALIZATION_ID, VERSION

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
    "LEGACY_STATE_DICT",
    "LEGACY_CONSTANTS",
    "LEGACY_EXAMPLE_INPUTS",
    "LEGACY_SCHEMA_MAJORS",
    "is_legacy_pt2",
    "XL_MODEL_WEIGHTS_DIR",
    "RECORDS",
    "is_pt2",
    "is_pt2_records",
    "is_storage_record",
    "is_torch_loaded",
    "classify_record",
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
#: pre-2.8 archives (no ``archive_format``): ``torch.export.save`` of torch 2.5-2.7 wrote a
#: zip without an archive folder holding the program JSON (schema 7.x or earlier), the
#: state dict, constants and example inputs each as one ``torch.save`` archive, and the
#: schema version as text (``7.3``) in ``version``
LEGACY_EP_JSON = "serialized_exported_program.json"
LEGACY_STATE_DICT = "serialized_state_dict.pt"
LEGACY_CONSTANTS = "serialized_constants.pt"
LEGACY_EXAMPLE_INPUTS = "serialized_example_inputs.pt"
LEGACY_VERSION_PATH = VERSION  # as in torch.save's zip
#: the schema majors of those archives torchless reads (upgraded to the current schema;
#: torch 2.5 wrote 7.3, torch 2.6 8.2, torch 2.7 8.7, in this layout)
LEGACY_SCHEMA_MAJORS = (5, 6, 7, 8)
#: weights stored outside the archive's pickles (``XL_MODEL_WEIGHTS_DIR``)
XL_MODEL_WEIGHTS_DIR = "xl_model_weights/"
#: the small records ``PT2ArchiveWriter`` writes besides the models and data
RECORDS = (ARCHIVE_FORMAT_PATH, ARCHIVE_VERSION_PATH, DATA_VERSION, BYTEORDER, SERIALIZATION_ID)

_STORAGE_RECORD = re.compile(
    "^(?:.*/)?(?:"
    + re.escape(WEIGHTS_DIR + WEIGHT_FILENAME_PREFIX)
    + "|"
    + re.escape(CONSTANTS_DIR + TENSOR_CONSTANT_FILENAME_PREFIX)
    + r")\d+$|^(?:.*/)?"
    + re.escape(XL_MODEL_WEIGHTS_DIR)
)


# Detection lives here, with the record names, so sniffing stays cheap.
def is_pt2(records: list[str] | None) -> bool:
    """Whether zip record names (relative to the prefix) look like a PT2 archive."""
    if not records:
        return False
    return ARCHIVE_FORMAT_PATH in records and any(r.startswith(MODELS_DIR) and r.endswith(".json") for r in records)


def is_legacy_pt2(records: list[str] | None) -> bool:
    """Record names of a pre-2.8 ``torch.export.save`` archive (no archive folder)."""
    return records is not None and LEGACY_EP_JSON in records and LEGACY_STATE_DICT in records


def is_pt2_records(records: list[str]) -> bool:
    """Whether ``torch.export.load`` is the loader meant for these records: an
    ``archive_format`` record, looked up case-insensitively as miniz does (the scanner's
    rule: wider than :func:`is_pt2`, which also wants a model)."""
    return any(r.lower() == ARCHIVE_FORMAT_PATH for r in records)


def is_storage_record(rel: str) -> bool:
    """Raw tensor bytes of a PT2 archive (weights, tensor constants, XL weights)."""
    return bool(_STORAGE_RECORD.match(rel))


def is_torch_loaded(rel: str) -> bool:
    """Storage-named records that ``torch.export.load`` / the AOTInductor loader pass to
    ``torch.load`` (``pickle_weights``: each a whole ``torch.save`` archive)."""
    return rel.startswith((WEIGHTS_DIR, CONSTANTS_DIR))


def classify_record(rel: str) -> str:
    """``pickle``, ``storage``, ``code``, ``metadata`` or ``other`` for a record name
    relative to the archive folder."""
    if is_storage_record(rel):
        return "storage"  # raw bytes, or (see is_torch_loaded) a whole torch.save archive
    if rel.startswith(SAMPLE_INPUTS_DIR):
        return "pickle"  # torch.save of the sample inputs
    if rel.startswith(AOTINDUCTOR_DIR):
        return "code"
    if rel in RECORDS or rel.endswith(".json"):
        return "metadata"
    return "other"
