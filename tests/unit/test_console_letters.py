"""Dead letters in the console (services/_console/letters.py, read by services/_kernel/kafka/dead_letters.py), over an
in-memory log of the services' dead letters, roundtrip.dead_letters.handled and the records the letters name: a dead
letter is re-driven to its source topic once and as Kafka keeps it (value, key, headers), a second re-drive is refused
here, by another replica and after a restart; the first claim wins a race and the loser sends nothing; a re-drive
Kafka did not take waits again; only a topic the letter's service consumes is written, and only the record at the
letter's place when it is the letter's copy; the page shows the bytes a re-drive publishes, as text; the reader keeps
the newest letters by time. The real broker and browser: tests/e2e/test_console_e2e.py."""

from __future__ import annotations

import base64
import html
import json
import logging
import re
import uuid
from types import SimpleNamespace

import httpx
import pytest

from roundtrip._console import letter_pages, letters
from roundtrip._console.auth import Identity
from roundtrip._console.ledger_reader import Books
from roundtrip._console.letters import Letters
from roundtrip._console.web import Console, application
from roundtrip._kernel.kafka import dead_letters
from roundtrip._kernel.kafka.dead_letters import DeadLetterReader
from roundtrip._kernel.kafka.messaging import dead_letter_of
from roundtrip._kernel.settings import Settings
from roundtrip._kernel.wire import topics, topology
from roundtrip._kernel.wire.letters import DeadLettered, DeadLetterHandled
from roundtrip._kernel.wire.topology import SERVICES

ME = "tester@unit"
BATCH = b'{"turn": {"turn_id": "turn_1"}, "step": 1, "calls": []}'
HEADERS = [("traceparent", b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"), ("raw", b"\xff\x00")]


class Log:
    """The dead letters and their handling as Kafka keeps them (one partition each), shared by every console reading
    them, and the source topics' records the letters name."""

    def __init__(self) -> None:
        self.dead: list[tuple[str, bytes]] = []  # (the service whose topic it is on, "" the shared one; the letter)
        self.sources: dict[tuple[str, int, int], dead_letters.Record] = {}
        self.handled: list[bytes] = []
        self.redriven: list[tuple[str, bytes, bytes | None, list[tuple[str, bytes]]]] = []
        self.away = False  # Kafka takes no re-drive
        self.rival: str | None = None  # another replica's claim lands just before the next one
        self.stamps: dict[int, int] = {}  # a dead letter's timestamp (ms) by its offset, when not the default

    def dead_letter(
        self, topic: str, value: bytes, key: bytes | None, reason: str, headers=HEADERS, service: str | None = None
    ) -> str:
        """The letter of a record the service consuming `topic` refused, on that service's topic; the record is kept."""
        service = service or next((s.name for s in SERVICES if topic in topology.consumed_by(s.name)), "executor")
        record = SimpleNamespace(topic=topic, partition=2, offset=40 + len(self.dead), value=value, key=key)
        record.headers = headers
        self.sources[topic, 2, record.offset] = dead_letters.Record(value, key, list(headers))
        self.dead.append((service, dead_letter_of(service, record, reason).model_dump_json().encode()))
        return dead_letters.letter_id(0, len(self.dead) - 1, service)


class LogReader(DeadLetterReader):
    """The dead-letter reader over `log` instead of Kafka."""

    def __init__(self, settings: Settings, log: Log, keep: int = letters.LETTERS_KEPT) -> None:
        super().__init__(settings, keep, "unit")
        self.log, self.seen = log, [0, 0]

    async def _read_to_end(self) -> None:
        by_service = {service: topic for topic, service in self.dead_topics.items()}
        for i in range(self.seen[0], len(self.log.dead)):
            stamp, (service, value) = self.log.stamps.get(i, 10**12), self.log.dead[i]
            topic = by_service[service] if service else self.shared_topic
            self._take(topic, SimpleNamespace(partition=0, offset=i, timestamp=stamp, value=value))
        for i in range(self.seen[1], len(self.log.handled)):
            self._take(self.handled_topic, SimpleNamespace(partition=0, offset=i, value=self.log.handled[i]))
        self.seen = [len(self.log.dead), len(self.log.handled)]


class Shelf(Letters):
    """Letters reading `log` instead of Kafka."""

    def __init__(self, settings: Settings, log: Log) -> None:
        super().__init__(settings, self._claim, self._redrive)
        self.log, self.reader, self.read = log, LogReader(settings, log), self._read

    async def _claim(self, message, key: str) -> None:
        if self.log.rival and message.action != dead_letters.RELEASE:
            rival = message.model_copy(update={"claim": uuid.uuid4().hex, "by": self.log.rival})
            self.log.handled.append(rival.model_dump_json().encode())
            self.log.rival = None
        assert key == message.letter_id  # keyed by the letter
        self.log.handled.append(message.model_dump_json().encode())

    async def _read(self, topic: str, partition: int, offset: int) -> dead_letters.Record | None:
        return self.log.sources.get((topic, partition, offset))

    async def _redrive(self, topic, value, key, headers) -> None:
        if self.log.away:
            raise ConnectionError("Kafka is away")
        self.log.redriven.append((topic, value, key, headers))


def settings() -> Settings:
    return Settings(_env_file=None, env="development", console_local_user=ME, console_secure_cookies=False)


async def signed_in(log: Log) -> tuple[httpx.AsyncClient, str]:
    """A console (a new replica, or one just restarted: it reads the log from the start) and its CSRF token."""
    s = settings()
    console = Console(s, Books("sqlite+aiosqlite:///nowhere/ledger.db", None), _never, _never)
    app = application(console, letter_pages.routes(console, Shelf(s, log)))
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://testserver")
    page = await http.get("/dead-letters")
    assert page.status_code == 200, page.text
    return http, http.cookies["roundtrip_csrf"]


async def _never(message, key) -> None:
    raise AssertionError("no decision or cancel is sent from the dead letters")


@pytest.fixture
def log() -> Log:
    return Log()


async def test_a_dead_letter_is_re_driven_once_to_its_topic_as_it_was(log, caplog):
    caplog.set_level(logging.INFO, logger="roundtrip.audit")
    wanted = log.dead_letter(topics.TOOL_BATCHES, BATCH, b"conv_1", "SignatureInvalid: unknown key id 'k2'")
    http, token = await signed_in(log)
    page = (await http.get("/dead-letters/live")).text
    assert f'data-letter="{wanted}"' in page and "unknown key id" in page and "conv_1" in page
    assert "turn.tool_batches" in page and "traceparent" in page and "Re-drive" in page
    assert "<td>SignatureInvalid</td><td>1</td><td>0</td>" in page  # counted per reason

    answer = await http.post(f"/dead-letters/{wanted}/redrive", data={"csrf": token, "reason": "keys fixed"})
    assert answer.status_code == 303
    assert (
        f"dead letter {wanted} re-driven to turn.tool_batches by {ME}"
        in (await http.get(answer.headers["location"])).text
    )
    assert log.redriven == [(topics.TOOL_BATCHES, BATCH, b"conv_1", HEADERS)]  # the record as it was
    assert "<td>SignatureInvalid</td><td>0</td><td>1</td>" in (await http.get("/dead-letters/live")).text

    again = await http.post(f"/dead-letters/{wanted}/redrive", data={"csrf": token})
    assert again.status_code == 409 and f"dead letter {wanted} was already re-driven by {ME}" in again.text
    other, other_token = await signed_in(log)  # another replica, or this one restarted
    assert (await other.post(f"/dead-letters/{wanted}/discard", data={"csrf": other_token})).status_code == 409
    assert len(log.redriven) == 1
    audit = caplog.text
    assert f'redrive dead letter by="{ME}" role=approver via=local' in audit and '"keys fixed"' in audit
    assert 'refused discard dead letter by="tester@unit"' in audit


async def test_the_first_claim_wins_and_the_other_console_sends_nothing(log):
    wanted = log.dead_letter(topics.TOOL_BATCHES, BATCH, b"conv_1", "SignatureInvalid: unknown key id 'k2'")
    http, token = await signed_in(log)
    log.rival = "bob@replica-2"
    answer = await http.post(f"/dead-letters/{wanted}/redrive", data={"csrf": token})
    assert answer.status_code == 409 and "already re-driven by bob@replica-2" in answer.text
    assert not log.redriven


async def test_a_re_drive_kafka_did_not_take_is_released_and_waits_again(log):
    wanted = log.dead_letter(topics.SUPPORT_REQUESTS, b'{"request_id": "r"}', b"conv_9", "RuntimeError: boom")
    http, token = await signed_in(log)
    log.away = True
    answer = await http.post(f"/dead-letters/{wanted}/redrive", data={"csrf": token})
    assert answer.status_code == 503 and "it waits again" in answer.text
    assert [json.loads(r)["action"] for r in log.handled] == ["redrive", "release"]
    assert 'data-state="waiting"' in (await http.get("/dead-letters/live")).text
    log.away = False
    assert (await http.post(f"/dead-letters/{wanted}/redrive", data={"csrf": token})).status_code == 303
    assert len(log.redriven) == 1


async def test_only_a_topic_the_fleet_consumes_is_written_and_anything_can_be_discarded(log):
    elsewhere = log.dead_letter("payments.ledger", b"{}", b"k", "RuntimeError: boom")
    log.dead.append(("executor", b"\xffnot a dead letter"))
    unreadable = dead_letters.letter_id(0, len(log.dead) - 1, "executor")
    http, token = await signed_in(log)
    page = (await http.get("/dead-letters/live")).text
    assert "no service of this fleet consumes" in page and "formaction" not in page  # no re-drive offered
    refused = await http.post(f"/dead-letters/{elsewhere}/redrive", data={"csrf": token})
    assert refused.status_code == 409 and "it can only be discarded" in refused.text
    assert (await http.post(f"/dead-letters/{unreadable}/redrive", data={"csrf": token})).status_code == 409
    for wanted in (elsewhere, unreadable):
        assert (await http.post(f"/dead-letters/{wanted}/discard", data={"csrf": token})).status_code == 303
    assert not log.redriven
    assert (await http.post("/dead-letters/0-999/discard", data={"csrf": token})).status_code == 404
    forged = await http.post(f"/dead-letters/{elsewhere}/discard", data={"csrf": "forged.0"})
    assert forged.status_code == 403


async def test_kafka_away_is_said_on_the_page_and_nothing_is_done(log):
    class Away(LogReader):
        async def _read_to_end(self) -> None:
            raise ConnectionError("no broker")

    s = settings()
    console = Console(s, Books("sqlite+aiosqlite:///nowhere/ledger.db", None), _never, _never)
    shelf = Shelf(s, log)
    shelf.reader = Away(s, log)
    http = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=application(console, letter_pages.routes(console, shelf))),
        base_url="http://testserver",
    )
    page = await http.get("/dead-letters")
    assert page.status_code == 200 and "cannot be read from Kafka" in page.text
    answer = await http.post("/dead-letters/0-0/redrive", data={"csrf": http.cookies["roundtrip_csrf"]})
    assert answer.status_code == 503 and "nothing done" in answer.text


def test_what_a_dead_letter_carries_is_shown_as_text(log):
    hostile = '<script>alert(1)</script><img src=x onerror="alert(2)">'
    log.dead_letter(f"{hostile}.topic", hostile.encode(), hostile.encode(), f"schema violation: {hostile}")
    item = dead_letters.parse_letter(0, 0, 1_000, log.dead[0][1], "")
    handling = DeadLetterHandled(letter_id=item.id, action="discard", claim="c", by=hostile, at=1.0, note=hostile)
    me = Identity(ME, "approver", "local")
    shown = letter_pages.letter_card(item, None, me, "tok", 10.0, None) + letter_pages.letter_card(
        item, handling, me, "t", 10.0, None
    )
    shown += letter_pages.dead_letters([], [(letters.kind_of(hostile), 1, 0)], "v", hostile)
    assert not re.search(r"<(script|img)", shown, re.I) and "&lt;script&gt;" in shown and "&lt;img" in shown


def test_the_first_claim_of_a_letter_wins_until_it_is_released():
    def record(action: str, claim: str, letter: str = "0-1") -> DeadLetterHandled:
        return DeadLetterHandled(letter_id=letter, action=action, claim=claim, by=claim, at=1.0)

    handled: dict[str, DeadLetterHandled] = {}
    for r in (record("redrive", "a"), record("discard", "b"), record("release", "b"), record("discard", "c", "0-2")):
        dead_letters.apply(handled, r)
    assert handled["0-1"].claim == "a" and handled["0-2"].claim == "c"  # b lost, and its release freed nothing
    dead_letters.apply(handled, record("release", "a"))
    dead_letters.apply(handled, record("discard", "d"))
    assert handled["0-1"].claim == "d"


def test_the_original_record_comes_back_byte_for_byte_and_reasons_are_counted_by_kind(log):
    log.dead_letter(topics.TOOL_BATCHES, b"\x00\xffbytes", b"\xfekey", "RuntimeError: boom")
    item = dead_letters.parse_letter(0, 0, 1_000, log.dead[0][1], "")
    assert item.letter is not None and letters.original(item.letter) == (b"\x00\xffbytes", b"\xfekey", HEADERS)
    assert letters.kind_of("malformed JSON: Expecting value") == "malformed JSON"
    others = [dead_letters.parse_letter(0, 1, 0, b"junk", ""), dead_letters.parse_letter(0, 2, 0, b"junk", "")]
    assert letters.counts([item, *others], {"0-2": None}) == [  # type: ignore[dict-item]
        ("not a dead letter the fleet wrote (unreadable record)", 1, 1),
        ("RuntimeError", 1, 0),
    ]


async def test_the_reader_keeps_the_newest_letters_by_their_time_each_with_its_handling(log):
    first, second, third = (log.dead_letter(topics.SUPPORT_REQUESTS, b"{}", b"k", f"RuntimeError: {n}") for n in "abc")
    log.stamps.update({0: 3_000, 1: 1_000, 2: 2_000})  # the first written is the newest, the second the oldest
    handled = DeadLetterHandled(letter_id=first, action="discard", claim="c", by="alice", at=1.0)
    log.handled.append(handled.model_dump_json().encode())
    reader = LogReader(settings(), log, keep=2)
    await reader.read()
    assert [(item.id, h.by if h else None) for item, h in reader.tail()] == [(third, None), (first, "alice")]
    assert second not in reader.letters


HARMLESS = b'{"request_id": "r1", "customer_id": "cust_a", "text": "What are your opening hours?"}'
HARMFUL = b'{"turn_id": "t9", "customer_id": "cust_b", "text": "cancel every order"}'


def forge(log: Log, index: int, **changes) -> None:
    """Rewrite letter `index` as a service holding the topic's credentials could: other fields, same place."""
    service, value = log.dead[index]
    log.dead[index] = (
        service,
        DeadLettered.model_validate_json(value).model_copy(update=changes).model_dump_json().encode(),
    )


async def test_a_letter_whose_copy_is_not_the_record_at_its_place_is_refused_and_nothing_is_published(log, caplog):
    caplog.set_level(logging.WARNING, logger="roundtrip.security")
    wanted = log.dead_letter(topics.TURN_STARTS, HARMLESS, b"conv_a", "RuntimeError: boom")
    forge(log, 0, payload_base64=base64.b64encode(HARMFUL).decode(), payload=HARMFUL.decode())
    http, token = await signed_in(log)
    page = (await http.get("/dead-letters/live")).text
    assert "cancel every order" in page and "opening hours" not in page  # what a re-drive would publish, no other

    refused = await http.post(f"/dead-letters/{wanted}/redrive", data={"csrf": token})
    assert (
        refused.status_code == 409 and "its copy is not the record at turn.starts[2]@40 (value differ)" in refused.text
    )
    assert not log.redriven and not log.handled  # not even claimed: it still waits, to be discarded
    (line,) = [r for r in caplog.records if r.name == "roundtrip.security"]
    assert wanted in line.getMessage() and "value differ" in line.getMessage()

    log.sources.clear()  # the retention passed the record
    gone = await http.post(f"/dead-letters/{wanted}/redrive", data={"csrf": token})
    assert gone.status_code == 409 and "no longer on Kafka" in gone.text and not log.redriven
    assert (await http.post(f"/dead-letters/{wanted}/discard", data={"csrf": token})).status_code == 303


async def test_a_letter_whose_readable_copy_is_not_its_bytes_is_not_offered_and_shows_its_bytes(log):
    wanted = log.dead_letter(topics.TURN_STARTS, HARMFUL, b"conv_b", "RuntimeError: boom")
    forge(log, 0, payload=HARMLESS.decode(), key="conv_a")  # the readable copies lie, the bytes are the record's
    http, token = await signed_in(log)
    page = (await http.get("/dead-letters/live")).text
    assert "its readable copy of the record is not its lossless copy" in page and "formaction" not in page
    assert "cancel every order" in page and "opening hours" not in page and "conv_b" in page
    assert (await http.post(f"/dead-letters/{wanted}/redrive", data={"csrf": token})).status_code == 409
    assert not log.redriven


async def test_each_services_letters_name_only_a_topic_that_service_consumes(log):
    elsewhere = log.dead_letter(topics.TURN_STARTS, HARMLESS, b"conv_a", "RuntimeError: boom", service="executor")
    log.dead_letter(topics.TURN_STARTS, HARMLESS, b"conv_a", "RuntimeError: boom", service="executor")
    log.dead[1] = ("guard", log.dead[1][1])  # on the guard's topic, saying the executor refused it
    disguised = dead_letters.letter_id(0, 1, "guard")
    http, token = await signed_in(log)
    refused = await http.post(f"/dead-letters/{elsewhere}/redrive", data={"csrf": token})
    said = html.unescape(refused.text)
    assert refused.status_code == 409 and "came from 'turn.starts', which 'executor' does not consume" in said
    refused = await http.post(f"/dead-letters/{disguised}/redrive", data={"csrf": token})
    said = html.unescape(refused.text)
    assert refused.status_code == 409 and "is on guard's dead letters but says 'executor' refused it" in said
    assert not log.redriven


async def test_a_letter_of_the_shared_topic_of_an_older_fleet_is_still_re_driven_when_it_is_the_record(log):
    log.dead_letter(topics.TOOL_BATCHES, BATCH, b"conv_1", "SignatureInvalid: unknown key id 'k2'")
    log.dead[0] = ("", log.dead[0][1])  # on roundtrip.dead_letters, as an older fleet wrote it
    wanted = dead_letters.letter_id(0, 0, "")
    assert wanted == "0-0"  # its id as before, so what that fleet's consoles handled stays handled
    http, token = await signed_in(log)
    assert (await http.post(f"/dead-letters/{wanted}/redrive", data={"csrf": token})).status_code == 303
    assert log.redriven == [(topics.TOOL_BATCHES, BATCH, b"conv_1", HEADERS)]


def test_what_differs_between_a_letter_and_the_record_at_its_place(log):
    log.dead_letter(topics.TOOL_BATCHES, BATCH, b"conv_1", "RuntimeError: boom")
    letter = DeadLettered.model_validate_json(log.dead[0][1])
    same = dead_letters.Record(BATCH, b"conv_1", list(HEADERS))
    assert letters.differences(letter, same) == []
    assert letters.differences(letter, dead_letters.Record(BATCH + b" ", b"conv_1", list(HEADERS))) == ["value"]
    assert letters.differences(letter, dead_letters.Record(BATCH, b"conv_2", list(HEADERS))) == ["key"]
    assert letters.differences(letter, dead_letters.Record(BATCH, None, list(HEADERS))) == ["key"]
    assert letters.differences(letter, dead_letters.Record(BATCH, b"conv_1", HEADERS[:1])) == ["headers"]
    assert letters.differences(letter, dead_letters.Record(b"", None, [])) == ["value", "key", "headers"]
    assert letters.readable_differs(letter) is None
    assert (
        letters.readable_differs(letter.model_copy(update={"key": None})) == "its readable key is not its lossless key"
    )
