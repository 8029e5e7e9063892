"""`roundtrip lag` against a real Kafka broker: committed and end offsets, lag from the start of the log, members."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from roundtrip._kernel.kafka.admin import consumer_lag
from roundtrip._kernel.wire import topics, topology
from tests.topics import topics_report


async def _produce(bootstrap: str, topic: str, per_partition: dict[int, int]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        for partition, count in per_partition.items():
            for i in range(count):
                await producer.send_and_wait(topic, f"m{i}".encode(), partition=partition)
    finally:
        await producer.stop()


def _lag_cli(bootstrap: str, prefix: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "ROUNDTRIP_KAFKA_BOOTSTRAP_SERVERS": bootstrap, "ROUNDTRIP_TOPIC_PREFIX": prefix}
    return subprocess.run(
        [sys.executable, "-m", "roundtrip._cli.main", "lag", *args], capture_output=True, text=True, env=env, timeout=60
    )


async def test_lag_counts_from_the_start_of_the_log_until_a_commit_then_from_the_commit(kafka_bootstrap, kafka_topics):
    prefix = kafka_topics
    batches = prefix + topics.TOOL_BATCHES
    await _produce(kafka_bootstrap, batches, {0: 3, 1: 2})

    (before,) = await consumer_lag(kafka_bootstrap, prefix, "executor")
    assert before.group == prefix + "roundtrip-executor"  # the fleet's groups carry its topic prefix
    mine = [p for p in before.partitions if p.topic == batches]
    assert [(p.partition, p.committed, p.end, p.lag) for p in mine] == [(0, None, 3, 3), (1, None, 2, 2)]

    # A member of the executor group that read everything but committed only partition 0 up to offset 2.
    consumer = AIOKafkaConsumer(
        batches,
        bootstrap_servers=kafka_bootstrap,
        group_id=prefix + "roundtrip-executor",
        client_id="lag-test",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    await consumer.start()
    try:
        got = 0
        while got < 5:
            got += sum(len(r) for r in (await consumer.getmany(timeout_ms=1000)).values())
        await consumer.commit({TopicPartition(batches, 0): 2})

        (during,) = await consumer_lag(kafka_bootstrap, prefix, "roundtrip-executor")
        mine = {p.partition: p for p in during.partitions if p.topic == batches}
        assert (mine[0].committed, mine[0].lag) == (2, 1)
        assert (mine[1].committed, mine[1].lag) == (None, 2)  # not committed: from the start of the log
        assert during.lag >= 3
        assert during.state == "Stable"
        (member,) = [m for m in during.members if m.client_id == "lag-test"]
        assert member.partitions == [(batches, 0), (batches, 1)]
        assert member.host

        # The CLI says the same, as JSON, and shows every fleet group without --group.
        result = _lag_cli(kafka_bootstrap, prefix, "--json")
        assert result.returncode == 0, result.stderr
        document = json.loads(result.stdout)
        groups = {g["group"]: g for g in document["groups"]}
        assert set(topology.groups(prefix)) <= set(groups)
        executor = groups[prefix + "roundtrip-executor"]
        rows = {(p["topic"], p["partition"]): p for p in executor["partitions"]}
        assert rows[(batches, 0)] == {"topic": batches, "partition": 0, "committed": 2, "start": 0, "end": 3, "lag": 1}
        assert rows[(batches, 1)]["committed"] is None and rows[(batches, 1)]["lag"] == 2
        assert any(m["client_id"] == "lag-test" for m in executor["members"])
        assert groups[prefix + "roundtrip-model"]["lag"] == 0  # nothing published to turn.model_calls
    finally:
        await consumer.stop()

    table = _lag_cli(kafka_bootstrap, prefix, "--group", "executor")
    assert table.returncode == 0, table.stderr
    assert "roundtrip-executor" in table.stdout and batches in table.stdout and "roundtrip-model" not in table.stdout


def test_lag_says_clearly_when_kafka_is_unreachable():
    from roundtrip._broker.embedded import free_port

    result = _lag_cli(f"127.0.0.1:{free_port()}", "", "--json")
    assert result.returncode == 2
    assert "cannot reach Kafka" in result.stderr
    assert result.stdout == ""


async def test_a_subscription_added_to_the_topology_shows_up_in_lag_before_its_group_exists(
    kafka_bootstrap, topic_prefix, monkeypatch
):
    from tests.unit.test_topology import ECHO, ECHOES

    monkeypatch.setattr(topology, "SERVICES", (*topology.SERVICES, ECHO))
    await topics_report(kafka_bootstrap, topic_prefix, partitions=2)  # topics create makes its topic too
    await _produce(kafka_bootstrap, topic_prefix + ECHOES, {0: 2, 1: 1})
    report = {g.group: g for g in await consumer_lag(kafka_bootstrap, topic_prefix, None)}
    echo = report[topic_prefix + "roundtrip-echo"]
    assert echo.lag == 3 and {p.topic for p in echo.partitions} == {topic_prefix + ECHOES}
