"""The console's dead letters on a real broker (services/_console/letters.py): two console replicas re-drive the same
dead letter at once (each has found it waiting before either claim is published) and exactly one record reaches its
source topic, the original's value, key and headers; a console started afterwards reads that it was handled, and by
whom."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from roundtrip._console import letters
from roundtrip._console.decisions import Refused
from roundtrip._kernel.kafka import dead_letters
from roundtrip._kernel.kafka.admin import create_topics
from roundtrip._kernel.kafka.messaging import dead_letter_of
from roundtrip._kernel.settings import Settings
from roundtrip._kernel.wire import topics

BATCH = b'{"turn": {"turn_id": "turn_1"}, "step": 1, "calls": []}'
HEADERS = [("traceparent", b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")]


async def test_two_replicas_re_drive_one_dead_letter_once_and_a_later_console_knows(kafka_bootstrap, topic_prefix):
    await create_topics(kafka_bootstrap, topic_prefix, partitions=2)
    settings = Settings(_env_file=None, kafka_bootstrap_servers=kafka_bootstrap, topic_prefix=topic_prefix)
    source = topics.t(topics.TOOL_BATCHES, topic_prefix)
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all", enable_idempotence=True)
    await producer.start()

    both_checked = asyncio.Barrier(2)  # each console has found the letter waiting before either claim is published

    async def send_handled(message, key: str) -> None:
        if message.action != dead_letters.RELEASE:
            await both_checked.wait()
        topic = topics.t(topics.DEAD_LETTERS_HANDLED, topic_prefix)
        await producer.send_and_wait(topic, message.model_dump_json().encode(), key=key.encode())

    async def send_raw(topic: str, value: bytes, key: bytes | None, headers) -> None:
        await producer.send_and_wait(topic, value, key=key, headers=headers)

    record = SimpleNamespace(topic=source, partition=1, offset=7, value=BATCH, key=b"conv_1", headers=HEADERS)
    letter = dead_letter_of("executor", record, "ApprovalError: batch signed with unknown key id 'k1'")
    await producer.send_and_wait(
        topics.t(topics.DEAD_LETTERS, topic_prefix), letter.model_dump_json().encode(), key=b"conv_1"
    )
    consoles = [letters.Letters(settings, send_handled, send_raw) for _ in range(3)]
    try:
        for console in consoles:
            await console.refresh()
        ((item, _),) = consoles[0].listed()
        raced = await asyncio.gather(
            consoles[0].act(item.id, dead_letters.REDRIVE, "alice", ""),
            consoles[1].act(item.id, dead_letters.REDRIVE, "bob", ""),
            return_exceptions=True,
        )
        won = [r for r in raced if not isinstance(r, BaseException)]
        lost = [r for r in raced if isinstance(r, BaseException)]
        assert len(won) == 1 and len(lost) == 1 and isinstance(lost[0], Refused), raced
        winner = won[0][1].by
        assert f"already re-driven by {winner}" in lost[0].message

        with pytest.raises(Refused, match=f"already re-driven by {winner}"):  # a console that read before the race
            await consoles[2].act(item.id, dead_letters.DISCARD, "carol", "")
        later = letters.Letters(settings, send_handled, send_raw)  # one started afterwards
        consoles.append(later)
        await later.refresh()
        assert [(i.id, h.by if h else None) for i, h in later.listed()] == [(item.id, winner)]
        ((_, handled),) = consoles[2].listed()
        assert handled is not None and handled.topic == source
    finally:
        for console in consoles:
            await console.close()
        await producer.stop()

    consumer = AIOKafkaConsumer(source, bootstrap_servers=kafka_bootstrap, auto_offset_reset="earliest")
    await consumer.start()
    redriven = []
    try:
        for _ in range(10):  # 5 s: long enough for a second copy to show, were there one
            fetched = await consumer.getmany(timeout_ms=500)
            redriven += [r for records in fetched.values() for r in records]
    finally:
        await consumer.stop()
    assert [(r.value, r.key, list(r.headers)) for r in redriven] == [(BATCH, b"conv_1", HEADERS)]  # once, as it was
