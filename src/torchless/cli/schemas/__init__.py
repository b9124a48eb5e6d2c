"""One JSON Schema (draft 2020-12 subset) per command's ``--json`` output.

``SCHEMAS[name]`` is the schema of ``torchless <command> --json`` (``name`` as passed
to :func:`torchless.cli.render.emit_json`); :func:`validate` checks a value against one
with the keywords used here (``type``, ``properties``, ``required``,
``additionalProperties``, ``propertyNames``, ``items``, ``enum``, ``anyOf``, ``$ref``,
``minimum``), so the tests need no third-party validator. docs/cli.md documents them;
``python -m torchless.cli.schemas NAME`` prints one.
"""

from __future__ import annotations

import json
import re
from typing import Any

__all__ = ["SCHEMAS", "validate", "SchemaError"]

_STR = {"type": "string"}
_INT = {"type": "integer", "minimum": 0}
_BOOL = {"type": "boolean"}
_NUM_OR_TEXT = {"anyOf": [{"type": "number"}, {"enum": ["nan", "inf", "-inf"]}]}
_KEY = {"pattern": r"^\S+$"}  # field names never hold spaces
#: a summary statistic of ``run``: a number (bool for bool scalars), "nan"/"inf", or null when it does not apply
_STAT = {"anyOf": [{"type": ["number", "boolean", "null"]}, {"enum": ["nan", "inf", "-inf"]}]}


def _obj(props: dict[str, Any], *, optional: tuple[str, ...] = (), extra: Any = False) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": props,
        "required": [k for k in props if k not in optional],
        "additionalProperties": extra,
    }


def _arr(items: Any) -> dict[str, Any]:
    return {"type": "array", "items": items}


_TENSOR_ROW = _obj({"name": _STR, "dtype": _STR, "shape": _arr(_INT), "nbytes": _INT, "file": _STR}, optional=("file",))
_PROBLEM = _obj(
    {
        "code": _STR,
        "message": _STR,
        "member": {"type": ["string", "null"]},
        "offset": {"type": ["integer", "null"]},
        "severity": {"enum": ["error", "warning", "info"]},
    }
)
_ARG: dict[str, Any] = {}  # graph node arguments: any JSON (nodes as {"node": name}, others as {"value": text})
_GRAPH = _obj(
    {
        "path": _STR,
        "code": _STR,
        "nodes": _arr(_obj({"name": _STR, "op": _STR, "target": _STR, "args": _arr(_ARG), "kwargs": {"type": "object"}})),
    }
)
#: a node of :func:`torchless.core.tree.json_tree`
_TREE = {
    "anyOf": [
        {"type": ["null", "boolean", "number", "string", "array"]},
        {
            "type": "object",
            "properties": {"__kind__": {"enum": ["tensor", "object", "global", "bytes", "float", "shared", "repr"]}},
        },
    ]
}

#: ``torchless view --json``: the viewer's data model (:mod:`torchless.view.model`)
#: one entry of ``scan --coverage``: a pickle stream or a source the scan analysed
_SCAN_COVERED = _obj(
    {
        "what": {"enum": ["pickle", "source"]},
        "member": {"type": ["string", "null"]},
        "offset": {"type": ["integer", "null"]},
        "finished": _BOOL,
        "length": _INT,
        "sha256": {"type": "string", "pattern": "^[0-9a-f]{64}$"},
    },
    optional=("offset", "finished"),
)
_VIEW_NODE = _obj(
    {
        "name": _STR,
        "op": _STR,
        "target": _STR,
        "group": _arr(_STR),
        "val": _STR,
        "args": _ARG,
        "kwargs": _ARG,
        "schema": _STR,
        "stack": _STR,
        "doc": _STR,
        "subgraph": _INT,
        "meta": {"type": "object"},
        # state drawn inside the boxes of its users: its kind and original name
        "fold": {"enum": ["parameter", "buffer", "constant", "object", "initializer", "module", "attribute"]},
        "ref": _STR,
    },
    optional=("val", "args", "kwargs", "schema", "stack", "doc", "subgraph", "meta", "fold", "ref"),
)
_VIEW_ARTIFACT = _obj(
    {
        "name": _STR,
        "format": _STR,
        "tensors": _arr(
            _obj(
                {
                    "name": _STR,
                    "dtype": _STR,
                    "shape": _arr({"anyOf": [_INT, _STR]}),
                    "numel": _INT,
                    "nbytes": _INT,
                    "param": _BOOL,
                    "storage": {"type": ["integer", "null"]},
                    "kind": _STR,
                    "shared": _BOOL,
                }
            )
        ),
        "graphs": _arr(
            _obj(
                {
                    "id": _INT,
                    "title": _STR,
                    "parent": {"type": ["integer", "null"]},
                    "nodes": _arr(_VIEW_NODE),
                    "edges": _arr({"type": "array", "items": {"type": ["integer", "string"]}}),
                }
            )
        ),
        "code": {"type": "object", "additionalProperties": _STR},
        "notes": _arr(_STR),
        "info": {"type": "object"},
        "findings": {"type": ["object", "null"]},
    }
)

SCHEMAS: dict[str, dict[str, Any]] = {
    "info": {
        "type": "object",
        "description": (
            "Artifact.info() of the format: format and path always, then that format's fields; "
            "no field name holds a space, records are trimmed, pytree specs are JSON, "
            "and a checkpoint's tree is whole (json_tree nodes)."
        ),
        "properties": {
            "format": _STR,
            "path": _STR,
            "tensors": _INT,
            "elements": _INT,
            "parameters": _INT,
            "bytes_by_dtype": {"type": "object", "additionalProperties": _INT},
            "tensor_bytes": _INT,
            "storage_bytes": _INT,
            "records": {"type": "object", "additionalProperties": {"type": ["string", "integer", "null"]}},
            "tree": _TREE,
            "models_detail": {"type": "object", "additionalProperties": {"type": "object"}},
        },
        "required": ["format", "path"],
        "propertyNames": _KEY,
        "additionalProperties": True,
    },
    "ls": _arr(_TENSOR_ROW),
    "formats": _arr(
        _obj(
            {
                "name": _STR,
                "description": _STR,
                "extensions": _arr(_STR),
                "read": _BOOL,
                "list": _BOOL,
                "verify": _BOOL,
                "write_tensors": _BOOL,
                "write_objects": _BOOL,
                "edit": _BOOL,
                "open_options": _arr(_STR),
                "write_options": _arr(_STR),
                "checksum": {"type": ["string", "null"]},
            }
        )
    ),
    "convert": _obj(
        {
            "source": _STR,
            "destination": _STR,
            "tensors": _INT,
            "bytes": _INT,
            "files": _arr(_STR),
            "object_kept": _BOOL,
            "dropped": _arr(_obj({"key": _STR, "type": _STR})),
        }
    ),
    "diff": _obj(
        {
            "a": _STR,
            "b": _STR,
            "added": _arr(_STR),
            "removed": _arr(_STR),
            "changed": _arr(_obj({"name": _STR, "reason": _STR, "max_abs_diff": {"anyOf": [_NUM_OR_TEXT, {"type": "null"}]}})),
            "not_compared": _arr(_obj({"name": _STR, "reason": _STR})),
            "same": _INT,
            "values_added": _arr(_STR),
            "values_removed": _arr(_STR),
            "values_changed": _arr(_obj({"name": _STR, "a": _STR, "b": _STR})),
            "identical": _BOOL,
        }
    ),
    "verify": _obj(
        {
            "path": _STR,
            "format": _STR,
            "ok": _BOOL,
            "errors": _INT,
            "warnings": _INT,
            "notes": _INT,
            "problems": _arr(_PROBLEM),
            "checksum": {"type": ["string", "null"]},
            "digests": _arr(_obj({"file": _STR, "expected": _STR, "actual": {"type": ["string", "null"]}, "ok": _BOOL})),
        }
    ),
    "reshard": _obj(
        {
            "source": _STR,
            "destination": _STR,
            "ranks": _INT,
            "files": _arr(_STR),
            "tensors": _INT,
            "chunks": _INT,
            "bytes_items": _INT,
            "skipped": _arr(_STR),
            "tasks": _INT,
            "resumed": _arr(_STR),
            "resumed_parts": _INT,
            "peak_rss": _INT,
            "executor": _STR,
        },
        optional=("tasks", "resumed", "resumed_parts", "peak_rss", "executor"),  # with --executor / --max-task-bytes / --resume
    ),
    "cleanup": _obj({"destination": _STR, "removed": _arr(_STR)}),
    "reshard-plan": _obj(
        {
            "source": _STR,
            "ranks": _INT,
            "tasks": _arr(
                _obj(
                    {
                        "file": _STR,
                        "items": _INT,
                        "bytes_written": _INT,
                        "bytes_read": _INT,
                        "source_files": _INT,
                        "reads": _INT,
                    }
                )
            ),
            "total_bytes_written": _INT,
            "total_bytes_read": _INT,
            "critical_path": {"anyOf": [_obj({"file": _STR, "bytes": _INT}), {"type": "null"}]},
            "balance": {"type": "number", "minimum": 0},
        }
    ),
    "dcp-layout": _obj(
        {
            "version": {"type": ["string", "null"]},
            "files": {"type": "object", "additionalProperties": {"type": ["integer", "null"]}},
            "items": {
                "type": "object",
                "additionalProperties": {
                    "type": "object",
                    "properties": {"kind": {"enum": ["tensor", "bytes"]}},
                    "required": ["kind"],
                },
            },
        },
        extra=True,
    ),
    "code": _obj({"path": _STR, "method": {"type": ["string", "null"]}, "module": {"type": ["string", "null"]}, "code": _STR}),
    "graph": _obj({"path": _STR, "models": _arr(_obj({"name": _STR, "dialect": _STR, "graphs": _arr(_GRAPH)}))}),
    "onnx-graph": _obj({"path": _STR, "graphs": _arr(_GRAPH)}),
    "run": _obj(
        {
            "path": _STR,
            "model": _STR,
            "inputs": _arr(_obj({"name": _STR, "dtype": _STR, "shape": _arr(_INT)})),
            "outputs": _arr(
                _obj(
                    {
                        "name": _STR,
                        "dtype": _STR,
                        "shape": _arr(_INT),
                        "min": _STAT,
                        "max": _STAT,
                        "mean": _STAT,
                    }
                )
            ),
            "output_file": {"type": ["string", "null"]},
        }
    ),
    "onnx-set-weights": {
        "type": "object",
        "properties": {
            "output": _STR,
            "data_file": {"type": ["string", "null"]},
            "bytes": _INT,
            "replaced": _arr(_STR),
            "kept": _arr(_STR),
            "ignored": _arr(_STR),
        },
        "required": ["output", "data_file", "bytes", "replaced", "kept", "ignored"],
        "propertyNames": _KEY,
        "additionalProperties": True,
    },
    "ts-set-weights": {
        "type": "object",
        "properties": {
            "output": _STR,
            "replaced": _arr(_STR),
            "storages": _INT,
            "ignored": _arr(_STR),
            "extra_files": _arr(_STR),
        },
        "required": ["output", "replaced", "storages", "ignored", "extra_files"],
        "propertyNames": _KEY,
        "additionalProperties": True,
    },
    "pt2-set-weights": _obj({"output": _STR, "program": _STR, "replaced": _arr(_STR), "kept": _arr(_STR), "ignored": _arr(_STR)}),
    "error": _obj(
        {
            "error": _obj(
                {
                    "type": _STR,
                    "message": _STR,
                    "path": {"type": ["string", "null"]},
                    "member": {"type": ["string", "null"]},
                    "offset": {"type": ["integer", "null"]},
                    "expected": {"type": ["string", "null"]},
                    "found": {"type": ["string", "null"]},
                    "hint": {"type": ["string", "null"]},
                    "text": _STR,
                }
            )
        }
    ),
    "ts-extra": _obj({"path": _STR, "extra_files": _arr(_obj({"name": _STR, "size": _INT}))}),
    "ts-bytecode": _obj(
        {
            "path": _STR,
            "version": _INT,
            "methods": _arr(
                {"type": "object", "properties": {"qualified_name": _STR}, "required": ["qualified_name"], "propertyNames": _KEY}
            ),
        }
    ),
    "extract": _obj({"outdir": _STR, "files": _arr(_obj({"member": _STR, "path": _STR, "size": _INT}))}),
    "cache": {
        "anyOf": [
            _obj(
                {
                    "root": _STR,
                    "exists": _BOOL,
                    "entries": _INT,
                    "files": _INT,
                    "bytes": _INT,
                    "by_kind": {"type": "object"},
                    "items": _arr({"type": "object", "propertyNames": _KEY}),
                }
            ),
            _obj({"root": _STR, "file": _STR, "text": _STR}),
        ]
    },
    "cache-prune": {
        "type": "object",
        "properties": {
            "dry_run": _BOOL,
            "root": _STR,
            "entries": _arr({"type": "object"}),
            "files": _arr(_STR),
            "dirs": _arr(_STR),
            "bytes": _INT,
            "remaining_bytes": _INT,
            "result": {"type": "object"},
        },
        "required": ["dry_run", "root", "entries", "files", "dirs", "bytes", "remaining_bytes"],
        "propertyNames": _KEY,
        "additionalProperties": False,
    },
    "view": _obj({"version": _INT, "artifacts": _arr(_VIEW_ARTIFACT), "diff": {"type": ["object", "null"]}}),
    "scan": {
        "type": "object",
        "properties": {
            "files": _arr(
                {
                    "type": "object",
                    "properties": {
                        "path": _STR,
                        "verdict": _STR,
                        "findings": _arr({"type": "object"}),
                        "coverage": _arr(_SCAN_COVERED),
                    },
                    "required": ["path", "verdict", "findings"],
                    "propertyNames": _KEY,
                }
            ),
            "summary": {"type": "object"},
            "exit_code": _INT,
        },
        "required": ["files", "summary", "exit_code"],
        "propertyNames": _KEY,
        "additionalProperties": True,
    },
}


class SchemaError(ValueError):
    """A value does not match its schema; the message names the JSON path."""


_TYPES = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
}


def validate(value: Any, schema: dict[str, Any], path: str = "$") -> None:
    """Raise :class:`SchemaError` naming the first place ``value`` breaks ``schema``."""
    if "anyOf" in schema:
        errors = []
        for sub in schema["anyOf"]:
            try:
                validate(value, sub, path)
                break
            except SchemaError as e:
                errors.append(str(e))
        else:
            raise SchemaError(f"{path}: matches none of the alternatives ({'; '.join(errors)})")
    t = schema.get("type")
    if t is not None:
        types = [t] if isinstance(t, str) else t
        if not any(_TYPES[x](value) for x in types):
            raise SchemaError(f"{path}: expected {' or '.join(types)}, found {type(value).__name__} {json.dumps(value)[:60]}")
    if "enum" in schema and value not in schema["enum"]:
        raise SchemaError(f"{path}: {value!r} is not one of {schema['enum']}")
    if "minimum" in schema and isinstance(value, (int, float)) and not isinstance(value, bool) and value < schema["minimum"]:
        raise SchemaError(f"{path}: {value} < {schema['minimum']}")
    if isinstance(value, dict):
        props = schema.get("properties", {})
        for k in schema.get("required", ()):
            if k not in value:
                raise SchemaError(f"{path}: missing {k!r}")
        names = schema.get("propertyNames")
        for k, v in value.items():
            if names and not re.search(names["pattern"], k):
                raise SchemaError(f"{path}: field name {k!r} does not match {names['pattern']}")
            if k in props:
                validate(v, props[k], f"{path}.{k}")
            else:
                extra = schema.get("additionalProperties", True)
                if extra is False:
                    raise SchemaError(f"{path}: unexpected field {k!r}")
                if isinstance(extra, dict):
                    validate(v, extra, f"{path}.{k}")
    if isinstance(value, list) and "items" in schema:
        for i, v in enumerate(value):
            validate(v, schema["items"], f"{path}[{i}]")
