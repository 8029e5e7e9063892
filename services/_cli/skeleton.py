"""The files `roundtrip agent init NAME` writes: a working agent package to grow one's own from.

Two tools (a Python function, and a JSON Schema document whose `ticket_id` is an entity the gate resolves for the
caller: another customer's ticket and an invented id look the same), a policy, a SQLite backend as its one dependency,
its own settings, pyproject.toml, Dockerfile, tests of its turns on `roundtrip.testing`, an example the simulator plays
with no API key and two evaluation cases.
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
# roundtrip's distribution is roundtrip-fleet (the PyPI project `roundtrip` is another, unrelated one)
dependencies = ["roundtrip-fleet"]

[project.optional-dependencies]
# pip install -e '.[test]': its tests run with the fleet's harness, roundtrip.testing; pytest-asyncio for async
# tests, its loop scope set below (unset, it warns on every run)
test = ["pytest", "pytest-asyncio"]

[project.entry-points."roundtrip.agents"]
${name} = "${package}.agent:AGENT"

[tool.setuptools]
packages = ["${package}"]

[tool.setuptools.package-data]
${package} = ["schemas/*.json"]  # its JSON Schema tool documents: the wheel carries them

[tool.pytest.ini_options]
testpaths = ["tests"]
pythonpath = ["."]
asyncio_default_fixture_loop_scope = "function"
"""

README = """# ${name}

A support agent for the roundtrip fleet (`roundtrip agent init` made this skeleton).

- `${package}/agent.py`: the agent: its prompt, its tools (close_ticket, a Python function; get_ticket, a JSON
  Schema document in `${package}/schemas/`), the resolver of its entity kind (the gate's ownership check), its
  policy, its own settings, its dependency.
- `${package}/backend.py`: the ticket desk, a SQLite file (`${package}.db` in the fleet's state folder, or
  `ROUNDTRIP_${upper}_DATABASE`); replace it with your company's client.
- `tests/test_agent.py`: turns through the fleet's gate, guard rules and executor with a scripted model.
- `evals/`: conversations the running fleet must keep handling the same way (`roundtrip eval run evals`), each a
  JSON case: the customer, what they write, the model's responses as a script (played by the simulator when no
  API key is set) and what must happen (the tools called, the calls the gate refuses, the outcome).
- `Dockerfile`: the fleet's image with this agent in it.

Dependencies are per process: in the fleet the gate (resolvers, policies) and the executor (handlers) are separate
processes, each with its own instance of every dependency, and `run_turn` gives them two instances too. State that
both must see lives in a backend they share (this SQLite file, a database, a service), never in memory.

    ${python} -m pip install -e '.[test]'  # the agent and pytest, into the venv of the roundtrip that made it
    ${python} -m pytest                    # its tests
    ${roundtrip} agent check ${package}.agent:AGENT
    ROUNDTRIP_AGENT=${name} ${roundtrip} up   # then, in another shell: the banner's example, and
    ${roundtrip} eval run evals               # its conversations through the fleet (--fresh: reset first)

Without the package index (roundtrip-fleet is not on it), install from the fleet's wheel: `pip install
--find-links DIR '.[test]'`, DIR holding roundtrip-fleet's wheel and its dependencies' (the fleet's manual:
Your own agent, "Installing without the package index").
    docker build --build-arg FLEET_IMAGE=roundtrip:latest -t ${name} .   # the fleet's image + this agent

In the fleet's manifests, set ROUNDTRIP_AGENT=${name} and its own settings (ROUNDTRIP_${upper}_*) in the ConfigMap
(the Secret for secrets) and run every service from this image.
"""

DOCKERFILE = """# The fleet's image with this agent in it, every service runs from it (ROUNDTRIP_AGENT=${name}).
# FLEET_IMAGE is the fleet's own image (the roundtrip project's Dockerfile: docker build -t roundtrip .).
ARG FLEET_IMAGE=roundtrip:latest
FROM $${FLEET_IMAGE}
USER 0
COPY . /src/${name}
# roundtrip-fleet is in the image already, so pip keeps it; the agent's other dependencies come from your index
RUN pip install --no-cache-dir /src/${name} && rm -rf /src/${name}
USER 10001
ENV ROUNDTRIP_AGENT=${name}
"""

INIT = '''"""The ${name} support agent (the object is ${package}.agent:AGENT)."""
'''

BACKEND = '''"""The agent's backend: a ticket desk in a SQLite file. Replace it with your company's client.

A file, not memory: the fleet's gate and executor are separate processes, each opening its own instance of this
class, and both must see the same tickets (the policy reads what close_ticket changed). Every read is scoped to a
customer: a ticket that is someone else's is not found, exactly like one that does not exist.
"""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

DEMO = [
    ("T-1001", "cus_1", "open", "The app logs me out"),
    ("T-1002", "cus_1", "closed", "Invoice address"),
    ("T-2001", "cus_2", "open", "Refund"),
]
SCHEMA = (
    "CREATE TABLE IF NOT EXISTS tickets (ticket_id TEXT PRIMARY KEY, customer_id TEXT NOT NULL, "
    "status TEXT NOT NULL, subject TEXT NOT NULL, note TEXT NOT NULL DEFAULT '')"
)


class Tickets:
    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._db() as db:  # the demo tickets, once per file
            db.execute(SCHEMA)
            db.executemany("INSERT OR IGNORE INTO tickets (ticket_id, customer_id, status, subject) VALUES (?,?,?,?)",
                           DEMO)

    def _db(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, timeout=10)
        db.row_factory = sqlite3.Row
        return db

    def _get(self, customer_id: str, ticket_id: str) -> dict[str, Any] | None:
        with self._db() as db:
            found = db.execute(
                "SELECT * FROM tickets WHERE ticket_id = ? AND customer_id = ?", (ticket_id, customer_id)
            ).fetchone()
        return dict(found) if found else None

    def _close(self, customer_id: str, ticket_id: str, note: str) -> dict[str, Any]:
        with self._db() as db:
            done = db.execute(
                "UPDATE tickets SET status = 'closed', note = ? WHERE ticket_id = ? AND customer_id = ?",
                (note, ticket_id, customer_id),
            )
        if done.rowcount != 1:
            raise LookupError(ticket_id)
        return self._get(customer_id, ticket_id) or {}

    async def get(self, customer_id: str, ticket_id: str) -> dict[str, Any] | None:
        return await asyncio.to_thread(self._get, customer_id, ticket_id)

    async def close(self, customer_id: str, ticket_id: str, note: str) -> dict[str, Any]:
        return await asyncio.to_thread(self._close, customer_id, ticket_id, note)

    def reset(self) -> None:
        """The demo tickets as they were first written (`roundtrip eval run --fresh` calls it through AGENT's reset)."""
        with self._db() as db:
            db.execute("DELETE FROM tickets")
            db.executemany("INSERT INTO tickets (ticket_id, customer_id, status, subject) VALUES (?,?,?,?)", DEMO)

    def statuses(self) -> dict[str, str]:
        """ticket id -> status (the tests read it)."""
        with self._db() as db:
            return {row["ticket_id"]: row["status"] for row in db.execute("SELECT ticket_id, status FROM tickets")}

    async def aclose(self) -> None:
        """Called once at the service's shutdown (a real client closes its connections here)."""
'''

TOOL = """{
  "name": "get_ticket",
  "description": "Show one of the customer's support tickets: its subject, its status and the note it was closed with.",
  "input_schema": {
    "$$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "properties": {
      "ticket_id": {
        "type": "string",
        "pattern": "^T-[0-9]{4}$$",
        "x-entity": "ticket",
        "description": "The ticket's id as the customer gave it, e.g. T-1001. Never guess one."
      }
    },
    "required": ["ticket_id"],
    "additionalProperties": false
  }
}
"""

AGENT = '''"""The ${name} support agent: everything the fleet needs to run it, in one object (AGENT)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from roundtrip import Agent, Entity, ToolContext, tool
from ${package}.backend import Tickets

SYSTEM_PROMPT = """You are the support agent of ${name}. You act only for the signed-in customer; their identity
is fixed by the session, never by what anyone writes. Never guess a ticket id: ask the customer for it. If a tool
returns an error, read it and correct your call instead of repeating it. Answer politely and concisely."""


class Settings(BaseSettings):
    """The agent's own settings (ROUNDTRIP_${upper}_*)."""

    model_config = SettingsConfigDict(env_prefix="ROUNDTRIP_${upper}_", extra="ignore")
    database: Path | None = Field(None, description="SQLite file of the tickets; unset: ${package}.db in state_dir")


@tool
async def close_ticket(
    ctx: ToolContext,
    ticket_id: Annotated[str, Entity("ticket"), Field(description="The ticket's id, e.g. T-1001")],
    note: Annotated[str, Field(max_length=500, description="Why it is closed, in the customer's words")] = "",
) -> dict[str, Any]:
    """Close one of the customer's open support tickets, with a note saying why."""
    return await ctx.deps.tickets.close(ctx.customer_id, ticket_id, note)


async def get_ticket(args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    """The handler of schemas/get_ticket.json (the gate has checked that the ticket is the customer's)."""
    return await ctx.deps.tickets.get(ctx.customer_id, args["ticket_id"]) or {}


async def resolve_ticket(ticket_id: str, ctx: ToolContext) -> dict[str, Any] | None:
    """The ticket if it exists and is the customer's, else None: the gate's existence and ownership check."""
    return await ctx.deps.tickets.get(ctx.customer_id, ticket_id)


async def only_open_tickets(args: dict[str, Any], entities: dict[str, dict[str, Any]], ctx: ToolContext) -> str | None:
    """The policy of close_ticket: the reason to refuse (shown to the model), or None to allow."""
    ticket = entities["ticket_id"]
    return None if ticket["status"] == "open" else f"ticket {ticket['ticket_id']} is already {ticket['status']}."


def tickets(fleet_settings: Any, own: Settings) -> Tickets:
    """Made once per process (the gate's, the executor's): every instance opens the same file."""
    return Tickets(own.database or Path(fleet_settings.state_dir) / "${package}.db")


def reset(fleet_settings: Any, own: Settings) -> None:
    """The backend back to its demo tickets, before an evaluation that changes them (roundtrip eval run --fresh)."""
    tickets(fleet_settings, own).reset()


AGENT = Agent(
    name="${name}",
    system_prompt=SYSTEM_PROMPT,
    tools_dir=Path(__file__).parent / "schemas",  # JSON Schema tool documents (package data of the wheel)
    handlers={"get_ticket": get_ticket},
    tools=[close_ticket],
    entities={"ticket": resolve_ticket},
    policies={"close_ticket": only_open_tickets},
    serial=frozenset({"close_ticket"}),  # a side effect: never next to another call
    settings=Settings,
    dependencies={"tickets": tickets},
    reset=reset,
    example_ask="what is happening with my ticket T-1001?",  # what `roundtrip up` suggests to try
    example_customer="cus_1",
    example_script=[  # the model's responses to it when no API key is set (the simulator plays them)
        [{"type": "tool_use", "name": "get_ticket", "input": {"ticket_id": "T-1001"}}],
        [{"type": "text", "text": "Here is ticket T-1001 as the desk has it."}],
    ],
)
'''

TEST = '''"""${name}'s turns through the fleet's own gate, guard rules and executor, with a scripted model (no Kafka).

Each test has its own state folder (tmp_path), so its own tickets file; the gate and the executor each open their
own instance of the backend, as the fleet's processes do.
"""

from roundtrip.testing import ScriptedModel, call, run_turn
from ${package}.agent import AGENT
from ${package}.backend import Tickets


def statuses(state_dir):
    return Tickets(state_dir / "${package}.db").statuses()


def test_the_agent_fits_together():
    assert AGENT.problems() == []


def test_a_customer_closes_their_own_open_ticket(tmp_path):
    model = ScriptedModel([call("close_ticket", ticket_id="T-1001", note="fixed by the update"), "T-1001 is closed."])
    result = run_turn(AGENT, "cus_1", "Please close T-1001, the update fixed it", model=model, state_dir=tmp_path)
    assert result.outcome == "end_turn" and result.text == "T-1001 is closed."
    assert result.calls[0].ok and result.calls[0].result["status"] == "closed"
    assert statuses(tmp_path)["T-1001"] == "closed"


def test_another_customers_ticket_and_an_invented_one_never_reach_the_backend(tmp_path):
    model = ScriptedModel([[call("close_ticket", ticket_id="T-2001"), call("get_ticket", ticket_id="T-9999")],
                           "I could not find those tickets."])
    result = run_turn(AGENT, "cus_1", "Close T-2001 and show T-9999", model=model, state_dir=tmp_path)
    assert [c.is_error for c in result.calls] == [True, True]
    assert all("was not found" in c.content for c in result.calls)
    assert statuses(tmp_path)["T-2001"] == "open"


def test_the_policy_refuses_a_closed_ticket(tmp_path):
    model = ScriptedModel([call("close_ticket", ticket_id="T-1002"), "T-1002 was already closed."])
    result = run_turn(AGENT, "cus_1", "Close T-1002", model=model, state_dir=tmp_path)
    assert result.calls[0].is_error and "already closed" in result.calls[0].content


def test_the_policy_sees_what_a_handler_changed_earlier_in_the_turn(tmp_path):
    """The policy runs in the gate's process, the handler in the executor's: the second close is refused only when
    both see one backend (with one in memory it would go through, in the fleet and in run_turn alike)."""
    model = ScriptedModel([call("close_ticket", ticket_id="T-1001"), call("close_ticket", ticket_id="T-1001"), "Done."])
    result = run_turn(AGENT, "cus_1", "Close T-1001. And close T-1001.", model=model, state_dir=tmp_path)
    first, second = result.calls
    assert first.ok and second.is_error and "already closed" in second.content
'''

OWN_TICKET_CASE = """{
  "description": "A customer reads their own ticket: the gate lets the call through, the desk answers.",
  "customer": "cus_1",
  "message": "What is happening with T-1001?",
  "script": [
    [{"type": "tool_use", "name": "get_ticket", "input": {"ticket_id": "T-1001"}}],
    "Here is T-1001."
  ],
  "expect": {"outcome": "end_turn", "tools_called": ["get_ticket"], "refused": []}
}
"""

FOREIGN_TICKET_CASE = """{
  "description": "Another customer's ticket: the gate refuses it exactly like one that does not exist.",
  "customer": "cus_1",
  "message": "Close T-2001 for me",
  "script": [
    [{"type": "tool_use", "name": "close_ticket", "input": {"ticket_id": "T-2001", "note": "asked"}}],
    "I could not find that ticket among yours."
  ],
  "expect": {"outcome": "end_turn", "refused": [{"tool": "close_ticket", "because": "was not found"}]}
}
"""

FILES = {
    "pyproject.toml": PYPROJECT,
    "README.md": README,
    "Dockerfile": DOCKERFILE,
    "${package}/__init__.py": INIT,
    "${package}/backend.py": BACKEND,
    "${package}/agent.py": AGENT,
    "${package}/schemas/get_ticket.json": TOOL,
    "tests/test_agent.py": TEST,
    "evals/own-ticket.json": OWN_TICKET_CASE,
    "evals/another-customers-ticket.json": FOREIGN_TICKET_CASE,
}


def package_name(name: str) -> str:
    """The Python package of an agent named `name` (`acme-support` -> `acme_support`); ValueError if there is none."""
    if not AGENT_NAME.match(name):
        raise ValueError(f"agent name {name!r} must match {AGENT_NAME.pattern}")
    package = re.sub(r"[^a-zA-Z0-9_]", "_", name).lower()
    if not package.isidentifier() or package[0].isdigit():
        raise ValueError(f"agent name {name!r} must start with a letter (its package would be {package!r})")
    return package


def skeleton(name: str, python: str, roundtrip: str) -> dict[str, str]:
    """Relative path -> text of every file of the skeleton of the agent `name` (`python`, `roundtrip`: the interpreter
    and the command its README runs, those of the roundtrip that made it)."""
    package = package_name(name)
    values = {"name": name, "package": package, "upper": package.upper(), "python": python, "roundtrip": roundtrip}
    return {Template(path).substitute(values): Template(text).substitute(values) for path, text in FILES.items()}
