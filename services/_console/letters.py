"""Dead letters in the console: read them, re-drive one to its source topic once, or discard it once.

What was handled is remembered in Kafka: each re-drive or discard is first a claim on roundtrip.dead_letters.handled
(one partition, keyed by the letter's id), read from its start by every replica. The single partition orders the
claims: the first claim of a letter wins, and a console that reads back its own claim behind another sends nothing.
A re-drive publishes the original record unchanged, its ids and trace context included, so the services' dedupe holds,
and only to a topic a service of the fleet consumes, whatever a dead letter says. docs/console.md has the whole story.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

from roundtrip._console.decisions import Refused
from roundtrip._kernel.kafka.admin import DEAD_LETTER_MAX_BYTES
from roundtrip._kernel.kafka.aiokafka_seam import partitions_of
from roundtrip._kernel.kafka.clients import kafka_clients
from roundtrip._kernel.kafka.faststream_seam import kafka_producer
from roundtrip._kernel.settings import Settings
from roundtrip._kernel.wire import topics, topology
from roundtrip._kernel.wire.events import DeadLettered, DeadLetterHandled

log = logging.getLogger("roundtrip.console")

REDRIVE, DISCARD, RELEASE = "redrive", "discard", "release"
PAST = {REDRIVE: "re-driven", DISCARD: "discarded"}
LETTERS_KEPT = 500  # the newest dead letters the page can show and act on
READ_TIMEOUT_S = 10.0
PUBLISH_TIMEOUT_S = 10.0
SendHandled = Callable[[BaseModel, str], Awaitable[None]]  # an Outlet of roundtrip.dead_letters.handled
SendRaw = Callable[[str, bytes, bytes | None, list[tuple[str, bytes]]], Awaitable[None]]  # topic, value, key, headers


class LettersAway(Exception):
    """The dead letters could not be read from Kafka: `str(exc)` says why, in one line (shown on the page)."""


@dataclass(frozen=True)
class Letter:
    """One record of roundtrip.dead_letters: `letter` None when it is no DeadLettered (then `raw` is its text)."""

    id: str  # "<partition>-<offset>" on roundtrip.dead_letters
    at: float  # when it was dead-lettered (the record's timestamp)
    letter: DeadLettered | None
    raw: str = ""

    @property
    def reason(self) -> str:
        return self.letter.reason if self.letter else "not a dead letter the fleet wrote (unreadable record)"


def letter_id(partition: int, offset: int) -> str:
    return f"{partition}-{offset}"


def parse_letter(partition: int, offset: int, timestamp_ms: int | None, value: bytes | None) -> Letter:
    at = (timestamp_ms or 0) / 1000
    try:
        return Letter(letter_id(partition, offset), at, DeadLettered.model_validate_json(value or b""))
    except ValidationError:
        return Letter(letter_id(partition, offset), at, None, (value or b"")[:100_000].decode("utf-8", "replace"))


def apply(handled: dict[str, DeadLetterHandled], record: DeadLetterHandled) -> None:
    """Fold one record of roundtrip.dead_letters.handled (in the topic's order) into letter id -> its winning claim."""
    current = handled.get(record.letter_id)
    if record.action == RELEASE:
        if current is not None and current.claim == record.claim:
            del handled[record.letter_id]
    elif current is None:
        handled[record.letter_id] = record


def kind_of(reason: str) -> str:
    """What a reason is, for counting: its words before the first colon."""
    head = reason.split(":", 1)[0].strip()
    return head[:80] or "(no reason)"


def counts(letters: Iterable[Letter], handled: dict[str, DeadLetterHandled]) -> list[tuple[str, int, int]]:
    """(kind of reason, waiting, handled) for each kind, the most waiting first."""
    by_kind: dict[str, list[int]] = {}
    for item in letters:
        tally = by_kind.setdefault(kind_of(item.reason), [0, 0])
        tally[1 if item.id in handled else 0] += 1
    return sorted(((k, w, h) for k, (w, h) in by_kind.items()), key=lambda c: (-c[1], -c[2], c[0]))


def original(letter: DeadLettered) -> tuple[bytes, bytes | None, list[tuple[str, bytes]]]:
    """The dead-lettered record as it was: its value, key and headers (ValueError when its copies are not base64)."""
    try:
        value = base64.b64decode(letter.payload_base64, validate=True)
        key = base64.b64decode(letter.key_base64, validate=True) if letter.key_base64 is not None else None
        headers = [(h["key"], base64.b64decode(h.get("value_base64", ""), validate=True)) for h in letter.headers]
    except (binascii.Error, KeyError) as exc:
        raise ValueError(f"its copy of the record is not valid base64 ({exc})") from None
    return value, key, headers


def refusal(
    wanted: str,
    action: str,
    item: Letter | None,
    handling: DeadLetterHandled | None,
    prefix: str,
) -> Refused | None:
    """Why dead letter `wanted` cannot be re-driven (or discarded) now; None when it can."""
    if item is None:
        return Refused(f"no dead letter {wanted} among the newest {LETTERS_KEPT}: nothing done", 404)
    if handling is not None:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(handling.at))
        return Refused(
            f"dead letter {wanted} was already {PAST.get(handling.action, handling.action)} by {handling.by} at "
            f"{when}: nothing done"
        )
    if action != REDRIVE:
        return None
    if item.letter is None:
        return Refused(f"dead letter {wanted} is no record the fleet dead-lettered: it can only be discarded")
    if not item.letter.payload_base64:
        return Refused(f"dead letter {wanted} keeps no lossless copy of its record: it can only be discarded")
    if item.letter.topic not in {topics.t(name, prefix) for name in topology.redrive_topics()}:
        return Refused(
            f"dead letter {wanted} came from {item.letter.topic!r}, which no service of this fleet consumes: it can "
            "only be discarded"
        )
    try:
        original(item.letter)
    except ValueError as exc:
        return Refused(f"dead letter {wanted}: {exc}: it can only be discarded")
    return None


def raw_sender(broker: Any) -> SendRaw:
    """Publish a record's bytes as they are, on the console's producer (the broker's), and wait for the ack."""

    async def send(topic: str, value: bytes, key: bytes | None, headers: list[tuple[str, bytes]]) -> None:
        await (await kafka_producer(broker).send(topic, value, key=key, headers=headers))

    return send


class Letters:
    """The dead letters as the console shows them, and their re-drive and discard."""

    def __init__(self, settings: Settings, send_handled: SendHandled, send_raw: SendRaw) -> None:
        self.settings, self.prefix = settings, settings.topic_prefix
        self.send_handled, self.send_raw = send_handled, send_raw
        self.dead_topic = topics.t(topics.DEAD_LETTERS, self.prefix)
        self.handled_topic = topics.t(topics.DEAD_LETTERS_HANDLED, self.prefix)
        self.letters: dict[str, Letter] = {}  # oldest first, at most LETTERS_KEPT
        self.handled: dict[str, DeadLetterHandled] = {}  # letter id -> the claim that handled it
        self._consumer: Any = None
        self._reading = asyncio.Lock()
        self._acting = asyncio.Lock()
        self.last_error: str | None = None

    async def close(self) -> None:
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            with contextlib.suppress(Exception):
                await consumer.stop()

    async def _open(self) -> Any:
        consumer = kafka_clients(self.settings).consumer(
            client_id="roundtrip-console-letters",
            enable_auto_commit=False,
            auto_offset_reset="earliest",  # a position the retention passed starts again at what is kept
            max_partition_fetch_bytes=DEAD_LETTER_MAX_BYTES,
            fetch_max_bytes=2 * DEAD_LETTER_MAX_BYTES,
        )
        await consumer.start()
        try:
            found = await partitions_of(consumer, [self.dead_topic, self.handled_topic])
            missing = {self.dead_topic, self.handled_topic} - {tp.topic for tp in found}
            if missing:
                raise LettersAway(
                    f"no topic {', '.join(sorted(missing))}: create the fleet's topics (roundtrip topics create)"
                )
            consumer.assign(found)
            dead = [tp for tp in found if tp.topic == self.dead_topic]
            ends = await consumer.end_offsets(dead)
            for tp in dead:
                consumer.seek(tp, max(0, ends[tp] - LETTERS_KEPT))
            await consumer.seek_to_beginning(*[tp for tp in found if tp.topic == self.handled_topic])
        except BaseException:
            with contextlib.suppress(Exception):
                await consumer.stop()
            raise
        self.letters, self.handled = {}, {}
        return consumer

    async def refresh(self) -> None:
        """Read both topics to their end (LettersAway when Kafka cannot be read; the next call starts again)."""
        async with self._reading:
            try:
                await asyncio.wait_for(self._read_to_end(), READ_TIMEOUT_S)
            except Exception as exc:  # noqa: BLE001 - Kafka away: the page says so, the next read starts again
                reason = exc if isinstance(exc, LettersAway) else f"{type(exc).__name__}: {exc}"
                message = f"the dead letters cannot be read from Kafka ({self.dead_topic}): {reason}"[:400]
                if message != self.last_error:
                    log.warning("%s", message)
                self.last_error = message
                await self.close()
                raise LettersAway(message) from None
            self.last_error = None

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
        if topic == self.dead_topic:
            item = parse_letter(record.partition, record.offset, record.timestamp, record.value)
            self.letters[item.id] = item
            while len(self.letters) > LETTERS_KEPT:
                self.letters.pop(next(iter(self.letters)))
            return
        try:
            apply(self.handled, DeadLetterHandled.model_validate_json(record.value or b""))
        except ValidationError:
            log.warning("%s[%d]@%d is no DeadLetterHandled: ignored", topic, record.partition, record.offset)

    def listed(self) -> list[tuple[Letter, DeadLetterHandled | None]]:
        """The letters read, those waiting first, the newest first within each."""
        newest = list(reversed(self.letters.values()))
        return [(i, None) for i in newest if i.id not in self.handled] + [
            (i, self.handled[i.id]) for i in newest if i.id in self.handled
        ]

    async def act(self, wanted: str, action: str, by: str, note: str) -> tuple[Letter, DeadLetterHandled]:
        """Re-drive or discard dead letter `wanted` for `by`: Refused when it is unknown, handled already or cannot be
        re-driven; the publish's exception when the re-drive was not taken (the letter is released: it waits again)."""
        async with self._acting:  # one at a time here; replicas are ordered by the claims' topic
            await self.refresh()
            item = self.letters.get(wanted)
            refused = refusal(wanted, action, item, self.handled.get(wanted), self.prefix)
            if refused is not None:
                raise refused
            assert item is not None  # refusal() refuses an unknown letter
            claim = DeadLetterHandled(
                letter_id=wanted,
                action=action,
                claim=uuid.uuid4().hex,
                by=by,
                at=round(time.time(), 3),
                note=note,
                topic=item.letter.topic if item.letter and action == REDRIVE else "",
            )
            try:
                await asyncio.wait_for(self.send_handled(claim, wanted), PUBLISH_TIMEOUT_S)
                await self.refresh()
                winner = self.handled.get(wanted)
                if winner is None or winner.claim != claim.claim:
                    raise refusal(wanted, action, item, winner, self.prefix) or Refused(
                        f"dead letter {wanted}: this console's claim was not recorded: nothing done"
                    )
                if action == REDRIVE:
                    assert item.letter is not None  # refusal() refuses a re-drive of anything else
                    value, key, headers = original(item.letter)
                    await asyncio.wait_for(self.send_raw(item.letter.topic, value, key, headers), PUBLISH_TIMEOUT_S)
            except Refused:
                raise
            except BaseException:
                await self._release(claim)
                raise
            return item, claim

    async def _release(self, claim: DeadLetterHandled) -> None:
        """Free the letter of a claim whose re-drive was not published."""
        release = claim.model_copy(update={"action": RELEASE, "at": round(time.time(), 3)})
        try:
            await asyncio.wait_for(self.send_handled(release, claim.letter_id), PUBLISH_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 - said in the log: the letter stays marked, though nothing was sent
            log.error(
                "dead letter %s: the release of claim %s was not published either (%s: %s); it stays marked %s",
                claim.letter_id,
                claim.claim,
                type(exc).__name__,
                exc,
                PAST.get(claim.action, claim.action),
            )
