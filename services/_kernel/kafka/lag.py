"""A consumer's lag, per topic: records of its assigned partitions it has not finished, as `roundtrip_consumer_lag`.

Measured against the broker's end offsets every LAG_EVERY_S, not the fetches' high watermarks: a paused partition
(an outage, a consumer at its limit) is not fetched, and that is when its lag grows.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from aiokafka import TopicPartition

from roundtrip._kernel.observability import metrics

log = logging.getLogger("roundtrip.consumer")

LAG_EVERY_S = 15.0
ASK_TIMEOUT_S = 5.0  # a broker that does not answer leaves the last figures


async def measure(name: str, kafka: Any, done_up_to: dict[TopicPartition, int | None], shown: set[str]) -> None:
    """Set the lag of consumer `name` per topic; `done_up_to`: each assigned partition's first unfinished offset
    (None: nothing handed out yet, so the group's committed offset); `shown`: the topics gauged before."""
    ends = await asyncio.wait_for(kafka.end_offsets(list(done_up_to)), ASK_TIMEOUT_S) if done_up_to else {}
    per_topic: dict[str, int] = {}
    for tp, end in ends.items():
        base = done_up_to.get(tp)
        if base is None:
            base = await asyncio.wait_for(kafka.committed(tp), ASK_TIMEOUT_S)
        per_topic[tp.topic] = per_topic.get(tp.topic, 0) + max(0, end - (base if base is not None else end))
    for topic in shown - per_topic.keys():  # revoked since: no longer this member's
        metrics.consumer_lag.labels(name, topic).set(0)
    for topic, lag in per_topic.items():
        metrics.consumer_lag.labels(name, topic).set(lag)
    shown.clear()
    shown.update(per_topic)


async def watch(name: str, kafka: Any, done_up_to: Any) -> None:
    """measure() every LAG_EVERY_S for ever; `done_up_to()` gives the partitions' offsets at each turn."""
    shown: set[str] = set()
    while True:
        try:
            await measure(name, kafka, done_up_to(), shown)
        except Exception as exc:  # noqa: BLE001 - an unreachable broker: the next turn asks again
            log.debug("%s: measuring the lag failed: %s", name, exc)
        await asyncio.sleep(LAG_EVERY_S)
