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


def transactional_id(service: str, topic: str, instance_id: str | None = None) -> str:
    """Stable per replica, so a restarted replica fences the transaction its dead predecessor left
    open at once (Kafka aborts it when the same id registers again) instead of readers waiting
    for the transaction timeout (~60 s). The replica's identity, first found:
    `instance_id` (Settings.instance_id, ROUNDTRIP_INSTANCE_ID: a StatefulSet pod name, or what
    `roundtrip up` gives each child); in Kubernetes the pod name (HOSTNAME); else host + service.
    Two replicas must never share one: give a second replica on one host its own ROUNDTRIP_INSTANCE_ID."""
    instance = instance_id or os.environ.get("ROUNDTRIP_INSTANCE_ID")
    if not instance and os.environ.get("KUBERNETES_SERVICE_HOST") and os.environ.get("HOSTNAME"):
        instance = os.environ["HOSTNAME"]
    instance = instance or f"{socket.gethostname()}-{service}"
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
