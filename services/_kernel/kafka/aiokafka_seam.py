"""The one part of aiokafka the fleet uses that aiokafka does not offer as public API.

`partitions_of(consumer, topics)`: the partitions of some topics, for a consumer without a group
that assigns itself partitions (the gateway's memory of answered turns, the console's readers, any
watcher of the topics). aiokafka's consumer has `partitions_for_topic`, which answers only from metadata it
already holds (none for a topic before it is assigned), and `topics()`, which fetches the metadata of
every topic and keeps only the names. The client under it fetches that same metadata once and
returns it whole: `consumer._client.fetch_all_metadata()`, a `ClusterMetadata` whose
`partitions_for_topic(name)` gives the partition ids (None for a topic that does not exist).

How that shape is checked on each installed aiokafka: docs/decisions/message-path.md, "The seams".
"""

from __future__ import annotations

from collections.abc import Iterable

from aiokafka import AIOKafkaConsumer, TopicPartition


async def partitions_of(consumer: AIOKafkaConsumer, names: Iterable[str]) -> list[TopicPartition]:
    """Every partition of these topics (none for a topic that does not exist), from one metadata request."""
    metadata = await consumer._client.fetch_all_metadata()  # see the module's docstring
    return [TopicPartition(name, p) for name in names for p in sorted(metadata.partitions_for_topic(name) or ())]
