"""A backend that times out for one conversation's ids, end to end (issue 42: an outage holds only what it must).

The whole fleet (the demo shop agent, the simulator in scripted mode) on one partition per topic, its shop a real
HTTP server of this test that never answers the look-ups of one order. The turn whose model asks for that order is
held at the gate (its conversation only) while the other conversations' turns, on the same partitions, run and are
answered at their normal latency; the held turn ends by its deadline with exactly one reply, and the gate's batch for
it, answered after the deadline with the call refused, runs nothing (services/_kernel/kafka/outages.py,
docs/faults.md "What an outage holds").
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid

import pytest
import uvicorn

from roundtrip._broker.embedded import free_port
from roundtrip._fleet.launcher import Fleet
from roundtrip._kernel.wire import topics
from roundtrip._kernel.wire.events import Outcome
from roundtrip._shop.agent import AGENT as SHOP
from roundtrip._shop.app import create_app
from tests.agents import ShopFleetSettings
from tests.e2e.conftest import FleetClient, fleet_env
from tests.signing import key_settings

STUCK_ORDER = "ord_a1000003"  # Alice's: the shop never answers about it
DEADLINE_S = 12.0  # the turns' deadline (ROUNDTRIP_TURN_DEADLINE_S)
NORMAL_S = 6.0  # what a turn the outage does not concern may take at most here (2 model calls, 1 tool, shared CPU)


def call(name: str, **args) -> dict:
    return {"type": "tool_use", "name": name, "input": args}


SCRIPTS = {
    "stuck": [[call("lookup_order", order_id=STUCK_ORDER)], [{"type": "text", "text": "Your boots are on hold."}]],
    "kettle": [[call("lookup_order", order_id="ord_a1000001")], [{"type": "text", "text": "It was delivered."}]],
}


def never_answering(app, order_id: str, released: asyncio.Event):
    async def wrapped(scope, receive, send):
        if scope["type"] == "http" and order_id in scope["path"]:
            await released.wait()  # the shop client times out long before
        await app(scope, receive, send)

    return wrapped


@pytest.fixture
async def slow_shop(tmp_path):
    port, released = free_port(), asyncio.Event()
    shop = create_app(f"sqlite+aiosqlite:///{tmp_path / 'shop.db'}", seed=True)
    server = uvicorn.Server(
        uvicorn.Config(never_answering(shop, STUCK_ORDER, released), port=port, log_level="warning")
    )
    task = asyncio.create_task(server.serve())
    while not server.started:
        assert not task.done(), "the shop did not start"
        await asyncio.sleep(0.05)  # poll interval: the shop's server started
    yield f"http://127.0.0.1:{port}"
    released.set()
    server.should_exit = True
    await asyncio.wait_for(task, 20)


@pytest.fixture
async def client(kafka_bootstrap, tmp_path, slow_shop):
    state = tmp_path / "fleet"
    state.mkdir()
    (state / "scripts.json").write_text(json.dumps(SCRIPTS))
    values = dict(
        kafka_bootstrap_servers=kafka_bootstrap,
        kafka_allow_plaintext=True,  # the test broker listens in the clear; the fleet is not development
        topic_prefix=f"bo{uuid.uuid4().hex[:6]}.",
        state_dir=state,
        simulator_port=free_port(),
        console_port=free_port(),
        shop_port=free_port(),
        shop_url=slow_shop,
        partitions=1,  # every conversation on the same partition of every topic
        simulator_script=state / "scripts.json",
        tool_timeout_s=1.0,
        turn_deadline_s=DEADLINE_S,
        stuck_after_s=4.0,  # the sweeper looks every second; a held turn is flagged, not ended, before its deadline
        stuck_grace_s=60.0,
        log_level="INFO",
        **key_settings("bo1"),  # fresh pairs, never the published development keys
    )
    settings = ShopFleetSettings(**values)
    fleet = Fleet(settings, env=fleet_env(**values), executor_replicas=1)
    await asyncio.to_thread(fleet.__enter__)
    c = FleetClient(settings)
    try:
        await c.start()
        yield c
    finally:
        await c.stop()
        await asyncio.to_thread(fleet.__exit__, None, None, None)


async def test_a_turn_held_by_its_backend_holds_only_its_conversation_and_ends_by_its_deadline(client):
    stuck = await client.ask("where are my rain boots?", customer="cus_1001", persona="script:stuck")
    asked = time.time()
    # held at the gate: its step reached the gate and no batch came back
    await client.wait_for(lambda: client.of_turn(topics.TOOL_CALLS, stuck), timeout=30)
    await asyncio.sleep(2.0)  # the first look-up timed out (1 s): the conversation is held
    assert not client.of_turn(topics.TOOL_BATCHES, stuck)

    others: dict[str, float] = {}
    for _ in range(4):  # the other conversations, on the same partitions, while it is held
        others[await client.ask("is my kettle there?", customer="cus_1001", persona="script:kettle")] = time.time()
    for request_id, sent in others.items():
        reply = await client.reply(request_id, timeout=NORMAL_S + 10)
        took = time.time() - sent
        assert reply.outcome is Outcome.END_TURN and reply.text == "It was delivered.", reply
        assert took < NORMAL_S, f"{request_id} took {took:.1f} s while another conversation was held"
        print(f"{request_id}: answered in {took:.2f} s while the other conversation was held")
    assert not client.replies.get(stuck), "the held turn should still be running"

    reply = await client.reply(stuck, timeout=DEADLINE_S + 30)
    ended = time.time() - asked
    assert reply.outcome is Outcome.DEADLINE, reply
    assert DEADLINE_S - 1 <= ended < DEADLINE_S + 6, ended
    print(f"the held turn ended {reply.outcome} after {ended:.2f} s (deadline {DEADLINE_S:g} s)")
    (batch,) = await client.wait_for(lambda: client.of_turn(topics.TOOL_BATCHES, stuck), timeout=20)
    (refused,) = batch["calls"]  # answered after its deadline: refused in the agent's words, run by no one
    assert not refused["approved"] and refused["error"] == SHOP.message("lookup_failed")
    assert batch["expires_at"] <= time.time()
    await client.settled()  # nothing more comes for it: one reply, one batch, no next model call
    assert len(client.replies[stuck]) == 1
    assert len(client.of_turn(topics.TOOL_BATCHES, stuck)) == 1
    assert len(client.of_turn(topics.MODEL_CALLS, stuck)) == 1  # the first call only
