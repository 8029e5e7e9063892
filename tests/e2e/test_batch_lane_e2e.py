"""The batch lane end to end: the fleet as processes, driven through support.requests and support.replies, the
simulator's Message Batches API behind the model service. Turns of three model calls each (two tool steps, then the
answer) go through batches beside interactive turns, every turn gets one reply, billed at the batch rate in the reply
and the ledger, every batch call is submitted once (the simulator counts creates per custom id), the iterations and
the ledger carry the batch id; and a model service SIGKILLed while three batches are open resubmits nothing after its
restart."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import uuid

import httpx
import pytest

from roundtrip._kernel.storage.prices import PriceTable
from roundtrip._kernel.wire import topics
from roundtrip._kernel.wire.events import Outcome, Usage

SCRIPT = "batch3"
ANSWER = "Here is what I found about your orders and our returns."
STEPS = [
    [{"type": "tool_use", "name": "list_orders", "input": {}}],
    [{"type": "tool_use", "name": "search_help_center", "input": {"query": "returns"}}],
    ANSWER,
]
FAST = dict(batch_max_wait_s=0.5, batch_poll_s=0.5, batch_poll_max_s=1.0)  # the lane's pauses, short for a test
# the Done-when: 200 batch turns beside 50 chat turns (measured in CI's time: docs/batch-lane.md)
BATCH_TURNS, CHAT_TURNS = 200, 50
REPLIES_WITHIN_S = 240.0
CALLS_A_BATCH_AT_LEAST = 3  # on average: calls are gathered by age and count, a batch holds many


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
    """The issue's Done-when at its scale: BATCH_TURNS batch turns of three calls each beside CHAT_TURNS chat turns."""
    settings = fleet_settings[0]
    async with fleet.reconfigured(("model",), **FAST):
        put_script(settings)
        batch = [await ask(client, "batch", f"script:{SCRIPT}") for _ in range(BATCH_TURNS)]
        chats = [await ask(client, None, "careful", "What are your opening hours?") for _ in range(CHAT_TURNS)]
        replies = await one_reply_each(client, batch + chats, timeout=REPLIES_WITHIN_S)
    iterations, calls = of_turns(client, topics.ITERATIONS), of_turns(client, topics.MODEL_CALLS)
    for request_id in batch:
        reply = replies[request_id]
        assert (reply.outcome, reply.text, reply.steps) == (Outcome.END_TURN, ANSWER, 3), reply
        assert [i["step"] for i in iterations[request_id]] == [1, 2, 3]
        assert all(i["batch_id"].startswith("msgbatch_") for i in iterations[request_id]), iterations[request_id]
        assert all(c["turn"]["lane"] == "batch" for c in calls[request_id])
    for request_id in chats:
        assert replies[request_id].outcome is Outcome.END_TURN
        assert all(i["batch_id"] == "" for i in iterations[request_id])
    assert_submitted_once(settings, {r: replies[r] for r in batch})
    answered_by = {(i["turn"]["turn_id"], i["step"] - 1): i["batch_id"] for r in batch for i in iterations[r]}
    assert len(set(answered_by.values())) <= len(answered_by) / CALLS_A_BATCH_AT_LEAST  # gathered, not one by one
    turn_ids = [replies[r].turn_id for r in batch]
    recorded = batch_calls_in_ledger(settings, turn_ids)
    assert sorted((t, s) for t, s, _, _ in recorded) == sorted((t, s) for t in turn_ids for s in range(3))
    assert all(status == "done" and batch_id.startswith("msgbatch_") for _, _, status, batch_id in recorded)
    assert {(t, s): b for t, s, _, b in recorded} == answered_by
    assert_billed_at_the_batch_rate(settings, {r: replies[r] for r in batch}, iterations)


def of_turns(client, name: str) -> dict[str, list[dict]]:
    """The messages of one topic by their turn's request id, in the order they came."""
    found: dict[str, list[dict]] = {}
    for message in client.seen[name]:
        found.setdefault(message.get("turn", {}).get("request_id"), []).append(message)
    return found


def assert_billed_at_the_batch_rate(settings, replies: dict, iterations: dict) -> None:
    """Each batch turn's reply and its ledger row cost half of what the same calls cost direct (no negotiated batch
    rate is configured: the batch price is half the list price), to the reply's six decimal places."""
    prices = PriceTable.from_json(settings.prices, settings.model_provider)
    in_ledger = costs_in_ledger(settings, [reply.turn_id for reply in replies.values()])
    for request_id, reply in replies.items():
        calls = [(i["model"], Usage.model_validate(i["usage"])) for i in iterations[request_id]]
        direct = sum(prices.cost(model, usage) for model, usage in calls)
        assert direct > 0 and reply.cost_usd == pytest.approx(direct / 2, abs=1e-6), (reply.cost_usd, direct)
        assert in_ledger[reply.turn_id] == pytest.approx(reply.cost_usd, abs=1e-6)


def costs_in_ledger(settings, turn_ids: list[str]) -> dict[str, float]:
    path = settings.ledger_db_url.split(":///", 1)[1]
    marks = ",".join("?" * len(turn_ids))
    with sqlite3.connect(path) as db:
        return dict(db.execute(f"SELECT turn_id, cost_usd FROM turns WHERE turn_id IN ({marks})", turn_ids).fetchall())


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
