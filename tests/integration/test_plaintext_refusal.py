"""A service started as a process against a real broker with a PLAINTEXT listener that is not the embedded
development one (the session's Apache Kafka, named by ROUNDTRIP_KAFKA_BOOTSTRAP_SERVERS, ROUNDTRIP_ENV unset):
refused in one line with exit code 1; with ROUNDTRIP_KAFKA_ALLOW_PLAINTEXT=true the same service starts and
works. Every fleet service started in production with SASL_PLAINTEXT and PLAIN (its password in the clear) or SSL
without a client certificate (anonymous to the broker) exits 1 with one line. The check itself:
tests/unit/test_plaintext_kafka.py.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from roundtrip._kernel.wire import topics
from tests.databases import migrated
from tests.processes import start_service
from tests.signing import key_environment

FLEET = ("gateway", "model", "guard", "gate", "executor", "console")


async def test_a_service_refuses_a_plaintext_kafka_outside_development_and_starts_when_allowed(
    kafka_bootstrap, kafka_topics, tmp_path
):
    prefix = kafka_topics
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROUNDTRIP_")} | {
        "ROUNDTRIP_KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "ROUNDTRIP_TOPIC_PREFIX": prefix,
        "ROUNDTRIP_STATE_DIR": str(tmp_path),
        "ROUNDTRIP_LEDGER_DATABASE_URL": await migrated(f"sqlite+aiosqlite:///{tmp_path / 'ledger.db'}"),
        "PYTHONUNBUFFERED": "1",
    }

    refused = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "roundtrip._cli.main", "run", "gateway"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    lines = [line for line in refused.stderr.splitlines() if line.strip()]
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert len(lines) == 1 and "Traceback" not in refused.stderr, refused.stderr
    assert lines[0].startswith("error: gateway refuses to start: ROUNDTRIP_KAFKA_SECURITY_PROTOCOL is PLAINTEXT")
    assert kafka_bootstrap in lines[0] and "ROUNDTRIP_KAFKA_ALLOW_PLAINTEXT=true" in lines[0]

    allowed = {**env, "ROUNDTRIP_KAFKA_ALLOW_PLAINTEXT": "true"}
    gateway = await asyncio.to_thread(start_service, "gateway", allowed, tmp_path / "gateway.log")
    try:  # it does not only start: it works (a support request becomes a turn)
        producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
        consumer = AIOKafkaConsumer(
            prefix + topics.TURN_STARTS,
            bootstrap_servers=kafka_bootstrap,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            isolation_level="read_committed",
        )
        await producer.start()
        await consumer.start()
        try:
            rid = f"req_{uuid.uuid4().hex[:8]}"
            body = {"request_id": rid, "conversation_id": f"conv_{rid}", "customer_id": "cus_1001", "text": "hi"}
            await producer.send_and_wait(
                prefix + topics.SUPPORT_REQUESTS, json.dumps(body).encode(), key=f"conv_{rid}".encode()
            )
            record = await asyncio.wait_for(consumer.getone(), 60)
            assert json.loads(record.value)["turn"]["request_id"] == rid
        finally:
            await consumer.stop()
            await producer.stop()
    finally:
        gateway.terminate()
        gateway.wait(timeout=30)
    assert gateway.returncode == 0, (tmp_path / "gateway.log").read_text()[-3000:]


@pytest.mark.parametrize(
    "security,says",
    [
        (
            {
                "ROUNDTRIP_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
                "ROUNDTRIP_KAFKA_SASL_MECHANISM": "PLAIN",
                "ROUNDTRIP_KAFKA_SASL_USERNAME": "roundtrip",
                "ROUNDTRIP_KAFKA_SASL_PASSWORD": "pw-in-the-clear",
            },
            ("is SASL_PLAINTEXT with PLAIN", "ROUNDTRIP_KAFKA_ALLOW_PLAINTEXT=true"),
        ),
        (
            {"ROUNDTRIP_KAFKA_SECURITY_PROTOCOL": "SSL"},
            ("is SSL without a client certificate", "ROUNDTRIP_KAFKA_ALLOW_ANONYMOUS=true"),
        ),
    ],
    ids=["sasl-plain-in-the-clear", "ssl-anonymous"],
)
async def test_every_service_in_production_refuses_a_password_in_the_clear_or_an_anonymous_tls_client(
    kafka_bootstrap, tmp_path, security, says
):
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROUNDTRIP_")} | {
        "ROUNDTRIP_ENV": "production",
        "ROUNDTRIP_KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,  # a real broker, never dialled: refused before that
        "ROUNDTRIP_STATE_DIR": str(tmp_path),
        "ROUNDTRIP_LEDGER_DATABASE_URL": await migrated(f"sqlite+aiosqlite:///{tmp_path / 'ledger.db'}"),
        **key_environment(),  # fresh pairs: what each refuses is the Kafka connection
        **security,
    }

    def run(service: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "roundtrip._cli.main", "run", service],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            cwd=tmp_path,
        )

    for service, done in zip(FLEET, await asyncio.gather(*(asyncio.to_thread(run, s) for s in FLEET)), strict=True):
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        assert done.returncode == 1 and len(lines) == 1 and "Traceback" not in done.stderr, (service, done.stderr)
        cause, allowance = says
        assert lines[0].startswith(f"error: {service} refuses to start: ROUNDTRIP_KAFKA_SECURITY_PROTOCOL {cause}")
        assert allowance in lines[0] and kafka_bootstrap in lines[0] and "pw-in-the-clear" not in done.stderr
