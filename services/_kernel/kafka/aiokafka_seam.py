"""The one part of aiokafka the fleet uses that aiokafka does not offer as public API.

`partitions_of`: a groupless consumer's partitions of some topics. The consumer's `partitions_for_topic` answers
only from metadata it already holds (none before assignment) and `topics()` keeps only the names, so this asks
the client under it: `_client.fetch_all_metadata()`. How that is checked: docs/decisions/message-path.md.
"""

from __future__ import annotations

from collections.abc import Iterable

from aiokafka import AIOKafkaConsumer, TopicPartition


async def partitions_of(consumer: AIOKafkaConsumer, names: Iterable[str]) -> list[TopicPartition]:
    """Every partition of these topics (none for a topic that does not exist), from one metadata request."""
    metadata = await consumer._client.fetch_all_metadata()
    return [TopicPartition(name, p) for name in names for p in sorted(metadata.partitions_for_topic(name) or ())]
