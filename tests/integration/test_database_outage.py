"""A real PostgreSQL stopped (and SIGKILLed) under a consumer that writes the turn ledger, then started again:
every record is retried, none is dead-lettered, the consumer pauses while the database is away (the metric, /readyz's
check) and resumes by itself (services/_kernel/kafka/faults.py, services/_kernel/kafka/consumer.py)."""

from __future__ import annotations

import asyncio
import signal
from types import SimpleNamespace

import pytest
from aiokafka import TopicPartition

from roundtrip._guard.ledger import Ledger
from roundtrip._kernel.kafka import faults, messaging
from roundtrip._kernel.settings import Settings
from roundtrip._kernel.wire import topics
from roundtrip._kernel.wire.events import CancelTurn
from tests import waiting
from tests.databases import PostgresServer, find_pg_bindir, migrated

PREFIX = "outage."
SETTINGS = Settings(_env_file=None, topic_prefix=PREFIX)
TP = TopicPartition(topics.t(topics.TURN_CONTROLS, PREFIX), 0)


class FeedingKafka:
    """Gives out `records` a few at a time while not paused; remembers the pauses and commits."""

    def __init__(self, records: list) -> None:
        self.records, self.paused, self.pauses, self.commits = list(records), False, 0, []

    def assignment(self):
        return {TP}

    def pause(self, *parts):
        self.paused, self.pauses = True, self.pauses + 1

    def resume(self, *parts):
        self.paused = False

    async def commit(self, offsets):
        self.commits.append(dict(offsets))

    async def getmany(self, timeout_ms=0, max_records=None):
        await asyncio.sleep(0.02)  # a fake poll's wait: the consumer loop yields as on a real broker
        if self.paused or not self.records:
            return {}
        batch, self.records = self.records[:5], self.records[5:]
        return {TP: batch}


class FakeProducer:
    def __init__(self) -> None:
        self.sent: list = []

    async def send(self, topic, value, key=None, headers=None):
        self.sent.append((topic, value))
        done = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done


@pytest.fixture
def server():
    bindir = find_pg_bindir()
    if bindir is None:
        pytest.fail("PostgreSQL server binaries not found (see tests/conftest.py's postgres_url)", pytrace=False)
    pg = PostgresServer(bindir, crash_safe=True)  # its commits survive its SIGKILL
    url = pg.start()
    yield SimpleNamespace(pg=pg, url=url)
    pg.stop()


@pytest.mark.parametrize("how", [signal.SIGINT, signal.SIGKILL], ids=["stopped", "killed"])
async def test_a_consumer_waits_out_a_database_outage_and_dead_letters_nothing(server, monkeypatch, how):
    url = await migrated(server.url)
    ledger = await Ledger.open(url)
    producer = FakeProducer()
    monkeypatch.setattr(messaging, "kafka_producer", lambda broker: producer)
    wired = messaging.wiring("outage", SETTINGS, (), "")

    @messaging.subscribe(wired, topics.TURN_CONTROLS, SETTINGS, max_in_flight=8)
    async def on_control(command: CancelTurn) -> None:
        turn = {"turn_id": command.turn_id, "request_id": "r", "conversation_id": "c", "customer_id": "cus_1"}
        await ledger.start(turn, pending="{}")

    (consumer,) = wired.consumers
    n = 60
    records = [
        SimpleNamespace(
            topic=TP.topic,
            partition=0,
            offset=i,
            timestamp=0,
            key=f"c{i % 7}".encode(),
            headers=[],
            value=CancelTurn(turn_id=f"t{i}").model_dump_json().encode(),
        )
        for i in range(n)
    ]
    kafka = FeedingKafka(records)
    await consumer.on_partitions_assigned([TP])
    task = asyncio.create_task(consumer.run(kafka))
    try:
        await _until(lambda: consumer.processed >= 10, 20)
        server.pg.halt(how)
        # the outage is recorded first, then the loop pauses its partitions while the database is away
        await _until(lambda: consumer.outages.waiting == (faults.DATABASE,) and kafka.paused, 20)
        await asyncio.sleep(2)  # the records in hand are retried meanwhile, none dead-lettered
        assert consumer.outages and producer.sent == []
        await asyncio.to_thread(server.pg.resume)
        await _until(lambda: consumer.processed == n, 60)
        assert not consumer.outages and producer.sent == []  # every record went through, not one dead letter
        for i in range(n):
            assert await ledger.get(f"t{i}") is not None, i
    finally:
        await consumer.drain()
        await asyncio.wait_for(task, 10)
        await ledger.close()


async def _until(condition, timeout: float) -> None:
    await waiting.until(condition, timeout)
