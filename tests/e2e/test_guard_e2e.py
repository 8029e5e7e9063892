"""The guard end to end: runaway turns end quickly and politely; every turn gets exactly one reply."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import uuid

import pytest
from sqlalchemy import insert, select

from roundtrip._kernel.wire import topics
from roundtrip._kernel.wire.events import Outcome
from roundtrip._shop import db as shop_db
from roundtrip._shop import demo_data


def executed(client, request_id: str, tool: str) -> int:
    """How many calls of `tool` the gate approved for the executors in this turn."""
    return sum(
        1
        for b in client.of_turn(topics.TOOL_BATCHES, request_id)
        for c in b["calls"]
        if c["name"] == tool and c["approved"]
    )


def emitted(client, request_id: str, tool: str) -> int:
    return sum(1 for it in client.of_turn(topics.ITERATIONS, request_id) for c in it["tool_calls"] if c["name"] == tool)


def roundtrip_cli(fleet_settings, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, **fleet_settings[1]}
    return subprocess.run(
        [sys.executable, "-m", "roundtrip._cli.main", *args], env=env, capture_output=True, text=True, timeout=60
    )


async def test_roundtrip_ask_on_the_incident_exits_3_with_a_clear_line_and_shows_each_step_in_order(
    fleet, fleet_settings
):
    asked = await asyncio.to_thread(
        roundtrip_cli,
        fleet_settings,
        "ask",
        "where is my order ord_0000dead?",
        "--customer",
        "cus_1003",
        "--persona",
        "stubborn",
    )
    assert asked.returncode == 3, asked.stdout + asked.stderr
    assert "the turn did not end with the model's answer: repeated_call (exit code 3)" in asked.stdout
    lines = [line.strip() for line in asked.stdout.splitlines()]
    steps = [int(line.split()[1]) for line in lines if line.startswith("step ")]
    assert steps == list(range(1, len(steps) + 1)) and len(steps) >= 3, asked.stdout  # each step once, in order
    blocks: list[list[str]] = []  # the lines of each step, from its model line to the next one's
    for line in lines:
        if line.startswith("step "):
            blocks.append([])
        elif blocks:
            blocks[-1].append(line)
    for block in blocks:  # a step's gate verdicts come after its model line, before the next step's: one per call
        calls = [line.split()[1].split("(")[0] for line in block if line.startswith("calls ")]
        gated = [line.split()[1].rstrip(":") for line in block if line.startswith("gate ")]
        assert gated in (calls, []), asked.stdout  # none: the guard ended the turn on this step's calls


async def test_the_40_call_incident_ends_within_two_identical_calls_with_cost_in_the_reply(
    client, fleet, fleet_settings, capsys
):
    request_id = await client.ask("where is my order ord_0000dead?", customer="cus_1003", persona="stubborn")
    reply = await client.reply(request_id)

    assert reply.outcome is Outcome.REPEATED_CALL
    assert "sorry" in reply.text.lower()
    assert (
        emitted(client, request_id, "lookup_order") == 3
    )  # fails, its first repeat is blocked, the second ends the turn
    errors = [c["error"] for b in client.of_turn(topics.TOOL_BATCHES, request_id) for c in b["calls"]]
    assert len(errors) == 2 and "not found" in errors[0]
    assert "already failed at step 1" in errors[1] and "not found" in errors[1]
    assert executed(client, request_id, "lookup_order") == 0
    assert (
        reply.usage.cache_creation_input_tokens + reply.usage.cache_read_input_tokens + reply.usage.input_tokens > 0
        and reply.cost_usd > 0
    )

    # The same scenario with the loop rules off: only the step limit stops it.
    async with fleet.reconfigured(("guard",), loop_rules=False):
        off_id = await client.ask("where is my order ord_0000dead?", customer="cus_1003", persona="stubborn")
        off = await client.reply(off_id)
    assert off.outcome is Outcome.STEP_LIMIT and off.steps == fleet_settings[0].max_steps
    assert emitted(client, off_id, "lookup_order") == fleet_settings[0].max_steps

    def tokens(r):
        return (
            r.usage.input_tokens
            + r.usage.cache_creation_input_tokens
            + r.usage.cache_read_input_tokens
            + r.usage.output_tokens
        )

    with capsys.disabled():
        print(
            f"\n[guard] stubborn lookup_order: guard on  -> {reply.outcome.value}, {reply.steps} model calls, "
            f"{tokens(reply)} tokens, ${reply.cost_usd:.4f}"
        )
        print(
            f"[guard] stubborn lookup_order: guard off -> {off.outcome.value}, {off.steps} model calls, "
            f"{tokens(off)} tokens, ${off.cost_usd:.4f} ({off.cost_usd / reply.cost_usd:.1f}x)"
        )
    assert off.cost_usd > 2 * reply.cost_usd


@pytest.mark.parametrize("persona,outcome", [("looping", Outcome.CYCLE), ("flailing", Outcome.FAILURE_STREAK)])
async def test_alternating_loops_and_failure_streaks_are_caught_by_their_own_rule(client, persona, outcome):
    request_id = await client.ask("where is my order ord_0000dead?", customer="cus_1003", persona=persona)
    reply = await client.reply(request_id)
    assert reply.outcome is outcome
    assert "sorry" in reply.text.lower()
    if persona == "looping":
        names = [it["tool_calls"][0]["name"] for it in client.of_turn(topics.ITERATIONS, request_id)]
        assert names == ["lookup_order", "get_shipping_status", "lookup_order", "get_shipping_status"]
    else:
        ids = [it["tool_calls"][0]["input"]["order_id"] for it in client.of_turn(topics.ITERATIONS, request_id)]
        assert len(ids) == len(set(ids)) == 5  # all different calls, all failing


async def _customer_with_one_cancellable_order(settings) -> tuple[str, str]:
    """A new customer of the shop's with a pending order (and an older delivered one): "cancel my last order" has
    exactly one order to cancel, whatever the session's other tests did to the demo customers."""
    tag = uuid.uuid4().hex[:8]
    customer, pending, delivered = f"cus_dup{tag}", f"ord_{tag}", f"ord_{uuid.uuid4().hex[:8]}"
    engine = shop_db.make_engine(settings.shop_db_url)
    try:
        async with engine.begin() as conn:
            await conn.execute(
                insert(shop_db.customers), [{"customer_id": customer, "name": "Dee Plicate", "email": "d@example.com"}]
            )
            item = [demo_data._item("SKU-DUP", "Twin socks", 1, 1200)]
            await conn.execute(
                insert(shop_db.orders),
                [
                    demo_data._order(pending, customer, "pending", "2026-11-30T10:00:00", item),
                    demo_data._order(delivered, customer, "delivered", "2026-10-01T10:00:00", item),
                ],
            )
    finally:
        await engine.dispose()
    return customer, pending


async def _runs_of(settings, customer: str) -> list[tuple[str, str]]:
    """(endpoint, idempotency key) of every write the shop was asked to run for the customer (services/_shop/db.py)."""
    engine = shop_db.make_engine(settings.shop_db_url)
    try:
        async with engine.connect() as conn:
            rows = await conn.execute(
                select(shop_db.executions.c.endpoint, shop_db.executions.c.key).where(
                    shop_db.executions.c.customer_id == customer
                )
            )
            return [(r.endpoint, r.key) for r in rows]
    finally:
        await engine.dispose()


async def test_a_duplicated_support_request_gets_one_reply_and_one_side_effect(client, fleet_settings, shop_orders):
    settings = fleet_settings[0]
    customer, pending = await _customer_with_one_cancellable_order(settings)
    before = shop_orders()
    body = {
        "request_id": f"req_dup_{customer}",
        "conversation_id": f"conv_dup_{customer}",
        "customer_id": customer,
        "text": "cancel my last order",
        "persona": "careful",
    }
    for _ in range(2):
        await client.publish_raw(json.dumps(body).encode(), key=body["conversation_id"].encode())
    reply = await client.reply(body["request_id"])
    await client.settled()  # every record handled: a second reply or a second run of the cancel would have happened
    assert len(client.replies[body["request_id"]]) == 1
    assert reply.outcome is Outcome.END_TURN and reply.steps == 3  # list_orders, cancel_order, the answer
    assert pending in reply.text
    after = shop_orders()
    assert {oid: after[oid] for oid in after if before.get(oid) != after[oid]} == {pending: (customer, "cancelled")}
    ((endpoint, key),) = await _runs_of(settings, customer)  # the cancel ran once: no replay either
    assert endpoint == "cancel_order" and key.startswith(reply.turn_id + ":")
    assert len(client.of_turn(topics.ITERATIONS, body["request_id"])) == reply.steps


async def test_duplicated_iteration_events_are_dropped(client, shop_orders):
    request_id = await client.ask("where is my order?", customer="cus_1001", persona="careful")
    reply = await client.reply(request_id)
    before = shop_orders()
    iterations = client.of_turn(topics.ITERATIONS, request_id)
    assert len(iterations) == reply.steps
    for iteration in iterations:  # redeliver every iteration of the turn, first to last
        await client.producer.send_and_wait(
            client.topic(topics.ITERATIONS),
            json.dumps(iteration).encode(),
            key=iteration["turn"]["conversation_id"].encode(),
        )
    await client.settled()  # the redelivered iterations handled: a step checked twice would be in `seen`
    assert len(client.replies[request_id]) == 1
    assert len(client.of_turn(topics.TOOL_CALLS, request_id)) == reply.steps - 1  # no step was checked twice
    assert shop_orders() == before


@pytest.mark.kills_services
async def test_a_turn_whose_executors_died_is_flagged_stuck_then_ended_politely(client, fleet, fleet_settings):
    # the grace leaves `roundtrip turns` (its own process, seconds to start on a busy machine, the e2e tier running
    # beside the others) time to list it stuck
    async with fleet.reconfigured(("guard", "gate"), stuck_after_s=2, stuck_grace_s=12):
        await fleet.kill("executor")
        try:
            started = time.monotonic()
            request_id = await client.ask("where is my order?", customer="cus_1001", persona="careful")
            await client.wait_for(lambda: client.of_turn(topics.TOOL_BATCHES, request_id), timeout=30)

            stuck = await client.wait_for(
                lambda: [e for e in client.seen[topics.TURN_EVENTS] if e["turn"]["request_id"] == request_id],
                timeout=15,
            )
            assert stuck[0]["status"] == "stuck" and stuck[0]["idle_s"] >= 2
            listing = roundtrip_cli(fleet_settings, "turns", "--status", "stuck")
            assert listing.returncode == 0, listing.stderr
            assert stuck[0]["turn"]["turn_id"] in listing.stdout and stuck[0]["turn"]["trace_id"] in listing.stdout

            reply = await client.reply(request_id, timeout=30)
            elapsed = time.monotonic() - started
            assert reply.outcome is Outcome.DEADLINE
            assert "sorry" in reply.text.lower()
            assert elapsed < 2 + 12 + 10  # stuck_after + grace + sweeping and start-up slack
        finally:
            await fleet.respawn("executor")
    # The stale batch the executors find on their return has expired: it never runs, and no second reply comes.
    await client.settled()  # the returned executors handled the stale batch
    assert len(client.replies[request_id]) == 1


async def test_turns_cancel_stops_a_stubborn_turn_mid_loop(client, fleet, fleet_settings):
    async with (
        fleet.reconfigured(("simulator",), simulator_latency_ms=700),
        fleet.reconfigured(("guard",), loop_rules=False),
    ):
        request_id = await client.ask("where is my order ord_0000dead?", customer="cus_1003", persona="stubborn")
        first = await client.wait_for(lambda: client.of_turn(topics.ITERATIONS, request_id), timeout=30)
        result = roundtrip_cli(fleet_settings, "turns", "cancel", first[0]["turn"]["turn_id"])
        assert result.returncode == 0, result.stderr
        reply = await client.reply(request_id, timeout=30)
    assert reply.outcome is Outcome.CANCELLED
    assert reply.steps < fleet_settings[0].max_steps
    assert "sorry" in reply.text.lower()
    await client.settled()  # the steps in flight at the cancel handled: a second reply would be in `seen`
    assert len(client.replies[request_id]) == 1
