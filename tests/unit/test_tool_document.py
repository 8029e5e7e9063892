"""schemas/tool.json, the schema every tool document must satisfy: it is valid JSON Schema 2020-12, every tool document
this repository ships passes it, and a document breaking any one of its rules is refused by `roundtrip agent check`
with a line naming the file, the JSON path and the rule."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Annotated

import pytest
from jsonschema import Draft202012Validator
from typer.testing import CliRunner

import roundtrip.schemas
from roundtrip import Entity, ToolContext, tool
from roundtrip._cli.main import app
from roundtrip._sdk.registry import TOOL_DOCUMENT, collect_specs, document_problems, tool_document_validator

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = sorted((ROOT / "schemas" / "tools").glob("*.json")) + sorted(
    (ROOT / "examples" / "telecom-agent" / "telecom_agent" / "schemas").glob("*.json")
)
GOOD = {
    "name": "wrap_order",
    "description": "Gift-wrap one of the customer's orders, with a card.",
    "input_schema": {
        "type": "object",
        "additionalProperties": False,
        "required": ["order_id"],
        "properties": {
            "order_id": {"type": "string", "pattern": "^ord_[0-9a-f]{8}$", "x-entity": "order"},
            "ribbon": {"type": "object", "additionalProperties": False, "properties": {"color": {"type": "string"}}},
            "cards": {
                "type": "array",
                "maxItems": 3,
                "items": {"type": "object", "additionalProperties": False, "properties": {"text": {"type": "string"}}},
            },
        },
    },
}


def test_the_tool_document_schema_is_valid_json_schema_2020_12_and_ships_with_the_package():
    schema = json.loads((ROOT / "schemas" / "tool.json").read_text(encoding="utf-8"))
    Draft202012Validator.check_schema(schema)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert Path(roundtrip.schemas.__file__).parent / "tool.json" == TOOL_DOCUMENT
    assert TOOL_DOCUMENT.samefile(ROOT / "schemas" / "tool.json")
    assert tool_document_validator().schema == schema


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_every_tool_document_shipped_passes_the_schema(path):
    doc = json.loads(path.read_text(encoding="utf-8"))
    assert [error.message for error in tool_document_validator().iter_errors(doc)] == []
    spec, problems = document_problems(doc, str(path))
    assert problems == [] and spec is not None and spec.name == path.stem


def test_the_shipped_documents_are_the_six_of_the_demo_agent_and_the_four_of_the_telecom_agent():
    assert len(SHIPPED) == 10 and {p.stem for p in SHIPPED[:6]} == {
        "list_orders",
        "lookup_order",
        "cancel_order",
        "get_shipping_status",
        "search_help_center",
        "escalate_to_human",
    }


def test_a_document_that_keeps_every_rule_passes():
    spec, problems = document_problems(GOOD, "wrap_order.json")
    assert problems == [] and spec is not None and spec.entity_refs == {"order_id": "order"}


def _broken(change) -> dict:
    doc = copy.deepcopy(GOOD)
    change(doc)
    return doc


def _set(doc: dict, path: str, value) -> None:
    *parents, last = path.split(".")
    for part in parents:
        doc = doc[part]
    if value is DELETE:
        del doc[last]
    else:
        doc[last] = value


DELETE = object()
RULES = [  # (what is changed, the JSON path named, the rule said)
    ("extra", 1, "$", "a tool document has exactly the keys ['description', 'input_schema', 'name']"),
    ("description", DELETE, "$", "a tool document has exactly the keys"),
    ("name", "wrap order", "$.name", "tool name 'wrap order' must match ^[a-zA-Z0-9_-]{1,64}$"),
    ("name", "w" * 65, "$.name", "must match ^[a-zA-Z0-9_-]{1,64}$"),
    (
        "description",
        "Wraps it.",
        "$.description",
        "tool wrap_order needs a real description (a sentence of 20 characters or more)",
    ),
    ("description", "   Wraps it.                 ", "$.description", "needs a real description"),
    (
        "input_schema.type",
        "array",
        "$.input_schema.type",
        "input_schema of wrap_order must be a JSON Schema with type 'object'",
    ),
    (
        "input_schema.required",
        DELETE,
        "$.input_schema",
        "input_schema of wrap_order must list 'required' (possibly empty)",
    ),
    (
        "input_schema.additionalProperties",
        DELETE,
        "$.input_schema",
        "wrap_order # must set additionalProperties: false",
    ),
    (
        "input_schema.additionalProperties",
        True,
        "$.input_schema.additionalProperties",
        "wrap_order # must set additionalProperties: false, not true",
    ),
    (
        "input_schema.properties.ribbon.additionalProperties",
        DELETE,
        "$.input_schema.properties.ribbon",
        "wrap_order #/properties/ribbon must set additionalProperties: false",
    ),
    (
        "input_schema.properties.cards.items.additionalProperties",
        {"type": "string"},
        "$.input_schema.properties.cards.items.additionalProperties",
        "wrap_order #/properties/cards/items must set additionalProperties: false",
    ),
    (
        "input_schema.properties.order_id.x-entity",
        "",
        "$.input_schema.properties.order_id['x-entity']",
        "x-entity of wrap_order must be a non-empty string",
    ),
    (
        "input_schema.properties.order_id.x-entity",
        7,
        "$.input_schema.properties.order_id['x-entity']",
        "x-entity of wrap_order must be a non-empty string",
    ),
    (
        "input_schema.properties.ribbon.properties.color.x-entity",
        "order",
        "$.input_schema.properties.ribbon.properties.color['x-entity']",
        "x-entity of wrap_order is only checked on a top-level property of input_schema",
    ),
    (
        "input_schema.properties.cards.items.x-entity",
        "order",
        "$.input_schema.properties.cards.items['x-entity']",
        "here the gate would not resolve it",
    ),
    (
        "input_schema.x-entity",
        "order",
        "$.input_schema['x-entity']",
        "x-entity of wrap_order is only checked on a top-level property",
    ),
    (
        "input_schema.properties.order_id.anyOf",
        [{"type": "string", "x-entity": "order"}],
        "$.input_schema.properties.order_id.anyOf[0]['x-entity']",
        "x-entity of wrap_order is only checked on a top-level property",
    ),
    (
        "input_schema.properties.ribbon.$ref",
        "#/properties/order_id",
        "$.input_schema.properties.ribbon",
        "$ref #/properties/order_id of wrap_order leads to an x-entity the gate does not check through a reference",
    ),
    (
        "input_schema.properties.order_id.$anchor",
        "order",
        "$.input_schema.properties.order_id",
        "the x-entity property of wrap_order must not be a $ref target ($anchor)",
    ),
    (
        "input_schema.properties.cards.maxItems",
        -1,
        "$.input_schema.properties.cards.maxItems",
        "input_schema of wrap_order is not valid JSON Schema 2020-12: -1 is less than the minimum of 0",
    ),
    (
        "input_schema.properties.order_id.pattern",
        "ord_[",
        "$.input_schema.properties.order_id.pattern",
        "input_schema of wrap_order is not valid JSON Schema 2020-12: 'ord_[' is not a 'regex'",
    ),
]


@pytest.mark.parametrize("where, value, path, rule", RULES, ids=lambda v: v if isinstance(v, str) else None)
def test_a_document_breaking_a_rule_is_refused_naming_file_path_and_rule(where, value, path, rule, tmp_path):
    file = tmp_path / "wrap_order.json"
    file.write_text(json.dumps(_broken(lambda doc: _set(doc, where, value))))
    _, problems = collect_specs(tmp_path)
    assert any(p.startswith(f"{file}: {path}: ") and rule in p for p in problems), problems
    assert all("\n" not in p and p.startswith(f"{file}: $") for p in problems), problems


def test_agent_check_reports_each_violation_of_the_folder_as_one_line_naming_file_and_path(tmp_path, monkeypatch):
    folder = tmp_path / "tools"
    folder.mkdir()
    loose = _broken(lambda doc: _set(doc, "input_schema.properties.ribbon.additionalProperties", DELETE))
    (folder / "wrap_order.json").write_text(json.dumps(loose))
    (folder / "lookup.json").write_text(
        json.dumps(_broken(lambda doc: doc.update(name="lookup", description="Looks.")))
    )
    (tmp_path / "desk_tooldoc.py").write_text(
        "from roundtrip import Agent\n"
        "async def handler(args, ctx):\n    return {}\n"
        f"AGENT = Agent(name='desk', system_prompt='You help.', tools_dir={str(folder)!r},\n"
        "              handlers={'wrap_order': handler, 'lookup': handler}, entities={'order': handler})\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    checked = CliRunner().invoke(app, ["agent", "check", "desk_tooldoc:AGENT"])
    assert checked.exit_code == 1, checked.output
    assert checked.output.splitlines() == [
        "agent 'desk': 2 problems",
        f"  - {folder / 'lookup.json'}: $.description: tool lookup needs a real description (a sentence of 20 "
        "characters or more)",
        f"  - {folder / 'wrap_order.json'}: $.input_schema.properties.ribbon: wrap_order #/properties/ribbon must set "
        "additionalProperties: false",
    ]


def test_an_x_entity_behind_a_ref_is_refused_where_it_is_and_where_it_is_referred_to():
    doc = _broken(
        lambda doc: doc["input_schema"].update(
            {
                "$defs": {"order_ref": {"type": "string", "x-entity": "order"}},
                "properties": {"gift_for": {"$ref": "#/$defs/order_ref"}},
                "required": [],
            }
        )
    )
    spec, problems = document_problems(doc, "wrap_order.json")
    assert set(problems) == {
        "wrap_order.json: $.input_schema['$defs'].order_ref['x-entity']: x-entity of wrap_order is only checked on "
        "a top-level property of input_schema; here the gate would not resolve it: make the id a top-level argument "
        "(or drop the annotation)",
        "wrap_order.json: $.input_schema.properties.gift_for: $ref #/$defs/order_ref of wrap_order leads to an "
        "x-entity the gate does not check through a reference: annotate the top-level property itself",
    }
    assert spec is not None and spec.entity_refs == {}  # what the gate would have checked: nothing


def test_a_recursive_schema_holding_an_entity_is_refused_and_a_top_level_entity_with_a_ref_is_not():
    recursive = _broken(lambda doc: doc["input_schema"]["properties"].update(parent={"$ref": "#"}))
    assert any("$ref # of wrap_order leads to an x-entity" in p for p in document_problems(recursive, "<tool>")[1])
    annotated_ref = _broken(
        lambda doc: doc["input_schema"].update(
            {
                "$defs": {"order_id": {"type": "string", "pattern": "^ord_[0-9a-f]{8}$"}},
                "properties": {"order_id": {"$ref": "#/$defs/order_id", "x-entity": "order"}},
            }
        )
    )
    spec, problems = document_problems(annotated_ref, "<tool>")
    assert problems == [] and spec is not None and spec.entity_refs == {"order_id": "order"}


def test_a_python_tool_with_an_entity_inside_a_list_is_refused_naming_the_tool_and_path():
    @tool
    async def wrap_orders(ctx: ToolContext, order_ids: list[Annotated[str, Entity("order")]]) -> dict:
        """Gift-wrap several of the customer's orders at once."""
        return {}

    assert [p.split(": ", 2)[1:] for p in wrap_orders.problems({"order"})] == [
        [
            "$.input_schema.properties.order_ids.items['x-entity']",
            "x-entity of wrap_orders is only checked on a top-level property of input_schema; here the gate would not "
            "resolve it: make the id a top-level argument (or drop the annotation)",
        ]
    ]


def test_agent_check_lists_an_x_entity_the_gate_would_not_check_with_the_tool_and_path(tmp_path, monkeypatch):
    folder = tmp_path / "tools"
    folder.mkdir()
    nested = _broken(lambda doc: _set(doc, "input_schema.properties.cards.items.properties.text.x-entity", "order"))
    (folder / "wrap_order.json").write_text(json.dumps(nested))
    (tmp_path / "desk_nested_entity.py").write_text(
        "from roundtrip import Agent\n"
        "async def handler(args, ctx):\n    return {}\n"
        f"AGENT = Agent(name='desk', system_prompt='You help.', tools_dir={str(folder)!r},\n"
        "              handlers={'wrap_order': handler}, entities={'order': handler})\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    checked = CliRunner().invoke(app, ["agent", "check", "desk_nested_entity:AGENT"])
    assert checked.exit_code == 1, checked.output
    assert checked.output.splitlines() == [
        "agent 'desk': 1 problem",
        f"  - {folder / 'wrap_order.json'}: $.input_schema.properties.cards.items.properties.text['x-entity']: "
        "x-entity of wrap_order is only checked on a top-level property of input_schema; here the gate would not "
        "resolve it: make the id a top-level argument (or drop the annotation)",
    ]
