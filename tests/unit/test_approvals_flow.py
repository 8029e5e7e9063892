"""Approvals by a person and serial tools, piece by piece: the gate against the real shop app in-process,
the executor's runner with recording handlers, the guard with a real SQLite ledger, the model client
with the real SDK against the simulator over HTTP."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from roundtrip import always
from roundtrip._gate.gate import Gate
from roundtrip._guard.approvals import DecisionRefused
from roundtrip._guard.core import Guard
from roundtrip._guard.ledger import AWAITING, ENDED, RUNNING, Ledger
from roundtrip._guard.replies import Replies
from roundtrip._guard.rules import Policy
from roundtrip._kernel.settings import Settings
from roundtrip._kernel.storage.turnstore import Fence
from roundtrip._kernel.wire import topics
from roundtrip._kernel.wire.approvals import Signer, approval_id_for, in_tool_use_order, input_digest
from roundtrip._kernel.wire.events import (
    ApprovalDecided,
    ApprovalRequested,
    CallModel,
    CancelTurn,
    CheckedCall,
    CheckToolCalls,
    Decision,
    ExecuteToolBatch,
    Outcome,
    SupportStatus,
    ToolCall,
    Turn,
    TurnEnded,
    TurnState,
)
from roundtrip._shop.agent.client import ShopClient
from roundtrip._shop.agent.tools import ShopAgentSettings
from roundtrip._simulator.server import running_simulator
from tests.agents import SHOP, shop_deps, shop_model_client, shop_registry, tool_runner
from tests.cores import executed, respond
from tests.cores import guard as guard_of
from tests.databases import migrated
from tests.gate_calls import check_call
from tests.ledger_steps import approvals_of
from tests.prices import price_table
from tests.shop import in_process
from tests.signing import key_settings, pair
from tests.unit.test_guard_handlers import Recorder

REGISTRY = SHOP.registry
GATE_KEYS, PEOPLE_KEYS = pair("k1"), pair("ops1")
SIGNER = GATE_KEYS.signer  # the gate's private key
BATCHES = GATE_KEYS.verifier  # the executors' and the guard's public key
PEOPLE = PEOPLE_KEYS.signer  # the console's private key
DECISIONS = PEOPLE_KEYS.decisions  # the gate's and the guard's public key
FORGER = pair("ops1").signer  # a key of its own under the people's key id
CANCEL = {"order_id": "ord_a1000003", "reason": "customer_request"}  # Alice's pending order, 87.00 EUR


def call(name: str, tool_input, id: str = "toolu_1") -> ToolCall:
    return ToolCall(id=id, name=name, input=tool_input, fingerprint="fp")


def turn(deadline_at: float = 0.0) -> Turn:
    return Turn(
        turn_id="turn_1",
        request_id="req_1",
        conversation_id="conv_1",
        customer_id="cus_1001",
        trace_id="0" * 32,
        deadline_at=deadline_at,
    )


def decided(decision: Decision = Decision.APPROVE, signer: Signer = PEOPLE, **overrides) -> ApprovalDecided:
    values = dict(
        approval_id=approval_id_for("turn_1", 1, "toolu_c"),
        turn_id="turn_1",
        tool_use_id="toolu_c",
        input_sha256=input_digest("cancel_order", CANCEL),
        decision=decision,
        reason="checked with the customer",
        decided_by="alice@support",
        decided_at=time.time(),
    )
    return signer.sign(ApprovalDecided(**(values | overrides)))


@pytest.fixture
async def shop(tmp_path):
    async with in_process(f"sqlite+aiosqlite:///{tmp_path}/shop.db") as transport:
        client = ShopClient("http://shop", timeout=10.0, transport=transport)
        yield client
        await client.aclose()


def gate_for(shop, above: int | None = 5000) -> Gate:
    async def lookup(kind, entity_id, customer_id):
        return await shop.get_order(customer_id, entity_id)

    return Gate(
        registry=REGISTRY,
        lookup=lookup,
        signer=SIGNER,
        deps=shop_deps(shop),
        agent_settings=ShopAgentSettings(approval_cancel_above_cents=above),
        decisions=DECISIONS,
        approval_timeout_s=60,
    )


# -- the gate: who is asked about what ----------------------------------------------------------------


async def test_a_cancellation_above_the_threshold_is_held_with_the_order_and_a_digest_of_the_exact_arguments(shop):
    held = await check_call(gate_for(shop, above=5000), call("cancel_order", CANCEL), "cus_1001", "turn_1")
    assert held.approved and held.hold is not None and held.approved_by is None
    assert "ord_a1000003 of 87.00 EUR" in held.hold.reason and "50.00 EUR" in held.hold.reason
    assert (
        held.hold.entities["order_id"]["total_cents"] == 8700
        and held.hold.entities["order_id"]["customer_id"] == "cus_1001"
    )
    assert (
        held.hold.input_sha256
        == input_digest("cancel_order", CANCEL)
        != input_digest("cancel_order", CANCEL | {"reason": "other"})
    )
    assert time.time() + 55 < held.hold.expires_at <= time.time() + 61
    below = await check_call(gate_for(shop, above=10000), call("cancel_order", CANCEL), "cus_1001", "turn_1")
    off = await check_call(gate_for(shop, above=None), call("cancel_order", CANCEL), "cus_1001", "turn_1")
    assert below.approved and below.hold is None and off.approved and off.hold is None


async def test_nobody_is_asked_about_a_call_the_gate_would_reject(shop):
    gate = gate_for(shop, above=0)  # every cancellation needs a person
    foreign = await check_call(
        gate, call("cancel_order", {"order_id": "ord_9f3c4e21", "reason": "other"}), "cus_1001", "t"
    )
    shipped = await check_call(
        gate, call("cancel_order", {"order_id": "ord_a1000002", "reason": "other"}), "cus_1001", "t"
    )
    invalid = await check_call(
        gate, call("cancel_order", {"order_id": "ord_a1000003", "reason": "why_not"}), "cus_1001", "t"
    )
    for result in (foreign, shipped, invalid):
        assert not result.approved and result.hold is None


async def test_a_tool_can_always_need_a_person(shop):
    registry = shop_registry(approvals={"escalate_to_human": always("a person decides every escalation")})

    async def lookup(kind, entity_id, customer_id):
        return await shop.get_order(customer_id, entity_id)

    gate = Gate(registry=registry, lookup=lookup, signer=SIGNER, deps=shop_deps(shop), agent_settings=SHOP.own_settings)
    result = await check_call(
        gate, call("escalate_to_human", {"summary": "customer wants a person", "urgency": "normal"}), "cus_1001", "t"
    )
    assert result.approved and result.hold.reason == "a person decides every escalation"


async def test_the_held_call_runs_only_under_a_valid_decision_for_exactly_that_call(shop):
    gate = gate_for(shop)
    cancel = call("cancel_order", CANCEL, id="toolu_c")
    ok = await check_call(gate, cancel, "cus_1001", "turn_1", decision=decided())
    assert ok.approved and ok.hold is None and ok.approved_by == "alice@support"
    refused = {
        "forged": decided(signer=FORGER),
        "denied": decided(Decision.DENY),
        "another turn": decided(turn_id="turn_2"),
        "another call": decided(tool_use_id="toolu_x"),
        "other arguments": decided(input_sha256=input_digest("cancel_order", CANCEL | {"order_id": "ord_a1000004"})),
    }
    for why, decision in refused.items():
        result = await check_call(gate, cancel, "cus_1001", "turn_1", decision=decision)
        assert not result.approved and result.hold is None and "Nothing was done" in result.error, why
    # the same decision does not carry over to other arguments the model may send later
    other = await check_call(
        gate,
        call("cancel_order", {**CANCEL, "reason": "other"}, id="toolu_c"),
        "cus_1001",
        "turn_1",
        decision=decided(),
    )
    assert not other.approved and "other arguments" in other.error


async def test_one_call_per_step_waits_for_a_person_the_second_is_told_to_come_back(shop):
    command = CheckToolCalls(
        turn=turn(),
        step=1,
        messages=[],
        calls=[
            call("cancel_order", CANCEL, id="toolu_a"),
            call("cancel_order", {"order_id": "ord_a1000004", "reason": "other"}, id="toolu_b"),
            call("list_orders", {}, id="toolu_l"),
        ],
    )
    batch = await gate_for(shop, above=1000).check(command)
    held, second, listed = batch.calls
    assert (
        held.hold and not second.approved and "already waiting" in second.error and listed.approved and not listed.hold
    )
    BATCHES.verify(batch)
    # the hold carries the gate's own signature, which the executor copies into the request the guard checks
    runner = tool_runner(recording_registry(Recording()), shop_deps(None))
    asked = await executed(batch, BATCHES, runner)
    assert isinstance(asked, ApprovalRequested) and asked.hold_key_id == GATE_KEYS.key_id and asked.hold_signature
    BATCHES.verify_hold(asked)


# -- the executor: the others run, the held one waits; serial tools run in order ---------------------------


class Recording:
    """Handlers that record when each call starts and ends."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []

    def handler(self, name: str, seconds: float):
        async def run(args, ctx):
            self.events.append(("start", ctx.tool_use_id))
            await asyncio.sleep(seconds)  # the tool's own run time, as the test sets it
            self.events.append(("end", ctx.tool_use_id))
            return {"tool": name}

        return run


def recording_registry(recording: Recording, **options):
    handlers = {
        name: recording.handler(name, 0.05 if name == "search_help_center" else 0.01) for name in REGISTRY.names
    }
    return shop_registry(handlers=handlers, **options)


def checked(name: str, id: str, **fields) -> CheckedCall:
    return CheckedCall(id=id, name=name, input={}, approved=True, **fields)


async def test_a_step_holding_a_serial_tool_runs_its_calls_one_after_another_in_tool_use_order():
    recording = Recording()
    runner = tool_runner(recording_registry(recording), shop_deps(None))
    calls = [checked("search_help_center", "c1"), checked("cancel_order", "c2"), checked("lookup_order", "c3")]
    results = await runner.run(calls, turn())
    assert [r["tool_use_id"] for r in results] == ["c1", "c2", "c3"]
    # the slow first call ends before the second starts, and so on: no overlap, the model's order
    assert recording.events == [
        ("start", "c1"),
        ("end", "c1"),
        ("start", "c2"),
        ("end", "c2"),
        ("start", "c3"),
        ("end", "c3"),
    ]


async def test_without_a_serial_tool_the_calls_of_a_step_overlap():
    recording = Recording()
    runner = tool_runner(recording_registry(recording), shop_deps(None))
    await runner.run([checked("search_help_center", "c1"), checked("lookup_order", "c2")], turn())
    assert recording.events[:2] == [("start", "c1"), ("start", "c2")]  # both started before either ended
    # and a serial declaration of a rejected call does not serialise the step
    recording.events.clear()
    await runner.run(
        [
            checked("search_help_center", "c1"),
            CheckedCall(id="c2", name="cancel_order", input={}, approved=False, error="no"),
            checked("lookup_order", "c3"),
        ],
        turn(),
    )
    assert recording.events[:2] == [("start", "c1"), ("start", "c3")]


def transcript(*ids_names) -> list[dict]:
    return [
        {"role": "user", "content": "cancel my orders"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": i, "name": n, "input": {}} for i, n in ids_names]},
    ]


async def test_a_batch_with_a_held_call_runs_the_others_then_asks_and_the_resumed_batch_completes_the_step_in_order():
    recording = Recording()
    runner = tool_runner(recording_registry(recording), shop_deps(None))
    messages = transcript(("c1", "cancel_order"), ("c2", "lookup_order"))
    hold = {
        "reason": "above 50.00 EUR",
        "entities": {"order_id": {"total_cents": 8700}},
        "input_sha256": "d" * 64,
        "expires_at": 9e9,
    }
    batch = SIGNER.sign(
        ExecuteToolBatch(
            turn=turn(),
            step=1,
            messages=messages,
            calls=[checked("cancel_order", "c1", hold=hold), checked("lookup_order", "c2")],
        )
    )
    asked = await executed(batch, BATCHES, runner)
    assert isinstance(asked, ApprovalRequested)
    assert recording.events == [("start", "c2"), ("end", "c2")]  # only the other call ran
    assert (
        asked.approval_id == approval_id_for("turn_1", 1, "c1")
        and asked.call.id == "c1"
        and asked.input_sha256 == "d" * 64
    )
    assert [r["tool_use_id"] for r in asked.results] == ["c2"] and asked.entities["order_id"]["total_cents"] == 8700
    resumed = SIGNER.sign(
        ExecuteToolBatch(
            turn=turn(),
            step=1,
            messages=messages,
            results=asked.results,
            calls=[checked("cancel_order", "c1", approved_by="alice")],
        )
    )
    command = await executed(resumed, BATCHES, runner)
    assert isinstance(command, CallModel)
    assert [b["tool_use_id"] for b in command.messages[-1]["content"]] == ["c1", "c2"]  # the model's order, one message
    assert recording.events[2:] == [("start", "c1"), ("end", "c1")]
    assert in_tool_use_order(messages, [{"tool_use_id": "c2"}, {"tool_use_id": "c1"}]) == [
        {"tool_use_id": "c1"},
        {"tool_use_id": "c2"},
    ]


# -- the guard: awaiting, deciding, expiring -----------------------------------------------------------------


@pytest.fixture
async def guard(tmp_path):
    ledger = await Ledger.open(await migrated(f"sqlite+aiosqlite:///{tmp_path / 'ledger.db'}"))
    recorder = Recorder()
    g = guard_of(
        ledger=ledger,
        policy=Policy(replies=Replies()),
        prices=price_table(),
        publish=recorder,
        stuck_after_s=0.01,
        stuck_grace_s=0.01,
        turn_deadline_s=300,
        decisions=DECISIONS,
        holds=BATCHES,
    )
    g.recorder = recorder
    yield g
    await g.outbox.drain()
    await ledger.close()


async def held_request(guard: Guard, expires_in: float = 60.0) -> ApprovalRequested:
    """A turn at step 1 (list_orders and cancel_order called), and the gate's signed hold of its cancel."""
    from roundtrip._kernel.wire.events import ModelResponded, StartTurn, Usage

    await guard.starts.on_start(StartTurn(turn=turn(), text="cancel my last order"))
    messages = transcript(("toolu_c", "cancel_order"), ("toolu_l", "list_orders"))
    calls = [
        ToolCall(id="toolu_c", name="cancel_order", input=CANCEL, fingerprint="a"),
        ToolCall(id="toolu_l", name="list_orders", input={}, fingerprint="b"),
    ]
    await guard.loop.on_iteration(
        ModelResponded(
            turn=turn(),
            step=1,
            messages=messages[:1],
            content=messages[1]["content"],
            stop_reason="tool_use",
            tool_calls=calls,
            usage=Usage(input_tokens=10),
            spent=Usage(input_tokens=10),
        )
    )
    row = await guard.ledger.get("turn_1")
    assert row.status == RUNNING and row.step == 1
    now = time.time()
    event = ApprovalRequested(
        approval_id=approval_id_for("turn_1", 1, "toolu_c"),
        turn=turn(deadline_at=row.deadline_at),
        step=1,
        call=CheckedCall(id="toolu_c", name="cancel_order", input=CANCEL, approved=True),
        reason="above 50.00 EUR",
        entities={"order_id": {"order_id": "ord_a1000003", "total_cents": 8700}},
        input_sha256=input_digest("cancel_order", CANCEL),
        requested_at=now,
        expires_at=round(now + expires_in, 3),
        messages=messages,
        results=[{"type": "tool_result", "tool_use_id": "toolu_l", "content": "{}"}],
    )
    return SIGNER.sign_request(event)  # as the gate signs the hold in the batch the executor copies it from


async def waiting_turn(guard: Guard, expires_in: float = 60.0) -> ApprovalRequested:
    """A turn at step 1 (list_orders and cancel_order called) whose cancel waits for a person."""
    event = await held_request(guard, expires_in)
    assert await guard.approvals.on_requested(event) == "awaiting"
    assert await guard.approvals.on_requested(event) == "duplicate"
    await guard.outbox.drain()
    return event


async def test_the_guard_records_no_wait_the_gate_did_not_sign_for_this_customer_and_call(guard, caplog):
    """A writer of turn.approval_requests cannot park a live turn for another customer, another call or a later
    deadline: each is refused (so dead-lettered by the kernel) and said on roundtrip.security; the turn runs on."""
    from roundtrip._guard.approvals import RequestRefused
    from roundtrip._kernel.wire.events import ModelResponded, StartTurn, Usage

    await guard.starts.on_start(StartTurn(turn=turn(), text="cancel my last order"))
    messages = transcript(("toolu_c", "cancel_order"))
    await guard.loop.on_iteration(
        ModelResponded(
            turn=turn(),
            step=1,
            messages=messages[:1],
            content=messages[1]["content"],
            stop_reason="tool_use",
            tool_calls=[ToolCall(id="toolu_c", name="cancel_order", input=CANCEL, fingerprint="a")],
            usage=Usage(input_tokens=10),
            spent=Usage(input_tokens=10),
        )
    )
    expires = round(time.time() + 60, 3)
    digest = input_digest("cancel_order", CANCEL)
    deadline = (await guard.ledger.get("turn_1")).deadline_at
    genuine = ApprovalRequested(
        approval_id=approval_id_for("turn_1", 1, "toolu_c"),
        turn=turn(deadline_at=deadline),
        step=1,
        call=CheckedCall(id="toolu_c", name="cancel_order", input=CANCEL, approved=True),
        reason="above 50.00 EUR",
        input_sha256=digest,
        requested_at=time.time(),
        expires_at=expires,
        messages=messages,
    )
    genuine = SIGNER.sign_request(genuine)
    forged_signature = FORGER.sign_request(genuine).hold_signature
    for forged in (
        genuine.model_copy(update={"turn": genuine.turn.model_copy(update={"customer_id": "cus_1002"})}),
        genuine.model_copy(update={"expires_at": expires + 86400}),
        genuine.model_copy(update={"hold_key_id": "", "hold_signature": ""}),
        genuine.model_copy(update={"hold_key_id": "k1", "hold_signature": forged_signature}),
    ):
        with caplog.at_level("ERROR", logger="roundtrip.security"), pytest.raises(RequestRefused):
            await guard.approvals.on_requested(forged)
    assert (await guard.ledger.get("turn_1")).status == RUNNING and await guard.ledger.approval(
        genuine.approval_id
    ) is None
    assert sum("refused approval request" in r.getMessage() for r in caplog.records) == 4
    assert await guard.approvals.on_requested(genuine) == "awaiting"


async def test_a_waiting_turn_is_never_flagged_stuck_and_nothing_can_act_for_it(guard):
    await waiting_turn(guard)
    await asyncio.sleep(0.05)  # time passes while the turn waits: a sweep could call it idle
    assert await guard.sweeper.sweep(guard.recorder.flag, now=time.time()) == (0, 0)
    assert not guard.recorder.flags and (await guard.ledger.get("turn_1")).status == AWAITING
    fence = Fence(guard.ledger.engine)  # what the executor and the model service ask
    assert not await fence.claim_batch(turn(), 1, 10, now=time.time())  # no executor may run anything now
    assert not await fence.claim_model_call(turn(), 1, now=time.time())
    (pending,) = await approvals_of(guard.ledger)
    assert pending.tool == "cancel_order" and pending.customer_id == "cus_1001" and pending.status == "pending"


async def test_the_app_is_told_once_that_its_turn_waits_for_a_person_and_until_when(guard):
    event = await waiting_turn(guard)
    statuses = [  # the wait (each step's `working` is told too)
        (t, m) for t, m in guard.recorder.sent if isinstance(m, SupportStatus) and m.state is not TurnState.WORKING
    ]
    assert len(statuses) == 1  # the request again (a duplicate) tells nothing twice
    ((topic, status),) = statuses
    assert topic == topics.SUPPORT_STATUS and status.state is TurnState.WAITING_FOR_APPROVAL
    assert (status.request_id, status.turn_id, status.customer_id) == ("req_1", "turn_1", "cus_1001")
    assert (
        status.until == event.expires_at
        and status.approval_id == event.approval_id
        and status.reason == "above 50.00 EUR"
    )
    assert not [m for t, m in guard.recorder.sent if t == topics.SUPPORT_REPLIES]  # a status is no reply
    assert (await guard.ledger.get("turn_1")).pending is None  # published: cleared from the outbox


async def test_a_wait_status_that_could_not_be_published_is_published_by_the_outbox_later(guard):
    async def broker_away(topic, message, conversation_id):  # gone just when the wait is told
        if topic == topics.SUPPORT_STATUS:
            raise ConnectionError("broker away")
        await guard.recorder(topic, message, conversation_id)

    guard.outbox.publish = broker_away
    with pytest.raises(ConnectionError):
        await waiting_turn(guard)
    assert (await guard.ledger.get("turn_1")).status == AWAITING  # recorded: the wait holds
    guard.outbox.publish = guard.recorder
    assert await guard.outbox.republish_all(older_than=time.time() + 1) == 1
    assert [type(m) for _, m in guard.recorder.sent][-1] is SupportStatus


async def test_approved_the_call_goes_back_to_the_gate_once_with_the_decision_and_the_earlier_results(guard):
    event = await waiting_turn(guard)
    before = len(guard.recorder.sent)
    decision = decided()
    assert await guard.approvals.on_decision(decision) == "approved"
    topic, message = guard.recorder.sent[-1]
    assert topic == topics.TOOL_CALLS and isinstance(message, CheckToolCalls)
    assert (
        [c.id for c in message.calls] == ["toolu_c"]
        and message.calls[0].input == CANCEL
        and message.decisions == [decision]
    )
    assert message.results == event.results and message.step == 1
    assert message.turn.deadline_at >= event.turn.deadline_at  # the wait does not count against the turn's deadline
    row = await guard.ledger.get("turn_1")
    assert row.status == RUNNING and await Fence(guard.ledger.engine).claim_batch(turn(), 1, 10, now=time.time())
    # the same decision again (redelivered or published twice): nothing is sent again
    assert await guard.approvals.on_decision(decision) == "duplicate"
    assert await guard.approvals.on_decision(decided(decided_by="bob@support")) == "duplicate"
    assert len(guard.recorder.sent) == before + 1
    with pytest.raises(DecisionRefused, match="already approved by alice@support"):
        await guard.approvals.on_decision(decided(Decision.DENY))
    (kept,) = await approvals_of(guard.ledger, status=None)
    assert kept.status == "approved" and kept.decided_by == "alice@support" and kept.decided_at


async def test_a_decided_call_is_never_held_again_and_the_deadline_a_decision_writes_is_the_ledgers(guard, caplog):
    """After a genuine approval, a signed copy under another approval id (or with a later deadline in its turn) is
    refused on roundtrip.security: nothing new waits, and the turn keeps the deadline the guard gave it."""
    from roundtrip._guard.approvals import RequestRefused

    asked = time.time()
    event = await waiting_turn(guard)
    deadline = event.turn.deadline_at  # the ledger's, as the guard gave it at the start
    assert await guard.approvals.on_decision(decided()) == "approved"
    extended = (await guard.ledger.get("turn_1")).deadline_at
    assert deadline < extended <= deadline + (time.time() - asked) + 0.01  # only the wait was added
    again = SIGNER.sign_request(event.model_copy(update={"approval_id": "appr_again", "reason": "refund 3.00 EUR"}))
    later = event.turn.model_copy(update={"deadline_at": 4102444800.0})
    other_step = SIGNER.sign_request(event.model_copy(update={"approval_id": "appr_later", "turn": later}))
    with caplog.at_level("ERROR", logger="roundtrip.security"):
        with pytest.raises(RequestRefused, match=r"held already, as approval appr_\w+ \(approved\)"):
            await guard.approvals.on_requested(again)
        with pytest.raises(RequestRefused, match="held already"):
            await guard.approvals.on_requested(other_step)
    assert sum("refused approval request" in r.getMessage() for r in caplog.records) == 2
    assert [a.approval_id for a in await approvals_of(guard.ledger, status=None)] == [event.approval_id]
    row = await guard.ledger.get("turn_1")
    assert row.status == RUNNING and row.deadline_at == extended
    # the genuine request redelivered changes nothing either
    assert await guard.approvals.on_requested(event) == "duplicate"
    assert (await guard.ledger.get("turn_1")).deadline_at == extended


async def test_a_signed_hold_whose_turn_carries_another_deadline_than_the_ledgers_is_refused(guard):
    """The deadline a decision extends is the request's turn's: the guard records no wait whose deadline is not the
    ledger's (whatever deadline a CheckToolCalls copy made the gate sign)."""
    from roundtrip._guard.approvals import RequestRefused

    event = await held_request(guard)
    deadline = (await guard.ledger.get("turn_1")).deadline_at
    later = SIGNER.sign_request(
        event.model_copy(update={"turn": event.turn.model_copy(update={"deadline_at": 4102444800.0})})
    )
    with pytest.raises(RequestRefused, match="deadline is not the one the ledger keeps"):
        await guard.approvals.on_requested(later)
    row = await guard.ledger.get("turn_1")
    assert row.status == RUNNING and row.deadline_at == deadline
    assert await guard.ledger.approval(event.approval_id) is None


async def test_denied_the_model_gets_an_error_result_with_the_reason_and_all_results_in_order(guard):
    await waiting_turn(guard)
    assert (
        await guard.approvals.on_decision(decided(Decision.DENY, reason="order flagged for fraud review")) == "denied"
    )
    topic, message = guard.recorder.sent[-1]
    assert topic == topics.MODEL_CALLS and isinstance(message, CallModel) and message.step == 1
    results = message.messages[-1]["content"]
    assert [r["tool_use_id"] for r in results] == ["toolu_c", "toolu_l"]
    assert results[0]["is_error"] and "declined it: order flagged for fraud review" in results[0]["content"]
    assert (await guard.ledger.get("turn_1")).status == RUNNING


@pytest.mark.parametrize("case", ["forged", "unknown", "another call", "other arguments"])
async def test_forged_unknown_or_foreign_decisions_are_refused_and_change_nothing(guard, case):
    await waiting_turn(guard)
    decision = {
        "forged": decided(signer=FORGER),
        "unknown": decided(approval_id="appr_nope"),
        "another call": decided(tool_use_id="toolu_l"),
        "other arguments": decided(input_sha256=input_digest("cancel_order", {**CANCEL, "order_id": "ord_a1000004"})),
    }[case]
    before = len(guard.recorder.sent)
    with pytest.raises(DecisionRefused):
        await guard.approvals.on_decision(decision)
    assert len(guard.recorder.sent) == before and (await guard.ledger.get("turn_1")).status == AWAITING


async def test_no_decision_in_time_ends_the_turn_politely_and_a_late_decision_is_refused(guard):
    await waiting_turn(guard, expires_in=0.05)
    await asyncio.sleep(0.1)  # past the approval's expiry (0.05 s)
    await guard.sweeper.sweep(guard.recorder.flag, now=time.time())
    await guard.outbox.drain()
    topic, ended = guard.recorder.sent[-1]
    assert topic == topics.OUTCOMES and isinstance(ended, TurnEnded) and ended.outcome is Outcome.APPROVAL_TIMEOUT
    assert "could not be reviewed in time" in ended.text and "Nothing was changed" in ended.text
    row = await guard.ledger.get("turn_1")
    assert row.status == ENDED and row.outcome == "approval_timeout"
    (expired,) = await approvals_of(guard.ledger, status=None)
    assert expired.status == "expired"
    with pytest.raises(DecisionRefused, match="already expired"):
        await guard.approvals.on_decision(decided())


async def test_a_waiting_turn_can_be_cancelled_and_a_decision_for_it_is_then_refused(guard):
    await waiting_turn(guard)
    assert (
        await guard.external_ends.on_cancel(
            CancelTurn(turn_id="turn_1", customer_id="cus_1001", conversation_id="conv_1")
        )
        == "cancelled"
    )
    with pytest.raises(DecisionRefused):
        await guard.approvals.on_decision(decided())
    assert (await guard.ledger.get("turn_1")).outcome == "cancelled"


# -- parallel use: the flag in tool_choice ---------------------------------------------------------------


@pytest.fixture(scope="module")
def simulator():
    with running_simulator() as url:
        yield url


@pytest.mark.parametrize(
    "deployment, request_flag, expected",
    [(False, None, False), (True, None, True), (False, True, True), (True, False, False)],
)
async def test_parallel_use_is_disabled_per_deployment_or_per_request_and_the_request_carries_the_flag(
    simulator, deployment, request_flag, expected
):
    settings = Settings(
        _env_file=None, anthropic_api_key=None, anthropic_base_url=simulator, disable_parallel_tool_use=deployment
    )
    client = shop_model_client(settings)
    t = turn().model_copy(update={"persona": "parallel", "disable_parallel_tool_use": request_flag})
    before = httpx.get(f"{simulator}/health").json()["parallel_disabled"]
    try:
        event = await respond(
            CallModel(turn=t, step=0, messages=[{"role": "user", "content": "cancel my last order"}]), client
        )
    finally:
        await client.aclose()
    after = httpx.get(f"{simulator}/health").json()["parallel_disabled"]
    assert after - before == int(expected)  # the simulator saw tool_choice.disable_parallel_tool_use: true
    assert [c.name for c in event.tool_calls] == (
        ["list_orders"] if expected else ["list_orders", "search_help_center"]
    )
    assert client.tool_choice(request_flag if request_flag is not None else None) == (
        {"type": "auto", "disable_parallel_tool_use": True} if expected else None
    )


# -- configuration and the simulator's validation -----------------------------------------------------------


def test_the_published_decision_key_is_refused_outside_development_only_while_approvals_are_on():
    from roundtrip._kernel.settings import DEV_DECISION_VERIFY_KEYS, InsecureConfiguration

    own = key_settings()
    production = dict(_env_file=None, kafka_bootstrap_servers="kafka:9092", **own)
    published = production | {"decision_verify_keys": DEV_DECISION_VERIFY_KEYS}
    held = ("decision_verify_keys",)
    Settings(**published).refuse_unfit_keys("guard", held, approvals=False)  # approvals off: the key is never used
    with pytest.raises(InsecureConfiguration, match="ROUNDTRIP_DECISION_VERIFY_KEYS"):
        Settings(**published).refuse_unfit_keys("guard", held, approvals=True)
    Settings(**production).refuse_unfit_keys("gate", held, approvals=True)
    Settings(_env_file=None, **own | {"decision_verify_keys": DEV_DECISION_VERIFY_KEYS}).refuse_unfit_keys(
        "gate", held, approvals=True
    )


@pytest.mark.parametrize(
    "choice, problem",
    [
        ({"type": "auto", "disable_parallel_tool_use": True}, None),
        ({"type": "any", "disable_parallel_tool_use": False}, None),
        ({"type": "auto", "disable_parallel_tool_use": "yes"}, "valid boolean"),
        ({"type": "none", "disable_parallel_tool_use": True}, "Extra inputs"),
    ],
)
def test_the_simulator_validates_disable_parallel_tool_use_as_the_api_does(choice, problem):
    from roundtrip._simulator.errors import ApiError
    from roundtrip._simulator.validation import validate_create

    body = {
        "model": "claude-sonnet-4-6",
        "max_tokens": 10,
        "messages": [{"role": "user", "content": "hi"}],
        "tool_choice": choice,
        "tools": [{"name": "t", "description": "a tool", "input_schema": {"type": "object"}}],
    }
    if problem is None:
        validate_create(body)
    else:
        with pytest.raises(ApiError, match=problem):
            validate_create(body)
