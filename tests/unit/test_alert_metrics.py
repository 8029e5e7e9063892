"""The metrics the alert rules (deploy/prometheus) need beyond the fleet's first ones, each moved where its fact is
known: the sweeper's stuck flags, the approvals waiting for a person (the guard's ledger pass) and each reply's
latency with its trace id as exemplar (the gateway), and each consumer's lag per topic (the kernel's consumer)."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

from aiokafka import TopicPartition
from prometheus_client import REGISTRY
from prometheus_client.openmetrics.exposition import generate_latest

from roundtrip._guard.retention import Retention
from roundtrip._kernel.kafka import lag
from roundtrip._kernel.observability import metrics
from roundtrip._kernel.storage.turnstore import approvals
from roundtrip._kernel.wire.events import StartTurn
from tests.consumers import key_ordered
from tests.unit.test_guard_handlers import TURN, guard  # noqa: F401 - fixture


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def test_a_turn_flagged_stuck_is_counted_once_per_stall(guard):  # noqa: F811
    before = sample("roundtrip_stuck_turns_total")
    await guard.starts.on_start(StartTurn(turn=TURN, text="hi"))
    t0 = (await guard.ledger.get("turn_1")).last_progress_at
    assert await guard.sweeper.sweep(guard.recorder.flag, now=t0 + 10) == (0, 0)
    assert sample("roundtrip_stuck_turns_total") == before  # idle, not yet stuck
    assert await guard.sweeper.sweep(guard.recorder.flag, now=t0 + 61) == (1, 0)
    assert await guard.sweeper.sweep(guard.recorder.flag, now=t0 + 62) == (0, 0)
    assert sample("roundtrip_stuck_turns_total") == before + 1


def pending(approval_id: str, at: float) -> dict:
    return dict(
        approval_id=approval_id, turn_id=f"t_{approval_id}", step=1, tool_use_id="toolu_1", tool="cancel_order",
        input_sha256="0" * 64, customer_id="cus_1", conversation_id=f"c_{approval_id}", status="pending", reason="r",
        requested_at=at, expires_at=at + 3600, request_json="{}",
    )  # fmt: skip


async def test_the_ledger_pass_gauges_the_approvals_waiting_and_the_oldest_ones_wait(guard):  # noqa: F811
    retention, now = Retention(guard.ledger, 14 * 86400), time.time()
    await retention.measure(now)
    assert sample("roundtrip_approvals_waiting") == 0 and sample("roundtrip_approval_oldest_wait_seconds") == 0
    decided = pending("appr_done", now - 9000) | {"status": "approved"}
    rows = [pending("appr_1", now - 600), pending("appr_2", now - 30), decided]
    await guard.ledger._run(lambda conn: conn.execute(approvals.insert(), rows), write=True)
    await retention.measure(now)
    assert sample("roundtrip_approvals_waiting") == 2  # the decided one no longer waits
    assert sample("roundtrip_approval_oldest_wait_seconds") == 600


def test_a_reply_is_timed_from_the_requests_arrival_by_lane_with_its_trace_id_as_exemplar():
    turn = SimpleNamespace(
        started_at=1000.0, trace_id="4bf92f3577b34da6a3ce929d0e0e4736", lane="interactive", agent_version=""
    )
    chat = {"outcome": "end_turn", "agent_version": "default", "lane": "interactive"}
    batch = {**chat, "lane": "batch"}
    count, batches = sample("roundtrip_reply_seconds_count", **chat), sample("roundtrip_reply_seconds_count", **batch)
    slow = sample("roundtrip_reply_seconds_bucket", **chat, le="8.0")
    metrics.count_reply(turn, "end_turn", now=1007.5)
    assert sample("roundtrip_reply_seconds_count", **chat) == count + 1
    assert sample("roundtrip_reply_seconds_bucket", **chat, le="8.0") == slow + 1
    exposition = generate_latest(REGISTRY).decode()
    bucket = 'roundtrip_reply_seconds_bucket{agent_version="default",lane="interactive",le="8.0",outcome="end_turn"}'
    line = next(x for x in exposition.splitlines() if x.startswith(bucket))
    assert '# {trace_id="4bf92f3577b34da6a3ce929d0e0e4736"} 7.5' in line
    hour = sample("roundtrip_reply_seconds_bucket", **batch, le="3600.0")
    metrics.count_reply(
        SimpleNamespace(started_at=1000.0, trace_id="", lane="batch", agent_version=""), "end_turn", now=3500.0
    )
    assert sample("roundtrip_reply_seconds_count", **batch) == batches + 1  # its own series, not the chat's
    assert sample("roundtrip_reply_seconds_bucket", **batch, le="3600.0") == hour + 1
    assert sample("roundtrip_reply_seconds_count", **chat) == count + 1
    metrics.count_reply(
        SimpleNamespace(started_at=0.0, trace_id="", lane="interactive", agent_version=""), "end_turn", now=1007.5
    )
    assert sample("roundtrip_reply_seconds_count", **chat) == count + 1  # no start known


class Broker:
    """The two questions the lag asks of aiokafka: the partitions' end offsets and the group's committed offset."""

    def __init__(self, ends: dict, committed: dict) -> None:
        self.ends, self.committed_offsets = ends, committed

    async def end_offsets(self, partitions):
        return {tp: self.ends[tp] for tp in partitions}

    async def committed(self, tp):
        return self.committed_offsets.get(tp)


async def test_the_consumer_lag_is_per_topic_from_the_end_offsets_and_a_revoked_topic_falls_to_zero():
    a0, a1, b0 = TopicPartition("a", 0), TopicPartition("a", 1), TopicPartition("b", 0)
    broker, shown = Broker({a0: 100, a1: 50, b0: 7}, {a1: 20}), set()
    # a0: unfinished from offset 90; a1: nothing handed out yet, the group committed 20; b0: never committed
    await lag.measure("executor", broker, {a0: 90, a1: None, b0: None}, shown)
    assert sample("roundtrip_consumer_lag", consumer="executor", topic="a") == 10 + 30
    assert sample("roundtrip_consumer_lag", consumer="executor", topic="b") == 0
    broker.ends[a0] = 160  # a stalled consumer: the end moves on, its progress does not
    await lag.measure("executor", broker, {a0: 90}, shown)
    assert sample("roundtrip_consumer_lag", consumer="executor", topic="a") == 70
    assert shown == {"a"}


async def test_a_consumer_measures_its_lag_while_it_runs_and_stops_with_its_drain(monkeypatch):
    measured = asyncio.Event()

    async def measure(name, kafka, done_up_to, shown):
        assert name == "lagging" and done_up_to == {}
        measured.set()

    monkeypatch.setattr(lag, "measure", measure)
    consumer, kafka = key_ordered(process=handle, name="lagging"), Idle()
    running = asyncio.create_task(consumer.run(kafka))
    await asyncio.wait_for(measured.wait(), 5)
    await consumer.drain()
    await asyncio.wait_for(running, 5)
    assert consumer._lag is not None and consumer._lag.done()


async def handle(record) -> None:
    raise AssertionError("no record is fetched")


class Idle:
    def assignment(self):
        return set()

    async def getmany(self, timeout_ms=0, max_records=None):
        await asyncio.sleep(0.01)  # a fake poll's wait: the consumer loop yields as on a real broker
        return {}
