"""Fleet topics made for a test: `ensure_topics` with a test's partitions, the names it created."""

from __future__ import annotations

from roundtrip._kernel.kafka.admin import ensure_topics


async def create_topics(
    bootstrap: str, prefix: str, partitions: int = 6, executor_partitions: int | None = None
) -> list[str]:
    return (await ensure_topics(bootstrap, prefix, partitions, executor_partitions, 1)).created
