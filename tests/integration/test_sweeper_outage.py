"""The guard's sweeper never waits on Kafka: with the broker away, stuck turns are still flagged and ended on
time in the ledger, and each gets exactly one reply once the broker is back.

The guard and the gateway run as real processes on a broker of this module's own (it is SIGKILLed, so it is
not the session's). No model service runs: every turn the gateway starts stays at step 0, which is what a
turn whose model calls cannot get through looks like to the guard. The broker goes away before any turn is
stuck, so nothing but the sweeper's own publishes (the stuck flags, the ends, the outbox) meets the outage.

Two waves, so that the outbox holds a decision the broker never took before the second wave is stuck: the first
wave is flagged while the broker is up and ended once it is down (its end stays pending in the ledger: the
outbox's work); the second is started just before the broker goes away and must still be flagged and ended
on time, with the outbox's publishes failing meanwhile (a sweeper that awaited them would stop there).
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

from roundtrip._guard.ledger import Ledger
from roundtrip._kernel.wire import topics
from tests.databases import migrated
from tests.processes import embedded_kafka, start_service
from tests.topics import topics_report

STUCK_AFTER_S = 3.0
GRACE_S = 6.0
WAVE = 2  # turns per wave


@pytest.fixture
def own_kafka(tmp_path):
    with embedded_kafka(tmp_path / "kafka") as kafka:  # SIGKILLed below: not the session's broker
        yield kafka


async def test_stuck_turns_are_flagged_and_ended_while_the_broker_is_down_and_replied_once_it_is_back(
    own_kafka, tmp_path
):
    prefix = f"sweep{uuid.uuid4().hex[:6]}."
    ledger_url = f"sqlite+aiosqlite:///{tmp_path / 'ledger.db'}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROUNDTRIP_")}
    env |= {
        "ROUNDTRIP_KAFKA_BOOTSTRAP_SERVERS": own_kafka.bootstrap,
        "ROUNDTRIP_TOPIC_PREFIX": prefix,
        "ROUNDTRIP_STATE_DIR": str(tmp_path),
        "ROUNDTRIP_LEDGER_DATABASE_URL": ledger_url,
        "ROUNDTRIP_STUCK_AFTER_S": str(STUCK_AFTER_S),
        "ROUNDTRIP_STUCK_GRACE_S": str(GRACE_S),
        "ROUNDTRIP_OUTBOX_AFTER_S": "0.5",  # the outbox takes up a failed end at once
        "ROUNDTRIP_ENV": "development",
        "PYTHONUNBUFFERED": "1",
    }
    await topics_report(own_kafka.bootstrap, prefix, partitions=2)
    await migrated(ledger_url)  # as `roundtrip db upgrade` does before the services start
    procs = []
    try:
        for name in ("guard", "gateway"):
            procs.append(start_service(name, env, tmp_path / f"{name}.log"))

        producer = AIOKafkaProducer(bootstrap_servers=own_kafka.bootstrap)
        await producer.start()
        ledger = await Ledger.open(ledger_url)
        requests: list[str] = []

        async def rows() -> dict:
            return {row.request_id: row for row in await ledger.list(limit=100) if row.request_id in requests}

        async def wave() -> float:
            """Start WAVE turns; return when the guard has recorded them, with their latest start."""
            ids = [f"req_{uuid.uuid4().hex[:8]}" for _ in range(WAVE)]
            requests.extend(ids)
            for rid in ids:
                body = {
                    "request_id": rid,
                    "conversation_id": f"conv_{rid}",
                    "customer_id": "cus_1001",
                    "text": "where is my order?",
                }
                await producer.send_and_wait(
                    prefix + topics.SUPPORT_REQUESTS, json.dumps(body).encode(), key=f"conv_{rid}".encode()
                )
            deadline = time.monotonic() + 30
            while len(recorded := await rows()) < len(requests):
                assert time.monotonic() < deadline, "the guard did not record the turns"
                await asyncio.sleep(0.1)  # poll interval: the guard's rows in the ledger
            return max(recorded[rid].started_at for rid in ids)

        try:
            await wave()
            deadline = time.monotonic() + STUCK_AFTER_S + 10
            # the first wave is flagged, the broker up
            while not all(row.flagged_at for row in (await rows()).values()):
                assert time.monotonic() < deadline, "the first wave was not flagged"
                await asyncio.sleep(0.1)  # poll interval: the sweeper's flags in the ledger
            second_started = await wave()
            await producer.stop()
            os.killpg(own_kafka.proc.pid, signal.SIGKILL)  # the broker goes away before the second wave is stuck
            await asyncio.to_thread(own_kafka.proc.wait)
            assert time.time() < second_started + STUCK_AFTER_S, (
                "the broker should be gone before the second wave is stuck"
            )

            # everything flagged after STUCK_AFTER_S and ended after the grace, in the ledger, the broker still down
            deadline = time.monotonic() + STUCK_AFTER_S + GRACE_S + 20
            while not all(row.outcome for row in (await rows()).values()):
                assert time.monotonic() < deadline, {
                    rid: (r.status, r.flagged_at, r.pending_at) for rid, r in (await rows()).items()
                }
                await asyncio.sleep(0.2)  # poll interval: the ledger's rows
            ended = await rows()
            assert own_kafka.proc.poll() is not None, "the broker must still be down"
            for row in ended.values():
                assert row.outcome == "deadline", row
                assert row.flagged_at is not None and row.flagged_at >= row.last_progress_at + STUCK_AFTER_S - 0.01
                assert row.ended_at >= row.flagged_at + GRACE_S - 0.01
                assert row.ended_at - (row.last_progress_at + STUCK_AFTER_S + GRACE_S) < 10, "ended late"
            assert all(row.pending for row in ended.values()), "the ends wait in the outbox for the broker"
        finally:
            await ledger.close()
        assert all(p.poll() is None for p in procs), "a service died during the outage"

        own_kafka.start()  # same data dir: topics and offsets kept
        await asyncio.to_thread(own_kafka.wait_ready, 90)
        consumer = AIOKafkaConsumer(
            prefix + topics.SUPPORT_REPLIES,
            bootstrap_servers=own_kafka.bootstrap,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            isolation_level="read_committed",
        )
        await consumer.start()
        replies: dict[str, list[dict]] = {}
        try:
            deadline = time.monotonic() + 60
            while not all(rid in replies for rid in requests) and time.monotonic() < deadline:
                for records in (await consumer.getmany(timeout_ms=1000)).values():
                    for record in records:
                        reply = json.loads(record.value)
                        replies.setdefault(reply["request_id"], []).append(reply)
            for records in (await consumer.getmany(timeout_ms=3000)).values():  # anything duplicated behind them
                for record in records:
                    reply = json.loads(record.value)
                    replies.setdefault(reply["request_id"], []).append(reply)
        finally:
            await consumer.stop()
        assert sorted(replies) == sorted(requests), replies
        assert all(len(got) == 1 for got in replies.values()), {rid: len(got) for rid, got in replies.items()}
        assert {got[0]["outcome"] for got in replies.values()} == {"deadline"}
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
