"""Which turns already have their reply: so a turn's end delivered again never gets a second one.

A reply is committed with the offset of the end it answers, which covers that record, not a copy of it at another
offset. `committed` is filled from `support.replies` itself at start and after each rebalance, so the memory survives
the process. `staged` replies await their commit; a rebalance that drops them drops them here too, so the end, read
again by its next owner, is answered then rather than dropped as a duplicate.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time

from aiokafka import TopicPartition

from roundtrip._kernel.clock import SYSTEM
from roundtrip._kernel.kafka.aiokafka_seam import partitions_of
from roundtrip._kernel.kafka.clients import KafkaClients, clients_of
from roundtrip._kernel.kafka.dedupe import SeenIds

log = logging.getLogger("roundtrip.gateway")

PRIME_TIMEOUT_S = 30.0


class RepliedTurns:
    def __init__(self, kafka: KafkaClients | str, replies_topic: str, memory_s: float) -> None:
        self._kafka, self._topic, self._memory_s = clients_of(kafka), replies_topic, memory_s
        self.committed = SeenIds(SYSTEM, capacity=1_000_000, max_age_s=memory_s)
        self.staged: dict[str, tuple[TopicPartition, int]] = {}
        self._primed = False
        self._lock = asyncio.Lock()

    async def answered(self, turn_id: str) -> bool:
        """The turn has, or is about to have, its reply (an end the ledger no longer has may be a redelivery)."""
        await self._primed_once()
        return turn_id in self.committed or turn_id in self.staged

    async def claim(self, turn_id: str, tp: TopicPartition, offset: int) -> bool:
        """True: reply to this end (read at tp/offset) now. False: the turn has, or is about to have, its reply."""
        await self._primed_once()
        if turn_id in self.committed:
            return False
        seen = self.staged.get(turn_id)
        if seen is not None and seen != (tp, offset):
            return False  # another copy of the end waits for its commit
        self.staged[turn_id] = (tp, offset)
        return True

    async def _primed_once(self) -> None:
        if not self._primed:
            async with self._lock:
                if not self._primed:
                    try:
                        await asyncio.wait_for(self._prime(), PRIME_TIMEOUT_S)
                    except Exception as exc:  # noqa: BLE001 - without it a copy may be answered twice; never lose the reply
                        log.warning(
                            "could not read %s to learn the answered turns (%s: %s); relying on this process's memory",
                            self._topic,
                            type(exc).__name__,
                            exc,
                        )
                    self._primed = True

    def committed_up_to(self, offsets: dict[TopicPartition, int]) -> None:
        for turn_id, (tp, offset) in list(self.staged.items()):
            if tp in offsets and offset < offsets[tp]:
                del self.staged[turn_id]
                self.committed.add(turn_id)

    def forget(self, partitions: list[TopicPartition]) -> None:
        """A rebalance took these partitions: their uncommitted replies are gone; learn the others' replies again."""
        gone = set(partitions)
        for turn_id, (tp, _) in list(self.staged.items()):
            if tp in gone:
                del self.staged[turn_id]
        self._primed = False

    async def _prime(self) -> None:
        started = time.monotonic()
        consumer = self._kafka.consumer(
            enable_auto_commit=False, isolation_level="read_committed", auto_offset_reset="earliest"
        )
        await consumer.start()
        try:
            partitions = await partitions_of(consumer, [self._topic])  # one request, no group needed
            if not partitions:
                return
            consumer.assign(partitions)
            ends = await consumer.end_offsets(partitions)  # read_committed: the last stable offsets
            since = await consumer.offsets_for_times(
                {tp: int((time.time() - self._memory_s) * 1000) for tp in partitions}
            )
            todo = {}
            for tp in partitions:
                if since.get(tp) is not None and since[tp].offset < ends[tp]:
                    consumer.seek(tp, since[tp].offset)
                    todo[tp] = ends[tp]
            learned = 0
            while todo:
                for records in (await consumer.getmany(*todo, timeout_ms=1000)).values():
                    for record in records:
                        try:
                            self.committed.add(json.loads(record.value)["turn_id"])
                            learned += 1
                        except (ValueError, TypeError, KeyError):
                            pass
                for tp in list(todo):
                    if await consumer.position(tp) >= todo[tp]:
                        del todo[tp]
            log.info("learned %d answered turns from %s in %.2f s", learned, self._topic, time.monotonic() - started)
        finally:
            await consumer.stop()
