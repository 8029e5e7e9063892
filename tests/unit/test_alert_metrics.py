"""The metrics the alert rules (deploy/prometheus) need beyond the fleet's first ones, each moved where its fact is
known: the sweeper's stuck flags, the approvals waiting for a person (the guard's ledger pass) and each reply's
latency with its trace id as exemplar (the gateway)."""

from __future__ import annotations

import time
from types import SimpleNamespace

from prometheus_client import REGISTRY
from prometheus_client.openmetrics.exposition import generate_latest

from roundtrip._guard.retention import Retention
from roundtrip._kernel.observability import metrics
from roundtrip._kernel.storage.turnstore import approvals
from roundtrip._kernel.wire.events import StartTurn
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


def test_a_reply_is_timed_from_the_requests_arrival_with_its_trace_id_as_exemplar():
    turn = SimpleNamespace(started_at=1000.0, trace_id="4bf92f3577b34da6a3ce929d0e0e4736")
    count = sample("roundtrip_reply_seconds_count", outcome="end_turn")
    slow = sample("roundtrip_reply_seconds_bucket", outcome="end_turn", le="8.0")
    metrics.count_reply(turn, "end_turn", now=1007.5)
    assert sample("roundtrip_reply_seconds_count", outcome="end_turn") == count + 1
    assert sample("roundtrip_reply_seconds_bucket", outcome="end_turn", le="8.0") == slow + 1
    exposition = generate_latest(REGISTRY).decode()
    line = next(x for x in exposition.splitlines() if x.startswith('roundtrip_reply_seconds_bucket{le="8.0"'))
    assert '# {trace_id="4bf92f3577b34da6a3ce929d0e0e4736"} 7.5' in line
    metrics.count_reply(SimpleNamespace(started_at=0.0, trace_id=""), "end_turn", now=1007.5)  # no start known
    assert sample("roundtrip_reply_seconds_count", outcome="end_turn") == count + 1
