"""The embedded broker and topic administration, against real Apache Kafka."""

from __future__ import annotations

import asyncio
import socket
import time
import uuid
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from roundtrip._broker.embedded import (
    EmbeddedKafka,
    PortInUseError,
    fetch_configured,
    free_port,
    port_is_free,
    probe_metadata,
)
from roundtrip._kernel.kafka.admin import DEAD_LETTER_MAX_BYTES
from roundtrip._kernel.settings import Settings
from roundtrip._kernel.wire import topics, topology
from tests.topics import create_topics, topics_report


async def _partitions(bootstrap: str, names: list[str]) -> dict[str, int]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        return {t["topic"]: len(t["partitions"]) for t in await admin.describe_topics(names)}
    finally:
        await admin.close()


async def _produce_and_consume(bootstrap: str, topic: str, value: bytes, key: bytes = b"conv-1") -> bytes:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True)
    await producer.start()
    try:
        await producer.send_and_wait(topic, value, key=key)
    finally:
        await producer.stop()
    return await _consume_one(bootstrap, topic)


async def _consume_one(bootstrap: str, topic: str) -> bytes:
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=f"g-{uuid.uuid4().hex[:8]}",
        auto_offset_reset="earliest",
    )
    await consumer.start()
    try:
        msg = await asyncio.wait_for(consumer.getone(), timeout=30)
        return msg.value
    finally:
        await consumer.stop()


async def test_create_topics_is_idempotent(kafka_bootstrap: str, topic_prefix: str) -> None:
    created = await create_topics(kafka_bootstrap, topic_prefix, partitions=3, executor_partitions=5)
    assert created == [topic_prefix + name for name in topology.topic_names()]

    again = await topics_report(kafka_bootstrap, topic_prefix, partitions=3, executor_partitions=5)
    assert again.created == []
    assert again.existing == created
    assert again.grown == []

    counts = await _partitions(kafka_bootstrap, created)
    assert counts[topic_prefix + topics.TOOL_BATCHES] == 5
    assert counts[topic_prefix + topics.dead_letters("executor")] == 1
    assert counts[topic_prefix + topics.SUPPORT_REQUESTS] == 3


async def test_more_executor_partitions_grow_the_executor_topic(kafka_bootstrap: str, topic_prefix: str) -> None:
    await create_topics(kafka_bootstrap, topic_prefix, partitions=2)
    report = await topics_report(kafka_bootstrap, topic_prefix, partitions=2, executor_partitions=4)
    assert report.created == []
    assert report.grown == [topic_prefix + topics.TOOL_BATCHES]
    assert (await _partitions(kafka_bootstrap, [topic_prefix + topics.TOOL_BATCHES])) == {
        topic_prefix + topics.TOOL_BATCHES: 4
    }


async def _topic_config(bootstrap: str, name: str) -> dict[str, str]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        (response,) = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, name)])
        return {e[0]: e[1] for e in response.resources[0][4]}
    finally:
        await admin.close()


async def test_the_dead_letter_topic_takes_the_dead_letter_of_a_record_near_the_limit(
    kafka_bootstrap: str, topic_prefix: str
) -> None:
    """A dead letter is the original record base64-encoded plus a readable copy: ~1.3 MB for a 900 kB record."""
    await create_topics(kafka_bootstrap, topic_prefix, partitions=1)
    name = topic_prefix + topics.dead_letters("executor")
    assert int((await _topic_config(kafka_bootstrap, name))["max.message.bytes"]) == DEAD_LETTER_MAX_BYTES
    assert (
        int((await _topic_config(kafka_bootstrap, topic_prefix + topics.SUPPORT_REQUESTS))["max.message.bytes"])
        < 2**20 + 100
    )
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, max_request_size=DEAD_LETTER_MAX_BYTES)
    await producer.start()
    try:
        await producer.send_and_wait(name, b"x" * 1_400_000, key=b"k")
    finally:
        await producer.stop()


async def test_an_existing_dead_letter_topic_gets_the_larger_limit_and_keeps_its_settings(
    kafka_bootstrap: str, topic_prefix: str
) -> None:
    name = topic_prefix + topics.dead_letters("executor")
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    try:  # made by an older fleet: the default limit, and a retention an operator chose
        await admin.create_topics([NewTopic(name, 1, 1, topic_configs={"retention.ms": "123456789"})])
    finally:
        await admin.close()
    report = await topics_report(kafka_bootstrap, topic_prefix, partitions=1)
    assert name in report.existing
    for _ in range(100):  # the controller has it at once; the broker's metadata follows a moment later
        config = await _topic_config(kafka_bootstrap, name)
        if int(config["max.message.bytes"]) == DEAD_LETTER_MAX_BYTES:
            break
        await asyncio.sleep(0.1)  # poll interval: the topic's config as the broker reports it
    assert int(config["max.message.bytes"]) == DEAD_LETTER_MAX_BYTES and config["retention.ms"] == "123456789"


async def test_make_topics_fixture_helper(kafka_bootstrap: str, topic_prefix: str, make_topics) -> None:
    assert len(await make_topics(kafka_bootstrap, topic_prefix)) == len(topology.topic_names())
    assert await make_topics(kafka_bootstrap, topic_prefix) == []


async def test_produced_message_is_consumed(kafka_topics: str, kafka_bootstrap: str) -> None:
    topic = kafka_topics + topics.SUPPORT_REQUESTS
    assert await _produce_and_consume(kafka_bootstrap, topic, b'{"hello": "kafka"}') == b'{"hello": "kafka"}'


def test_metadata_probe_lists_the_broker(kafka_bootstrap: str) -> None:
    host, port = kafka_bootstrap.rsplit(":", 1)
    brokers = probe_metadata(host, int(port))
    assert len(brokers) == 1 and brokers[0][2] == int(port)


def test_refuses_to_start_when_the_port_is_taken(tmp_path: Path) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        kafka = EmbeddedKafka(tmp_path / "k", port=taken, controller_port=free_port(), libs_dir=tmp_path)
        with pytest.raises(PortInUseError, match=rf"port {taken} \(client listener\).*already in use"):
            kafka.start()
        assert kafka.proc is None  # checked before launching anything
        assert not (tmp_path / "k" / "data").exists()


def test_wait_ready_reports_the_broker_log_on_early_exit(tmp_path: Path) -> None:
    libs = fetch_configured(Settings(), progress=None)
    # An invalid property makes Kafka exit during start-up: the error must carry its log.
    kafka = EmbeddedKafka(tmp_path, free_port(), free_port(), libs_dir=libs)
    kafka.write_properties()
    kafka.format_storage()  # with a valid config: formatting validates it too
    kafka.extra_properties = {"num.io.threads": "not-a-number"}
    kafka.start()
    try:
        with pytest.raises(Exception, match=r"exited with code \d+ during start-up(.|\n)*num.io.threads"):
            kafka.wait_ready(60)
    finally:
        kafka.stop()


def test_restart_keeps_data_and_does_not_reformat(tmp_path: Path) -> None:
    libs = fetch_configured(Settings(), progress=None)
    port, cport = free_port(), free_port()
    while cport == port:
        cport = free_port()
    kafka = EmbeddedKafka(tmp_path / "kafka", port, cport, libs_dir=libs, die_with_parent=True)
    try:
        t0 = time.monotonic()
        kafka.start().wait_ready(90)
        first_start = time.monotonic() - t0
        assert kafka.formatted_on_start
        meta = (kafka.log_dirs / "meta.properties").read_text()
        asyncio.run(create_topics(kafka.bootstrap, "restart.", partitions=1))
        producer_result = asyncio.run(_produce_and_consume(kafka.bootstrap, "restart." + topics.OUTCOMES, b"kept"))
        assert producer_result == b"kept"
        assert kafka.stop() == 0  # a clean shutdown on SIGTERM
        assert port_is_free(port) and port_is_free(cport)

        kafka.start().wait_ready(90)
        assert not kafka.formatted_on_start
        assert (kafka.log_dirs / "meta.properties").read_text() == meta  # same cluster id
        report = asyncio.run(topics_report(kafka.bootstrap, "restart.", partitions=1))
        assert report.created == [] and len(report.existing) == len(topology.topic_names())
        assert asyncio.run(_consume_one(kafka.bootstrap, "restart." + topics.OUTCOMES)) == b"kept"
        print(f"first start (with format) {first_start:.1f}s")
    finally:
        kafka.stop()
    assert not kafka.running()


async def test_topics_are_created_with_the_configured_min_insync_replicas(
    kafka_bootstrap: str, topic_prefix: str
) -> None:
    """ROUNDTRIP_MIN_INSYNC_REPLICAS is set on each topic it creates (one broker here: 1, the most RF 1 allows), the
    dead-letter topic's own limit kept beside it."""
    await topics_report(kafka_bootstrap, topic_prefix, partitions=1, replication_factor=1, min_insync_replicas=1)
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    try:
        for name in (topic_prefix + topics.MODEL_CALLS, topic_prefix + topics.dead_letters("executor")):
            (response,) = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, name)])
            entries = {e[0]: e for e in response.resources[0][4]}
            value, source = entries["min.insync.replicas"][1], entries["min.insync.replicas"][3]
            on_topic = (
                source == 1 if response.API_VERSION >= 1 else not source
            )  # v1+: config source 1 = the topic itself
            assert (value, on_topic) == ("1", True), (name, entries["min.insync.replicas"])
        assert int(entries["max.message.bytes"][1]) == DEAD_LETTER_MAX_BYTES
    finally:
        await admin.close()
