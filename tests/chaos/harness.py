"""The chaos suite's tools: load like a user's app, poison of every kind, and the audit.

* `Observer` publishes to support.requests (and anywhere else) and reads `support.replies`
  (read_committed, with each record's timestamp), every service's dead letters and the signed
  batches on `turn.tool_batches`, without a consumer group (nothing to rebalance).
* `plan_load` builds a bounded mix of personas over many conversations, some with several
  requests, some requests published twice (an app retrying); `seed_customers` gives the
  scenario its own customers with cancellable orders in the shop's real database.
* `poison_messages` makes every kind of bad message for a topic; `check_dead_letters` finds
  each one's dead letter by (topic, partition, offset) and compares the original bytes.
* `audit` reads the shop database (its side effects, one idempotency record per tool_use_id, and its
  execution log, one row per run of a call, replays included) and the turn ledger, and `judge` counts:
  replies lost, duplicated or stray; side effects duplicated or after their turn's end; calls run more
  than once (excused only when the call's batch was running in an executor the harness SIGKILLed: its
  calls had run and its offset was not committed, by the `Kill` recorded then); and, with the scenario's
  `Expect`, outcomes outside the expected set, fewer `end_turn` or side effects than its floor, a fault
  that hit fewer turns in flight than it should.
* `deliver_batches_again` publishes the signed batches of ended turns again after a fault (at least once, made sure).
* `Observer.wait_for` raises when what a scenario waits for does not come in time; `Observer.settled` when the fleet
  has not handled what is on its topics in time.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import contextlib
import itertools
import json
import math
import sqlite3
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from sqlalchemy import insert, select, text
from sqlalchemy.ext.asyncio import create_async_engine

from roundtrip._gateway.turns import turn_id_for
from roundtrip._kernel.kafka.aiokafka_seam import partitions_of
from roundtrip._kernel.settings import Settings
from roundtrip._kernel.wire import topics, topology
from roundtrip._kernel.wire.events import Outcome, SupportRequest
from roundtrip._shop import db as shopdb
from tests import settling
from tests.readers import stop_reader

# Topics a fleet service consumes (poison there must be dead-lettered). support.replies, turn.events
# and the dead letters are outputs only: no service of the fleet reads them.
CONSUMED = (
    topics.SUPPORT_REQUESTS,
    topics.TURN_STARTS,
    topics.TURN_CONTROLS,
    topics.MODEL_CALLS,
    topics.ITERATIONS,
    topics.TOOL_CALLS,
    topics.TOOL_BATCHES,
    topics.OUTCOMES,
)

# how long a fleet may take to handle what is on its topics after a scenario (a slow, shared machine): past it the
# scenario fails, since "nothing more happened" cannot be told from "not yet"
SETTLE_TIMEOUT_S = 90.0

# internal topics whose records the observer keeps as they were (to deliver them again)
RAW_TOPICS = (topics.TOOL_BATCHES, topics.MODEL_CALLS, topics.OUTCOMES)

# (persona, what the customer writes): side effects come from the cancels and the escalation
MIX = (
    ("careful", "Please cancel my last order"),
    ("careless", "cancel my last order"),
    ("stubborn", "where is my order ord_0000dead?"),
    ("sloppy", "cancel my last order, I changed my mind"),
    ("parallel", "cancel my last order"),
    ("careful", "I need to talk to a human agent"),
    ("parallel", "where are my orders?"),
    ("parallel", "I want a person to call me"),
)


@dataclass
class Planned:
    request: SupportRequest
    twice: bool = False  # the app publishes it again (a retry): still exactly one reply

    @property
    def turn_id(self) -> str:
        return turn_id_for(self.request)


def plan_load(
    tag: str, customers: list[str], conversations: int, requests: int, twice_every: int = 13
) -> list[Planned]:
    """`requests` requests over `conversations` conversations (round robin, so most have several),
    personas from MIX, customers shared by several conversations (racing cancels of one order)."""
    plan = []
    mix = itertools.cycle(MIX)
    for n in range(requests):
        c = n % conversations
        persona, text = next(mix)
        request = SupportRequest(
            request_id=f"{tag}-r{n:04d}",
            conversation_id=f"{tag}-c{c:03d}",
            customer_id=customers[c % len(customers)],
            text=text,
            persona=persona,
        )
        plan.append(Planned(request, twice=n % twice_every == 5))
    return plan


async def seed_customers(settings: Settings, tag: str, count: int, cancellable: int = 3) -> list[str]:
    """`count` new customers, each with `cancellable` pending/processing orders and one shipped order."""
    engine = shopdb.make_engine(settings.shop_db_url)
    ids = [f"cus_{tag}{i:03d}" for i in range(count)]
    prefix = uuid.uuid4().hex[:4]  # order ids must look like ord_ + 8 hex digits (the tools' schema)
    now = datetime.now(UTC)
    rows_c, rows_o = [], []
    for i, cid in enumerate(ids):
        rows_c.append({"customer_id": cid, "name": f"Chaos {tag} {i}", "email": f"{cid}@example.com"})
        for j in range(cancellable + 1):
            status = ("pending", "processing")[j % 2] if j < cancellable else "shipped"
            rows_o.append(
                {
                    "order_id": f"ord_{prefix}{i:03x}{j:x}",
                    "customer_id": cid,
                    "status": status,
                    "placed_at": now - timedelta(days=j + 1),
                    "total_cents": 1000 + j,
                    "currency": "EUR",
                    "items": [
                        {"sku": "SKU-CHAOS", "name": "Chaos monkey plush", "quantity": 1, "unit_price_cents": 1000 + j}
                    ],
                    "carrier": "DHL" if status == "shipped" else None,
                    "tracking_number": None,
                    "eta": None,
                    "cancel_reason": None,
                    "cancelled_at": None,
                }
            )
    try:
        async with engine.begin() as conn:
            await conn.execute(insert(shopdb.customers), rows_c)
            await conn.execute(insert(shopdb.orders), rows_o)
    finally:
        await engine.dispose()
    return ids


# -- the client ------------------------------------------------------------------------------


@dataclass
class Seen:
    replies: dict[str, list[tuple[dict, float]]] = field(
        default_factory=lambda: defaultdict(list)
    )  # request id -> (reply, ts)
    dead_letters: list[dict] = field(default_factory=list)
    batches: list[dict] = field(default_factory=list)
    raw: list[tuple[str, bytes | None, bytes, list]] = field(
        default_factory=list
    )  # (logical topic, key, value, headers) of RAW_TOPICS


class Observer:
    """A user's app (publishes requests, reads replies) plus an operator's view of dead letters and batches."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.seen = Seen()
        self._arrived = asyncio.Event()

    def topic(self, name: str) -> str:
        return self.settings.topic_prefix + name

    async def start(self) -> None:
        watched = [self.topic(n) for n in (topics.SUPPORT_REPLIES, *topology.dead_letter_topics(), *RAW_TOPICS)]
        self.admin = AIOKafkaAdminClient(bootstrap_servers=self.settings.bootstrap_servers)
        await self.admin.start()
        self.producer = AIOKafkaProducer(
            bootstrap_servers=self.settings.bootstrap_servers,
            acks="all",
            enable_idempotence=True,
            max_request_size=1_000_000,
        )
        self.consumer = AIOKafkaConsumer(
            bootstrap_servers=self.settings.bootstrap_servers,
            enable_auto_commit=False,
            isolation_level="read_committed",
            fetch_max_bytes=32 * 1024 * 1024,
            max_partition_fetch_bytes=16 * 1024 * 1024,
        )
        await self.producer.start()
        await self.consumer.start()
        partitions = await partitions_of(self.consumer, watched)
        assert len({tp.topic for tp in partitions}) == len(watched), "the fleet's topics should exist"
        self.consumer.assign(partitions)
        self._partitions = partitions
        self._consumed = await partitions_of(self.consumer, [self.topic(t) for t in set(topology.groups("").values())])
        await self.consumer.seek_to_beginning(*partitions)
        self._task = asyncio.create_task(self._collect())

    async def _collect(self) -> None:
        replies, batches = (self.topic(n) for n in (topics.SUPPORT_REPLIES, topics.TOOL_BATCHES))
        letters = {self.topic(n) for n in topology.dead_letter_topics()}
        raw = {self.topic(n): n for n in RAW_TOPICS}
        async for record in self.consumer:
            if record.topic in raw:
                self.seen.raw.append((raw[record.topic], record.key, record.value, list(record.headers or ())))
                if record.topic != batches:
                    continue
            try:
                data = json.loads(record.value)
                if record.topic == replies:
                    self.seen.replies[data["request_id"]].append((data, record.timestamp / 1000))
                elif record.topic in letters:
                    self.seen.dead_letters.append(data)
                elif record.topic == batches:
                    self.seen.batches.append(
                        {
                            "turn_id": data["turn"]["turn_id"],
                            "step": data["step"],
                            "calls": [(c["name"], c["approved"]) for c in data["calls"]],
                            "runs": [c["id"] for c in data["calls"] if c["approved"] and not c.get("hold")],
                            "partition": record.partition,
                            "offset": record.offset,
                        }
                    )
            except (ValueError, TypeError, KeyError, RecursionError):
                continue  # poison (on turn.tool_batches) is the fleet's to dead-letter, not ours to read
            self._arrived.set()

    async def __aenter__(self) -> Observer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def stop(self) -> None:
        await stop_reader(self._task, self.consumer)
        await self.producer.stop()
        await self.admin.close()

    async def settled(self, timeout: float = 60.0) -> None:
        """Until the fleet has done all it will do with what is on its topics (tests/settling.py): what a delivered-
        again record would (wrongly) have led to is then in `seen` or the shop's log. TimeoutError when it has not
        settled by `timeout`: a window too short fails, never passes."""
        await settling.settled_at_ends(
            self.consumer, self.admin, self._consumed, self._partitions, self.settings.topic_prefix, timeout
        )

    async def send(
        self, topic: str, value: bytes | None, key: bytes | None, headers: list[tuple[str, bytes]] | None = None
    ):
        """Publish one record to a logical topic; returns its RecordMetadata (partition, offset). Retried
        while the broker is away, as an app would (the producer is idempotent: no duplicate)."""
        for attempt in range(60):
            try:
                return await self.producer.send_and_wait(self.topic(topic), value, key=key, headers=headers or None)
            except Exception:  # the broker is being killed under us: wait and retry
                if attempt == 59:
                    raise
                await asyncio.sleep(0.5)  # retry interval: the broker not answering yet (60 tries)
        raise AssertionError("unreachable")

    async def ask(self, planned: Planned) -> None:
        r = planned.request
        await self.send(
            topics.SUPPORT_REQUESTS, r.model_dump_json(exclude_none=True).encode(), r.conversation_id.encode()
        )

    async def drive(self, plan: list[Planned], rate_per_s: float) -> None:
        """Publish the plan at `rate_per_s`, the retries of `twice` requests a little later."""
        retries = []
        for planned in plan:
            await self.ask(planned)
            if planned.twice:
                retries.append(planned)
            if len(retries) > 2:
                await self.ask(retries.pop(0))
            await asyncio.sleep(1 / rate_per_s)  # pacing: the next request is due at the offered rate
        for planned in retries:
            await self.ask(planned)

    async def wait_for(self, predicate: Callable[[], Any], timeout: float, what: str = "") -> Any:
        """The first truthy value of `predicate()`, checked as records arrive; AssertionError after `timeout`."""
        result = await self._poll(predicate, timeout)
        if not result:
            raise AssertionError(f"waited {timeout:g} s in vain for {what or 'the scenario to go on'}")
        return result

    async def _poll(self, predicate: Callable[[], Any], timeout: float) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            result = predicate()
            if result or time.monotonic() > deadline:
                return result
            self._arrived.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._arrived.wait(), timeout=min(1.0, max(0.01, deadline - time.monotonic())))

    async def wait_for_replies(self, request_ids: list[str], timeout: float, linger_s: float = 4.0) -> None:
        """Until every request has a reply (or `timeout`), then until the fleet has settled (`settled`): a duplicate
        reply or call it was going to make is then in `seen` or the shop's log. No raise at the timeout: the audit
        that follows names each request left without a reply (`lost`). `linger_s` 0: no settling (a service the
        scenario holds stopped cannot commit); any other value only says to settle (no fixed window any more)."""
        await self._poll(lambda: all(rid in self.seen.replies for rid in request_ids), timeout)
        if linger_s:
            await self.settled(SETTLE_TIMEOUT_S)


async def drive_while(
    observer: Observer, plan: list[Planned], rate_per_s: float, faults: asyncio.Task
) -> list[Planned]:
    """Publish the plan (Observer.drive, ten at a time) until `faults` is done or the plan used up: what was sent."""
    sent: list[Planned] = []
    for i in range(0, len(plan), 10):
        if faults.done():
            break
        await observer.drive(plan[i : i + 10], rate_per_s)
        sent += plan[i : i + 10]
    return sent


async def deliver_batches_again(observer: Observer, settings: Settings, plan: list[Planned]) -> int:
    """Publish again the signed batches of the plan's turns ended so far (how many): what a fault makes possible, a
    consumer's commit lost with a process, the broker or the database (at least once), made sure here rather than left
    to the fault's timing. The executors must refuse each (their memory of batches handled, else the fence); a copy
    of the executor without them runs the calls again, and the audit fails it."""
    ended = {t for t, row in ledger_rows(settings).items() if row["status"] == "ended"}
    conversations = {p.request.conversation_id.encode() for p in plan}
    copies = [
        (topic, key, value, headers)
        for topic, key, value, headers in list(observer.seen.raw)
        if topic == topics.TOOL_BATCHES and key in conversations and json.loads(value)["turn"]["turn_id"] in ended
    ]
    assert copies, "no signed batch of an ended turn to deliver again: the scenario could not catch a second run"
    for topic, key, value, headers in copies:
        await observer.send(topic, value, key, headers)
    return len(copies)


def stall_s(observer: Observer, plan: list[Planned], at: float, until: float | None = None) -> float:
    """The longest time without a reply to the plan's requests from a fault at `at` (epoch seconds): the gap
    between consecutive first replies, from the last before `at` through those up to `until`; inf without any."""
    times = sorted(
        min(ts for _, ts in observer.seen.replies[p.request.request_id])
        for p in plan
        if p.request.request_id in observer.seen.replies
    )
    after = [t for t in times if t > at and (until is None or t <= until)]
    if not after:
        return float("inf")
    points = [max([t for t in times if t <= at], default=at), *after]
    return max(b - a for a, b in itertools.pairwise(points))


# -- poison ----------------------------------------------------------------------------------


@dataclass
class Poison:
    topic: str
    kind: str
    value: bytes
    key: bytes | None
    headers: list[tuple[str, bytes]]
    partition: int = -1
    offset: int = -1


def poison_messages(topic: str, tag: str) -> list[Poison]:
    """Every kind of bad message for `topic` (each with its own key, so none waits behind another)."""

    def key(kind: str) -> bytes:
        return f"{tag}-{topic}-{kind}".encode()

    huge = b'{"poison": "' + b"x" * 900_000 + b'"}'  # ~900 kB: under the broker's 1 MB limit, so Kafka accepts it
    return [
        Poison(topic, "malformed_json", b'{"request_id": "p1", "text": oops', key("malformed_json"), []),
        Poison(topic, "deep_json", b"[" * 100_000 + b"]" * 100_000, key("deep_json"), []),
        Poison(
            topic,
            "wrong_schema",
            json.dumps({"unexpected": True, "poison": topic, "n": [1, 2, 3]}).encode(),
            key("wrong_schema"),
            [],
        ),
        Poison(topic, "empty_value", b"", key("empty_value"), []),
        Poison(topic, "binary", bytes(range(256)) + b"\xff\xfe\xc3\x28\x80" * 20, key("binary"), []),
        Poison(
            topic,
            "bad_header",
            json.dumps({"poison": "header"}).encode(),
            key("bad_header"),
            [("x-poison", b"\xff\xfe\xfd\x00"), ("traceparent", b"\xc3\x28\xa0\xa1")],
        ),
        Poison(topic, "huge", huge, key("huge"), []),
        Poison(topic, "null_key", json.dumps({"poison": "null key"}).encode(), None, []),
    ]


def poison_sampler(tag: str, shift: int = 0) -> list[Poison]:
    """One poison message on each consumed topic, a different kind on each (every kind once): the lighter
    set the cluster scenarios send while a broker is away; `shift` pairs topics and kinds differently."""
    return [(kinds := poison_messages(topic, tag))[(i + shift) % len(kinds)] for i, topic in enumerate(CONSUMED)]


async def send_poison(observer: Observer, poison: list[Poison]) -> None:
    for p in poison:
        meta = await observer.send(p.topic, p.value, p.key, p.headers)
        p.partition, p.offset = meta.partition, meta.offset


def check_dead_letters(observer: Observer, poison: list[Poison]) -> tuple[list[Poison], list[str]]:
    """(poison dead-lettered intact, problems): each poison's dead letter found by topic/partition/offset,
    its payload_base64, key and headers equal to what was sent, and a reason."""
    by_position: dict[tuple[str, int, int], list[dict]] = defaultdict(list)
    for letter in observer.seen.dead_letters:
        by_position[(letter["topic"], letter.get("partition"), letter.get("offset"))].append(letter)
    intact, problems = [], []
    for p in poison:
        letters = by_position.get((observer.topic(p.topic), p.partition, p.offset), [])
        where = f"{p.kind} on {p.topic}"
        if not letters:
            problems.append(f"{where}: no dead letter")
            continue
        letter = letters[0]
        wrong = []
        if base64.b64decode(letter.get("payload_base64", "")) != p.value:
            wrong.append("payload bytes differ")
        key = base64.b64decode(letter["key_base64"]) if letter.get("key_base64") is not None else None
        if key != p.key:
            wrong.append(f"key {key!r} != {p.key!r}")
        headers = [(h["key"], base64.b64decode(h["value_base64"])) for h in letter.get("headers", [])]
        if any(h not in headers for h in p.headers):
            wrong.append(f"headers {headers!r} lack {p.headers!r}")
        if not letter.get("reason"):
            wrong.append("no reason")
        if wrong:
            problems.append(f"{where}: " + "; ".join(wrong))
        else:
            intact.append(p)
    return intact, problems


# -- the audit -------------------------------------------------------------------------------


def _epoch(value: Any) -> float:
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    if value.tzinfo is None:  # SQLite keeps no offset; the shop stores UTC
        value = value.replace(tzinfo=UTC)
    return value.timestamp()


# How long after a fault the fleet may still be finding its feet (a cluster's new leaders take longer): the default
# of `Fault.settle_s`. It excuses nothing: a call run again is excused only by a `Kill` of the executor (see `judge`).
RERUN_MARGIN_S = 10.0


@dataclass(frozen=True)
class Fault:
    """A fault a scenario injected: from `at` to `until` (epoch seconds; None: an instant, or down for good), and
    how long after that the fleet may still be finding its feet (`settle_s`: a cluster's new leaders take longer)."""

    label: str
    at: float
    until: float | None = None
    settle_s: float = RERUN_MARGIN_S


@dataclass(frozen=True)
class Kill:
    """A SIGKILL the harness sent: the service (`victim`), when every process of it was dead (epoch seconds), and its
    group's committed offsets then ((logical topic, partition) -> offset): a record at or past its partition's
    offset was not finished, so one whose calls had run was running in the victim when it died."""

    victim: str
    at: float
    committed: dict[tuple[str, int], int] = field(default_factory=dict)

    def interrupted(self, batch: dict) -> bool:
        """Whether the batch (an `Observer.seen.batches` entry) was running in the executor this kill killed."""
        done = self.committed.get((topics.TOOL_BATCHES, batch["partition"]), 0)
        return self.victim == "executor" and batch["offset"] >= done


CALM = frozenset({Outcome.END_TURN, Outcome.REPEATED_CALL})  # the persona mix, nothing failing: stubborn repeats
FAULTY = CALM | {Outcome.DEADLINE}  # a step lost with a fault is ended by the stuck rule


@dataclass(frozen=True)
class Expect:
    """What a scenario must show besides the zeros: how its turns ended, that tools ran, that its faults hit
    turns in flight (started before the fault, ended after it, by the ledger)."""

    outcomes: frozenset[str] = CALM  # every reply's outcome is one of these
    end_turn: float = 0.5  # at least this share of the requests ends `end_turn`
    side_effects: int = 1  # at least this many side effects (a cancel that changed an order, a ticket)
    in_flight: int = 1  # at least this many turns in flight at each fault


@dataclass
class Audit:
    scenario: str
    requests: int
    turns: int = 0
    replies: int = 0
    lost: list[str] = field(default_factory=list)
    duplicated: list[str] = field(default_factory=list)
    strays: list[str] = field(default_factory=list)  # replies to requests nobody sent
    side_effects: int = 0
    executions: int = 0  # runs of a side-effecting call the shop received (replays included)
    duplicate_side_effects: list[str] = field(default_factory=list)
    duplicate_executions: list[str] = field(default_factory=list)
    reruns_after_faults: list[str] = field(default_factory=list)  # re-runs a SIGKILLed executor explains (reported)
    late_side_effects: list[str] = field(default_factory=list)
    outcomes: Counter = field(default_factory=Counter)
    unexpected_outcomes: list[str] = field(default_factory=list)
    in_flight: dict[str, int] = field(default_factory=dict)  # fault label -> turns in flight when it landed
    shortfalls: list[str] = field(default_factory=list)  # an expectation (Expect) the run fell short of
    poison_sent: int = 0
    poison_dead_lettered: int = 0
    poison_problems: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def line(self) -> str:
        top = ", ".join(f"{k} {v}" for k, v in self.outcomes.most_common())
        flight = ", ".join(f"{k} {v}" for k, v in self.in_flight.items())
        return (
            f"[chaos] {self.scenario}: turns {self.turns}, replies {self.replies}, lost {len(self.lost)}, "
            f"duplicated {len(self.duplicated)}, side effects {self.side_effects} (duplicate "
            f"{len(self.duplicate_side_effects)}, late {len(self.late_side_effects)}), runs {self.executions} "
            f"(duplicate {len(self.duplicate_executions)}, re-run after an executor's SIGKILL "
            f"{len(self.reruns_after_faults)}), "
            f"poison dead-lettered {self.poison_dead_lettered}/{self.poison_sent}, "
            f"{self.seconds:.0f} s; outcomes: {top}" + (f"; turns in flight at {flight}" if flight else "")
        )

    def problems(self) -> list[str]:
        out = []
        for label, items in (
            ("lost (no reply)", self.lost),
            ("duplicated replies", self.duplicated),
            ("stray replies", self.strays),
            ("duplicate side effects", self.duplicate_side_effects),
            ("duplicated executions", self.duplicate_executions),
            ("side effects after the turn's end", self.late_side_effects),
            ("unexpected outcomes", self.unexpected_outcomes),
            ("short of the scenario's expectations", self.shortfalls),
            ("poison", self.poison_problems),
        ):
            if items:
                out.append(f"{label}: {len(items)}: " + "; ".join(items[:8]))
        return out


LEDGER_COLUMNS = "turn_id, request_id, status, step, started_at, ended_at, outcome"


def ledger_rows(settings: Settings) -> dict[str, dict]:
    """turn id -> row of the guard's ledger (read-only), on the fleet's database: SQLite or PostgreSQL."""
    if settings.ledger_database_url is None:  # the SQLite file in the state folder: read directly, at once
        conn = sqlite3.connect(f"file:{settings.state_dir / 'ledger.db'}?mode=ro", uri=True, timeout=30)
        conn.row_factory = sqlite3.Row
        try:
            return {r["turn_id"]: dict(r) for r in conn.execute(f"SELECT {LEDGER_COLUMNS} FROM turns")}
        finally:
            conn.close()

    async def read() -> dict[str, dict]:  # PostgreSQL: asyncpg, in a thread of its own (callers are on the test's loop)
        engine = create_async_engine(settings.ledger_db_url)
        try:
            async with engine.connect() as conn:
                rows = (await conn.execute(text(f"SELECT {LEDGER_COLUMNS} FROM turns"))).mappings().all()
        finally:
            await engine.dispose()
        return {r["turn_id"]: dict(r) for r in rows}

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, read()).result(60)


async def _shop_rows(settings: Settings, table: Any) -> list[Any]:
    engine = shopdb.make_engine(settings.shop_db_url)
    try:
        async with engine.connect() as conn:
            return list((await conn.execute(select(table))).mappings().all())
    finally:
        await engine.dispose()


async def side_effects(settings: Settings) -> list[dict]:
    """Every side effect the shop performed: a cancel that changed an order (200) or a ticket opened (201),
    from its idempotency record (one per customer and `turn_id:tool_use_id`, written in the same transaction)."""
    effects = []
    for r in await _shop_rows(settings, shopdb.idempotency):
        if (r["endpoint"], r["status_code"]) in (("cancel_order", 200), ("escalate", 201)):
            turn_id, _, tool_use_id = r["key"].partition(":")
            effects.append(
                {
                    "turn_id": turn_id,
                    "tool_use_id": tool_use_id,
                    "endpoint": r["endpoint"],
                    "customer_id": r["customer_id"],
                    "order_id": r["request"].get("order_id"),
                    "at": _epoch(r["created_at"]),
                }
            )
    return effects


async def executions(settings: Settings) -> list[dict]:
    """Every run of a side-effecting call the shop received, from its append-only execution log: a replay of
    a call that ran before is there too, though it changed nothing (services/_shop/db.py)."""
    runs = []
    for r in await _shop_rows(settings, shopdb.executions):
        turn_id, _, tool_use_id = r["key"].partition(":")
        runs.append(
            {
                "turn_id": turn_id,
                "tool_use_id": tool_use_id,
                "endpoint": r["endpoint"],
                "customer_id": r["customer_id"],
                "at": _epoch(r["at"]),
            }
        )
    return runs


def judge(
    result: Audit,
    plan: list[Planned],
    replies: dict[str, list[tuple[dict, float]]],
    ledger: dict[str, dict],
    effects: list[dict],
    runs: list[dict],
    expect: Expect | None = None,
    faults: Sequence[Fault] = (),
    kills: Sequence[Kill] = (),
    batches: Sequence[dict] = (),
) -> Audit:
    """Fill `result` from what the scenario saw: the replies (request id -> (reply, timestamp)), the ledger's rows,
    the shop's side effects and its execution log, the signed batches (`Observer.seen.batches`) and the SIGKILLs
    the harness sent. A call is checked once, by its runs in the execution log (its idempotency record is one by
    the shop's primary key, so it cannot show a second run). Without `expect`, only the zeros are checked."""
    expected = {p.request.request_id: p for p in plan}
    tag = scenario_tag(plan)
    for rid, got in replies.items():
        if rid in expected:
            result.replies += 1
            outcome = got[0][0]["outcome"]
            result.outcomes[outcome] += 1
            if expect is not None and outcome not in expect.outcomes:
                result.unexpected_outcomes.append(f"{rid} {outcome}")
            if len(got) > 1:
                result.duplicated.append(f"{rid} x{len(got)} ({', '.join(g[0]['outcome'] for g in got)})")
        elif tag and rid.startswith(tag + "-"):
            result.strays.append(rid)
    result.lost = sorted(rid for rid in expected if rid not in replies)
    turn_of = {p.turn_id: p.request.request_id for p in plan}
    result.turns = sum(1 for t in turn_of if t in ledger)
    reply_at = {rid: min(ts for _, ts in got) for rid, got in replies.items()}

    effects = [e for e in effects if e["turn_id"] in turn_of]
    result.side_effects = len(effects)
    per_order = Counter(e["order_id"] for e in effects if e["endpoint"] == "cancel_order")
    result.duplicate_side_effects += [f"order {o} cancelled {n} times" for o, n in per_order.items() if n > 1]
    for e in effects:
        row = ledger.get(e["turn_id"])
        rid = turn_of[e["turn_id"]]
        ended = row["ended_at"] if row else None
        replied = reply_at.get(rid)
        if ended is not None and e["at"] > ended:
            result.late_side_effects.append(
                f"{e['endpoint']} {e['order_id'] or ''} of {e['turn_id']} {e['at'] - ended:.3f} s after the ledger's "
                f"end ({row['outcome']})"
            )
        elif replied is not None and e["at"] > replied:
            result.late_side_effects.append(
                f"{e['endpoint']} {e['order_id'] or ''} of {e['turn_id']} {e['at'] - replied:.3f} s after its reply"
            )

    runs = [r for r in runs if r["turn_id"] in turn_of]
    result.executions = len(runs)
    per_call: dict[tuple[str, str], list[float]] = defaultdict(list)
    for r in runs:
        per_call[(r["turn_id"], r["tool_use_id"])].append(r["at"])
    first_batch: dict[tuple[str, str], dict] = {}  # the call's first delivery: the batch that ran it first
    for b in sorted(batches, key=lambda b: b["offset"]):
        for call_id in b.get("runs", ()):
            first_batch.setdefault((b["turn_id"], call_id), b)
    for (turn_id, tool_use_id), times in per_call.items():
        if len(times) < 2:
            continue
        first, batch = min(times), first_batch.get((turn_id, tool_use_id))
        # one run more for each SIGKILL of the executor while the call's batch was in it: ran, not yet committed
        hits = [k for k in kills if batch is not None and k.interrupted(batch) and first <= k.at]
        what = f"{turn_id}:{tool_use_id} ran {len(times)} times"
        if len(times) <= 1 + len(hits):
            result.reruns_after_faults.append(f"{what} (its batch was running in {hits[0].victim} SIGKILLed)")
        else:
            result.duplicate_executions.append(what + (f", {len(hits)} explained by a SIGKILL" if hits else ""))

    for f in faults:
        result.in_flight[f.label] = sum(
            1
            for t in turn_of
            if (row := ledger.get(t)) is not None
            and row["started_at"] < f.at
            and (row["ended_at"] is None or row["ended_at"] > f.at)
        )
    if expect is not None:
        result.shortfalls += [
            f"{n} turns in flight at {label}, fewer than {expect.in_flight}"
            for label, n in result.in_flight.items()
            if n < expect.in_flight
        ]
        if result.side_effects < expect.side_effects:
            result.shortfalls.append(f"{result.side_effects} side effects, fewer than {expect.side_effects}")
        floor = math.ceil(expect.end_turn * len(expected))
        if result.outcomes[Outcome.END_TURN] < floor:
            result.shortfalls.append(f"{result.outcomes[Outcome.END_TURN]} turns ended end_turn, fewer than {floor}")
    return result


async def audit(
    scenario: str,
    settings: Settings,
    observer: Observer,
    plan: list[Planned],
    started: float,
    poison: Sequence[Poison] = (),
    expect: Expect | None = None,
    faults: Sequence[Fault] = (),
    kills: Sequence[Kill] = (),
) -> Audit:
    """The scenario's audit from the shop's database, the ledger and what `observer` saw (see `judge`); `kills`: the
    SIGKILLs the harness sent meanwhile (`ChaosFleet.kills`), the only excuse for a call run again."""
    result = judge(
        Audit(scenario, requests=len({p.request.request_id for p in plan})),
        plan,
        observer.seen.replies,
        ledger_rows(settings),
        await side_effects(settings),
        await executions(settings),
        expect,
        list(faults),
        list(kills),
        list(observer.seen.batches),
    )
    if poison:
        intact, problems = check_dead_letters(observer, list(poison))
        result.poison_sent, result.poison_dead_lettered, result.poison_problems = len(poison), len(intact), problems
    result.seconds = time.monotonic() - started
    return result


def report(result: Audit, capsys) -> None:
    """Print the scenario's line (past pytest's capture) and fail with every problem the audit found."""
    with capsys.disabled():
        print("\n" + result.line(), flush=True)
    problems = result.problems()
    assert not problems, f"{result.scenario}:\n" + "\n".join(problems)


def scenario_tag(plan: list[Planned]) -> str:
    return plan[0].request.request_id.rsplit("-", 1)[0] if plan else ""


def new_tag(name: str) -> str:
    return f"{name}{uuid.uuid4().hex[:4]}"
