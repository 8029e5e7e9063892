"""Key-ordered concurrent consumption on aiokafka: records of one key in offset order, of different keys at once.

At `max_in_flight` the partitions are paused while polling goes on (an overload waits in Kafka as lag). A
partition's commit never passes its first unfinished record, and a record is never dropped: `RetryLater` retries
it in its place, a failure past the callable's dead-letter path goes to `rescue` (docs/operating/scaling.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import ConsumerStoppedError, KafkaError

from roundtrip._kernel.kafka import lag
from roundtrip._kernel.kafka.faults import RetryLater
from roundtrip._kernel.kafka.outages import Outages, rescue_until_done, shortened

log = logging.getLogger("roundtrip.consumer")
DRAIN_TIMEOUT_S = 10.0  # the longest a revoked partition waits for its running records before they are given up

Process = Callable[[Any], Awaitable[None]]  # one aiokafka ConsumerRecord
Commit = Callable[[dict[TopicPartition, int]], Awaitable[None]]
Rescue = Callable[[Any, BaseException], Awaitable[None]]


class _Slot:
    __slots__ = ("done", "offset")

    def __init__(self, offset: int) -> None:
        self.offset = offset
        self.done = False


class _Partition:
    """The records handed out of one partition, in offset order."""

    def __init__(self, tp: TopicPartition) -> None:
        self.tp = tp
        self.slots: deque[_Slot] = deque()
        self.next_offset: int | None = None  # after the last record handed out
        self.committed: int | None = None
        self.held = 0  # handed out and not finished or abandoned
        self.revoked = False
        self.idle = asyncio.Event()
        self.idle.set()

    def add(self, offset: int) -> _Slot:
        slot = _Slot(offset)
        self.slots.append(slot)
        self.next_offset = offset + 1
        self.held += 1
        self.idle.clear()
        return slot

    def release(self, n: int) -> None:
        self.held -= n
        if self.held <= 0:
            self.idle.set()

    def safe(self) -> int | None:
        slots = self.slots
        while slots and slots[0].done:
            slots.popleft()
        return slots[0].offset if slots else self.next_offset


class KeyOrderedConsumer(ConsumerRebalanceListener):  # type: ignore[misc]  # aiokafka ships no types
    def __init__(
        self,
        process: Process,
        *,
        name: str,
        max_in_flight: int,
        commit_interval_s: float,
        commit: Commit | None,
        rescue: Rescue | None,
        forget: Callable[[list[TopicPartition]], None] | None,
        idle_wait_ms: int,
        cancel_on_revoke: bool,
    ) -> None:
        self.name = name
        self._process = process
        self._limit = max(1, max_in_flight)
        self._commit_interval = commit_interval_s
        self._commit_fn = commit
        self._rescue = rescue
        self._forget = forget
        self._idle_wait_ms = idle_wait_ms
        # for a handler that only waits (admission): the next owner reads the cancelled record again
        self._cancel_on_revoke = cancel_on_revoke
        self._consumer: AIOKafkaConsumer | None = None
        self._parts: dict[TopicPartition, _Partition] = {}
        self._keys: dict[tuple[TopicPartition, Any], deque[tuple[Any, _Slot]]] = {}
        self._tasks: dict[tuple[TopicPartition, Any], asyncio.Task[None]] = {}
        self._held = 0
        self._running = 0
        self._paused = False
        self._held_back = False
        self.outages = Outages(name)
        self._stopping = False
        self._room = asyncio.Event()
        self._room.set()
        self._dirty = asyncio.Event()
        self._commit_lock = asyncio.Lock()
        self._committer: asyncio.Task[None] | None = None
        self._lag: asyncio.Task[None] | None = None
        self.last_poll = time.monotonic()
        self.assigned = False  # joined the group, with or without partitions
        self.processed = 0

    @property
    def process(self) -> Process:
        return self._process

    @property
    def in_flight(self) -> int:
        return self._held

    @property
    def running(self) -> int:
        return self._running

    @property
    def paused(self) -> bool:
        return self._paused

    def hold(self, held: bool) -> None:
        """Stop (True) or resume (False) fetching, whatever the room: the handler's own resource is at its limit."""
        self._held_back = held
        if not held:
            self._room.set()

    def committed(self) -> dict[TopicPartition, int | None]:
        return {tp: p.committed for tp, p in self._parts.items()}

    def done_up_to(self) -> dict[TopicPartition, int | None]:
        """Each assigned partition's first unfinished offset (None: nothing handed out, nothing committed yet)."""
        return {tp: p.committed if (s := p.safe()) is None else s for tp, p in self._parts.items() if not p.revoked}

    async def run(self, consumer: AIOKafkaConsumer) -> None:
        self._consumer = consumer
        self._stopping = False
        if self._committer is None or self._committer.done():
            self._committer = asyncio.create_task(self._commit_loop(), name=f"{self.name}-commits")
        if self._lag is None or self._lag.done():
            self._lag = asyncio.create_task(lag.watch(self.name, consumer, self.done_up_to), name=f"{self.name}-lag")
        while not self._stopping:
            try:
                if self._paused or self._held_back or self.outages or self._held >= self._limit:
                    await self._wait_for_room(consumer)
                    continue
                batch = await consumer.getmany(timeout_ms=self._idle_wait_ms, max_records=self._limit - self._held)
                self.last_poll = time.monotonic()
            except ConsumerStoppedError:
                return
            except KafkaError as exc:  # aiokafka reconnects by itself
                log.warning("%s: fetching failed (%s); retrying in 1 s", self.name, exc)
                await asyncio.sleep(1.0)
                continue
            for tp, records in batch.items():
                part = self._parts.get(tp)
                if part is None or part.revoked:
                    continue  # fetched just before a revocation: the next owner reads them again
                for record in records:
                    self._hand_out(part, record)

    async def _wait_for_room(self, consumer: AIOKafkaConsumer) -> None:
        """Pause every partition and keep polling, so the group keeps us, until there is room."""
        if not self._paused:
            self._paused = True
            self._room.clear()
            consumer.pause(*consumer.assignment())
            if not self.outages:  # an outage says so itself, once
                why = "held back by its handler" if self._held_back else "the limit"
                log.info("%s: %d records in flight (%s): paused fetching", self.name, self._held, why)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._room.wait(), timeout=max(0.5, self._idle_wait_ms / 1000))
        if self._held < self._limit and not self._held_back and not self.outages:
            self._paused = False
            consumer.resume(*consumer.assignment())
        else:
            self._room.clear()  # set by a finish while still held back
            await consumer.getmany(timeout_ms=0)  # paused: returns nothing, but counts as a poll
            self.last_poll = time.monotonic()

    def _hand_out(self, part: _Partition, record: Any) -> None:
        slot = part.add(record.offset)
        self._held += 1
        key = (part.tp, record.key if record.key is not None else ("offset", record.offset))
        queue = self._keys.get(key)
        if queue is not None:
            queue.append((record, slot))
            return
        self._keys[key] = deque([(record, slot)])
        self._tasks[key] = asyncio.create_task(self._run_key(key, part))

    async def _run_key(self, key: tuple[TopicPartition, Any], part: _Partition) -> None:
        queue = self._keys[key]
        try:
            while queue:
                record, slot = queue[0]
                if part.revoked or self._stopping:
                    break  # not started: whoever owns the partition next reads it again
                self._running += 1
                try:
                    finished = await self._handle(record, part, key)
                finally:
                    self._running -= 1
                if not finished:
                    break
                slot.done = True
                queue.popleft()
                self._finished(part, 1)
                self.processed += 1
        finally:
            if queue:  # abandoned (revoked, stopping, cancelled): not done, so never committed
                self._finished(part, len(queue))
                queue.clear()
            del self._keys[key]
            self._tasks.pop(key, None)

    async def _handle(self, record: Any, part: _Partition, key: tuple[TopicPartition, Any]) -> bool:
        """True when the record is finished (handled or dead-lettered), False when a rebalance or a stop gave it up."""
        try:
            await self._process(record)
            return True
        except asyncio.CancelledError:
            raise
        except RetryLater as exc:
            finished = await self.outages.retry(
                lambda: self._process(record),
                exc,
                self._given_up(part),
                self._rescued(record, part),
                key=key,
                label=f"{record.key!r:.80} of {record.topic}[{record.partition}]",
            )
            self._room.set()
            return finished
        except BaseException as exc:  # noqa: BLE001 - nothing a message does may stop the consumer
            return await self._rescued(record, part)(exc)

    def _given_up(self, part: _Partition) -> Callable[[], bool]:
        return lambda: part.revoked or self._stopping

    def _rescued(self, record: Any, part: _Partition) -> Callable[[BaseException], Awaitable[bool]]:
        return lambda failure: rescue_until_done(self.name, self._rescue, record, failure, self._given_up(part))

    def _finished(self, part: _Partition, n: int) -> None:
        self._held -= n
        part.release(n)
        self._dirty.set()
        if self._held < self._limit:
            self._room.set()

    async def _commit_loop(self) -> None:
        while True:
            await self._dirty.wait()
            if self._commit_interval > 0:  # the finishes meanwhile join this commit
                await asyncio.sleep(self._commit_interval)
            self._dirty.clear()
            if not await self.commit():
                self._dirty.set()
                await asyncio.sleep(1.0)

    async def commit(self, parts: list[_Partition] | None = None) -> bool:
        async with self._commit_lock:
            offsets = {}
            for part in parts if parts is not None else list(self._parts.values()):
                safe = part.safe()
                if safe is not None and safe != part.committed:
                    offsets[part.tp] = safe
            if not offsets:
                return True
            try:
                if self._commit_fn is not None:
                    await self._commit_fn(offsets)
                elif self._consumer is not None:
                    await self._consumer.commit(offsets)
            except Exception as exc:  # noqa: BLE001 - retried by the commit loop
                log.warning(
                    "%s: committing %s failed: %s: %s", self.name, _fmt(offsets), type(exc).__name__, shortened(exc)
                )
                return False
            for tp, offset in offsets.items():
                held = self._parts.get(tp)
                if held is not None:
                    held.committed = offset
            return True

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        parts = [self._parts[tp] for tp in revoked if tp in self._parts]
        for part in parts:
            part.revoked = True
        await self._settle(parts)
        for part in parts:
            self._parts.pop(part.tp, None)
        if self._forget is not None and parts:
            self._forget([p.tp for p in parts])

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        for tp in assigned:
            old = self._parts.get(tp)
            if old is None or old.revoked:
                self._parts[tp] = _Partition(tp)
        self._paused = False  # a new assignment starts unpaused
        self._room.set()
        self.assigned = True

    async def _settle(self, parts: list[_Partition]) -> None:
        """Let the running records of `parts` finish (bounded by DRAIN_TIMEOUT_S), then commit what finished."""
        if not parts:
            return
        if self._cancel_on_revoke:
            gone = {p.tp for p in parts}
            for key, task in list(self._tasks.items()):
                if key[0] in gone:
                    task.cancel()
        waits = [asyncio.ensure_future(p.idle.wait()) for p in parts]
        _, pending = await asyncio.wait(waits, timeout=DRAIN_TIMEOUT_S)
        for w in pending:
            w.cancel()
        if pending:
            busy = sum(p.held for p in parts)
            log.warning(
                "%s: %d records still running after %.0f s; their offsets stay uncommitted (redelivered)",
                self.name,
                busy,
                DRAIN_TIMEOUT_S,
            )
        await self.commit(parts)

    async def drain(self) -> None:
        self._stopping = True
        self._room.set()
        for part in self._parts.values():
            part.revoked = True
        await self._settle(list(self._parts.values()))
        for task in (self._committer, self._lag):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        for task in list(self._tasks.values()):
            task.cancel()


def _fmt(offsets: dict[TopicPartition, int]) -> str:
    return ", ".join(f"{tp.topic}[{tp.partition}]={off}" for tp, off in sorted(offsets.items()))
