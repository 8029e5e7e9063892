"""Topic administration: create the fleet's topics idempotently, wait for a broker, read consumer lag. An existing
topic keeps its settings but grows to the partitions asked (Kafka can only add), so raising `executor_partitions`
scales the executors of a running fleet.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient, NewPartitions, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import KafkaError, TopicAlreadyExistsError, for_code

from roundtrip._kernel.kafka.clients import KafkaClients, clients_of
from roundtrip._kernel.wire import topics, topology

log = logging.getLogger(__name__)

DEAD_LETTER_PARTITIONS = 1
# a dead letter carries its record base64-encoded plus a readable copy: well past the broker's 1 MB default
DEAD_LETTER_MAX_BYTES = 8 * 1024 * 1024


@dataclass
class TopicsReport:
    created: list[str] = field(default_factory=list)
    existing: list[str] = field(default_factory=list)
    grown: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        parts = [f"created {len(self.created)}", f"already there {len(self.existing)}"]
        if self.grown:
            parts.append(f"grown {', '.join(self.grown)}")
        return "topics: " + ", ".join(parts)


def topic_configs(name: str, prefix: str) -> dict[str, str]:
    if name.startswith(prefix) and topics.dead_letters_service(name[len(prefix) :]):
        return {"max.message.bytes": str(DEAD_LETTER_MAX_BYTES)}
    return {}


def desired_topics(
    prefix: str, partitions: int, executor_partitions: int | None, versions: Sequence[str]
) -> dict[str, int]:
    """The fleet's topics and their partitions, with the own topics of each agent version in `versions`."""
    counts = {}
    for name in (*topology.topic_names(), *(t for v in versions for t in topology.version_topics(v))):
        if name.partition(topics.VERSION_MARK)[0] == topics.TOOL_BATCHES:  # a version's too
            n = executor_partitions or partitions
        elif name == topics.DEAD_LETTERS_HANDLED or topics.dead_letters_service(name):  # the first claim of one wins
            n = DEAD_LETTER_PARTITIONS
        else:
            n = partitions
        counts[prefix + name] = n
    return counts


def _admin(kafka: KafkaClients | str, request_timeout_ms: int) -> AIOKafkaAdminClient:
    return clients_of(kafka).admin(client_id="roundtrip-admin", request_timeout_ms=request_timeout_ms)


async def _partition_counts(
    admin: AIOKafkaAdminClient, names: list[str], timeout: float, at_least: dict[str, int] | None = None
) -> dict[str, int]:
    """Partition count of each topic, polled until the broker's metadata shows all with leaders (and at least
    `at_least[name]` partitions): right after a create, the broker's metadata cache lags the controller."""
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


ENSURE_TIMEOUT_S = 30.0  # per admin request of creating or growing the topics


async def ensure_topics(
    bootstrap: KafkaClients | str,
    prefix: str,
    partitions: int,
    executor_partitions: int | None,
    replication_factor: int,
    *,
    min_insync_replicas: int | None,
    versions: Sequence[str],
) -> TopicsReport:
    durability = {"min.insync.replicas": str(min_insync_replicas)} if min_insync_replicas else {}
    wanted = desired_topics(prefix, partitions, executor_partitions, versions)
    report, timeout = TopicsReport(), ENSURE_TIMEOUT_S
    admin = _admin(bootstrap, int(timeout * 1000))
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        missing = [name for name in wanted if name not in existing]
        report.existing = [name for name in wanted if name in existing]
        if missing:
            await _create(
                admin, {name: wanted[name] for name in missing}, replication_factor, prefix, durability, timeout, report
            )
        # so that producers and consumers started right after this call find every topic
        counts = await _partition_counts(admin, list(wanted), timeout)
        if missing_now := [name for name in wanted if name not in counts]:
            raise KafkaError(f"topics not available after {timeout:.0f}s: {', '.join(missing_now)}")
        await _raise_message_limits(admin, [n for n in report.existing if topic_configs(n, prefix)], prefix)
        to_grow = {n: NewPartitions(wanted[n]) for n in report.existing if counts[n] < wanted[n]}
        if to_grow:
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


async def _create(
    admin: AIOKafkaAdminClient,
    wanted: dict[str, int],
    replication_factor: int,
    prefix: str,
    durability: dict[str, str],
    timeout: float,
    report: TopicsReport,
) -> None:
    response = await admin.create_topics(
        [
            NewTopic(name, partitions, replication_factor, topic_configs={**topic_configs(name, prefix), **durability})
            for name, partitions in wanted.items()
        ],
        timeout_ms=int(timeout * 1000),
    )
    for topic_error in response.topic_errors:
        name, code = topic_error[0], topic_error[1]
        message = topic_error[2] if len(topic_error) > 2 else None
        if code == 0:
            report.created.append(name)
        elif code == TopicAlreadyExistsError.errno:
            report.existing.append(name)
        else:
            raise for_code(code)(f"could not create topic {name}: {message}")


async def _raise_message_limits(admin: AIOKafkaAdminClient, names: list[str], prefix: str) -> None:
    if not names:
        return
    described = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, n) for n in names])
    for response in described:
        for _code, _msg, _type, name, entries in response.resources:
            # AlterConfigs replaces a topic's settings: keep those set on it (v0: not default; v1+: source 1, the topic)
            current = {
                e[0]: e[1]
                for e in entries
                if not e[2] and e[1] is not None and ((e[3] == 1) if response.API_VERSION >= 1 else not e[3])
            }
            limit = int({e[0]: e[1] for e in entries}.get("max.message.bytes") or 0)
            if limit < DEAD_LETTER_MAX_BYTES:
                await admin.alter_configs(
                    [ConfigResource(ConfigResourceType.TOPIC, name, {**current, **topic_configs(name, prefix)})]
                )
                log.info("raised max.message.bytes of %s to %d", name, DEAD_LETTER_MAX_BYTES)


async def wait_for_topics(kafka: KafkaClients | str, names: list[str], timeout: float) -> dict[str, int]:
    """Poll until every topic has leaders as this principal sees them; after `timeout` the error code of each still
    away (3: no such topic, 29: not authorized: a topic it may not describe stays away whether it exists or not)."""
    admin, deadline = _admin(kafka, request_timeout_ms=10000), time.monotonic() + timeout
    await admin.start()
    try:
        while True:
            described = await admin.describe_topics(names)
            led = [t for t in described if t["partitions"] and all(p["leader"] >= 0 for p in t["partitions"])]
            away = {t["topic"]: t["error_code"] for t in described if t["error_code"] or t not in led}
            if not away or time.monotonic() > deadline:
                return away
            await asyncio.sleep(1.0)  # poll interval: the setup job making the ACLs and the topics
    finally:
        await admin.close()


@dataclass
class PartitionLag:
    topic: str
    partition: int
    committed: int | None
    start: int  # where a group without a commit begins (auto_offset_reset=earliest)
    end: int

    @property
    def lag(self) -> int:
        position = self.start if self.committed is None else max(self.committed, self.start)
        return max(0, self.end - position)


@dataclass
class GroupMember:
    member_id: str
    client_id: str
    host: str
    partitions: list[tuple[str, int]]


@dataclass
class GroupLag:
    group: str
    state: str  # Dead: never existed or expired
    partitions: list[PartitionLag] = field(default_factory=list)
    members: list[GroupMember] = field(default_factory=list)

    @property
    def lag(self) -> int:
        return sum(p.lag for p in self.partitions)

    def as_dict(self) -> dict[str, Any]:
        return {
            "group": self.group,
            "state": self.state,
            "lag": self.lag,
            "partitions": [
                {
                    "topic": p.topic,
                    "partition": p.partition,
                    "committed": p.committed,
                    "start": p.start,
                    "end": p.end,
                    "lag": p.lag,
                }
                for p in self.partitions
            ],
            "members": [
                {
                    "member_id": m.member_id,
                    "client_id": m.client_id,
                    "host": m.host,
                    "partitions": [{"topic": t, "partition": n} for t, n in m.partitions],
                }
                for m in self.members
            ],
        }


def _decode_members(members: list[Any], protocol_type: str, wire: set[str]) -> tuple[list[GroupMember], set[str]]:
    from aiokafka.coordinator.protocol import ConsumerProtocolMemberAssignment, ConsumerProtocolMemberMetadata

    decoded, subscribed = [], set()
    for member_id, client_id, host, metadata, assignment in (m[:5] for m in members):
        partitions: list[tuple[str, int]] = []
        if protocol_type == "consumer":
            if assignment:
                partitions = sorted(
                    (tp.topic, tp.partition) for tp in ConsumerProtocolMemberAssignment.decode(assignment).partitions()
                )
            if metadata:
                subscribed |= set(ConsumerProtocolMemberMetadata.decode(metadata).subscription) & wire
        decoded.append(GroupMember(member_id, client_id, host.lstrip("/"), [tp for tp in partitions if tp[0] in wire]))
    return sorted(decoded, key=lambda m: (m.client_id, m.member_id)), subscribed


async def _retrying(call: Callable[[], Awaitable[Any]], timeout: float) -> Any:
    """Retry a group request while the coordinator is not there (a new cluster makes __consumer_offsets first)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return await call()
        except KafkaError as exc:
            if not getattr(exc, "retriable", False) or time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


LAG_TIMEOUT_S = 10.0  # per admin request of `roundtrip lag`


async def consumer_lag(bootstrap: KafkaClients | str, prefix: str, group: str | None) -> list[GroupLag]:
    """Lag per partition and members of the fleet's groups on `prefix`'s topics (another fleet's are not shown).
    The topology's groups are shown even before they exist: a group that never committed lags from the log's start.
    """
    timeout = LAG_TIMEOUT_S
    from aiokafka import TopicPartition

    wire = {prefix + name for name in topology.topic_names()}
    fleet_groups, ours = topology.groups(prefix), f"{prefix}roundtrip-"
    admin = _admin(bootstrap, int(timeout * 1000))
    consumer = None
    await admin.start()
    try:
        consumer = clients_of(bootstrap).consumer(enable_auto_commit=False, request_timeout_ms=int(timeout * 1000))
        await consumer.start()
        listed = {g[0] for g in await admin.list_consumer_groups() if str(g[0]).startswith(ours)}
        names = sorted(set(fleet_groups) | listed)
        if group is not None:
            names = [n for n in names if group in (n, n.removeprefix(prefix), n.removeprefix(ours))] or [group]
        described = await _describe_groups(admin, names, wire, timeout)
        committed = dict(
            zip(
                names,
                await _retrying(
                    lambda: asyncio.gather(*(admin.list_consumer_group_offsets(n) for n in names)), timeout
                ),
                strict=True,
            )
        )
        topics_of = {name: _topics_of(name, committed, described, wire, fleet_groups, prefix) for name in names}
        all_topics = sorted(set().union(*topics_of.values())) if topics_of else []
        partitions = [
            TopicPartition(t["topic"], p["partition"])
            for t in (await admin.describe_topics(all_topics) if all_topics else [])
            if t["error_code"] == 0
            for p in t["partitions"]
        ]
        starts = await consumer.beginning_offsets(partitions) if partitions else {}
        ends = await consumer.end_offsets(partitions) if partitions else {}
    finally:
        if consumer is not None:
            await consumer.stop()
        await admin.close()
    report = []
    for name in names:
        state, members, _ = described.get(name, ("Dead", [], set()))
        rows = []
        for tp in sorted(partitions):
            if tp.topic in topics_of[name]:
                meta = committed[name].get(tp)
                offset = meta.offset if meta is not None and meta.offset >= 0 else None
                rows.append(PartitionLag(tp.topic, tp.partition, offset, starts[tp], ends[tp]))
        report.append(GroupLag(name, state, rows, members))
    return report


def _topics_of(
    name: str,
    committed: dict[str, dict[Any, Any]],
    described: dict[str, tuple[str, list[GroupMember], set[str]]],
    wire: set[str],
    fleet_groups: dict[str, str],
    prefix: str,
) -> set[str]:
    _, members, subscribed = described.get(name, ("", [], set()))
    mine = {tp.topic for tp in committed[name] if tp.topic in wire} | subscribed
    mine |= {t for m in members for t, _ in m.partitions}
    if name in fleet_groups:
        mine.add(prefix + fleet_groups[name])
    return mine


async def _describe_groups(
    admin: AIOKafkaAdminClient, names: list[str], wire: set[str], timeout: float
) -> dict[str, tuple[str, list[GroupMember], set[str]]]:
    described: dict[str, tuple[str, list[GroupMember], set[str]]] = {}
    # one group per request: aiokafka misreads a DescribeGroups response that carries several groups
    responses = await _retrying(lambda: asyncio.gather(*(admin.describe_consumer_groups([n]) for n in names)), timeout)
    for response in (r for rs in responses for r in rs):
        for error_code, name, state, protocol_type, _protocol, members, *_ in response.groups:
            members_of, subscribed = _decode_members(members, protocol_type, wire) if error_code == 0 else ([], set())
            described[name] = (state if error_code == 0 else f"error {error_code}", members_of, subscribed)
    return described
