"""What an agent author writes and runs: tools as Python functions, `roundtrip agent check` naming every problem of
a broken agent, and `roundtrip agent init` making a package that passes the check and its own tests."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path
from typing import Annotated, Any

import pytest
from pydantic import BaseModel, ConfigDict, Field
from typer.testing import CliRunner

from roundtrip import Agent, AgentError, Entity, ToolContext, always, tool
from roundtrip._cli.help import this_command
from roundtrip._cli.main import app
from roundtrip._gate.validation import InputValidator
from tests.agents import SHOP

ROOT = Path(__file__).resolve().parents[2]


async def resolve_ticket(ticket_id: str, ctx: ToolContext) -> dict[str, Any] | None:
    return {"ticket_id": ticket_id, "customer_id": ctx.customer_id} if ticket_id.startswith("T-") else None


@tool
async def close_ticket(
    ctx: ToolContext,
    ticket_id: Annotated[str, Entity("ticket"), Field(description="The ticket's id, e.g. T-1")],
    note: Annotated[str, Field(max_length=50)] = "",
    urgent: bool = False,
) -> dict[str, Any]:
    """Close one of the customer's open tickets, with a note saying why."""
    return {"closed": ticket_id, "note": note, "urgent": urgent, "by": ctx.customer_id}


class Refund(BaseModel):
    model_config = ConfigDict(extra="forbid")

    ticket_id: Annotated[str, Entity("ticket")]
    cents: int = Field(gt=0)


@tool(name="refund")
async def refund_ticket(args: Refund, ctx: ToolContext) -> Refund:
    """Refund part of what the customer paid for the ticket's order."""
    return args.model_copy(update={"cents": args.cents})


def agent(**change: Any) -> Agent:
    return dataclasses.replace(
        Agent(
            name="desk",
            system_prompt="You help the desk's customers.",
            tools=[close_ticket, refund_ticket],
            entities={"ticket": resolve_ticket},
        ),
        **change,
    )


def ctx(customer: str = "cus_1") -> ToolContext:
    return ToolContext(customer_id=customer, tool_use_id="toolu_1", idempotency_key="k")


# -- tools as functions -----------------------------------------------------------------------------------------


def test_a_function_becomes_a_strict_tool_document_from_its_annotations_and_docstring():
    registry = agent().check().registry
    spec = registry.get("close_ticket")
    assert spec.description == "Close one of the customer's open tickets, with a note saying why."
    assert spec.input_schema == {
        "type": "object",
        "additionalProperties": False,
        "required": ["ticket_id"],
        "properties": {
            "ticket_id": {"type": "string", "description": "The ticket's id, e.g. T-1", "x-entity": "ticket"},
            "note": {"type": "string", "maxLength": 50, "default": ""},
            "urgent": {"type": "boolean", "default": False},
        },
    }
    assert spec.entity_refs == {"ticket_id": "ticket"}  # the gate resolves it for the principal
    assert "x-entity" not in json.dumps(spec.api_tool())  # the model never sees the annotation
    validator = InputValidator(spec.input_schema)
    assert validator.problems({"ticket_id": "T-1", "note": "x" * 51}) and validator.problems(
        {"ticket_id": "T-1", "who": "bob"}
    )


async def test_the_handler_gets_the_context_and_typed_arguments_or_the_model():
    registry = agent().check().registry
    closed = await registry.handler("close_ticket")({"ticket_id": "T-7", "urgent": True}, ctx("cus_9"))
    assert closed == {"closed": "T-7", "note": "", "urgent": True, "by": "cus_9"}
    assert registry.get("refund").entity_refs == {"ticket_id": "ticket"}
    assert await registry.handler("refund")({"ticket_id": "T-7", "cents": 250}, ctx()) == {
        "ticket_id": "T-7",
        "cents": 250,
    }


def test_schema_documents_and_functions_make_one_agent():
    both = dataclasses.replace(SHOP, tools=[close_ticket], entities={**SHOP.entities, "ticket": resolve_ticket}).check()
    assert "close_ticket" in both.registry and "cancel_order" in both.registry and both.digest != SHOP.digest


# -- agent check: every problem, each named ----------------------------------------------------------------------


async def no_docstring(ctx: ToolContext, ticket_id: str) -> dict:
    return {}


def sync_tool(ctx: ToolContext, ticket_id: str) -> dict:
    """A tool that forgot to be async, so it would block every other turn."""
    return {}


async def untyped(ctx: ToolContext, ticket_id) -> dict:  # the point of the test
    """A tool whose argument has no type, so it has no schema."""
    return {}


class Opaque:
    """A type pydantic knows nothing of."""


async def opaque(ctx: ToolContext, thing: Opaque) -> dict:
    """A tool whose argument's type has no JSON Schema."""
    return {}


class Loose(BaseModel):  # extra fields allowed: not strict
    ticket_id: str


async def loose(args: Loose) -> dict:
    """A tool whose model lets the model send any field it likes."""
    return {}


LOOSE_DIR = {
    "name": "loose_doc",
    "description": "A schema document that does not close its object.",
    "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}},
}


@pytest.mark.parametrize(
    "change, problem",
    [
        ({"tools": [loose]}, "loose # must set additionalProperties: false"),
        ({"tools": [loose]}, "its model Loose needs model_config = ConfigDict(extra='forbid')"),
        ({"tools_dir": "LOOSE"}, "input_schema of loose_doc must list 'required' (possibly empty)"),
        ({"tools": [no_docstring]}, "tool no_docstring needs a real description"),
        ({"tools": [sync_tool]}, "tool sync_tool: the function must be `async def`"),
        ({"tools": [untyped]}, "tool untyped: argument 'ticket_id' has no type annotation"),
        ({"tools": [opaque]}, "tool opaque: its arguments cannot be a model: PydanticSchemaGenerationError"),
        ({"entities": {}}, "x-entity kinds without a resolver: ['ticket']"),
        ({"policies": {"reopen": lambda a, e, c: None}}, "policies for unknown tools: ['reopen']"),
        (
            {"approvals": {"reopen": always("a person reopens")}},
            "approval rules or serial declarations for unknown tools: ['reopen']",
        ),
        ({"serial": frozenset({"reopen"})}, "approval rules or serial declarations for unknown tools: ['reopen']"),
        ({"handlers": {"reopen": close_ticket}}, "handlers without a schema: ['reopen']"),
        (
            {"handlers": {"close_ticket": close_ticket}},
            "handlers for function tools (a function is its own handler): ['close_ticket']",
        ),
        ({"tools": [close_ticket, close_ticket]}, "tool close_ticket is declared twice"),
        ({"tools": [tool(name="no spaces allowed")(close_ticket.fn)]}, "tool name 'no spaces allowed' must match"),
        ({"tools": []}, "no tools: give tools_dir (JSON Schema documents), tools (Python functions) or mcp_servers"),
        ({"name": "a desk"}, "the name must match"),
        ({"system_prompt": ""}, "the system prompt is empty"),
        ({"replies": {"nap": "zzz"}}, "replies for unknown outcomes ['nap']"),
    ],
)
def test_agent_check_refuses_a_broken_agent_naming_its_problem(change, problem, tmp_path):
    if change.get("tools_dir") == "LOOSE":
        (tmp_path / "loose_doc.json").write_text(json.dumps(LOOSE_DIR))
        change = {"tools_dir": tmp_path, "handlers": {"loose_doc": close_ticket}}
    broken = agent(**change)
    assert any(problem in p for p in broken.problems()), broken.problems()
    with pytest.raises(AgentError) as caught:
        broken.check()
    assert problem in str(caught.value) and "\n" not in str(caught.value)


def test_agent_check_names_every_problem_at_once_not_only_the_first():
    broken = agent(
        name="a desk",
        system_prompt=" ",
        tools=[close_ticket, sync_tool, untyped],
        entities={},
        policies={"reopen": lambda a, e, c: None},
    )
    problems = broken.problems()
    for expected in (
        "the name must match",
        "the system prompt is empty",
        "must be `async def`",
        "has no type annotation",
        "x-entity kinds without a resolver: ['ticket']",
        "policies for unknown tools: ['reopen']",
    ):
        assert sum(expected in p for p in problems) == 1, (expected, problems)


def test_the_checks_are_a_list_other_parts_can_add_to(monkeypatch):
    from roundtrip._sdk import agent as agents

    monkeypatch.setattr(agents, "CHECKS", [*agents.CHECKS, lambda a: ["mcp tool lookup is annotated but not listed"]])
    assert agent().problems() == ["mcp tool lookup is annotated but not listed"]


# -- the command --------------------------------------------------------------------------------------------------


@pytest.fixture
def module(tmp_path, monkeypatch):
    """Write a module of agents onto sys.path under a fresh name; returns its name."""
    monkeypatch.syspath_prepend(str(tmp_path))

    def write(source: str) -> str:
        name = f"desk_{uuid.uuid4().hex[:8]}"
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
        return name

    return write


BROKEN = """
    import dataclasses
    from tests.unit.test_agent_authoring import agent, sync_tool, untyped
    AGENT = agent(system_prompt="", tools=[sync_tool, untyped], entities={})
    FINE = agent()
"""


def test_agent_check_lists_every_problem_and_exits_1_or_sums_up_a_sound_agent(module):
    name = module(BROKEN)
    bad = CliRunner().invoke(app, ["agent", "check", f"{name}:AGENT"])
    assert bad.exit_code == 1, bad.output
    lines = bad.output.strip().splitlines()
    assert (
        lines[0] == "agent 'desk': 3 problems"
        and len(lines) == 4
        and all(line.startswith("  - ") for line in lines[1:])
    )
    good = CliRunner().invoke(app, ["agent", "check", f"{name}:FINE"])
    assert good.exit_code == 0, good.output
    assert good.output.startswith("agent desk: ok: 2 tools (close_ticket, refund), entity kinds ['ticket']")


def test_agent_check_of_a_bad_import_string_is_one_line_and_status_1(monkeypatch):
    monkeypatch.delenv("ROUNDTRIP_AGENT", raising=False)
    missing = CliRunner().invoke(app, ["agent", "check", "desk_nowhere_xyz:AGENT"])
    assert missing.exit_code == 1 and "cannot import desk_nowhere_xyz" in missing.output
    default = CliRunner().invoke(app, ["agent", "check"])  # ROUNDTRIP_AGENT unset: the demo shop's agent
    assert default.exit_code == 0 and default.output.startswith("agent support-agent: ok: 6 tools")


@pytest.mark.parametrize(
    ("source", "line", "what"),
    [
        ("x = 1\ndef broken(:\n    pass\n", 2, "SyntaxError: invalid syntax"),
        (
            "import json\nSETTINGS = json.loads('{')\n",
            2,
            "JSONDecodeError: Expecting property name",
        ),  # raised in a library it calls
        ("import os\n\nraise RuntimeError('no backend\\nconfigured')\n", 3, "RuntimeError: no backend configured"),
        ("import json\nimport desk_no_such_library_xyz\n", 2, "No module named 'desk_no_such_library_xyz'"),
    ],
)
def test_agent_check_reports_an_import_time_failure_as_one_line_with_file_and_line(
    module, tmp_path, source, line, what
):
    name = module(source)
    result = CliRunner().invoke(app, ["agent", "check", f"{name}:AGENT"])
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    assert lines[0].startswith(f"error: ROUNDTRIP_AGENT='{name}:AGENT': cannot import {name}: {what}"), lines[0]
    assert lines[0].endswith(f"({tmp_path / (name + '.py')}, line {line})"), lines[0]


def test_agent_init_makes_a_package_that_passes_the_check_and_its_own_tests(tmp_path, monkeypatch):
    made = CliRunner().invoke(app, ["agent", "init", "acme-desk", "--dir", str(tmp_path)])
    assert made.exit_code == 0, made.output
    package = tmp_path / "acme-desk"
    pyproject = (package / "pyproject.toml").read_text()
    assert '[project.entry-points."roundtrip.agents"]\nacme-desk = "acme_desk.agent:AGENT"' in pyproject
    monkeypatch.syspath_prepend(str(package))
    checked = CliRunner().invoke(app, ["agent", "check", "acme_desk.agent:AGENT"])
    assert (
        checked.exit_code == 0
        and "agent acme-desk: ok: 2 tools (close_ticket, get_ticket), entity kinds ['ticket']" in checked.output
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROUNDTRIP_")} | {
        "PYTHONPATH": os.pathsep.join([str(package), str(ROOT)])
    }
    tests = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(package / "tests")],
        capture_output=True,
        text=True,
        env=env,
        cwd=package,
        timeout=300,
    )
    assert tests.returncode == 0 and "5 passed" in tests.stdout, tests.stdout + tests.stderr
    assert "Warning" not in tests.stdout + tests.stderr  # pytest-asyncio's loop scope is set
    readme = (package / "README.md").read_text()
    assert f"{sys.executable} -m pytest" in readme  # this venv's Python, not the system's
    cli = this_command()  # and its roundtrip, runnable as printed: on PATH, else its path
    assert shutil.which(cli.split()[0]), cli
    for command in ("agent check acme_desk.agent:AGENT", "up", "eval run evals"):
        assert f"{cli} {command}" in made.output and f"{cli} {command}" in readme, command
    again = CliRunner().invoke(app, ["agent", "init", "acme-desk", "--dir", str(tmp_path)])
    assert again.exit_code == 1 and "exists and is not empty" in again.output
    assert CliRunner().invoke(app, ["agent", "init", "9lives", "--dir", str(tmp_path)]).exit_code == 1


def test_agent_check_asks_the_agents_mcp_servers_unless_offline(monkeypatch):
    from roundtrip._broker.embedded import free_port

    monkeypatch.setenv("ROUNDTRIP_MCP_GIFTWRAP_URL", f"http://127.0.0.1:{free_port()}/mcp")  # nothing listens there
    asked = CliRunner().invoke(app, ["agent", "check", "tests.mcp_agent:AGENT"])
    assert asked.exit_code == 1, asked.output
    assert "MCP server giftwrap" in asked.output and "does not answer" in asked.output
    offline = CliRunner().invoke(app, ["agent", "check", "--offline", "tests.mcp_agent:AGENT"])
    assert offline.exit_code == 0, offline.output
    assert offline.output.startswith("agent gifting-agent: ok:")
