"""Fleet topics made for a test: `ensure_topics` with a test's partitions (one replica), the names it created."""

from __future__ import annotations

from roundtrip._kernel.kafka.admin import TopicsReport, ensure_topics


async def topics_report(
    bootstrap: str,
    prefix: str,
    partitions: int = 6,
    executor_partitions: int | None = None,
    replication_factor: int = 1,
    min_insync_replicas: int | None = None,
) -> TopicsReport:
    return await ensure_topics(
        bootstrap,
        prefix,
        partitions,
        executor_partitions,
        replication_factor,
        min_insync_replicas=min_insync_replicas,
        versions=(),
    )


async def create_topics(
    bootstrap: str, prefix: str, partitions: int = 6, executor_partitions: int | None = None
) -> list[str]:
    return (await topics_report(bootstrap, prefix, partitions, executor_partitions)).created
