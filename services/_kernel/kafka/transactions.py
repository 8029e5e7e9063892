"""Exactly-once from one topic to another: a reply and the consumer offset that covers its input are committed in
one Kafka transaction, so a crash between them cannot publish the reply twice. Readers must use
`isolation.level=read_committed` to skip the output of aborted transactions.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from typing import Any

from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from opentelemetry.propagate import inject
from pydantic import BaseModel

from roundtrip._kernel.kafka.clients import KafkaClients, clients_of

# a broken producer's stop flushes nothing that matters, and a restart that fails is tried by the next commit
DISCARD_TIMEOUT_S = 10
RESTART_TIMEOUT_S = 30


def instance_name(service: str, instance_id: str | None) -> str:
    """This replica's stable name: ROUNDTRIP_INSTANCE_ID, else the pod's name in Kubernetes, else host + service."""
    if instance_id:
        return instance_id
    if os.environ.get("KUBERNETES_SERVICE_HOST") and os.environ.get("HOSTNAME"):
        return os.environ["HOSTNAME"]
    return f"{socket.gethostname()}-{service}"


def transactional_id(service: str, topic: str, instance_id: str | None, prefix: str) -> str:
    """Stable per replica, so a restarted replica fences its dead predecessor's open transaction at once (Kafka
    aborts it when the same id registers again) instead of readers waiting for the transaction timeout. Two
    replicas must never share one. `prefix` comes first so a fleet's ACL on its ids covers none of another fleet's."""
    return f"{prefix}roundtrip-{service}-{topic}-{instance_name(service, instance_id)}"


class TransactionalOutlet:
    """A handler `stage()`s its output for the record it consumed; the key-ordered consumer's `commit(offsets)`
    publishes every staged message below its partition's safe offset in one transaction with those offsets."""

    def __init__(self, kafka: KafkaClients | str, topic: str, group_id: str, txn_id: str) -> None:
        self.topic, self.group_id = topic, group_id
        self._kafka, self._options = (
            clients_of(kafka),
            dict(transactional_id=txn_id, enable_idempotence=True, linger_ms=0),
        )
        self._producer: AIOKafkaProducer | None = None
        # partition -> consumed offset -> (value, key, headers): a record read again replaces its own
        self._staged: dict[TopicPartition, dict[int, tuple[bytes, bytes, list[tuple[str, bytes]]]]] = {}

    async def start(self) -> None:
        self._producer = self._kafka.producer(**self._options)  # here, not in __init__: aiokafka wants a running loop
        await self._producer.start()

    async def stop(self) -> None:
        if self._producer is not None:
            await self._producer.stop()

    def stage(self, message: BaseModel, key: bytes, consumed: Any) -> None:
        carrier: dict[str, str] = {}
        inject(carrier)
        headers = [(k, v.encode()) for k, v in carrier.items()] + [("content-type", b"application/json")]
        tp = TopicPartition(consumed.topic, consumed.partition)
        self._staged.setdefault(tp, {})[consumed.offset] = (message.model_dump_json().encode(), key, headers)

    def forget(self, partitions: list[TopicPartition]) -> None:
        """Partitions given up in a rebalance: the next owner reads their uncommitted records again."""
        for tp in partitions:
            self._staged.pop(tp, None)

    @property
    def staged(self) -> int:
        return sum(len(v) for v in self._staged.values())

    async def commit(self, offsets: dict[TopicPartition, int]) -> None:
        """One transaction: the staged messages below `offsets`, and `offsets` for the consumer group.

        A failed commit discards the producer: aiokafka leaves one in a fatal state after some broker failures, and
        a failed commit may still have committed. The next commit's fresh producer settles that transaction first."""
        if self._producer is None:
            await self._restart()
        producer = self._producer
        assert producer is not None
        ready = {tp: sorted(o for o in self._staged.get(tp, {}) if o < offset) for tp, offset in offsets.items()}
        try:
            async with producer.transaction():
                for tp, offsets_ready in ready.items():
                    for o in offsets_ready:
                        value, key, headers = self._staged[tp][o]
                        await producer.send(self.topic, value, key=key, headers=headers)
                await producer.send_offsets_to_transaction(offsets, self.group_id)
        except BaseException:
            await self._discard()
            raise
        self._drop_below(offsets)

    def _drop_below(self, offsets: dict[TopicPartition, int]) -> None:
        for tp, offset in offsets.items():
            for o in [o for o in self._staged.get(tp, {}) if o < offset]:
                self._staged[tp].pop(o)

    async def _discard(self) -> None:
        producer, self._producer = self._producer, None
        if producer is None:
            return
        with contextlib.suppress(Exception):
            await asyncio.wait_for(producer.stop(), DISCARD_TIMEOUT_S)

    async def _restart(self) -> None:
        """A fresh producer with the same transactional id: registering it settles the last one's transaction, so
        the group's committed offsets then say what was published, and those staged messages are dropped."""
        admin = self._kafka.admin(request_timeout_ms=10000)
        try:
            committed = await asyncio.wait_for(self._start_and_read(admin), RESTART_TIMEOUT_S)
        except BaseException:
            await self._discard()
            raise
        finally:
            await admin.close()
        self._drop_below({tp: meta.offset for tp, meta in committed.items() if meta.offset >= 0})

    async def _start_and_read(self, admin: AIOKafkaAdminClient) -> dict[Any, Any]:
        await self.start()
        await admin.start()
        return await admin.list_consumer_group_offsets(self.group_id)  # type: ignore[no-any-return]  # aiokafka ships no types
