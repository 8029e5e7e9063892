"""The tool registry: an agent's tool schemas (*.json in its folder) bound to its handlers and policies.

Each schema file is exactly what the model sees ({"name", "description", "input_schema"}),
with JSON Schema 2020-12 input schemas that are strict (every object closes with
`additionalProperties: false`). Fields that reference an entity carry `"x-entity": kind`;
the gate resolves them for the principal before any policy or handler runs. `api_tools()`
strips the `x-` keywords and marks the last tool for prompt caching.

Loading fails loudly (RegistryError, with every problem found in its `problems`) when a
schema has no handler, a handler has no schema, a policy or entity kind is unbound, or a
schema is invalid or not strict. Tools declared as Python functions (services/_sdk/functions.py)
become the same documents and pass the same checks.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from roundtrip._sdk.context import ToolContext

Handler = Callable[[dict[str, Any], ToolContext], Awaitable[dict[str, Any]]]
Policy = Callable[[dict[str, Any], dict[str, dict[str, Any]], ToolContext], Awaitable[str | None]]
EntityResolver = Callable[[str, ToolContext], Awaitable[dict[str, Any] | None]]
# (input, resolved entities, the agent's own settings) -> the reason a person must approve first, or None
ApprovalRule = Callable[[dict[str, Any], dict[str, dict[str, Any]], Any], str | None]


async def allow(args: dict[str, Any], entities: dict[str, dict[str, Any]], ctx: ToolContext) -> str | None:
    """The policy of a tool that declares none."""
    return None

TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
SCHEMA_KEYS = {"name", "description", "input_schema"}
# Keywords whose value maps *names* (not keywords) to subschemas.
_NAMED_SUBSCHEMAS = {"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"}


class RegistryError(Exception):
    """The tool schemas and the code do not fit together (`problems`: every one found, each a sentence)."""

    def __init__(self, message: str, problems: list[str] | None = None) -> None:
        super().__init__(message)
        self.problems = list(problems) if problems else [message]


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str
    input_schema: dict[str, Any]
    entity_refs: dict[str, str] = field(default_factory=dict)  # top-level field -> entity kind

    def api_tool(self) -> dict[str, Any]:
        """This tool as an element of the Messages API `tools` array (no `x-` keywords)."""
        return {"name": self.name, "description": self.description, "input_schema": strip_extensions(self.input_schema)}


def strip_extensions(schema: Any, top: bool = True) -> Any:
    """A copy of a JSON Schema without custom `x-` keywords (and without `$schema`)."""
    if isinstance(schema, list):
        return [strip_extensions(s, top=False) for s in schema]
    if not isinstance(schema, dict):
        return copy.deepcopy(schema)
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key.startswith("x-") or (top and key == "$schema"):
            continue
        if key in _NAMED_SUBSCHEMAS and isinstance(value, dict):
            out[key] = {name: strip_extensions(sub, top=False) for name, sub in value.items()}
        elif isinstance(value, (dict, list)) and key not in ("enum", "const", "examples", "default"):
            out[key] = strip_extensions(value, top=False)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _object_schemas(schema: Any, path: str = "#") -> list[tuple[str, dict[str, Any]]]:
    """Every (path, subschema) that describes an object, for the strictness check."""
    found: list[tuple[str, dict[str, Any]]] = []
    if isinstance(schema, list):
        for i, sub in enumerate(schema):
            found += _object_schemas(sub, f"{path}/{i}")
        return found
    if not isinstance(schema, dict):
        return found
    if schema.get("type") == "object" or "properties" in schema:
        found.append((path, schema))
    for key, value in schema.items():
        if key in _NAMED_SUBSCHEMAS and isinstance(value, dict):
            for name, sub in value.items():
                found += _object_schemas(sub, f"{path}/{key}/{name}")
        elif key in ("items", "additionalItems", "contains", "not", "if", "then", "else", "prefixItems",
                     "allOf", "anyOf", "oneOf", "unevaluatedItems", "propertyNames"):
            found += _object_schemas(value, f"{path}/{key}")
    return found


def document_problems(doc: Any, source: str = "<tool>") -> tuple[ToolSpec | None, list[str]]:
    """Every problem of one tool document, and its ToolSpec when its name, description and schema can be read."""
    if not isinstance(doc, dict) or set(doc) != SCHEMA_KEYS:
        keys = sorted(doc) if isinstance(doc, dict) else type(doc).__name__
        return None, [f"{source}: a tool document has exactly the keys {sorted(SCHEMA_KEYS)}, got {keys}"]
    name, description, schema = doc["name"], doc["description"], doc["input_schema"]
    problems: list[str] = []
    if not isinstance(name, str) or not TOOL_NAME.match(name):
        problems.append(f"{source}: tool name {name!r} must match {TOOL_NAME.pattern}")
    if not isinstance(description, str) or len(description.strip()) < 20:
        problems.append(f"{source}: tool {name} needs a real description (a sentence of 20 characters or more)")
    if not isinstance(schema, dict) or schema.get("type") != "object":
        return None, [*problems, f"{source}: input_schema of {name} must be a JSON Schema with type 'object'"]
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        problems.append(f"{source}: input_schema of {name} is not valid JSON Schema 2020-12: {exc.message}")
    if "required" not in schema:
        problems.append(f"{source}: input_schema of {name} must list 'required' (possibly empty)")
    problems += [f"{source}: {name} {path} must set additionalProperties: false"
                 for path, sub in _object_schemas(schema) if sub.get("additionalProperties") is not False]
    entity_refs: dict[str, str] = {}
    for prop, sub in (schema.get("properties") or {}).items():
        if isinstance(sub, dict) and "x-entity" in sub:
            if not isinstance(sub["x-entity"], str) or not sub["x-entity"]:
                problems.append(f"{source}: {name}.{prop} x-entity must be a non-empty string")
            else:
                entity_refs[prop] = sub["x-entity"]
    if not isinstance(name, str) or not TOOL_NAME.match(name):
        return None, problems
    return ToolSpec(name=name, description=str(description), input_schema=schema, entity_refs=entity_refs), problems


def check_tool_document(doc: Any, source: str = "<tool>") -> ToolSpec:
    """Validate one tool document and build its ToolSpec (RegistryError naming every problem when it is not fit)."""
    spec, problems = document_problems(doc, source)
    if problems or spec is None:
        raise RegistryError("; ".join(problems), problems)
    return spec


def binding_problems(
    specs: Mapping[str, ToolSpec],
    handlers: Mapping[str, Any],
    policies: Mapping[str, Any],
    entity_resolvers: Mapping[str, Any],
    approvals: Mapping[str, Any],
    serial: frozenset[str] | set[str],
    mounted: frozenset[str] | set[str] = frozenset(),
) -> list[str]:
    """What does not fit between the tools and the code bound to them by name (`mounted`: tools an MCP server brings
    later, which bindings may name)."""
    problems = []
    if stray := sorted((set(approvals) | set(serial)) - set(specs) - set(mounted)):
        problems.append(f"approval rules or serial declarations for unknown tools: {stray}")
    if missing := sorted(set(specs) - set(handlers)):
        problems.append(f"schemas without a handler: {missing}")
    if orphans := sorted(set(handlers) - set(specs)):
        problems.append(f"handlers without a schema: {orphans}")
    if stray := sorted(set(policies) - set(specs) - set(mounted)):
        problems.append(f"policies for unknown tools: {stray}")
    kinds = {kind for spec in specs.values() for kind in spec.entity_refs.values()}
    if unbound := sorted(kinds - set(entity_resolvers)):
        problems.append(f"x-entity kinds without a resolver: {unbound}")
    return problems


class Registry:
    def __init__(
        self,
        specs: Mapping[str, ToolSpec],
        handlers: Mapping[str, Handler],
        policies: Mapping[str, Policy] | None = None,
        entity_resolvers: Mapping[str, EntityResolver] | None = None,
        approvals: Mapping[str, ApprovalRule] | None = None,
        serial: frozenset[str] | set[str] | None = None,
        mounted: frozenset[str] | set[str] | None = None,
    ) -> None:
        self.specs: dict[str, ToolSpec] = dict(specs)
        self.mounted = frozenset(mounted or ())  # tools an MCP server brings later (services/_sdk/mcp.py): bindings may name them
        self.local = frozenset(self.specs)  # the agent's own tools (not mounted ones)
        self._handlers = dict(handlers)
        self._policies = dict(policies or {})
        self._resolvers = dict(entity_resolvers or {})
        self._approvals = dict(approvals or {})
        self.serial = frozenset(serial or ())
        problems = binding_problems(self.specs, self._handlers, self._policies, self._resolvers, self._approvals, self.serial,
                                    self.mounted)
        if problems:
            raise RegistryError("tool registry does not fit together: " + "; ".join(problems), problems)

    def mount(self, spec: ToolSpec, handler: Handler) -> None:
        """Add a tool listed at run time by an MCP server (RegistryError when its name is taken)."""
        if spec.name in self.specs:
            raise RegistryError(f"tool {spec.name} is already declared")
        self.specs[spec.name] = spec
        self._handlers[spec.name] = handler

    def __contains__(self, name: object) -> bool:
        return name in self.specs

    def __len__(self) -> int:
        return len(self.specs)

    @property
    def names(self) -> list[str]:
        return sorted(self.specs)

    def get(self, name: str) -> ToolSpec | None:
        return self.specs.get(name)

    def handler(self, name: str) -> Handler:
        """The async handler of a tool (KeyError for an unknown tool)."""
        return self._handlers[name]

    def policy(self, name: str) -> Policy:
        """The authorization policy of a tool; tools without one get `allow` (KeyError if unknown)."""
        if name not in self.specs:
            raise KeyError(name)
        return self._policies.get(name, allow)

    def approval_rule(self, name: str) -> ApprovalRule | None:
        """When a call of this tool needs a person's approval first (None: never)."""
        return self._approvals.get(name)

    def is_serial(self, name: str) -> bool:
        """The tool must not run concurrently with other calls of its step."""
        return name in self.serial

    def entity_resolver(self, kind: str) -> EntityResolver:
        """`async (entity_id, ctx) -> entity | None`, scoped to ctx.customer_id."""
        return self._resolvers[kind]

    async def resolve_entities(self, name: str, args: Mapping[str, Any], ctx: ToolContext) -> dict[str, dict[str, Any] | None]:
        """{field: entity or None} for every x-entity field present in `args` (None: missing or not the principal's)."""
        resolved: dict[str, dict[str, Any] | None] = {}
        for prop, kind in self.specs[name].entity_refs.items():
            if prop in args:
                resolved[prop] = await self._resolvers[kind](str(args[prop]), ctx)
        return resolved

    def api_tools(self, cache: bool = True) -> list[dict[str, Any]]:
        """The `tools` parameter of messages.create, in a stable order (prompt caching needs it)."""
        tools = [self.specs[name].api_tool() for name in self.names]
        if cache and tools:
            tools[-1]["cache_control"] = {"type": "ephemeral"}
        return tools


def collect_specs(schemas_dir: Path) -> tuple[dict[str, ToolSpec], list[str]]:
    """The tool documents of a folder that can be read, and every problem of all of them."""
    specs: dict[str, ToolSpec] = {}
    problems: list[str] = []
    files = sorted(Path(schemas_dir).glob("*.json"))
    if not files:
        return specs, [f"no tool schemas in {schemas_dir}"]
    for path in files:
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            problems.append(f"{path}: invalid JSON: {exc}")
            continue
        spec, found = document_problems(doc, source=str(path))
        problems += found
        if spec is not None and spec.name != path.stem:
            problems.append(f"{path}: tool name {spec.name!r} must match the file name")
        if spec is not None:
            specs[spec.name] = spec
    return specs, problems


def load_specs(schemas_dir: Path) -> dict[str, ToolSpec]:
    specs, problems = collect_specs(schemas_dir)
    if problems:
        raise RegistryError("; ".join(problems), problems)
    return specs


def load_registry(
    schemas_dir: Path,
    *,
    handlers: Mapping[str, Handler],
    policies: Mapping[str, Policy] | None = None,
    entity_resolvers: Mapping[str, EntityResolver] | None = None,
    approvals: Mapping[str, ApprovalRule] | None = None,
    serial: frozenset[str] | set[str] | None = None,
    mounted: frozenset[str] | set[str] | None = None,
) -> Registry:
    """Load `schemas_dir`/*.json and bind them to the given handlers, policies, resolvers and rules."""
    return Registry(load_specs(Path(schemas_dir)), handlers, policies, entity_resolvers, approvals, serial, mounted)
