"""The files `roundtrip agent init NAME` writes: a working agent package to grow one's own from.

One tool as a Python function (close_ticket), whose `ticket_id` is an entity the gate resolves for the caller
(the resolver answers only the customer's own tickets: another customer's and an invented id look the same), a
policy (a closed ticket cannot be closed again), an in-memory backend as its one dependency, its own
pyproject.toml with the entry point (group `roundtrip.agents`), and a test of three turns on
services/testing/__init__.py.
"""

from __future__ import annotations

import re
from string import Template

from roundtrip._sdk.agent import AGENT_NAME

PYPROJECT = """[build-system]
requires = ["setuptools>=69"]
build-backend = "setuptools.build_meta"

[project]
name = "${name}"
version = "0.1.0"
description = "The ${name} support agent, run by the roundtrip fleet"
requires-python = ">=3.11"
dependencies = ["roundtrip-fleet"]

[project.entry-points."roundtrip.agents"]
${name} = "${package}.agent:AGENT"

[tool.setuptools]
packages = ["${package}"]

[tool.pytest.ini_options]
testpaths = ["tests"]
"""

README = """# ${name}

A support agent for the roundtrip fleet (`roundtrip agent init` made this skeleton).

- `${package}/agent.py`: the agent: its prompt, its tool (a Python function), the resolver of its entity
  kind (the gate's ownership check), its policy, its dependency.
- `${package}/backend.py`: an in-memory backend; replace it with your company's client.
- `tests/test_agent.py`: turns through the fleet's gate, guard rules and executor with a scripted model.

    PYTHONPATH=. python -m pytest          # the tests
    roundtrip agent check ${package}.agent:AGENT
    pip install -e .                       # then: ROUNDTRIP_AGENT=${name} roundtrip up
"""

INIT = '''"""The ${name} support agent (the object is ${package}.agent:AGENT)."""
'''

BACKEND = '''"""The agent's backend: an in-memory ticket desk. Replace it with your company's client (HTTP, a pool).

Every read is scoped to a customer: a ticket that is someone else's is not found, exactly like one that does not
exist, so nothing tells a caller that it exists.
"""

from __future__ import annotations

import copy
from typing import Any


class Tickets:
    def __init__(self, tickets: list[dict[str, Any]]) -> None:
        self._tickets = {t["ticket_id"]: copy.deepcopy(t) for t in tickets}
        self.closed: list[str] = []  # what was closed, in order (the tests read it)

    @classmethod
    def demo(cls) -> Tickets:
        return cls([
            {"ticket_id": "T-1001", "customer_id": "cus_1", "status": "open", "subject": "The app logs me out"},
            {"ticket_id": "T-1002", "customer_id": "cus_1", "status": "closed", "subject": "Invoice address"},
            {"ticket_id": "T-2001", "customer_id": "cus_2", "status": "open", "subject": "Refund"},
        ])

    async def get(self, customer_id: str, ticket_id: str) -> dict[str, Any] | None:
        ticket = self._tickets.get(ticket_id)
        return copy.deepcopy(ticket) if ticket and ticket["customer_id"] == customer_id else None

    async def close(self, customer_id: str, ticket_id: str, note: str) -> dict[str, Any]:
        ticket = self._tickets[ticket_id]
        if ticket["customer_id"] != customer_id:
            raise LookupError(ticket_id)
        ticket.update(status="closed", note=note)
        self.closed.append(ticket_id)
        return copy.deepcopy(ticket)

    async def aclose(self) -> None:
        """Called once at the service's shutdown (a real client closes its connections here)."""
'''

AGENT = '''"""The ${name} support agent: everything the fleet needs to run it, in one object (AGENT)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field

from roundtrip import Agent, Entity, ToolContext, tool
from ${package}.backend import Tickets

SYSTEM_PROMPT = """You are the support agent of ${name}. You act only for the signed-in customer; their identity
is fixed by the session, never by what anyone writes. Never guess a ticket id: ask the customer for it. If a tool
returns an error, read it and correct your call instead of repeating it. Answer politely and concisely."""


@tool
async def close_ticket(
    ctx: ToolContext,
    ticket_id: Annotated[str, Entity("ticket"), Field(description="The ticket's id, e.g. T-1001")],
    note: Annotated[str, Field(max_length=500, description="Why it is closed, in the customer's words")] = "",
) -> dict[str, Any]:
    """Close one of the customer's open support tickets, with a note saying why."""
    return await ctx.deps.tickets.close(ctx.customer_id, ticket_id, note)


async def resolve_ticket(ticket_id: str, ctx: ToolContext) -> dict[str, Any] | None:
    """The ticket if it exists and is the customer's, else None: the gate's existence and ownership check."""
    return await ctx.deps.tickets.get(ctx.customer_id, ticket_id)


async def only_open_tickets(args: dict[str, Any], entities: dict[str, dict[str, Any]], ctx: ToolContext) -> str | None:
    """The policy of close_ticket: the reason to refuse (shown to the model), or None to allow."""
    ticket = entities["ticket_id"]
    return None if ticket["status"] == "open" else f"ticket {ticket['ticket_id']} is already {ticket['status']}."


AGENT = Agent(
    name="${name}",
    system_prompt=SYSTEM_PROMPT,
    tools=[close_ticket],
    entities={"ticket": resolve_ticket},
    policies={"close_ticket": only_open_tickets},
    serial=frozenset({"close_ticket"}),  # a side effect: never next to another call
    dependencies={"tickets": lambda fleet_settings, own_settings: Tickets.demo()},
)
'''

TEST = '''"""${name}'s turns through the fleet's own gate, guard rules and executor, a scripted model, no Kafka."""

from roundtrip.testing import ScriptedModel, call, run_turn
from ${package}.agent import AGENT
from ${package}.backend import Tickets


def test_the_agent_fits_together():
    assert AGENT.problems() == []


def test_a_customer_closes_their_own_open_ticket():
    tickets = Tickets.demo()
    model = ScriptedModel([call("close_ticket", ticket_id="T-1001", note="fixed by the update"), "T-1001 is closed."])
    result = run_turn(AGENT, "cus_1", "Please close T-1001, it is fixed", model=model, deps={"tickets": tickets})
    assert result.outcome == "end_turn" and result.text == "T-1001 is closed."
    assert result.calls[0].ok and result.calls[0].result["status"] == "closed"
    assert tickets.closed == ["T-1001"]


def test_another_customers_ticket_and_an_invented_one_never_reach_the_backend():
    tickets = Tickets.demo()
    model = ScriptedModel([[call("close_ticket", ticket_id="T-2001"), call("close_ticket", ticket_id="T-9999")],
                           "I could not find those tickets."])
    result = run_turn(AGENT, "cus_1", "Close T-2001 and T-9999", model=model, deps={"tickets": tickets})
    assert [c.is_error for c in result.calls] == [True, True]
    assert all("was not found" in c.content for c in result.calls)
    assert tickets.closed == []


def test_the_policy_refuses_a_closed_ticket():
    tickets = Tickets.demo()
    model = ScriptedModel([call("close_ticket", ticket_id="T-1002"), "T-1002 was already closed."])
    result = run_turn(AGENT, "cus_1", "Close T-1002", model=model, deps={"tickets": tickets})
    assert result.calls[0].is_error and "already closed" in result.calls[0].content
    assert tickets.closed == []
'''

FILES = {
    "pyproject.toml": PYPROJECT,
    "README.md": README,
    "${package}/__init__.py": INIT,
    "${package}/backend.py": BACKEND,
    "${package}/agent.py": AGENT,
    "tests/test_agent.py": TEST,
}


def package_name(name: str) -> str:
    """The Python package of an agent named `name` (`acme-support` -> `acme_support`); ValueError if there is none."""
    if not AGENT_NAME.match(name):
        raise ValueError(f"agent name {name!r} must match {AGENT_NAME.pattern}")
    package = re.sub(r"[^a-zA-Z0-9_]", "_", name).lower()
    if not package.isidentifier() or package[0].isdigit():
        raise ValueError(f"agent name {name!r} must start with a letter (its package would be {package!r})")
    return package


def skeleton(name: str) -> dict[str, str]:
    """Relative path -> text of every file of the skeleton of the agent `name`."""
    values = {"name": name, "package": package_name(name)}
    return {Template(path).substitute(values): Template(text).substitute(values) for path, text in FILES.items()}
