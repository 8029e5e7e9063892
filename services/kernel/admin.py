"""Topic administration: create the fleet's topics (idempotently) and wait for a broker.

    report = await ensure_topics("127.0.0.1:9092", prefix="", partitions=6, executor_partitions=12)
    report.created, report.existing, report.grown

`create_topics` is the short form returning only the names it created. Existing topics are
left alone, except that a topic with fewer partitions than asked is grown (Kafka can only add
partitions), so raising `executor_partitions` scales the executors of a running fleet.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

from aiokafka.admin import AIOKafkaAdminClient, NewPartitions, NewTopic
from aiokafka.errors import KafkaConnectionError, KafkaError, TopicAlreadyExistsError, for_code

from services.kernel import topics

log = logging.getLogger(__name__)

DEAD_LETTER_PARTITIONS = 1  # dead letters are for people to read, in order


@dataclass
class TopicsReport:
    created: list[str] = field(default_factory=list)
    existing: list[str] = field(default_factory=list)
    grown: list[str] = field(default_factory=list)  # existing topics that got more partitions

    def __str__(self) -> str:
        parts = [f"created {len(self.created)}", f"already there {len(self.existing)}"]
        if self.grown:
            parts.append(f"grown {', '.join(self.grown)}")
        return "topics: " + ", ".join(parts)


def desired_topics(prefix: str, partitions: int, executor_partitions: int | None = None) -> dict[str, int]:
    """Wire name -> partition count of every topic of the fleet."""
    counts = {}
    for name in topics.ALL:
        if name == topics.TOOL_BATCHES:
            n = executor_partitions or partitions
        elif name == topics.DEAD_LETTERS:
            n = DEAD_LETTER_PARTITIONS
        else:
            n = partitions
        counts[prefix + name] = n
    return counts


def _admin(bootstrap: str, request_timeout_ms: int = 30000) -> AIOKafkaAdminClient:
    return AIOKafkaAdminClient(
        bootstrap_servers=bootstrap, client_id="roundtrip-admin", request_timeout_ms=request_timeout_ms
    )


async def _partition_counts(
    admin: AIOKafkaAdminClient, names: list[str], timeout: float = 10.0, at_least: dict[str, int] | None = None
) -> dict[str, int]:
    """Partition count of each topic, once the broker's metadata shows all of them with leaders
    (and at least `at_least[name]` partitions).

    Right after a create, the broker may not know the topic yet (the controller commits first,
    the broker's metadata cache follows a moment later), so this polls until it does.
    """
    at_least = at_least or {}
    deadline = time.monotonic() + timeout
    while True:
        described = await admin.describe_topics(names)
        counts = {
            t["topic"]: len(t["partitions"])
            for t in described
            if t["error_code"] == 0 and t["partitions"] and all(p["leader"] >= 0 for p in t["partitions"])
        }
        if all(counts.get(n, 0) >= at_least.get(n, 1) for n in names) or time.monotonic() > deadline:
            return counts
        await asyncio.sleep(0.05)


async def ensure_topics(
    bootstrap: str,
    prefix: str = "",
    partitions: int = 6,
    executor_partitions: int | None = None,
    replication_factor: int = 1,
    *,
    grow: bool = True,
    timeout: float = 30.0,
) -> TopicsReport:
    """Create the fleet's topics that do not exist yet; report what was created and what existed."""
    wanted = desired_topics(prefix, partitions, executor_partitions)
    report = TopicsReport()
    admin = _admin(bootstrap, int(timeout * 1000))
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        missing = [name for name in wanted if name not in existing]
        report.existing = [name for name in wanted if name in existing]
        if missing:
            response = await admin.create_topics(
                [NewTopic(name, wanted[name], replication_factor) for name in missing],
                timeout_ms=int(timeout * 1000),
            )
            for topic_error in response.topic_errors:
                name, code = topic_error[0], topic_error[1]
                message = topic_error[2] if len(topic_error) > 2 else None
                if code == 0:
                    report.created.append(name)
                elif code == TopicAlreadyExistsError.errno:  # created concurrently by someone else
                    report.existing.append(name)
                else:
                    raise for_code(code)(f"could not create topic {name}: {message}")
        # Wait until the broker serves every topic (so producers and consumers started right after
        # this call find them), and grow the existing ones that have fewer partitions than asked.
        counts = await _partition_counts(admin, list(wanted), timeout)
        if missing_now := [name for name in wanted if name not in counts]:
            raise KafkaError(f"topics not available after {timeout:.0f}s: {', '.join(missing_now)}")
        to_grow = {n: NewPartitions(wanted[n]) for n in report.existing if counts[n] < wanted[n]}
        if grow and to_grow:
            await admin.create_partitions(to_grow, timeout_ms=int(timeout * 1000))
            report.grown = sorted(to_grow, key=list(wanted).index)
            await _partition_counts(admin, report.grown, timeout, at_least=wanted)
    finally:
        await admin.close()
    order = list(wanted)
    report.created.sort(key=order.index)
    report.existing.sort(key=order.index)
    if report.created:
        log.info("created topics %s", ", ".join(report.created))
    if report.existing:
        log.info("topics already there: %s", ", ".join(report.existing))
    if report.grown:
        log.info("added partitions to %s", ", ".join(report.grown))
    return report


async def create_topics(
    bootstrap: str,
    prefix: str = "",
    partitions: int = 6,
    executor_partitions: int | None = None,
    replication_factor: int = 1,
) -> list[str]:
    """Create every topic of `topics.ALL` (prefixed) that is missing; return the names created.

    Safe to run twice: the second run creates nothing. The executor topic gets
    `executor_partitions or partitions` partitions, the dead-letter topic one.
    """
    report = await ensure_topics(bootstrap, prefix, partitions, executor_partitions, replication_factor)
    return report.created


async def wait_for_broker(bootstrap: str, timeout: float = 60.0) -> None:
    """Wait until the cluster at `bootstrap` answers a metadata request with a live broker."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        admin = _admin(bootstrap, request_timeout_ms=5000)
        try:
            await admin.start()
            cluster = await admin.describe_cluster()
            if cluster.get("brokers"):
                return
            last = KafkaError("no live broker yet")
        except (KafkaConnectionError, KafkaError, OSError) as e:
            last = e
        finally:
            await admin.close()
        await asyncio.sleep(0.25)
    raise TimeoutError(f"no Kafka broker answering at {bootstrap} after {timeout:.0f}s ({last})")
