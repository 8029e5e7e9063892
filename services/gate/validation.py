"""Schema validation of one tool call, with errors a model can act on.

Validators are compiled once per tool (JSON Schema 2020-12, format checks on). Size and
depth are checked before the validator sees the input, so a hostile input costs little.
"""

from __future__ import annotations

import json
from typing import Any

from jsonschema import Draft202012Validator, ValidationError

MAX_INPUT_BYTES = 16_384
MAX_DEPTH = 8


def _depth(value: Any, limit: int) -> int:
    """Nesting depth of a JSON value, counting stops once past `limit`."""
    stack = [(value, 1)]
    deepest = 0
    while stack:
        node, d = stack.pop()
        deepest = max(deepest, d)
        if deepest > limit:
            return deepest
        if isinstance(node, dict):
            stack.extend((v, d + 1) for v in node.values())
        elif isinstance(node, list):
            stack.extend((v, d + 1) for v in node)
    return deepest


def _field(error: ValidationError) -> str:
    path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path).lstrip(".")
    return path or "input"


def _given(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, default=str)
    text = text if len(text) <= 60 else text[:57] + "..."
    return f"{text} ({_json_type(value)})"


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def explain(error: ValidationError) -> str:
    """One sentence: which field, what was expected, what was given."""
    field, v, kind = _field(error), error.validator_value, error.validator
    if kind == "required":
        missing = [name for name in v if isinstance(error.instance, dict) and name not in error.instance]
        return f"missing required field(s): {', '.join(f'`{m}`' for m in missing)}" + (
            "" if field == "input" else f" in `{field}`"
        )
    if kind == "additionalProperties":
        extra = sorted(set(error.instance) - set(error.schema.get("properties", {}))) if isinstance(error.instance, dict) else []
        allowed = ", ".join(f"`{p}`" for p in error.schema.get("properties", {}))
        return f"unexpected field(s) {', '.join(f'`{e}`' for e in extra)}; allowed fields are {allowed or 'none'}"
    if kind == "type":
        return f"`{field}` must be of type {v}, got {_given(error.instance)}"
    if kind == "enum":
        return f"`{field}` must be one of {', '.join(json.dumps(x) for x in v)}; got {_given(error.instance)}"
    if kind == "pattern":
        return f"`{field}` must match the pattern {v}; got {_given(error.instance)}"
    if kind in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        return f"`{field}` must be {kind.replace('exclusive', 'exclusive ').lower()} {v}; got {_given(error.instance)}"
    if kind in ("minLength", "maxLength"):
        return f"`{field}` must have {'at least' if kind == 'minLength' else 'at most'} {v} characters; got {len(error.instance)}"
    if kind == "format":
        return f"`{field}` must be a valid {v}; got {_given(error.instance)}"
    return f"`{field}`: {error.message}"


class InputValidator:
    def __init__(self, schema: dict[str, Any]) -> None:
        Draft202012Validator.check_schema(schema)
        self._validator = Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)

    def problems(self, tool_input: Any) -> list[str]:
        if not isinstance(tool_input, dict):
            return [f"the input must be a JSON object, got {_given(tool_input)}"]
        try:
            size = len(json.dumps(tool_input, ensure_ascii=False, default=str).encode())
        except (ValueError, TypeError, RecursionError):
            return ["the input is not valid JSON"]
        if size > MAX_INPUT_BYTES:
            return [f"the input is {size} bytes; at most {MAX_INPUT_BYTES} are accepted"]
        if _depth(tool_input, MAX_DEPTH) > MAX_DEPTH:
            return [f"the input is nested more than {MAX_DEPTH} levels deep"]
        errors = sorted(self._validator.iter_errors(tool_input), key=lambda e: (list(e.absolute_path), e.validator))
        return [explain(e) for e in errors[:10]]
