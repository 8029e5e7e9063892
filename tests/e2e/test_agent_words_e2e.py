"""An agent's own words, end to end (issue 29, item 6): a German-speaking carrier agent (tests/german_agent.py: the
example carrier's tools with every text in German) run by the whole fleet, whose turn ends early after a side
effect. The customer reads the agent's own German text naming what was done (its describe_action and its template
for the outcome), never the fleet's English, an internal key or the raw input; the model reads the gate's refusal
in the agent's words.
"""

from __future__ import annotations

import json
import sqlite3
import uuid

import httpx
import pytest

from roundtrip._broker.embedded import free_port
from roundtrip._fleet.launcher import Fleet
from roundtrip._kernel.settings import Settings
from roundtrip._kernel.wire.events import Outcome
from tests.e2e.conftest import FleetClient, fleet_env
from tests.signing import key_settings

CAROL = "cus_2003"  # holds ln_5550303


def call(name: str, **args) -> dict:
    return {"type": "tool_use", "name": name, "input": args}


SCRIPTS = {  # a plan change that succeeds, then the same invented line four times: the repeated-call rule ends it
    "acted": [[call("change_plan", line_id="ln_5550303", plan="unlimited")]]
    + [[call("get_line", line_id="ln_9999999")]] * 4,
}


@pytest.fixture(scope="module")
def german_fleet(kafka_bootstrap, tmp_path_factory):
    pytest.importorskip("telecom_agent", reason="the example agent is installed by scripts/setup.sh")
    state = tmp_path_factory.mktemp("german-fleet")
    (state / "scripts.json").write_text(json.dumps(SCRIPTS))
    values = dict(
        agent="tests.german_agent:AGENT",
        kafka_bootstrap_servers=kafka_bootstrap,
        kafka_allow_plaintext=True,  # the test broker listens in the clear; the fleet is not development
        topic_prefix=f"de{uuid.uuid4().hex[:6]}.",
        state_dir=state,
        simulator_port=free_port(),
        partitions=1,
        simulator_script=state / "scripts.json",
        **key_settings("de1"),  # fresh pairs, never the published development keys
    )
    with Fleet(Settings(**values), env=fleet_env(**values), executor_replicas=1) as fleet:
        yield fleet


@pytest.fixture(scope="module")
async def client(german_fleet):
    c = FleetClient(german_fleet.settings)
    await c.start()
    yield c
    await c.stop()


async def test_a_german_agents_turn_ended_early_after_a_side_effect_reads_its_own_german_words(client, german_fleet):
    from tests.german_agent import ACTED

    settings = german_fleet.settings
    request_id = await client.ask("Bitte stellen Sie meinen Tarif um", customer=CAROL, persona="script:acted")
    reply = await client.reply(request_id, timeout=90)
    assert reply.outcome is Outcome.REPEATED_CALL
    done = "Der Tarif von Anschluss ln_5550303 wurde auf unlimited umgestellt"
    assert reply.text == ACTED["repeated_call"].format(done=done), reply.text
    assert reply.turn_id not in reply.text and "toolu" not in reply.text and "succeeded" not in reply.text
    assert "I'm sorry" not in reply.text  # none of the fleet's English
    with sqlite3.connect(settings.state_dir / "telecom.db") as db:
        assert db.execute("SELECT plan FROM lines WHERE line_id = 'ln_5550303'").fetchone() == ("unlimited",)

    sent = httpx.get(
        f"http://127.0.0.1:{settings.simulator_port}/v1/_received", params={"persona": "script:acted"}, timeout=10
    ).json()["requests"]
    refused = sent[2]["body"]["messages"][-1]["content"][0]  # the result of the first get_line of the invented id
    said = refused["content"] if isinstance(refused["content"], str) else refused["content"][0]["text"]
    assert refused["is_error"] and said == (
        "Nicht erlaubt: Anschluss ln_9999999 gibt es bei diesem Kunden nicht. Rate keine IDs: list_lines zeigt seine "
        "Anschlüsse."
    )
