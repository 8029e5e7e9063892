"""The newest dead letters of every service (roundtrip.dead_letters.by.<service>, and the shared
roundtrip.dead_letters of older fleets), each with how a person handled it (roundtrip.dead_letters.handled); and the
record a letter names, read back from its source topic.

The handled topic has one partition, read from its start: the first claim of a letter wins, and only a release of that
very claim frees the letter again."""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import logging
from dataclasses import dataclass
from typing import Any

from aiokafka import TopicPartition
from pydantic import ValidationError

from roundtrip._kernel.kafka.admin import DEAD_LETTER_MAX_BYTES
from roundtrip._kernel.kafka.aiokafka_seam import partitions_of
from roundtrip._kernel.kafka.clients import kafka_clients
from roundtrip._kernel.settings import Settings
from roundtrip._kernel.wire import topics, topology
from roundtrip._kernel.wire.letters import DeadLettered, DeadLetterHandled

log = logging.getLogger("roundtrip.dead_letters")

REDRIVE, DISCARD, RELEASE = "redrive", "discard", "release"
PAST = {REDRIVE: "re-driven", DISCARD: "discarded"}
READ_TIMEOUT_S = 10.0


class LettersAway(Exception):
    """The dead letters could not be read from Kafka: `str(exc)` says why, in one line."""


@dataclass(frozen=True)
class Letter:
    """One dead letter: `letter` None when it is no DeadLettered (then `raw` is its text)."""

    id: str  # letter_id(): where it is
    at: float  # when it was dead-lettered (the record's timestamp)
    letter: DeadLettered | None
    raw: str = ""
    topic_of: str = ""  # the service whose topic it is on, which alone could write it; "" on the shared topic

    @property
    def reason(self) -> str:
        return self.letter.reason if self.letter else "not a dead letter the fleet wrote (unreadable record)"


@dataclass(frozen=True)
class Record:
    """A Kafka record as it is: what a re-drive publishes."""

    value: bytes | None
    key: bytes | None
    headers: list[tuple[str, bytes]]


def letter_id(partition: int, offset: int, service: str) -> str:
    """`<service>-<partition>-<offset>` on the service's topic; `<partition>-<offset>` on the shared one (as before)."""
    return f"{service}-{partition}-{offset}" if service else f"{partition}-{offset}"


def parse_letter(partition: int, offset: int, timestamp_ms: int | None, value: bytes | None, service: str) -> Letter:
    at, lid = (timestamp_ms or 0) / 1000, letter_id(partition, offset, service)
    try:
        return Letter(lid, at, DeadLettered.model_validate_json(value or b""), topic_of=service)
    except ValidationError:
        return Letter(lid, at, None, (value or b"")[:100_000].decode("utf-8", "replace"), topic_of=service)


def copy_of(letter: DeadLettered) -> Record:
    """The record as the letter's lossless copies say it was (ValueError when they are not base64)."""
    try:
        value = base64.b64decode(letter.payload_base64, validate=True)
        key = base64.b64decode(letter.key_base64, validate=True) if letter.key_base64 is not None else None
        headers = [(h["key"], base64.b64decode(h.get("value_base64", ""), validate=True)) for h in letter.headers]
    except (binascii.Error, KeyError) as exc:
        raise ValueError(f"its copy of the record is not valid base64 ({exc})") from None
    return Record(value, key, headers)


async def read_record(settings: Settings, topic: str, partition: int, offset: int) -> Record | None:
    """The record at `offset` of `topic`'s `partition` as Kafka keeps it, committed records only; None when it is not
    there (retention passed it, an aborted transaction's, never written). LettersAway when Kafka cannot be read."""
    consumer = kafka_clients(settings).consumer(
        client_id="roundtrip-console-original",
        enable_auto_commit=False,
        isolation_level="read_committed",
        max_partition_fetch_bytes=DEAD_LETTER_MAX_BYTES,
        fetch_max_bytes=DEAD_LETTER_MAX_BYTES,
    )
    try:
        return await asyncio.wait_for(_read_one(consumer, topic, partition, offset), READ_TIMEOUT_S)
    except Exception as exc:  # noqa: BLE001 - Kafka away: said in one line
        why = f"{type(exc).__name__}: {exc}"
        raise LettersAway(f"the record {topic}[{partition}]@{offset} cannot be read from Kafka ({why})"[:400]) from None
    finally:
        with contextlib.suppress(Exception):
            await consumer.stop()


async def _read_one(consumer: Any, topic: str, partition: int, offset: int) -> Record | None:
    await consumer.start()
    tp = TopicPartition(topic, partition)
    if tp not in await partitions_of(consumer, [topic]):
        return None
    consumer.assign([tp])
    first, end = (await consumer.beginning_offsets([tp]))[tp], (await consumer.end_offsets([tp]))[tp]
    if not first <= offset < end:
        return None
    consumer.seek(tp, offset)
    while await consumer.position(tp) < end:
        for record in (await consumer.getmany(tp, timeout_ms=500)).get(tp, []):
            if record.offset >= offset:  # past it: it was an aborted transaction's, which read_committed skips
                return Record(record.value, record.key, list(record.headers)) if record.offset == offset else None
    return None


def apply(handled: dict[str, DeadLetterHandled], record: DeadLetterHandled) -> None:
    """Fold one record of roundtrip.dead_letters.handled (in the topic's order) into letter id -> its winning claim."""
    current = handled.get(record.letter_id)
    if record.action == RELEASE:
        if current is not None and current.claim == record.claim:
            del handled[record.letter_id]
    elif current is None:
        handled[record.letter_id] = record


class DeadLetterReader:
    """The last `keep` dead letters and every handling, read with no consumer group; `read()` goes on from the last."""

    def __init__(self, settings: Settings, keep: int, client_id: str, timeout_s: float = READ_TIMEOUT_S) -> None:
        self.settings, self.keep, self.client_id, self.timeout_s = settings, keep, client_id, timeout_s
        prefix = settings.topic_prefix
        # topic -> the service whose letters it holds ("" for the shared topic of older fleets, read when it exists)
        self.dead_topics = {
            topics.t(t, prefix): topics.dead_letters_service(t) or "" for t in topology.dead_letter_topics()
        }
        self.shared_topic = topics.t(topics.DEAD_LETTERS, prefix)
        self.handled_topic = topics.t(topics.DEAD_LETTERS_HANDLED, prefix)
        self.letters: dict[str, Letter] = {}  # oldest first, at most `keep`
        self.handled: dict[str, DeadLetterHandled] = {}  # letter id -> the claim that handled it
        self._consumer: Any = None

    def tail(self) -> list[tuple[Letter, DeadLetterHandled | None]]:
        """The letters read, oldest first, each with its handling (None while it waits)."""
        return [(item, self.handled.get(item.id)) for item in self.letters.values()]

    async def read(self) -> None:
        """Read both topics to their end (LettersAway when Kafka cannot be read; the next call starts again)."""
        try:
            await asyncio.wait_for(self._read_to_end(), self.timeout_s)
        except Exception as exc:  # noqa: BLE001 - Kafka away: said in one line, the next read starts again
            reason = exc if isinstance(exc, LettersAway) else f"{type(exc).__name__}: {exc}"
            await self.close()
            message = f"the dead letters cannot be read from Kafka: {reason}"
            raise LettersAway(message[:400]) from None
        finally:
            self._trim()

    async def close(self) -> None:
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            with contextlib.suppress(Exception):
                await consumer.stop()

    async def _open(self) -> Any:
        consumer = kafka_clients(self.settings).consumer(
            client_id=self.client_id,
            enable_auto_commit=False,
            auto_offset_reset="earliest",  # a position the retention passed starts again at what is kept
            max_partition_fetch_bytes=DEAD_LETTER_MAX_BYTES,
            fetch_max_bytes=2 * DEAD_LETTER_MAX_BYTES,
        )
        try:
            await consumer.start()
            needed = [*self.dead_topics, self.handled_topic]
            found = await partitions_of(consumer, [*needed, self.shared_topic])
            missing = set(needed) - {tp.topic for tp in found}
            if missing:
                raise LettersAway(
                    f"no topic {', '.join(sorted(missing))}: create the fleet's topics (roundtrip topics create)"
                )
            consumer.assign(found)
            dead = [tp for tp in found if tp.topic != self.handled_topic]
            ends = await consumer.end_offsets(dead)
            for tp in dead:
                consumer.seek(tp, max(0, ends[tp] - self.keep))
            await consumer.seek_to_beginning(*[tp for tp in found if tp.topic == self.handled_topic])
        except BaseException:
            with contextlib.suppress(Exception):
                await consumer.stop()
            raise
        self.letters, self.handled = {}, {}
        return consumer

    async def _read_to_end(self) -> None:
        if self._consumer is None:
            self._consumer = await self._open()
        consumer = self._consumer
        partitions = list(consumer.assignment())
        ends = await consumer.end_offsets(partitions)
        while any([await consumer.position(tp) < ends[tp] for tp in partitions]):
            for tp, records in (await consumer.getmany(*partitions, timeout_ms=500)).items():
                for record in records:
                    self._take(tp.topic, record)

    def _take(self, topic: str, record: Any) -> None:
        if topic != self.handled_topic:
            service = self.dead_topics.get(topic, "")
            item = parse_letter(record.partition, record.offset, record.timestamp, record.value, service)
            self.letters[item.id] = item
            return
        try:
            apply(self.handled, DeadLetterHandled.model_validate_json(record.value or b""))
        except ValidationError:
            log.warning("%s[%d]@%d is no DeadLetterHandled: ignored", topic, record.partition, record.offset)

    def _trim(self) -> None:
        ordered = sorted(self.letters.values(), key=lambda item: item.at)[-self.keep :] if self.keep > 0 else []
        self.letters = {item.id: item for item in ordered}
