"""Carrying load through the fleet: admission keeps at most ROUNDTRIP_MAX_RUNNING_TURNS turns running
(the rest wait in support.requests), and one conversation's follow-ups never wait on an idle long-poll."""

from __future__ import annotations

import json
import time
import uuid

import pytest
from aiokafka import AIOKafkaConsumer

from roundtrip._kernel.kafka.aiokafka_seam import partitions_of
from roundtrip._kernel.wire import topics

pytestmark = pytest.mark.e2e


async def record_times(settings, names: list[str]) -> dict[str, list[tuple[int, dict]]]:
    """Every record of `names` (logical topics) with its Kafka timestamp (ms, set by the producer)."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=settings.bootstrap_servers, enable_auto_commit=False, isolation_level="read_committed"
    )
    await consumer.start()
    try:
        wire = [settings.topic_prefix + n for n in names]
        parts = await partitions_of(consumer, wire)
        consumer.assign(parts)
        await consumer.seek_to_beginning(*parts)
        ends = await consumer.end_offsets(parts)
        out: dict[str, list[tuple[int, dict]]] = {n: [] for n in names}

        async def behind() -> bool:
            return any([await consumer.position(tp) < ends[tp] for tp in parts])

        while await behind():
            for tp, records in (await consumer.getmany(timeout_ms=1000)).items():
                name = tp.topic[len(settings.topic_prefix) :]
                out[name] += [(r.timestamp, json.loads(r.value)) for r in records]
        return out
    finally:
        await consumer.stop()


def first_times(records: list[tuple[int, dict]], request_ids: set[str]) -> dict[str, int]:
    """turn id -> the timestamp of its first record among `records`, for turns of `request_ids`."""
    first: dict[str, int] = {}
    for ts, message in records:
        if message["turn"]["request_id"] in request_ids:
            turn_id = message["turn"]["turn_id"]
            first[turn_id] = min(ts, first.get(turn_id, ts))
    return first


async def test_admission_runs_at_most_the_limit_and_queues_the_rest(client, fleet, fleet_settings):
    settings = fleet_settings[0]
    async with fleet.reconfigured(("gateway",), max_running_turns=2):
        ids = [await client.ask("where is my order?", "cus_1001", persona="careful") for _ in range(12)]
        replies = [await client.reply(r, timeout=90) for r in ids]
    assert all(r.outcome == "end_turn" for r in replies), [r.outcome for r in replies]
    ours = set(ids)
    times = await record_times(settings, [topics.TURN_STARTS, topics.OUTCOMES])
    # at least once: a start or an end may be published again (a redelivery, the outbox); the first one counts
    started = first_times(times[topics.TURN_STARTS], ours)
    ended = first_times(times[topics.OUTCOMES], ours)
    assert len(started) == 12 and len(ended) == 12
    events = [(t, +1) for t in started.values()] + [(t, -1) for t in ended.values()]
    running, most = 0, 0
    for _, delta in sorted(events, key=lambda e: (e[0], e[1])):  # at equal ms, an end before a start
        running += delta
        most = max(most, running)
    # a turn is admitted only after an earlier one's end was published: never more than 2 at once
    assert most == 2, f"{most} turns ran at once with a limit of 2"


async def test_follow_ups_in_one_conversation_never_stall(client, fleet_settings):
    """20 asks in a row in one conversation: each hop's consumer must see the next message at once,
    not after an idle fetch wait of the partition it just served (5 s before the key-ordered consumer)."""
    conversation = f"conv_{uuid.uuid4().hex[:8]}"
    took = []
    for i in range(20):
        request_id = f"req_{conversation}_{i}"
        body = {
            "request_id": request_id,
            "conversation_id": conversation,
            "customer_id": "cus_1003",
            "text": "where is my order?",
            "persona": "careful",
        }
        started = time.perf_counter()
        await client.publish_raw(json.dumps(body).encode(), key=conversation.encode())
        reply = await client.reply(request_id, timeout=60)
        took.append(time.perf_counter() - started)
        assert reply.outcome == "end_turn"
    print(f"\n[load] 20 asks in one conversation: p50 {sorted(took)[10] * 1000:.0f} ms, max {max(took) * 1000:.0f} ms")
    assert max(took) < 4.0, f"an ask took {max(took):.1f} s: a follow-up waited on an idle long-poll"
