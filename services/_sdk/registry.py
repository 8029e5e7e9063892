"""The tool registry: an agent's tool documents bound to its handlers, policies, resolvers and approval rules.

A document is what the model sees, checked against schemas/tool.json (one problem per violation, by JSON path); what
that cannot say (where an `x-entity` may be, the file's name, the bindings) is checked here.
"""

from __future__ import annotations

import copy
import functools
import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError

import roundtrip.schemas
from roundtrip._sdk.context import ToolContext
from roundtrip._sdk.entity_places import NAMED_SUBSCHEMAS, entity_problems

Handler = Callable[[dict[str, Any], ToolContext], Awaitable[dict[str, Any]]]
Policy = Callable[[dict[str, Any], dict[str, dict[str, Any]], ToolContext], Awaitable[str | None]]
EntityResolver = Callable[[str, ToolContext], Awaitable[dict[str, Any] | None]]
# (input, resolved entities, the agent's own settings) -> the reason a person must approve first, or None
ApprovalRule = Callable[[dict[str, Any], dict[str, dict[str, Any]], Any], str | None]


async def allow(args: dict[str, Any], entities: dict[str, dict[str, Any]], ctx: ToolContext) -> str | None:
    """The policy of a tool that declares none."""
    return None


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
        return {"name": self.name, "description": self.description, "input_schema": strip_extensions(self.input_schema)}


def strip_extensions(schema: Any, top: bool = True) -> Any:
    if isinstance(schema, list):
        return [strip_extensions(s, top=False) for s in schema]
    if not isinstance(schema, dict):
        return copy.deepcopy(schema)
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key.startswith("x-") or (top and key == "$schema"):
            continue
        if key in NAMED_SUBSCHEMAS and isinstance(value, dict):
            out[key] = {name: strip_extensions(sub, top=False) for name, sub in value.items()}
        elif isinstance(value, (dict, list)) and key not in ("enum", "const", "examples", "default"):
            out[key] = strip_extensions(value, top=False)
        else:
            out[key] = copy.deepcopy(value)
    return out


TOOL_DOCUMENT = Path(roundtrip.schemas.__file__).parent / "tool.json"


@functools.cache
def tool_document_validator() -> Draft202012Validator:
    schema = json.loads(TOOL_DOCUMENT.read_text(encoding="utf-8"))
    return Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)


def _sentence(error: ValidationError, doc: Any) -> str:
    """The `x-message` of tool.json nearest the failing keyword, filled in with what was found."""
    root = tool_document_validator().schema
    assert isinstance(root, dict)
    node: Any = root
    message = "{error}"
    for key in [*error.absolute_schema_path, None]:  # the path omits each `$ref` it followed
        while isinstance(node, dict):
            message = node.get("x-message", message)
            if key in node or "$ref" not in node:
                break
            node = _local(root, node["$ref"])
        if node is None or key is None:
            break
        node = node[key]
    where = list(error.absolute_path)
    inside = where[1:] if where[:1] == ["input_schema"] else where
    schema = error.schema if isinstance(error.schema, dict) else {}
    return message.format(
        name=doc.get("name") if isinstance(doc, dict) else None,
        value=error.instance,
        json=json.dumps(error.instance, default=repr),
        pointer=_pointer(inside),
        parent=_pointer(inside[:-1]),
        error=error.message,
        pattern=schema.get("pattern"),
    )


def _local(root: dict[str, Any], ref: str) -> Any:
    if not ref.startswith("#/"):
        return None
    node: Any = root
    for part in ref.removeprefix("#/").split("/"):
        node = node[part]
    return node


def _pointer(parts: list[Any]) -> str:
    return "#" + "".join(f"/{part}" for part in parts)


def document_problems(doc: Any, source: str) -> tuple[ToolSpec | None, list[str]]:
    """Every problem of one tool document, and its ToolSpec when its name, description and schema can be read."""
    errors = list(tool_document_validator().iter_errors(doc))
    problems = list(dict.fromkeys(f"{source}: {error.json_path}: {_sentence(error, doc)}" for error in errors))
    problems += entity_problems(doc, source)
    if any(list(error.absolute_path)[:1] in ([], ["name"]) for error in errors):
        return None, problems
    name, description, schema = doc["name"], doc["description"], doc["input_schema"]
    if not isinstance(schema, dict):
        return None, problems
    properties = found if isinstance(found := schema.get("properties"), dict) else {}
    entity_refs = {
        prop: sub["x-entity"]
        for prop, sub in properties.items()
        if isinstance(sub, dict) and isinstance(sub.get("x-entity"), str) and sub["x-entity"]
    }
    return ToolSpec(name=name, description=str(description), input_schema=schema, entity_refs=entity_refs), problems


def check_tool_document(doc: Any, source: str) -> ToolSpec:
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
    mounted: frozenset[str] | set[str],
) -> list[str]:
    """What does not fit between the tools and the code bound to them by name (`mounted`: MCP tools to come)."""
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
        policies: Mapping[str, Policy],
        entity_resolvers: Mapping[str, EntityResolver],
        approvals: Mapping[str, ApprovalRule],
        serial: frozenset[str] | set[str],
        mounted: frozenset[str] | set[str],
    ) -> None:
        self.specs: dict[str, ToolSpec] = dict(specs)
        self.mounted = frozenset(mounted)  # tools an MCP server brings later: bindings may name them
        self.local = frozenset(self.specs)
        self._handlers = dict(handlers)
        self._policies = dict(policies)
        self._resolvers = dict(entity_resolvers)
        self._approvals = dict(approvals)
        self.serial = frozenset(serial)
        problems = binding_problems(
            self.specs, self._handlers, self._policies, self._resolvers, self._approvals, self.serial, self.mounted
        )
        if problems:
            raise RegistryError("tool registry does not fit together: " + "; ".join(problems), problems)

    def mount(self, spec: ToolSpec, handler: Handler) -> None:
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
        return self._handlers[name]

    def policy(self, name: str) -> Policy:
        if name not in self.specs:
            raise KeyError(name)
        return self._policies.get(name, allow)

    def approval_rule(self, name: str) -> ApprovalRule | None:
        return self._approvals.get(name)

    def is_serial(self, name: str) -> bool:
        return name in self.serial

    def entity_resolver(self, kind: str) -> EntityResolver:
        return self._resolvers[kind]

    async def resolve_entities(
        self, name: str, args: Mapping[str, Any], ctx: ToolContext
    ) -> dict[str, dict[str, Any] | None]:
        """{field: entity, or None when missing or not the principal's} for each x-entity field in `args`."""
        resolved: dict[str, dict[str, Any] | None] = {}
        for prop, kind in self.specs[name].entity_refs.items():
            if prop in args:
                resolved[prop] = await self._resolvers[kind](str(args[prop]), ctx)
        return resolved

    def api_tools(self, cache: bool) -> list[dict[str, Any]]:
        """The `tools` of messages.create, in a stable order, as prompt caching needs."""
        tools = [self.specs[name].api_tool() for name in self.names]
        if cache and tools:
            tools[-1]["cache_control"] = {"type": "ephemeral"}
        return tools


def collect_specs(schemas_dir: Path) -> tuple[dict[str, ToolSpec], list[str]]:
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
