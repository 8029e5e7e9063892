"""The batch lane end to end: the fleet as processes, driven through support.requests and support.replies, the
simulator's Message Batches API behind the model service. Turns of three model calls each (two tool steps, then the
answer) go through batches beside interactive turns, every turn gets one reply, every batch call is submitted once
(the simulator counts creates per custom id), the iterations and the ledger carry the batch id; and a model service
SIGKILLed while three batches are open resubmits nothing after its restart."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import uuid

import httpx
import pytest

from roundtrip._kernel.wire import topics
from roundtrip._kernel.wire.events import Outcome

SCRIPT = "batch3"
ANSWER = "Here is what I found about your orders and our returns."
STEPS = [
    [{"type": "tool_use", "name": "list_orders", "input": {}}],
    [{"type": "tool_use", "name": "search_help_center", "input": {"query": "returns"}}],
    ANSWER,
]
FAST = dict(batch_max_wait_s=0.5, batch_poll_s=0.5, batch_poll_max_s=1.0)  # the lane's pauses, short for a test


def simulator_url(settings) -> str:
    return f"http://127.0.0.1:{settings.simulator_port}"


def put_script(settings) -> None:
    done = httpx.put(f"{simulator_url(settings)}/v1/_scripts/{SCRIPT}", json=STEPS, timeout=10)
    assert done.status_code == 200, done.text


def seen_by_simulator(settings) -> dict:
    return httpx.get(f"{simulator_url(settings)}/v1/_batches", timeout=10).json()


async def ask(client, lane: str | None, persona: str, text: str = "What happened to my orders, and can I return one?"):
    request_id = f"req_{uuid.uuid4().hex[:10]}"
    body = {
        "request_id": request_id,
        "conversation_id": f"conv_{request_id}",
        "customer_id": "cus_1001",
        "text": text,
        "persona": persona,
        **({"lane": lane} if lane else {}),
    }
    await client.publish_raw(json.dumps(body).encode(), key=body["conversation_id"].encode())
    return request_id


def batch_calls_in_ledger(settings, turn_ids: list[str]) -> list[tuple]:
    """(turn id, step, status, batch id) of the model service's batch calls of these turns, from the ledger file."""
    path = settings.ledger_db_url.split(":///", 1)[1]
    marks = ",".join("?" * len(turn_ids))
    with sqlite3.connect(path) as db:
        return db.execute(
            f"SELECT turn_id, step, status, batch_id FROM model_batch_calls WHERE turn_id IN ({marks})", turn_ids
        ).fetchall()


async def one_reply_each(client, request_ids: list[str], timeout: float) -> dict:
    replies = {r: await client.reply(r, timeout=timeout) for r in request_ids}
    await client.settled()
    assert {r: len(client.replies[r]) for r in request_ids} == dict.fromkeys(request_ids, 1)
    return replies


def assert_submitted_once(settings, replies: dict) -> None:
    custom_ids = [f"{reply.turn_id}_{step}" for reply in replies.values() for step in range(3)]
    submissions = seen_by_simulator(settings)["submissions"]
    assert {c: submissions.get(c, 0) for c in custom_ids} == dict.fromkeys(custom_ids, 1)


async def test_batch_turns_of_three_calls_each_beside_interactive_ones(client, fleet, fleet_settings):
    settings = fleet_settings[0]
    async with fleet.reconfigured(("model",), **FAST):
        put_script(settings)
        batch = [await ask(client, "batch", f"script:{SCRIPT}") for _ in range(12)]
        chats = [await ask(client, None, "careful", "What are your opening hours?") for _ in range(4)]
        replies = await one_reply_each(client, batch + chats, timeout=180)
    for request_id in batch:
        reply = replies[request_id]
        assert (reply.outcome, reply.text, reply.steps) == (Outcome.END_TURN, ANSWER, 3), reply
        iterations = client.of_turn(topics.ITERATIONS, request_id)
        assert [i["step"] for i in iterations] == [1, 2, 3]
        assert all(i["batch_id"].startswith("msgbatch_") for i in iterations), iterations
        assert all(c["turn"]["lane"] == "batch" for c in client.of_turn(topics.MODEL_CALLS, request_id))
    for request_id in chats:
        assert replies[request_id].outcome is Outcome.END_TURN
        assert all(i["batch_id"] == "" for i in client.of_turn(topics.ITERATIONS, request_id))
    assert_submitted_once(settings, {r: replies[r] for r in batch})
    turn_ids = [replies[r].turn_id for r in batch]
    recorded = batch_calls_in_ledger(settings, turn_ids)
    assert sorted((t, s) for t, s, _, _ in recorded) == sorted((t, s) for t in turn_ids for s in range(3))
    assert all(status == "done" and batch_id.startswith("msgbatch_") for _, _, status, batch_id in recorded)
    answered_by = {
        (i["turn"]["turn_id"], i["step"] - 1): i["batch_id"]
        for r in batch
        for i in client.of_turn(topics.ITERATIONS, r)
    }
    assert {(t, s): b for t, s, _, b in recorded} == answered_by


@pytest.mark.kills_services
async def test_the_model_service_sigkilled_while_three_batches_are_open_resubmits_nothing(
    client, fleet, fleet_settings
):
    settings = fleet_settings[0]
    async with fleet.reconfigured(("simulator", "model"), simulator_batch_delay_ms=6000, **FAST):
        put_script(settings)  # the restarted simulator has no script yet
        asked: list[str] = []
        for wave in range(3):  # a batch per wave: the lane submits each wave's calls half a second after them
            asked += [await ask(client, "batch", f"script:{SCRIPT}") for _ in range(2)]
            await until(lambda wave=wave: len(seen_by_simulator(settings)["batches"]) > wave, timeout=60)
        statuses = list(seen_by_simulator(settings)["batches"].values())
        assert statuses.count("in_progress") >= 3, statuses  # killed with three batches open (6 s each)
        await fleet.kill("model")
        await fleet.respawn("model")
        replies = await one_reply_each(client, asked, timeout=240)
        assert_submitted_once(settings, replies)
    for reply in replies.values():
        assert (reply.outcome, reply.text, reply.steps) == (Outcome.END_TURN, ANSWER, 3), reply


async def until(predicate, timeout: float) -> None:
    """Wait until `predicate()` holds (the simulator says nothing when a batch is created: it is asked)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, f"not within {timeout:g} s"
        await asyncio.sleep(0.1)  # poll interval: the simulator's batches, asked over HTTP
