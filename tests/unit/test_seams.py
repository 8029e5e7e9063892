"""What the kernel takes of FastStream and aiokafka beyond their public API is still there (no broker needed).

services/_kernel/kafka/faststream_seam.py and services/_kernel/kafka/aiokafka_seam.py name each part; these tests
fail with the library's version and the attribute that changed, so an upgrade that moves one of them
says so here instead of breaking the message path. tests/integration/test_seams.py runs the same
parts on the real broker."""

from __future__ import annotations

import inspect
from importlib.metadata import version

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.cluster import ClusterMetadata
from faststream.kafka import KafkaBroker
from prometheus_client import REGISTRY

from roundtrip._kernel.kafka import faststream_seam, messaging
from roundtrip._kernel.kafka.faststream_metrics import KafkaMetrics
from roundtrip._kernel.settings import Settings
from roundtrip._kernel.wire import topics
from roundtrip._kernel.wire.events import CancelTurn

FASTSTREAM = f"FastStream {version('faststream')}"
AIOKAFKA = f"aiokafka {version('aiokafka')}"


def subscribed() -> tuple[KafkaBroker, object, object]:
    """A broker with one kernel subscription: (broker, FastStream's subscriber, the key-ordered consumer)."""
    wired = messaging.Wiring("seamunit", KafkaBroker("127.0.0.1:1"))
    broker = wired.broker

    @messaging.subscribe(wired, topics.TURN_CONTROLS, Settings())
    async def on_cancel(command: CancelTurn) -> None: ...

    (subscriber,) = broker.subscribers
    (consumer,) = wired.consumers
    return broker, subscriber, consumer


def test_a_kafka_subscriber_starts_its_fetch_loop_from_the_attribute_the_kernel_replaces():
    _, subscriber, consumer = subscribed()
    cls, name = type(subscriber), faststream_seam.CONSUME_LOOP
    theirs = getattr(cls, name, None)
    assert theirs is not None and inspect.iscoroutinefunction(theirs), (
        f"{FASTSTREAM}: {cls.__qualname__} has no coroutine `{name}` any more; "
        "faststream_seam.replace_consume_loop would not replace FastStream's fetch loop"
    )
    assert list(inspect.signature(theirs).parameters) == ["self", "consumer"], (
        f"{FASTSTREAM}: {cls.__qualname__}.{name} takes {list(inspect.signature(theirs).parameters)}, "
        "not (self, consumer): the key-ordered consumer's loop would not get the aiokafka consumer"
    )
    start = inspect.unwrap(cls.start)
    assert name in start.__code__.co_names, (
        f"{FASTSTREAM}: {cls.__qualname__}.start() no longer starts `self.{name}`; "
        "the key-ordered consumer would never run (faststream_seam.replace_consume_loop)"
    )
    assert getattr(subscriber, name) == consumer.run, f"{FASTSTREAM}: setting a subscriber's `{name}` did not take"


async def test_the_producer_the_kernel_publishes_on_is_the_aiokafka_producer_the_broker_connected(monkeypatch):
    broker = KafkaBroker("127.0.0.1:1")
    with pytest.raises(RuntimeError, match=r"the broker is not connected$"):
        faststream_seam.kafka_producer(broker)
    producer = AIOKafkaProducer(bootstrap_servers="127.0.0.1:1")

    async def nothing() -> None: ...

    monkeypatch.setattr(producer, "start", nothing)  # connected, as far as FastStream can tell
    monkeypatch.setattr(producer, "stop", nothing)
    await broker.config.producer.connect(producer, serializer=None)  # what the broker's connect() does with it
    try:
        assert faststream_seam.kafka_producer(broker) is producer, (
            f"{FASTSTREAM}: {faststream_seam.PRODUCER_PATH} is not the producer the broker connected"
        )
    except RuntimeError as moved:
        pytest.fail(f"{FASTSTREAM}: {moved}")
    await broker.config.producer.disconnect()
    with pytest.raises(RuntimeError, match=r"the broker is not connected$"):
        faststream_seam.kafka_producer(broker)


def test_liveness_reads_what_a_subscriber_still_has():
    broker, subscriber, _ = subscribed()
    assert subscriber in broker.subscribers
    for name, kind in (("running", bool), ("tasks", list)):
        assert isinstance(getattr(subscriber, name, None), kind), (
            f"{FASTSTREAM}: a Kafka subscriber has no `{name}` ({kind.__name__}) any more; "
            "faststream_seam.consume_loops_alive would call every service dead"
        )
    assert not faststream_seam.consume_loops_alive(subscriber)  # not started


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, {"app_name": "roundtrip-seamunit", "broker": "kafka", **labels}) or 0.0


def test_fastStreams_kafka_metrics_keep_the_names_and_labels_the_kernel_records():
    counted = KafkaMetrics("seamunit")
    topic = {"handler": "seam.topic"}
    received = sample("faststream_received_messages_total", **topic)
    acked = sample("faststream_received_processed_messages_total", **topic, status="acked")
    errors = sample("faststream_received_processed_messages_exceptions_total", **topic, exception_type="ValueError")
    published = sample("faststream_published_messages_total", destination="seam.topic", status="success")
    failed = sample(
        "faststream_published_messages_exceptions_total", destination="seam.topic", exception_type="KafkaError"
    )

    counted.received("seam.topic", 10).done(0.01)
    record = counted.received("seam.topic", 10)
    record.failed("ValueError")
    record.done(0.01)
    counted.published("seam.topic", 0.01, None)
    counted.published("seam.topic", 0.01, "KafkaError")

    assert sample("faststream_received_messages_total", **topic) == received + 2, FASTSTREAM
    assert sample("faststream_received_processed_messages_total", **topic, status="acked") == acked + 1, FASTSTREAM
    assert (
        sample("faststream_received_processed_messages_exceptions_total", **topic, exception_type="ValueError")
        == errors + 1
    )
    assert sample("faststream_received_messages_in_process", **topic) == 0, FASTSTREAM
    assert sample("faststream_published_messages_total", destination="seam.topic", status="success") == published + 1
    assert (
        sample("faststream_published_messages_exceptions_total", destination="seam.topic", exception_type="KafkaError")
        == failed + 1
    ), FASTSTREAM


async def test_aiokafkas_consumer_still_has_the_client_whose_metadata_names_the_partitions():
    consumer = AIOKafkaConsumer(bootstrap_servers="127.0.0.1:1")
    try:
        fetch = getattr(getattr(consumer, "_client", None), "fetch_all_metadata", None)
        assert fetch is not None and inspect.iscoroutinefunction(fetch), (
            f"{AIOKAFKA}: AIOKafkaConsumer._client.fetch_all_metadata() is gone; aiokafka_seam.partitions_of cannot "
            "list partitions"
        )
        assert ClusterMetadata().partitions_for_topic("missing") is None, (
            f"{AIOKAFKA}: ClusterMetadata.partitions_for_topic no longer answers None for a topic it does not know"
        )
    finally:
        await consumer.stop()
