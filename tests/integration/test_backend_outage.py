"""A backend that times out for one conversation's ids holds that conversation only: the gate, a real process on
the real broker, checks the steps of many conversations on ONE partition while the shop (a real HTTP server) never
answers the look-ups of one order. The other conversations' steps are signed at their normal latency, before and
during the hold; the stuck step is retried in its place and, once its turn's deadline has passed, answered with the
call refused in the agent's words; every step gets exactly one batch; the gate stays ready (/readyz) and shows the
held key (`roundtrip_held_keys`), with one log line for it (services/_kernel/kafka/outages.py, docs/faults.md).

This is the gate's half of the turn: past the deadline no executor runs the batch (it expires with the turn) and the
guard's sweeper ends the turn with its one reply, as for any turn past its deadline: the whole turn is
tests/e2e/test_backend_outage_e2e.py.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid

import httpx
import pytest
import uvicorn
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from roundtrip._broker.embedded import free_port
from roundtrip._guard.ledger import Ledger
from roundtrip._kernel.wire import topics
from roundtrip._kernel.wire.events import CheckToolCalls, ExecuteToolBatch, ToolCall, Turn
from roundtrip._kernel.wire.topology import group
from roundtrip._shop.agent import AGENT as SHOP
from roundtrip._shop.app import create_app
from tests.databases import migrated
from tests.processes import start_service
from tests.topics import topics_report

pytestmark = pytest.mark.integration

STUCK_ORDER = "ord_a1000003"  # Alice's: the shop never answers its look-ups
OTHER_ORDERS = ("ord_a1000001", "ord_a1000002", "ord_a1000004")
TOOL_TIMEOUT_S = 1.0  # the shop client's timeout in the gate (ROUNDTRIP_TOOL_TIMEOUT_S)
STUCK_DEADLINE_S = 8.0  # the stuck turn's deadline, from its step's publication
HELD = "key b'conv_stuck'"  # the gate's line when it begins to hold the conversation
NORMAL_S = 3.0  # what a step of a conversation the outage does not concern may take, at most, on this shared machine


def never_answering(app, order_id: str, released: asyncio.Event):
    """The shop's ASGI app, except that a request about `order_id` gets no answer until `released` (the client times
    out long before)."""

    async def wrapped(scope, receive, send):
        if scope["type"] == "http" and order_id in scope["path"]:
            await released.wait()
        await app(scope, receive, send)

    return wrapped


@pytest.fixture
async def slow_shop(tmp_path):
    port, released = free_port(), asyncio.Event()
    shop = create_app(f"sqlite+aiosqlite:///{tmp_path / 'shop.db'}", seed=True)
    config = uvicorn.Config(never_answering(shop, STUCK_ORDER, released), port=port, log_level="warning")
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    while not server.started:
        assert not task.done(), "the shop did not start"
        await asyncio.sleep(0.05)  # poll interval: the shop's server started
    yield f"http://127.0.0.1:{port}"
    released.set()
    server.should_exit = True
    await asyncio.wait_for(task, 20)


def step(conversation: str, order_id: str, deadline_at: float) -> CheckToolCalls:
    turn = Turn(
        turn_id=f"turn_{conversation}",
        request_id=f"req_{conversation}",
        conversation_id=conversation,
        customer_id="cus_1001",
        started_at=time.time(),
        deadline_at=round(deadline_at, 3),
    )
    call = ToolCall(id="toolu_1", name="lookup_order", input={"order_id": order_id}, fingerprint="fp")
    assistant = {"role": "assistant", "content": [{"type": "tool_use", **call.model_dump(include={"id", "name"})}]}
    return CheckToolCalls(turn=turn, step=1, messages=[assistant], calls=[call])


async def test_a_backend_that_times_out_for_one_conversation_holds_only_it_until_its_deadline(
    kafka_bootstrap, slow_shop, tmp_path
):
    prefix = f"away{uuid.uuid4().hex[:6]}."
    health = free_port()
    ledger_url = f"sqlite+aiosqlite:///{tmp_path / 'ledger.db'}"
    await migrated(ledger_url)  # the gate authorizes for the turn as the ledger recorded it at its start
    ledger = await Ledger.open(ledger_url)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROUNDTRIP_")}
    env |= {
        "ROUNDTRIP_KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "ROUNDTRIP_TOPIC_PREFIX": prefix,
        "ROUNDTRIP_STATE_DIR": str(tmp_path),
        "ROUNDTRIP_SHOP_URL": slow_shop,
        "ROUNDTRIP_LEDGER_DATABASE_URL": ledger_url,
        "ROUNDTRIP_TOOL_TIMEOUT_S": str(TOOL_TIMEOUT_S),
        "ROUNDTRIP_HEALTH_PORT": str(health),
        "ROUNDTRIP_ENV": "development",
        "PYTHONUNBUFFERED": "1",
    }
    await topics_report(kafka_bootstrap, prefix, partitions=1)  # every conversation on the same partition
    log = tmp_path / "gate.log"
    gate = start_service("gate", env, log)
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, linger_ms=0)
    batches = AIOKafkaConsumer(
        prefix + topics.TOOL_BATCHES,
        bootstrap_servers=kafka_bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        isolation_level="read_committed",
    )
    await producer.start()
    await batches.start()
    got: dict[str, list[tuple[float, ExecuteToolBatch]]] = {}

    async def read() -> None:
        async for record in batches:
            batch = ExecuteToolBatch.model_validate_json(record.value)
            got.setdefault(batch.turn.conversation_id, []).append((time.time(), batch))

    reader = asyncio.create_task(read())
    published: dict[str, float] = {}

    async def publish(conversation: str, order_id: str, deadline_at: float) -> None:
        command = step(conversation, order_id, deadline_at)
        await ledger.start(command.turn.model_dump(mode="json"), pending="{}")  # as the guard starts the turn
        published[conversation] = time.time()
        await producer.send_and_wait(
            prefix + topics.TOOL_CALLS, command.model_dump_json().encode(), key=conversation.encode()
        )

    async def until(condition, timeout: float, what: str) -> None:
        end = time.monotonic() + timeout
        while not condition():
            assert time.monotonic() < end, f"timed out waiting for {what}"
            await asyncio.sleep(0.05)  # poll interval: the condition awaited

    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{health}") as probe:
            # the stuck conversation first, then the others behind it on the same partition
            stuck_deadline = time.time() + STUCK_DEADLINE_S
            await publish("conv_stuck", STUCK_ORDER, stuck_deadline)
            first = [f"conv_a{i}" for i in range(6)]
            for i, conversation in enumerate(first):
                await publish(conversation, OTHER_ORDERS[i % 3], time.time() + 60)
            await until(lambda: all(c in got for c in first), 2 * NORMAL_S + 6, "the first conversations' batches")

            # while the stuck one is held: the gate fetches and checks new steps, stays ready and shows the hold
            await until(lambda: HELD in log.read_text(), 10, "the hold's log line")
            later = [f"conv_b{i}" for i in range(4)]
            for i, conversation in enumerate(later):
                await publish(conversation, OTHER_ORDERS[i % 3], time.time() + 60)
            await until(lambda: all(c in got for c in later), 2 * NORMAL_S, "the later conversations' batches")
            metrics = (await probe.get("/metrics")).text
            ready = await probe.get("/readyz")
            assert time.time() < stuck_deadline, "the stuck step should still be held here (a slower machine?)"
            assert "conv_stuck" not in got
            assert 'roundtrip_held_keys{consumer="gate"} 1.0' in metrics
            assert ready.status_code == 200, ready.text  # a held conversation does not make the replica unready
            assert not [
                line
                for line in metrics.splitlines()
                if line.startswith("roundtrip_dependency_unavailable{") and not line.endswith(" 0.0")
            ]

            for conversation in first + later:  # every other step at its normal latency, approved, once
                (arrived, batch), *more = got[conversation]
                assert not more, conversation
                assert arrived - published[conversation] < NORMAL_S + (0 if conversation in later else 4)
                assert batch.calls[0].approved, batch.calls[0]

            await until(lambda: "conv_stuck" in got, STUCK_DEADLINE_S + TOOL_TIMEOUT_S + 10, "the stuck step's batch")
            await asyncio.sleep(2 * TOOL_TIMEOUT_S + 1)  # no second batch comes for it
            (arrived, batch), *more = got["conv_stuck"]
            assert not more
            # answered once its deadline passed: the try due at the deadline, plus one look-up timing out
            assert stuck_deadline <= arrived < stuck_deadline + TOOL_TIMEOUT_S + 3, arrived - stuck_deadline
            (refused,) = batch.calls
            assert not refused.approved and refused.error == SHOP.message("lookup_failed")
            assert batch.expires_at == round(stuck_deadline, 3)  # no executor runs it: the turn's deadline passed
            assert 'roundtrip_held_keys{consumer="gate"} 0.0' in (await probe.get("/metrics")).text

        held_lines = [line for line in log.read_text().splitlines() if HELD in line]
        assert len(held_lines) == 1, held_lines  # one line for the hold, not one per try
        # every step finished: the gate's group committed the whole partition
        probe_consumer = AIOKafkaConsumer(
            bootstrap_servers=kafka_bootstrap, group_id=group("gate", prefix=prefix), enable_auto_commit=False
        )
        await probe_consumer.start()
        try:
            tp = TopicPartition(prefix + topics.TOOL_CALLS, 0)
            end = time.monotonic() + 10
            while (await probe_consumer.committed(tp)) != 1 + len(first) + len(later):
                assert time.monotonic() < end, await probe_consumer.committed(tp)
                await asyncio.sleep(0.2)  # poll interval: the group's committed offset
        finally:
            await probe_consumer.stop()
    finally:
        reader.cancel()
        await batches.stop()
        await producer.stop()
        await ledger.close()
        gate.terminate()
        gate.wait(20)
        print(json.dumps({c: [round(t - published[c], 2) for t, _ in v] for c, v in got.items()}))
