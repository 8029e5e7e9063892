"""The guard's turn ledger and the turn fence on both databases they support: a SQLite file and PostgreSQL."""

from __future__ import annotations

import asyncio
import time
import uuid
from types import SimpleNamespace

import pytest

from roundtrip._guard import ledger as ledger_module
from roundtrip._guard.ledger import ENDED, ENDING, RUNNING, STUCK, Ledger
from roundtrip._kernel.storage.turnstore import Fence
from tests.databases import migrated
from tests.ledger_steps import advance, approvals_of, flag_stuck


@pytest.fixture(params=["sqlite", "postgresql"])
async def ledger(request, tmp_path):
    if request.param == "sqlite":
        url = f"sqlite+aiosqlite:///{tmp_path / 'ledger.db'}"
    else:
        url = request.getfixturevalue("postgres_url")
    ledger = await Ledger.open(await migrated(url))
    ledger.url = url
    yield ledger
    await ledger.close()


@pytest.fixture
async def fence(ledger):
    """The fence as the executor and the model service open it: its own engine on the same database."""
    fence = await Fence.open(ledger.url)
    yield fence
    await fence.close()


def key(t: dict) -> SimpleNamespace:
    """The turn as the fence and the ledger take it: its id and principal."""
    return SimpleNamespace(**t)


def turn(**extra):
    tid = f"turn_{uuid.uuid4().hex[:12]}"
    return {
        "turn_id": tid,
        "request_id": f"req_{tid}",
        "conversation_id": "conv",
        "customer_id": "cus_1001",
        "trace_id": "ab" * 16,
        **extra,
    }


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
    assert await advance(ledger, key(t), 1, USAGE, 0.01, pending="x", now=time.time()) is True
    assert await advance(ledger, key(t), 1, USAGE, 0.01, pending="x", now=time.time()) is False  # duplicate step
    assert await advance(ledger, key(t), 3, USAGE, 0.01, pending="x", now=time.time()) is False  # a gap
    assert await advance(ledger, key(t), 2, USAGE, 0.02, pending="y", outcome="end_turn", now=time.time()) is True
    assert (
        await advance(ledger, key(t), 3, USAGE, 0.03, pending="z", now=time.time()) is False
    )  # ended turns do not move
    row = await ledger.get(t["turn_id"])
    assert (row.status, row.step, row.outcome, row.cost_usd, row.input_tokens, row.pending) == (
        ENDED,
        2,
        "end_turn",
        0.02,
        10,
        "y",
    )
    await ledger.published(t["turn_id"], "x")  # a late clean-up of an earlier decision leaves the newer one alone
    assert (await ledger.get(t["turn_id"])).pending == "y"
    await ledger.published(t["turn_id"], "y")
    assert (await ledger.get(t["turn_id"])).pending is None


async def test_racing_replicas_cannot_both_take_a_step(ledger):
    t = turn()
    await ledger.start(t, pending="{}")
    results = await asyncio.gather(
        *(advance(ledger, key(t), 1, USAGE, 0.0, pending="p", now=time.time()) for _ in range(8))
    )
    assert sorted(results) == [False] * 7 + [True]


async def test_idle_turns_are_flagged_then_expire_and_end_once(ledger):
    t = turn()
    await ledger.start(t, pending="{}", now=1000.0)
    idle, expired, _ = await ledger.overdue(now=1061.0, stuck_after_s=60, grace_s=30, deadline_s=300)
    assert t["turn_id"] in [r.turn_id for r in idle] and t["turn_id"] not in [r.turn_id for r in expired]
    assert await flag_stuck(ledger, t["turn_id"], now=1061.0) is True
    assert await flag_stuck(ledger, t["turn_id"], now=1062.0) is False
    assert (await ledger.get(t["turn_id"])).status == STUCK
    _, expired, _ = await ledger.overdue(now=1092.0, stuck_after_s=60, grace_s=30, deadline_s=300)
    assert t["turn_id"] in [r.turn_id for r in expired]
    assert await ledger.end(t["turn_id"], "deadline", pending="e") == ENDED
    assert await ledger.end(t["turn_id"], "deadline", pending="e") is None
    assert (await ledger.get(t["turn_id"])).outcome == "deadline"


async def test_progress_unflags_a_stuck_turn(ledger):
    t = turn()
    await ledger.start(t, pending="{}", now=1000.0)
    await flag_stuck(ledger, t["turn_id"], now=1061.0)
    assert await advance(ledger, key(t), 1, USAGE, 0.0, pending="p", now=1070.0) is True
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


# -- the fence: claims by the executor and the model service, ends conditional on what was decided from --


async def test_a_claim_succeeds_only_while_the_turn_is_live_at_that_step_and_before_its_deadline(ledger, fence):
    t = turn()
    await ledger.start(t, pending="{}", now=1000.0, deadline_at=1300.0)
    assert await fence.claim_model_call(key(t), 0, now=1001.0) is True
    assert await fence.claim_batch(key(t), 1, lease_s=15, now=1002.0) is False  # the turn is not at step 1 yet
    await advance(ledger, key(t), 1, USAGE, 0.0, pending="p", now=1003.0)
    assert await fence.claim_batch(key(t), 1, lease_s=15, now=1004.0) is True
    assert (
        await fence.claim_batch(key(t), 1, lease_s=15, now=1005.0) is True
    )  # a redelivery re-claims (idempotent calls)
    assert await fence.claim_batch(key(t), 0, lease_s=15, now=1005.0) is False  # a step the turn has left
    row = await ledger.get(t["turn_id"])
    assert (row.lease_step, row.lease_until) == (1, 1020.0)
    assert await fence.claim_model_call(key(t), 1, now=1006.0) is True  # the calls are done: lease released
    assert (await ledger.get(t["turn_id"])).lease_until is None
    assert await fence.claim_batch(key(t), 1, lease_s=15, now=1300.0) is False  # at the deadline
    assert await fence.claim_model_call(key(t), 1, now=1300.5) is False
    assert await fence.claim_batch(key(turn(turn_id="turn_unknown")), 1, lease_s=15, now=time.time()) is False


async def test_nothing_can_be_claimed_after_the_end(ledger, fence):
    t = turn()
    await ledger.start(t, pending="{}", now=1000.0, deadline_at=1300.0)
    await advance(ledger, key(t), 1, USAGE, 0.0, pending="p", now=1001.0)
    assert await ledger.end(t["turn_id"], "cancelled", pending="e", step=1, now=1002.0) == ENDED  # the end wins
    assert await fence.claim_batch(key(t), 1, lease_s=15, now=1003.0) is False
    assert await fence.claim_model_call(key(t), 1, now=1003.0) is False


async def test_an_end_waits_for_a_claimed_batch_then_lands_after_it(ledger, fence):
    t = turn()
    await ledger.start(t, pending="{}", now=1000.0, deadline_at=1300.0)
    await advance(ledger, key(t), 1, USAGE, 0.0, pending="p", now=1001.0)
    assert await fence.claim_batch(key(t), 1, lease_s=15, now=1002.0) is True  # the claim wins
    assert (
        await ledger.end(t["turn_id"], "cancelled", pending="e", step=1, now=1003.0) is None
    )  # no end under a live lease
    assert await ledger.end(t["turn_id"], "cancelled", pending="e", step=1, now=1003.0, defer=True) == ENDING
    row = await ledger.get(t["turn_id"])
    assert (row.status, row.outcome, row.pending) == (ENDING, "cancelled", "e")
    assert await fence.claim_batch(key(t), 1, lease_s=15, now=1004.0) is False  # no new claim, not even a redelivery
    assert await ledger.finish_ending(t["turn_id"], now=1005.0) is False  # the claimed calls may still be running
    await ledger.published(t["turn_id"], "e")
    assert (await ledger.get(t["turn_id"])).pending == "e"  # an ENDING turn's end is not out yet
    assert (
        await fence.claim_model_call(key(t), 1, now=1006.0) is False
    )  # the executor is done: no model call, lease released
    assert await ledger.finish_ending(t["turn_id"], now=1006.5) is True
    row = await ledger.get(t["turn_id"])
    assert (row.status, row.outcome, row.ended_at, row.pending) == (ENDED, "cancelled", 1006.5, "e")


async def test_a_lease_that_runs_out_no_longer_holds_the_end_back(ledger, fence):
    t = turn()
    await ledger.start(t, pending="{}", now=1000.0)
    await advance(ledger, key(t), 1, USAGE, 0.0, pending="p", now=1001.0)
    await fence.claim_batch(key(t), 1, lease_s=15, now=1002.0)
    assert await ledger.end(t["turn_id"], "deadline", pending="e", step=1, now=1016.9) is None
    assert await ledger.end(t["turn_id"], "deadline", pending="e", step=1, now=1017.0) == ENDED


async def test_ends_are_conditional_on_the_state_they_were_decided_from(ledger):
    t = turn()
    await ledger.start(t, pending="{}", now=1000.0)
    await flag_stuck(ledger, t["turn_id"], now=1061.0, stuck_after_s=60)
    stale = await ledger.get(t["turn_id"])
    await advance(ledger, key(t), 1, USAGE, 0.0, pending="p", now=1095.0)  # it moved after the sweeper read it
    assert (
        await ledger.end(
            t["turn_id"],
            "deadline",
            pending="e",
            step=stale.step,
            status=STUCK,
            flagged_at=stale.flagged_at,
            now=1095.1,
            defer=True,
        )
        is None
    )
    row = await ledger.get(t["turn_id"])
    assert (row.status, row.step) == (RUNNING, 1)
    # flagged again later: an end decided from the earlier flag does not end it either
    await flag_stuck(ledger, t["turn_id"], now=1160.0, stuck_after_s=60)
    assert (
        await ledger.end(
            t["turn_id"], "deadline", pending="e", step=1, status=STUCK, flagged_at=stale.flagged_at, now=1200.0
        )
        is None
    )
    current = await ledger.get(t["turn_id"])
    assert (
        await ledger.end(
            t["turn_id"], "deadline", pending="e", step=1, status=STUCK, flagged_at=current.flagged_at, now=1200.0
        )
        == ENDED
    )


async def test_a_turn_is_flagged_only_when_still_idle_at_the_moment_of_the_flag(ledger):
    t = turn()
    await ledger.start(t, pending="{}", now=1000.0)
    assert await flag_stuck(ledger, t["turn_id"], now=1059.0, stuck_after_s=60) is False
    await advance(ledger, key(t), 1, USAGE, 0.0, pending="p", now=1050.0)
    assert await flag_stuck(ledger, t["turn_id"], now=1070.0, stuck_after_s=60, step=0) is False  # decided at step 0
    assert await flag_stuck(ledger, t["turn_id"], now=1110.0, stuck_after_s=60, step=1) is True


async def test_the_outbox_lists_unpublished_decisions_until_they_are_published(ledger, monkeypatch):
    monkeypatch.setattr(ledger_module, "OUTBOX_BATCH", 10_000)  # past the other tests' turns in a shared database
    a, b = turn(), turn()
    await ledger.start(a, pending="call-a", now=1000.0)
    await ledger.start(b, pending="call-b", now=1000.0)
    await ledger.published(b["turn_id"], "call-b")
    await ledger.end(a["turn_id"], "cancelled", pending="end-a", now=1010.0)
    pending = {r.turn_id: r.pending for r in await ledger.outbox(older_than=1011.0)}
    assert pending.get(a["turn_id"]) == "end-a" and b["turn_id"] not in pending
    assert a["turn_id"] not in {r.turn_id for r in await ledger.outbox(older_than=1009.0)}  # too fresh


# -- approvals by a person (issue 11) ---------------------------------------------------------------


def approval_of(t: dict, step: int = 1, expires_in: float = 60.0) -> dict:
    now = time.time()
    return dict(
        approval_id=f"appr_{t['turn_id'][5:]}",
        turn_id=t["turn_id"],
        step=step,
        tool_use_id="toolu_c",
        tool="cancel_order",
        input_sha256="d" * 64,
        customer_id=t["customer_id"],
        conversation_id=t["conversation_id"],
        reason="above 50.00 EUR",
        requested_at=now,
        expires_at=now + expires_in,
        traceparent=None,
        request_json="{}",
    )


async def test_a_waiting_turn_is_fenced_unflagged_and_resumed_once(ledger, fence):
    from roundtrip._guard.ledger import AWAITING

    t = turn()
    await ledger.start(t, "{}", deadline_at=time.time() + 300)
    assert await advance(ledger, key(t), 1, USAGE, 0.01, "{}", now=time.time())
    assert await fence.claim_batch(key(t), 1, 30, now=time.time())  # the executor runs the step's other calls ...
    approval = approval_of(t)
    assert await ledger.await_approval(approval, None)  # ... and its held call waits
    assert not await ledger.await_approval(approval, None)  # the same request twice
    row = await ledger.get(t["turn_id"])
    assert (
        row.status == AWAITING and row.lease_until is None and row.deadline_at == pytest.approx(approval["expires_at"])
    )
    assert not await fence.claim_batch(key(t), 1, 30, now=time.time()) and not await fence.claim_model_call(
        key(t), 1, now=time.time()
    )
    assert not await flag_stuck(ledger, t["turn_id"], time.time() + 3600)  # the stuck rule does not apply
    idle, expired, _ = await ledger.overdue(time.time() + 3600, 1, 1, 300)
    assert t["turn_id"] not in {r.turn_id for r in idle + expired}
    assert [r.approval_id for r in await approvals_of(ledger, turn_id=t["turn_id"])] == [approval["approval_id"]]
    assert approval["approval_id"] in [a.approval_id for a, _ in await ledger.overdue_approvals(time.time() + 61)]

    decided = [
        ledger.decide(
            approval["approval_id"], "approved", f"person{i}", time.time(), "", f'{{"n": {i}}}', time.time() + 400
        )
        for i in range(4)
    ]
    assert sorted(await asyncio.gather(*decided)) == [False, False, False, True]  # one decision wins, however many race
    row = await ledger.get(t["turn_id"])
    assert row.status == RUNNING and row.pending.startswith('{"n": ')
    (kept,) = await approvals_of(ledger, status=None, turn_id=t["turn_id"])
    assert kept.status == "approved" and kept.decided_by == f"person{row.pending[6]}"
    assert await fence.claim_batch(key(t), 1, 30, now=time.time())  # the approved call may run now


async def test_a_decision_for_a_turn_that_ended_while_waiting_changes_nothing(ledger):
    t = turn()
    await ledger.start(t, "{}", deadline_at=time.time() + 300)
    await advance(ledger, key(t), 1, USAGE, 0.01, "{}", now=time.time())
    approval = approval_of(t)
    assert await ledger.await_approval(approval, None)
    assert await ledger.end(t["turn_id"], "cancelled", "{}", step=1) == ENDED  # a waiting turn can be cancelled
    assert not await ledger.decide(approval["approval_id"], "approved", "alice", time.time(), "", "{}", None)
    (still,) = await approvals_of(ledger, status=None, turn_id=t["turn_id"])
    assert (
        still.status == "pending" and await approvals_of(ledger, turn_id=t["turn_id"]) == []
    )  # no longer listed as waiting
    assert await ledger.close_approvals(t["turn_id"], "ended") == 1
    assert (await ledger.get(t["turn_id"])).status == ENDED


async def test_a_gateway_reads_which_of_its_running_turns_have_ended(ledger):
    """Services/_gateway/throttle.py: the turns whose outcome another gateway replica read (an IN list of ids)."""
    running, ended = turn(), turn()
    for t in (running, ended):
        assert await ledger.start(t, pending="{}") is True
    assert await ledger.end(ended["turn_id"], "cancelled", pending="{}") is not None
    ids = [running["turn_id"], ended["turn_id"], "turn_unknown"]
    assert await ledger.ended_among(ids) == {ended["turn_id"]}
    assert await ledger.ended_among([]) == set()
