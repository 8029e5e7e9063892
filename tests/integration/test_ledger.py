"""The guard's turn ledger on both databases it supports: a SQLite file and PostgreSQL."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from services.guard.ledger import ENDED, RUNNING, STUCK, Ledger


@pytest.fixture(params=["sqlite", "postgresql"])
async def ledger(request, tmp_path):
    if request.param == "sqlite":
        url = f"sqlite+aiosqlite:///{tmp_path / 'ledger.db'}"
    else:
        url = request.getfixturevalue("postgres_url")
    ledger = await Ledger.open(url)
    yield ledger
    await ledger.close()


def turn(**extra):
    tid = f"turn_{uuid.uuid4().hex[:12]}"
    return {"turn_id": tid, "request_id": f"req_{tid}", "conversation_id": "conv", "customer_id": "cus_1001", "trace_id": "ab" * 16, **extra}


USAGE = {"input_tokens": 10, "output_tokens": 2, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 5}


async def test_a_turn_starts_once(ledger):
    t = turn()
    assert await ledger.start(t, pending="{}") is True
    assert await ledger.start(t, pending="{}") is False  # a duplicated request
    row = await ledger.get(t["turn_id"])
    assert (row.status, row.step, row.customer_id, row.turn["turn_id"]) == (RUNNING, 0, "cus_1001", t["turn_id"])


async def test_each_step_advances_once_and_only_in_order(ledger):
    t = turn()
    await ledger.start(t, pending="{}")
    assert await ledger.advance(t["turn_id"], 1, USAGE, 0.01, pending="x") is True
    assert await ledger.advance(t["turn_id"], 1, USAGE, 0.01, pending="x") is False  # duplicate step
    assert await ledger.advance(t["turn_id"], 3, USAGE, 0.01, pending="x") is False  # a gap
    assert await ledger.advance(t["turn_id"], 2, USAGE, 0.02, pending="y", outcome="end_turn") is True
    assert await ledger.advance(t["turn_id"], 3, USAGE, 0.03, pending="z") is False  # ended turns do not move
    row = await ledger.get(t["turn_id"])
    assert (row.status, row.step, row.outcome, row.cost_usd, row.input_tokens, row.pending) == (ENDED, 2, "end_turn", 0.02, 10, "y")
    await ledger.published(t["turn_id"], 1)  # a late clean-up of an earlier step leaves the newer decision alone
    assert (await ledger.get(t["turn_id"])).pending == "y"
    await ledger.published(t["turn_id"], 2)
    assert (await ledger.get(t["turn_id"])).pending is None


async def test_racing_replicas_cannot_both_take_a_step(ledger):
    t = turn()
    await ledger.start(t, pending="{}")
    results = await asyncio.gather(*(ledger.advance(t["turn_id"], 1, USAGE, 0.0, pending="p") for _ in range(8)))
    assert sorted(results) == [False] * 7 + [True]


async def test_idle_turns_are_flagged_then_expire_and_end_once(ledger):
    t = turn()
    await ledger.start(t, pending="{}", now=1000.0)
    idle, expired = await ledger.overdue(now=1061.0, stuck_after_s=60, grace_s=30, deadline_s=300)
    assert [r.turn_id for r in idle] == [t["turn_id"]] and expired == []
    assert await ledger.flag_stuck(t["turn_id"], now=1061.0) is True
    assert await ledger.flag_stuck(t["turn_id"], now=1062.0) is False
    assert (await ledger.get(t["turn_id"])).status == STUCK
    _, expired = await ledger.overdue(now=1092.0, stuck_after_s=60, grace_s=30, deadline_s=300)
    assert [r.turn_id for r in expired] == [t["turn_id"]]
    assert await ledger.end(t["turn_id"], "deadline", pending="e") is True
    assert await ledger.end(t["turn_id"], "deadline", pending="e") is False
    assert (await ledger.get(t["turn_id"])).outcome == "deadline"


async def test_progress_unflags_a_stuck_turn(ledger):
    t = turn()
    await ledger.start(t, pending="{}", now=1000.0)
    await ledger.flag_stuck(t["turn_id"], now=1061.0)
    assert await ledger.advance(t["turn_id"], 1, USAGE, 0.0, pending="p", now=1070.0) is True
    row = await ledger.get(t["turn_id"])
    assert (row.status, row.flagged_at) == (RUNNING, None)


async def test_listing_filters_by_status_and_customer(ledger):
    a, b = turn(), turn(customer_id="cus_1002")
    b["customer_id"] = "cus_1002"
    await ledger.start(a, pending="{}")
    await ledger.start(b, pending="{}")
    await ledger.end(a["turn_id"], "cancelled", pending="e")
    mine = {r.turn_id for r in await ledger.list(customer_id="cus_1002")}
    assert b["turn_id"] in mine and a["turn_id"] not in mine
    assert a["turn_id"] in {r.turn_id for r in await ledger.list(status="ended", limit=500)}
