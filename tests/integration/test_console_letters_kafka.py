"""The console's dead letters on a real broker (services/_console/letters.py): two console replicas re-drive the same
dead letter at once (each has found it waiting before either claim is published) and exactly one record reaches its
source topic, the original's value, key and headers; a console started afterwards reads that it was handled, and by
whom; a letter whose copy is not the record at the place it names is refused and nothing is published, and a genuine
one re-drives the record Kafka keeps there."""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from roundtrip._console import letters
from roundtrip._console.decisions import Refused
from roundtrip._kernel.kafka import dead_letters
from roundtrip._kernel.kafka.messaging import dead_letter_of
from roundtrip._kernel.settings import Settings
from roundtrip._kernel.wire import topics
from tests.topics import create_topics

BATCH = b'{"turn": {"turn_id": "turn_1"}, "step": 1, "calls": []}'
HARMLESS = b'{"turn_id": "turn_a", "customer_id": "cust_a", "text": "What are your opening hours?"}'
HARMFUL = b'{"turn_id": "turn_b", "customer_id": "cust_b", "text": "cancel every order"}'
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

    sent = await producer.send_and_wait(source, BATCH, key=b"conv_1", partition=1, headers=HEADERS)
    record = SimpleNamespace(topic=source, partition=1, offset=sent.offset, value=BATCH, key=b"conv_1")
    record.headers = HEADERS
    letter = dead_letter_of("executor", record, "ApprovalError: batch signed with unknown key id 'k1'")
    await producer.send_and_wait(
        topics.t(topics.dead_letters("executor"), topic_prefix), letter.model_dump_json().encode(), key=b"conv_1"
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

    assert await _records_on(kafka_bootstrap, source) == [(BATCH, b"conv_1", HEADERS)] * 2  # the record, re-driven once


async def _records_on(bootstrap: str, topic: str) -> list[tuple[bytes, bytes | None, list]]:
    """Every record of the topic (value, key, headers), read for 5 s: long enough for a second copy to show, were
    there one."""
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest")
    await consumer.start()
    found = []
    try:
        for _ in range(10):
            found += [r for records in (await consumer.getmany(timeout_ms=500)).values() for r in records]
    finally:
        await consumer.stop()
    return [(r.value, r.key, list(r.headers)) for r in found]


async def test_a_letter_whose_copy_is_not_its_record_is_refused_and_a_genuine_one_re_drives_the_record(
    kafka_bootstrap, topic_prefix, caplog
):
    """A letter on the guard's dead letters names a harmless StartTurn on turn.starts by its partition and offset but
    carries a StartTurn for another customer: the console reads the record back, refuses, and publishes nothing; the
    genuine letter of that record re-drives the record Kafka keeps there."""
    await create_topics(kafka_bootstrap, topic_prefix, partitions=1)
    settings = Settings(_env_file=None, kafka_bootstrap_servers=kafka_bootstrap, topic_prefix=topic_prefix)
    source, letters_topic = (topics.t(t, topic_prefix) for t in (topics.TURN_STARTS, topics.dead_letters("guard")))
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all", enable_idempotence=True)
    await producer.start()

    async def send_handled(message, key: str) -> None:
        handled = topics.t(topics.DEAD_LETTERS_HANDLED, topic_prefix)
        await producer.send_and_wait(handled, message.model_dump_json().encode(), key=key.encode())

    async def send_raw(topic: str, value: bytes | None, key: bytes | None, headers) -> None:
        await producer.send_and_wait(topic, value, key=key, headers=headers)

    shelf = letters.Letters(settings, send_handled, send_raw)
    try:
        sent = await producer.send_and_wait(source, HARMLESS, key=b"conv_a", headers=HEADERS)
        record = SimpleNamespace(topic=source, partition=0, offset=sent.offset, value=HARMLESS, key=b"conv_a")
        record.headers = HEADERS
        genuine = dead_letter_of("guard", record, "RuntimeError: the ledger said no")
        forged = dead_letter_of("guard", SimpleNamespace(**{**vars(record), "value": HARMFUL, "key": b"conv_b"}), "x")
        for letter in (forged, genuine):
            await producer.send_and_wait(letters_topic, letter.model_dump_json().encode())
        await shelf.refresh()
        by_reason = {item.reason: item.id for item, _ in shelf.listed()}

        caplog.set_level(logging.WARNING, logger="roundtrip.security")
        with pytest.raises(
            Refused, match=r"its copy is not the record at .*turn\.starts\[0\]@\d+ \(value, key differ\)"
        ):
            await shelf.act(by_reason["x"], dead_letters.REDRIVE, "alice", "")
        assert any(r.name == "roundtrip.security" and by_reason["x"] in r.getMessage() for r in caplog.records)
        assert await _records_on(kafka_bootstrap, source) == [(HARMLESS, b"conv_a", HEADERS)]  # nothing published
        assert shelf.handled.get(by_reason["x"]) is None  # not claimed: it waits, to be discarded

        await shelf.act(by_reason["RuntimeError: the ledger said no"], dead_letters.REDRIVE, "alice", "")
    finally:
        await shelf.close()
        await producer.stop()
    assert await _records_on(kafka_bootstrap, source) == [(HARMLESS, b"conv_a", HEADERS)] * 2  # the record Kafka kept
