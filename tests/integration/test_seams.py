"""The kernel's use of FastStream's and aiokafka's insides (services/_kernel/*_seam.py) on the real broker:
a kernel subscription runs on the key-ordered consumer inside FastStream's subscriber, publishes on the
producer the broker connected, commits what it finished, and the consumers without a group find their
partitions. tests/unit/test_seams.py checks the same parts' shape without a broker."""

from __future__ import annotations

import uuid

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from roundtrip._kernel.kafka import faststream_seam, messaging
from roundtrip._kernel.kafka.aiokafka_seam import partitions_of
from roundtrip._kernel.settings import Settings
from roundtrip._kernel.wire import topics
from roundtrip._kernel.wire.events import CancelTurn
from tests.integration.test_consumer import committed, new_topic, wait_until

pytestmark = pytest.mark.integration


async def test_a_kernel_subscription_runs_on_the_key_ordered_consumer_and_publishes_on_the_connected_producer(
    kafka_bootstrap, topic_prefix
):
    settings = Settings(kafka_bootstrap_servers=kafka_bootstrap)
    wire = await new_topic(
        kafka_bootstrap, topics.t(topic_prefix, settings.topic_prefix), partitions=2
    )  # its "keyed" topic
    service = f"seam{uuid.uuid4().hex[:6]}"
    wired = messaging.wiring(service, settings, (), "")
    broker = wired.broker
    got: list[tuple[str, object]] = []

    @messaging.subscribe(wired, f"{topic_prefix}keyed", settings)
    async def on_cancel(command: CancelTurn) -> None:
        got.append((command.turn_id, messaging.current_record()))

    (subscriber,) = broker.subscribers
    (consumer,) = wired.consumers
    await broker.start()
    try:
        assert isinstance(faststream_seam.kafka_producer(broker), AIOKafkaProducer)
        for i in range(6):
            await messaging.publish(wired, wire, CancelTurn(turn_id=f"turn_{i}"), messaging.key_of(f"conv_{i % 3}"))
        await wait_until(lambda: consumer.processed == 6, what="the key-ordered consumer to handle all six")
        assert faststream_seam.consume_loops_alive(subscriber)
        assert sorted(turn for turn, _ in got) == [f"turn_{i}" for i in range(6)]
        assert all(
            record is not None and record.topic == wire for _, record in got
        )  # the kernel's path, not FastStream's
        await consumer.drain()
    finally:
        await broker.stop()
    assert not faststream_seam.consume_loops_alive(subscriber)
    offsets = await committed(kafka_bootstrap, messaging.group(service), wire, 2)
    assert sum(offset or 0 for offset in offsets.values()) == 6  # the consumer's commits, none of FastStream's acks


async def test_a_consumer_without_a_group_finds_the_partitions_of_the_topics_that_exist(kafka_bootstrap, topic_prefix):
    name = await new_topic(kafka_bootstrap, topic_prefix, partitions=3)
    consumer = AIOKafkaConsumer(bootstrap_servers=kafka_bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        assert await partitions_of(consumer, [name, f"{topic_prefix}missing"]) == [
            TopicPartition(name, p) for p in range(3)
        ]
    finally:
        await consumer.stop()
