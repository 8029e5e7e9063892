"""An outage holds only what it must: an agent's backend away holds its record's key (conversation) while the other
keys of the partition go on; the fleet's own dependency pauses the consumer; the gate answers a call whose backend is
still away at the turn's deadline as refused (services/_kernel/kafka/outages.py, services/_gate/gate.py)."""

from __future__ import annotations

import asyncio
import logging
import time
from types import SimpleNamespace

import httpx
import pytest
from aiokafka import TopicPartition
from prometheus_client import REGISTRY

from roundtrip._gate.authorization import authorize
from roundtrip._gate.gate import Gate
from roundtrip._kernel.kafka import consumer as consumer_module
from roundtrip._kernel.kafka import faults
from roundtrip._kernel.kafka.consumer import KeyOrderedConsumer
from roundtrip._kernel.kafka.outages import next_try
from roundtrip._kernel.wire.events import CheckToolCalls, ToolCall, Turn
from roundtrip._sdk.context import ToolContext
from roundtrip._sdk.texts import gate_message
from roundtrip._shop.agent.client import ShopClient, ShopUnavailable
from tests import waiting
from tests.agents import SHOP, shop_deps
from tests.consumers import key_ordered
from tests.shop import in_process
from tests.signing import pair

TP = TopicPartition("t", 0)


def rec(offset: int, key: bytes) -> SimpleNamespace:
    return SimpleNamespace(topic="t", partition=0, offset=offset, key=key, value=b"{}")


class FeedKafka:
    """Hands out what the test feeds it, one partition; remembers pauses and commits."""

    def __init__(self) -> None:
        self.paused = False
        self.pauses = 0
        self.feed: list[SimpleNamespace] = []
        self.commits: list[dict] = []

    def assignment(self):
        return {TP}

    async def commit(self, offsets):
        self.commits.append(dict(offsets))

    def pause(self, *parts):
        self.paused = True
        self.pauses += 1

    def resume(self, *parts):
        self.paused = False

    async def getmany(self, timeout_ms=0, max_records=None):
        # a fake poll's wait: the consumer loop yields as on a real broker
        await asyncio.sleep(min(timeout_ms, 20) / 1000)
        if self.paused or not self.feed:
            return {}
        out, self.feed = self.feed[: max_records or None], self.feed[max_records or len(self.feed) :]
        return {TP: out}


def held_gauge(consumer: str) -> float | None:
    return REGISTRY.get_sample_value("roundtrip_held_keys", {"consumer": consumer})


async def until_true(check, timeout: float = 5.0) -> None:
    await waiting.until(check, timeout)


async def started(process, name: str, **options) -> tuple[KeyOrderedConsumer, FeedKafka, asyncio.Task]:
    consumer = key_ordered(process=process, name=name, idle_wait_ms=50, commit_interval_s=0.02, **options)
    await consumer.on_partitions_assigned([TP])
    kafka = FeedKafka()
    return consumer, kafka, asyncio.create_task(consumer.run(kafka))


async def stopped(consumer: KeyOrderedConsumer, task: asyncio.Task) -> None:
    await consumer.drain()
    await asyncio.wait_for(task, 5)


async def test_a_backend_away_holds_only_its_key_the_other_keys_of_the_partition_go_on(caplog):
    away = {"on": True}
    done: list[tuple[bytes, int]] = []
    tries = {"stuck": 0}

    async def process(record):
        if record.key == b"stuck" and away["on"]:
            tries["stuck"] += 1
            raise faults.RetryLater(faults.HTTP, "ReadTimeout: the shop did not answer", backend=True)
        done.append((record.key, record.offset))

    caplog.set_level(logging.INFO, "roundtrip.consumer")
    consumer, kafka, task = await started(process, "unitheld")
    kafka.feed = [rec(0, b"stuck"), rec(1, b"ok1"), rec(2, b"stuck"), rec(3, b"ok2")]
    await until_true(lambda: len(done) == 2)
    assert sorted(done) == [(b"ok1", 1), (b"ok2", 3)]  # the other keys went on at once
    kafka.feed = [rec(4, b"ok3")]  # fetching goes on while the key is held
    await until_true(lambda: (b"ok3", 4) in done)
    await asyncio.sleep(1.2)  # several tries of the held record (0.25, 0.5 s ...)
    assert tries["stuck"] >= 3
    assert not consumer.outages and not consumer.outages.waiting and kafka.pauses == 0  # no pause, no outage
    assert consumer.outages.held_keys == 1 and held_gauge("unitheld") == 1
    assert consumer.committed() == {TP: 0}  # never past the unfinished record, whatever finished after it
    assert all(offsets[TP] == 0 for offsets in kafka.commits)
    assert (b"stuck", 2) not in done  # its key's later record waits behind it
    lines = [r.getMessage() for r in caplog.records if "unitheld" in r.getMessage()]
    assert len(lines) == 1 and "b'stuck'" in lines[0] and "held" in lines[0], lines  # one line, not one per try
    retried = REGISTRY.get_sample_value(
        "roundtrip_retried_messages_total", {"consumer": "unitheld", "dependency": faults.HTTP}
    )
    assert retried is not None and retried >= 3

    away["on"] = False
    await until_true(lambda: (b"stuck", 2) in done)
    assert [d for d in done if d[0] == b"stuck"] == [(b"stuck", 0), (b"stuck", 2)]  # in its order
    await until_true(lambda: consumer.committed() == {TP: 5})
    assert consumer.outages.held_keys == 0 and held_gauge("unitheld") == 0
    await stopped(consumer, task)


async def test_the_fleets_own_dependency_still_pauses_the_whole_consumer():
    done: list[int] = []
    away = {"on": True}

    async def process(record):
        if record.key == b"c1" and away["on"]:
            raise faults.RetryLater(faults.DATABASE, "ConnectionRefusedError: [Errno 111]", backend=False)
        done.append(record.offset)

    consumer, kafka, task = await started(process, "unitfleet")
    kafka.feed = [rec(0, b"c1")]
    await until_true(lambda: kafka.paused)
    kafka.feed = [rec(1, b"c2")]
    await asyncio.sleep(0.6)  # the window the second record would (wrongly) have been processed in
    assert done == [] and consumer.outages.waiting == (faults.DATABASE,) and consumer.outages.held_keys == 0
    away["on"] = False
    await until_true(lambda: done == [0, 1])
    await stopped(consumer, task)


async def test_a_held_record_that_then_finds_the_fleets_dependency_away_pauses_the_consumer_until_it_answers():
    answers = iter(
        [
            faults.RetryLater(faults.HTTP, "503", backend=True),
            faults.RetryLater(faults.KAFKA, "KafkaConnectionError", backend=False),
            faults.RetryLater(faults.KAFKA, "KafkaConnectionError", backend=False),
        ]
    )
    seen: list[tuple[bool, int, tuple[str, ...]]] = []
    consumer: KeyOrderedConsumer | None = None

    async def process(record):
        assert consumer is not None
        seen.append((kafka.paused, consumer.outages.held_keys, consumer.outages.waiting))
        failure = next(answers, None)
        if failure is not None:
            raise failure

    consumer, kafka, task = await started(process, "unitmoves")
    kafka.feed = [rec(0, b"c1")]
    await until_true(lambda: consumer.processed == 1)
    # first try: nothing waits; the backend's try: its key held; the broker's: the consumer paused, no key held
    assert seen[0] == (False, 0, ())
    assert seen[1] == (False, 1, ())
    assert seen[2][1:] == (0, (faults.KAFKA,)) and seen[3][1:] == (0, (faults.KAFKA,))
    await until_true(lambda: not kafka.paused)
    assert not consumer.outages and consumer.outages.held_keys == 0
    await stopped(consumer, task)


async def test_a_held_record_is_tried_again_right_at_its_deadline_not_at_the_backoffs_next_try():
    deadline = time.time() + 1.0  # backoff alone: tries at 0.25, 0.75, 1.75 s
    finished: list[float] = []
    start = time.monotonic()

    async def process(record):
        if time.time() < deadline:
            raise faults.RetryLater(faults.HTTP, "timeout", backend=True, until=deadline)
        finished.append(time.monotonic() - start)

    consumer, kafka, task = await started(process, "unitdeadline")
    kafka.feed = [rec(0, b"c1")]
    await until_true(lambda: bool(finished))
    assert 1.0 <= finished[0] < 1.4, finished
    await stopped(consumer, task)


def test_the_next_try_is_cut_short_only_by_a_deadline_still_ahead():
    now = time.time()
    assert next_try(2.0, None) == 2.0
    assert next_try(2.0, now + 10) == 2.0
    assert 0.4 < next_try(2.0, now + 0.5) <= 0.52
    assert next_try(2.0, now - 1) == 2.0  # past it: a handler that still raises backs off, never spins


async def test_a_held_key_given_up_on_a_rebalance_is_not_committed_and_not_counted_as_held(monkeypatch):
    monkeypatch.setattr(consumer_module, "DRAIN_TIMEOUT_S", 8)

    async def process(record):
        raise faults.RetryLater(faults.HTTP, "down", backend=True)

    consumer, kafka, task = await started(process, "unitheldgiveup")
    kafka.feed = [rec(0, b"c1")]
    await until_true(lambda: consumer.outages.held_keys == 1)
    await stopped(consumer, task)
    assert consumer.committed() == {TP: 0} and consumer.processed == 0
    assert consumer.outages.held_keys == 0 and held_gauge("unitheldgiveup") == 0


def test_a_failure_is_a_backends_only_when_it_says_so():
    backend = faults.RetryLater(faults.HTTP, "x", backend=True, until=5.0)
    try:
        try:
            raise backend
        except faults.RetryLater as exc:
            raise ValueError("wrapped") from exc
    except ValueError as wrapped:
        assert faults.of_backend(wrapped) is backend
    assert faults.of_backend(faults.RetryLater(faults.DATABASE, "x", backend=False)) is None
    try:
        try:
            raise backend
        except faults.RetryLater:
            raise ConnectionRefusedError(111, "the ledger refused")  # noqa: B904 - its context only
    except ConnectionRefusedError as meanwhile:
        assert faults.of_backend(meanwhile) is None  # the ledger's, though raised while the backend was away
    assert faults.of_backend(ConnectionRefusedError(111, "refused")) is None  # unmarked: the fleet's
    assert faults.of_backend(ExceptionGroup("g", [backend, faults.RetryLater(faults.HTTP, "y", backend=True)]))
    assert (
        faults.of_backend(ExceptionGroup("g", [backend, faults.RetryLater(faults.DATABASE, "y", backend=False)]))
        is None
    )


# -- the gate: a backend away before and after the turn's deadline ----------------------------------------------

GATE_KEYS = pair("k1")
SIGNER = GATE_KEYS.signer


@pytest.fixture
async def shop(tmp_path):
    async with in_process(f"sqlite+aiosqlite:///{tmp_path}/shop.db") as transport:
        client = ShopClient("http://shop", timeout=10.0, transport=transport)
        yield client
        await client.aclose()


def away_gate(shop: ShopClient, stuck: str) -> Gate:
    """A gate whose look-up of `stuck` times out (what ShopClient raises then); the others are the shop's."""

    async def lookup(kind: str, entity_id: str, customer_id: str):
        if entity_id == stuck:
            try:
                raise httpx.ReadTimeout("timed out")
            except httpx.ReadTimeout as exc:
                raise ShopUnavailable(f"shop unreachable: {exc!r}") from exc
        return await shop.get_order(customer_id, entity_id)

    return Gate(
        registry=SHOP.registry,
        lookup=lookup,
        signer=SIGNER,
        deps=shop_deps(shop),
        agent_settings=SHOP.own_settings,
        messages=SHOP.message,  # the agent's wording, as gate_for gives it
    )


def step(deadline_at: float | None, order_id: str) -> CheckToolCalls:
    turn = Turn(
        turn_id="turn_1", request_id="req_1", conversation_id="conv_1", customer_id="cus_1001", deadline_at=deadline_at
    )
    calls = [
        ToolCall(id="toolu_1", name="lookup_order", input={"order_id": order_id}, fingerprint="fp"),
        ToolCall(id="toolu_2", name="list_orders", input={}, fingerprint="fp2"),
    ]
    return CheckToolCalls(turn=turn, step=1, messages=[], calls=calls)


async def test_a_backend_away_before_the_deadline_holds_the_step_as_a_backends_wait_due_at_the_deadline(shop):
    deadline = round(time.time() + 60, 3)
    with pytest.raises(faults.RetryLater) as later:
        await away_gate(shop, "ord_a1000003").check(step(deadline, "ord_a1000003"))
    assert later.value.backend and later.value.until == deadline and later.value.dependency == faults.HTTP


async def test_a_backend_still_away_at_the_deadline_refuses_that_call_and_answers_the_step(shop):
    gate = away_gate(shop, "ord_a1000003")
    batch = await gate.check(step(time.time() - 0.1, "ord_a1000003"))
    stuck, other = batch.calls
    assert not stuck.approved and stuck.error == SHOP.message("lookup_failed")
    assert other.approved  # the step's other call is checked as ever
    # signed (bound to the passed deadline: no executor runs it; the guard ends the turn)
    GATE_KEYS.verifier.verify(batch)


async def test_a_policy_whose_backend_is_away_holds_its_conversation_and_a_bug_in_it_does_not():
    spec = SHOP.registry.get("list_orders")
    ctx = ToolContext(customer_id="cus_1001", tool_use_id="toolu_1", idempotency_key="t:toolu_1")

    async def no_entities(kind, entity_id, customer_id):
        raise AssertionError("list_orders references no entity")

    async def away(tool_input, entities, ctx):
        raise httpx.ConnectError("All connection attempts failed")

    async def buggy(tool_input, entities, ctx):
        raise KeyError("status")

    with pytest.raises(faults.RetryLater) as later:
        await authorize(spec, {}, ctx, no_entities, away, {}, gate_message, ())
    assert later.value.backend and later.value.dependency == faults.HTTP
    with pytest.raises(KeyError):  # the gate's check_call turns it into internal_error, as ever
        await authorize(spec, {}, ctx, no_entities, buggy, {}, gate_message, ())
