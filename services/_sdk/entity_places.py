"""Where an `x-entity` may stand in a tool's input schema: on a top-level property, the one place the gate resolves it.

Anywhere else (nested, in items, under `$defs`, in anyOf/oneOf, reached through a `$ref`) it would mark an argument
no one checks, so `entity_problems` names each such place.
"""

from __future__ import annotations

from typing import Any

from jsonschema.exceptions import ValidationError

# Keywords whose value maps *names* (not keywords) to subschemas.
NAMED_SUBSCHEMAS = {"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"}
_SUBSCHEMAS = {
    "items",
    "additionalItems",
    "additionalProperties",
    "unevaluatedItems",
    "unevaluatedProperties",
    "contains",
    "contentSchema",
    "propertyNames",
    "not",
    "if",
    "then",
    "else",
    "prefixItems",
    "allOf",
    "anyOf",
    "oneOf",
}
_REF_TARGETS = ("$id", "$anchor", "$dynamicAnchor")


def _pointed(schema: dict[str, Any], ref: str) -> Any:
    if ref == "#":
        return schema
    if not ref.startswith("#/"):
        return None
    node: Any = schema
    for part in ref.removeprefix("#/").split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


def _subschemas(schema: Any, path: tuple[Any, ...] = ()) -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
    if not isinstance(schema, dict):
        return []
    found = [(path, schema)]
    for key, value in schema.items():
        if key in NAMED_SUBSCHEMAS and isinstance(value, dict):
            for name, sub in value.items():
                found += _subschemas(sub, (*path, key, name))
        elif key in _SUBSCHEMAS and isinstance(value, list):
            for i, sub in enumerate(value):
                found += _subschemas(sub, (*path, key, i))
        elif key in _SUBSCHEMAS:
            found += _subschemas(value, (*path, key))
    return found


def _json_path(parts: tuple[Any, ...]) -> str:
    return ValidationError("", path=list(parts)).json_path


def entity_problems(doc: Any, source: str) -> list[str]:
    """`x-entity` where the gate would not check it, one line each. A top-level property that carries one must not be
    a `$ref` target either: the gate would check the property, not the place that refers to it."""
    schema = doc.get("input_schema") if isinstance(doc, dict) else None
    if not isinstance(schema, dict):
        return []
    name = doc.get("name")
    checked = {("properties", prop) for prop, sub in _top_level(schema).items() if "x-entity" in sub}
    problems = []
    for path, sub in _subschemas(schema):
        where = _json_path(("input_schema", *path))
        if "x-entity" in sub and path not in checked:
            problems.append(
                f"{source}: {_json_path(('input_schema', *path, 'x-entity'))}: x-entity of {name} is only checked on "
                "a top-level property of input_schema; here the gate would not resolve it: make the id a top-level "
                "argument (or drop the annotation)"
            )
        if path in checked and (targets := [key for key in _REF_TARGETS if key in sub]):
            problems.append(
                f"{source}: {where}: the x-entity property of {name} must not be a $ref target ({targets[0]}): a "
                "field referring to it would not be checked"
            )
        for key in ("$ref", "$dynamicRef"):
            target = _pointed(schema, ref) if isinstance(ref := sub.get(key), str) else None
            if isinstance(target, dict) and any("x-entity" in inner for _, inner in _subschemas(target)):
                problems.append(
                    f"{source}: {where}: {key} {ref} of {name} leads to an x-entity the gate does not check "
                    "through a reference: annotate the top-level property itself"
                )
    return problems


def _top_level(schema: dict[str, Any]) -> dict[str, dict[str, Any]]:
    properties = schema.get("properties")
    if not isinstance(properties, dict):
        return {}
    return {prop: sub for prop, sub in properties.items() if isinstance(sub, dict)}
