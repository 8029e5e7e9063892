"""Schema validation of one tool call (JSON Schema 2020-12), with errors a model can act on.

Before the validator sees an input, one cheap walk rejects what no schema should have to handle: too deep, too large,
or not exactly JSON (NaN, integers beyond 2^53, unpaired surrogates). Strings are shown with invisible and non-ASCII
characters spelled out, so a model that copied a look-alike id can see what is wrong with it.
"""

from __future__ import annotations

import functools
import json
import math
import re
import unicodedata
from typing import Any

from jsonschema import Draft202012Validator, ValidationError, validators

# what the gate accepts of any tool's input (ids and short texts): not settings, and tighter than the transcript's
# limits, which only keep events under the broker's
MAX_INPUT_BYTES = 16_384
MAX_DEPTH = 8
MAX_ERRORS = 10
SAFE_INTEGER = 2**53 - 1


@functools.lru_cache(maxsize=256)
def ecma_regex(pattern: str) -> re.Pattern[str]:
    """Compile a JSON Schema pattern with ECMA-262 semantics: Python's `$` also matches before a trailing newline, and
    its `\\d`/`\\w` match any Unicode digit or letter."""
    out, i, in_class = [], 0, False
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\" and i + 1 < len(pattern):
            out.append(pattern[i : i + 2])
            i += 2
            continue
        if in_class:
            in_class = ch != "]"
        elif ch == "[":
            in_class = True
        elif ch == "$":
            ch = r"\Z"
        out.append(ch)
        i += 1
    return re.compile("".join(out), re.ASCII)


def _ecma_pattern(validator: Any, pattern: str, instance: Any, schema: dict[str, Any]) -> Any:
    if validator.is_type(instance, "string") and not ecma_regex(pattern).search(instance):
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


GateValidator = validators.extend(Draft202012Validator, {"pattern": _ecma_pattern})  # type: ignore[no-untyped-call]  # unannotated in types-jsonschema


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
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def _char_name(ch: str) -> str:
    control = {"\n": "LINE FEED", "\r": "CARRIAGE RETURN", "\t": "TAB"}.get(ch, "CONTROL CHARACTER")
    return f"U+{ord(ch):04X} {unicodedata.name(ch, control)}"


def string_hints(text: str) -> str:
    """Why a string that looks right may not be: whitespace, invisible or non-ASCII characters, case."""
    hints = []
    if text != text.strip():
        hints.append("it has leading or trailing whitespace")
    odd = [ch for ch in dict.fromkeys(text) if not ch.isascii() or (not ch.isprintable() and ch not in " ")]
    if odd:
        shown = ", ".join(_char_name(ch) for ch in odd[:3]) + (" and others" if len(odd) > 3 else "")
        hints.append(f"it contains non-ASCII or invisible character(s) {shown}; type it with plain ASCII characters")
    elif text != text.lower():
        hints.append("it has uppercase letters")
    return "; ".join(hints)


def _given(value: Any) -> str:
    try:
        text = json.dumps(value, ensure_ascii=True, default=str)
    except (ValueError, TypeError, RecursionError):
        text = repr(value)
    text = text if len(text) <= 60 else text[:57] + "..."
    return f"{text} ({_json_type(value)})"


def _name(key: Any) -> str:
    text = json.dumps(str(key), ensure_ascii=True)[1:-1]
    return f"`{text[:40]}{'...' if len(text) > 40 else ''}`"


def _field(path: Any) -> str:
    text = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path).lstrip(".")
    if not text:
        return "input"
    text = json.dumps(text, ensure_ascii=True)[1:-1]
    return text if len(text) <= 60 else text[:57] + "..."


def explain(error: ValidationError) -> str:
    """One sentence: which field, what was expected, what was given."""
    # jsonschema types these as possibly unset; an error its validation raised has them all
    v: Any = error.validator_value
    instance: Any = error.instance
    schema: Any = error.schema
    field, kind = _field(error.absolute_path), error.validator
    if kind == "required":
        missing = [name for name in v if isinstance(instance, dict) and name not in instance]
        return f"missing required field(s): {', '.join(f'`{m}`' for m in missing)}" + (
            "" if field == "input" else f" in `{field}`"
        )
    if kind == "additionalProperties":
        props = schema.get("properties", {})
        extra = sorted(k for k in instance if k not in props) if isinstance(instance, dict) else []
        shown = ", ".join(_name(e) for e in extra[:5]) + (f" and {len(extra) - 5} more" if len(extra) > 5 else "")
        allowed = ", ".join(f"`{p}`" for p in props)
        where = "" if field == "input" else f" in `{field}`"
        return f"unexpected field(s) {shown}{where}; allowed fields are {allowed or 'none'}"
    if kind == "type":
        return f"`{field}` must be of type {v}, got {_given(instance)}"
    if kind in ("enum", "const"):
        options = ", ".join(json.dumps(x) for x in (v if kind == "enum" else [v]))
        hint = string_hints(instance) if isinstance(instance, str) else ""
        return f"`{field}` must be one of {options}; got {_given(instance)}" + (f" ({hint})" if hint else "")
    if kind == "pattern":
        hint = string_hints(instance) if isinstance(instance, str) else ""
        return f"`{field}` must match the pattern {v}; got {_given(instance)}" + (f" ({hint})" if hint else "")
    if kind in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        words = {
            "minimum": "at least",
            "maximum": "at most",
            "exclusiveMinimum": "greater than",
            "exclusiveMaximum": "less than",
        }
        return f"`{field}` must be {words[kind]} {v}; got {_given(instance)}"
    if kind in ("minLength", "maxLength"):
        return (
            f"`{field}` must have {'at least' if kind == 'minLength' else 'at most'} {v} characters; got "
            f"{len(instance)}"
        )
    if kind == "format":
        return f"`{field}` must be a valid {v}; got {_given(instance)}"
    message = error.message if len(error.message) <= 200 else error.message[:197] + "..."
    return f"`{field}`: {message}"


def _walk_problem(tool_input: dict[str, Any]) -> str | None:
    """One pass over the input: depth, size, JSON-ness and exactness; stops at the first problem."""
    budget = MAX_INPUT_BYTES
    stack: list[tuple[Any, int, tuple[Any, ...]]] = [(tool_input, 1, ())]
    while stack:
        node, depth, path = stack.pop()
        if depth > MAX_DEPTH:
            return (
                f"the input is nested more than {MAX_DEPTH} levels deep (at `{_field(path[:MAX_DEPTH])}`); send a "
                "flat object"
            )
        if isinstance(node, dict):
            budget -= 2
            for key, value in node.items():
                if not isinstance(key, str):
                    return f"the input is not JSON: a key in `{_field(path)}` is not a string"
                budget -= len(key) + 4
                stack.append((value, depth + 1, (*path, key)))
        elif isinstance(node, list):
            budget -= 2
            stack.extend((value, depth + 1, (*path, i)) for i, value in enumerate(node))
        elif isinstance(node, str):
            budget -= len(node) + 2
            if budget < 0:
                break  # too large anyway: do not scan it
            try:
                node.encode("utf-8")
            except UnicodeEncodeError:
                return f"`{_field(path)}` contains an unpaired UTF-16 surrogate, which is not valid text"
        elif isinstance(node, bool) or node is None:
            budget -= 5
        elif isinstance(node, int):
            if abs(node) > SAFE_INTEGER:
                return (
                    f"`{_field(path)}` holds the integer {str(node)[:30]}, which is too large to be exchanged "
                    "exactly (at most 2^53-1 in magnitude)"
                )
            budget -= 8
        elif isinstance(node, float):
            if not math.isfinite(node):
                return f"`{_field(path)}` must be a finite number, got {node}"
            budget -= 8
        else:
            return f"`{_field(path)}` is not a JSON value ({type(node).__name__})"
        if budget < 0:
            break
    if budget >= 0:
        return None
    size = len(json.dumps(tool_input, ensure_ascii=False).encode())
    if size > MAX_INPUT_BYTES:
        return f"the input is {size} bytes; at most {MAX_INPUT_BYTES} are accepted. Send only the fields the tool needs"
    return None


class InputValidator:
    """Checks one tool's inputs; `problems()` is empty when the input is valid."""

    def __init__(self, schema: dict[str, Any]) -> None:
        GateValidator.check_schema(schema)
        self._validator = GateValidator(schema, format_checker=GateValidator.FORMAT_CHECKER)

    def problems(self, tool_input: Any) -> list[str]:
        if not isinstance(tool_input, dict):
            return [f"the input must be a JSON object with the tool's fields, got {_given(tool_input)}"]
        problem = _walk_problem(tool_input)
        if problem:
            return [problem]
        errors = sorted(
            self._validator.iter_errors(tool_input), key=lambda e: ([str(p) for p in e.absolute_path], e.validator)
        )
        return [explain(e) for e in errors[:MAX_ERRORS]]
