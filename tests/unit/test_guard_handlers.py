"""The guard's handlers with a real (SQLite) ledger and a recording publisher in place of Kafka."""

from __future__ import annotations

import json
import time

import pytest

from roundtrip._guard.ledger import Ledger
from roundtrip._guard.replies import Replies
from roundtrip._guard.rules import Policy
from roundtrip._kernel.wire import topics
from roundtrip._kernel.wire.events import (
    CancelTurn,
    ModelResponded,
    Outcome,
    StartTurn,
    SupportStatus,
    ToolCall,
    Turn,
    TurnState,
    Usage,
)
from roundtrip._kernel.wire.fingerprints import fingerprint
from tests.cores import guard as guard_of
from tests.databases import migrated
from tests.prices import price_table

TURN = Turn(turn_id="turn_1", request_id="req_1", conversation_id="conv_1", customer_id="cus_1001", trace_id="0" * 32)
PRICES = price_table()


class Recorder:
    """The guard's publishes: its decisions in `sent`, the progress it tells the app (support.status, working) apart."""

    def __init__(self):
        self.sent: list[tuple[str, object]] = []
        self.progress: list[SupportStatus] = []
        self.flags: list[object] = []

    async def __call__(self, topic, message, conversation_id):
        if topic == topics.SUPPORT_STATUS and message.state == TurnState.WORKING:
            self.progress.append(message)
        else:
            self.sent.append((topic, message))

    async def flag(self, message, conversation_id):
        self.flags.append(message)


@pytest.fixture
async def guard(tmp_path):
    ledger = await Ledger.open(await migrated(f"sqlite+aiosqlite:///{tmp_path / 'ledger.db'}"))
    recorder = Recorder()
    g = guard_of(
        ledger=ledger,
        policy=Policy(replies=Replies()),
        prices=PRICES,
        publish=recorder,
        model="claude-sonnet-4-6",
        stuck_after_s=60,
        stuck_grace_s=30,
        turn_deadline_s=300,
    )
    g.recorder = recorder
    g.outbox.progress = {"list_orders": "Looking up your orders"}  # the agent's words (Agent.progress)
    yield g
    await g.outbox.drain()
    await ledger.close()


def iteration(step, stop_reason="tool_use", calls=(), messages=None):
    calls = list(calls)
    content = [{"type": "tool_use", "id": c.id, "name": c.name, "input": c.input} for c in calls] or [
        {"type": "text", "text": "Done."}
    ]
    usage = Usage(input_tokens=100, output_tokens=10)
    return ModelResponded(
        turn=TURN,
        step=step,
        messages=messages or [{"role": "user", "content": "hi"}],
        content=content,
        stop_reason=stop_reason,
        tool_calls=calls,
        usage=usage,
        spent=Usage(input_tokens=100 * step, output_tokens=10 * step),
        model="claude-sonnet-4-6",
    )


LIST = ToolCall(id="toolu_1", name="list_orders", input={}, fingerprint=fingerprint("list_orders", {}))


async def test_a_turn_starts_once_even_when_the_request_is_duplicated(guard):
    assert await guard.starts.on_start(StartTurn(turn=TURN, text="hi")) == "started"
    await guard.outbox.drain()
    assert await guard.starts.on_start(StartTurn(turn=TURN, text="hi")) == "duplicate"
    assert [t for t, _ in guard.recorder.sent] == [topics.MODEL_CALLS]


async def test_the_ledger_records_which_agent_started_the_turn_and_the_turn_carries_it(tmp_path):
    ledger = await Ledger.open(await migrated(f"sqlite+aiosqlite:///{tmp_path / 'digest.db'}"))
    recorder = Recorder()
    g = guard_of(
        ledger=ledger,
        policy=Policy(replies=Replies()),
        prices=PRICES,
        publish=recorder,
        agent_digest="0123456789abcdef",
    )
    try:
        assert await g.starts.on_start(StartTurn(turn=TURN, text="hi")) == "started"
        assert (await ledger.get(TURN.turn_id)).agent_digest == "0123456789abcdef"
        await g.outbox.drain()
        (first,) = [m for t, m in recorder.sent if t == topics.MODEL_CALLS]
        assert first.turn.agent_digest == "0123456789abcdef"  # every service compares it with its own
    finally:
        await g.outbox.drain()
        await ledger.close()


async def test_an_iteration_moves_the_turn_once(guard):
    await guard.starts.on_start(StartTurn(turn=TURN, text="hi"))
    assert await guard.loop.on_iteration(iteration(1, calls=[LIST])) == "CheckToolCalls"
    await guard.outbox.drain()
    assert await guard.loop.on_iteration(iteration(1, calls=[LIST])) == "duplicate"
    assert await guard.loop.on_iteration(iteration(2, stop_reason="end_turn")) == "end_turn"
    await guard.outbox.drain()
    assert await guard.loop.on_iteration(iteration(3, stop_reason="end_turn")) == "duplicate"
    assert await guard.loop.on_iteration(iteration(2, stop_reason="end_turn")) == "duplicate"
    sent = [t for t, _ in guard.recorder.sent]
    assert sent == [topics.MODEL_CALLS, topics.TOOL_CALLS, topics.OUTCOMES]
    ended = guard.recorder.sent[-1][1]
    assert (
        ended.outcome is Outcome.END_TURN
        and ended.text == "Done."
        and ended.cost_usd == pytest.approx((200 * 3 + 20 * 15) / 1e6)
    )
    row = await guard.ledger.get("turn_1")
    assert (row.status, row.step, row.outcome, row.input_tokens) == ("ended", 2, "end_turn", 200)


async def test_every_step_of_a_turn_is_told_as_working_with_the_agents_words_for_its_tools(guard):
    """support.status: step 1 at the start, step 2 as its tools go to the gate (their words), none for the end."""
    await guard.starts.on_start(StartTurn(turn=TURN, text="hi"))
    other = ToolCall(id="toolu_2", name="search_help_center", input={}, fingerprint=fingerprint("search", {}))
    await guard.loop.on_iteration(iteration(1, calls=[LIST, other]))
    await guard.loop.on_iteration(iteration(2, stop_reason="end_turn"))
    told = [(s.state, s.step, s.activity, s.turn_id, s.request_id) for s in guard.recorder.progress]
    assert told == [
        (TurnState.WORKING, 1, "", "turn_1", "req_1"),
        (TurnState.WORKING, 2, "Looking up your orders", "turn_1", "req_1"),  # a tool without words says nothing
    ]
    assert [t for t, _ in guard.recorder.sent] == [topics.MODEL_CALLS, topics.TOOL_CALLS, topics.OUTCOMES]


async def test_a_status_the_broker_refuses_does_not_hold_up_the_decision(guard):
    async def no_status(topic, message, conversation_id):
        if topic == topics.SUPPORT_STATUS:
            raise RuntimeError("broker refused")
        await guard.recorder(topic, message, conversation_id)

    guard.outbox.publish = no_status
    assert await guard.starts.on_start(StartTurn(turn=TURN, text="hi")) == "started"
    assert [t for t, _ in guard.recorder.sent] == [topics.MODEL_CALLS] and guard.recorder.progress == []


async def test_a_decision_recorded_but_not_published_is_republished_on_redelivery(guard):
    await guard.starts.on_start(StartTurn(turn=TURN, text="hi"))

    async def crash(topic, message, conversation_id):
        raise ConnectionError("broker gone")

    guard.outbox.publish = crash
    with pytest.raises(ConnectionError):
        await guard.loop.on_iteration(iteration(1, calls=[LIST]))
    guard.outbox.publish = guard.recorder
    assert await guard.loop.on_iteration(iteration(1, calls=[LIST])) == "republished"
    assert [t for t, _ in guard.recorder.sent][-1] == topics.TOOL_CALLS
    await guard.outbox.drain()
    assert await guard.loop.on_iteration(iteration(1, calls=[LIST])) == "duplicate"  # published now: a plain duplicate


async def test_stuck_turns_are_flagged_then_ended_politely_once(guard):
    await guard.starts.on_start(StartTurn(turn=TURN, text="hi"))
    row = await guard.ledger.get("turn_1")
    t0 = row.last_progress_at
    assert await guard.sweeper.sweep(guard.recorder.flag, now=t0 + 10) == (0, 0)
    assert await guard.sweeper.sweep(guard.recorder.flag, now=t0 + 61) == (1, 0)
    assert guard.recorder.flags[0].idle_s >= 61 and guard.recorder.flags[0].turn.turn_id == "turn_1"
    assert await guard.sweeper.sweep(guard.recorder.flag, now=t0 + 62) == (0, 0)
    assert await guard.sweeper.sweep(guard.recorder.flag, now=t0 + 92) == (0, 1)
    topic, ended = guard.recorder.sent[-1]
    assert topic == topics.OUTCOMES and ended.outcome is Outcome.DEADLINE and "sorry" in ended.text.lower()
    assert await guard.sweeper.sweep(guard.recorder.flag, now=t0 + 200) == (0, 0)
    await guard.outbox.drain()
    assert await guard.loop.on_iteration(iteration(1, calls=[LIST])) == "duplicate"  # a late iteration cannot revive it


async def test_cancel_ends_a_running_turn_once(guard):
    await guard.starts.on_start(StartTurn(turn=TURN, text="hi"))
    assert (
        await guard.external_ends.on_cancel(
            CancelTurn(turn_id="turn_1", customer_id="cus_1001", conversation_id="conv_1")
        )
        == "cancelled"
    )
    assert (
        await guard.external_ends.on_cancel(
            CancelTurn(turn_id="turn_1", customer_id="cus_1001", conversation_id="conv_1")
        )
        == "already ended"
    )
    assert (
        await guard.external_ends.on_cancel(
            CancelTurn(turn_id="turn_nope", customer_id="cus_1001", conversation_id="conv_1")
        )
        == "unknown turn"
    )
    assert guard.recorder.sent[-1][1].outcome is Outcome.CANCELLED


async def test_a_streaming_turn_ended_otherwise_than_by_the_model_has_its_text_cut(guard):
    """The text a cancelled turn streamed is not its reply: a cut of every step (step 0) goes beside the end."""
    streaming = TURN.model_copy(update={"stream": True})
    await guard.starts.on_start(StartTurn(turn=streaming, text="hi"))
    assert (
        await guard.external_ends.on_cancel(
            CancelTurn(turn_id="turn_1", customer_id="cus_1001", conversation_id="conv_1")
        )
        == "cancelled"
    )
    (cut,) = [m for t, m in guard.recorder.sent if t == topics.SUPPORT_STREAM]
    assert (cut.turn_id, cut.step, cut.stream_id, cut.cut, cut.text) == ("turn_1", 0, "", True, "")
    assert guard.recorder.sent[-1][0] in (topics.OUTCOMES, topics.SUPPORT_STREAM)


async def test_a_turn_that_streams_and_ends_by_the_models_answer_or_does_not_stream_has_nothing_cut(guard):
    await guard.starts.on_start(StartTurn(turn=TURN.model_copy(update={"stream": True}), text="hi"))
    await guard.loop.on_iteration(iteration(1, stop_reason="end_turn").model_copy(update={"turn": TURN}))
    await guard.starts.on_start(StartTurn(turn=TURN.model_copy(update={"turn_id": "turn_2"}), text="hi"))
    await guard.external_ends.on_cancel(
        CancelTurn(turn_id="turn_2", customer_id="cus_1001", conversation_id="conv_1")
    )  # streams by the setting only: off
    assert [m for t, m in guard.recorder.sent if t == topics.SUPPORT_STREAM] == []


async def test_budget_outcome_carries_the_cost(guard):
    guard.loop.decisions.policy = Policy(budget_usd=0.0005, replies=Replies())
    await guard.starts.on_start(StartTurn(turn=TURN, text="hi"))
    assert await guard.loop.on_iteration(iteration(1, calls=[LIST])) == "budget"
    ended = guard.recorder.sent[-1][1]
    assert ended.outcome is Outcome.BUDGET and ended.cost_usd > 0
    assert json.loads(ended.model_dump_json())["spent"]["input_tokens"] == 100


async def test_a_turn_gets_its_deadline_when_it_starts_and_carries_it(guard):
    await guard.starts.on_start(StartTurn(turn=TURN, text="hi"))
    call = guard.recorder.sent[0][1]
    row = await guard.ledger.get("turn_1")
    assert (
        call.turn.deadline_at == pytest.approx(row.started_at + 300, abs=0.01)
        and row.deadline_at == call.turn.deadline_at
    )


async def test_a_cancel_waits_for_a_claimed_batch_and_is_published_once_it_is_done(guard, tmp_path):
    from roundtrip._kernel.storage.turnstore import Fence

    fence = await Fence.open(
        f"sqlite+aiosqlite:///{tmp_path / 'ledger.db'}"
    )  # what the executor and model service open
    try:
        await guard.starts.on_start(StartTurn(turn=TURN, text="hi"))
        await guard.loop.on_iteration(iteration(1, calls=[LIST]))
        assert await fence.claim_batch(TURN, 1, lease_s=30, now=time.time())  # an executor is running step 1's calls
        assert (
            await guard.external_ends.on_cancel(
                CancelTurn(turn_id="turn_1", customer_id="cus_1001", conversation_id="conv_1")
            )
            == "cancelling"
        )
        assert (
            await guard.external_ends.on_cancel(
                CancelTurn(turn_id="turn_1", customer_id="cus_1001", conversation_id="conv_1")
            )
            == "already ended"
        )
        assert guard.recorder.sent[-1][0] == topics.TOOL_CALLS  # no end published while the calls may still run
        assert await guard.sweeper.sweep(guard.recorder.flag, now=time.time()) == (0, 0)
        assert (
            await fence.claim_model_call(TURN, 1, now=time.time()) is False
        )  # the executor is done; no model call for this turn
        assert await guard.sweeper.sweep(guard.recorder.flag, now=time.time()) == (0, 1)
        topic, ended = guard.recorder.sent[-1]
        assert topic == topics.OUTCOMES and ended.outcome is Outcome.CANCELLED and ended.step == 1
        assert await guard.sweeper.sweep(guard.recorder.flag, now=time.time()) == (0, 0)
        assert [t for t, _ in guard.recorder.sent].count(topics.OUTCOMES) == 1
    finally:
        await fence.close()


async def test_an_end_the_sweeper_could_not_publish_is_republished_by_a_later_sweep(guard):
    guard.outbox.after_s = 0.0
    await guard.starts.on_start(StartTurn(turn=TURN, text="hi"))
    await guard.outbox.drain()
    t0 = (await guard.ledger.get("turn_1")).last_progress_at
    await guard.sweeper.sweep(guard.recorder.flag, now=t0 + 61)

    async def broker_down(topic, message, conversation_id):
        raise ConnectionError("broker gone")

    guard.outbox.publish = broker_down
    with pytest.raises(ConnectionError):
        await guard.sweeper.sweep(guard.recorder.flag, now=t0 + 92)  # ended in the ledger, the end not published
    assert (await guard.ledger.get("turn_1")).status == "ended"
    guard.outbox.publish = guard.recorder
    await guard.sweeper.sweep(guard.recorder.flag, now=t0 + 93)  # the outbox: nothing is lost
    await guard.outbox.drain()
    outcomes = [m for t, m in guard.recorder.sent if t == topics.OUTCOMES]
    assert len(outcomes) == 1 and outcomes[0].outcome is Outcome.DEADLINE
    assert (await guard.ledger.get("turn_1")).pending is None
    await guard.sweeper.sweep(guard.recorder.flag, now=t0 + 94)
    assert len([m for t, m in guard.recorder.sent if t == topics.OUTCOMES]) == 1


async def test_a_stuck_turn_that_moves_before_its_grace_ends_is_not_ended(guard):
    await guard.starts.on_start(StartTurn(turn=TURN, text="hi"))
    t0 = (await guard.ledger.get("turn_1")).last_progress_at
    assert await guard.sweeper.sweep(guard.recorder.flag, now=t0 + 61) == (1, 0)
    stale = await guard.ledger.get("turn_1")
    await guard.loop.on_iteration(iteration(1, calls=[LIST]))  # progress, after the sweeper read the row
    assert (
        await guard.external_ends.end(stale, Outcome.DEADLINE, "stuck", status="stuck", flagged_at=stale.flagged_at)
        is None
    )
    assert (await guard.ledger.get("turn_1")).status == "running"
    assert Outcome.DEADLINE not in [getattr(m, "outcome", None) for _, m in guard.recorder.sent]


async def test_an_unfit_tool_input_becomes_an_error_result_and_the_loop_goes_on(guard):
    big = ToolCall(
        id="toolu_big",
        name="search_help_center",
        input={"roundtrip_omitted": "input too large"},
        fingerprint=fingerprint("search_help_center", {"roundtrip_omitted": "input too large"}),
        error="input too large: 614400 bytes, limit 65536",
    )
    await guard.starts.on_start(StartTurn(turn=TURN, text="hi"))
    assert await guard.loop.on_iteration(iteration(1, calls=[big, LIST])) == "CheckToolCalls"
    check = guard.recorder.sent[-1][1]
    assert (
        list(check.blocked) == ["toolu_big"]
        and "input too large: 614400 bytes, limit 65536" in check.blocked["toolu_big"]
    )


async def test_with_the_broker_away_the_sweeper_records_every_end_and_the_outbox_publishes_them_later(
    guard, monkeypatch
):
    """Kafka down while turns pass their deadline: the ends are recorded (none blocks the others), and
    published once the broker is back, by the outbox."""
    import asyncio

    import roundtrip._guard.outbox as outbox

    monkeypatch.setattr(outbox, "SWEEP_PUBLISH_TIMEOUT_S", 0.2)
    turns = [
        TURN.model_copy(update={"turn_id": f"turn_{i}", "request_id": f"req_{i}", "conversation_id": f"conv_{i}"})
        for i in range(5)
    ]
    for turn in turns:
        await guard.starts.on_start(StartTurn(turn=turn, text="hi"))
    await guard.outbox.drain()
    sent_before = len(guard.recorder.sent)
    broker_back = asyncio.Event()
    real_publish = guard.outbox.publish

    async def hanging(topic, message, conversation_id):  # what a publish does while the broker is down
        await broker_back.wait()
        await real_publish(topic, message, conversation_id)

    guard.outbox.publish = hanging
    t0 = (await guard.ledger.get("turn_0")).started_at
    started = asyncio.get_running_loop().time()
    await guard.sweeper.sweep(guard.recorder.flag, now=t0 + 301)  # past every turn's deadline
    assert asyncio.get_running_loop().time() - started < 2  # one publish timed out, the rest were only recorded
    rows = [await guard.ledger.get(t.turn_id) for t in turns]
    assert all(r.status == "ended" and r.outcome == "deadline" and r.pending for r in rows)
    assert len(guard.recorder.sent) == sent_before  # nothing got through
    guard.outbox.publish = real_publish  # the broker is back
    assert await guard.outbox.republish_all(older_than=t0 + 10_000) == 5
    await guard.outbox.drain()
    ends = [m for topic, m in guard.recorder.sent[sent_before:] if topic == topics.OUTCOMES]
    assert sorted(m.turn.turn_id for m in ends) == sorted(t.turn_id for t in turns)
