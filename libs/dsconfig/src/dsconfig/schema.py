"""A JSON Schema (draft 2020-12) of the whole config, generated from the attrs classes."""

from __future__ import annotations

import typing
from typing import Any, Literal, Union

import attrs

from .config import DeepSpeedConfig
from .fields import info
from .keys import KNOWN_KEYS


def json_schema() -> dict[str, Any]:
    definitions: dict[str, Any] = {}
    root = _class_schema(DeepSpeedConfig, definitions, "")
    root["properties"]["elasticity"] = _elasticity_schema()  # read by `load` itself (dsconfig.elasticity)
    root["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    root["title"] = "DeepSpeed configuration (dstrain)"
    root["$defs"] = definitions
    return root


def _class_schema(cls: type, definitions: dict, table_path: str) -> dict[str, Any]:
    properties: dict[str, Any] = {}
    required = [f.name for f in attrs.fields(cls) if f.default is attrs.NOTHING]
    for field in attrs.fields(cls):
        if field.metadata.get("dsconfig_internal"):
            continue
        prop = _type_schema(field.type, definitions, field.name)
        meta = info(field)
        if meta.doc:
            prop["description"] = meta.doc
        for key, bound in (("minimum", meta.ge), ("exclusiveMinimum", meta.gt), ("maximum", meta.le)):
            if bound is not None:
                _numeric_target(prop)[key] = bound
        default = _default_of(field)
        if default is not attrs.NOTHING:
            prop["default"] = default
        properties[field.name] = prop
    # Old spellings and DeepSpeed-only keys are accepted (with a warning); editors should know them.
    for (section, key), known in KNOWN_KEYS.items():
        if section == table_path and key not in properties:
            properties[key] = {"deprecated": True, "description": f"{known.kind}: {known.reason or known.new_key}"}
    schema = {"type": "object", "properties": properties, "additionalProperties": False,
              "patternProperties": {"^_": {"description": "a comment"}}}
    if required:
        schema["required"] = required
    return schema


def _elasticity_schema() -> dict[str, Any]:
    positive = {"type": "integer", "minimum": 1}
    properties = {
        "enabled": {"type": "boolean", "default": False,
                    "description": "Take the batch triple from the elastic arithmetic at the data-parallel size."},
        "max_train_batch_size": {**positive, "description": "The largest acceptable global batch."},
        "micro_batch_sizes": {"type": "array", "items": positive, "minItems": 1,
                              "description": "Micro batch sizes a rank may run."},
        "min_gpus": {**positive, "default": 1}, "max_gpus": {**positive, "default": 10000},
        "min_time": {"type": "number", "minimum": 0, "default": 0},
        "version": {"enum": [0.1, 0.2], "default": 0.2,
                    "description": "0.1 counts GPUs; 0.2 counts nodes of num_gpus_per_node GPUs."},
        "prefer_larger_batch": {"type": "boolean", "default": True},
        "ignore_non_elastic_batch_info": {"type": "boolean", "default": False,
                                          "description": "Replace batch keys that differ (a warning) instead of "
                                                         "refusing them."},
        "model_parallel_size": {**positive, "default": 1}, "num_gpus_per_node": {**positive, "default": 1},
    }
    return {"type": "object", "properties": properties, "additionalProperties": False,
            "description": "Elastic training: one global batch across the data-parallel sizes a job may restart at."}


def _numeric_target(prop: dict) -> dict:
    for option in prop.get("anyOf", []):
        if option.get("type") in ("integer", "number"):
            return option
    return prop


def _default_of(field: attrs.Attribute) -> Any:
    from .converter import CONVERTER

    default = field.default
    if isinstance(default, attrs.Factory):  # type: ignore[arg-type]
        default = default.factory()
    return CONVERTER.unstructure(default)


def _type_schema(tp: Any, definitions: dict, name: str) -> dict[str, Any]:
    origin = typing.get_origin(tp)
    if attrs.has(tp):
        ref = tp.__name__
        if ref not in definitions:
            definitions[ref] = {}  # placeholder against recursion
            definitions[ref] = _class_schema(tp, definitions, name)
        return {"$ref": f"#/$defs/{ref}"}
    if origin is Literal:
        return {"enum": list(typing.get_args(tp))}
    if origin is Union or type(tp).__name__ == "UnionType":
        return {"anyOf": [_type_schema(member, definitions, name) for member in typing.get_args(tp)]}
    if origin is list:
        (item,) = typing.get_args(tp) or (Any,)
        return {"type": "array", "items": _type_schema(item, definitions, name)}
    if origin is dict:
        _, value = typing.get_args(tp) or (str, Any)
        return {"type": "object", "additionalProperties": _type_schema(value, definitions, name)}
    simple = {bool: "boolean", int: "integer", float: "number", str: "string", type(None): "null"}
    if tp in simple:
        return {"type": simple[tp]}
    return {}
