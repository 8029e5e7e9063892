"""`roundtrip dead-letters` against a real broker: three dead letters, one re-driven in the console, one waiting (on
the shared topic of an older fleet, still read) and one whose re-drive Kafka did not take (released: it waits again);
the command marks each as the console recorded it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from types import SimpleNamespace

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from roundtrip._console import letters
from roundtrip._kernel.kafka import dead_letters
from roundtrip._kernel.kafka.messaging import dead_letter_of
from roundtrip._kernel.settings import Settings
from roundtrip._kernel.wire import topics
from tests.topics import create_topics

BATCH = b'{"turn": {"turn_id": "turn_1"}, "step": 1, "calls": []}'


async def _handle_three_letters(bootstrap: str, prefix: str) -> dict[str, str]:
    """Write three dead letters, re-drive the first and (failing) the third in a console: reason -> letter id."""
    source = topics.t(topics.TOOL_BATCHES, prefix)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True)
    await producer.start()
    raw_away = False

    async def send_handled(message, key: str) -> None:
        handled = topics.t(topics.DEAD_LETTERS_HANDLED, prefix)
        await producer.send_and_wait(handled, message.model_dump_json().encode(), key=key.encode())

    async def send_raw(topic: str, value: bytes, key: bytes | None, headers) -> None:
        if raw_away:
            raise ConnectionError("Kafka is away")
        await producer.send_and_wait(topic, value, key=key, headers=headers)

    settings = Settings(_env_file=None, kafka_bootstrap_servers=bootstrap, topic_prefix=prefix)
    shelf = letters.Letters(settings, send_handled, send_raw)
    try:
        for reason in ("RuntimeError: handled", "RuntimeError: waiting", "RuntimeError: released"):
            sent = await producer.send_and_wait(source, BATCH, key=b"conv_1", partition=0)
            record = SimpleNamespace(topic=source, partition=0, offset=sent.offset, value=BATCH, key=b"conv_1")
            record.headers = []
            letter = dead_letter_of("executor", record, reason)
            mine = topics.DEAD_LETTERS if reason.endswith("waiting") else topics.dead_letters("executor")
            await producer.send_and_wait(topics.t(mine, prefix), letter.model_dump_json().encode())
        await shelf.refresh()
        ids = {item.reason: item.id for item, _ in shelf.listed()}
        await shelf.act(ids["RuntimeError: handled"], dead_letters.REDRIVE, "alice", "keys fixed")
        raw_away = True
        with pytest.raises(ConnectionError):
            await shelf.act(ids["RuntimeError: released"], dead_letters.REDRIVE, "bob", "")
    finally:
        await shelf.close()
        await producer.stop()
    return ids


async def test_dead_letters_marks_each_letter_waiting_or_as_the_console_handled_it(
    kafka_bootstrap, topic_prefix, tmp_path
):
    await create_topics(kafka_bootstrap, topic_prefix, partitions=1)
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)  # the shared topic, as an older fleet made it
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topics.t(topics.DEAD_LETTERS, topic_prefix), 1, 1)])
    finally:
        await admin.close()
    ids = await _handle_three_letters(kafka_bootstrap, topic_prefix)

    env = {
        **os.environ,
        "ROUNDTRIP_KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "ROUNDTRIP_TOPIC_PREFIX": topic_prefix,
        "ROUNDTRIP_STATE_DIR": str(tmp_path),  # no running fleet's settings
    }
    shown = subprocess.run(
        [sys.executable, "-m", "roundtrip._cli.main", "dead-letters"],
        capture_output=True,
        text=True,
        env=env,
        timeout=90,
    )
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    stamp = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d"

    def state_of(reason: str) -> str:
        (line,) = [line for line in lines if re.match(rf"{stamp} {ids[reason]} ", line)]
        assert reason in line, line
        return line.split()[3]

    assert state_of("RuntimeError: handled") == "re-driven"
    assert state_of("RuntimeError: waiting") == "waiting" and ids["RuntimeError: waiting"] == "0-0"
    assert state_of("RuntimeError: released") == "waiting"  # its claim was released: it waits again
    source = topics.t(topics.TOOL_BATCHES, topic_prefix)
    assert any(re.fullmatch(rf"  re-driven by alice at {stamp} to {re.escape(source)}: keys fixed", x) for x in lines)
    assert "bob" not in shown.stdout
    assert lines[-1].startswith("3 shown: 2 waiting, 1 handled")
