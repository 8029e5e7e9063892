"""Drives the running fleet like a client app: publish to support.requests, read support.replies (and, for a turn
that streams, support.stream: when its first text came, how many chunks).

It also watches turn.iterations, but reads only each record's key (the conversation id,
which the benchmark chooses) and its Kafka timestamp (set by the model service's producer
when it published the iteration), so watching costs almost nothing and the iteration
times do not depend on how fast this process reads. Records of one key stay in one
partition, so the n-th iteration record of a conversation is its step n.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from roundtrip._kernel.kafka.aiokafka_seam import partitions_of
from roundtrip._kernel.settings import Settings
from roundtrip._kernel.wire import topics
from tests.benchmarks.inprocess import TurnTiming


class FleetDriver:
    def __init__(self, settings: Settings, timeout: float = 60.0) -> None:
        self.settings = settings
        self.timeout = timeout
        self._waiting: dict[str, tuple[TurnTiming, asyncio.Future[None]]] = {}  # conversation id -> ...
        self._iterations: dict[str, list[float]] = {}
        self.count_tokens = False  # parse each iteration's usage too (tests/benchmarks/bench_ratelimit.py)
        self.tokens: list[tuple[float, int]] = []  # (wall time of the iteration, input tokens + cache writes)

    def topic(self, name: str) -> str:
        return self.settings.topic_prefix + name

    async def start(self) -> None:
        servers = self.settings.bootstrap_servers
        self.producer = AIOKafkaProducer(bootstrap_servers=servers, linger_ms=0, enable_idempotence=True)
        self.consumer = AIOKafkaConsumer(
            bootstrap_servers=servers, group_id=None, enable_auto_commit=False, fetch_max_wait_ms=100
        )
        await self.producer.start()
        await self.consumer.start()
        wanted = [self.topic(topics.SUPPORT_REPLIES), self.topic(topics.ITERATIONS), self.topic(topics.SUPPORT_STREAM)]
        parts = []
        for name in wanted:
            for _ in range(100):  # metadata may lag just after the topics were created
                found = await partitions_of(self.consumer, [name])
                if found:
                    break
                await asyncio.sleep(0.1)  # poll interval: the fleet's health ports answering
            else:
                raise RuntimeError(f"topic {name} has no partitions")
            parts += found
        self.consumer.assign(parts)
        await self.consumer.seek_to_end(*parts)
        for tp in parts:
            await self.consumer.position(tp)
        self._task = asyncio.create_task(self._read())

    async def stop(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        await self.consumer.stop()
        await self.producer.stop()

    async def _read(self) -> None:
        replies, streamed = self.topic(topics.SUPPORT_REPLIES), self.topic(topics.SUPPORT_STREAM)
        while True:
            batches = await self.consumer.getmany(timeout_ms=1000)
            now = time.perf_counter()
            for tp, records in batches.items():
                for record in records:
                    key = record.key.decode() if record.key else ""
                    if tp.topic == streamed:
                        self._streamed(key, record.value, now)
                        continue
                    if tp.topic != replies:
                        if key in self._iterations:
                            self._iterations[key].append(record.timestamp / 1000)
                            if self.count_tokens:  # what the call counts against an input-token limit
                                usage = json.loads(record.value).get("usage") or {}
                                self.tokens.append(
                                    (
                                        record.timestamp / 1000,
                                        usage.get("input_tokens", 0) + usage.get("cache_creation_input_tokens", 0),
                                    )
                                )
                        continue
                    waiting = self._waiting.pop(key, None)
                    if waiting is None:
                        continue
                    timing, done = waiting
                    reply = json.loads(record.value)
                    timing.ended = now
                    timing.steps = int(reply.get("steps", 0))
                    timing.outcome = str(reply.get("outcome", ""))
                    timing.usage = reply.get("usage") or {}
                    timing.cost_usd = float(reply.get("cost_usd", 0.0))
                    if not done.done():
                        done.set_result(None)

    def _streamed(self, key: str, value: bytes, now: float) -> None:
        """A chunk of a streamed turn: counted, and the first with text marks the time to the first streamed text."""
        waiting = self._waiting.get(key)
        if waiting is None:
            return
        timing = waiting[0]
        timing.chunks += 1
        if not timing.first_text and json.loads(value).get("text"):
            timing.first_text = now

    async def turn(
        self,
        text: str,
        customer_id: str,
        persona: str | None,
        timeout: float | None = None,
        stream: bool = False,
        lane: str | None = None,
    ) -> TurnTiming:
        request_id = f"req_{uuid.uuid4().hex[:12]}"
        conversation_id = f"conv_{request_id}"
        body = {"request_id": request_id, "conversation_id": conversation_id, "customer_id": customer_id, "text": text}
        if persona:
            body["persona"] = persona
        if lane:  # "batch": its model calls through Message Batches
            body["lane"] = lane
        if stream:  # its text to support.stream as it is written
            body["stream"] = True
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        wall0, timing = time.time(), TurnTiming(started=time.perf_counter())
        timing.conversation_id, timing.wall_started = conversation_id, wall0
        self._waiting[conversation_id] = (timing, done)
        self._iterations[conversation_id] = []
        await self.producer.send_and_wait(
            self.topic(topics.SUPPORT_REQUESTS), json.dumps(body).encode(), key=conversation_id.encode()
        )
        try:
            await asyncio.wait_for(done, timeout or self.timeout)
        except TimeoutError:
            self._waiting.pop(conversation_id, None)
            timing.outcome = "timeout"
            timing.ended = time.perf_counter()
        # the last iteration record may be read a moment after the reply (another topic)
        deadline = time.perf_counter() + 2.0
        while len(self._iterations[conversation_id]) < timing.steps and time.perf_counter() < deadline:
            await asyncio.sleep(0.005)  # poll interval: the conversation's iterations arriving (timed to the ms)
        # iteration records carry wall-clock ms; put them on this turn's perf_counter axis
        walls = self._iterations.pop(conversation_id, [])
        timing.responses = [timing.started + (w - wall0) for w in walls]
        return timing
