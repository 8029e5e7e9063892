"""Exactly-once from one topic to another: consume, produce and commit in one Kafka transaction.

Used where a duplicate would be visible to a user (the gateway's replies): the reply and the
consumer offset of the message that caused it are committed atomically, so a crash between
publishing and committing cannot publish the reply twice. Readers must use
`isolation.level=read_committed` to skip the output of aborted transactions.
"""

from __future__ import annotations

import os
import socket

from aiokafka import AIOKafkaProducer, TopicPartition
from opentelemetry.propagate import inject
from pydantic import BaseModel


def transactional_id(service: str, topic: str) -> str:
    """Stable per process slot: ROUNDTRIP_INSTANCE_ID (e.g. a StatefulSet pod name) or host + pid."""
    instance = os.environ.get("ROUNDTRIP_INSTANCE_ID") or f"{socket.gethostname()}-{os.getpid()}"
    return f"roundtrip-{service}-{topic}-{instance}"


class TransactionalOutlet:
    def __init__(self, bootstrap_servers: str, topic: str, group_id: str, txn_id: str) -> None:
        self.topic, self.group_id = topic, group_id
        self._options = dict(bootstrap_servers=bootstrap_servers, transactional_id=txn_id, enable_idempotence=True, linger_ms=0)
        self._producer: AIOKafkaProducer | None = None

    async def start(self) -> None:
        """Connect and register the transactional id (fencing an earlier producer with the same id)."""
        self._producer = AIOKafkaProducer(**self._options)  # aiokafka wants a running loop
        await self._producer.start()

    async def stop(self) -> None:
        if self._producer is not None:
            await self._producer.stop()

    async def publish_consumed(self, message: BaseModel, key: bytes, consumed) -> None:
        """Publish `message` and commit the offset of `consumed` (a ConsumerRecord) atomically."""
        carrier: dict[str, str] = {}
        inject(carrier)  # the turn's trace continues in the reply, as with every other hop
        headers = [(k, v.encode()) for k, v in carrier.items()] + [("content-type", b"application/json")]
        async with self._producer.transaction():
            await self._producer.send(self.topic, message.model_dump_json().encode(), key=key, headers=headers)
            await self._producer.send_offsets_to_transaction(
                {TopicPartition(consumed.topic, consumed.partition): consumed.offset + 1}, self.group_id
            )
