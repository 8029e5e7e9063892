"""A list of brokers in ROUNDTRIP_KAFKA_BOOTSTRAP_SERVERS, as a real cluster's clients are given (issue 17).

Three entries: an address where no broker listens, then the session's broker under two names. Every kind of
client the fleet makes must take the list and move past the dead entry: `roundtrip topics create` (the admin
client), a service (FastStream's broker, its consumers and producer; the gateway's transactional producer and
its reply reader) and `roundtrip lag`. Before the fix the services took the whole string as one host name.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from roundtrip._broker.embedded import free_port
from roundtrip._kernel.wire import topics
from tests.databases import migrated
from tests.processes import start_service


def three_entries(bootstrap: str) -> str:
    port = bootstrap.rsplit(":", 1)[1]
    return f"127.0.0.1:{free_port()},{bootstrap},localhost:{port}"


async def test_topics_a_service_and_lag_work_on_a_list_of_three_bootstrap_servers(kafka_bootstrap, tmp_path):
    servers, prefix = three_entries(kafka_bootstrap), f"list{uuid.uuid4().hex[:6]}."
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROUNDTRIP_")}
    ledger_url = await migrated(f"sqlite+aiosqlite:///{tmp_path / 'ledger.db'}")  # the gateway reads the shared ledger
    env |= {
        "ROUNDTRIP_KAFKA_BOOTSTRAP_SERVERS": servers,
        "ROUNDTRIP_TOPIC_PREFIX": prefix,
        "ROUNDTRIP_STATE_DIR": str(tmp_path),
        "ROUNDTRIP_PARTITIONS": "2",
        "ROUNDTRIP_LEDGER_DATABASE_URL": ledger_url,
        "ROUNDTRIP_KAFKA_ALLOW_PLAINTEXT": "true",  # the test broker listens in the clear; this is not development
        "PYTHONUNBUFFERED": "1",
    }

    made = subprocess.run(
        [sys.executable, "-m", "roundtrip._cli.main", "topics", "create"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert made.returncode == 0, made.stdout + made.stderr
    assert f"created {prefix}{topics.SUPPORT_REQUESTS}" in made.stdout

    gateway = start_service("gateway", env, tmp_path / "gateway.log")
    try:
        producer = AIOKafkaProducer(bootstrap_servers=servers)
        consumer = AIOKafkaConsumer(
            prefix + topics.TURN_STARTS,
            bootstrap_servers=servers,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            isolation_level="read_committed",
        )
        await producer.start()
        await consumer.start()
        try:
            rid = f"req_{uuid.uuid4().hex[:8]}"
            body = {
                "request_id": rid,
                "conversation_id": f"conv_{rid}",
                "customer_id": "cus_1001",
                "text": "where is my order?",
            }
            await producer.send_and_wait(
                prefix + topics.SUPPORT_REQUESTS, json.dumps(body).encode(), key=f"conv_{rid}".encode()
            )
            record = await asyncio.wait_for(consumer.getone(), 60)  # the gateway consumed it and started the turn
            assert json.loads(record.value)["turn"]["request_id"] == rid
        finally:
            await consumer.stop()
            await producer.stop()

        lag = subprocess.run(
            [sys.executable, "-m", "roundtrip._cli.main", "lag", "--json"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert lag.returncode == 0, lag.stdout + lag.stderr
        assert "roundtrip-gateway" in lag.stdout
    finally:
        gateway.terminate()
        gateway.wait(timeout=30)
        assert gateway.returncode == 0, (tmp_path / "gateway.log").read_text()[-3000:]
