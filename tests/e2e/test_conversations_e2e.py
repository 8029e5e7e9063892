"""Conversations end to end through support.requests: a follow-up uses the history, another customer is
refused, requests of one conversation run one after another, and a long conversation with large tool
results stays bounded."""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
import uuid
from statistics import mean

import httpx
from sqlalchemy import insert

from roundtrip._guard.conversations import Conversations
from roundtrip._kernel.wire import topics
from roundtrip._kernel.wire.events import Outcome
from roundtrip._shop import db as shop_db
from roundtrip._shop import demo_data

CARRIERS = (topics.MODEL_CALLS, topics.ITERATIONS, topics.TOOL_CALLS, topics.TOOL_BATCHES)


def _calls(client, request_id: str) -> list[str]:
    return [c["name"] for event in client.of_turn(topics.ITERATIONS, request_id) for c in event["tool_calls"]]


def _first_call(client, request_id: str) -> dict:
    return next(c for c in client.of_turn(topics.MODEL_CALLS, request_id) if c["step"] == 0)


def _paired(messages: list[dict]) -> bool:
    for i, message in enumerate(messages):
        uses = {
            b["id"] for b in message["content"] if isinstance(message["content"], list) and b.get("type") == "tool_use"
        }
        answers = {
            b.get("tool_use_id")
            for b in (messages[i + 1]["content"] if i + 1 < len(messages) else [])
            if isinstance(b, dict)
        }
        if uses - answers:
            return False
    return True


async def test_a_follow_up_uses_the_history_and_another_customer_is_refused(client, fleet_settings, shop_orders):
    settings = fleet_settings[0]
    httpx.post(f"{settings.shop_base_url}/admin/reset", timeout=10).raise_for_status()
    conversation = f"conv_{uuid.uuid4().hex[:10]}"
    before = shop_orders()

    first = await client.reply(
        await client.ask("what orders do I have?", "cus_1001", "careful", conversation_id=conversation)
    )
    assert first.outcome is Outcome.END_TURN
    listed = list(dict.fromkeys(re.findall(r"\bord_[0-9a-z]+\b", first.text)))
    assert len(listed) >= 2, first.text

    second_id = await client.ask(
        "cancel the second one you listed", "cus_1001", "careful", conversation_id=conversation
    )
    second = await client.reply(second_id)
    after = shop_orders()
    assert second.outcome is Outcome.END_TURN, second.text
    changed = {oid for oid in before if before[oid] != after[oid]}
    assert changed == {listed[1]} and after[listed[1]] == ("cus_1001", "cancelled"), (changed, listed)
    assert listed[1] in second.text
    assert _calls(client, second_id) == ["cancel_order"]  # no second list_orders: the history had it
    started = _first_call(client, second_id)
    assert started["turn"]["history_messages"] == 4 and _paired(started["messages"])
    assert second.usage.cache_read_input_tokens > 0

    third_id = await client.ask("which orders did we talk about?", "cus_1002", "careful", conversation_id=conversation)
    third = await client.reply(third_id)
    assert third.outcome is Outcome.CONVERSATION_REFUSED and third.steps == 0
    assert "another account" in third.text and not re.search(r"ord_", third.text)
    assert client.of_turn(topics.MODEL_CALLS, third_id) == [] and client.of_turn(topics.ITERATIONS, third_id) == []
    assert shop_orders() == after


async def test_requests_sent_at_once_run_one_after_another_each_with_the_turns_before(client):
    conversation = f"conv_{uuid.uuid4().hex[:10]}"
    ids = [
        await client.ask(text, "cus_1003", "careful", conversation_id=conversation)
        for text in ("what orders do I have?", "how do refunds work?", "what orders do I have now?")
    ]
    replies = [await client.reply(i) for i in ids]
    assert [r.outcome for r in replies] == [Outcome.END_TURN] * 3
    histories = [_first_call(client, i)["turn"]["history_messages"] for i in ids]
    assert histories[0] == 0 and 0 < histories[1] < histories[2]  # each started after the one before had ended
    ended = [
        m["turn"]["request_id"] for m in client.seen[topics.OUTCOMES] if m["turn"]["conversation_id"] == conversation
    ]
    assert ended == ids


async def _seed_bulk_customer(settings, customer: str, orders: int = 20, items: int = 10) -> None:
    """A customer whose list_orders result is about 50 kB (20 orders of about 2.5 kB)."""
    engine = shop_db.make_engine(settings.shop_db_url)
    try:
        async with engine.begin() as conn:
            await conn.execute(
                insert(shop_db.customers),
                [{"customer_id": customer, "name": "Bulk Buyer", "email": f"{customer}@example.com"}],
            )
            rows = [
                demo_data._order(
                    f"ord_{customer[-6:]}{n:04d}",
                    customer,
                    "delivered",
                    f"2026-0{1 + n % 9}-1{n % 10}T10:00:00",
                    [
                        demo_data._item(
                            f"SKU-{n}-{i}", f"Item {i} of order {n}: " + "a very long product name " * 9, 1, 1000 + i
                        )
                        for i in range(items)
                    ],
                )
                for n in range(orders)
            ]
            await conn.execute(insert(shop_db.orders), rows)
    finally:
        await engine.dispose()


async def test_a_100_request_conversation_with_50_kb_tool_results_stays_bounded(client, fleet_settings):
    settings = fleet_settings[0]
    customer = f"cus_{uuid.uuid4().hex[:6]}"
    await _seed_bulk_customer(settings, customer)
    conversation = f"conv_{uuid.uuid4().hex[:10]}"
    ids = [
        await client.ask(f"what orders do I have? ({n})", customer, "careful", conversation_id=conversation)
        for n in range(100)
    ]
    replies = [await client.reply(i, timeout=600) for i in ids]
    assert [r.outcome for r in replies] == [Outcome.END_TURN] * 100
    assert all(_calls(client, i) == ["list_orders"] for i in ids)

    results = [
        len(b["content"].encode())
        for c in client.of_turn(topics.MODEL_CALLS, ids[0])
        if c["step"]
        for b in c["messages"][-1]["content"]
        if b.get("type") == "tool_result"
    ]
    assert results and 45_000 < results[0] < 64_000, results

    sizes: dict[str, list[list[int]]] = {name: [] for name in CARRIERS}
    for request_id in ids:
        for name in CARRIERS:
            sizes[name].append(
                [len(json.dumps(m, separators=(",", ":")).encode()) for m in client.of_turn(name, request_id)]
            )
        for command in client.of_turn(topics.MODEL_CALLS, request_id):
            assert _paired(command["messages"]), request_id  # never split inside a tool call
    largest = max(s for per_topic in sizes.values() for turn in per_topic for s in turn)
    early = max(s for per_topic in sizes.values() for turn in per_topic[1:20] for s in turn)
    late = max(s for per_topic in sizes.values() for turn in per_topic[80:] for s in turn)
    budget_bytes = settings.history_tokens * 4
    print(
        f"\n100-request conversation, list_orders result {results[0]:,} bytes, history budget "
        f"{settings.history_tokens:,} tokens"
    )
    for name, per_turn in sizes.items():
        flat = [s for turn in per_turn for s in turn]
        print(
            f"  {name:<20} events {len(flat):4d}  mean {mean(flat):9,.0f} B  max {max(flat):9,} B  "
            f"turn 1 max {max(per_turn[0]):9,} B  turn 100 max {max(per_turn[-1]):9,} B"
        )
    assert largest < budget_bytes + 3 * 64 * 1024 < 1_000_000 and late <= early * 1.05, (largest, early, late)

    store = await Conversations.open(settings.conversations_db_url, settings.history_tokens)
    try:
        row = await store.get(conversation)
        history = await store.history(conversation)
    finally:
        await store.close()
    print(
        f"  stored: {row.turns} turns, {row.history_turns} in the history ({row.history_tokens:,} tokens), "
        f"{row.dropped_turns} dropped"
    )
    assert row.turns == 100 and row.dropped_turns >= 90 and row.history_tokens <= settings.history_tokens
    assert _paired(history) and history[0]["role"] == "user" and history[-1]["role"] == "assistant"


async def test_chat_holds_a_conversation_and_conversations_lists_and_forgets_it(client, fleet_settings):
    env = {**os.environ, **fleet_settings[1]}
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "roundtrip._cli.main",
        "chat",
        "--customer",
        "cus_1003",
        "--persona",
        "careful",
        env=env,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(b"what orders do I have?\nhow do refunds work?\n"), 120)
    text = out.decode()
    assert process.returncode == 0, err.decode()
    assert text.count("\nreply (end_turn") == 2 and "step 1 model" in text and "calls list_orders" in text, text
    conversation = re.search(r"conversation (conv_\w+) as cus_1003", text).group(1)
    turns = [
        m for m in client.seen[topics.MODEL_CALLS] if m["turn"]["conversation_id"] == conversation and m["step"] == 0
    ]
    assert [t["turn"]["history_messages"] for t in turns] == [0, 4]

    async def cli(*args: str) -> tuple[int, str]:
        p = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "roundtrip._cli.main",
            *args,
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        output, _ = await asyncio.wait_for(p.communicate(), 60)
        return p.returncode, output.decode()

    code, listing = await cli("conversations", "--customer", "cus_1003")
    assert code == 0 and conversation in listing
    code, said = await cli("conversations", "forget", conversation)
    assert code == 0 and "forgotten" in said
    code, listing = await cli("conversations", "--customer", "cus_1003")
    assert conversation not in listing
    assert (await cli("conversations", "forget", conversation))[0] == 1
