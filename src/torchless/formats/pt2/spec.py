"""Record paths of a PT2 archive (``torch.export.save``), relative to the archive folder.

Spec: ``pt2.md`` §1 (``torch/export/pt2_archive/constants.py``, defined in C++). The
reader, the writer, the AOTInductor package reader and the scanner take them from here.
"""

from __future__ import annotations

import re
from collections.abc import Callable

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
    "unpickled_payloads",
    "TORCH_LOAD",
    "PICKLE_LOADS",
    "PICKLE_LOAD_OBJ",
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


#: how ``torch.export.load`` (``pt2_archive/_package.py``) reads a payload it unpickles
TORCH_LOAD = "torch.load(weights_only=False)"
PICKLE_LOADS = "pickle.loads"
PICKLE_LOAD_OBJ = "torch._C._pickle_load_obj"


def _model_names(records: list[str]) -> set[str]:
    """``_load_exported_programs``: every record under ``models/`` names a model as
    ``file[len("models/"):-len(".json")]`` (torch does not check the suffix)."""
    pre, suf = MODELS_FILENAME_FORMAT.split("{}")
    return {r[len(pre) : -len(suf)] for r in records if r.startswith(pre)}


def _payloads(config: bytes | None) -> list[tuple[str, bool]] | None:
    """``(path_name, use_pickle)`` of a weights/constants config as torch reads it
    (``json.loads`` of the UTF-8 text, then ``_dict_to_dataclass(PayloadConfig)``: a
    ``use_pickle`` of any JSON type is tested for truth), or None when it is not a
    config torch could read entry by entry (callers then treat every payload as pickled)."""
    import json

    if config is None:
        return []
    try:
        doc = json.loads(config.decode())
    except (UnicodeDecodeError, ValueError, RecursionError):
        return []  # torch raises before unpickling anything named there
    if not isinstance(doc, dict) or not isinstance(doc.get("config"), dict):
        return None
    out = []
    for meta in doc["config"].values():
        if not isinstance(meta, dict):
            return None
        path = meta.get("path_name")
        if not isinstance(path, str):
            if meta.get("use_pickle"):
                return None
            continue
        out.append((path, bool(meta.get("use_pickle"))))
    return out


def unpickled_payloads(records: list[str], read: Callable[[str], bytes | None]) -> tuple[dict[str, str], list[str]]:
    """The records ``torch.export.load`` unpickles, decided as ``pt2_archive/_package.py``
    decides: from the weights and constants configs of every model (and every config in
    the archive), not from the records' first bytes. Returns ``({record: loader}, folders)``
    where ``folders`` are the payload folders whose config torch could read in ways this
    function does not model (every record there is to be treated as unpickled).

    * ``data/weights/<model>.pt`` / ``data/constants/<model>.pt`` (legacy) and
      ``data/sample_inputs/<model>.pt``: ``torch.load`` (``weights_only=True`` first, then
      ``weights_only=False``);
    * a weights entry with a true ``use_pickle``: ``torch.load(weights_only=False)`` of
      ``data/weights/<path_name>``;
    * a constants entry: ``tensor_*`` with ``use_pickle``: ``torch.load(weights_only=False)``;
      ``custom_obj_*``: ``torch._C._pickle_load_obj``; ``opaque_obj_*``: ``pickle.loads``
      (whatever ``use_pickle`` says).

    ``read(record)`` returns a record's bytes (None: absent).
    """
    import posixpath

    out: dict[str, str] = {}
    unclear: list[str] = []
    models = _model_names(records)
    configs: dict[str, tuple[str, str]] = {}
    for name in models:
        configs[WEIGHTS_CONFIG_FILENAME_FORMAT.format(name)] = (WEIGHTS_DIR, name)
        configs[CONSTANTS_CONFIG_FILENAME_FORMAT.format(name)] = (CONSTANTS_DIR, name)
        out[SAMPLE_INPUTS_FILENAME_FORMAT.format(name)] = TORCH_LOAD
        out[f"{WEIGHTS_DIR}{name}.pt"] = TORCH_LOAD
        out[f"{CONSTANTS_DIR}{name}.pt"] = TORCH_LOAD
    w_pre, w_suf = WEIGHTS_CONFIG_FILENAME_FORMAT.split("{}")
    c_pre, c_suf = CONSTANTS_CONFIG_FILENAME_FORMAT.split("{}")
    for r in records:  # configs of models the archive does not list are read too (fail closed)
        if r.startswith(w_pre) and r.endswith(w_suf):
            configs.setdefault(r, (WEIGHTS_DIR, ""))
        elif r.startswith(c_pre) and r.endswith(c_suf):
            configs.setdefault(r, (CONSTANTS_DIR, ""))
    for cfg, (folder, _model) in sorted(configs.items()):
        entries = _payloads(read(cfg))
        if entries is None:
            unclear.append(folder)
            continue
        for path, use_pickle in entries:
            rec = posixpath.join(folder, path)  # os.path.join, as torch joins them
            if folder == CONSTANTS_DIR:
                if path.startswith(CUSTOM_OBJ_FILENAME_PREFIX):
                    out[rec] = PICKLE_LOAD_OBJ
                elif path.startswith(OPAQUE_OBJ_FILENAME_PREFIX):
                    out[rec] = PICKLE_LOADS
                elif use_pickle and path.startswith(TENSOR_CONSTANT_FILENAME_PREFIX):
                    out[rec] = TORCH_LOAD
            elif use_pickle:
                out[rec] = TORCH_LOAD
    return out, sorted(set(unclear))
