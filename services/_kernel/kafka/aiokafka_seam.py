"""The one part of aiokafka the fleet uses that is not public API: a groupless consumer's partitions of some topics,
from the client's whole metadata (the consumer's `partitions_for_topic` knows only assigned topics). How that is
checked on each aiokafka: docs/decisions/message-path.md, "The seams".
"""

from __future__ import annotations

from collections.abc import Iterable

from aiokafka import AIOKafkaConsumer, TopicPartition


async def partitions_of(consumer: AIOKafkaConsumer, names: Iterable[str]) -> list[TopicPartition]:
    """Every partition of these topics (none for a topic that does not exist), from one metadata request."""
    metadata = await consumer._client.fetch_all_metadata()
    return [TopicPartition(name, p) for name in names for p in sorted(metadata.partitions_for_topic(name) or ())]
