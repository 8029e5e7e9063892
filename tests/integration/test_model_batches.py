"""The model service's batch lane on the real broker, a real ledger file and the simulator's Message Batches API over
HTTP through the anthropic SDK: batch turns' calls go out in one batch and come back as their turns' iterations with
the batch id, and a model service stopped while its batch is open is replaced by one that answers it without
submitting anything again (the simulator counts creates per custom id); a batch whose turns all ended is cancelled
there."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
from aiokafka import AIOKafkaConsumer
from faststream import TestApp
from sqlalchemy import insert, select, update

from roundtrip import load_agent
from roundtrip._kernel.settings import Settings
from roundtrip._kernel.storage.turnstore import ENDED, RUNNING, TurnStore, batch_calls, turns
from roundtrip._kernel.wire import topics
from roundtrip._kernel.wire.events import CallModel, ModelResponded, Turn
from roundtrip._model import app as model_app
from roundtrip._simulator import running_simulator
from tests.databases import migrated

pytestmark = pytest.mark.integration


def settings_for(tmp_path, ledger: str, bootstrap: str, prefix: str, simulator: str) -> Settings:
    return Settings(
        _env_file=None,
        env="development",  # the embedded broker's plaintext listener, as the other fleet tests run it
        state_dir=tmp_path,
        ledger_database_url=ledger,
        kafka_bootstrap_servers=bootstrap,
        topic_prefix=prefix,
        anthropic_api_key=None,
        anthropic_base_url=simulator,
        instance_id="model-batches-it",
        batch_max_calls=3,
        batch_max_wait_s=0.5,
        batch_poll_s=0.2,
        batch_poll_max_s=0.5,
    )


async def live_turns(ledger: str, count: int) -> list[Turn]:
    """`count` running turns of the batch lane, as the guard records them, at their first model call."""
    now = time.time()
    made = [
        Turn(
            turn_id=f"turn_it{n}",
            request_id=f"req_{n}",
            conversation_id=f"conv_{n}",
            customer_id="cus_1001",
            persona="careful",
            lane="batch",
            deadline_at=now + 3600,
        )
        for n in range(count)
    ]
    store = await TurnStore.open(ledger)
    try:
        for turn in made:
            values = dict(
                turn_id=turn.turn_id, request_id=turn.request_id, conversation_id=turn.conversation_id,
                customer_id=turn.customer_id, status=RUNNING, step=0, started_at=now, last_progress_at=now,
                deadline_at=turn.deadline_at, turn_json=turn.model_dump_json(),
            )  # fmt: skip
            await store._run(lambda conn, v=values: conn.execute(insert(turns).values(**v)), write=True)
    finally:
        await store.close()
    return made


def call(turn: Turn) -> CallModel:
    return CallModel(turn=turn, step=0, messages=[{"role": "user", "content": "Please cancel my last order"}])


async def iterations(settings: Settings, count: int) -> list[ModelResponded]:
    reader = AIOKafkaConsumer(
        topics.t(topics.ITERATIONS, settings.topic_prefix),
        bootstrap_servers=settings.bootstrap_servers,
        auto_offset_reset="earliest",
    )
    await reader.start()
    try:
        found = []
        while len(found) < count:
            record = await asyncio.wait_for(reader.getone(), 60)
            found.append(ModelResponded.model_validate_json(record.value))
        return found
    finally:
        await reader.stop()


def batches_seen(simulator: str) -> dict:
    return httpx.get(f"{simulator}/v1/_batches", timeout=5).json()


async def test_batch_turns_calls_go_in_one_batch_and_come_back_as_their_iterations(
    tmp_path, kafka_bootstrap, kafka_topics
):
    ledger = await migrated(f"sqlite+aiosqlite:///{tmp_path / 'ledger.db'}")
    made = await live_turns(ledger, 3)
    with running_simulator(batch_delay_ms=300) as simulator:
        settings = settings_for(tmp_path, ledger, kafka_bootstrap, kafka_topics, simulator)
        app = model_app.build(settings, load_agent(None))
        async with TestApp(app):
            for turn in made:
                await app.broker.publish(
                    call(turn), topic=topics.t(topics.MODEL_CALLS, kafka_topics), key=turn.conversation_id.encode()
                )
            events = await iterations(settings, 3)
        seen = batches_seen(simulator)
    assert sorted(e.turn.turn_id for e in events) == [t.turn_id for t in made]
    (batch_id,) = {e.batch_id for e in events}
    assert batch_id.startswith("msgbatch_") and list(seen["batches"]) == [batch_id]
    assert seen["submissions"] == {f"{t.turn_id}_0": 1 for t in made}
    for event in events:
        assert event.step == 1 and event.error is None
        cached = event.usage.cache_creation_input_tokens + event.usage.cache_read_input_tokens
        assert cached > 1000  # the whole prompt a cache write or read, billed as a direct call's
        assert [c.name for c in event.tool_calls] == ["list_orders"]  # the persona's first step, as a direct call's


async def test_a_model_service_stopped_while_its_batch_is_open_is_replaced_without_a_second_submission(
    tmp_path, kafka_bootstrap, kafka_topics
):
    ledger = await migrated(f"sqlite+aiosqlite:///{tmp_path / 'ledger.db'}")
    made = await live_turns(ledger, 3)
    with running_simulator(batch_delay_ms=4000) as simulator:
        settings = settings_for(tmp_path, ledger, kafka_bootstrap, kafka_topics, simulator)
        first = model_app.build(settings, load_agent(None))
        async with TestApp(first):
            for turn in made:
                await first.broker.publish(
                    call(turn), topic=topics.t(topics.MODEL_CALLS, kafka_topics), key=turn.conversation_id.encode()
                )
            while not batches_seen(simulator)["batches"]:
                await asyncio.sleep(0.1)  # poll interval: the simulator's batches, until the lane's is created
        assert list(batches_seen(simulator)["batches"].values()) == ["in_progress"]  # stopped with its batch open
        second = model_app.build(settings, load_agent(None))
        async with TestApp(second):
            events = await iterations(settings, 3)
        seen = batches_seen(simulator)
    assert sorted(e.turn.turn_id for e in events) == [t.turn_id for t in made]
    assert {e.batch_id for e in events} == set(seen["batches"]) and len(seen["batches"]) == 1
    assert seen["submissions"] == {f"{t.turn_id}_0": 1 for t in made}


async def test_a_batch_whose_turns_all_ended_is_cancelled_at_the_simulator(tmp_path, kafka_bootstrap, kafka_topics):
    ledger = await migrated(f"sqlite+aiosqlite:///{tmp_path / 'ledger.db'}")
    made = await live_turns(ledger, 3)
    with running_simulator(batch_delay_ms=600_000) as simulator:  # open for ten minutes unless cancelled
        settings = settings_for(tmp_path, ledger, kafka_bootstrap, kafka_topics, simulator)
        app = model_app.build(settings, load_agent(None))
        async with TestApp(app):
            for turn in made:
                await app.broker.publish(
                    call(turn), topic=topics.t(topics.MODEL_CALLS, kafka_topics), key=turn.conversation_id.encode()
                )
            while not batches_seen(simulator)["batches"]:
                await asyncio.sleep(0.1)  # poll interval: the simulator's batches, until the lane's is created
            (batch_id,) = batches_seen(simulator)["batches"]
            await ended(ledger, made)  # as the guard ends them: a cancel, a deadline
            batch = await cancelled_at(simulator, batch_id, timeout=30)
        store = await TurnStore.open(ledger)
        try:
            recorded = await store._run(lambda conn: conn.execute(select(batch_calls.c.status)).scalars().all())
        finally:
            await store.close()
    assert batch["request_counts"]["canceled"] == 3 and batch["processing_status"] == "ended"
    assert recorded == ["cancelled"] * 3


async def ended(ledger: str, made: list[Turn]) -> None:
    store = await TurnStore.open(ledger)
    try:
        statement = update(turns).where(turns.c.turn_id.in_([t.turn_id for t in made])).values(status=ENDED)
        await store._run(lambda conn: conn.execute(statement), write=True)
    finally:
        await store.close()


async def cancelled_at(simulator: str, batch_id: str, timeout: float) -> dict:
    """The batch as the API shows it, once its cancel was asked."""
    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient(base_url=simulator, headers={"x-api-key": "test"}) as http:
        while True:
            batch = (await http.get(f"/v1/messages/batches/{batch_id}")).json()
            if batch["cancel_initiated_at"]:
                return batch
            assert time.monotonic() < deadline, f"batch {batch_id} not cancelled within {timeout:g} s: {batch}"
            await asyncio.sleep(0.1)  # poll interval: the simulator's view of the batch
