"""An agent package of a user's own, end to end (issue 19, done when): the example carrier agent of
examples/telecom-agent, installed with pip into the venv as its own distribution (scripts/setup.sh), run by the
whole fleet with ROUNDTRIP_AGENT=telecom (its entry point), driven through support.requests/support.replies like a
user's app, with the simulator in scripted mode (no API key).

It proves: its ownership rule rejects another customer's line and an invented id (and a family-plan member's
change), its approval rule holds a port-out until a person's signed decision, its system prompt reaches the model
(the simulator's received requests), and its own reply texts reach the customer.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
import uuid
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

import httpx
import pytest

from roundtrip._broker.embedded import free_port
from roundtrip._fleet.launcher import Fleet
from roundtrip._kernel.settings import Settings
from roundtrip._kernel.wire import topics
from roundtrip._kernel.wire.approvals import Signer
from roundtrip._kernel.wire.events import ApprovalDecided, Decision, Outcome
from tests.e2e.conftest import FleetClient, fleet_env
from tests.signing import key_settings

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "examples" / "telecom-agent"
ALICE, BOB, CAROL = "cus_2001", "cus_2002", "cus_2003"  # Alice holds ln_5550101, Bob shares it; Carol holds ln_5550303


def call(name: str, **args) -> dict:
    return {"type": "tool_use", "name": name, "input": args}


def say(text: str) -> list[dict]:
    return [{"type": "text", "text": text}]


SCRIPTS = {
    "foreign": [
        [call("get_line", line_id="ln_5550303"), call("get_line", line_id="ln_9999999")],
        say("I can't find those lines."),
    ],
    "member-change": [
        [call("change_plan", line_id="ln_5550101", plan="unlimited")],
        say("Only the holder can change it."),
    ],
    "port-out": [
        [call("port_out_number", line_id="ln_5550101", new_carrier="OtherTel")],
        say("Your number is on its way."),
    ],
    "stuck": [[call("get_line", line_id="ln_5550202")]]
    * 4,  # the same call a fourth time: the guard's repeated-call rule
}


@pytest.fixture(scope="module")
def installed() -> Path:
    """Where pip installed the package (scripts/setup.sh: `pip install ./examples/telecom-agent`, its own
    distribution, not editable): the site-packages folder holding it, never the project's source."""
    try:
        dist = distribution("telecom-agent")
    except PackageNotFoundError:
        pytest.fail("the example agent is not installed: run bash scripts/setup.sh")
    where = Path(dist.locate_file("telecom_agent")).resolve()
    assert where.is_dir() and not where.is_relative_to(SOURCE), (
        f"telecom_agent should be installed by pip, not found at {where}"
    )
    sources = [p for p in (SOURCE / "telecom_agent").rglob("*") if p.suffix in (".py", ".json")]
    copies = {p: where / p.relative_to(SOURCE / "telecom_agent") for p in sources}
    stale = [p.name for p, copy in copies.items() if not copy.is_file() or copy.read_bytes() != p.read_bytes()]
    assert not stale, (
        f"the installed telecom-agent differs from examples/telecom-agent ({stale}): run bash scripts/setup.sh"
    )
    return where.parent


@pytest.fixture(scope="module")
def telecom_fleet(kafka_bootstrap, tmp_path_factory, installed):
    state = tmp_path_factory.mktemp("telecom-fleet")
    scripts = state / "scripts.json"
    scripts.write_text(json.dumps(SCRIPTS))
    values = dict(
        agent="telecom",
        kafka_bootstrap_servers=kafka_bootstrap,
        kafka_allow_plaintext=True,  # the test broker listens in the clear; the fleet is not development
        topic_prefix=f"tc{uuid.uuid4().hex[:6]}.",
        state_dir=state,
        simulator_port=free_port(),
        console_port=free_port(),
        partitions=2,
        simulator_script=scripts,
        log_level="INFO",
        **key_settings("tc1"),  # fresh pairs, never the published development keys
    )
    env = fleet_env(
        **values
    )  # the fleet's processes run the venv's python: the package is there, found by its entry point
    with Fleet(Settings(**values), env=env, executor_replicas=1) as fleet:
        yield fleet


@pytest.fixture(scope="module")
async def client(telecom_fleet):
    c = FleetClient(telecom_fleet.settings)
    await c.start()
    yield c
    await c.stop()


def received(settings: Settings, script: str) -> list[dict]:
    url = f"http://127.0.0.1:{settings.simulator_port}/v1/_received"
    return httpx.get(url, params={"persona": f"script:{script}"}, timeout=10).json()["requests"]


def results_seen(settings: Settings, script: str) -> list[dict]:
    """The tool_result blocks the model was sent after the script's first response."""
    (_, second) = received(settings, script)
    return second["body"]["messages"][-1]["content"]


def text(result: dict) -> str:
    content = result.get("content", "")
    return content if isinstance(content, str) else "".join(b.get("text", "") for b in content)


def line(settings: Settings, line_id: str) -> tuple[str, str]:
    with sqlite3.connect(settings.state_dir / "telecom.db") as db:
        return db.execute("SELECT plan, status FROM lines WHERE line_id = ?", (line_id,)).fetchone()


def test_the_package_is_its_own_distribution_found_by_its_entry_point(installed):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    found = subprocess.run(  # as a service process finds it: from any folder, by the entry point's name
        [
            sys.executable,
            "-c",
            "from roundtrip._sdk.agent import load_agent; import telecom_agent;"
            "print(load_agent('telecom').name, telecom_agent.__file__)",
        ],
        env=env,
        cwd=installed,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert found.returncode == 0, found.stderr
    name, module = found.stdout.split()
    assert name == "telco-support" and Path(module).resolve().is_relative_to(installed)


def test_the_fleet_of_another_agent_runs_no_demo_shop(telecom_fleet):
    assert "shop" not in {child.name for child in telecom_fleet.children}


async def test_its_ownership_rule_rejects_another_customers_line_an_invented_one_and_a_members_change(
    client, telecom_fleet
):
    settings = telecom_fleet.settings
    reply = await client.reply(await client.ask("show me these lines", customer=ALICE, persona="script:foreign"))
    assert reply.outcome is Outcome.END_TURN and reply.text == "I can't find those lines."
    carols, invented = results_seen(settings, "foreign")
    for result, line_id in ((carols, "ln_5550303"), (invented, "ln_9999999")):
        assert result["is_error"] and f"Line {line_id} was not found among this customer's lines" in text(result)

    reply = await client.reply(
        await client.ask("upgrade our family line", customer=BOB, persona="script:member-change")
    )
    (denied,) = results_seen(settings, "member-change")
    assert denied["is_error"] and "only the account holder can change it" in text(denied)
    assert line(settings, "ln_5550101") == ("plus", "active")


async def test_its_approval_rule_holds_a_port_out_until_a_signed_decision(client, telecom_fleet):
    settings = telecom_fleet.settings
    request_id = await client.ask("port my number to OtherTel", customer=ALICE, persona="script:port-out")
    (request,) = await client.wait_for(lambda: client.of_turn(topics.APPROVAL_REQUESTS, request_id), timeout=60)
    assert request["call"]["name"] == "port_out_number" and "a person confirms every port-out" in request["reason"]
    assert request["entities"]["line_id"]["your_role"] == "holder"
    await client.settled()  # every record handled, the call held: nothing ran, no reply
    assert line(settings, "ln_5550101") == ("plus", "active") and not client.replies.get(request_id)

    signer = Signer.of(settings.key_text("decision_signing_key"), "ROUNDTRIP_DECISION_SIGNING_KEY")
    decision = signer.sign(
        ApprovalDecided(
            approval_id=request["approval_id"],
            turn_id=request["turn"]["turn_id"],
            tool_use_id=request["call"]["id"],
            input_sha256=request["input_sha256"],
            decision=Decision.APPROVE,
            decided_by="ops@telco",
            decided_at=time.time(),
        )
    )
    await client.producer.send_and_wait(
        client.topic(topics.APPROVAL_DECISIONS),
        decision.model_dump_json().encode(),
        key=request["turn"]["conversation_id"].encode(),
    )
    reply = await client.reply(request_id, timeout=60)
    assert reply.outcome is Outcome.END_TURN and reply.text == "Your number is on its way."
    assert line(settings, "ln_5550101")[1] == "ported_out"
    (ported,) = results_seen(settings, "port-out")
    assert not ported.get("is_error") and json.loads(text(ported))["transfer_code"]


async def test_its_system_prompt_reaches_the_model_and_its_own_reply_texts_reach_the_customer(
    client, telecom_fleet, installed
):
    from telecom_agent import REPLIES, SYSTEM_PROMPT  # the texts, as the package declares them

    reply = await client.reply(await client.ask("is my line ok?", customer=BOB, persona="script:stuck"))
    assert reply.outcome is Outcome.REPEATED_CALL and reply.text == REPLIES["repeated_call"]
    sent = received(telecom_fleet.settings, "stuck")
    assert sent and all(r["body"]["system"][0]["text"] == SYSTEM_PROMPT for r in sent)
    assert sorted(t["name"] for t in sent[0]["body"]["tools"]) == [
        "change_plan",
        "get_line",
        "list_lines",
        "port_out_number",
    ]
