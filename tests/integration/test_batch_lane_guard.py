"""The guard's stuck rule and the batch lane (issue 55), with the guard a real process on the session's broker and a
real ledger (a SQLite file, PostgreSQL): a batch turn waiting for its model answer is never flagged stuck and ends at
its own deadline, while a chat turn waiting as long beside it is flagged and ended after the grace.

No model service runs, so both turns wait at step 0 for their first model call, as a batch turn does while its call
is in a Message Batch. The turns are started as the gateway starts them: a StartTurn on turn.starts, the batch one
with the deadline the gateway gives a batch turn.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time
import uuid

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from roundtrip._guard.ledger import ENDED, Ledger
from roundtrip._kernel.wire import topics
from roundtrip._kernel.wire.events import StartTurn, Turn
from tests.databases import migrated
from tests.processes import start_service
from tests.readers import stop_reader

STUCK_AFTER_S = 1.0
GRACE_S = 1.0
BATCH_DEADLINE_S = 10.0  # the batch turn's own deadline: far past the chat turn's stuck flag and grace


@pytest.fixture(params=["sqlite", "postgresql"])
def ledger_url(request, tmp_path) -> str:
    """A new, empty ledger database of either kind."""
    if request.param == "sqlite":
        return f"sqlite+aiosqlite:///{tmp_path / 'ledger.db'}"
    return request.getfixturevalue("postgres_database")


def _turn(lane: str, deadline_at: float = 0.0) -> Turn:
    rid = f"req_{uuid.uuid4().hex[:8]}"
    return Turn(
        turn_id=f"turn_{uuid.uuid4().hex[:12]}",
        request_id=rid,
        conversation_id=f"conv_{rid}",
        customer_id="cus_1001",
        trace_id=uuid.uuid4().hex,
        started_at=time.time(),
        deadline_at=deadline_at,
        lane=lane,
    )


async def test_a_batch_turn_waiting_for_its_model_answer_is_never_stuck_and_ends_at_its_own_deadline(
    kafka_bootstrap, kafka_topics, ledger_url, tmp_path
):
    prefix = kafka_topics
    await migrated(ledger_url)  # as `roundtrip db upgrade` does before the services start
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROUNDTRIP_")}
    env |= {
        "ROUNDTRIP_KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "ROUNDTRIP_TOPIC_PREFIX": prefix,
        "ROUNDTRIP_STATE_DIR": str(tmp_path),
        "ROUNDTRIP_LEDGER_DATABASE_URL": ledger_url,
        "ROUNDTRIP_STUCK_AFTER_S": str(STUCK_AFTER_S),
        "ROUNDTRIP_STUCK_GRACE_S": str(GRACE_S),
        "ROUNDTRIP_ENV": "development",
        "PYTHONUNBUFFERED": "1",
    }
    guard = start_service("guard", env, tmp_path / "guard.log")
    seen: dict[str, list[tuple[str, dict]]] = {}
    consumer = AIOKafkaConsumer(
        prefix + topics.TURN_EVENTS,
        prefix + topics.OUTCOMES,
        bootstrap_servers=kafka_bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        isolation_level="read_committed",
    )
    await consumer.start()

    async def read() -> None:
        async for record in consumer:
            message = json.loads(record.value)
            seen.setdefault(message["turn"]["turn_id"], []).append((record.topic.removeprefix(prefix), message))

    reader = asyncio.create_task(read())
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
    await producer.start()
    ledger = await Ledger.open(ledger_url)
    chat, batch = _turn("interactive"), _turn("batch", deadline_at=round(time.time() + BATCH_DEADLINE_S, 3))
    try:
        for turn in (chat, batch):
            start = StartTurn(turn=turn, text="where is my order?")
            await producer.send_and_wait(
                prefix + topics.TURN_STARTS, start.model_dump_json().encode(), key=turn.conversation_id.encode()
            )

        async def row(turn: Turn):
            return await ledger.get(turn.turn_id)

        deadline = time.monotonic() + 60
        while (done := await row(chat)) is None or done.status != ENDED:
            assert time.monotonic() < deadline, f"the chat turn was not flagged and ended: {done}"
            await asyncio.sleep(0.1)  # poll interval: the guard's rows in the ledger
        assert done.outcome == "deadline" and done.flagged_at is not None
        waiting = await row(batch)
        assert waiting is not None and waiting.lane == "batch" and waiting.status == "running", waiting
        assert waiting.in_batch and waiting.shown_status == "in batch" and waiting.flagged_at is None
        assert waiting.deadline_at == pytest.approx(batch.deadline_at)  # the gateway's, not the fleet's 300 s

        deadline = time.monotonic() + BATCH_DEADLINE_S + 30
        while (ended := await row(batch)).status != ENDED:
            assert time.monotonic() < deadline, f"the batch turn did not end at its deadline: {ended}"
            assert ended.flagged_at is None, "a batch turn waiting for its model answer was flagged stuck"
            await asyncio.sleep(0.1)  # poll interval: the guard's rows in the ledger
        assert ended.outcome == "deadline" and ended.flagged_at is None
        assert ended.ended_at >= batch.deadline_at

        async def topics_of(turn: Turn) -> list[str]:
            deadline = time.monotonic() + 30
            while not any(topic == topics.OUTCOMES for topic, _ in seen.get(turn.turn_id, [])):
                assert time.monotonic() < deadline, f"no end of {turn.turn_id} on turn.outcomes"
                await asyncio.sleep(0.1)  # poll interval: the reader's records
            return [topic for topic, _ in seen[turn.turn_id]]

        assert topics.TURN_EVENTS in await topics_of(chat)  # flagged on turn.events, then ended
        assert set(await topics_of(batch)) == {topics.OUTCOMES}  # never flagged: only its end (at least once)
        assert {m["outcome"] for topic, m in seen[batch.turn_id] if topic == topics.OUTCOMES} == {"deadline"}
    finally:
        await ledger.close()
        await producer.stop()
        await stop_reader(reader, consumer)
        guard.send_signal(signal.SIGTERM)
        try:
            guard.wait(timeout=20)
        except subprocess.TimeoutExpired:
            guard.kill()
