"""The kernel's key-ordered consumer against the real broker: order per key, concurrency across
keys, commits that never pass an unfinished message, nothing lost when a consumer is killed,
and a bounded number of messages held when handlers are slow."""

from __future__ import annotations

import asyncio
import random
import signal
import subprocess
import sys
import uuid
from collections import defaultdict
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from roundtrip._kernel.kafka import consumer as consumer_module
from roundtrip._kernel.kafka.consumer import KeyOrderedConsumer
from tests import waiting
from tests.consumers import key_ordered

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


async def new_topic(bootstrap: str, prefix: str, partitions: int) -> str:
    name = f"{prefix}keyed"
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, partitions, 1)])
    finally:
        await admin.close()
    return name


async def produce(bootstrap: str, topic: str, items: list[tuple[str, str]]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    await producer.start()
    try:
        futures = [await producer.send(topic, value.encode(), key=key.encode()) for key, value in items]
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


def consumer_for(bootstrap: str, topic: str, group: str, listener: KeyOrderedConsumer) -> AIOKafkaConsumer:
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        fetch_max_wait_ms=500,
    )
    consumer.subscribe([topic], listener=listener)
    return consumer


async def committed(bootstrap: str, group: str, topic: str, partitions: int) -> dict[int, int | None]:
    probe = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    await probe.start()
    try:
        return {p: await probe.committed(TopicPartition(topic, p)) for p in range(partitions)}
    finally:
        await probe.stop()


async def wait_until(predicate, timeout: float = 30.0, what: str = "condition") -> None:
    await waiting.until(predicate, timeout, what)


async def test_one_key_in_order_many_keys_at_once(kafka_bootstrap, topic_prefix):
    topic = await new_topic(kafka_bootstrap, topic_prefix, partitions=2)
    keys, per_key = [f"conv_{i}" for i in range(40)], 15
    items = [(k, f"{k}:{n}") for n in range(per_key) for k in keys]
    await produce(kafka_bootstrap, topic, items)

    seen: dict[str, list[int]] = defaultdict(list)
    running: set[str] = set()
    overlap = {"max": 0, "same_key": 0}

    async def process(record) -> None:
        key = record.key.decode()
        if key in running:
            overlap["same_key"] += 1
        running.add(key)
        overlap["max"] = max(overlap["max"], len(running))
        await asyncio.sleep(random.uniform(0.001, 0.02))  # a random processing time: the records finish out of order
        seen[key].append(int(record.value.decode().split(":")[1]))
        running.discard(key)

    koc = key_ordered(process, max_in_flight=200, commit_interval_s=0.05)
    consumer = consumer_for(kafka_bootstrap, topic, f"g-{uuid.uuid4().hex[:8]}", koc)
    await consumer.start()
    task = asyncio.create_task(koc.run(consumer))
    try:
        await wait_until(lambda: koc.processed == len(items), what="every message processed")
    finally:
        await koc.drain()
        task.cancel()
        await consumer.stop()
    assert all(seen[k] == list(range(per_key)) for k in keys), "a conversation's messages ran out of order"
    assert overlap["same_key"] == 0, "two messages of one conversation ran at the same time"
    # 2 partitions, yet many conversations at once (a partition-at-a-time consumer would show 2)
    assert overlap["max"] >= 20, f"at most {overlap['max']} messages ran at once"


async def test_commits_stop_at_the_first_unfinished_message(kafka_bootstrap, topic_prefix):
    topic = await new_topic(kafka_bootstrap, topic_prefix, partitions=1)
    items = [(f"conv_{i}", str(i)) for i in range(50)]
    await produce(kafka_bootstrap, topic, items)
    release = asyncio.Event()

    async def process(record) -> None:
        if record.value == b"10":  # a slow model call at offset 10
            await release.wait()

    group = f"g-{uuid.uuid4().hex[:8]}"
    koc = key_ordered(process, max_in_flight=100, commit_interval_s=0.02)
    consumer = consumer_for(kafka_bootstrap, topic, group, koc)
    await consumer.start()
    task = asyncio.create_task(koc.run(consumer))
    try:
        await wait_until(lambda: koc.processed == 49, what="the other 49 messages")
        await asyncio.sleep(0.3)  # several commit intervals
        assert (await committed(kafka_bootstrap, group, topic, 1))[0] == 10  # not past the unfinished one
        release.set()
        await wait_until(lambda: koc.processed == 50, what="the slow message")
        await wait_until(lambda: koc.committed().get(TopicPartition(topic, 0)) == 50, what="the commit")
        assert (await committed(kafka_bootstrap, group, topic, 1))[0] == 50
    finally:
        await koc.drain()
        task.cancel()
        await consumer.stop()


def read_lines(path: Path) -> list[tuple[str, str, int]]:
    if not path.exists():
        return []
    return [(a, b, int(c)) for a, b, c in (line.split() for line in path.read_text().splitlines() if line)]


async def test_a_killed_consumer_loses_nothing_and_never_committed_past_unfinished_work(
    kafka_bootstrap, topic_prefix, tmp_path
):
    topic = await new_topic(kafka_bootstrap, topic_prefix, partitions=2)
    items = [(f"conv_{i % 30}", f"m{i}") for i in range(300)]
    await produce(kafka_bootstrap, topic, items)
    group, first, second = f"g-{uuid.uuid4().hex[:8]}", tmp_path / "first.txt", tmp_path / "second.txt"

    def worker(out: Path, *extra: str) -> subprocess.Popen:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.integration.consumer_worker",
                kafka_bootstrap,
                topic,
                group,
                str(out),
                *extra,
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )

    proc = worker(first, "--block-value", "m7")  # conv_7's first message never finishes in the first process
    try:
        assert proc.stdout.readline().strip() == "ready"
        await wait_until(lambda: len(read_lines(first)) >= 250, timeout=60, what="the first worker's progress")
        await asyncio.sleep(0.5)  # let commits land
        offsets_before_kill = await committed(kafka_bootstrap, group, topic, 2)
    finally:
        proc.send_signal(signal.SIGKILL)  # mid-flight: m7 and conv_7's later messages are unfinished
        proc.wait(10)
    done_first = read_lines(first)
    assert all(v != "m7" for _, v, _ in done_first)
    assert not any(k == "conv_7" for k, _, _ in done_first), "conv_7 ran past its unfinished first message"

    # where m7 lives: the committed offset of its partition must not be past it
    probe = AIOKafkaConsumer(bootstrap_servers=kafka_bootstrap, enable_auto_commit=False)
    await probe.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(2)]
        probe.assign(tps)
        await probe.seek_to_beginning(*tps)
        records = await probe.getmany(*tps, timeout_ms=3000)
        where = {(r.value.decode()): (r.partition, r.offset) for rs in records.values() for r in rs}
    finally:
        await probe.stop()
    m7_partition, m7_offset = where["m7"]
    assert offsets_before_kill[m7_partition] is not None and offsets_before_kill[m7_partition] <= m7_offset

    proc = worker(second)  # a replacement takes over from the committed offsets
    try:
        assert proc.stdout.readline().strip() == "ready"

        def all_done() -> bool:
            return {v for _, v, _ in read_lines(first) + read_lines(second)} >= {v for _, v in items}

        await wait_until(all_done, timeout=60, what="every message processed by one of the two workers")
    finally:
        proc.terminate()
        proc.wait(10)
    second_lines = read_lines(second)
    conv7 = [int(v[1:]) for k, v, _ in second_lines if k == "conv_7"]
    assert conv7 == sorted(conv7) and conv7[0] == 7, "conv_7 resumed in order from its unfinished message"
    # redelivery is limited to what was not committed: nothing below the committed offsets ran again
    for _key, v, offset in second_lines:
        p, _ = where[v]
        assert offset >= offsets_before_kill[p], f"{v} at offset {offset} was committed but processed again"


async def test_at_the_limit_it_pauses_instead_of_buffering(kafka_bootstrap, topic_prefix):
    topic = await new_topic(kafka_bootstrap, topic_prefix, partitions=2)
    items = [(f"conv_{i}", str(i)) for i in range(400)]
    await produce(kafka_bootstrap, topic, items)
    release = asyncio.Event()
    high_water = {"held": 0}

    async def process(record) -> None:
        high_water["held"] = max(high_water["held"], koc.in_flight)
        await release.wait()

    koc = key_ordered(process, max_in_flight=25, commit_interval_s=0.05, idle_wait_ms=500)
    consumer = consumer_for(kafka_bootstrap, topic, f"g-{uuid.uuid4().hex[:8]}", koc)
    await consumer.start()
    task = asyncio.create_task(koc.run(consumer))
    try:
        await wait_until(lambda: koc.paused, what="the pause")
        await asyncio.sleep(1.5)  # several polls while paused: nothing more is taken
        assert koc.in_flight == 25 and high_water["held"] <= 25  # exactly the limit, never more
        await asyncio.sleep(1.0)  # more polls while paused: still nothing more is taken
        assert koc.in_flight == 25 and koc.paused
        release.set()
        await wait_until(lambda: koc.processed == 400, what="everything after the release")
        await wait_until(lambda: not koc.paused, what="fetching resumed")  # at its next look at the room
    finally:
        await koc.drain()
        task.cancel()
        await consumer.stop()


async def test_waiting_handlers_are_interrupted_on_stop_when_safe_and_read_again(
    kafka_bootstrap, topic_prefix, monkeypatch
):
    """The gateway's requests wait for admission: a stop must not wait for turns to end, and must not commit them."""
    topic = await new_topic(kafka_bootstrap, topic_prefix, partitions=1)
    await produce(kafka_bootstrap, topic, [(f"conv_{i}", str(i)) for i in range(5)])
    group = f"g-{uuid.uuid4().hex[:8]}"
    admitted = asyncio.Event()

    async def process(record) -> None:
        if record.value != b"0":
            await admitted.wait()  # never admitted

    monkeypatch.setattr(consumer_module, "DRAIN_TIMEOUT_S", 30)  # far past the 5 s the stop may take
    koc = key_ordered(process, commit_interval_s=0.02, cancel_on_revoke=True)
    consumer = consumer_for(kafka_bootstrap, topic, group, koc)
    await consumer.start()
    task = asyncio.create_task(koc.run(consumer))
    try:
        await wait_until(lambda: koc.processed == 1 and koc.running == 4, what="four waiting handlers")
        started = asyncio.get_running_loop().time()
        await koc.drain()
        assert asyncio.get_running_loop().time() - started < 5  # not the 30 s drain timeout
    finally:
        task.cancel()
        await consumer.stop()
    assert (await committed(kafka_bootstrap, group, topic, 1))[0] == 1  # the waiting ones are read again
