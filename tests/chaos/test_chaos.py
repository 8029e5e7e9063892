"""Chaos (issue 8): load through support.requests while services, the broker and executors fail,
and poison on every topic. Each scenario prints one summary line and asserts, from the shop's
database, the turn ledger, support.replies (read_committed) and the services' dead letters:

* every request exactly one reply: none lost, none duplicated (an app's retry included);
* no duplicate side effect: no order cancelled twice, one side effect per tool_use_id;
* no side effect after its turn's end (the ledger's ended_at, and the reply's timestamp);
* every poison message dead-lettered with its original bytes, key and headers, and a reason;
* no call run twice by the shop's execution log, with one excuse: its batch was running in an executor the
  harness SIGKILLed (its calls had run, its offset was not committed: redelivered, it runs again under its
  idempotency key). A broker, PostgreSQL, another service failing, or a pause, excuses nothing;
* the scenario's `Expect`: outcomes within its set, a floor of `end_turn` and of side effects, and each fault
  landing on turns in flight (started before it, ended after it, by the ledger).

Run: .venv/bin/python -m pytest -q tests/chaos -s
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter

import pytest

from roundtrip._kernel.wire import topics
from roundtrip._kernel.wire.events import CancelTurn, Outcome, SupportRequest
from tests.chaos.conftest import BROKEN_EXECUTOR
from tests.chaos.harness import (
    CALM,
    CONSUMED,
    FAULTY,
    Audit,
    Expect,
    Fault,
    Kill,
    Planned,
    audit,
    deliver_batches_again,
    executions,
    ledger_rows,
    new_tag,
    plan_load,
    poison_messages,
    report,
    seed_customers,
    send_poison,
    side_effects,
)

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(300)]

ON_BOTH_DATABASES = pytest.mark.parametrize("chaos_database", ["sqlite", "postgres"], indirect=True)  # issue 23
REPLY_TIMEOUT_S = 120  # a lost step is ended by the stuck rule within ~25 s (15 s + 5 s grace + sweeps)


async def test_poison_of_every_kind_on_every_topic_is_dead_lettered_intact_while_load_runs(
    chaos_fleet, chaos_settings, observer, capsys
):
    settings = chaos_settings[0]
    started = time.monotonic()
    tag = new_tag("poison")
    customers = await seed_customers(settings, tag, 6)
    plan = plan_load(tag, customers, conversations=12, requests=24)
    poison = [p for topic in CONSUMED for p in poison_messages(topic, tag)]
    load = asyncio.create_task(observer.drive(plan, rate_per_s=8))
    await send_poison(observer, poison)
    await load
    expected = {(observer.topic(p.topic), p.partition, p.offset) for p in poison}
    await observer.wait_for(
        lambda: (
            expected <= {(d["topic"], d.get("partition"), d.get("offset")) for d in observer.seen.dead_letters}
            and all(p.request.request_id in observer.seen.replies for p in plan)
        ),
        timeout=60,
        what="a dead letter of every poison message and a reply to every request",
    )
    await observer.wait_for_replies([p.request.request_id for p in plan], timeout=REPLY_TIMEOUT_S, linger_s=2)
    expect = Expect(CALM, side_effects=len(plan) // 5)
    report(await audit("poison on every topic", settings, observer, plan, started, poison, expect), capsys)


async def _every_service_sigkilled(chaos_fleet, settings, observer) -> tuple[Audit, dict[str, int]]:
    """Load, and each service SIGKILLed and started again in turn under it (both executor replicas at once); the audit
    and the turns live at each kill."""
    started = time.monotonic()
    tag = new_tag("kill")
    customers = await seed_customers(settings, tag, 16)
    plan = plan_load(tag, customers, conversations=40, requests=120)
    turn_ids = {p.turn_id for p in plan}
    load = asyncio.create_task(observer.drive(plan, rate_per_s=5))  # ~24 s of load; each kill + respawn takes ~4-5 s
    await asyncio.sleep(2)  # turns in flight before the first kill
    live_at_kill, faults, kills = {}, [], len(chaos_fleet.kills)
    for name in ("executor", "model", "guard", "gate", "gateway"):
        live_at_kill[name] = sum(
            1 for t, row in ledger_rows(settings).items() if t in turn_ids and row["status"] != "ended"
        )
        at = time.time()
        await chaos_fleet.kill_and_respawn(name)
        faults.append(Fault(f"the {name} SIGKILLed", at, time.time()))
    await deliver_batches_again(observer, settings, plan)
    await load
    await observer.wait_for_replies([p.request.request_id for p in plan], timeout=REPLY_TIMEOUT_S)
    expect = Expect(FAULTY, side_effects=len(plan) // 5, in_flight=2)
    result = await audit(
        "every service SIGKILLed mid-load",
        settings,
        observer,
        plan,
        started,
        expect=expect,
        faults=faults,
        kills=chaos_fleet.kills[kills:],
    )
    return result, live_at_kill


@ON_BOTH_DATABASES
async def test_every_service_sigkilled_mid_load(chaos_fleet, chaos_settings, observer, capsys):
    result, live_at_kill = await _every_service_sigkilled(chaos_fleet, chaos_settings[0], observer)
    report(result, capsys)
    with capsys.disabled():
        print(
            "[chaos]   turns live when SIGKILLed: " + ", ".join(f"{k} {v}" for k, v in live_at_kill.items()), flush=True
        )
    assert all(live_at_kill.values()), f"every kill should hit turns in flight: {live_at_kill}"


async def test_every_service_sigkilled_fails_the_audit_with_a_broken_executor(
    chaos_fleet, chaos_settings, observer, capsys
):
    """The scenario above can fail: run on a copy of the executor without its duplicate check and the fence's claim
    (tests/chaos/broken_executor.py), the calls of batches delivered again after the kills run again, outside the
    one excuse (a batch that was running in the executor SIGKILLed), and the audit says so."""
    async with chaos_fleet.replaced("executor", BROKEN_EXECUTOR):
        result, _ = await _every_service_sigkilled(chaos_fleet, chaos_settings[0], observer)
    with capsys.disabled():
        print("\n" + result.line() + " (a broken executor)", flush=True)
    assert result.duplicate_executions, "the broken executor ran calls again: the audit must flag them"


@ON_BOTH_DATABASES
async def test_broker_sigkilled_mid_load_and_restarted_on_its_data(chaos_fleet, chaos_settings, observer, capsys):
    settings = chaos_settings[0]
    started = time.monotonic()
    tag = new_tag("broker")
    customers = await seed_customers(settings, tag, 10)
    plan = plan_load(tag, customers, conversations=24, requests=60)
    load = asyncio.create_task(observer.drive(plan, rate_per_s=6))
    await asyncio.sleep(3)  # turns in flight before the broker is killed
    at = time.time()
    await chaos_fleet.kill_broker()
    await asyncio.sleep(3)  # down while turns are mid-flight (and while turns end)
    await chaos_fleet.start_broker()
    fault = Fault("the broker SIGKILLed", at, time.time())
    await deliver_batches_again(observer, settings, plan)
    await load
    await observer.wait_for_replies([p.request.request_id for p in plan], timeout=REPLY_TIMEOUT_S)
    expect = Expect(FAULTY, side_effects=len(plan) // 5, in_flight=3)
    report(
        await audit("broker SIGKILLed mid-load", settings, observer, plan, started, expect=expect, faults=[fault]),
        capsys,
    )


async def test_every_internal_message_delivered_again_after_its_consumers_restarted(
    chaos_fleet, chaos_settings, observer, capsys
):
    """At least once means any message may come again, also after its consumer restarted (its memory of
    what it handled is gone): the model calls, signed batches and turn ends of finished turns, delivered
    again, must cause no second reply, no model call and no side effect."""
    settings = chaos_settings[0]
    started = time.monotonic()
    tag = new_tag("again")
    customers = await seed_customers(settings, tag, 6)
    plan = plan_load(tag, customers, conversations=12, requests=16)
    await observer.drive(plan, rate_per_s=10)
    await observer.wait_for_replies([p.request.request_id for p in plan], timeout=REPLY_TIMEOUT_S, linger_s=1)
    conversations = {p.request.conversation_id.encode() for p in plan}
    again = [r for r in observer.seen.raw if r[1] in conversations]
    for name in ("gateway", "model", "executor"):
        await chaos_fleet.kill_and_respawn(name)
    for topic, key, value, headers in again:
        await observer.send(topic, value, key, headers)
    await observer.settled()  # every copy handled: a (wrong) run of one would be in the shop's log now
    # no fault declared: the restarts came after every turn had ended, so any call run again is a duplicate
    expect = Expect(CALM, side_effects=len(plan) // 5, in_flight=0)
    result = await audit(
        "internal messages delivered again after restarts", settings, observer, plan, started, expect=expect
    )
    report(result, capsys)
    with capsys.disabled():
        kinds = Counter(topic for topic, *_ in again)
        print("[chaos]   delivered again: " + ", ".join(f"{k} {v}" for k, v in sorted(kinds.items())), flush=True)
    assert all(kinds[t] for t in (topics.MODEL_CALLS, topics.TOOL_BATCHES, topics.OUTCOMES))
    logs = settings.state_dir / "logs"
    for topic, log_glob, refusal in (
        (topics.MODEL_CALLS, "model.log", "model not called"),
        (topics.TOOL_BATCHES, "executor*.log", "not run"),
    ):
        steps = {
            (json.loads(value)["turn"]["turn_id"], json.loads(value)["step"]) for t, _, value, _ in again if t == topic
        }
        text = "".join(p.read_text(errors="replace") for p in logs.glob(log_glob))
        missing = [f"{t} step {n}" for t, n in steps if f"turn {t} step {n}: {refusal}" not in text]
        assert not missing, f"{topic} delivered again was not refused by the fence: {missing[:5]}"


async def test_a_broken_executor_that_runs_batches_again_fails_the_audit(chaos_fleet, chaos_settings, observer, capsys):
    """The suite can fail: with the executors replaced by a copy whose checks against running a batch again are
    removed (tests/chaos/broken_executor.py), the signed batches of finished turns delivered again run their calls
    again. The shop answers each from its idempotency record and changes nothing, so counting stored answers sees
    no duplicate; its execution log does, and the audit the other scenarios pass flags the duplicated runs."""
    settings = chaos_settings[0]
    started = time.monotonic()
    tag = new_tag("broken")
    customers = await seed_customers(settings, tag, 4)
    plan = plan_load(tag, customers, conversations=8, requests=8)
    await observer.drive(plan, rate_per_s=10)
    await observer.wait_for_replies([p.request.request_id for p in plan], timeout=REPLY_TIMEOUT_S, linger_s=1)
    turn_ids = {p.turn_id for p in plan}

    async def runs() -> Counter:
        return Counter((r["turn_id"], r["tool_use_id"]) for r in await executions(settings) if r["turn_id"] in turn_ids)

    calls = await runs()
    assert calls and set(calls.values()) == {1}, f"the load should have run side-effecting calls, each once: {calls}"
    conversations = {p.request.conversation_id.encode() for p in plan}
    again = [r for r in observer.seen.raw if r[0] == topics.TOOL_BATCHES and r[1] in conversations]
    async with chaos_fleet.replaced("executor", BROKEN_EXECUTOR):
        for topic, key, value, headers in again:
            await observer.send(topic, value, key, headers)
        deadline = time.monotonic() + 60
        while (now := await runs()) and not all(now[call] >= 2 for call in calls):
            assert time.monotonic() < deadline, f"the broken executors should have run every call again: {now}"
            await asyncio.sleep(0.5)  # poll interval: the broken executors' runs in the shop's log
    result = await audit("a broken executor: batches run again", settings, observer, plan, started)
    with capsys.disabled():
        print("\n" + result.line(), flush=True)
    assert [p.split(":")[0] for p in result.problems()] == ["duplicated executions"], result.problems()
    assert len(result.duplicate_executions) == len(calls)
    assert not result.duplicate_side_effects, "stored answers stay one per call: they cannot show a second run"
    assert not result.duplicated and not result.lost, "the model service's fence still refuses the ended turns"


async def _executor_logged(settings, text: str, timeout: float) -> list[str]:
    deadline = time.monotonic() + timeout
    while True:
        lines = [
            line
            for p in (settings.state_dir / "logs").glob("executor*.log")
            for line in p.read_text(errors="replace").splitlines()
            if text in line
        ]
        if lines or time.monotonic() > deadline:
            return lines
        await asyncio.sleep(0.5)  # poll interval: the executors' log


async def test_paused_executors_hold_signed_cancels_while_turns_are_cancelled_or_pass_their_deadline(
    chaos_fleet, chaos_settings, observer, capsys
):
    settings = chaos_settings[0]
    started = time.monotonic()
    tag = new_tag("pause")
    count = 8
    customers = await seed_customers(settings, tag, count, cancellable=1)
    plan = [
        Planned(
            SupportRequest(
                request_id=f"{tag}-r{i:04d}",
                conversation_id=f"{tag}-c{i:03d}",
                customer_id=customers[i],
                text="cancel my last order",
                persona="careful",
            )
        )
        for i in range(count)
    ]
    turn_ids = [p.turn_id for p in plan]
    # a model call takes ~1.5 s, so the executors can be paused between step 1's results and step 2's signed cancel;
    # turns get a 10 s deadline, which the ones not cancelled pass while their signed cancel waits
    await chaos_fleet.restart("simulator", simulator_latency_ms=1500, simulator_latency_jitter=0)
    await chaos_fleet.restart("guard", turn_deadline_s=10)
    # a model service that has not had an answer yet starts 4 calls at a time (its slow start): one turn first, so the
    # eight turns' calls go out together and their cancels are signed together, after the pause
    warm = new_tag("warm")
    first = SupportRequest(
        request_id=f"{warm}-r", conversation_id=f"{warm}-c", customer_id=customers[0], text="hello", persona="careful"
    )
    await observer.ask(Planned(first))
    await observer.wait_for_replies([first.request_id], timeout=60, linger_s=0)
    paused = []
    try:
        for p in plan:
            await observer.ask(p)

        def batches(name: str) -> dict[str, dict]:
            return {
                b["turn_id"]: b
                for b in observer.seen.batches
                if b["turn_id"] in turn_ids and any(n == name for n, _ in b["calls"])
            }

        await observer.wait_for(
            lambda: len(batches("list_orders")) == count, timeout=30, what="every turn's signed list_orders"
        )
        await asyncio.sleep(0.3)  # step 1's list_orders run; step 2 is at the model for ~1.5 s
        already = set(batches("cancel_order"))
        paused_at, paused = time.time(), chaos_fleet.pause("executor")
        signed = await observer.wait_for(
            lambda: len(batches("cancel_order")) == count and batches("cancel_order"),
            timeout=30,
            what="every turn's signed cancel_order",
        )
        held = [t for t in signed if t not in already]  # signed cancels waiting at paused executors
        cancelled = held[::2]
        for turn_id in cancelled:
            request = plan[turn_ids.index(turn_id)].request
            cancel = CancelTurn(
                turn_id=turn_id,
                customer_id=request.customer_id,
                conversation_id=request.conversation_id,
                reason="chaos: operator cancel",
                requested_by="chaos",
            )
            await observer.send(
                topics.TURN_CONTROLS, cancel.model_dump_json().encode(), request.conversation_id.encode()
            )
        await observer.wait_for_replies([p.request.request_id for p in plan], timeout=60, linger_s=0)
    finally:
        chaos_fleet.resume(paused)
    fault = Fault("the executors SIGSTOPped", paused_at, time.time())
    # the executors reach the held batches now: every one is refused by the fence (or as expired)
    refused = {t: await _executor_logged(settings, f"turn {t} step 2: not run", timeout=60) for t in held}
    await observer.settled()  # every held batch handled: a (wrong) run of one would be in the shop's log now
    await chaos_fleet.restart(
        "simulator",
        simulator_latency_ms=settings.simulator_latency_ms,
        simulator_latency_jitter=settings.simulator_latency_jitter,
    )
    await chaos_fleet.restart("guard", turn_deadline_s=settings.turn_deadline_s)

    # the cancels signed before the pause ran (end_turn); the held ones' turns were cancelled or passed their deadline
    expect = Expect(
        frozenset({Outcome.END_TURN, Outcome.CANCELLED, Outcome.DEADLINE}), end_turn=0, side_effects=0, in_flight=count
    )
    result = await audit(
        "paused executors, turns cancelled / past deadline",
        settings,
        observer,
        plan,
        started,
        expect=expect,
        faults=[fault],
    )
    report(result, capsys)
    with capsys.disabled():
        print(
            f"[chaos]   held signed cancels {len(held)} (operator-cancelled {len(cancelled)}, deadline "
            f"{len(held) - len(cancelled)}), "
            f"refused by the fence {sum(1 for v in refused.values() if v)}",
            flush=True,
        )
    assert len(held) >= count - 2, (
        f"the executors should have been paused with (nearly) every signed cancel waiting: {len(held)} of {count}"
    )
    outcome_of = {rid: got[0][0]["outcome"] for rid, got in observer.seen.replies.items()}
    for turn_id in held:
        rid = plan[turn_ids.index(turn_id)].request.request_id
        assert outcome_of[rid] == (Outcome.CANCELLED if turn_id in cancelled else Outcome.DEADLINE), (
            turn_id,
            outcome_of[rid],
        )
        assert refused[turn_id], f"no executor logged that the held batch of {turn_id} was not run"
    effects = {e["turn_id"] for e in await side_effects(settings)}
    assert not effects & set(held), "a held cancel ran after its turn had ended"
    ledger = ledger_rows(settings)
    assert all(ledger[t]["status"] == "ended" for t in turn_ids)


async def test_compound_stuck_turns_end_while_the_broker_is_down_and_the_guard_is_killed_mid_sweep(
    chaos_fleet, chaos_settings, observer, capsys
):
    """The model service hangs (SIGSTOP), so every turn gets stuck; the broker dies just before the sweeper ends them
    (the ends are recorded but cannot be published), then the guard is SIGKILLed mid-sweep. Every turn must
    still get exactly one reply (the outbox), and the model must never be called for a turn that has ended."""
    settings = chaos_settings[0]
    started = time.monotonic()
    tag = new_tag("stuck")
    customers = await seed_customers(settings, tag, 5)
    # one request per conversation: a conversation's second request waits for its first turn to end (the guard
    # runs a conversation's turns one after another), so it would not be running, nor stuck, meanwhile
    plan = plan_load(tag, customers, conversations=20, requests=20, twice_every=7)
    turn_ids = {p.turn_id for p in plan}
    hung = chaos_fleet.pause("model")
    try:
        await observer.drive(plan, rate_per_s=20)
        ended_unannounced, fault = await _stuck_then_broker_down_then_guard_killed(chaos_fleet, settings, turn_ids)
        kill = chaos_fleet.kills[-1]
        await observer.wait_for_replies([p.request.request_id for p in plan], timeout=REPLY_TIMEOUT_S, linger_s=0)
    finally:
        chaos_fleet.resume(hung)  # it now reads the stale model calls of ended turns
    refused = await _model_refusals(settings, turn_ids, timeout=60)
    await observer.settled()  # every stale model call handled: a (wrong) step or reply would be on its topic now
    # the model hung from the start: no tool ran; every turn was stuck when the broker died, and the first flagged
    # may have reached its end by then on a slow machine: most, not all, were still in flight
    expect = Expect(frozenset({Outcome.DEADLINE}), end_turn=0, side_effects=0, in_flight=len(turn_ids) // 2)
    result = await audit(
        "compound: stuck turns end while the broker is down, guard killed mid-sweep",
        settings,
        observer,
        plan,
        started,
        expect=expect,
        faults=[fault],
        kills=[kill],
    )
    report(result, capsys)
    with capsys.disabled():
        print(
            f"[chaos]   turns ended in the ledger while the broker was down {ended_unannounced}, "
            f"stale model calls refused by the fence {len(refused)}/{len(turn_ids)}",
            flush=True,
        )
    assert set(result.outcomes) == {Outcome.DEADLINE}
    assert refused == turn_ids, "the model was called (or not asked) for a turn that had ended"


async def _stuck_then_broker_down_then_guard_killed(chaos_fleet, settings, turn_ids: set[str]) -> tuple[int, Fault]:
    """Wait until every turn is flagged stuck, kill the broker, let the grace pass (the sweeper ends turns
    it cannot announce), SIGKILL the guard, start the broker and the guard again. Returns the turns the
    ledger had ended while the broker was down, and the outage."""

    def ledger_of(status: str) -> set[str]:
        return {t for t, row in ledger_rows(settings).items() if t in turn_ids and row["status"] == status}

    deadline = time.monotonic() + settings.stuck_after_s + 20
    while len(ledger_of("stuck")) < len(turn_ids) and time.monotonic() < deadline:
        await asyncio.sleep(0.5)  # poll interval: the sweeper's stuck flags in the ledger
    assert len(ledger_of("stuck")) == len(turn_ids), (
        "every turn should be flagged stuck while the model service is down"
    )
    at = time.time()
    await chaos_fleet.kill_broker()
    await asyncio.sleep(settings.stuck_grace_s + 2)  # past the grace: the sweeper ends turns it cannot announce
    ended_unannounced = len(ledger_of("ended"))
    await asyncio.to_thread(chaos_fleet.sync.kill, "guard")  # mid-sweep, publishes hanging on the dead broker
    chaos_fleet.kills.append(Kill("guard", time.time()))  # its groups' offsets cannot be read: the broker is down
    await chaos_fleet.start_broker()
    fault = Fault("the broker SIGKILLed (turns stuck)", at, time.time())
    await asyncio.to_thread(chaos_fleet.sync.respawn, "guard")
    return ended_unannounced, fault


async def _model_refusals(settings, turn_ids: set[str], timeout: float) -> set[str]:
    deadline = time.monotonic() + timeout
    while True:
        text = (settings.state_dir / "logs" / "model.log").read_text(errors="replace")
        refused = {t for t in turn_ids if f"turn {t} step 0: model not called" in text}
        if refused == turn_ids or time.monotonic() > deadline:
            return refused
        await asyncio.sleep(0.5)  # poll interval: the model service's log
