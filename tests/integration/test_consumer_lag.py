"""A consumer's lag (roundtrip_consumer_lag, services/_kernel/kafka/lag.py) against the real broker: it counts the
records not finished yet, keeps growing while the consumer is at its limit with its partitions paused (no fetch
reaches them, so only the broker's end offsets can say), and falls to zero once the work is done."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from prometheus_client import REGISTRY

from roundtrip._kernel.kafka import lag
from tests.consumers import key_ordered
from tests.integration.test_consumer import consumer_for, new_topic, produce, wait_until

pytestmark = pytest.mark.integration


def lag_of(name: str, topic: str) -> float | None:
    return REGISTRY.get_sample_value("roundtrip_consumer_lag", {"consumer": name, "topic": topic})


async def test_the_lag_grows_while_the_consumer_is_paused_at_its_limit_and_falls_to_zero(
    kafka_bootstrap, topic_prefix, monkeypatch
):
    monkeypatch.setattr(lag, "LAG_EVERY_S", 0.2)
    topic = await new_topic(kafka_bootstrap, topic_prefix, partitions=1)
    release = asyncio.Event()

    async def process(record) -> None:
        await release.wait()  # a backend that stopped answering

    name = f"lagging-{uuid.uuid4().hex[:6]}"
    koc = key_ordered(process, name=name, max_in_flight=5, commit_interval_s=0.02)
    consumer = consumer_for(kafka_bootstrap, topic, f"g-{uuid.uuid4().hex[:8]}", koc)
    await consumer.start()
    task = asyncio.create_task(koc.run(consumer))
    try:
        await produce(kafka_bootstrap, topic, [(f"conv_{i}", str(i)) for i in range(50)])
        await wait_until(lambda: koc.in_flight == 5 and koc.paused, what="the consumer at its limit, paused")
        await wait_until(lambda: lag_of(name, topic) == 50, what="a lag of the 50 records")
        await produce(kafka_bootstrap, topic, [(f"conv_{i}", str(i)) for i in range(50, 70)])
        await wait_until(lambda: lag_of(name, topic) == 70, what="the lag grown by the 20 new records")
        release.set()
        await wait_until(lambda: koc.processed == 70, what="every record processed")
        await wait_until(lambda: lag_of(name, topic) == 0, what="no lag once everything is done and committed")
    finally:
        release.set()
        await koc.drain()
        task.cancel()
        await consumer.stop()
