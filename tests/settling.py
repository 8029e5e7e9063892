"""Waiting until a fleet has settled: every consumer group of the fleet has committed past every record of the topic
it reads, and nothing new was written meanwhile. A service writes what a record leads to before it commits past the
record, so once this returns, anything the fleet was going to do with what is on its topics (a second reply, a call
run twice) is on a topic: "nothing more happened" is a positive signal, not a window that may be too short. It says
nothing of what a timer does later (a sweeper, a deadline). Used by the e2e FleetClient and the chaos Observer."""

from __future__ import annotations

import asyncio
from typing import Any

from aiokafka.errors import KafkaError

from roundtrip._kernel.wire import topology


async def settled(
    consumer: Any, admin: Any, partitions: list[Any], read_to: dict[tuple[str, int], int], prefix: str, timeout: float
) -> None:
    """`consumer` reads `partitions` (every topic of the fleet) and keeps `read_to` ((topic, partition) -> the offset
    after its last record read) as it goes; `admin` lists the groups' offsets. TimeoutError after `timeout` s: the
    fleet still busy then is a failure, never a pass."""

    async def loop() -> None:
        while True:
            await read_to_end(consumer, partitions)
            marks = dict(read_to)
            for group, logical in topology.groups(prefix).items():
                await _committed_past(admin, group, prefix + logical, marks)
            await read_to_end(consumer, partitions)
            if read_to == marks:
                return

    await asyncio.wait_for(loop(), timeout)


async def settled_at_ends(
    consumer: Any, admin: Any, consumed: list[Any], own: list[Any], prefix: str, timeout: float
) -> None:
    """`settled` for a reader that does not read every topic: the groups' marks are the end offsets of the topics they
    consume (`consumed`; no transaction writes to those, so the end is the offset after the last record), and the
    reader has read its own partitions (`own`) to their end at the close. TimeoutError after `timeout` s."""

    async def loop() -> None:
        while True:
            marks = {(tp.topic, tp.partition): end for tp, end in (await consumer.end_offsets(consumed)).items() if end}
            for group, logical in topology.groups(prefix).items():
                await _committed_past(admin, group, prefix + logical, marks)
            again = {(tp.topic, tp.partition): end for tp, end in (await consumer.end_offsets(consumed)).items() if end}
            if again == marks:
                await read_to_end(consumer, own)
                return

    await asyncio.wait_for(loop(), timeout)


async def read_to_end(consumer: Any, partitions: list[Any]) -> None:
    """Until `consumer` has read every record on `partitions` when called (all a dead process had sent is in)."""
    ends = await consumer.end_offsets(partitions)
    for tp, end in ends.items():
        while await consumer.position(tp) < end:
            await asyncio.sleep(0.05)  # poll interval: the collector reading what is already on the topics


async def _committed_past(admin: Any, group: str, topic: str, marks: dict[tuple[str, int], int]) -> None:
    wanted = {p: o for (t, p), o in marks.items() if t == topic}
    while True:
        try:
            offsets = await admin.list_consumer_group_offsets(group)
        except KafkaError as exc:
            if not exc.retriable:
                raise
            await asyncio.sleep(0.5)  # poll interval: a broker down (for good) until the admin's metadata drops it
            continue
        committed = {tp.partition: m.offset for tp, m in offsets.items() if tp.topic == topic}
        if all(committed.get(p, -1) >= o for p, o in wanted.items()):
            return
        await asyncio.sleep(0.1)  # poll interval: a group commits what it finished every commit interval
