"""The chaos suite's audit (tests/chaos/harness.py `judge`) flags what it exists to flag: fed the replies, the
ledger, the shop's side effects and its execution log of a run that went wrong in each way, it names each fault;
fed a clean run, it finds nothing. The chaos scenarios themselves only ever show it finding nothing."""

from __future__ import annotations

from roundtrip._kernel.wire import topics
from tests.chaos.harness import CALM, FAULTY, Audit, Expect, Fault, Kill, Planned, judge, plan_load

T0 = 1_800_000_000.0  # epoch seconds of the made-up run


def _plan(n: int = 4) -> list[Planned]:
    return plan_load("unit", ["cus_u001"], conversations=n, requests=n, twice_every=1000)


def _reply(outcome: str, at: float) -> tuple[dict, float]:
    return {"outcome": outcome}, at


def _row(started: float, ended: float | None, outcome: str = "end_turn") -> dict:
    return {
        "status": "ended" if ended else "running",
        "step": 2,
        "started_at": started,
        "ended_at": ended,
        "outcome": outcome,
    }


def _effect(plan: list[Planned], i: int, at: float, order: str | None = None) -> dict:
    endpoint = "cancel_order" if order else "escalate"
    return {
        "turn_id": plan[i].turn_id,
        "tool_use_id": f"toolu_{i}",
        "endpoint": endpoint,
        "customer_id": "cus_u001",
        "order_id": order,
        "at": at,
    }


def _run(plan: list[Planned], i: int, at: float) -> dict:
    return {
        "turn_id": plan[i].turn_id,
        "tool_use_id": f"toolu_{i}",
        "endpoint": "cancel_order",
        "customer_id": "cus_u001",
        "at": at,
    }


def _clean(plan: list[Planned]):
    """A run with nothing wrong: each turn 1 s long, one reply each; turns 0 and 1 cancel an order once."""
    replies = {p.request.request_id: [_reply("end_turn", T0 + i + 1.1)] for i, p in enumerate(plan)}
    ledger = {p.turn_id: _row(T0 + i, T0 + i + 1) for i, p in enumerate(plan)}
    effects = [_effect(plan, 0, T0 + 0.5, "ord_00000001"), _effect(plan, 1, T0 + 1.5, "ord_00000002")]
    runs = [_run(plan, 0, T0 + 0.5), _run(plan, 1, T0 + 1.5)]
    return replies, ledger, effects, runs


def _judge(plan, replies, ledger, effects, runs, expect=None, faults=()) -> Audit:
    return judge(Audit("unit", len(plan)), plan, replies, ledger, effects, runs, expect, list(faults))


def test_a_clean_run_has_no_problem_and_meets_its_expectations():
    plan = _plan()
    result = _judge(
        plan, *_clean(plan), Expect(CALM, end_turn=1.0, side_effects=2, in_flight=1), [Fault("a kill", T0 + 2.5)]
    )
    assert result.problems() == []
    assert (result.replies, result.side_effects, result.executions) == (4, 2, 2)
    assert result.in_flight == {"a kill": 1}  # turn 2 (from T0+2 to T0+3)
    assert "runs 2 (duplicate 0" in result.line()


def test_a_lost_reply_is_flagged():
    plan = _plan()
    replies, ledger, effects, runs = _clean(plan)
    del replies[plan[3].request.request_id]
    result = _judge(plan, replies, ledger, effects, runs)
    assert result.lost == [plan[3].request.request_id]
    assert result.problems()[0].startswith("lost (no reply): 1")


def test_a_duplicate_reply_is_flagged():
    plan = _plan()
    replies, ledger, effects, runs = _clean(plan)
    replies[plan[2].request.request_id].append(_reply("deadline", T0 + 9))
    result = _judge(plan, replies, ledger, effects, runs)
    assert result.duplicated == [f"{plan[2].request.request_id} x2 (end_turn, deadline)"]
    assert any(p.startswith("duplicated replies: 1") for p in result.problems())


def test_a_call_run_twice_is_flagged_though_its_second_run_changed_nothing():
    """The shop stored one answer (one side effect), but its execution log has the call twice: a duplicate."""
    plan = _plan()
    replies, ledger, effects, runs = _clean(plan)
    runs.append(_run(plan, 0, T0 + 0.8))  # a replay: the idempotency record (the side effect) stays one
    result = _judge(plan, replies, ledger, effects, runs)
    assert result.duplicate_side_effects == []
    assert result.duplicate_executions == [f"{plan[0].turn_id}:toolu_0 ran 2 times"]
    assert any(p.startswith("duplicated executions: 1") for p in result.problems())


def _batch(plan: list[Planned], i: int, offset: int, partition: int = 0) -> dict:
    """turn i's signed batch (what `Observer` keeps): its call toolu_i runs, at `offset` of turn.tool_batches."""
    return {"turn_id": plan[i].turn_id, "step": 1, "runs": [f"toolu_{i}"], "partition": partition, "offset": offset}


def test_a_re_run_is_excused_only_for_a_batch_running_in_an_executor_when_it_was_sigkilled():
    """Call 0 first ran at T0+0.5 from the batch at offset 7; the executors were SIGKILLed at T0+0.7 with offset 7
    not committed: redelivered, it ran again (under its idempotency key). Anything else is a duplicate."""
    plan = _plan()
    replies, ledger, effects, runs = _clean(plan)
    runs.append(_run(plan, 0, T0 + 0.8))
    batches = [_batch(plan, 0, offset=7), _batch(plan, 1, offset=8)]
    in_flight = Kill("executor", T0 + 0.7, {(topics.TOOL_BATCHES, 0): 7})

    def judged(*kills: Kill, faults: tuple[Fault, ...] = ()) -> Audit:
        return judge(Audit("unit", 4), plan, replies, ledger, effects, runs, None, list(faults), list(kills), batches)

    excused = judged(in_flight)
    assert excused.problems() == [] and excused.duplicate_executions == []
    assert excused.reruns_after_faults == [
        f"{plan[0].turn_id}:toolu_0 ran 2 times (its batch was running in executor SIGKILLed)"
    ]
    duplicate = [f"{plan[0].turn_id}:toolu_0 ran 2 times"]
    # a fault however near (the old 10 s window) excuses nothing
    assert judged(faults=(Fault("the broker SIGKILLed", T0, T0 + 3),)).duplicate_executions == duplicate
    assert judged(Kill("gate", T0 + 0.7, {})).duplicate_executions == duplicate  # not the executor
    committed = Kill("executor", T0 + 0.7, {(topics.TOOL_BATCHES, 0): 8})  # offset 7 was done: not in flight
    assert judged(committed).duplicate_executions == duplicate
    before = Kill("executor", T0 + 0.4, {(topics.TOOL_BATCHES, 0): 7})  # killed before the call first ran
    assert judged(before).duplicate_executions == duplicate
    assert (
        judged(Kill("executor", T0 + 0.7, {(topics.TOOL_BATCHES, 1): 9})).duplicate_executions == []
    )  # other partition
    runs.append(_run(plan, 0, T0 + 0.9))  # a third run: one kill excuses one more run, not two
    assert judged(in_flight).duplicate_executions == [f"{duplicate[0][:-7]}3 times, 1 explained by a SIGKILL"]


def test_the_per_call_check_counts_runs_not_stored_answers():
    """One idempotency record per call (the shop's primary key): a second run shows in the execution log only."""
    plan = _plan()
    replies, ledger, effects, runs = _clean(plan)
    runs.append(_run(plan, 1, T0 + 1.6))
    result = _judge(plan, replies, ledger, effects, runs)
    assert result.duplicate_side_effects == [] and result.duplicate_executions == [
        f"{plan[1].turn_id}:toolu_1 ran 2 times"
    ]


def test_an_order_cancelled_twice_is_flagged():
    plan = _plan()
    replies, ledger, effects, runs = _clean(plan)
    effects.append(_effect(plan, 2, T0 + 2.5, "ord_00000001"))
    runs.append(_run(plan, 2, T0 + 2.5))
    result = _judge(plan, replies, ledger, effects, runs)
    assert result.duplicate_side_effects == ["order ord_00000001 cancelled 2 times"]


def test_a_side_effect_after_the_turns_end_is_flagged():
    plan = _plan()
    replies, ledger, effects, runs = _clean(plan)
    effects.append(_effect(plan, 3, T0 + 4.5))  # turn 3 ended at T0+4
    runs.append(_run(plan, 3, T0 + 4.5))
    result = _judge(plan, replies, ledger, effects, runs)
    assert len(result.late_side_effects) == 1 and "0.500 s after the ledger's end" in result.late_side_effects[0]
    assert any(p.startswith("side effects after the turn's end: 1") for p in result.problems())


def test_a_side_effect_after_the_reply_is_flagged_when_the_ledger_has_no_end():
    plan = _plan()
    replies, ledger, effects, runs = _clean(plan)
    ledger[plan[3].turn_id]["ended_at"] = None
    effects.append(_effect(plan, 3, T0 + 4.6))  # its reply came at T0+4.1
    result = _judge(plan, replies, ledger, effects, runs)
    assert len(result.late_side_effects) == 1 and "after its reply" in result.late_side_effects[0]


def test_every_request_answered_deadline_falls_short_of_end_turn():
    """What a fleet that answers every request with a polite `deadline` shows: each reply is there, no duplicate,
    no side effect at all, and a scenario's expectations fail on it."""
    plan = _plan()
    replies = {p.request.request_id: [_reply("deadline", T0 + 30)] for p in plan}
    ledger = {p.turn_id: _row(T0, T0 + 30, "deadline") for p in plan}
    calm = _judge(plan, replies, ledger, [], [], Expect(CALM, end_turn=0.5, side_effects=1))
    assert len(calm.unexpected_outcomes) == 4
    assert "0 side effects, fewer than 1" in calm.shortfalls
    assert "0 turns ended end_turn, fewer than 2" in calm.shortfalls
    faulty = _judge(plan, replies, ledger, [], [], Expect(FAULTY, end_turn=0.5, side_effects=0))
    assert faulty.unexpected_outcomes == [] and faulty.shortfalls == ["0 turns ended end_turn, fewer than 2"]
    assert faulty.problems() == ["short of the scenario's expectations: 1: 0 turns ended end_turn, fewer than 2"]


def test_a_fault_that_hit_no_turn_in_flight_falls_short():
    plan = _plan()
    replies, ledger, effects, runs = _clean(plan)
    result = _judge(
        plan,
        replies,
        ledger,
        effects,
        runs,
        Expect(CALM, end_turn=0, side_effects=0, in_flight=2),
        [Fault("the broker SIGKILLed", T0 + 10, T0 + 13)],
    )
    assert result.in_flight == {"the broker SIGKILLed": 0}
    assert result.shortfalls == ["0 turns in flight at the broker SIGKILLed, fewer than 2"]


def test_a_turn_not_yet_ended_at_the_fault_counts_as_in_flight():
    plan = _plan()
    replies, ledger, effects, runs = _clean(plan)
    ledger[plan[0].turn_id]["ended_at"] = None
    result = _judge(plan, replies, ledger, effects, runs, faults=[Fault("a kill", T0 + 10)])
    assert result.in_flight == {"a kill": 1}
