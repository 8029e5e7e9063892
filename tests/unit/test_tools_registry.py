"""The tool registry: every schema loads, is valid 2020-12, strict, and fits the code."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator

from roundtrip._gate.validation import InputValidator  # the validator the fleet uses
from roundtrip._sdk.registry import RegistryError, ToolSpec, strip_extensions
from tests.agents import SCHEMAS, SHOP, shop_registry

HANDLERS, POLICIES = SHOP.handlers, SHOP.policies
TOOLS = {
    "list_orders",
    "lookup_order",
    "cancel_order",
    "get_shipping_status",
    "search_help_center",
    "escalate_to_human",
}


def _walk(schema):
    """Every dict inside a schema (keyword level and below)."""
    if isinstance(schema, dict):
        yield schema
        for value in schema.values():
            yield from _walk(value)
    elif isinstance(schema, list):
        for value in schema:
            yield from _walk(value)


@pytest.fixture(scope="module")
def registry():
    return SHOP.registry


def test_the_shop_agents_tools_are_the_schemas_in_its_own_folder(registry):
    assert Path(__file__).resolve().parents[2] / "schemas" / "tools" == SCHEMAS
    assert set(registry.names) == TOOLS == {p.stem for p in SCHEMAS.glob("*.json")}


@pytest.mark.parametrize("path", sorted(SCHEMAS.glob("*.json")), ids=lambda p: p.stem)
def test_schema_file_is_a_strict_2020_12_tool(path):
    doc = json.loads(path.read_text())
    assert set(doc) == {"name", "description", "input_schema"}
    assert doc["name"] == path.stem
    assert len(doc["description"]) > 150  # what it does, when to use it, what it returns
    schema = doc["input_schema"]
    Draft202012Validator.check_schema(schema)
    assert schema["type"] == "object" and "required" in schema
    for sub in _walk(schema):
        if sub.get("type") == "object":
            assert sub.get("additionalProperties") is False
    for prop in schema["properties"].values():
        assert prop.get("description")
    # the principal is never a tool input
    assert not {"customer_id", "customer", "user_id", "principal"} & set(schema["properties"])


def test_entity_refs(registry):
    refs = {name: spec.entity_refs for name, spec in registry.specs.items()}
    assert refs == {
        "list_orders": {},
        "lookup_order": {"order_id": "order"},
        "cancel_order": {"order_id": "order"},
        "get_shipping_status": {"order_id": "order"},
        "search_help_center": {},
        "escalate_to_human": {},
    }
    assert isinstance(registry.get("cancel_order"), ToolSpec)
    assert registry.get("drop_tables") is None


def test_api_tools_strip_extensions_and_cache_the_last(registry):
    tools = registry.api_tools(cache=True)
    assert [t["name"] for t in tools] == sorted(TOOLS)
    for tool in tools[:-1]:
        assert set(tool) == {"name", "description", "input_schema"}
    assert tools[-1]["cache_control"] == {"type": "ephemeral"}
    for tool in tools:
        for sub in _walk(tool["input_schema"]):
            assert not any(k.startswith("x-") for k in sub if k not in ("properties",)), tool["name"]
        assert "$schema" not in tool["input_schema"]
        Draft202012Validator.check_schema(tool["input_schema"])
    assert all("cache_control" not in t for t in registry.api_tools(cache=False))
    # the registry's own schemas keep the keyword
    assert registry.get("lookup_order").input_schema["properties"]["order_id"]["x-entity"] == "order"
    # mutating the output does not touch the registry
    tools[0]["input_schema"]["properties"].clear()
    assert registry.api_tools(cache=True)[0]["input_schema"]["properties"]


def test_strip_extensions_keeps_property_names():
    schema = {
        "type": "object",
        "x-a": 1,
        "properties": {"x-name": {"type": "string", "x-entity": "order"}},
        "additionalProperties": False,
        "required": ["x-name"],
    }
    assert strip_extensions(schema) == {
        "type": "object",
        "properties": {"x-name": {"type": "string"}},
        "additionalProperties": False,
        "required": ["x-name"],
    }


@pytest.mark.parametrize(
    "tool, value, ok",
    [
        ("lookup_order", {"order_id": "ord_a1000003"}, True),
        ("lookup_order", {"order_id": "ord_9f3c"}, False),
        ("lookup_order", {"order_id": "ord_a1000003", "customer_id": "cus_1002"}, False),
        ("lookup_order", {}, False),
        ("cancel_order", {"order_id": "ord_a1000003", "reason": "customer_request"}, True),
        ("cancel_order", {"order_id": "ord_a1000003", "reason": "because"}, False),
        ("list_orders", {}, True),
        ("list_orders", {"status": "pending", "limit": 50}, True),
        ("list_orders", {"limit": 0}, False),
        ("list_orders", {"limit": "5"}, False),
        ("search_help_center", {"query": "r"}, False),
        ("search_help_center", {"query": "refunds"}, True),
        ("escalate_to_human", {"summary": "too short", "urgency": "high"}, False),
        ("escalate_to_human", {"summary": "The customer needs a human", "urgency": "urgent"}, False),
        ("escalate_to_human", {"summary": "The customer needs a human", "urgency": "low"}, True),
    ],
)
def test_validation(registry, tool, value, ok):
    assert (InputValidator(registry.get(tool).input_schema).problems(value) == []) is ok


def test_handlers_and_policies_are_bound(registry):
    for name in TOOLS:
        assert registry.handler(name) is HANDLERS[name]
        assert callable(registry.policy(name))
    assert registry.policy("cancel_order") is POLICIES["cancel_order"]
    with pytest.raises(KeyError):
        registry.handler("drop_tables")
    with pytest.raises(KeyError):
        registry.policy("drop_tables")


def _copy_schemas(tmp_path: Path) -> Path:
    target = tmp_path / "tools"
    shutil.copytree(SCHEMAS, target)
    return target


def test_schema_without_handler_fails(tmp_path):
    folder = _copy_schemas(tmp_path)
    doc = json.loads((folder / "lookup_order.json").read_text()) | {"name": "refund_order"}
    (folder / "refund_order.json").write_text(json.dumps(doc))
    with pytest.raises(RegistryError, match="schemas without a handler: \\['refund_order'\\]"):
        shop_registry(folder)


def test_handler_without_schema_fails(tmp_path):
    folder = _copy_schemas(tmp_path)
    (folder / "escalate_to_human.json").unlink()
    with pytest.raises(RegistryError, match="handlers without a schema: \\['escalate_to_human'\\]"):
        shop_registry(folder)


def test_loose_schema_fails(tmp_path):
    folder = _copy_schemas(tmp_path)
    doc = json.loads((folder / "lookup_order.json").read_text())
    del doc["input_schema"]["additionalProperties"]
    (folder / "lookup_order.json").write_text(json.dumps(doc))
    with pytest.raises(RegistryError, match="additionalProperties"):
        shop_registry(folder)


def test_invalid_schema_fails(tmp_path):
    folder = _copy_schemas(tmp_path)
    doc = json.loads((folder / "list_orders.json").read_text())
    doc["input_schema"]["properties"]["limit"]["minimum"] = "one"
    (folder / "list_orders.json").write_text(json.dumps(doc))
    with pytest.raises(RegistryError, match="not valid JSON Schema 2020-12"):
        shop_registry(folder)


def test_name_must_match_file(tmp_path):
    folder = _copy_schemas(tmp_path)
    (folder / "lookup_order.json").rename(folder / "find_order.json")
    with pytest.raises(RegistryError, match="must match the file name"):
        shop_registry(folder)


def test_unbound_entity_kind_fails(tmp_path):
    folder = _copy_schemas(tmp_path)
    with pytest.raises(RegistryError, match="x-entity kinds without a resolver: \\['order'\\]"):
        shop_registry(folder, entity_resolvers={})
