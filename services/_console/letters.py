"""Dead letters in the console: re-drive one to its source topic once, or discard it once.

Each re-drive or discard is first a claim on roundtrip.dead_letters.handled, read back with the letters by the kernel's
DeadLetterReader: a console that reads its own claim behind another's sends nothing. A re-drive publishes only the
original record: read back from the source topic, partition and offset the letter names, and only when it is, byte for
byte, the copy the page showed (value, key, headers), so its ids and trace context go with it and the services' dedupe
holds. Only to a topic the letter's service consumes, whatever a dead letter says. docs/console.md has the whole story.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from pydantic import BaseModel

from roundtrip._console.decisions import Refused
from roundtrip._kernel.kafka.dead_letters import (
    PAST,
    REDRIVE,
    RELEASE,
    DeadLetterReader,
    Letter,
    LettersAway,
    Record,
    copy_of,
    read_record,
)
from roundtrip._kernel.kafka.faststream_seam import kafka_producer
from roundtrip._kernel.settings import Settings
from roundtrip._kernel.wire import topics, topology
from roundtrip._kernel.wire.letters import DeadLettered, DeadLetterHandled

log = logging.getLogger("roundtrip.console")
security = logging.getLogger("roundtrip.security")

LETTERS_KEPT = 500  # the newest dead letters the page can show and act on
PUBLISH_TIMEOUT_S = 10.0
SendHandled = Callable[[BaseModel, str], Awaitable[None]]  # an Outlet of roundtrip.dead_letters.handled
# topic, value, key, headers
SendRaw = Callable[[str, bytes | None, bytes | None, list[tuple[str, bytes]]], Awaitable[None]]
ReadRecord = Callable[[str, int, int], Awaitable[Record | None]]  # topic, partition, offset: the record there, or None


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
    """The dead-lettered record as the letter's lossless copies say (ValueError when they are not base64)."""
    record = copy_of(letter)
    return record.value or b"", record.key, record.headers


def readable_differs(letter: DeadLettered) -> str | None:
    """What of the letter's readable copy is not its lossless copy (both written from one record by the fleet)."""
    value, key, _ = original(letter)
    if letter.payload != value[:100_000].decode("utf-8", errors="replace"):
        return "its readable copy of the record is not its lossless copy"
    if (key is None) != (letter.key is None) or (key is not None and letter.key != key.decode("utf-8", "replace")):
        return "its readable key is not its lossless key"
    return None


def differences(letter: DeadLettered, record: Record) -> list[str]:
    """What of the record Kafka keeps at the letter's place is not the letter's copy: [] when it is the same."""
    value, key, headers = original(letter)
    named = (("value", value, record.value or b""), ("key", key, record.key), ("headers", headers, record.headers))
    return [name for name, copied, kept in named if copied != kept]


def source_refusal(wanted: str, item: Letter, prefix: str) -> Refused | None:
    """Why the letter may not name its source topic: each service's letters name only a topic that service consumes."""
    assert item.letter is not None
    service = item.topic_of or item.letter.service  # the shared topic of older fleets: only the letter's own word
    if item.topic_of and item.letter.service != item.topic_of:
        return Refused(
            f"dead letter {wanted} is on {item.topic_of}'s dead letters but says {item.letter.service!r} refused it: "
            "it can only be discarded"
        )
    if item.letter.topic not in {topics.t(name, prefix) for name in topology.consumed_by(service)}:
        return Refused(
            f"dead letter {wanted} came from {item.letter.topic!r}, which {service!r} does not consume: it can only "
            "be discarded"
        )
    if item.letter.partition is None or item.letter.offset is None:
        return Refused(f"dead letter {wanted} names no partition and offset of its record: it can only be discarded")
    return None


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
    if named := source_refusal(wanted, item, prefix):
        return named
    try:
        forged = readable_differs(item.letter)
    except ValueError as exc:
        return Refused(f"dead letter {wanted}: {exc}: it can only be discarded")
    if forged:
        return Refused(f"dead letter {wanted}: {forged}, as the fleet never writes one: it can only be discarded")
    return None


def raw_sender(broker: Any) -> SendRaw:
    """Publish a record's bytes as they are, on the console's producer (the broker's), and wait for the ack."""

    async def send(topic: str, value: bytes | None, key: bytes | None, headers: list[tuple[str, bytes]]) -> None:
        await (await kafka_producer(broker).send(topic, value, key=key, headers=headers))

    return send


class Letters:
    """The dead letters as the console shows them, and their re-drive and discard."""

    def __init__(self, settings: Settings, send_handled: SendHandled, send_raw: SendRaw) -> None:
        self.settings, self.prefix = settings, settings.topic_prefix
        self.send_handled, self.send_raw = send_handled, send_raw
        self.read: ReadRecord = lambda topic, partition, offset: read_record(settings, topic, partition, offset)
        self.reader = DeadLetterReader(settings, LETTERS_KEPT, "roundtrip-console-letters")
        self._reading = asyncio.Lock()
        self._acting = asyncio.Lock()
        self.last_error: str | None = None

    @property
    def letters(self) -> dict[str, Letter]:
        return self.reader.letters

    @property
    def handled(self) -> dict[str, DeadLetterHandled]:
        return self.reader.handled

    async def close(self) -> None:
        await self.reader.close()

    async def refresh(self) -> None:
        """Read both topics to their end (LettersAway when Kafka cannot be read; the next call starts again)."""
        async with self._reading:
            try:
                await self.reader.read()
            except LettersAway as exc:
                if str(exc) != self.last_error:
                    log.warning("%s", exc)
                self.last_error = str(exc)
                raise
            self.last_error = None

    def listed(self) -> list[tuple[Letter, DeadLetterHandled | None]]:
        """The letters read, those waiting first, the newest first within each."""
        newest = self.reader.tail()[::-1]
        return [pair for pair in newest if pair[1] is None] + [pair for pair in newest if pair[1] is not None]

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
            kept = await self._original(wanted, item) if action == REDRIVE else None
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
                if kept is not None:
                    assert item.letter is not None  # refusal() refuses a re-drive of anything else
                    send = self.send_raw(item.letter.topic, kept.value, kept.key, kept.headers)
                    await asyncio.wait_for(send, PUBLISH_TIMEOUT_S)
            except Refused:
                raise
            except BaseException:
                await self._release(claim)
                raise
            return item, claim

    async def _original(self, wanted: str, item: Letter) -> Record:
        """The record the letter names, as Kafka keeps it: Refused when it is gone or is not the letter's copy."""
        letter = item.letter
        assert letter is not None and letter.partition is not None and letter.offset is not None  # refusal()
        place = f"{letter.topic}[{letter.partition}]@{letter.offset}"
        kept = await self.read(letter.topic, letter.partition, letter.offset)
        if kept is None:
            raise Refused(
                f"dead letter {wanted}: its record {place} is no longer on Kafka (retention) or never was: nothing "
                "re-driven; it can only be discarded"
            )
        if differing := differences(letter, kept):
            security.warning(
                "dead letter %r refused: its copy is not the record %s (%s differ); its service's credentials may "
                "be in other hands",
                wanted,
                place,
                ", ".join(differing),
            )
            raise Refused(
                f"dead letter {wanted}: its copy is not the record at {place} ({', '.join(differing)} differ): nothing "
                "re-driven; it can only be discarded"
            )
        return kept

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
